"""The torchrun example (``examples/contrastive_torchrun.py``) on torch's own launcher.

Runs ``python -m torch.distributed.run --standalone --nproc-per-node 3`` (``torchrun``;
``--standalone`` rendezvouses on a free localhost port) with ``--dump``, then checks,
in this one process, what every rank wrote:

* each rank's gathered upstream gradients, pushed through ``vargather.oracle`` under
  the ``sum`` contract, give the embedding gradients vargather returned (to the last
  bits: float64 sums of three terms in another order);
* recomputing every rank's contrastive loss on ``torch.cat`` of all ranks' embeddings,
  in one autograd graph, and differentiating ``Σ_j L_j`` gives the same embedding
  gradients, the same losses, and (summed over ranks) the same encoder gradients.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from vargather import oracle

from ._by_path import import_path

# The slow schedule's: a torchrun launcher and three interpreters, 12 s of the default
# run's 2 cores; the README's own torchrun example runs by default (tests/test_docs.py).
pytestmark = [pytest.mark.multirank, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "contrastive_torchrun.py"
WORLD = 3
TIMEOUT_S = 240


def load_example() -> ModuleType:
    return import_path("contrastive_torchrun", EXAMPLE)


BATCH_SIZES = (pytest.param("5,2,7", marks=pytest.mark.slow), "5,0,7")
"""Ragged batches, and one with an empty rank (whose loss is 0, not nan): the default
run starts torchrun once, with the empty rank (ragged too)."""


@pytest.fixture(scope="module", params=BATCH_SIZES)
def dumps(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        str(EXAMPLE),
        "--dump",
        str(out),
        "--batch-sizes",
        request.param,
    ]
    proc = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout}\n{proc.stderr}"
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_every_rank_ran_with_its_own_batch_size(dumps: list[dict[str, Any]]) -> None:
    example = load_example()
    sizes = dumps[0]["sizes"]
    assert len(set(sizes)) == WORLD  # really ragged
    assert sizes in ([5, 2, 7], [5, 0, 7])
    for r, d in enumerate(dumps):
        assert d["rank"] == r
        assert d["world_size"] == WORLD
        assert d["sizes"] == sizes
        assert d["a"].shape == (sizes[r], example.EMBED_DIM)
        assert not any(v.isnan().any() for v in d.values() if isinstance(v, torch.Tensor))
        assert not any(g.isnan().any() for g in d["param_grads"].values())
        if sizes[r] == 0:
            assert d["loss"].item() == 0.0  # not the nan of a mean over no rows


def test_embedding_grads_match_the_oracle(dumps: list[dict[str, Any]]) -> None:
    for key, up in (("a", "upstream_a"), ("t", "upstream_t")):
        shards = [d[key] for d in dumps]
        upstream = [d[up] for d in dumps]
        assert not all(torch.equal(upstream[0], u) for u in upstream[1:]), "ranks' losses agree"
        want = oracle.expected_input_grads(shards, upstream, 0, "sum")
        for r, d in enumerate(dumps):
            # float64 sums of W terms in another order: equal to the last bits, not bitwise
            torch.testing.assert_close(
                d[f"grad_{key}"], want[r], rtol=1e-13, atol=1e-15, msg=f"rank {r}: grad_{key}"
            )


def test_gradients_of_the_summed_loss_recomputed_in_one_process(
    dumps: list[dict[str, Any]],
) -> None:
    """The whole multi-rank objective Σ_j L_j, rebuilt from the ranks' raw batches."""
    example = load_example()
    first = dumps[0]
    seed, temperature, sizes = first["seed"], first["temperature"], first["sizes"]
    image_encoder, text_encoder = example.make_encoders(seed)
    batches = [example.make_batch(r, sizes[r], seed) for r in range(WORLD)]
    a = [torch.nn.functional.normalize(image_encoder(x), dim=-1) for x, _ in batches]
    t = [torch.nn.functional.normalize(text_encoder(y), dim=-1) for _, y in batches]
    for e in (*a, *t):
        e.retain_grad()
    a_all, t_all = torch.cat(a), torch.cat(t)
    offsets = [sum(sizes[:r]) for r in range(WORLD)]
    losses = [
        example.contrastive_loss(a_all, t_all, offsets[r], sizes[r], temperature)
        for r in range(WORLD)
    ]
    torch.stack(losses).sum().backward()

    for r, d in enumerate(dumps):
        torch.testing.assert_close(d["loss"], losses[r].detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(d["grad_a"], a[r].grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(d["grad_t"], t[r].grad, rtol=1e-10, atol=1e-12)
    params = {f"image.{n}": p for n, p in image_encoder.named_parameters()} | {
        f"text.{n}": p for n, p in text_encoder.named_parameters()
    }
    for name, p in params.items():
        summed = torch.stack([d["param_grads"][name] for d in dumps]).sum(0)
        assert p.grad is not None
        torch.testing.assert_close(summed, p.grad, rtol=1e-10, atol=1e-12, msg=name)

"""DeepSpeed Ulysses on 2 CPU ranks over gloo: four checks, each in a world of its own.

Standalone (DeepSpeed and torch only). Run with the release under test installed:

    DS_BUILD_OPS=0 pip install -c constraints.txt --no-build-isolation deepspeed==0.19.6
    python docs/repro/deepspeed_ulysses.py

(the first run JIT-builds DeepSpeed's CPU comm op, about a minute). Each check prints
PASS, or FAIL with what happened (a wrong tensor, an exception, a rank killed by gloo's
abort). What each shows, and where upstream tracks it:

* ``seq-first round trip``: ``single_all_to_all`` sequence -> heads -> sequence with
  ``batch_dim_idx=1`` (``[s, b, h, d]``) is the identity. Wrong shape from 0.16.3
  (#6750's refactor) to 0.19.6; fixed in 0.19.7 (DeepSpeed PR #8317).
* ``second model's head count``: two ``DistributedAttention`` models in one process, 3
  heads then 4 heads; the second must give its input back through an identity
  attention. The first model's head count is kept process-wide and splits the second
  one's heads (DeepSpeed #8291, fixed in 0.19.7 by PR #8316).
* ``heads == ranks``: 2 heads on 2 ranks, the even case; the output all-to-all takes
  the uneven path and asserts (DeepSpeed #6774, fixed in 0.16.2).
* ``fewer kv heads than ranks``: GQA with 3 query heads and 1 key/value head on 2
  ranks must be refused on every rank (an AssertionError), not split ``[1, 0]``.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import sys
import tempfile
import traceback

import torch

WORLD = 2


class Mpu:
    """What ``deepspeed.initialize(mpu=...)`` installs: the sequence-parallel group."""

    def __init__(self, group: object) -> None:
        self.group = group

    def get_sequence_parallel_group(self) -> object:
        return self.group

    def get_sequence_parallel_rank(self) -> int:
        return torch.distributed.get_rank(self.group)

    def get_sequence_parallel_world_size(self) -> int:
        return torch.distributed.get_world_size(self.group)


def setup(rank: int, store: str) -> object:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store, WORLD), rank=rank, world_size=WORLD)
    import deepspeed
    from deepspeed.utils import groups

    with contextlib.redirect_stdout(io.StringIO()):
        deepspeed.init_distributed(dist_backend="gloo")
    group = dist.new_group(list(range(WORLD)))
    groups.mpu = Mpu(group)
    return group


def chunk(t: torch.Tensor, dim: int, rank: int) -> torch.Tensor:
    n = t.shape[dim] // WORLD
    return t.narrow(dim, rank * n, n).contiguous()


def seq_first_round_trip(rank: int, group: object) -> str:
    from deepspeed.sequence.layer import single_all_to_all

    whole = torch.arange(4 * 1 * 4 * 2, dtype=torch.float32).reshape(4, 1, 4, 2)  # [s, b, h, d]
    x = chunk(whole, 0, rank)
    heads = single_all_to_all(x, 2, 0, 1, group)  # [s, b, h/P, d]
    if not torch.equal(heads, chunk(whole, 2, rank)):
        return f"seq -> heads: got shape {tuple(heads.shape)}, expected {tuple(chunk(whole, 2, rank).shape)}"
    back = single_all_to_all(heads, 0, 2, 1, group)
    if back.shape != x.shape or not torch.equal(back, x):
        return f"heads -> seq: got shape {tuple(back.shape)}, expected {tuple(x.shape)}"
    return ""


class Identity(torch.nn.Module):
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: object
    ) -> torch.Tensor:
        return q * 1


def attention_identity(rank: int, group: object, heads: int, kv_heads: int | None = None) -> str:
    from deepspeed.sequence.layer import DistributedAttention

    kv = heads if kv_heads is None else kv_heads
    model = DistributedAttention(Identity(), group, scatter_idx=2, gather_idx=1)
    q = chunk(torch.arange(1 * 4 * heads * 2, dtype=torch.float32).reshape(1, 4, heads, 2), 1, rank)
    k = chunk(torch.zeros(1, 4, kv, 2), 1, rank)
    out = model(q, k, k.clone(), 0)  # batch_dim_idx=0: [b, s, h, d]
    if not torch.equal(out, q):
        return f"{heads}-head model: output differs from its input (shape {tuple(out.shape)})"
    return ""


def second_model(rank: int, group: object) -> str:
    return attention_identity(rank, group, 3) or attention_identity(rank, group, 4)


def heads_equal_ranks(rank: int, group: object) -> str:
    return attention_identity(rank, group, WORLD)


def fewer_kv_heads(rank: int, group: object) -> str:
    try:
        attention_identity(rank, group, 3, kv_heads=1)
    except AssertionError:
        return ""  # refused, as wanted
    return "not refused: 1 key/value head on 2 ranks ran"


CHECKS = {
    "seq-first round trip": seq_first_round_trip,
    "second model's head count": second_model,
    "heads == ranks": heads_equal_ranks,
    "fewer kv heads than ranks": fewer_kv_heads,
}


def child(name: str, rank: int, store: str, results: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        group = setup(rank, store)
        results.put((rank, CHECKS[name](rank, group)))
    except Exception as err:
        last = traceback.extract_tb(err.__traceback__)[-1]
        results.put(
            (rank, f"{type(err).__name__}: {err} ({os.path.basename(last.filename)}:{last.lineno})")
        )


def run(name: str) -> str:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(), "store")
    procs = [ctx.Process(target=child, args=(name, r, store, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    said: dict[int, str] = {}
    while not results.empty():
        rank, text = results.get()
        said[rank] = text
    problems = [f"rank {r}: {said[r]}" for r in sorted(said) if said[r]]
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            problems.append(f"rank {r}: hung (killed after 90 s)")
        elif p.exitcode and r not in said:
            problems.append(
                f"rank {r}: died (exit code {p.exitcode}; gloo aborts with SIGABRT = -6)"
            )
    return "; ".join(problems)


def main() -> int:
    import deepspeed

    print(f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}, {WORLD} gloo ranks")
    failed = 0
    for name in CHECKS:
        problem = run(name)
        failed += bool(problem)
        print(f"{'FAIL' if problem else 'PASS'}  {name}" + (f": {problem}" if problem else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

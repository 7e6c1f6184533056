"""A CLIP-style contrastive loss over every rank's batch, with a different batch size on
each rank, gathered with ``vargather.all_gather_v(grad="sum")``.

Run it with torch.distributed's own launcher and rendezvous (any number of processes
and nodes)::

    torchrun --standalone --nproc-per-node 3 examples/contrastive_torchrun.py

Each rank r encodes its own batch of ``b_r`` (image, text) pairs into embeddings
``a_r`` and ``t_r`` (``b_r x d``), gathers every rank's embeddings
(``A = cat_j a_j``, ``T = cat_j t_j``, ``B = Σ_j b_j`` rows) and computes its *own* loss:
its images against every text and its texts against every image,

    L_r = ½ [ CE(a_r Tᵀ / τ, o_r + i) + CE(t_r Aᵀ / τ, o_r + i) ] / B

where ``o_r`` is the offset of rank r's rows in the gathered batch (its positives)
and ``CE`` *sums* over rank r's rows. Ragged batches and a mean: dividing by the
global batch size ``B`` makes ``Σ_j L_j`` the mean over all ``B`` pairs, every pair
weighing the same whichever rank holds it. A per-rank mean (``cross_entropy``'s
default, dividing by ``b_r``) would weigh the pairs of a small rank more (a pair on a
rank of 2 counts 5/2 times one on a rank of 5), and on a rank with 0 rows it is the
mean of nothing: ``nan``, which the ``sum`` contract's backward then carries into
every rank's gradients. Here a rank with 0 rows computes ``L_r = 0`` and still takes
part in the gathers (``--batch-sizes 5,0,7``).
Every rank's loss depends on every rank's embeddings, and the losses differ, so the
gradient of the training objective ``Σ_j L_j`` with respect to ``a_r`` collects terms
from every rank: that is the ``sum`` contract (the seed's ``local`` contract would
silently drop them). After ``backward``, summing the encoder's gradients over ranks
(what DDP's all-reduce does, up to its 1/W) gives the gradient of ``Σ_j L_j``.

``--dump DIR`` writes each rank's inputs, embeddings, upstream gradients and
gradients to ``DIR/rank<r>.pt``; ``tests/test_torchrun_example.py`` checks them against
``vargather.oracle`` and a one-process recomputation of ``Σ_j L_j``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn import functional

import vargather

IN_FEATURES = 6
EMBED_DIM = 4


def batch_size(rank: int, sizes: Sequence[int]) -> int:
    """Rank ``rank``'s batch size: ``sizes`` cycled over the ranks."""
    return sizes[rank % len(sizes)]


def make_batch(rank: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s ``n`` (image, text) feature pairs, deterministic."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    images = torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)
    texts = images + 0.3 * torch.randn(n, IN_FEATURES, generator=g, dtype=torch.float64)
    return images, texts


def make_encoders(seed: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The same two linear encoders on every rank (same seed)."""
    torch.manual_seed(seed)
    image_encoder = torch.nn.Linear(IN_FEATURES, EMBED_DIM, dtype=torch.float64)
    text_encoder = torch.nn.Linear(IN_FEATURES, EMBED_DIM, dtype=torch.float64)
    return image_encoder, text_encoder


def contrastive_loss(
    a_all: torch.Tensor, t_all: torch.Tensor, offset: int, count: int, temperature: float
) -> torch.Tensor:
    """The loss of the rank whose rows are ``[offset, offset + count)`` of the gathered
    batch: its rows against every row, positives at ``offset + i``, summed over its
    rows and divided by the global batch size (the module docstring says why: a
    per-rank mean weighs small ranks more, and is ``nan`` on a rank with no rows).

    Its own rows are taken from the gathered tensors too, so every gradient reaching
    its embeddings flows back through the gather.
    """
    total = a_all.shape[0]
    a_local = a_all.narrow(0, offset, count)
    t_local = t_all.narrow(0, offset, count)
    targets = torch.arange(offset, offset + count)
    image_to_text = functional.cross_entropy(
        a_local @ t_all.T / temperature, targets, reduction="sum"
    )
    text_to_image = functional.cross_entropy(
        t_local @ a_all.T / temperature, targets, reduction="sum"
    )
    return 0.5 * (image_to_text + text_to_image) / total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-sizes",
        default="5,2,7",
        help="per-rank batch sizes, cycled over the ranks (default 5,2,7)",
    )
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default=None, help="default: nccl with CUDA, else gloo")
    parser.add_argument("--dump", metavar="DIR", help="write each rank's tensors to DIR/rank<r>.pt")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)  # torchrun's env:// rendezvous
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        image_encoder, text_encoder = make_encoders(args.seed)
        images, texts = make_batch(rank, batch_size(rank, sizes), args.seed)

        a = functional.normalize(image_encoder(images), dim=-1)
        t = functional.normalize(text_encoder(texts), dim=-1)
        a.retain_grad()
        t.retain_grad()
        # The gathered embeddings, rank 0's rows first; gradients flow back to every rank.
        a_all, layout = vargather.all_gather_v_with_layout(a, grad="sum")
        t_all = vargather.all_gather_v(t, grad="sum", sizes=layout.sizes, validate=False)
        a_all.retain_grad()
        t_all.retain_grad()

        loss = contrastive_loss(
            a_all, t_all, layout.local_offset, layout.local_size, args.temperature
        )
        loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs

        print(
            f"rank {rank}/{world}: batch {layout.local_size} of {layout.total}, "
            f"loss {loss.item():.4f}",
            flush=True,
        )
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            grads = (a.grad, t.grad, a_all.grad, t_all.grad)
            assert all(g is not None for g in grads)
            torch.save(
                {
                    "rank": rank,
                    "world_size": world,
                    "sizes": list(layout.sizes),
                    "seed": args.seed,
                    "temperature": args.temperature,
                    "loss": loss.detach(),
                    "a": a.detach(),
                    "t": t.detach(),
                    "upstream_a": a_all.grad,  # dL_r / dA on this rank
                    "upstream_t": t_all.grad,
                    "grad_a": a.grad,  # what vargather's backward returned (all of it)
                    "grad_t": t.grad,
                    "param_grads": {
                        f"image.{n}": p.grad for n, p in image_encoder.named_parameters()
                    }
                    | {f"text.{n}": p.grad for n, p in text_encoder.named_parameters()},
                },
                os.path.join(args.dump, f"rank{rank}.pt"),
            )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Broadcast-based, as ``lucidrains/vector-quantize-pytorch`` gathers: the sizes
exchanged with an ``all_gather``, then every rank's shard broadcast with
``async_op=True`` into freshly allocated buffers, a ``barrier`` and a ``cat``; rank 0
waits for every broadcast before the barrier. Called ``(x, dim)``; not differentiable.

Where the backend refuses the dtype (gloo: int16) only rank 0 sees the refusal (an
unwaited broadcast raises nothing), while its peers wait in the barrier until the
group's timeout: the zoo's member whose refusal races its peers' timeouts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _pad_shape(shape: torch.Size, size: int, dim: int) -> list[int]:
    out = list(shape)
    out[dim] = size
    return out


def all_gather(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if not dist.is_initialized():
        return x
    rank, world = dist.get_rank(), dist.get_world_size()
    size = torch.tensor([x.shape[dim]], dtype=torch.long)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    parts, works = [], []
    for i, n in enumerate(int(s) for s in sizes):
        t = x.contiguous() if i == rank else x.new_empty(_pad_shape(x.shape, n, dim))
        works.append(dist.broadcast(t, src=i, async_op=True))
        parts.append(t)
    if rank == 0:
        for work in works:
            work.wait()
    dist.barrier()
    return torch.cat(parts, dim=dim)

"""``lucidrains/vector-quantize-pytorch``'s gather as it is upstream
(``all_gather_sizes``, then ``all_gather_variably_sized`` and a ``cat``): every rank's
shard broadcast with ``async_op=True`` into freshly allocated buffers, no broadcast
waited for, a ``barrier``. Called ``(x, dim)``; not differentiable.

Not in ``ZOO``: it aborts a rank, and ``tests/test_targets.py`` checks it on its own.
Where the backend refuses the dtype (gloo: int16) nobody waits for the refusing
broadcasts, so every rank returns the unwritten memory of its receive buffers; and
with any dtype the unwaited broadcasts run on gloo's worker threads beside the next
call's collectives, which then pair up wrong (a rank aborts: ``Received data size
doesn't match expected size``). Both once raced (docs/targets.md, "Same JSON every
run"); a rank now settles them one way every run (``vargather.testing.repeatable``):
an unwritten int16 reads 32767, torch's fill for memory nothing wrote.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _pad_shape(shape: torch.Size, size: int, dim: int) -> list[int]:
    return [size if i == dim else s for i, s in enumerate(shape)]


def all_gather(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if not dist.is_initialized():
        return x
    rank, world = dist.get_rank(), dist.get_world_size()
    size = torch.tensor(x.shape[dim], dtype=torch.long)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    parts = []
    for i, n in enumerate(int(s) for s in sizes):
        t = x.contiguous() if i == rank else x.new_empty(_pad_shape(x.shape, n, dim))
        dist.broadcast(t, src=i, async_op=True)
        parts.append(t)
    dist.barrier()
    return torch.cat(parts, dim=dim)

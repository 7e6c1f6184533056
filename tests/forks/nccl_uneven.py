"""NCCL-only: all_gather straight into per-rank buffers of unequal sizes (NCCL's
process group accepts that, gloo does not). Judged with ``--emulate nccl``; no
autograd."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_uneven(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if not dist.is_initialized():
        return x.detach().clone()
    world = dist.get_world_size()
    n = torch.tensor([x.shape[dim]])
    counts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    bufs = []
    for c in counts:
        shape = list(x.shape)
        shape[dim] = int(c)
        bufs.append(x.new_empty(shape))
    dist.all_gather(bufs, x.detach().contiguous())
    return torch.cat(bufs, dim=dim)

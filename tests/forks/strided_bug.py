"""BUG: an equal-size fast path that skips ``.contiguous()``: gloo gathers the strided
view anyway, NCCL refuses it (``--emulate nccl`` finds it). Otherwise pads and
gathers; no autograd."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import pad_dim_to


def gather_fast(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if not dist.is_initialized():
        return x.detach().clone()
    world = dist.get_world_size()
    n = torch.tensor([x.shape[dim]])
    counts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    got = [int(c) for c in counts]
    x = x.detach()
    if len(set(got)) == 1:  # fast path: every shard the same size
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in got]
        dist.all_gather(parts, x)  # BUG: x may be a strided view
        return torch.cat(parts, dim=dim)
    padded = pad_dim_to(x, max(got), dim=dim).contiguous()
    bufs = [torch.empty_like(padded) for _ in got]
    dist.all_gather(bufs, padded)
    return torch.cat([b.narrow(dim, 0, k) for b, k in zip(bufs, got, strict=False)], dim=dim)

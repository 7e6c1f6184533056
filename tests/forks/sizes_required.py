"""Needs the sizes from the caller (no size exchange): pads to ``max(sizes)`` and
all_gathers. Returns the tensor only; no autograd (``--grad none``)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_known(x: torch.Tensor, dim: int, sizes: object) -> torch.Tensor:
    counts = [int(s) for s in (sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes)]  # type: ignore[attr-defined]
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return x.detach().clone()
    d = dim % x.ndim
    shape = list(x.shape)
    shape[d] = max(counts)
    padded = x.new_zeros(shape)
    padded.narrow(d, 0, x.shape[d]).copy_(x.detach())
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p.narrow(d, 0, n) for p, n in zip(parts, counts, strict=False)], dim=d)

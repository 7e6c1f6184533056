"""Gathers along dim 0 only (pads ``x.shape[0]``), no autograd; takes the shard alone:
``--call "(x)" --grad none`` (no dim in the call: dim 0 only; no sizes)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    if not dist.is_initialized():
        return x.detach().clone()
    world = dist.get_world_size()
    n = torch.tensor([x.shape[0]])
    counts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    top = int(max(c.item() for c in counts))
    padded = x.new_zeros((top, *x.shape[1:]))
    padded[: x.shape[0]] = x.detach()
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(c.item())] for p, c in zip(parts, counts, strict=False)], dim=0)

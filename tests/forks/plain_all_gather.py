"""The typical hand-written ragged gather: exchange sizes, pad to the largest, one
``dist.all_gather`` of the padded shards, cut each rank's rows back out, ``cat``.

Signature ``all_gather(x, dim)`` (the README's own example of a fork): the gate infers
the call ``(x, dim)`` from the parameter names. Scope: not differentiable
(``dist.all_gather`` records no gradient); int16 is refused by gloo (``unsupported``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    world = dist.get_world_size()
    size = torch.tensor([x.shape[dim]], dtype=torch.int64)
    sizes_t = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes_t, size)
    sizes = [int(s) for s in sizes_t]
    pad = list(x.shape)
    pad[dim] = max(sizes) - x.shape[dim]
    padded = torch.cat([x, x.new_zeros(pad)], dim=dim).contiguous()
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes, strict=True)], dim=dim)


def dim0_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The same gather where only dim 0 was ever needed: other dims raise."""
    if dim != 0:
        raise ValueError(f"dim0_gather gathers along dim 0 only, got dim={dim}")
    return all_gather(x, dim)

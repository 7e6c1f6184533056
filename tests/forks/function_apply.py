"""The seed's most copied shape: ``AllGather.apply(x)``, a ``torch.autograd.Function``
whose ``forward(ctx, x)`` gathers along dim 0 (padded all_gather of the sizes first)
and whose backward returns the own slice (``local``). Called with ``--call "(x)"``:
no dim (dim 0 only), no sizes, no group."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ._common import pad_dim_to


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            ctx.sizes, ctx.rank = [x.shape[0]], 0
            return x.clone()
        world, rank = dist.get_world_size(), dist.get_rank()
        n = torch.tensor([x.shape[0]], dtype=torch.long)
        counts = [torch.empty_like(n) for _ in range(world)]
        dist.all_gather(counts, n)
        sizes = [int(c.item()) for c in counts]
        padded = pad_dim_to(x, max(sizes)).contiguous()
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        ctx.sizes, ctx.rank = sizes, rank
        return torch.cat([p[:k] for p, k in zip(parts, sizes, strict=True)], dim=0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        offset = sum(ctx.sizes[: ctx.rank])
        return grad.narrow(0, offset, ctx.sizes[ctx.rank])

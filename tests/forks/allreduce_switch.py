"""A module configured at construction: ``AllGather(dim, all_reduce_grads=True)``.

With ``all_reduce_grads`` the backward sums every rank's upstream gradient
(all_reduce) before taking the own slice: the ``sum`` contract; without it, the own
slice only (``local``). ``forward(x, sizes=None) -> (out, sizes)``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function

from ._common import pad_dim_to


class _Gather(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, sizes: Any, all_reduce_grads: bool) -> Any:
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if world == 1:
            got = torch.tensor([x.shape[dim]])
            out = x.clone()
        else:
            if sizes is None:
                n = torch.tensor([x.shape[dim]])
                parts = [torch.empty_like(n) for _ in range(world)]
                dist.all_gather(parts, n)
                got = torch.cat(parts)
            else:
                got = torch.as_tensor(sizes, dtype=torch.long)
            top = int(got.max())
            padded = pad_dim_to(x, top, dim=dim).contiguous()
            buf = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(buf, padded)
            out = torch.cat(
                [b.narrow(dim, 0, int(k)) for b, k in zip(buf, got.tolist(), strict=False)], dim
            )
        ctx.dim, ctx.sizes, ctx.rank = dim, got.tolist(), rank
        ctx.all_reduce_grads = all_reduce_grads and world > 1
        return out, got

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> Any:
        if ctx.all_reduce_grads:
            grad = grad.contiguous().clone()
            dist.all_reduce(grad)
        return grad.split(ctx.sizes, dim=ctx.dim)[ctx.rank], None, None, None


class AllGather(nn.Module):
    def __init__(self, dim: int = 0, all_reduce_grads: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.all_reduce_grads = all_reduce_grads

    def forward(self, x: torch.Tensor, sizes: Any = None) -> Any:
        return _Gather.apply(x, self.dim, sizes, self.all_reduce_grads)

"""Mutant: reduce_scatter_v's backward keeps only this rank's upstream gradient (placed
at its own block, zeros elsewhere) instead of gathering every rank's."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "the gradient is this rank's own upstream gradient at its block, not cat_r g_r"


class _OwnBlock(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, sizes: list[int], dim: int, kwargs: dict[str, Any]
    ) -> torch.Tensor:
        ctx.shape, ctx.sizes, ctx.dim = x.shape, sizes, dim % x.ndim
        ctx.rank = torch.distributed.get_rank(kwargs.get("group"))
        return vargather.reduce_scatter_v(x.detach(), sizes, dim, **kwargs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        full = g.new_zeros(ctx.shape)
        full.narrow(ctx.dim, sum(ctx.sizes[: ctx.rank]), ctx.sizes[ctx.rank]).copy_(g)
        return full, None, None, None


def reduce_scatter_v(x: torch.Tensor, sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = _OwnBlock.apply(x, list(sizes), dim, kwargs)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    assert isinstance(out, torch.Tensor)
    return out

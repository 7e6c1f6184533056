"""Mutant: scatter_v's backward gathers nothing: src's input gradient holds only its own
upstream gradient at its block (zeros elsewhere)."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "src's dx is its own upstream gradient at its block, not cat_r g_r"


class _OwnBlock(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, sizes: list[int], src: int, dim: int, kwargs: dict[str, Any]
    ) -> torch.Tensor:
        group = kwargs.get("group")
        ctx.shape, ctx.sizes, ctx.dim, ctx.src = x.shape, sizes, dim % x.ndim, src
        ctx.rank = torch.distributed.get_rank(group) if torch.distributed.is_initialized() else 0
        return vargather.scatter_v(x.detach(), sizes, src, dim, **kwargs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dx = g.new_zeros(ctx.shape)
        if ctx.rank == ctx.src:
            at = sum(ctx.sizes[: ctx.rank])
            dx.narrow(ctx.dim, at, ctx.sizes[ctx.rank]).copy_(g)
        return dx, None, None, None, None


def scatter_v(x: torch.Tensor, sizes: Any, src: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = _OwnBlock.apply(x, list(sizes), src, dim, kwargs)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    assert isinstance(out, torch.Tensor)
    return out

"""Mutant: gather_v's backward never scatters the root's upstream gradient back: every
rank's input gradient is zeros."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "dx_r is zeros: the root's upstream gradient is never scattered back"


class _NotScattered(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, dst: int, dim: int, kwargs: dict[str, Any]
    ) -> torch.Tensor:
        ctx.shape = x.shape
        return vargather.gather_v(x.detach(), dst, dim, **kwargs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return g.new_zeros(ctx.shape), None, None, None


def gather_v(x: torch.Tensor, dst: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = _NotScattered.apply(x, dst, dim, kwargs)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    assert isinstance(out, torch.Tensor)
    return out

"""Mutant: all_to_all_v's gradient is twice the reverse exchange."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "the backward scales the reverse exchange by 2"


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def all_to_all_v(x: torch.Tensor, send_sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.all_to_all_v(x, send_sizes, dim, **kwargs)
    if not out.requires_grad:
        return out
    scaled = _Twice.apply(out)  # type: ignore[no-untyped-call]  # Function.apply is untyped
    assert isinstance(scaled, torch.Tensor)
    return scaled

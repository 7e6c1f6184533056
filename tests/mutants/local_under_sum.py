"""Mutant: the ``sum`` contract's backward returns the local slice (the seed's)."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "under grad='sum' the backward returns g_r[o_r : o_r + n_r] (the local contract)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="local", seed=8)


class _Local(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        layout = ctx.plan.layout
        if ctx.plan.contract == "sum" and layout.total > 0:
            return grad_output.narrow(layout.dim, layout.local_offset, layout.local_size), None
        return GatherVFunction.backward(ctx, grad_output)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_Local, **kwargs)

"""Mutant: the backward finds a rank's block at ``rank * max`` instead of its offset."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = (
    "the local contract's backward slices the gradient at rank * max_size (clamped to stay "
    "in range) instead of at o_r = n_0 + ... + n_{r-1}"
)
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="sum", seed=10)


class _RankTimesMax(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        layout = ctx.plan.layout
        if ctx.plan.contract == "local" and layout.total > 0:
            n = layout.local_size
            start = min(layout.rank * layout.max_size, layout.total - n)
            return grad_output.narrow(layout.dim, start, n), None
        return GatherVFunction.backward(ctx, grad_output)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_RankTimesMax, **kwargs)

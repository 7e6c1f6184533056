"""Mutant: the ``sum`` contract's gradient is multiplied by the world size."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "under grad='sum' the gradient is scaled by W (the 'multiply by world_size' workaround)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="local", seed=9)


class _TimesW(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        grad, _ = GatherVFunction.backward(ctx, grad_output)
        if ctx.plan.contract == "sum" and grad is not None:
            grad = grad * ctx.plan.layout.world_size
        return grad, None


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_TimesW, **kwargs)

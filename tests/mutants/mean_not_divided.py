"""Mutant: the ``mean`` contract forgets to divide by the world size."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "under grad='mean' the backward returns the sum (no division by W)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="sum", seed=13)


class _Undivided(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if ctx.plan.contract == "mean":
            ctx.plan = dataclasses.replace(ctx.plan, contract="sum")
        return GatherVFunction.backward(ctx, grad_output)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_Undivided, **kwargs)

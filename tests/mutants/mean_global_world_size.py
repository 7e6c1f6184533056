"""Mutant: the ``mean`` contract divides by the global world size, not the group's."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "under grad='mean' the sum is divided by dist.get_world_size() (the world's, not the group's)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="mean", seed=14)


class _GlobalMean(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if ctx.plan.contract != "mean":
            return GatherVFunction.backward(ctx, grad_output)
        ctx.plan = dataclasses.replace(ctx.plan, contract="sum")
        grad, _ = GatherVFunction.backward(ctx, grad_output)
        return (None if grad is None else grad / dist.get_world_size()), None


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_GlobalMean, **kwargs)

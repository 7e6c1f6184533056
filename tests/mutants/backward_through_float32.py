"""Mutant: the backward reduces gradients in float32 (complex64)."""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from vargather._autograd import GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "the backward casts the upstream gradient to float32 (complex64) before reducing it"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", upstream="real", seed=18)


class _Float32Backward(GatherVFunction):
    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        wire = torch.complex64 if grad_output.is_complex() else torch.float32
        grad, _ = GatherVFunction.backward(ctx, grad_output.to(wire))
        return (None if grad is None else grad.to(grad_output.dtype)), None


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_Float32Backward, **kwargs)

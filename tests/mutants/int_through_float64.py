"""Mutant: integer payloads travel as float64."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "integer tensors are sent as float64 and cast back (int64 beyond 2**53 loses bits)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="int32", requires_grad=False, seed=17)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return gather(x, dim, **kwargs)
    return gather(x.to(torch.float64), dim, **kwargs).to(x.dtype)

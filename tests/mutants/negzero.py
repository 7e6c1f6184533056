"""Mutant: ``out + 0.0`` (turns -0.0 into +0.0 and quiets signaling NaNs)."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "the result of a float gather is returned as out + 0.0, so -0.0 becomes +0.0"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="int64", requires_grad=False, seed=7)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = gather(x, dim, **kwargs)
    return out + 0.0 if out.is_floating_point() or out.is_complex() else out

"""Mutant: a negative ``dim`` is normalized one too low."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "a negative dim is normalized as dim + ndim - 1 (clamped at 0) instead of dim + ndim"
BENIGN = GatherCase(shapes=((2, 3, 2), (2, 1, 2)), dim=1, dtype="float32", seed=5)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    if dim < 0:
        dim = max(dim + x.ndim - 1, 0)
    return gather(x, dim, **kwargs)

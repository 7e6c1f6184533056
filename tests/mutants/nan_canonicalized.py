"""Mutant: NaNs come out as the canonical NaN (payload and sign lost)."""

from __future__ import annotations

import math
from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "every NaN of a real float result is replaced by the canonical NaN (payloads lost)"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float64", values="integers", seed=16)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = gather(x, dim, **kwargs)
    if not out.is_floating_point():
        return out
    return torch.where(out.isnan(), torch.full_like(out, math.nan), out)

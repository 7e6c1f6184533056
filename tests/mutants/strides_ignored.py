"""Mutant: the input's storage is read as if it were contiguous."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "the input is read with contiguous strides from its storage offset, whatever its strides"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=15)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    strides = []
    step = 1
    for size in reversed(x.shape):
        strides.append(step)
        step *= max(size, 1)
    raw = x.as_strided(x.shape, tuple(reversed(strides)), x.storage_offset())
    return gather(raw, dim, **kwargs)

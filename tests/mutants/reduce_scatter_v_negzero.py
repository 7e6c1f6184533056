"""Mutant: reduce_scatter_v returns ``out + 0.0`` (-0.0 becomes +0.0)."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "a float result is returned as out + 0.0, so -0.0 becomes +0.0"


def reduce_scatter_v(x: torch.Tensor, sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.reduce_scatter_v(x, sizes, dim, **kwargs)
    return out + 0.0 if out.is_floating_point() else out

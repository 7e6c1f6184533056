"""Mutant: scatter_v adds +0.0 to what it returns, turning -0.0 into +0.0."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "-0.0 becomes +0.0 (the result is x + 0.0 for floating dtypes)"


def scatter_v(x: torch.Tensor, sizes: Any, src: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.scatter_v(x, sizes, src, dim, **kwargs)
    return out + 0.0 if out.is_floating_point() else out

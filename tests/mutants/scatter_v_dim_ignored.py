"""Mutant: scatter_v always cuts along dim 0, whatever ``dim`` says."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "dim is ignored: the blocks are cut along dim 0"


def scatter_v(x: torch.Tensor, sizes: Any, src: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return vargather.scatter_v(x, sizes, src, 0, **kwargs)

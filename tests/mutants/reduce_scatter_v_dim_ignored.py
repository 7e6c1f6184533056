"""Mutant: reduce_scatter_v always splits along dim 0, whatever ``dim`` says."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "dim is ignored: the blocks are cut along dim 0 (when the sizes fit there)"


def reduce_scatter_v(x: torch.Tensor, sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    if x.shape[0] == sum(sizes):
        return vargather.reduce_scatter_v(x, sizes, 0, **kwargs)
    return vargather.reduce_scatter_v(x, sizes, dim, **kwargs)

"""Mutant: gather_v always joins along dim 0, whatever ``dim`` says."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "dim is ignored: the blocks are joined along dim 0"


def gather_v(x: torch.Tensor, dst: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    kwargs.pop("sizes", None)  # the sizes along dim, not along 0
    return vargather.gather_v(x, dst, 0, **kwargs)

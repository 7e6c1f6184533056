"""Mutant: all_to_all_v treats a rank that receives nothing as receiving one zero row."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "an empty result comes back as one row of zeros"


def all_to_all_v(x: torch.Tensor, send_sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.all_to_all_v(x, send_sizes, dim, **kwargs)
    if out.shape[dim] == 0:
        shape = list(out.shape)
        shape[dim] = 1
        return out.new_zeros(shape)
    return out

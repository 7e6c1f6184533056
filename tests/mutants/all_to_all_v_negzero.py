"""Mutant: all_to_all_v returns ``out + 0.0`` (-0.0 becomes +0.0), a data movement
that computes."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "a float result is returned as out + 0.0, so a -0.0 sent arrives as +0.0"


def all_to_all_v(x: torch.Tensor, send_sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.all_to_all_v(x, send_sizes, dim, **kwargs)
    return out + 0.0 if out.is_floating_point() else out

"""Mutant: all_to_all_v concatenates the received blocks in reverse rank order."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "the received blocks are concatenated last source first"


def all_to_all_v(x: torch.Tensor, send_sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    res = vargather.all_to_all_v_with_layout(x, send_sizes, dim, **kwargs)
    d = dim % x.ndim
    blocks = list(torch.split(res.tensor, list(res.layout.sizes), dim=d))
    return torch.cat(blocks[::-1], dim=d)

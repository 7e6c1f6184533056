"""Mutant: reduce_scatter_v leaves this rank's own contribution out of its sum."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "rank r returns sum over j != r of x_j's block r (its own term is missing)"


def reduce_scatter_v(x: torch.Tensor, sizes: Any, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = vargather.reduce_scatter_v(x, sizes, dim, **kwargs)
    rank = torch.distributed.get_rank(kwargs.get("group"))
    own = x.narrow(dim, sum(list(sizes)[:rank]), list(sizes)[rank])
    return out - own

"""Mutant: gather_v's root joins the blocks in reverse rank order."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "dst joins the blocks last rank first"


def gather_v(x: torch.Tensor, dst: int, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    kwargs.pop("sizes", None)
    gathered, layout = vargather.all_gather_v_with_layout(x, dim, **kwargs)
    group = kwargs.get("group")
    if torch.distributed.is_initialized() and torch.distributed.get_rank(group) != dst:
        return x.narrow(dim, 0, 0) + gathered.narrow(dim, 0, 0).sum() * 0
    blocks = torch.split(gathered, list(layout.sizes), dim)
    return torch.cat(blocks[::-1], dim)

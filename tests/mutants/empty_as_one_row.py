"""Mutant: an empty shard is sent as one row of zeros."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather, layout_of

BUG = "a rank with nothing to send (n_r = 0) sends one row of zeros instead"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=11)


def all_gather_v(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Any = None,
    group: Any = None,
    grad: str = "sum",
    transport: str = "auto",
) -> torch.Tensor:
    layout = layout_of(x, dim, sizes=sizes, group=group, grad=grad, transport=transport)
    if layout.local_size == 0:
        shape = list(x.shape)
        shape[layout.dim] = 1
        x = torch.zeros(shape, dtype=x.dtype, requires_grad=x.requires_grad)
    return gather(x, dim, group=group, grad=grad, transport=transport)

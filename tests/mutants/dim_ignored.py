"""Mutant: the shards are gathered as flat vectors, as if ``dim`` were the leading one."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather, layout_of

BUG = (
    "dim is ignored by the transport: shards are concatenated flat (rank-major) and "
    "viewed as the output shape, right only when every dimension before dim is 1"
)
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=4)


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
    flat = gather(x.reshape(-1), 0, group=group, grad=grad, transport=transport)
    return flat.view(layout.output_shape)

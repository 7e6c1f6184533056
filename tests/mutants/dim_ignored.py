"""Mutant: the shards are gathered as flat vectors, as if ``dim`` were the leading one."""

from __future__ import annotations

from typing import Any

import torch

import vargather
from vargather._cases import GatherCase

from ._base import gather

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
    layout = vargather.gather_layout(
        x,
        dim,
        sizes=sizes,
        group=group,
        grad=grad,  # type: ignore[arg-type]  # passed through: validation is vargather's
        transport=transport,  # type: ignore[arg-type]  # as above
    )
    flat = gather(x.reshape(-1), 0, group=group, grad=grad, transport=transport)
    return flat.view(layout.output_shape)

"""Mutant: the returned layout lists the sizes sorted, not in rank order."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import vargather
from vargather.testing.cases import GatherCase

BUG = "the Layout returned with the tensor has its sizes sorted largest first, not in rank order"
BENIGN = GatherCase(shapes=((3, 2), (1, 2)), dim=0, dtype="float32", seed=19)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    out, layout = vargather.all_gather_v_with_layout(x, dim, **kwargs)
    ordered = tuple(sorted(layout.sizes, reverse=True))
    return out, dataclasses.replace(layout, sizes=ordered)

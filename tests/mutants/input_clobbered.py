"""Mutant: the input's memory is used as scratch space and left zeroed."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "after the gather the input tensor's memory is zeroed (reused as a scratch buffer)"
BENIGN = GatherCase(shapes=((0, 3), (0, 3)), dim=0, dtype="float32", seed=20)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    out = gather(x, dim, **kwargs)
    if out.data_ptr() == x.data_ptr() and out.numel():  # the identity: copy out first
        out = out.clone()
    x.detach().zero_()
    return out

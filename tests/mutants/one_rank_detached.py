"""Mutant: a world of one rank returns a detached copy (gradients stop)."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "without peers (one rank, or no torch.distributed) the result is x.detach().clone()"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=12)


def _detached(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone()


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, one_rank=_detached, **kwargs)

"""Mutant: values travel as float32 (complex64) and are cast back."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "the payload is sent as float32 (complex64 for complex) and cast back to the input dtype"
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=6)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    wire = torch.complex64 if x.is_complex() else torch.float32
    return gather(x.to(wire), dim, **kwargs).to(x.dtype)

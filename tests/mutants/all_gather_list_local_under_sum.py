"""Mutant: all_gather_list gives the local gradient whatever ``grad`` says."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "grad='sum' and 'mean' behave as 'local' (only this rank's own upstream gradient)"


def all_gather_list(x: torch.Tensor, **kwargs: Any) -> list[torch.Tensor]:
    kwargs["grad"] = "local"
    return vargather.all_gather_list(x, **kwargs)

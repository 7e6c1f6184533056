"""Mutant: all_gather_list's ``mean`` gradient is not divided by the world size."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "grad='mean' returns the sum gradient"


def all_gather_list(x: torch.Tensor, **kwargs: Any) -> list[torch.Tensor]:
    if kwargs.get("grad") == "mean":
        kwargs["grad"] = "sum"
    return vargather.all_gather_list(x, **kwargs)

"""Mutant: all_gather_list returns every peer's tensor flattened to 1-d."""

from __future__ import annotations

from typing import Any

import torch

import vargather

BUG = "the peers' tensors come back flat (their shapes lost); only this rank's keeps it"


def all_gather_list(x: torch.Tensor, **kwargs: Any) -> list[torch.Tensor]:
    rank = torch.distributed.get_rank(kwargs.get("group"))
    outs = vargather.all_gather_list(x, **kwargs)
    return [o if r == rank else o.reshape(-1) for r, o in enumerate(outs)]

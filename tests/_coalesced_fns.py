"""Coalesced gathers for the ``coalesced`` property's own tests (``tests/test_coalesced.py``):
vargather's ``all_gather_v_coalesced`` with one thing broken each, importable in the
rank processes as ``tests._coalesced_fns:NAME`` (``Implementation.coalesced_ref``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import vargather


def swapped(tensors: Sequence[torch.Tensor], dim: Any = 0, **kwargs: Any) -> list[torch.Tensor]:
    """The first two tensors' outputs come back swapped."""
    out = vargather.all_gather_v_coalesced(tensors, dim, **kwargs)
    if len(out) >= 2:
        out[0], out[1] = out[1], out[0]
    return out


def always_sum(
    tensors: Sequence[torch.Tensor], dim: Any = 0, *, grad: Any = "sum", **kwargs: Any
) -> list[torch.Tensor]:
    """Gradients under ``sum`` whatever the ``grad=`` asked."""
    del grad
    return vargather.all_gather_v_coalesced(tensors, dim, grad="sum", **kwargs)


def refuses(tensors: Sequence[torch.Tensor], dim: Any = 0, **kwargs: Any) -> list[torch.Tensor]:
    """Raises the same error on every rank, before any collective."""
    raise ValueError(f"refusing {len(tensors)} tensor(s)")


def crashes(tensors: Sequence[torch.Tensor], dim: Any = 0, **kwargs: Any) -> list[torch.Tensor]:
    """Rank 1's process dies inside the call."""
    if dist.get_rank() == 1:
        os._exit(3)
    return vargather.all_gather_v_coalesced(tensors, dim, **kwargs)

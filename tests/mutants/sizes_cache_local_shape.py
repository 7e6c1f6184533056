"""Mutant: a sizes cache keyed on the local shape only, stale when another rank's changes."""

from __future__ import annotations

from typing import Any

import torch

import vargather
from vargather._layout import Layout
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = (
    "the exchanged layout is cached per process, keyed on this rank's shard shape, dtype "
    "and dim only: after another rank's size changes, a rank whose own shape did not "
    "reuses the stale sizes (and skips the exchange its peers run)"
)
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=21)
STATEFUL = True
"""Its bug shows only after earlier calls (a call sequence), not in one case alone."""

_CACHE: dict[tuple[object, ...], Layout] = {}
_EXCHANGE_TIMEOUT = 2.0


def _cached_layout(x: torch.Tensor, dim: int, **kwargs: Any) -> Layout:
    group = kwargs["group"]
    world = torch.distributed.get_world_size(group) if torch.distributed.is_initialized() else 1
    key = (tuple(x.shape), x.dtype, dim, kwargs["grad"], kwargs["transport"], world)
    layout = _CACHE.get(key)
    if layout is None:
        # The short timeout only keeps the suite quick: the ranks out of step (some in
        # this exchange, the cache hits already in the payload's collective) fail in
        # seconds instead of the group's timeout.
        layout = _CACHE[key] = vargather.gather_layout(x, dim, timeout=_EXCHANGE_TIMEOUT, **kwargs)
    return layout


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, plan=_cached_layout, **kwargs)

"""What the kit, the bench and the scale simulation may use of the internals; not a stable API.

The testing kit (``vargather.testing``), the command line and its bench
(``vargather._cli``) and ``scripts/scale_sim.py`` import what the public API does not
offer from here and from no private module, so the library may move its modules freely:
a move updates the imports below, and these names stay. Nothing here is promised to
users; it changes with the library, in the same release.

Where it sits: at the top of the library, beside ``__init__`` (it imports private
modules, and no library module imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from ._choices import TRANSPORT_NAMES, unsupported_reason
from ._collectives import COLLECTIVES, CollectiveName
from ._comm import collectives_issued, swap_issued_counter
from ._round_state import (
    FAMILY_FUSED_MAX,
    FUSED_MAX_BYTES,
    SHRINK_AFTER,
    SMALL_BYTES,
    WIDE_MIN_BYTES,
    FusedState,
    replace_state,
    state_of,
    swap_state,
)
from ._transport import (
    GLOO_REDUCE_SCATTER_MIN_BYTES,
    GLOO_SMALL_BYTES,
    NCCL_SMALL_BYTES,
    auto_transport_name,
)
from ._wire import HEADER_BYTES

__all__ = [
    "HEADER_BYTES",
    "SHRINK_AFTER",
    "THRESHOLDS",
    "TRANSPORT_NAMES",
    "Counts",
    "FusedState",
    "Threshold",
    "auto_transport_name",
    "collectives_issued",
    "replace_state",
    "state_of",
    "swap_issued_counter",
    "swap_state",
    "unsupported_reason",
]

Counts: TypeAlias = Literal["gathered", "per-rank", "per-block"]
"""What a threshold's bytes count: ``gathered``, the bytes of a gather's whole output
(every rank's payload); ``per-rank``, one rank's payload (all its tensors);
``per-block``, the largest block one rank sends one peer (an all_to_all-shaped
round's slot)."""


@dataclass(frozen=True)
class Threshold:
    """A byte count at which vargather changes its code path for some collectives.

    ``name``: the constant's name in the library; ``bytes``: its value; ``counts``:
    what the bytes count (``Counts``); ``collectives``: whose path it changes;
    ``switch``: what changes there (one sentence).
    """

    name: str
    bytes: int
    counts: Counts
    collectives: tuple[CollectiveName, ...]
    switch: str


_GATHERS: Final = tuple(n for n, c in COLLECTIVES.items() if c.round == "all_gather")
"""The collectives whose round is all_gather-shaped (``_fused``)."""
_SCATTERS: Final = tuple(n for n, c in COLLECTIVES.items() if c.round == "all_to_all")
"""The collectives whose round is all_to_all-shaped (``_family``)."""
_GATHER_BACKWARD: Final = tuple(n for n in _GATHERS if n != "all_gather_list")
"""The gathers whose backward goes through ``_transport`` (``all_gather_list``'s is
``reduce_scatter_v``'s)."""

THRESHOLDS: Final[tuple[Threshold, ...]] = (
    Threshold(
        "GLOO_SMALL_BYTES",
        GLOO_SMALL_BYTES,
        "gathered",
        _GATHERS,
        "on gloo, transport='auto' gathers in one collective below it and by one "
        "broadcast per rank from it",
    ),
    Threshold(
        "NCCL_SMALL_BYTES",
        NCCL_SMALL_BYTES,
        "gathered",
        _GATHERS,
        "on NCCL, transport='auto' pads to one all_gather below it whatever the padding",
    ),
    Threshold(
        "GLOO_REDUCE_SCATTER_MIN_BYTES",
        GLOO_REDUCE_SCATTER_MIN_BYTES,
        "gathered",
        _GATHER_BACKWARD,
        "on gloo, the copy-free transports' backward is an alltoallv (or an "
        "all_reduce) below it and an uneven reduce_scatter from it",
    ),
    Threshold(
        "FUSED_MAX_BYTES",
        FUSED_MAX_BYTES,
        "per-rank",
        _GATHERS,
        "the largest payload per rank that rides in the equal-size gather round",
    ),
    Threshold(
        "WIDE_MIN_BYTES",
        WIDE_MIN_BYTES,
        "per-rank",
        _GATHERS,
        "past it a group's one round becomes the wide round of direct sends",
    ),
    Threshold(
        "SMALL_BYTES",
        SMALL_BYTES,
        "gathered",
        _GATHERS,
        "what the gather round may always carry in all, however skewed the sizes",
    ),
    Threshold(
        "FAMILY_FUSED_MAX",
        FAMILY_FUSED_MAX,
        "per-block",
        _SCATTERS,
        "the largest block of the all_to_all-shaped round's equal slots; past it the round goes wide (a learned slot per pair of ranks)",
    ),
)
"""Every collective's byte thresholds, the family's included (``Threshold``)."""

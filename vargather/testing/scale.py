"""The testing kit's payload scale: the byte sizes large cases are drawn around.

Where it sits: beside the case model (``cases``), below ``strategies``, which draws
most cases small (a few elements: fast to run, fast to shrink) and some large, with
every rank's shard sized around one of the targets here. Real gathers switch
behaviour with size (chunking, bucketing, another transport above a threshold, a
fused or cached path for small payloads), so a large case puts a rank's shard just
below, at, or just above such a threshold: ``2^k - d``, ``2^k``, ``2^k + d`` rows for a
small ``d`` that Hypothesis shrinks toward 0, so a failing large case shrinks to the
smallest threshold that still fails, ``d`` rows off it.

The targets, per rank (``per_rank_targets``):

* powers of two in bytes, from ``MIN_LARGE_BYTES`` (1 KiB) up to ``max_payload``;
* vargather's own thresholds at their real values, read from the library
  (``library_thresholds``): the ``auto`` transport switch and the backward switch of
  ``vargather._transport``, which count the bytes of the whole gathered output, so
  the per-rank target is the threshold divided by the group size (every rank at the
  target: the output is the threshold itself, give or take the drawn ``d``); and the
  largest payload per rank that rides in the fused round (``vargather._round_state``).

``max_payload`` (``python -m vargather check --max-payload``) bounds the bytes of any
one rank's shard; 0 draws no large case at all.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Final, NamedTuple

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "MIN_LARGE_BYTES",
    "Target",
    "format_bytes",
    "library_thresholds",
    "payload_summary",
    "per_rank_targets",
    "sequence_length",
]

DEFAULT_MAX_PAYLOAD: Final = 4 * 1024 * 1024
"""Bytes per rank's shard a large case may reach by default (4 MiB: with 4 ranks the
gathered output reaches vargather's 16 MiB backward switch)."""

MIN_LARGE_BYTES: Final = 1024
"""The smallest power-of-two target (1 KiB): small cases reach about that already."""

_LIBRARY_MODULES: Final = {
    "vargather._transport": "gathered",
    "vargather._round_state": "per-rank",
}
"""Where vargather keeps its size thresholds, and what they count: ``_transport``'s
count the bytes of the gathered output (``payload_bytes``), ``_round_state``'s one rank's
payload (``FUSED_MAX_BYTES``). A module missing from this version is skipped."""

_NOT_THRESHOLDS: Final = frozenset({"vargather._wire.HEADER_BYTES"})
"""``*_BYTES`` constants that are sizes of a format, not thresholds."""


class Target(NamedTuple):
    """A per-rank shard size large cases are drawn around, and where it comes from."""

    bytes: int
    source: str


def library_thresholds() -> dict[str, tuple[int, str]]:
    """vargather's own byte thresholds, by name (``vargather._transport.GLOO_SMALL_BYTES``),
    read from the library at run time: every public ``*_BYTES`` integer constant of the
    modules that choose a code path by size, with what it counts (``"gathered"``: the
    bytes of the gathered output; ``"per-rank"``: one rank's payload)."""
    found: dict[str, tuple[int, str]] = {}
    for name, counts in _LIBRARY_MODULES.items():
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in getattr(module, "__all__", ()):
            value = getattr(module, attr, None)
            key = f"{name}.{attr}"
            if (
                attr.endswith("_BYTES")
                and type(value) is int
                and value > 0
                and key not in _NOT_THRESHOLDS
            ):
                found[key] = (value, counts)
    return found


def sequence_length() -> int:
    """How many calls a call sequence may hold: two more than the idle calls after which
    vargather's fused path shrinks a group's capacity (``_round_state.SHRINK_AFTER``, read
    from the library; 8 when it has none), so one sequence can grow, idle and shrink it."""
    try:
        module = importlib.import_module("vargather._round_state")
    except ImportError:
        return 10
    shrink = getattr(module, "SHRINK_AFTER", 8)
    return (shrink if type(shrink) is int and shrink > 0 else 8) + 2


def per_rank_targets(group_size: int, max_payload: int) -> tuple[Target, ...]:
    """The per-rank byte targets of a group of ``group_size`` ranks, ascending, none
    above ``max_payload`` (empty when it is below ``MIN_LARGE_BYTES``)."""
    if max_payload < MIN_LARGE_BYTES:
        return ()
    targets: dict[int, str] = {}
    for k in range(int(math.log2(MIN_LARGE_BYTES)), int(math.log2(max_payload)) + 1):
        targets[1 << k] = f"2^{k} bytes"
    for name, (value, counts) in sorted(library_thresholds().items(), key=lambda kv: kv[1]):
        gathered = counts == "gathered" and group_size > 1
        per_rank = -(-value // group_size) if gathered else value
        if MIN_LARGE_BYTES <= per_rank <= max_payload:
            where = name.removeprefix("vargather.")
            label = f"{where} / {group_size} ranks" if gathered else where
            targets[per_rank] = f"{targets[per_rank]}, {label}" if per_rank in targets else label
    return tuple(Target(b, s) for b, s in sorted(targets.items()))


def format_bytes(n: int) -> str:
    """``4100 B``, ``4 KiB``, ``1.5 MiB``: exact bytes first where not a round unit."""
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            text = f"{value:g} {unit}" if value == int(value) else f"{value:.2f} {unit}"
            return text if n % size == 0 else f"{n} B ({text})"
    return f"{n} B"


def payload_summary(per_rank: Sequence[int]) -> str:
    """Per-rank shard bytes in words: ``[4100, 0, 4096] bytes per rank (largest 4100 B
    (4.00 KiB)), 8196 bytes gathered``."""
    total = sum(per_rank)
    return (
        f"{list(per_rank)} bytes per rank (largest {format_bytes(max(per_rank, default=0))}), "
        f"{total} bytes gathered"
    )

"""The testing kit's payload scale: the byte sizes large cases are drawn around.

Where it sits: beside the case model (``cases``), below ``strategies``, which draws
most cases small and some large, every rank's shard just below, at, or just above one
of the targets here: real gathers switch behaviour with size (docs/property-suite.md,
"Payload scale").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, NamedTuple

DEFAULT_MAX_PAYLOAD: Final = 4 * 1024 * 1024
"""Bytes per rank's shard a large case may reach by default (4 MiB: with 4 ranks the
gathered output reaches vargather's 16 MiB backward switch)."""

MIN_LARGE_BYTES: Final = 1024
"""The smallest power-of-two target (1 KiB): small cases reach about that already."""


class Target(NamedTuple):
    """A per-rank shard size large cases are drawn around, and where it comes from."""

    bytes: int
    source: str


def library_thresholds() -> dict[str, tuple[int, str]]:
    """vargather's own byte thresholds, by name (``GLOO_SMALL_BYTES``), as the library
    declares them (every collective's), with what each counts (``"gathered"``: the bytes
    of the gathered output; ``"per-rank"``: one rank's payload; ``"per-block"``: the
    largest block one rank sends one peer, drawn around as a rank's payload)."""
    from vargather.internal import THRESHOLDS

    return {t.name: (t.bytes, t.counts) for t in THRESHOLDS if t.bytes > 0}


def sequence_length() -> int:
    """How many calls a call sequence may hold: two more than the idle calls after which
    vargather's one round shrinks a group's capacity (``vargather.internal.SHRINK_AFTER``),
    so one sequence can grow, idle and shrink it."""
    from vargather.internal import SHRINK_AFTER

    return SHRINK_AFTER + 2


def per_rank_targets(group_size: int, max_payload: int) -> tuple[Target, ...]:
    """The per-rank byte targets of a group of ``group_size`` ranks, ascending: powers of
    two from ``MIN_LARGE_BYTES``, and vargather's own thresholds at their real values (one
    that counts the gathered output divided by the group size), none above
    ``max_payload`` (``check --max-payload``; empty when it is below ``MIN_LARGE_BYTES``)."""
    if max_payload < MIN_LARGE_BYTES:
        return ()
    targets: dict[int, str] = {}
    for k in range(int(math.log2(MIN_LARGE_BYTES)), int(math.log2(max_payload)) + 1):
        targets[1 << k] = f"2^{k} bytes"
    for name, (value, counts) in sorted(library_thresholds().items(), key=lambda kv: kv[1]):
        gathered = counts == "gathered" and group_size > 1
        per_rank = -(-value // group_size) if gathered else value
        if MIN_LARGE_BYTES <= per_rank <= max_payload:
            label = f"{name} / {group_size} ranks" if gathered else name
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

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
  (``library_thresholds``: the ``auto`` transport switch and the backward switch of
  ``vargather._transport``, the fused path's capacities when the library has one).
  These count the bytes of the whole gathered output, so the per-rank target is the
  threshold divided by the group size (every rank at the target: the output is the
  threshold itself, give or take the drawn ``d``).

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
]

DEFAULT_MAX_PAYLOAD: Final = 4 * 1024 * 1024
"""Bytes per rank's shard a large case may reach by default (4 MiB: with 4 ranks the
gathered output reaches vargather's 16 MiB backward switch)."""

MIN_LARGE_BYTES: Final = 1024
"""The smallest power-of-two target (1 KiB): small cases reach about that already."""

_LIBRARY_MODULES: Final = ("vargather._transport", "vargather._fused")
"""Where vargather keeps its size thresholds; a module missing from this version is
skipped (the fused small-payload path is newer than the transports)."""


class Target(NamedTuple):
    """A per-rank shard size large cases are drawn around, and where it comes from."""

    bytes: int
    source: str


def library_thresholds() -> dict[str, int]:
    """vargather's own byte thresholds, by name (``vargather._transport.GLOO_SMALL_BYTES``),
    read from the library at run time: every public ``*_BYTES`` integer constant and
    every integer in a public ``*_CAPACITIES``/``*_BUCKETS`` tuple of the modules that
    choose a code path by size. Each counts the bytes of the gathered output."""
    found: dict[str, int] = {}
    for name in _LIBRARY_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in getattr(module, "__all__", dir(module)):
            value = getattr(module, attr, None)
            if attr.endswith("_BYTES") and type(value) is int and value > 0:
                found[f"{name}.{attr}"] = value
            elif attr.endswith(("_CAPACITIES", "_BUCKETS")) and isinstance(value, tuple):
                for i, item in enumerate(value):
                    if type(item) is int and item > 0:
                        found[f"{name}.{attr}[{i}]"] = item
    return found


def per_rank_targets(group_size: int, max_payload: int) -> tuple[Target, ...]:
    """The per-rank byte targets of a group of ``group_size`` ranks, ascending, none
    above ``max_payload`` (empty when it is below ``MIN_LARGE_BYTES``)."""
    if max_payload < MIN_LARGE_BYTES:
        return ()
    targets: dict[int, str] = {}
    for k in range(int(math.log2(MIN_LARGE_BYTES)), int(math.log2(max_payload)) + 1):
        targets[1 << k] = f"2^{k} bytes"
    for name, total in sorted(library_thresholds().items(), key=lambda kv: kv[1]):
        per_rank = -(-total // group_size)
        if MIN_LARGE_BYTES <= per_rank <= max_payload:
            where = name.removeprefix("vargather.")
            label = where if group_size == 1 else f"{where} / {group_size} ranks"
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

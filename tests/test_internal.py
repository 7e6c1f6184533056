"""The declared internal surface (``vargather.internal``): what the kit, the bench and
the scale simulation use of the internals, with every byte threshold of every
collective named once and equal to the constant the library decides with."""

from __future__ import annotations

import importlib
import pathlib

import vargather
from vargather import internal

PACKAGE = pathlib.Path(vargather.__file__).parent


def _library_constant(name: str) -> int:
    """``name``'s value in whichever private module defines it."""
    found = set()
    for path in PACKAGE.glob("_*.py"):
        module = importlib.import_module(f"vargather.{path.stem}")
        value = vars(module).get(name)
        if type(value) is int:
            found.add(value)
    assert len(found) == 1, (name, found)
    return found.pop()


def test_every_threshold_is_the_constant_the_library_decides_with() -> None:
    names = [t.name for t in internal.THRESHOLDS]
    assert len(names) == len(set(names))
    for t in internal.THRESHOLDS:
        assert t.bytes == _library_constant(t.name) > 0, t.name
        assert t.collectives, t.name
        assert set(t.collectives) <= set(vargather.COLLECTIVES), t.name
        assert t.counts in ("gathered", "per-rank", "per-block"), t.name


def test_every_collective_has_a_threshold_and_header_bytes_is_none() -> None:
    covered = {c for t in internal.THRESHOLDS for c in t.collectives}
    assert covered == set(vargather.COLLECTIVES)
    assert "HEADER_BYTES" not in {t.name for t in internal.THRESHOLDS}


def test_the_issued_counter_swaps_and_comes_back() -> None:
    mine = [5]
    before = internal.swap_issued_counter(mine)
    try:
        assert internal.collectives_issued() == 5
    finally:
        assert internal.swap_issued_counter(before) is mine
    assert internal.collectives_issued() == before[0]


def test_every_name_is_exported() -> None:
    for name in internal.__all__:
        assert hasattr(internal, name), name

"""The mutant catalogue: deliberately broken gathers, one bug each.

Every module here exposes ``all_gather_v(x, dim=0, *, sizes=None, group=None,
grad="sum", transport="auto")`` in vargather's call convention, built on the faithful
pipeline of ``_base`` with exactly one thing broken; ``BUG`` says what, and ``BENIGN``
is a case on which the bug does not show (so the mutant provably runs and is otherwise
a correct gather). ``STATEFUL = True`` marks a mutant whose bug needs earlier calls on
the same world (state carried across calls): only a call sequence reproduces it. ``tests/test_mutants.py`` runs the property suite's properties
against each and requires every one to be caught; ``faithful`` is the unbroken control.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

from vargather.testing.cases import GatherCase, Implementation

__all__ = ["MUTANTS", "RESULTS", "Mutant", "implementation"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NAMES = (
    "rank_order",
    "compaction_off_by_one",
    "dim_ignored",
    "negative_dim",
    "through_float32",
    "padding_leak",
    "negzero",
    "local_under_sum",
    "backward_times_w",
    "backward_offsets_max",
    "empty_as_one_row",
    "one_rank_detached",
    "mean_not_divided",
    "mean_global_world_size",
    "strides_ignored",
    "nan_canonicalized",
    "int_through_float64",
    "backward_through_float32",
    "layout_sizes_sorted",
    "input_clobbered",
    "chunked_tail_zeroed",
    "sizes_cache_local_shape",
    "large_path_even_offsets",
)

RESULTS: dict[str, str] = {}
"""Mutant name -> the property that caught it ("" if it survived), for the summary."""


def implementation(module: str, transports: tuple[str, ...]) -> Implementation:
    """The ``Implementation`` of ``tests.mutants.<module>`` taking ``transports``."""
    return Implementation(
        f"tests.mutants.{module}:all_gather_v",
        transports=transports,
        search_path=(REPO_ROOT,),
        name=f"tests.mutants.{module}",
    )


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    benign: GatherCase
    stateful: bool = False

    def implementation(self, transports: tuple[str, ...]) -> Implementation:
        return implementation(self.name, transports)


def _load(name: str) -> Mutant:
    module: ModuleType = importlib.import_module(f"tests.mutants.{name}")
    return Mutant(name, module.BUG, module.BENIGN, getattr(module, "STATEFUL", False))


MUTANTS: tuple[Mutant, ...] = tuple(_load(name) for name in NAMES)

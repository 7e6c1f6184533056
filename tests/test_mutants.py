"""Mutation testing of the property suite itself: it must catch every mutant.

Each mutant in ``tests/mutants`` is vargather's pipeline with exactly one bug. For
each, the test

1. runs the mutant's ``BENIGN`` case and requires it to pass (the mutant imports, runs
   on a gloo world and is otherwise a correct gather);
2. runs the kit's property catalogue (``vargather.testing.catalogues.catalogue``: the
   same properties as ``tests/test_properties.py`` and ``python -m vargather check``),
   each on each world size, round-robin in their fixed order, a few seeded batches at a
   time, until one finds a batch on which the mutant fails **and the unbroken pipeline
   passes** (so a bug of vargather's own cannot be mistaken for the mutant's).

``test_the_unbroken_pipeline_passes_the_search`` is the control: the same runs
against ``tests/mutants/faithful.py`` find nothing. The mutation score is printed at
the end of the session (``tests/conftest.py``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import Flaky, NoSuchExample

from vargather.testing.cases import GatherCase, Implementation
from vargather.testing.catalogues import catalogue
from vargather.testing.properties import Property
from vargather.testing.runner import run_cases

from .mutants import MUTANTS, RESULTS, Mutant, implementation

SCHEDULE = (1, 6, 6)
BATCH = 4
WORLD_SIZES = (1, 2, 3, 4)
"""The search: one pass over the properties (each on each of ``WORLD_SIZES``) in their
fixed order (``SEARCH_FIRST``, then the catalogue's) per entry of ``SCHEDULE``, each
pass giving every one that many batches of up to ``BATCH`` cases (the first of each is
Hypothesis's simplest example), seeded by (pass, property index) so every run draws the
same batches. Round-robin, so a mutant only a late property can see is reached after a
few batches of each; the first pass tries only each property's simplest batch."""


def _search_settings(batches: int) -> settings:
    return settings(
        database=None,
        max_examples=batches,
        phases=(Phase.generate,),  # the first failing batch is enough: no shrinking
        deadline=None,
        # find() counts each batch's rank round trips as generation time; the too_slow
        # check would measure the pools, not the strategy.
        suppress_health_check=(HealthCheck.too_slow,),
    )


@dataclass(frozen=True)
class _Target:
    """One property of the catalogue on one world size."""

    prop: Property
    world: int

    @property
    def name(self) -> str:
        return f"{self.prop.id}[W={self.world}]"

    def fails(self, batch: list[GatherCase]) -> bool:
        return self.prop.fails(batch)


SEARCH_FIRST = ("dims", "subgroup", "call-sequence")
"""Properties the search visits first, then the rest in the catalogue's order: each
draws its cases over many dtypes, dims and contracts (``subgroup`` and
``call-sequence`` with gradients), so the round-robin reaches a gradient bug within a
dozen batches instead of after every forward property."""


def _props(impl: Implementation) -> list[_Target]:
    props = sorted(
        catalogue(impl),
        key=lambda p: SEARCH_FIRST.index(p.id) if p.id in SEARCH_FIRST else len(SEARCH_FIRST),
    )
    return [
        _Target(p, w)
        for p in props
        if p.not_applicable(WORLD_SIZES) is None
        for w in p.worlds(WORLD_SIZES)
    ]


@functools.cache
def _controls(transports: tuple[str, ...]) -> dict[str, _Target]:
    return {t.name: t for t in _props(implementation("faithful", transports))}


def _search(
    targets: Sequence[_Target],
    condition: Callable[[_Target, list[GatherCase]], bool],
    schedule: Sequence[int],
    first_pass: int = 0,
) -> tuple[str, list[GatherCase]] | None:
    """The first (property name, batch) satisfying ``condition``, round-robin: pass
    ``first_pass + i`` (its number seeds its batches) gives every target
    ``schedule[i]`` batches."""
    for round_, batches in enumerate(schedule, start=first_pass):
        for index, target in enumerate(targets):
            held: list[list[GatherCase]] = []

            def holds(
                batch: list[GatherCase],
                target: _Target = target,
                held: list[list[GatherCase]] = held,
            ) -> bool:
                if condition(target, batch):
                    held.append(batch)
                    return True
                return False

            try:
                batch = find(
                    target.prop.strategy((target.world,), batch=BATCH),
                    holds,
                    settings=_search_settings(batches),
                    random=random.Random(1000 * round_ + index),
                )
            except NoSuchExample:
                continue
            except Flaky:
                # find() replays the batch it found; a mutant with state carried across
                # calls (a cache) need not fail the same way twice. It failed once.
                if not held:
                    raise
                batch = held[0]
            return target.name, batch
    return None


@pytest.mark.multirank
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_property_suite_catches_the_mutant(
    mutant: Mutant, usable_transports: tuple[str, ...]
) -> None:
    impl = mutant.implementation(usable_transports)
    (verdict,) = run_cases([mutant.benign], impl)
    assert verdict.ok, (
        f"mutant {mutant.name} fails its benign case, so it is broken beyond its one bug: "
        f"{[f.render() for f in verdict.failures] or verdict.not_run}"
    )
    controls = _controls(usable_transports)

    def caught(target: _Target, batch: list[GatherCase]) -> bool:
        return target.fails(batch) and not controls[target.name].fails(batch)

    found = _search(_props(impl), caught, SCHEDULE)
    RESULTS[mutant.name] = found[0] if found else ""
    assert found is not None, (
        f"no property caught mutant {mutant.name} ({mutant.bug}) in passes of "
        f"{SCHEDULE} batches per property"
    )


@pytest.mark.multirank
def test_the_unbroken_pipeline_passes_the_search(usable_transports: tuple[str, ...]) -> None:
    """The control: ``faithful`` (the mutants' base, unbroken) fails no property on the
    batches of the search's first full pass, apart from what vargather itself gets wrong
    (``test_properties.py`` reports that)."""
    reference = {
        t.name: t
        for t in _props(Implementation(None, transports=usable_transports, name="vargather"))
    }

    def differs(target: _Target, batch: list[GatherCase]) -> bool:
        return target.fails(batch) and not reference[target.name].fails(batch)

    found = _search(list(_controls(usable_transports).values()), differs, SCHEDULE[1:2], 1)
    assert found is None, (
        f"the unbroken pipeline fails {found[0]} where vargather passes: {found[1]}"
    )

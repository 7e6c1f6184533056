"""The family's properties catch every family mutant in tests/mutants: for each, some
case of a small fixed catalogue fails, while vargather passes every one of them."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib

import pytest

from vargather.testing import get_pool
from vargather.testing.family import (
    AllToAllCase,
    GatherListCase,
    ReduceScatterCase,
    check_case,
)

pytestmark = pytest.mark.multirank

CATALOGUE = {
    "reduce_scatter_v": [
        ReduceScatterCase(3, (2, 0, 1), (2,), -1, special=True, seed=1),
        ReduceScatterCase(2, (1, 3), (3,), 0, dtype="bfloat16", seed=2),
        ReduceScatterCase(2, (1, 2), (3,), 1, seed=6),
    ],
    "all_to_all_v": [
        AllToAllCase(3, ((1, 0, 2), (0, 0, 0), (2, 0, 1)), (2, 3), 0, special=True, seed=3),
        AllToAllCase(2, ((1, 2), (2, 0)), (2,), -1, dtype="int64", requires_grad=False),
    ],
    "all_gather_list": [
        GatherListCase(3, ((2, 3), (0, 1), (4, 2)), grad="sum", seed=4),
        GatherListCase(2, ((1, 2), (3, 1)), grad="mean", seed=5),
    ],
}

MUTANTS = sorted(
    p.stem
    for p in (pathlib.Path(__file__).parent / "mutants").glob("*.py")
    if p.stem.startswith(tuple(CATALOGUE))
)


@pytest.mark.parametrize("collective", sorted(CATALOGUE))
def test_vargather_passes_the_catalogue(collective: str) -> None:
    for case in CATALOGUE[collective]:
        assert check_case(get_pool(case.world_size), case) == [], case


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_is_caught(mutant: str) -> None:
    module = f"tests.mutants.{mutant}"
    assert importlib.import_module(module).BUG
    collective = next(c for c in CATALOGUE if mutant.startswith(c))
    caught = []
    for case in CATALOGUE[collective]:
        mutated = dataclasses.replace(case, impl=module)
        caught += check_case(get_pool(case.world_size), mutated)
    assert caught, f"{mutant} survived the family catalogue"


def test_there_are_mutants_for_every_collective() -> None:
    for collective in CATALOGUE:
        assert sum(m.startswith(collective) for m in MUTANTS) >= 3

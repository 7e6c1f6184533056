"""The ``compiled`` property earns its place: it catches a gather whose compiled form
issues other collectives on one rank than on its peers (``tests/mutants/
compiled_pure_ops.py``: vargather's operators registered pure, as they were before the
deadlock fix), and the rest of the catalogue, which calls it eagerly, passes it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from vargather.testing import get_pool
from vargather.testing.cases import GatherCase, Implementation
from vargather.testing.catalogues import catalogue
from vargather.testing.properties import Property
from vargather.testing.runner import describe

from .mutants import REPO_ROOT

pytestmark = pytest.mark.multirank

MUTANT = Implementation(
    "tests.mutants.compiled_pure_ops:all_gather_v",
    search_path=(REPO_ROOT,),
    compiles=True,
    name="tests.mutants.compiled_pure_ops",
)
HANG_TIMEOUT_S = 25.0
"""The pool's call timeout for the search: a hung world is reported after it."""


def _by_id(impl: Implementation) -> dict[str, Property]:
    return {p.id: p for p in catalogue(impl)}


def _factory(world: int):  # type: ignore[no-untyped-def]  # a pool factory
    return get_pool(world, call_timeout=HANG_TIMEOUT_S)


def _search_settings(examples: int) -> settings:
    return settings(
        database=None,
        max_examples=examples,
        phases=(Phase.generate,),
        deadline=None,
        suppress_health_check=(HealthCheck.too_slow,),
    )


class _Found(BaseException):
    """Ends the search at the first failing batch (Hypothesis would replay it: another
    hang), carrying what the run found."""

    def __init__(self, batch: list[GatherCase], bad: list[tuple[object, list[object]]]) -> None:
        super().__init__()
        self.batch = batch
        self.bad = bad


@pytest.mark.slow  # inductor compiles and a hang's timeout: about a minute on 2 cores
def test_the_compiled_property_catches_a_gather_whose_compiled_ranks_diverge() -> None:
    prop = _by_id(MUTANT)["compiled"]
    assert prop.not_applicable((2,)) is None

    def fails(batch: list[GatherCase]) -> bool:
        bad = [(v, f) for v, f in prop.run(batch, pool_factory=_factory) if f]
        if bad:
            raise _Found(batch, bad)  # type: ignore[arg-type]  # verdicts and failures
        return False

    with pytest.raises(_Found) as found:
        find(prop.strategy((2,)), fails, settings=_search_settings(40), random=random.Random(17))
    batch, ((verdict, failures), *_) = found.value.batch, found.value.bad
    case = verdict.case  # type: ignore[attr-defined]  # a Verdict
    # What makes this gather diverge: inductor, an empty shard, a gradient to compute.
    assert case.compile_backend == "inductor", case
    assert 0 in case.sizes, case
    assert case.requires_grad, case
    kinds = [f.kind for f in failures]  # type: ignore[attr-defined]  # Failures
    assert "hang" in kinds, kinds
    text = describe(case, MUTANT)
    assert "reproduce:" in text
    assert "compile_backend='inductor'" in text
    # vargather itself passes the very batch.
    (theirs,) = [p for p in catalogue() if p.id == "compiled"]
    assert not theirs.fails(batch)


def test_the_rest_of_the_catalogue_passes_the_pure_ops_gather() -> None:
    """Eagerly it is vargather: no other property fails it (two seeded batches each)."""
    for prop in catalogue(MUTANT):
        if prop.id == "compiled" or prop.not_applicable((1, 2, 3)) is not None:
            continue
        for seed in range(2):
            worlds = prop.worlds((1, 2, 3))
            batch = find(
                prop.strategy(worlds),
                lambda _batch: True,
                settings=_search_settings(1),
                random=random.Random(seed),
            )
            prop.check(batch)

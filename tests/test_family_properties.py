"""The family's property suite: every row of each collective's catalogue (the generic
rows of ``vargather.testing.family_catalogue``) against vargather on real gloo worlds.

Each test is one row run as the gate runs it (``evaluate.evaluate_row``: a
seeded Hypothesis test drawn in this process, its calls run on ``get_pool(W)``, a
failure shrunk here), for vargather's own functions claiming every contract. The same
rows gate a fork (``python -m vargather check --op ...``, ``tests/test_family_gate.py``).
"""

from __future__ import annotations

import pytest

from vargather.testing import Implementation, catalogue, get_pool
from vargather.testing.collectives import FAMILY
from vargather.testing.evaluate import evaluate_row
from vargather.testing.options import CheckOptions
from vargather.testing.progress import Progress

pytestmark = pytest.mark.multirank

WORLDS = (1, 2, 3, 4)
EXAMPLES = {"payload-scale": 3, "misuse": 4}
"""Examples per row where the default (``DEFAULT_EXAMPLES``) would cost too much."""
DEFAULT_EXAMPLES = 8

ROWS = [
    pytest.param(op, row.id, id=f"{op}-{row.id}")
    for op in FAMILY
    for row in catalogue(Implementation(op=op, name="vargather"))
    if row.not_applicable(WORLDS) is None
]


def _run(op: str, row_id: str, examples: int, seed: int = 0) -> None:
    row = next(r for r in catalogue(Implementation(op=op, name="vargather")) if r.id == row_id)
    options = CheckOptions(op=op, max_examples=examples, seed=seed)
    result = evaluate_row(row, options, WORLDS, get_pool, Progress(None, 1))
    assert result.status == "pass", "\n".join(
        [
            f"{op} {row_id}: {result.status}",
            result.failure.message if result.failure else "",
            result.failure.reproduction or "" if result.failure else "",
        ]
    )
    assert result.cases > 0


@pytest.mark.parametrize(("op", "row_id"), ROWS)
def test_row_holds_for_vargather(op: str, row_id: str) -> None:
    _run(op, row_id, EXAMPLES.get(row_id, DEFAULT_EXAMPLES))


@pytest.mark.slow
@pytest.mark.parametrize(("op", "row_id"), ROWS)
def test_row_holds_for_vargather_sweep(op: str, row_id: str) -> None:
    _run(op, row_id, 100, seed=1)


def test_every_collective_has_the_rows() -> None:
    for op in FAMILY:
        ids = [r.id for r in catalogue(Implementation(op=op, name="vargather"))]
        assert ids[:5] == [
            "forward-float",
            "forward-half",
            "forward-complex",
            "forward-int",
            "forward-bool",
        ]
        for needed in (
            *("empty", "non-contiguous", "one-rank", "uninitialized", "subgroup"),
            *("gradient", "adjoint", "call-sequence", "compiled", "misuse"),
        ):
            assert needed in ids, (op, needed)


def test_a_declined_row_says_why() -> None:
    """A generic row applies to every collective unless its catalogue declines it, with
    the reason the report shows."""
    rows = catalogue(Implementation(op="all_gather_list", name="vargather"))
    dims = next(r for r in rows if r.id == "dims")
    assert dims.not_applicable(WORLDS) == "all_gather_list takes no dim (every dim may differ)"
    for op in ("reduce_scatter_v", "all_to_all_v"):
        rows = catalogue(Implementation(op=op, name="vargather"))
        assert all(r.not_applicable(WORLDS) is None for r in rows), op

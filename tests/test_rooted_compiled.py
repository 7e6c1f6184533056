"""gather_v and scatter_v under ``torch.compile(fullgraph=True)``: their custom operators
on every backend, through the kit's compiled path (the gate's ``compiled`` row on fixed
cases), and their validation inside the operator, word for word as eager."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vargather.testing import get_pool
from vargather.testing.catalogues.gather_v import GatherVCase
from vargather.testing.catalogues.scatter_v import ScatterVCase
from vargather.testing.family import check_sequence

from . import _rooted_fns as fns
from ._compile_fns import warm_backend

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("case_type", [GatherVCase, ScatterVCase], ids=lambda c: c.collective)
@pytest.mark.parametrize(
    ("backend", "sizes"), [("eager", (2, 0, 3)), ("aot_eager", (0, 3, 1)), ("inductor", (0, 3))]
)
def test_compiled_fullgraph_bit_for_bit(
    case_type: type[GatherVCase | ScatterVCase], backend: str, sizes: tuple[int, ...]
) -> None:
    """Sizes as ints: the operators trace with fullgraph=True (no graph break), and give
    the oracle's output and input gradient, two calls in a row, the root the last rank."""
    pool = get_pool(len(sizes))
    pool.run(warm_backend, backend)
    w = len(sizes)
    case = case_type(w, sizes, (2,), -1, w - 1, dtype="float64", compile_backend=backend)
    case = case.compilable()
    assert check_sequence(pool, [case, replace(case, seed=1)]) == []


@pytest.mark.parametrize(
    ("op", "error"), [("gather_v", "SizesError"), ("scatter_v", "SizesMismatchError")]
)
def test_validation_runs_inside_the_compiled_operator(op: str, error: str) -> None:
    """A lie about sizes on the last rank, compiled with fullgraph (validate=True): the
    operator's round refuses it on every rank with the eager error, word for word."""
    results = get_pool(3).run(fns.compiled_lie, op)
    eager = results[0][0]
    assert eager[0] == error, eager
    assert eager[2] == (2,), eager
    assert eager[1].startswith(op), eager
    for rank, (e, c) in enumerate(results):
        assert e == eager, f"rank {rank}: eager raised {e}"
        assert c == eager, f"rank {rank}: compiled raised {c}, eager {eager}"

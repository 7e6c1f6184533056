"""scatter_v on real gloo worlds: forward and gradient bit for bit against the oracle
(NaN payloads, -0.0, bf16, bool, empty blocks, other dims, subgroups, src not 0, non-src
inputs of any length along dim), the misuse entries of its catalogue raising the same
error on every rank, the round's collective count, torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import vargather
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues import scatter_v as catalogue
from vargather.testing.catalogues.gather_v import Misuse
from vargather.testing.catalogues.scatter_v import ScatterVCase

from . import _rooted_fns as fns
from ._compile_fns import warm_backend

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int16", "complex64", "float64"])
def test_every_dtype_bit_for_bit(dtype: str) -> None:
    case = ScatterVCase((2, 0, 3), (2,), 0, 1, dtype=dtype, seed=4)
    fns.judge(case, get_pool(3).run(fns.run_case, case))


@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("src", [0, 2])
def test_other_dims_roots_and_placeholders(dim: int, src: int) -> None:
    """A non-src input may be any length along dim (here 5)."""
    case = ScatterVCase((1, 4, 0), (3, 2), dim, src, seed=dim + src, placeholder=5)
    fns.judge(case, get_pool(3).run(fns.run_case, case))


def test_subgroup_src_is_a_group_rank() -> None:
    """Group (1, 2) of 3: src=0 is process 1 (a group rank, not a global one)."""
    case = ScatterVCase((2, 3), (2,), 0, 0, group=(1, 2))
    fns.judge(case, get_pool(3).run(fns.run_case, case))


@pytest.mark.parametrize(
    "case",
    [
        ScatterVCase((3000, 0, 5000), (7,), 0, 2, calls=3),  # past the round's slots
        ScatterVCase((1, 2, 0), (3, 2), 1, 0, trusted=True),  # no round
        ScatterVCase((5, 1, 2), (), 0, 1, dtype="complex128", calls=3, trusted=True),
    ],
)
def test_large_blocks_and_trusted_sizes(case: ScatterVCase) -> None:
    fns.judge(case, get_pool(3).run(fns.run_case, case))


@settings(max_examples=12, deadline=None)
@given(case=catalogue.cases())
def test_drawn_cases(case: ScatterVCase) -> None:
    fns.judge(case, get_pool(len(case.sizes)).run(fns.run_case, case))


@pytest.mark.parametrize("entry", catalogue.MISUSE, ids=lambda m: m.kind)
def test_misuse_same_error_everywhere_and_next_call_works(entry: Misuse) -> None:
    results = get_pool(3).run(fns.misuse, ("scatter_v", entry.kind))
    errors = {err for err, _ in results}
    assert len(errors) == 1, errors
    (err,) = errors
    assert err is not None
    assert err[0] == entry.error.__name__, err
    assert err[2] == (entry.blamed % 3,), err
    assert err[1].startswith("scatter_v"), err
    want, _ = catalogue.MISUSE_CASE.expected()
    for r, (_, y) in enumerate(results):
        assert_bitwise_equal(y, want[r], f"rank {r}")


def test_collectives_per_call() -> None:
    for found in get_pool(2).run(fns.counts, ScatterVCase((1, 2), (3,), 0, 1)):
        assert found == (2, 1, 1)


def test_under_torch_compile() -> None:
    case = ScatterVCase((2, 1), (3,), 0, 1, calls=1)
    fns.judge(case, [[found] for found in get_pool(2).run(fns.compiled, case)])


def test_one_process_world() -> None:
    x = torch.arange(6.0).view(3, 2).requires_grad_(True)
    y = vargather.scatter_v(x, [3], 0)
    assert_bitwise_equal(y, x.detach())
    y.backward(torch.full((3, 2), 2.0))
    assert x.grad is not None
    assert_bitwise_equal(x.grad, torch.full((3, 2), 2.0))
    with pytest.raises(vargather.SizesError, match=r"sum\(sizes\) == 3"):
        vargather.scatter_v(x, [2], 0)
    with pytest.raises(vargather.ArgumentError, match="rank in the group"):
        vargather.scatter_v(x, [3], -1)


@pytest.mark.parametrize(
    "case",
    [
        fns.FullgraphCase("scatter_v", (2, 0, 3), (2,), 1, 2, "eager"),
        fns.FullgraphCase("scatter_v", (0, 3, 1), (2,), -1, 1, "aot_eager", placeholder=0),
        fns.FullgraphCase("scatter_v", (0, 3), (2,), 1, 1, "inductor"),
        fns.FullgraphCase("scatter_v", (2, 0, 3), (2,), 1, 1, "aot_eager", kit=True),
    ],
    ids=lambda c: f"{c.compile_backend}{'-kit' if c.kit else ''}",
)
def test_compiled_fullgraph_bit_for_bit(case: fns.FullgraphCase) -> None:
    """Sizes as ints: the operators trace with fullgraph=True (no graph break), on every
    backend, and give the oracle's output and input gradient (zeros off src), two calls
    in a row; also through the kit's compiled path."""
    pool = get_pool(len(case.sizes))
    pool.run(warm_backend, case.compile_backend)
    fns.judge_fullgraph(case, pool.run(fns.fullgraph, case))


def test_validation_runs_inside_the_compiled_operator() -> None:
    """A lie about sizes on the last rank, compiled with fullgraph (validate=True): the
    operator's round refuses it on every rank with the eager error, word for word."""
    results = get_pool(3).run(fns.compiled_lie, "scatter_v")
    eager = results[0][0]
    assert eager[0] == "SizesMismatchError", eager
    assert eager[2] == (2,), eager
    assert eager[1].startswith("scatter_v"), eager
    for rank, (e, c) in enumerate(results):
        assert e == eager, f"rank {rank}: eager raised {e}"
        assert c == eager, f"rank {rank}: compiled raised {c}, eager {eager}"

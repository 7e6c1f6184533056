"""reduce_scatter_v on real gloo worlds: issue 20's 3-rank scenarios and the edges (its
catalogue rows, Hypothesis-drawn, run in tests/test_family_properties.py)."""

from __future__ import annotations

import pytest
import torch

import vargather
from vargather import oracle
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase
from vargather.testing.family import check_case
from vargather.testing.misuse import MisuseCase, check_misuse

from . import _family_fns as fns

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dtype", ["bfloat16", "bool", "int16", "complex64", "float16"])
def test_every_dtype_gloo_carries(dtype: str) -> None:
    case = ReduceScatterCase(3, (2, 0, 1), (2,), -1, dtype=dtype, special=True, seed=5)
    assert check_case(get_pool(3), case) == []


def test_subgroup_of_two_in_three() -> None:
    case = ReduceScatterCase(3, (1, 3), (2,), 0, group=(0, 2), special=True)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize("dim", [0, -1])
def test_done_when_three_ranks_empty_block(dim: int) -> None:
    """Issue 20: 3 ranks, dim 0 and -1, an empty block: the oracle's bits, and the
    gradient is the gathered upstream gradient."""
    results = get_pool(3).run(fns.done_when_rs, dim)
    xs = []
    for r in range(3):
        g = torch.Generator().manual_seed(r)
        xs.append(torch.randn((5, 4) if dim == 0 else (2, 5), generator=g))
    want = oracle.expected_reduce_scatter(xs, [2, 0, 3], dim)
    ups = [torch.full_like(w, float(r + 1)) for r, w in enumerate(want)]
    gathered = torch.cat(ups, dim=dim)
    for r, (y, grad) in enumerate(results):
        assert_bitwise_equal(y, want[r], f"rank {r}")
        assert_bitwise_equal(grad, gathered, f"rank {r} gradient")
    assert results[1][0].shape[dim] == 0


@pytest.mark.parametrize("which", ["sizes", "dtype"])
def test_done_when_misuse_raises_everywhere_and_next_call_works(which: str) -> None:
    results = get_pool(3).run(fns.then_works, which)
    errors = {err for err, _ in results}
    assert len(errors) == 1
    (err,) = errors
    assert err is not None
    assert err[0] == ("SizesMismatchError" if which == "sizes" else "DTypeMismatchError")
    assert 2 in err[2]
    for r, (_, y) in enumerate(results):
        assert_bitwise_equal(y, torch.full((1, 2), 3.0), f"rank {r}")


@pytest.mark.parametrize(
    "kind",
    [
        "rs-sizes-differ",
        "rs-sum-mismatch",
        "rs-dtype-differs",
        "rs-ndim-differs",
        "rs-trailing-dim-differs",
        "rs-requires-grad-differs",
    ],
)
def test_misuse_same_error_everywhere(kind: str) -> None:
    assert check_misuse(get_pool(3), MisuseCase("reduce_scatter_v", kind, 3, 1)) == []


def test_absent_rank_is_the_named_timeout() -> None:
    assert check_misuse(get_pool(3), MisuseCase("reduce_scatter_v", "absent", 3, 2)) == []


def test_noncontiguous_input() -> None:
    for a, b in get_pool(2).run(fns.noncontiguous_reduce_scatter, None):
        assert_bitwise_equal(a, b)


def test_collectives_per_call_and_trusted_sizes() -> None:
    for validated, steady, trusted, a2a_trusted, gather_list in get_pool(2).run(
        fns.timeouts_and_counts, None
    ):
        # a fresh state: exchange + payload; then the payload rides in the exchange
        assert (validated, steady, trusted, a2a_trusted) == (2, 1, 1, 1)
        assert gather_list == 1  # steady state: the payload rides in the fused round


def test_validate_false_local_problem_raises_on_that_rank_only() -> None:
    results = get_pool(2).run(fns.trusted_local_problem, None)
    assert results[1] is not None
    assert results[1][0] == "SizesError"
    assert "raised on this rank only" in results[1][1]
    assert results[0] is not None
    assert results[0][0] == "CollectiveTimeoutError"
    get_pool(2).restart()


def test_one_process_world() -> None:
    x = torch.arange(6.0).view(3, 2).requires_grad_(True)
    y = vargather.reduce_scatter_v(x, [3])
    assert_bitwise_equal(y, x.detach())
    y.backward(torch.ones(3, 2))
    assert x.grad is not None
    with pytest.raises(vargather.SizesError, match=r"sum\(sizes\) == 3"):
        vargather.reduce_scatter_v(x, [2])
    with pytest.raises(vargather.SizesError, match="world size 1"):
        vargather.reduce_scatter_v(x, [1, 2])


def test_issue_36_nan_bits_do_not_depend_on_the_kernel_path() -> None:
    """Issue 36, the fuzzer's finding: bfloat16 specials along dim 1. The collective
    folds contiguous received blocks (torch's vectorized bfloat16 path wrote 0xffff for
    a NaN), the oracle strided slices (the scalar path, 0x7fc0): every NaN of a sum is
    now the canonical quiet NaN on both sides, compared bit for bit by the kit."""
    case = ReduceScatterCase(
        world_size=3,
        sizes=(0, 1, 4),
        other=(2, 4),
        dim=1,
        dtype="bfloat16",
        requires_grad=False,
        special=True,
        seed=0,
        group=None,
        validate=False,
        impl="vargather",
        call=None,
    )
    want = oracle.expected_reduce_scatter(case.inputs(), case.sizes, case.dim)
    nans = want[2][want[2].isnan()]
    assert nans.numel() > 0  # the case still reaches NaN sums
    assert set(nans.view(torch.int16).tolist()) == {0x7FC0}
    assert check_case(get_pool(3), case) == []

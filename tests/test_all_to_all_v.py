"""all_to_all_v on real gloo worlds: issue 20's 3-rank scenario (a send matrix with
zeros), recv_sizes, misuse and the edges (its catalogue rows, Hypothesis-drawn, run in
tests/test_family_properties.py)."""

from __future__ import annotations

import pytest
import torch

import vargather
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.family import (
    AllToAllCase,
    check_case,
)
from vargather.testing.misuse import MisuseCase, check_misuse

from . import _family_fns as fns

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dim", [0, -1, 1])
def test_done_when_send_matrix_with_zeros(dim: int) -> None:
    """Issue 20: 3 ranks, a send matrix with zeros (a whole zero row and column too):
    the oracle's bits, and the gradient is the reverse exchange."""
    send = ((1, 0, 2), (0, 0, 0), (2, 0, 1))
    case = AllToAllCase(3, send, (2, 3), dim, special=True, seed=3)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize("dtype", ["bfloat16", "bool", "int16", "complex64", "uint8"])
def test_every_dtype_gloo_carries(dtype: str) -> None:
    case = AllToAllCase(2, ((1, 2), (0, 3)), (2,), -1, dtype=dtype, special=True, pass_recv=True)
    assert check_case(get_pool(2), case) == []


def test_trusted_recv_sizes_and_subgroup() -> None:
    case = AllToAllCase(3, ((0, 2), (3, 1)), (2,), 0, group=(1, 2), pass_recv=True, validate=False)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize(
    "kind",
    ["send_length", "sum_mismatch", "recv_lie", "dtype", "ndim", "trailing", "requires_grad"],
)
def test_misuse_same_error_everywhere(kind: str) -> None:
    assert check_misuse(get_pool(3), MisuseCase("all_to_all_v", kind, 3, 0)) == []


def test_absent_rank_is_the_named_timeout() -> None:
    assert check_misuse(get_pool(2), MisuseCase("all_to_all_v", "absent", 2, 1)) == []


def test_noncontiguous_input() -> None:
    for a, b in get_pool(2).run(fns.noncontiguous_all_to_all, None):
        assert_bitwise_equal(a, b)


def test_one_process_world_and_layout() -> None:
    x = torch.arange(6.0).view(3, 2)
    res = vargather.all_to_all_v_with_layout(x, [3])
    assert_bitwise_equal(res.tensor, x)
    assert res.layout.sizes == (3,)
    assert res.send_sizes == (3,)
    with pytest.raises(vargather.SizesError, match="world size 1"):
        vargather.all_to_all_v(x, [1, 2])
    with pytest.raises(vargather.SizesMismatchError, match="recv_sizes"):
        vargather.all_to_all_v(x, [3], recv_sizes=[2])

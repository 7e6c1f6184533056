"""gather_v on real gloo worlds, by the kit's engine (``family.check_case`` against the
oracle the table names): forward and gradient bit for bit (NaN payloads, -0.0, bf16,
bool, empty blocks, other dims, subgroups, dst not 0), calls in a row, payloads past
the round's slots, trusted sizes, the round's collective count, a world of one. Its
misuse entries run in ``tests/test_misuse.py``, its rows in ``test_family_properties``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import vargather
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues.gather_v import GatherVCase
from vargather.testing.family import check_case, check_sequence

from . import _rooted_fns as fns

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int16", "complex64", "float64"])
@pytest.mark.parametrize("special", [False, True])
def test_every_dtype_bit_for_bit(dtype: str, special: bool) -> None:
    case = GatherVCase(3, (2, 0, 3), (2,), 0, 1, dtype=dtype, special=special, seed=3)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("dst", [0, 2])
def test_other_dims_and_roots(dim: int, dst: int) -> None:
    case = GatherVCase(3, (1, 4, 0), (3, 2), dim, dst, dtype="float64", seed=dim + dst)
    assert check_case(get_pool(3), case) == []


def test_subgroup_dst_is_a_group_rank() -> None:
    """Group (0, 2) of 3: dst=1 is process 2 (a group rank, not a global one)."""
    case = GatherVCase(3, (2, 3), (2,), 0, 1, dtype="float64", group=(0, 2))
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize(
    "case",
    [
        GatherVCase(3, (3000, 0, 5000), (7,), 0, 2, dtype="float64"),  # past the round's slots
        GatherVCase(3, (1, 2, 0), (3, 2), 1, 0, pass_sizes=True, validate=False),  # no round
        GatherVCase(3, (5, 1, 2), (), 0, 1, dtype="complex128", pass_sizes=True),
    ],
)
def test_calls_in_a_row_large_blocks_and_trusted_sizes(case: GatherVCase) -> None:
    """Three calls in a row: a fresh round state, then the steady one."""
    assert check_sequence(get_pool(3), [case, case, replace(case, seed=case.seed + 1)]) == []


def test_collectives_per_call() -> None:
    """A fresh state: the round, then the payload by direct sends; steady: the payload
    rides in the round; trusted sizes: the payload alone."""
    case = GatherVCase(2, (1, 2), (3,), 0, 1, requires_grad=False)
    trusted = replace(case, validate=False, pass_sizes=True)
    for found in get_pool(2).run(fns.counts, (case, trusted)):
        assert found == (2, 1, 1)


def test_one_process_world() -> None:
    x = torch.arange(6.0).view(3, 2).requires_grad_(True)
    y = vargather.gather_v(x, 0, -1)
    assert_bitwise_equal(y, x.detach())
    y.backward(torch.full((3, 2), 2.0))
    assert x.grad is not None
    assert_bitwise_equal(x.grad, torch.full((3, 2), 2.0))
    with pytest.raises(vargather.ArgumentError, match="rank in the group"):
        vargather.gather_v(x, 1)
    with pytest.raises(vargather.SizesError, match=r"sizes\[0\] == 3"):
        vargather.gather_v(x, 0, sizes=[2])

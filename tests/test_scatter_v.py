"""scatter_v on real gloo worlds, by the kit's engine (``family.check_case`` against the
oracle the table names): forward and gradient bit for bit (NaN payloads, -0.0, bf16,
bool, empty blocks, other dims, subgroups, src not 0, non-src inputs of any length
along dim), calls in a row, payloads past the round's slots, trusted sizes, the round's
collective count, a world of one. Its misuse entries run in ``tests/test_misuse.py``,
its rows in ``test_family_properties``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import vargather
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues.scatter_v import ScatterVCase
from vargather.testing.family import check_case, check_sequence

from . import _rooted_fns as fns

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool", "int16", "complex64", "float64"])
@pytest.mark.parametrize("special", [False, True])
def test_every_dtype_bit_for_bit(dtype: str, special: bool) -> None:
    case = ScatterVCase(3, (2, 0, 3), (2,), 0, 1, dtype=dtype, special=special, seed=4)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize("dim", [1, -1])
@pytest.mark.parametrize("src", [0, 2])
def test_other_dims_roots_and_placeholders(dim: int, src: int) -> None:
    """A non-src input 5 long along dim: only its dtype and the sizes off dim are read."""
    case = ScatterVCase(3, (1, 4, 0), (3, 2), dim, src, 5, dtype="float64", seed=dim + src)
    assert check_case(get_pool(3), case) == []


def test_subgroup_src_is_a_group_rank() -> None:
    """Group (1, 2) of 3: src=0 is process 1 (a group rank, not a global one)."""
    case = ScatterVCase(3, (2, 3), (2,), 0, 0, dtype="float64", group=(1, 2))
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize(
    "case",
    [
        ScatterVCase(3, (3000, 0, 5000), (7,), 0, 2, dtype="float64"),  # past the round's slots
        ScatterVCase(3, (1, 2, 0), (3, 2), 1, 0, validate=False),  # no round
        ScatterVCase(3, (5, 1, 2), (), 0, 1, dtype="complex128", validate=False),
    ],
)
def test_calls_in_a_row_large_blocks_and_trusted_sizes(case: ScatterVCase) -> None:
    """Three calls in a row: a fresh round state, then the steady one."""
    assert check_sequence(get_pool(3), [case, case, replace(case, seed=case.seed + 1)]) == []


def test_collectives_per_call() -> None:
    """A fresh state: the round, then the payload by direct sends; steady: the payload
    rides in the round; trusted: the payload alone."""
    case = ScatterVCase(2, (1, 2), (3,), 0, 1, requires_grad=False)
    trusted = replace(case, validate=False)
    for found in get_pool(2).run(fns.counts, (case, trusted)):
        assert found == (2, 1, 1)


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

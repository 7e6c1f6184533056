"""The local argument checks (``vargather._args``): never raise, and each problem
carries its error class and its finished message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import vargather
from vargather._args import MAX_NDIM, Problem, check_call, parse_sizes, parse_timeout
from vargather._group import GroupInfo

from ._stage_fns import calls

GLOO_2 = GroupInfo(None, 1, 2, True, "gloo")
ALONE = GroupInfo(None, 0, 1, False, "none")


def _problem(x: object = None, dim: object = 0, info: GroupInfo = GLOO_2, **kw: Any) -> Problem:
    args: dict[str, Any] = {"sizes": None, "grad": "sum", "transport": "auto"}
    args.update(kw)
    x = torch.zeros(2, 3) if x is None else x
    problem = check_call(x, dim, info=info, **args).record.problem
    assert problem is not None
    return problem


@given(data=st.data())
def test_check_call_never_raises(data: st.DataObject) -> None:
    """Whatever the arguments, ``check_call`` returns a record (drawing one calls it)."""
    w = data.draw(st.integers(1, 4), label="world_size")
    data.draw(calls(w, data.draw(st.integers(0, w - 1), label="rank")), label="record")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({"x": [1]}, vargather.InputTypeError, "expected a torch.Tensor, got list"),
        (
            {"x": torch.zeros(())},
            vargather.InputShapeError,
            "expected a tensor with at least 1 dimension, got a 0-d tensor",
        ),
        (
            {"x": torch.zeros([1] * (MAX_NDIM + 1))},
            vargather.InputShapeError,
            f"expected at most {MAX_NDIM} dimensions, got {MAX_NDIM + 1}",
        ),
        ({"dim": "0"}, vargather.DimError, "expected dim to be an int, got str '0'"),
        (
            {"dim": 2},
            vargather.DimError,
            "dim=2 is out of range: expected -2 <= dim < 2 for a 2-d tensor",
        ),
        (
            {"dim": 1 << 70},
            vargather.DimError,
            "dim=9223372036854775807 (or more) is out of range",
        ),
        (
            {"x": torch.zeros(2, dtype=torch.uint16)},
            vargather.InputTypeError,
            "dtype uint16 cannot be gathered on this backend: expected one of bfloat16, bool, "
            "complex128, complex64, float16, float32, float64, int16, int32, int64, int8, uint8",
        ),
        (
            {"x": torch.zeros(2, 3).to_sparse()},
            vargather.InputTypeError,
            "expected a dense (torch.strided) tensor, got a torch.sparse_coo tensor",
        ),
        (
            {"x": torch.zeros(2, device="meta")},
            vargather.InputTypeError,
            "expected a tensor on a device this backend carries, got a meta tensor",
        ),
        ({"grad": "max"}, vargather.ArgumentError, "grad must be one of 'sum', 'local', 'mean'"),
        (
            {"transport": 7},
            vargather.ArgumentError,
            "transport must be one of 'auto', 'padded', 'alltoallv', 'broadcast', 'views', got 7",
        ),
        ({"transport": "views"}, vargather.ArgumentError, "transport='views' gathers with"),
        ({"validate": 1}, vargather.ArgumentError, "validate must be a bool, got int 1"),
        (
            {"timeout": -1},
            vargather.ArgumentError,
            "timeout must be None, or a number of seconds or a timedelta from 0.001 s to "
            "1e+09 s, got int -1",
        ),
        (
            {"sizes": [2.0, 1]},
            vargather.SizesTypeError,
            "sizes must hold integers, got sizes[0] = float 2.0",
        ),
        ({"sizes": "21"}, vargather.SizesTypeError, "sizes must hold integers, got sizes = str"),
        (
            {"sizes": torch.zeros(2, 1, dtype=torch.int64)},
            vargather.SizesError,
            "sizes must be a 1-d integer tensor, got a tensor of dtype int64 and shape (2, 1)",
        ),
        ({"sizes": [2, -1]}, vargather.SizesError, "sizes must be >= 0, got sizes[1] = -1"),
        ({"sizes": [2]}, vargather.SizesError, "expected len(sizes) == world size 2, got 1"),
        (
            {"sizes": [2, 5]},
            vargather.SizesError,
            "expected sizes[1] == 2 (its tensor's size along dim 0), got sizes[1] = 5",
        ),
    ],
)
def test_each_problem_carries_its_error_and_message(
    call: dict[str, Any], error: type[vargather.VarGatherError], message: str
) -> None:
    problem = _problem(**call)
    assert problem.error is error
    assert problem.message.startswith(message), problem.message


def test_the_first_problem_found_is_the_one_reported() -> None:
    problem = _problem(x=[1], grad="max", dim="0")
    assert problem.message == "expected a torch.Tensor, got list"


def test_a_call_without_problems_records_its_shape_and_parsed_arguments() -> None:
    x = torch.zeros(2, 3, requires_grad=True)
    call = check_call(
        x, -1, sizes=torch.tensor([4, 3]), grad="mean", transport="padded", info=GLOO_2
    )
    rec = call.record
    assert rec.problem is None
    assert (rec.shape, rec.ndim, rec.dim, rec.normalized_dim) == ((2, 3), 2, -1, 1)
    assert (rec.dtype, rec.requires_grad, rec.sizes_len, rec.sizes_own) == (
        torch.float32,
        True,
        2,
        3,
    )
    assert call.sizes == (4, 3)


def test_a_per_call_timeout_is_parsed_once_and_kept_only_where_it_applies() -> None:
    """Alone (nothing communicates) a valid timeout is accepted and not applied."""
    call = check_call(
        torch.zeros(2), 0, sizes=None, grad="sum", transport="auto", info=ALONE, timeout=5
    )
    assert call.record.problem is None
    assert call.timeout is None
    assert parse_timeout(5) == timedelta(seconds=5)
    assert parse_timeout(timedelta(minutes=1)) == timedelta(minutes=1)
    assert parse_timeout(None) is None
    for bad in (0, float("nan"), 1e10, "5", True, 10**400):
        assert isinstance(parse_timeout(bad), Problem), bad


def test_parse_sizes_accepts_sequences_and_integer_tensors() -> None:
    assert parse_sizes([1, 0, torch.tensor(2)]) == (1, 0, 2)
    assert parse_sizes(torch.tensor([3, 4], dtype=torch.int32)) == (3, 4)
    assert isinstance(parse_sizes(torch.tensor([1.0])), Problem)
    assert isinstance(parse_sizes([True]), Problem)

"""``vargather.testing.assert_bitwise_equal``: dtype, shape and bytes, and a message that
names what differs (the first differing index with both values)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vargather.testing import assert_bitwise_equal, bitwise_difference
from vargather.testing.values import DTYPE_NAMES, make_values, torch_dtype


def _bits(pattern: int, dtype: torch.dtype, int_dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([pattern], dtype=int_dtype).view(dtype)


def _fails(actual: object, expected: object, msg: str | None = None) -> str:
    with pytest.raises(AssertionError) as info:
        assert_bitwise_equal(actual, expected, msg)
    return str(info.value)


def test_nan_payloads_differ_and_equal_payloads_pass() -> None:
    quiet = _bits(0x7FC00000, torch.float32, torch.int32)
    payload = _bits(0x7FC00001, torch.float32, torch.int32)
    assert_bitwise_equal(payload, payload.clone())  # torch.equal says False: NaN != NaN
    assert not torch.equal(payload, payload.clone())
    assert _fails(payload, quiet) == (
        "tensors are not bitwise equal: in 1 of 1 elements; first at index (0,): "
        "got nan (0x7fc00001), expected nan (0x7fc00000)"
    )


def test_negative_zero_differs_from_zero() -> None:
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))  # what torch.equal says
    message = _fails(torch.tensor([1.0, 0.0]), torch.tensor([1.0, -0.0]), "rank 2")
    assert message == (
        "rank 2: tensors are not bitwise equal: in 1 of 2 elements; first at index (1,): "
        "got 0.0 (0x00000000), expected -0.0 (0x80000000)"
    )


def test_bfloat16_bool_and_complex() -> None:
    got = torch.tensor([[1.5, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    want = got.clone()
    want[1, 0] = 3.25
    assert _fails(got, want).endswith(
        "in 1 of 4 elements; first at index (1, 0): got 3.0 (0x4040), expected 3.25 (0x4050)"
    )
    assert _fails(torch.tensor([True, False]), torch.tensor([True, True])).endswith(
        "first at index (1,): got False, expected True"
    )
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert _fails(z, z.conj()).endswith(
        "in 2 of 2 elements; first at index (0,): got (1+2j) (0x3f800000/0x40000000), "
        "expected (1-2j) (0x3f800000/0xc0000000)"
    )
    assert_bitwise_equal(z.conj(), z.conj().resolve_conj())  # the lazy conjugate is resolved


def test_dtype_shape_and_type_mismatches_are_named() -> None:
    assert _fails(torch.zeros(2), torch.zeros(2, dtype=torch.float64)) == (
        "tensors are not bitwise equal: dtype differs: got torch.float32, expected torch.float64"
    )
    assert _fails(torch.zeros(2, 3), torch.zeros(3, 2)) == (
        "tensors are not bitwise equal: shape differs: got (2, 3), expected (3, 2)"
    )
    both = _fails(torch.zeros(2, dtype=torch.int32), torch.zeros(3))
    assert "dtype differs: got torch.int32, expected torch.float32" in both
    assert "shape differs: got (2,), expected (3,)" in both
    assert _fails((torch.zeros(1), None), torch.zeros(1)).startswith(
        "tensors are not bitwise equal: actual is a tuple, not a torch.Tensor: (tensor([0.]), None)"
    )
    assert "expected is a list" in _fails(torch.zeros(1), [0.0])


def test_layout_does_not_matter_only_values() -> None:
    x = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    assert_bitwise_equal(x.t(), x.t().contiguous())
    assert_bitwise_equal(x[:, ::2], torch.tensor([[0, 2], [4, 6], [8, 10]], dtype=torch.int16))
    assert_bitwise_equal(torch.empty(0, 3), torch.empty(0, 3))
    assert_bitwise_equal(torch.tensor(5), torch.tensor(5))
    assert _fails(torch.tensor(5), torch.tensor(6)).endswith("index (): got 5, expected 6")


@given(
    dtype=st.sampled_from(DTYPE_NAMES),
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_one_flipped_bit_is_found_at_its_index(
    dtype: str, shape: tuple[int, ...], seed: int, data: st.DataObject
) -> None:
    """Every dtype the strategies draw, full-range values (NaNs, infinities, -0.0,
    extremes): a copy is equal; flipping any one bit of any one element is a difference
    at exactly that element's index."""
    x = make_values(shape, torch_dtype(dtype), seed, "full")
    assert bitwise_difference(x, x.clone()) is None
    raw = bytearray(x.contiguous().view(torch.uint8).numpy().tobytes())
    byte = data.draw(st.integers(0, len(raw) - 1), label="byte")
    if x.dtype == torch.bool:
        raw[byte] ^= 1  # a bool's other bits are not a bool
    else:
        raw[byte] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    y = torch.frombuffer(raw, dtype=torch.uint8).view(x.dtype).reshape(shape)
    element = byte // x.element_size()
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(element), shape))
    difference = bitwise_difference(y, x)
    assert difference is not None
    assert difference.startswith(f"in 1 of {x.numel()} elements; first at index {index}: ")

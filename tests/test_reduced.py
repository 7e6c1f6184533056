"""``vargather._reduced``: the canonical NaN of a reduction's result, per dtype, and the
mean per component, in one process (the collectives that use it are tested on gloo worlds in
tests/test_nan_semantics.py)."""

from __future__ import annotations

import math

import pytest
import torch

from vargather import oracle
from vargather._reduce_scatter import fold_blocks
from vargather._reduced import add_, canonical_nans_, mean_
from vargather.testing import assert_bitwise_equal

CANONICAL = {
    torch.float16: 0x7E00,
    torch.bfloat16: 0x7FC0,
    torch.float32: 0x7FC00000,
    torch.float64: 0x7FF8000000000000,
}
INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16}
INT_OF.update({torch.float32: torch.int32, torch.float64: torch.int64})


def _nan_bits(dtype: torch.dtype) -> list[int]:
    """NaNs of both signs, quiet and signalling, with payloads (as signed integers of
    the dtype's width)."""
    bits = torch.finfo(dtype).bits
    mant = {16: 10 if dtype == torch.float16 else 7, 32: 23, 64: 52}[bits]
    exp_all = ((1 << (bits - 1 - mant)) - 1) << mant
    sign = 1 << (bits - 1)
    quiet = 1 << (mant - 1)
    raw = [exp_all | quiet, exp_all | quiet | 5, exp_all | 1, sign | exp_all | quiet | 3]
    raw += [sign | exp_all | (quiet - 1), sign | exp_all | quiet]
    return [r - (1 << bits) if r >= sign else r for r in raw]


@pytest.mark.parametrize("dtype", list(CANONICAL))
def test_every_nan_becomes_the_canonical_one(dtype: torch.dtype) -> None:
    nans = _nan_bits(dtype)
    others = torch.tensor([-0.0, 0.0, float("inf"), float("-inf"), 1.5, -3.0], dtype=dtype)
    t = torch.cat([torch.tensor(nans, dtype=INT_OF[dtype]).view(dtype), others])
    before = t.clone()
    assert canonical_nans_(t) is t
    bits = t.view(INT_OF[dtype])
    width = torch.finfo(dtype).bits
    assert [b & ((1 << width) - 1) for b in bits[: len(nans)].tolist()] == [CANONICAL[dtype]] * len(
        nans
    )
    assert_bitwise_equal(t[len(nans) :], before[len(nans) :])  # -0.0, inf, values kept


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_nans_per_component(dtype: torch.dtype) -> None:
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    payload = torch.tensor(_nan_bits(real)[1:3], dtype=INT_OF[real]).view(real)
    parts = torch.tensor([[0.0, -0.0], [1.0, float("-inf")], [2.0, 3.0]], dtype=real)
    parts[0, 0], parts[1, 1] = payload[0], payload[1]
    t = torch.view_as_complex(parts.clone())
    canonical_nans_(t)
    want = parts.clone()
    want[0, 0] = want[1, 1] = float("nan")
    assert_bitwise_equal(torch.view_as_real(t), want)
    assert want.view(INT_OF[real])[0, 0].item() == CANONICAL[real]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.uint8, torch.bool])
def test_integers_are_untouched(dtype: torch.dtype) -> None:
    t = torch.arange(6).to(dtype)
    before = t.clone()
    canonical_nans_(t)
    assert_bitwise_equal(t, before)


def test_nan_free_tensor_whose_sum_overflows_is_untouched() -> None:
    """``inf + -inf`` makes the cheap sum a NaN: the exact path finds none."""
    t = torch.tensor([float("inf"), float("-inf"), -0.0, 3e38, 3e38])
    before = t.clone()
    canonical_nans_(t)
    assert_bitwise_equal(t, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fold_and_oracle_agree_on_every_layout(dtype: torch.dtype) -> None:
    """Issue 36 in one process: contiguous blocks (the collective's fold, torch's
    vectorized kernels) and strided slices (the oracle's, the scalar ones) give the
    same bits, NaNs canonical, where ``inf + -inf`` and NaN payloads meet."""
    g = torch.Generator().manual_seed(0)
    xs = []
    for _ in range(3):
        x = torch.randint(-8, 8, (3, 40), generator=g).to(dtype)
        pick = torch.randint(0, 5, x.shape, generator=g)
        x[pick == 0] = float("inf")
        x[pick == 1] = float("-inf")
        x[pick == 2] = -0.0
        xs.append(x)
    xs[1].view(INT_OF[dtype])[0, :5] = torch.tensor(_nan_bits(dtype)[:5], dtype=INT_OF[dtype])
    want = oracle.expected_reduce_scatter(xs, [10, 30], dim=1)
    blocks = torch.stack([x[:, 10:].contiguous().reshape(-1) for x in xs])
    got = fold_blocks(blocks).view(3, 30)
    assert_bitwise_equal(got, want[1])
    assert bool(want[1].isnan().any())
    bits = want[1][want[1].isnan()].view(INT_OF[dtype])
    assert set((bits & ((1 << torch.finfo(dtype).bits) - 1)).tolist()) == {CANONICAL[dtype]}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_mean_divides_each_component_alone(dtype: torch.dtype) -> None:
    """A complex division by ``3 + 0i`` would make ``inf + 1j`` a ``inf + nanj`` and
    round ``1 * (1/3)``; the mean is ``inf/3 + (1/3)j``."""
    t = torch.tensor(
        [complex(math.inf, 1.0), complex(1.0, math.nan), complex(5.0, -0.0)], dtype=dtype
    )
    real = torch.view_as_real(t).clone()
    mean_(t, 3)
    assert_bitwise_equal(
        torch.view_as_real(t), (real / 3).nan_to_num(nan=math.nan, posinf=math.inf)
    )


def test_mean_of_reals_is_the_division() -> None:
    t = torch.tensor([1.0, -0.0, math.inf, 7.0], dtype=torch.float32)
    want = t / 3
    assert_bitwise_equal(mean_(t, 3), want)


def test_complex_add_is_per_component() -> None:
    """torch's ``a + b`` is ``a + (1+0i) * b``: ``0 + inf i`` would be ``nan + inf i``."""
    a = torch.tensor([0j, complex(1, 2), complex(-0.0, -0.0)], dtype=torch.complex64)
    b = torch.tensor([complex(0, math.inf), complex(math.inf, 0), complex(-0.0, 0.0)])
    want = torch.view_as_real(a) + torch.view_as_real(b.to(torch.complex64))
    assert_bitwise_equal(torch.view_as_real(add_(a, b.to(torch.complex64))), want)
    assert not bool(a.isnan().any())

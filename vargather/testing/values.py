"""The kit's vocabulary of values and the deterministic values themselves.

Where it sits: the bottom of the testing kit, beneath ``cases``. Every tensor of a
case (rank r's shard ``x_r``, rank r's upstream gradient ``g_r``) is rebuilt from its
seed, in the parent and in the ranks alike, so only a case's description crosses a pipe.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Final

import torch

from vargather import GLOO_DTYPES, GLOO_NATIVE_DTYPES

# --- vocabulary ----------------------------------------------------------------------

DTYPE_FAMILIES: Final = ("float", "half", "complex", "int", "bool")
"""Dtype families, simplest first: float32/float64, float16/bfloat16, complex, integers,
bool (what ``dtype_family`` returns)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_family(dtype: torch.dtype) -> str:
    """The family of ``dtype`` in ``DTYPE_FAMILIES``."""
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float" if dtype.itemsize >= 4 else "half"
    return "bool" if dtype == torch.bool else "int"


def _simplest_first(dtype: torch.dtype) -> tuple[int, int, bool, bool]:
    """Family, then narrow floats and wide integers first, float16 before bfloat16, signed
    before unsigned."""
    family = dtype_family(dtype)
    width = -dtype.itemsize if family == "int" else dtype.itemsize
    return (DTYPE_FAMILIES.index(family), width, dtype == torch.bfloat16, not dtype.is_signed)


DTYPE_NAMES: Final[tuple[str, ...]] = tuple(
    dtype_name(d) for d in sorted(GLOO_DTYPES, key=_simplest_first)
)
"""Every dtype vargather gathers on gloo, simplest first (Hypothesis shrinks toward
``float32``)."""

PLAIN_DTYPE_NAMES: Final[tuple[str, ...]] = tuple(
    n for n in DTYPE_NAMES if getattr(torch, n) in GLOO_NATIVE_DTYPES
)
"""The dtypes a plain gloo collective carries itself (``DTYPE_NAMES`` without int16,
which gloo refuses with "Invalid scalar type" and vargather sends as bytes): what the
strategies draw by default for an implementation other than vargather's own."""

MEMORY_LAYOUTS: Final = ("contiguous", "transposed", "sliced")
"""How a rank's shard sits in memory: packed; its dimensions stored in reverse order
(a transposed view); or every other element of a larger buffer (strides of 2 and a
non-zero storage offset)."""

SIZES_FORMS: Final = ("none", "list", "tensor")
"""How ``sizes`` is passed: not at all, as a list of ints, as a 1-d int64 tensor."""

COMPILE_BACKENDS: Final = ("eager", "aot_eager", "inductor")
"""The ``torch.compile`` backends a compiled case runs its step under
(``GatherCase.compile_backend``, ``vargather.testing.compiled``)."""

VALUE_KINDS: Final = ("full", "integers")
"""The ``make_values`` kinds a gather's case draws."""

UPSTREAM_KINDS: Final = ("integers", "real")
"""The ``make_upstream`` kinds."""

_SMALL: Final = 8  # |integer values| <= _SMALL


def _check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {tuple(choices)}")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={name!r} is not a torch dtype name")
    return dtype


def is_differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


# --- deterministic values --------------------------------------------------------------

FLOAT_FORMATS: Final[dict[torch.dtype, tuple[int, int, torch.dtype]]] = {
    # dtype: (bits, mantissa bits, same-width integer dtype)
    torch.float64: (64, 52, torch.int64),
    torch.float32: (32, 23, torch.int32),
    torch.float16: (16, 10, torch.int16),
    torch.bfloat16: (16, 7, torch.int16),
}


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@functools.cache
def _specials(dtype: torch.dtype) -> torch.Tensor:
    """Special values of a real dtype, built from bit patterns (NaN payloads survive)."""
    if dtype in FLOAT_FORMATS:
        bits, mant, int_dtype = FLOAT_FORMATS[dtype]
        sign = 1 << (bits - 1)
        exp_all = ((1 << (bits - 1 - mant)) - 1) << mant
        one = ((1 << (bits - 2 - mant)) - 1) << mant
        patterns = [
            0,  # +0.0
            sign,  # -0.0
            exp_all,  # +inf
            sign | exp_all,  # -inf
            exp_all | (1 << (mant - 1)),  # the canonical quiet NaN
            exp_all | (1 << (mant - 1)) | 1,  # a quiet NaN with a payload
            sign | exp_all | (1 << (mant - 1)) | 5,  # a negative NaN with a payload
            exp_all | 1,  # a signaling NaN (payload 1)
            1,  # smallest subnormal
            (1 << mant) - 1,  # largest subnormal
            sign | 1,  # -smallest subnormal
            1 << mant,  # smallest normal
            exp_all - 1,  # largest finite
            sign | (exp_all - 1),  # most negative finite
            one,  # 1.0
            sign | one,  # -1.0
            one | 1,  # 1 + eps
        ]
        raw = torch.tensor([_signed(p, bits) for p in patterns], dtype=int_dtype).view(dtype)
        if dtype == torch.float64:
            # float64 values float32 cannot hold: out of its range, or too precise.
            extra = torch.tensor([1e300, -1e-300, 2.0**-1074 * 3, 1.0 + 2.0**-40, 16777217.0])
            raw = torch.cat([raw, extra.to(torch.float64)])
        return raw
    if dtype == torch.bool:
        return torch.tensor([False, True])
    info = torch.iinfo(dtype)
    values = {0, 1, info.max, info.min, info.max - 1, info.min + 1}
    if info.min < 0:
        values.add(-1)
    if info.bits >= 32:
        values |= {2**24 + 1, -(2**24 + 1)}  # not representable in float32
    if info.bits >= 64:
        values |= {2**53 + 1, -(2**53 + 1), 2**62 + 3}  # not representable in float64
    return torch.tensor(sorted(values), dtype=dtype)


def _seed(seed: int, stream: int) -> int:
    mixed = (seed * 0x9E3779B97F4A7C15 + (stream + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    mixed ^= mixed >> 31
    return mixed & ((1 << 63) - 1)


def make_values(shape: Sequence[int], dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    """A contiguous tensor of ``shape``, deterministic in ``seed``.

    ``kind="full"``: random bit patterns of the dtype (every exponent, NaNs with
    payloads, subnormals) with about a third of the elements replaced by special
    values (+-0, +-inf, NaNs, subnormal and normal extremes, integer extremes, int64
    values float64 cannot hold, float64 values float32 cannot hold); complex dtypes
    get both parts this way. ``kind="integers"``: integers in [-8, 8] (bool: 0/1; their
    sums and inner products are exact).
    ``kind="special"`` (``SPECIAL_VALUES``): those integers with, in a real float
    dtype, about three in five elements -0.0, +inf or NaN (float32's NaNs carrying
    distinct payloads): values whose sums are exact and do not depend on their order.
    """
    if kind == SPECIAL_VALUES:
        return _with_specials(make_values(shape, dtype, seed, "integers"), seed)
    _check_choice("kind", kind, VALUE_KINDS)
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    real = dtype.to_real()
    count = numel * (2 if dtype.is_complex else 1)
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (count,), generator=gen).to(torch.bool)
    elif kind == "integers":
        low = 0 if dtype == torch.uint8 else -_SMALL
        flat = torch.randint(low, _SMALL + 1, (count,), generator=gen).to(real)
    else:
        width = torch.empty((), dtype=real).element_size()
        raw = torch.randint(0, 256, (count * width,), dtype=torch.uint8, generator=gen)
        flat = raw.view(real).clone()
        specials = _specials(real)
        use = torch.randint(0, 3, (count,), generator=gen) == 0
        pick = torch.randint(0, len(specials), (count,), generator=gen)
        flat[use] = specials[pick[use]]
    if dtype.is_complex:
        flat = torch.view_as_complex(flat.view(numel, 2))
    return flat.view(tuple(shape))


SPECIAL_VALUES: Final = "special"
"""``make_values``'s kind for reductions (the family's cases); not one of ``VALUE_KINDS``."""


def _with_specials(t: torch.Tensor, seed: int) -> torch.Tensor:
    """``t`` (real floats only) with -0.0, +inf and NaNs at seeded positions."""
    if not t.dtype.is_floating_point or t.numel() == 0:
        return t
    g = torch.Generator().manual_seed(seed ^ 0x5EED)
    flat = t.view(-1)
    picks = torch.randint(0, 5, (flat.numel(),), generator=g)
    flat[picks == 0] = -0.0
    flat[picks == 1] = math.inf
    if t.dtype == torch.float32:
        nan = torch.tensor([0x7FC00001, -0x0003FFFF], dtype=torch.int32).view(torch.float32)
        where = (picks == 2).nonzero().view(-1)
        for i, k in enumerate(where.tolist()):
            flat[k] = nan[i % 2]
    else:
        flat[picks == 2] = math.nan
    return t


def make_upstream(
    shape: Sequence[int], dtype: torch.dtype, seed: int, rank: int, kind: str
) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient ``g_rank``: different on every rank.

    ``kind="integers"``: integers in [-8, 8]; ``kind="real"``: normal values times
    2^k, k in [-3, 3], with full mantissas. Element 0 is ``rank + 1`` so that no two
    ranks' gradients are equal whenever the output is not empty.
    """
    _check_choice("kind", kind, UPSTREAM_KINDS)
    if not is_differentiable(dtype):
        raise ValueError(f"dtype {dtype} has no gradients")
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    count = numel * (2 if dtype.is_complex else 1)
    if kind == "integers":
        flat = torch.randint(-_SMALL, _SMALL + 1, (count,), generator=gen).to(torch.float64)
    else:
        scale = torch.randint(-3, 4, (count,), generator=gen).to(torch.float64).exp2()
        flat = torch.randn(count, generator=gen, dtype=torch.float64) * scale
    if count:
        flat[0] = rank + 1
    flat = flat.to(dtype.to_real())
    if dtype.is_complex:
        flat = torch.view_as_complex(flat.view(numel, 2))
    return flat.view(tuple(shape))


def _lay_out(values: torch.Tensor, memory: str) -> torch.Tensor:
    """``values`` (contiguous) in the memory layout ``memory``, same logical content."""
    _check_choice("memory", memory, MEMORY_LAYOUTS)
    if memory == "contiguous":
        return values
    if memory == "transposed":
        order = list(range(values.ndim))[::-1]
        return values.permute(order).contiguous().permute(order)
    base = torch.zeros([2 * s + 1 for s in values.shape], dtype=values.dtype)  # sliced
    view = base[tuple(slice(1, None, 2) for _ in values.shape)]
    view.copy_(values)
    return view

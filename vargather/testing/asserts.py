"""Bit-for-bit tensor comparison: ``assert_bitwise_equal`` and the judge's mismatch text.

Where it sits: in the testing kit, beside the case model (``cases``), below the judge
(``judge`` compares a rank's output with the oracle's here, so a failing property and
a failing user test describe a difference in the same words). Public:
``vargather.testing.assert_bitwise_equal``, for tests of your own gathers, where
``torch.equal`` is the wrong tool: it calls two NaNs different (the strategies draw
NaNs with payloads on purpose) and ``0.0`` equal to ``-0.0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch

_INT_OF_WIDTH: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_patterns(t: torch.Tensor) -> torch.Tensor:
    """Elementwise bit patterns as integers, one row per element (complex: two, the
    real and the imaginary part's)."""
    r = t.detach().resolve_conj().resolve_neg().cpu()
    if r.is_complex():
        r = torch.view_as_real(r)
    r = r.view(_INT_OF_WIDTH[r.element_size()])
    return r.reshape(-1, 2 if t.is_complex() else 1)


def _show(t: torch.Tensor, flat: int) -> str:
    """Element ``flat`` (row-major) of ``t``: its value, and for floats its bits."""
    v = t.detach().resolve_conj().resolve_neg().cpu().reshape(-1)[flat]
    value = v.item()
    if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
        return repr(value)
    words = bit_patterns(v.reshape(1))[0].tolist()
    width = 2 * v.element_size() // (2 if t.is_complex() else 1)
    hexes = "/".join(f"0x{w & ((1 << (4 * width)) - 1):0{width}x}" for w in words)
    return f"{value!r} ({hexes})"


def _index(shape: Sequence[int], flat: int) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(index))


def mismatch_detail(
    got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, extra: str = ""
) -> str:
    """``in N of M elements; first at index (i, j): got X, expected Y`` for the
    elements ``bad`` (a bool tensor of ``want``'s shape, at least one True) marks."""
    count = int(bad.sum().item())
    first = int(bad.reshape(-1).nonzero()[0, 0].item())
    return (
        f"in {count} of {want.numel()} elements; first at index {_index(want.shape, first)}: "
        f"got {_show(got, first)}, expected {_show(want, first)}{extra}"
    )


def bitwise_difference(actual: object, expected: object) -> str | None:
    """``None`` when ``actual`` and ``expected`` are tensors of the same dtype, shape and
    bytes; otherwise what differs, in words: a type, the dtypes, the shapes
    (``dtype differs: got torch.float32, expected torch.float64``), or the elements
    (``in N of M elements; first at index I: got X, expected Y``, floats with their
    bits).

    It never raises: a non-tensor argument is a difference it describes.
    """
    if not isinstance(actual, torch.Tensor):
        return _not_a_tensor("actual", actual)
    if not isinstance(expected, torch.Tensor):
        return _not_a_tensor("expected", expected)
    problems = []
    if actual.dtype != expected.dtype:
        problems.append(f"dtype differs: got {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        problems.append(
            f"shape differs: got {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )
    if problems:
        return "; ".join(problems)
    if actual.numel() == 0:
        return None
    bad = (bit_patterns(actual) != bit_patterns(expected)).any(-1)
    if not bool(bad.any()):
        return None
    return mismatch_detail(actual, expected, bad.reshape(expected.shape))


def nan_payloads_only(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``actual`` differs from ``expected`` (same dtype and shape) only in the
    bits of NaNs: a NaN wherever ``expected`` has one (complex: per component), and the
    same bytes everywhere else. IEEE 754 leaves a sum's NaN payload unspecified."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if not (expected.is_floating_point() or expected.is_complex()):
        return False
    got = actual.detach().resolve_conj().resolve_neg().cpu()
    want = expected.detach().resolve_conj().resolve_neg().cpu()
    if want.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    nans = want.isnan()
    if not torch.equal(got.isnan(), nans):
        return False
    same = (bit_patterns(got) == bit_patterns(want)).reshape(want.shape)
    return bool((same | nans).all())


def _not_a_tensor(name: str, value: object) -> str:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return f"{name} is a {type(value).__name__}, not a torch.Tensor: {shown}"


def assert_bitwise_equal(actual: object, expected: object, msg: str | None = None) -> None:
    """Assert that ``actual`` and ``expected`` are tensors with the same dtype, shape and
    bytes (NaN payloads, ``-0.0``, bfloat16, bool, float8 and complex included), whatever
    their strides or devices (a tensor off the CPU is copied to it to be compared).

    The ``AssertionError`` names what differs: the dtypes, the shapes, or the number of
    differing elements and the first one's index with both values (and their bits, for
    floating-point and complex dtypes). ``msg`` is put in front of it.

    Raises:
        AssertionError: the two differ (the message says how), or either is not a tensor.
    """
    __tracebackhide__ = True  # pytest: the failure is the caller's line, not this one
    difference = bitwise_difference(actual, expected)
    if difference is None:
        return
    text = f"tensors are not bitwise equal: {difference}"
    raise AssertionError(f"{msg}: {text}" if msg else text)

"""NaN results of the reducing collectives: one canonical bit pattern per dtype.

Below every stage, beside ``_dtypes``: the collectives that add values across ranks
(``reduce_scatter_v``'s forward, the ``sum`` and ``mean`` backwards of the gathers) and
the oracle (``oracle``) call ``canonical_nans_`` on what they computed, so both give the
same bits for a NaN whatever the operands' memory layout, torch's kernel path or the
backend's reduction.

Why: IEEE 754 fixes the value of a sum, not the bits of a NaN it produces. torch's
vectorized bfloat16 conversion writes ``0xffff`` for a NaN where its scalar one writes
``0x7fc0``; x86 turns ``inf + -inf`` into a negative NaN; which operand's payload a
sum of two NaNs keeps is the hardware's choice. So the semantics: **every NaN in the
result of a reduction is the canonical quiet NaN of its dtype** (sign clear, quiet bit
set, payload zero: ``0x7e00`` float16, ``0x7fc0`` bfloat16, ``0x7fc00000`` float32,
``0x7ff8000000000000`` float64; for a complex dtype each NaN component, real or
imaginary, is its real dtype's). Every other bit of a reduced result (``-0.0``,
infinities, the values) stays as the arithmetic made it. Collectives that only move
data (the gathers' forwards, ``all_to_all_v``, the backwards that are gathers or
exchanges) never call this: their results keep every NaN payload as sent.

Cost: one sum over the result when it has no NaN (a read, no allocation; a NaN
anywhere makes the sum a NaN, and a sum that overflowed to ``inf - inf`` only sends a
NaN-free tensor down the exact path below); one ``isnan`` and one ``masked_fill_`` when
it does.
"""

from __future__ import annotations

import torch

__all__ = ["canonical_nan", "canonical_nans_"]


def canonical_nan(dtype: torch.dtype) -> torch.Tensor:
    """The canonical quiet NaN of the real floating ``dtype`` as a 0-d tensor."""
    return torch.tensor(float("nan"), dtype=dtype)


def canonical_nans_(t: torch.Tensor) -> torch.Tensor:
    """Every NaN element of ``t`` (each NaN component, for complex) set, in place, to
    the canonical quiet NaN of its dtype; ``t`` itself is returned. Integer and bool
    tensors are returned untouched."""
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return t
    if not bool(torch.isnan(t.sum())):
        return t
    real = torch.view_as_real(t) if t.is_complex() else t
    real.masked_fill_(torch.isnan(real), float("nan"))
    return t

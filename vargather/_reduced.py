"""What a reduction's result is, bit for bit: canonical NaNs, complex sums and means
per component.

Below every stage, beside ``_dtypes``: the collectives that add values across ranks
(``reduce_scatter_v``'s forward, the ``sum`` and ``mean`` backwards of the gathers) and
the oracle (``oracle``) pass what they computed through these helpers, so both give the
same bits whatever the operands' memory layout, torch's kernel path or the backend.

NaNs. IEEE 754 fixes the value of a sum, not the bits of a NaN it produces. torch's
vectorized bfloat16 conversion writes ``0xffff`` for a NaN where its scalar one writes
``0x7fc0``; x86 turns ``inf + -inf`` into a negative NaN; which operand's payload a
sum of two NaNs keeps is the hardware's choice. So: **every NaN in the result of a
reduction is the canonical quiet NaN of its dtype** (sign clear, quiet bit set,
payload zero: ``0x7e00`` float16, ``0x7fc0`` bfloat16, ``0x7fc00000`` float32,
``0x7ff8000000000000`` float64; for a complex dtype each NaN component, real or
imaginary, is its real dtype's). Every other bit of a reduced result (``-0.0``,
infinities, the values) stays as the arithmetic made it. Collectives that only move
data (the gathers' forwards, ``all_to_all_v``, the backwards that are gathers or
exchanges) never call these: their results keep every NaN payload as sent.

Complex values are added and divided component by component, as the backends' sums
add them. torch's ``add`` computes ``a + alpha * b`` with ``alpha = 1 + 0i``, and
``(1 + 0i) * (0 + inf i)`` is ``nan + inf i``: ``0 + (inf i)`` would be ``nan + inf i``.
``add_`` adds the real views instead. ``mean`` is the sum divided by ``W`` the same way:
a complex division by ``W + 0i`` would spread a NaN or an infinity of one component
into the other (and round ``a * (1/W)``, not ``a / W``).

Cost: one ``sum`` over the result when it has no NaN (a read, no allocation; a NaN
anywhere makes the sum a NaN, and a NaN-free sum that overflows to ``inf - inf`` only
sends the tensor down the exact path, which then finds nothing); one ``isnan`` and one
``masked_fill_`` when it has one.
"""

from __future__ import annotations

import torch

__all__ = ["add_", "canonical_nans_", "mean_"]


def add_(out: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``out += other`` in place, a complex one component by component; ``out``."""
    if out.is_complex():
        torch.view_as_real(out).add_(torch.view_as_real(other))
    else:
        out.add_(other)
    return out


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


def mean_(total: torch.Tensor, world_size: int) -> torch.Tensor:
    """``total / world_size`` in place, each component of a complex divided alone, NaNs
    canonical: the ``mean`` contract from the ``sum`` one's result."""
    real = torch.view_as_real(total) if total.is_complex() else total
    real.div_(world_size)
    return canonical_nans_(total)

"""What a reduction's result is, bit for bit: canonical NaNs, complex sums and means
per component.

Below every stage, beside ``_dtypes``: the collectives that add values across ranks
(``reduce_scatter_v``'s forward, the ``sum`` and ``mean`` backwards of the gathers) and
the oracle (``oracle``) pass what they computed through these helpers, so both give the
same bits whatever the operands' memory layout, torch's kernel path or the backend
(the rule and why: ``docs/family.md``, "Bit for bit, and NaN results"). Collectives that
only move data never call these: their results keep every NaN payload as sent.

Cost: one ``sum`` over the result when it has no NaN (a read, no allocation; a NaN
anywhere makes the sum a NaN, and a NaN-free sum that overflows to ``inf - inf`` only
sends the tensor down the exact path, which then finds nothing); one ``isnan`` and one
``masked_fill_`` when it has one.
"""

from __future__ import annotations

import torch


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
    """``total / world_size`` in place, each component of a complex divided alone (a
    division by ``W + 0i`` would spread one component's NaN or infinity into the other),
    NaNs canonical: the ``mean`` contract from the ``sum`` one's result."""
    real = torch.view_as_real(total) if total.is_complex() else total
    real.div_(world_size)
    return canonical_nans_(total)

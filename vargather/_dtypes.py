"""The dtype table: which dtypes vargather gathers, their wire codes, how each travels.

Below every stage: the argument checks (``_args``) refuse a dtype the backend cannot
carry, the wire format (``_wire``) sends a dtype as its code, validation (``_exchange``)
names a code back, and the collectives (``_comm``) send a dtype gloo refuses as bytes.
"""

from __future__ import annotations

from typing import Final

import torch

WIRE_DTYPES: Final[tuple[torch.dtype, ...]] = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.complex32,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)
"""Every dtype a record can name; the position + 1 is its wire code (0: none or
unknown). Append only: a code must mean the same dtype in every vargather version."""

GLOO_DTYPES: Final[frozenset[torch.dtype]] = frozenset(WIRE_DTYPES[:12])
"""Dtypes vargather gathers on gloo (int16 among them, travelling as bytes)."""

NATIVE_DTYPES: Final[frozenset[torch.dtype]] = GLOO_DTYPES - {torch.int16}
"""Dtypes the backends move themselves; any other travels as its bytes, exact because a
data-movement collective computes nothing (gloo refuses int16 and the unsigned types
wider than 8 bits with "Invalid scalar type", NCCL has no int16). Public as
``vargather.GLOO_NATIVE_DTYPES``: what a plain gloo collective (a hand-written gather)
carries."""


def dtype_code(dtype: torch.dtype) -> int:
    """The wire code of ``dtype`` (0 when the table does not hold it)."""
    return WIRE_DTYPES.index(dtype) + 1 if dtype in WIRE_DTYPES else 0


def dtype_from_code(code: int) -> torch.dtype | None:
    """The dtype of wire code ``code``, or ``None`` for 0 and unknown codes."""
    return WIRE_DTYPES[code - 1] if 0 < code <= len(WIRE_DTYPES) else None


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype`` as users write it after ``torch.``: ``"float32"``."""
    return str(dtype).removeprefix("torch.")

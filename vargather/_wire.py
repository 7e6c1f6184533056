"""Stage 2: the wire format: every byte layout vargather puts on the wire.

Where it sits: beneath the exchange (``_exchange``) and both rounds (``_fused``,
``_family``), the only reader and writer of each format. Three formats, one magic
scheme (``tagged_magic``): the full record (``encode_record``: ``RECORD_LENGTH`` words
on every rank, so one equal-size all_gather carries them all; the problem's message as
``MESSAGE_WORDS`` words of ASCII, ``?`` for anything else, cut to fit; integers
saturated into int64, everything else exact), the all_gather-shaped round's compact
header (``encode_header``: ``HEADER_WORDS`` words of what validation compares, a
problem only a flag, its text left to a full record on the error path) and the
all_to_all-shaped round's row (``encode_row``), plus the words that open an
``all_gather_list`` carrier (``carrier_words``). A vector vargather cannot read raises
``ProtocolMismatchError``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, Final

from ._args import MAX_NDIM, CallRecord, Problem, saturate
from ._errors import (
    ArgumentError,
    DimError,
    InputShapeError,
    InputTypeError,
    ProtocolMismatchError,
    SizesError,
    SizesTypeError,
    VarGatherError,
)


def tagged_magic(tag: str, version: int) -> int:
    """The one magic scheme of every format on the wire: four ASCII letters naming the
    format, then its version in the low byte (``"vgfu"``, 1 -> ``0x7667667501``). A
    peer of another format or version fails the magic check, whichever it is."""
    raw = tag.encode("ascii")
    assert len(raw) == 4
    assert 0 <= version < 256
    return int.from_bytes(raw, "big") << 8 | version


PROTOCOL_VERSION: Final = 3
MAGIC: Final = tagged_magic("varg", PROTOCOL_VERSION)
"""The full record's magic (its version also has a word of its own, ``version``)."""
MESSAGE_WORDS: Final = 64  # 512 ASCII bytes of a problem's message

_PROBLEM_ERRORS: Final[tuple[type[VarGatherError], ...]] = (
    InputTypeError,
    InputShapeError,
    DimError,
    SizesTypeError,
    SizesError,
    ArgumentError,
)
"""The error classes a local problem can raise; position + 1 is the wire code (0: none)."""

_FIELDS: Final = (
    "magic",
    "version",
    "error_code",
    "ndim",
    "dtype_code",
    "dim",
    "normalized_dim",
    "contract_code",
    "transport_code",
    "requires_grad",
    "device_code",
    "sizes_len",
    "sizes_own",
    "sizes_sum",
    "sizes_hash",
)
_MESSAGE_AT: Final = len(_FIELDS)
_SHAPE_AT: Final = _MESSAGE_AT + MESSAGE_WORDS
RECORD_LENGTH: Final = _SHAPE_AT + MAX_NDIM
RECORD_SHAPE_AT: Final = _SHAPE_AT
"""Where a record's shape starts, in words: dimension ``d < MAX_NDIM`` at ``+ d``."""


def wire_text(text: str) -> str:
    """``text`` as the wire delivers it: ASCII (``?`` for the rest), cut to fit."""
    raw = text.encode("ascii", "replace")[: 8 * MESSAGE_WORDS]
    return raw.rstrip(b"\0").decode("ascii")


def _encode_text(text: str) -> list[int]:
    raw = text.encode("ascii", "replace")[: 8 * MESSAGE_WORDS].ljust(8 * MESSAGE_WORDS, b"\0")
    return [
        int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(MESSAGE_WORDS)
    ]


def _decode_text(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("ascii", "replace")


def encode_record(record: CallRecord) -> list[int]:
    """The record as ``RECORD_LENGTH`` int64 values (saturated into int64)."""
    return list(_encoded_record(record))


@functools.lru_cache(maxsize=256)
def _encoded_record(record: CallRecord) -> tuple[int, ...]:
    """``encode_record``, remembered for recent records (a ``CallRecord`` is immutable;
    about 35 us each, most of it the message's text, on every call whose record is new
    to the round: a caller whose sizes change every call sends the same record)."""
    problem = record.problem
    code = 0 if problem is None else _PROBLEM_ERRORS.index(problem.error) + 1
    values = [MAGIC, PROTOCOL_VERSION, code, *(int(getattr(record, n)) for n in _FIELDS[3:])]
    message = "" if problem is None else problem.message
    shape = list(record.shape[:MAX_NDIM]) + [0] * (MAX_NDIM - min(len(record.shape), MAX_NDIM))
    return (*[saturate(v) for v in values], *_encode_text(message), *shape)


def decode_record(values: Sequence[int], *, rank: int) -> CallRecord:
    """Inverse of ``encode_record``; ``ProtocolMismatchError`` on a foreign vector."""
    if len(values) != RECORD_LENGTH or values[0] != MAGIC or values[1] != PROTOCOL_VERSION:
        got = list(values[:2]) if len(values) >= 2 else list(values)
        raise ProtocolMismatchError(
            f"rank {rank} sent metadata vargather cannot read: expected magic {MAGIC:#x} "
            f"and protocol version {PROTOCOL_VERSION} in {RECORD_LENGTH} values, got "
            f"{got} in {len(values)} values (another vargather version, or another "
            "collective issued on this group?)",
            ranks=[rank],
        )
    f: dict[str, Any] = dict(zip(_FIELDS, (int(v) for v in values), strict=False))
    code = f["error_code"]
    if not 0 <= code <= len(_PROBLEM_ERRORS):
        raise ProtocolMismatchError(
            f"rank {rank} sent an unknown error code {code}: expected one of "
            f"0..{len(_PROBLEM_ERRORS)} (another vargather version?)",
            ranks=[rank],
        )
    problem = (
        None
        if code == 0
        else Problem(_PROBLEM_ERRORS[code - 1], _decode_text(values[_MESSAGE_AT:_SHAPE_AT]))
    )
    ndim = f["ndim"]
    f["requires_grad"] = bool(f["requires_grad"])
    return CallRecord(
        problem=problem,
        shape=tuple(int(v) for v in values[_SHAPE_AT : _SHAPE_AT + max(0, min(ndim, MAX_NDIM))]),
        **{name: f[name] for name in _FIELDS[3:]},
    )


# --- the compact header of the fused round ---------------------------------------------

HEADER_WORDS: Final = 12
HEADER_BYTES: Final = 8 * HEADER_WORDS
SHAPE_SLOTS: Final = 6
"""Dims of the shape a compact header carries; a wider tensor takes the full path."""

HEADER_MAGIC: Final = tagged_magic("vgfu", 1)
"""The compact header's magic (the all_gather-shaped round)."""
FLAG_PROBLEM: Final = 1
FLAG_LONG: Final = 2
FLAG_ELIGIBLE: Final = 4
FLAG_REQUIRES_GRAD: Final = 8
KIND_SHIFT: Final = 4
"""The flags word's bits from here on hold the caller's collective (its wire code)."""


_FLAGS_AT: Final = 1
_CODES_AT: Final = 2
_COUNT_AT: Final = 3
_SIZES_LEN_AT: Final = 4
_SIZES_HASH_AT: Final = 5
_HEADER_SHAPE_AT: Final = 6
"""Word positions in a compact header: ``HEADER_MAGIC``; the flags (``FLAG_*``, and from
bit ``KIND_SHIFT`` the caller's collective's wire code); the ndim, dtype, normalized dim,
contract, transport and device codes, a byte each, in one word; the tensor count; the
passed sizes' length and hash; ``SHAPE_SLOTS`` dims of the shape."""


def _byte(v: int) -> int:
    return max(0, min(255, v))


def encode_header(record: CallRecord | None, count: int, flags: int) -> list[int]:
    """A compact header: ``record`` (``None``: an unused slot) of a call of ``count``
    tensors, with ``flags`` (the caller's ``FLAG_ELIGIBLE``) and the record's own."""
    if record is None:
        return [HEADER_MAGIC, flags, 0, saturate(count), -1, -1] + [0] * SHAPE_SLOTS
    if record.problem is not None:
        flags |= FLAG_PROBLEM
    if record.ndim > SHAPE_SLOTS:
        flags |= FLAG_LONG
    if record.requires_grad:
        flags |= FLAG_REQUIRES_GRAD
    codes = (
        _byte(record.ndim)
        | _byte(record.dtype_code) << 8
        | _byte(record.normalized_dim + 1) << 16
        | _byte(record.contract_code + 1) << 24
        | _byte(record.transport_code + 1) << 32
        | _byte(record.device_code + 1) << 40
    )
    shape = list(record.shape[:SHAPE_SLOTS])
    return [
        HEADER_MAGIC,
        flags,
        codes,
        saturate(count),
        record.sizes_len,
        record.sizes_hash,
        *shape,
        *[0] * (SHAPE_SLOTS - len(shape)),
    ]


def call_flags(*, eligible: bool, kind_code: int) -> int:
    """The flags a call passes to ``encode_header`` (``FLAG_ELIGIBLE``: this rank may
    take the fused transport)."""
    return (FLAG_ELIGIBLE if eligible else 0) | kind_code << KIND_SHIFT


def encode_headers(slots: int, records: Sequence[CallRecord], count: int, flags: int) -> list[int]:
    """``slots`` compact headers back to back: ``records[i]`` for ``i < count``, unused
    slots after them (``slots >= count``)."""
    words: list[int] = []
    for i in range(slots):
        words += encode_header(records[i] if i < count else None, count, flags)
    return words


@functools.lru_cache(maxsize=16)
def header_struct(slots: int) -> struct.Struct:
    """The bytes of ``slots`` compact headers: native-endian int64, as a tensor of
    ``torch.int64`` lies in memory (the round writes them with either)."""
    return struct.Struct(f"={slots * HEADER_WORDS}q")


def split_headers(row: Sequence[int]) -> list[Sequence[int]]:
    """One rank's received words as its compact headers, in slot order."""
    return [row[i * HEADER_WORDS : (i + 1) * HEADER_WORDS] for i in range(len(row) // HEADER_WORDS)]


def magic_mismatch(h: Sequence[int]) -> str | None:
    """Why ``h`` is not a compact header of this version (``None`` when it is)."""
    if h[0] == HEADER_MAGIC:
        return None
    return f"expected magic {HEADER_MAGIC:#x}, got {h[0]:#x}"


def header_flags(h: Sequence[int]) -> int:
    """The flag bits of ``h`` (``FLAG_*``), without the kind."""
    return h[_FLAGS_AT] & ((1 << KIND_SHIFT) - 1)


def header_kind(h: Sequence[int]) -> int:
    """The caller's collective in ``h``, as its wire code (``_collectives``)."""
    return h[_FLAGS_AT] >> KIND_SHIFT


def header_count(h: Sequence[int]) -> int:
    """The tensor count of the call that sent ``h``."""
    return h[_COUNT_AT]


def size_word_at(slot: int, dim: int) -> int:
    """Where, in one rank's words, the header of ``slot`` holds its size along ``dim``
    (``dim < SHAPE_SLOTS``)."""
    return slot * HEADER_WORDS + _HEADER_SHAPE_AT + dim


def sizes_len_word_at(slot: int) -> int:
    """Where, in one rank's words, the header of ``slot`` holds the passed sizes'
    length (-1: none passed)."""
    return slot * HEADER_WORDS + _SIZES_LEN_AT


def decode_header(h: Sequence[int]) -> CallRecord:
    """A compact header (no problem, ndim <= SHAPE_SLOTS) as a problem-free record."""
    codes = h[_CODES_AT]
    ndim = codes & 0xFF
    normalized_dim = ((codes >> 16) & 0xFF) - 1
    return CallRecord(
        problem=None,
        ndim=ndim,
        dtype_code=(codes >> 8) & 0xFF,
        dim=normalized_dim,
        normalized_dim=normalized_dim,
        contract_code=((codes >> 24) & 0xFF) - 1,
        transport_code=((codes >> 32) & 0xFF) - 1,
        requires_grad=bool(h[_FLAGS_AT] & FLAG_REQUIRES_GRAD),
        device_code=((codes >> 40) & 0xFF) - 1,
        sizes_len=h[_SIZES_LEN_AT],
        sizes_own=-1,
        sizes_sum=-1,
        sizes_hash=h[_SIZES_HASH_AT],
        shape=tuple(h[_HEADER_SHAPE_AT : _HEADER_SHAPE_AT + min(ndim, SHAPE_SLOTS)]),
    )


# --- the row of the all_to_all-shaped round ------------------------------------------

ROW_MAGIC: Final = tagged_magic("vgfa", 1)
"""The row's magic: the word after the record in every row of the all_to_all-shaped
round (``_family``)."""

_ROW_MARK_AT: Final = RECORD_LENGTH
ROW_EXTRAS_AT: Final = RECORD_LENGTH + 2
"""Where a row's extras start, in words (after the record, the magic and the code)."""


def row_extra_words(world_size: int) -> int:
    """The length of every row's extras: ``2 * (W + 1) + 1`` words, the longest any
    collective of the round sends (``all_to_all_v``'s two size vectors and its
    ``cat_dim``), so that every row of every collective of the round has one length."""
    return 2 * (world_size + 1) + 1


def encode_row(
    record: CallRecord, code: int, extras: Sequence[int], world_size: int, flag: int
) -> list[int]:
    """One row of the all_to_all-shaped round: ``encode_record(record) + [ROW_MAGIC,
    code] + extras + [flag]``, the extras (the caller's own words, carried unread)
    padded with ``-1`` to ``row_extra_words(W)`` (more is a ``ValueError``: rows of two
    lengths would not pair) and the row to an even count of words (16-byte rows: every
    payload slot after a row starts aligned)."""
    room = row_extra_words(world_size)
    if len(extras) > room:
        raise ValueError(f"a row carries at most {room} extra words, got {len(extras)}")
    pad = [-1] * (room - len(extras))
    words = [*encode_record(record), ROW_MAGIC, code, *extras, *pad, flag]
    return words + [0] * (len(words) % 2)


def row_mark(row: Sequence[int]) -> tuple[int, int]:
    """A row's magic and collective code (read before anything else of it)."""
    return row[_ROW_MARK_AT], row[_ROW_MARK_AT + 1]


def decode_row(
    row: Sequence[int], n_extras: int, world_size: int, *, rank: int
) -> tuple[CallRecord, tuple[int, ...], int]:
    """A row whose mark was checked: its record, its first ``n_extras`` extras and its
    flag word."""
    extras = tuple(row[ROW_EXTRAS_AT : ROW_EXTRAS_AT + n_extras])
    flag = int(row[ROW_EXTRAS_AT + row_extra_words(world_size)])
    return _decoded_record(tuple(row[:RECORD_LENGTH]), rank), extras, flag


@functools.lru_cache(maxsize=256)
def _decoded_record(values: tuple[int, ...], rank: int) -> CallRecord:
    """``decode_record``, remembered for recent records (as ``_encoded_record``)."""
    return decode_record(values, rank=rank)


# --- the words that open an all_gather_list carrier ----------------------------------

CARRIER_MAGIC: Final = tagged_magic("vgls", 1)
"""Marks an ``all_gather_list`` carrier (the first of its words): a peer whose run does
not start with it made another call of the same round (``all_gather_v_coalesced`` of
one tensor)."""


def carrier_words(shape: Sequence[int], passed: Sequence[int]) -> list[int]:
    """The int64 words that open a rank's ``all_gather_list`` carrier:
    ``[CARRIER_MAGIC, ndim, *shape, *passed]`` (``passed``: whether shapes were passed,
    and their hash)."""
    return [CARRIER_MAGIC, len(shape), *shape, *passed]


def carrier_ndim(first: Sequence[int] | None) -> int:
    """The ndim a carrier's first two words announce (-1: not a carrier)."""
    return first[1] if first is not None and first[0] == CARRIER_MAGIC else -1

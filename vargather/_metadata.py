"""Stage 1: the size/metadata exchange and all validation.

Pipeline: **metadata exchange** -> padding -> transport -> compaction -> autograd.

Each rank encodes what it was called with (is it a tensor, ndim, dtype, layout and
device, full shape, ``dim``, the gradient contract, the transport, caller-passed
``sizes``, and any problem found locally) into one fixed-length int64 vector,
``MetadataRecord``. Encoding never raises, whatever the arguments: a rank that raised
here would leave its peers waiting in the exchange. One equal-size all_gather gives
every rank the ``W x RECORD_LENGTH`` matrix of all records. ``validate_records`` then
decides from that matrix alone, so every rank reaches the same verdict: either the
same ``VarGatherError`` with the same message on every rank, before any payload
moves, or the same ``Layout``.

What is checked, when the exchange runs (the default, ``validate=True``):
  * locally, then reported on every rank: input is a strided tensor on a device the
    backend carries, ndim >= 1 and at most ``MAX_NDIM``, ``dim`` an integer in range,
    a dtype the backend carries, ``grad``/``transport``/``validate``/``timeout``
    valid, caller ``sizes`` well-formed (integers, 1-d, ``>= 0``, length ``W``, own
    entry equal to the local size);
  * across ranks: the same ``grad``, ``transport``, normalized ``dim``, device type,
    ndim, dtype and non-gathered dimensions; every rank's passed ``sizes`` equal to
    the true sizes (compared through their length and a 61-bit hash; when they
    differ every rank knows it, and one more small all_gather of the passed lists
    makes the message show them); the same ``requires_grad`` under the
    communicating contracts ``sum`` and ``mean``.

With ``sizes`` passed and ``validate=False`` the exchange is skipped (one collective
less). Then only the local checks run, and a failing one raises **on that rank
only**: its peers cannot know and wait in the payload collective until the timeout
(``CollectiveTimeoutError``, naming the missing rank). Everything cross-rank is
trusted: sizes that lie about *other* ranks, different dtypes or shapes are then the
backend's business (gloo may abort the process, or the result is silently wrong;
see FACTS). ``validate`` and whether ``sizes`` are passed must then agree on every
rank: a rank that skips the exchange while a peer runs it issues a different
collective. These lies cannot be detected without the exchange, which is what
``validate=True`` is for.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from typing import Final

import torch

from ._comm import GroupInfo, all_gather_equal, per_call_timeout_supported
from ._errors import (
    ArgumentError,
    ArgumentMismatchError,
    DimError,
    DTypeMismatchError,
    InputShapeError,
    InputTypeError,
    ProtocolMismatchError,
    RequiresGradMismatchError,
    ShapeMismatchError,
    SizesError,
    SizesMismatchError,
    SizesTypeError,
    VarGatherError,
)
from ._layout import Layout
from ._transport import unsupported_reason

__all__ = [
    "CONTRACTS",
    "GLOO_DTYPES",
    "MAX_NDIM",
    "RECORD_LENGTH",
    "STATUS_ERRORS",
    "MetadataRecord",
    "Status",
    "build_layout",
    "decode_record",
    "encode_record",
    "exchange_records",
    "local_record",
    "normalize_sizes",
    "parse_timeout",
    "plan_layout",
    "sizes_hash",
    "trusted_layout",
    "validate_records",
]

MAGIC: Final = 0x76617267  # "varg"
PROTOCOL_VERSION: Final = 2
MAX_NDIM: Final = 32
TEXT_WORDS: Final = 8  # 64 ASCII bytes of detail text (a type name, a bad value)
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
SIZES_SHOWN: Final = 64  # entries of each rank's passed sizes shown in a mismatch message
_MAX_TIMEOUT_S: Final = 1e9  # about 31 years; timedelta holds up to 999999999 days
_MIN_TIMEOUT_S: Final = 1e-3  # gloo counts in milliseconds: less rounds to "expire at once"

CONTRACTS: Final = ("sum", "local", "mean")
"""Gradient contracts, in the order of their wire codes."""

# Wire codes of dtypes. Append only: the position is the code (0 = none/unknown).
_DTYPES: Final[tuple[torch.dtype, ...]] = (
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

GLOO_DTYPES: Final[frozenset[torch.dtype]] = frozenset(_DTYPES[:12])
"""Dtypes vargather gathers on gloo (int16 travels as bytes: gloo itself refuses it,
see ``_comm``)."""

_DEVICE_TYPES: Final = ("cpu", "cuda", "xpu", "mps", "meta", "hpu", "privateuseone")
_BACKEND_DEVICES: Final[dict[str, frozenset[str]]] = {
    "gloo": frozenset({"cpu", "cuda"}),
    "nccl": frozenset({"cuda"}),
}
"""Device types each known backend carries; other backends are not checked."""


class Status(IntEnum):
    """What a rank found wrong with its own arguments (0 = nothing). Append only."""

    OK = 0
    NOT_TENSOR = 1
    ZERO_DIM = 2
    TOO_MANY_DIMS = 3
    DIM_NOT_INT = 4
    DIM_OUT_OF_RANGE = 5
    UNSUPPORTED_DTYPE = 6
    SIZES_NOT_INTEGERS = 7
    SIZES_WRONG_LENGTH = 8
    SIZES_NEGATIVE = 9
    SIZES_OWN_ENTRY = 10
    BAD_CONTRACT = 11
    BAD_TRANSPORT = 12
    SIZES_NOT_1D = 13
    UNSUPPORTED_LAYOUT = 14
    UNSUPPORTED_DEVICE = 15
    BAD_VALIDATE = 16
    BAD_TIMEOUT = 17
    TIMEOUT_UNSUPPORTED = 18
    TRANSPORT_UNSUPPORTED = 19


STATUS_ERRORS: Final[dict[Status, type[VarGatherError]]] = {
    Status.NOT_TENSOR: InputTypeError,
    Status.ZERO_DIM: InputShapeError,
    Status.TOO_MANY_DIMS: InputShapeError,
    Status.DIM_NOT_INT: DimError,
    Status.DIM_OUT_OF_RANGE: DimError,
    Status.UNSUPPORTED_DTYPE: InputTypeError,
    Status.SIZES_NOT_INTEGERS: SizesTypeError,
    Status.SIZES_WRONG_LENGTH: SizesError,
    Status.SIZES_NEGATIVE: SizesError,
    Status.SIZES_OWN_ENTRY: SizesError,
    Status.BAD_CONTRACT: ArgumentError,
    Status.BAD_TRANSPORT: ArgumentError,
    Status.SIZES_NOT_1D: SizesError,
    Status.UNSUPPORTED_LAYOUT: InputTypeError,
    Status.UNSUPPORTED_DEVICE: InputTypeError,
    Status.BAD_VALIDATE: ArgumentError,
    Status.BAD_TIMEOUT: ArgumentError,
    Status.TIMEOUT_UNSUPPORTED: ArgumentError,
    Status.TRANSPORT_UNSUPPORTED: ArgumentError,
}
"""The error class every rank raises for a rank's local problem."""


def _saturate(value: int) -> int:
    """``value`` clamped into int64 (user values such as ``dim`` can be any int)."""
    return max(INT64_MIN, min(INT64_MAX, value))


def _show_int(value: int) -> str:
    if value == INT64_MAX:
        return f"{value} (or more)"
    if value == INT64_MIN:
        return f"{value} (or less)"
    return str(value)


@dataclass(frozen=True)
class MetadataRecord:
    """One rank's call, as every other rank will see it.

    ``detail_a``/``detail_b`` and ``text`` carry what the error message needs for a
    non-OK ``status`` (an offending value, a type name). Sizes fields are -1 when no
    ``sizes`` were passed. Every integer fits int64 (``local_record`` saturates).
    """

    status: Status
    detail_a: int
    detail_b: int
    text: str
    ndim: int
    dtype_code: int
    dim: int  # as passed (may be negative); 0 when not an int
    normalized_dim: int  # -1 when unknown
    contract_code: int
    transport_code: int
    requires_grad: bool
    device_code: int
    sizes_len: int
    sizes_own: int
    sizes_sum: int
    sizes_hash: int
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype | None:
        return _DTYPES[self.dtype_code - 1] if 0 < self.dtype_code <= len(_DTYPES) else None

    @property
    def sizes_passed(self) -> bool:
        return self.sizes_len >= 0

    @property
    def size_along_dim(self) -> int:
        return self.shape[self.normalized_dim]

    @property
    def other_dims(self) -> tuple[int, ...]:
        """The shape without the gather dimension."""
        d = self.normalized_dim
        return self.shape[:d] + self.shape[d + 1 :]


# --- layout of the wire vector ------------------------------------------------------
_FIELDS: Final = (
    "magic",
    "version",
    "status",
    "detail_a",
    "detail_b",
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
_TEXT_AT: Final = len(_FIELDS)
_SHAPE_AT: Final = _TEXT_AT + TEXT_WORDS
RECORD_LENGTH: Final = _SHAPE_AT + MAX_NDIM


def _encode_text(text: str) -> list[int]:
    raw = text.encode("ascii", "replace")[: 8 * TEXT_WORDS].ljust(8 * TEXT_WORDS, b"\0")
    return [
        int.from_bytes(raw[8 * i : 8 * i + 8], "little", signed=True) for i in range(TEXT_WORDS)
    ]


def _decode_text(words: Sequence[int]) -> str:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return raw.rstrip(b"\0").decode("ascii", "replace")


def encode_record(record: MetadataRecord) -> list[int]:
    """The record as ``RECORD_LENGTH`` int64 values (saturated into int64)."""
    values = [
        MAGIC,
        PROTOCOL_VERSION,
        int(record.status),
        record.detail_a,
        record.detail_b,
        record.ndim,
        record.dtype_code,
        record.dim,
        record.normalized_dim,
        record.contract_code,
        record.transport_code,
        int(record.requires_grad),
        record.device_code,
        record.sizes_len,
        record.sizes_own,
        record.sizes_sum,
        record.sizes_hash,
    ]
    shape = list(record.shape[:MAX_NDIM]) + [0] * (MAX_NDIM - min(len(record.shape), MAX_NDIM))
    return [_saturate(v) for v in values] + _encode_text(record.text) + shape


def decode_record(values: Sequence[int], *, rank: int) -> MetadataRecord:
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
    f = dict(zip(_FIELDS, values, strict=False))
    ndim = int(f["ndim"])
    try:
        status = Status(int(f["status"]))
    except ValueError:
        raise ProtocolMismatchError(
            f"rank {rank} sent an unknown status code {f['status']}: expected one of "
            f"0..{max(Status)} (another vargather version?)",
            ranks=[rank],
        ) from None
    return MetadataRecord(
        status=status,
        detail_a=int(f["detail_a"]),
        detail_b=int(f["detail_b"]),
        text=_decode_text(values[_TEXT_AT:_SHAPE_AT]),
        ndim=ndim,
        dtype_code=int(f["dtype_code"]),
        dim=int(f["dim"]),
        normalized_dim=int(f["normalized_dim"]),
        contract_code=int(f["contract_code"]),
        transport_code=int(f["transport_code"]),
        requires_grad=bool(f["requires_grad"]),
        device_code=int(f["device_code"]),
        sizes_len=int(f["sizes_len"]),
        sizes_own=int(f["sizes_own"]),
        sizes_sum=int(f["sizes_sum"]),
        sizes_hash=int(f["sizes_hash"]),
        shape=tuple(int(v) for v in values[_SHAPE_AT : _SHAPE_AT + max(0, min(ndim, MAX_NDIM))]),
    )


# --- sizes ------------------------------------------------------------------------

_HASH_MODULUS: Final = (1 << 61) - 1


def sizes_hash(sizes: Sequence[int]) -> int:
    """A 61-bit polynomial hash of a sizes list, identical in every process."""
    h = len(sizes) + 1
    for n in sizes:
        h = (h * 1_000_003 + n + 1) % _HASH_MODULUS
    return h


@dataclass(frozen=True)
class _SizesProblem:
    status: Status
    a: int = 0
    b: int = 0
    text: str = ""


def _describe_value(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return f"a tensor of dtype {str(v.dtype).removeprefix('torch.')} and shape {tuple(v.shape)}"
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 24 else text[:21] + '...'}"


def _parse_sizes(sizes: object) -> tuple[int, ...] | _SizesProblem:
    """Caller ``sizes`` as a tuple of ints, or what is wrong with them. Never raises."""
    try:
        if isinstance(sizes, torch.Tensor):
            if sizes.is_floating_point() or sizes.is_complex() or sizes.dtype == torch.bool:
                return _SizesProblem(Status.SIZES_NOT_INTEGERS, -1, 0, _describe_value(sizes))
            if sizes.ndim != 1:
                return _SizesProblem(Status.SIZES_NOT_1D, sizes.ndim, 0, _describe_value(sizes))
            values = [int(v) for v in sizes.tolist()]
        elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            return _SizesProblem(Status.SIZES_NOT_INTEGERS, -1, 0, type(sizes).__name__)
        else:
            values = []
            for i, v in enumerate(sizes):
                if isinstance(v, bool) or (
                    isinstance(v, torch.Tensor)
                    and (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)
                ):
                    return _SizesProblem(Status.SIZES_NOT_INTEGERS, i, 0, _describe_value(v))
                try:
                    values.append(operator.index(v))
                except Exception:
                    return _SizesProblem(Status.SIZES_NOT_INTEGERS, i, 0, _describe_value(v))
    except Exception as err:  # a Sequence whose iteration raises, a tensor on a dead device
        return _SizesProblem(Status.SIZES_NOT_INTEGERS, -1, 0, f"{type(err).__name__} reading it")
    for i, n in enumerate(values):
        if n < 0:
            return _SizesProblem(Status.SIZES_NEGATIVE, i, _saturate(n))
    return tuple(values)


def normalize_sizes(sizes: object) -> tuple[int, ...]:
    """Caller ``sizes`` (a sequence of ints or a 1-d integer tensor) as a tuple.

    Raises ``SizesTypeError`` for non-integers and ``SizesError`` for negative entries
    or a tensor that is not 1-d. Length is checked by the caller, who knows ``W``.
    """
    parsed = _parse_sizes(sizes)
    if isinstance(parsed, _SizesProblem):
        rec = _problem_record(parsed)
        raise STATUS_ERRORS[parsed.status](_problem_text(rec, rank=None, transports=()))
    return parsed


def _problem_record(p: _SizesProblem) -> MetadataRecord:
    return MetadataRecord(
        p.status, p.a, p.b, p.text, 0, 0, 0, -1, 0, 0, False, 0, -1, -1, -1, -1, ()
    )


# --- building the local record -----------------------------------------------------


def _code_of(value: str, table: Sequence[str]) -> int:
    return table.index(value) if value in table else -1


def parse_timeout(timeout: object) -> timedelta | None:
    """``timeout=`` as a positive ``timedelta`` (``None`` stays ``None``).

    Accepts seconds (int or float) or a ``timedelta`` from 1 ms (gloo's resolution: a
    shorter one would expire at once) to 1e9 s; ``ArgumentError`` otherwise.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        try:
            seconds = float(timeout)
        except OverflowError:
            seconds = math.inf
    else:
        raise ArgumentError(
            "timeout must be None, a number of seconds or a datetime.timedelta, got "
            f"{_describe_value(timeout)}"
        )
    if not (math.isfinite(seconds) and _MIN_TIMEOUT_S <= seconds <= _MAX_TIMEOUT_S):
        raise ArgumentError(
            f"timeout must be a duration from {_MIN_TIMEOUT_S:g} s to {_MAX_TIMEOUT_S:g} s, "
            f"got {_describe_value(timeout)}"
        )
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)


def local_record(
    x: object,
    dim: object,
    *,
    sizes: object,
    contract: object,
    transport: object,
    transports: Sequence[str],
    info: GroupInfo,
    validate: object = True,
    timeout: object = None,
) -> MetadataRecord:
    """Encode this rank's call, recording (never raising) whatever is wrong with it."""
    status, detail_a, detail_b, text = Status.OK, 0, 0, ""

    def fail(s: Status, a: int = 0, b: int = 0, t: str = "") -> None:
        nonlocal status, detail_a, detail_b, text
        if status is Status.OK:  # keep the first problem found
            status, detail_a, detail_b, text = s, _saturate(a), _saturate(b), t

    shape: tuple[int, ...] = ()
    dtype_code = 0
    requires_grad = False
    device_code = 0
    usable = False  # a strided tensor whose shape can be read
    if not isinstance(x, torch.Tensor):
        fail(Status.NOT_TENSOR, t=type(x).__name__)
    else:
        try:
            if x.is_nested or x.layout != torch.strided:
                fail(Status.UNSUPPORTED_LAYOUT, t="nested" if x.is_nested else str(x.layout))
            else:
                shape = tuple(int(n) for n in x.shape)
                dtype_code = _DTYPES.index(x.dtype) + 1 if x.dtype in _DTYPES else 0
                requires_grad = x.requires_grad and torch.is_grad_enabled()
                device_code = _code_of(x.device.type, _DEVICE_TYPES)
                usable = True
        except Exception as err:  # an exotic tensor subclass whose metadata cannot be read
            shape, usable = (), False
            fail(Status.UNSUPPORTED_LAYOUT, t=f"{type(x).__name__} ({type(err).__name__})")
    ndim = len(shape)

    contract_code = _code_of(contract, CONTRACTS) if isinstance(contract, str) else -1
    if contract_code < 0:
        fail(Status.BAD_CONTRACT, t=repr(contract)[:64])
    transport_code = _code_of(transport, transports) if isinstance(transport, str) else -1
    if transport_code < 0:
        fail(Status.BAD_TRANSPORT, t=repr(transport)[:64])
    elif info.communicates and unsupported_reason(transports[transport_code], info.backend):
        fail(Status.TRANSPORT_UNSUPPORTED, transport_code, t=info.backend[:64])
    if not isinstance(validate, bool):
        fail(Status.BAD_VALIDATE, t=_describe_value(validate))
    try:
        parse_timeout(timeout)
    except Exception:  # ArgumentError, or anything an exotic number type raises
        fail(Status.BAD_TIMEOUT, t=_describe_value(timeout))
    else:
        if timeout is not None and info.communicates and not per_call_timeout_supported(info):
            fail(Status.TIMEOUT_UNSUPPORTED, t=info.backend[:64])

    if usable and ndim == 0:
        fail(Status.ZERO_DIM)
    elif ndim > MAX_NDIM:
        fail(Status.TOO_MANY_DIMS, ndim)
    if isinstance(x, torch.Tensor) and usable:
        dtype_name = str(x.dtype).removeprefix("torch.")
        if dtype_code == 0 or (info.backend == "gloo" and x.dtype not in GLOO_DTYPES):
            fail(Status.UNSUPPORTED_DTYPE, t=dtype_name)
        carried = _BACKEND_DEVICES.get(info.backend)
        if info.communicates and carried is not None and x.device.type not in carried:
            fail(Status.UNSUPPORTED_DEVICE, t=x.device.type)

    raw_dim = 0
    normalized_dim = -1
    dim_int: int | None = None
    if not isinstance(dim, bool):
        try:
            dim_int = operator.index(dim)  # type: ignore[arg-type]  # any __index__ type; failure handled below
        except Exception:
            dim_int = None
    if dim_int is None:
        fail(Status.DIM_NOT_INT, t=_describe_value(dim))
    else:
        raw_dim = _saturate(dim_int)
        if usable and ndim > 0:
            if -ndim <= dim_int < ndim:
                normalized_dim = dim_int % ndim
            else:
                fail(Status.DIM_OUT_OF_RANGE, dim_int, ndim)

    sizes_len = sizes_own = sizes_sum = sizes_hash_value = -1
    if sizes is not None:
        parsed = _parse_sizes(sizes)
        if isinstance(parsed, _SizesProblem):
            fail(parsed.status, parsed.a, parsed.b, parsed.text)
        else:
            sizes_len, sizes_sum = len(parsed), _saturate(sum(parsed))
            sizes_hash_value = sizes_hash(parsed)
            if len(parsed) != info.world_size:
                fail(Status.SIZES_WRONG_LENGTH, len(parsed), info.world_size)
            else:
                sizes_own = _saturate(parsed[info.rank])
                if normalized_dim >= 0 and parsed[info.rank] != shape[normalized_dim]:
                    fail(Status.SIZES_OWN_ENTRY, parsed[info.rank], shape[normalized_dim])

    return MetadataRecord(
        status=status,
        detail_a=detail_a,
        detail_b=detail_b,
        text=text,
        ndim=ndim,
        dtype_code=dtype_code,
        dim=raw_dim,
        normalized_dim=normalized_dim,
        contract_code=contract_code,
        transport_code=transport_code,
        requires_grad=requires_grad,
        device_code=device_code,
        sizes_len=sizes_len,
        sizes_own=sizes_own,
        sizes_sum=sizes_sum,
        sizes_hash=sizes_hash_value,
        shape=shape[:MAX_NDIM],
    )


# --- the exchange -----------------------------------------------------------------


def exchange_records(record: MetadataRecord, info: GroupInfo) -> list[MetadataRecord]:
    """All ranks' records, in group-rank order: one equal-size all_gather.

    In a world of one rank (or without torch.distributed) nothing is sent. The
    records travel on ``info.default_device()``: the CPU except on NCCL.
    """
    if not info.communicates:
        return [record]
    device = info.default_device()
    local = torch.tensor(encode_record(record), dtype=torch.int64, device=device)
    gathered = torch.empty(info.world_size * RECORD_LENGTH, dtype=torch.int64, device=device)
    all_gather_equal(gathered, local, info, what="all_gather (metadata exchange)")
    rows = gathered.view(info.world_size, RECORD_LENGTH).tolist()  # the one host sync
    return [decode_record(row, rank=r) for r, row in enumerate(rows)]


def _exchange_passed_sizes(
    passed: Sequence[int] | None, info: GroupInfo
) -> list[tuple[int, list[int]]]:
    """Every rank's passed sizes (length, first ``SIZES_SHOWN`` entries); -1: none.

    Only on the error path, after every rank has found the same sizes mismatch.
    """
    shown = min(info.world_size, SIZES_SHOWN)
    row = [-1] * (1 + shown)
    if passed is not None:
        row[0] = len(passed)
        for i, n in enumerate(passed[:shown]):
            row[1 + i] = _saturate(n)
    device = info.default_device()
    local = torch.tensor(row, dtype=torch.int64, device=device)
    gathered = torch.empty(info.world_size * (1 + shown), dtype=torch.int64, device=device)
    all_gather_equal(gathered, local, info, what="all_gather (sizes of a mismatch message)")
    rows = gathered.view(info.world_size, 1 + shown).tolist()
    return [(int(r[0]), [int(v) for v in r[1 : 1 + max(0, min(int(r[0]), shown))]]) for r in rows]


# --- validation -------------------------------------------------------------------


def _problem_text(rec: MetadataRecord, *, rank: int | None, transports: Sequence[str]) -> str:
    s, a, b, t = rec.status, rec.detail_a, rec.detail_b, rec.text
    at = f"sizes[{a}]" if a >= 0 else "sizes"
    messages: dict[Status, Callable[[], str]] = {
        Status.NOT_TENSOR: lambda: f"expected a torch.Tensor, got {t}",
        Status.ZERO_DIM: lambda: "expected a tensor with at least 1 dimension, got a 0-d tensor",
        Status.TOO_MANY_DIMS: lambda: f"expected at most {MAX_NDIM} dimensions, got {a}",
        Status.DIM_NOT_INT: lambda: f"expected dim to be an int, got {t}",
        Status.DIM_OUT_OF_RANGE: lambda: (
            f"dim={_show_int(a)} is out of range: expected -{b} <= dim < {b} for a {b}-d tensor"
        ),
        Status.UNSUPPORTED_DTYPE: lambda: (
            f"dtype {t} cannot be gathered on this backend: expected one of "
            + ", ".join(sorted(str(d).removeprefix("torch.") for d in GLOO_DTYPES))
        ),
        Status.SIZES_NOT_INTEGERS: lambda: f"sizes must hold integers, got {at} = {t}",
        Status.SIZES_NOT_1D: lambda: f"sizes must be a 1-d integer tensor, got {t}",
        Status.SIZES_WRONG_LENGTH: lambda: f"expected len(sizes) == world size {b}, got {a}",
        Status.SIZES_NEGATIVE: lambda: f"sizes must be >= 0, got sizes[{a}] = {_show_int(b)}",
        Status.SIZES_OWN_ENTRY: lambda: (
            f"expected sizes[{rank}] == {b} (its tensor's size along dim "
            f"{rec.normalized_dim}), got sizes[{rank}] = {_show_int(a)}"
        ),
        Status.BAD_CONTRACT: lambda: (
            f"grad must be one of {', '.join(map(repr, CONTRACTS))}, got {t}"
        ),
        Status.BAD_TRANSPORT: lambda: (
            f"transport must be one of {', '.join(map(repr, transports))}, got {t}"
        ),
        Status.UNSUPPORTED_LAYOUT: lambda: (
            f"expected a dense (torch.strided) tensor, got a {t} tensor"
        ),
        Status.UNSUPPORTED_DEVICE: lambda: (
            f"expected a tensor on a device this backend carries, got a {t} tensor"
        ),
        Status.BAD_VALIDATE: lambda: f"validate must be a bool, got {t}",
        Status.BAD_TIMEOUT: lambda: (
            f"timeout must be None, or a number of seconds or a timedelta from "
            f"{_MIN_TIMEOUT_S:g} s to {_MAX_TIMEOUT_S:g} s, got {t}"
        ),
        Status.TRANSPORT_UNSUPPORTED: lambda: (
            unsupported_reason(transports[a], t) or f"transport unavailable on backend {t}"
            if 0 <= a < len(transports)
            else f"a transport unavailable on backend {t}"
        ),
        Status.TIMEOUT_UNSUPPORTED: lambda: (
            f"a per-call timeout needs a backend whose timeout torch can read and set, "
            f"got backend {t} (use the group's timeout: timeout=None)"
        ),
    }
    text = messages[s]()
    return text if rank is None else f"rank {rank}: {text}"


def _disagreement(
    what: str, values: Sequence[object], show: Callable[[object], str] = repr
) -> tuple[str, list[int]] | None:
    """``None`` when every rank agrees, else (a message, the ranks it blames).

    When one value is held by more ranks than any other, it is the expected one and
    the other ranks are blamed; on a tie (two ranks, for one) every rank is named.
    """
    counts = Counter(values)
    if len(counts) == 1:
        return None
    ranked = counts.most_common()
    by_value: dict[object, list[int]] = {}
    for r, v in enumerate(values):
        by_value.setdefault(v, []).append(r)
    if ranked[0][1] > ranked[1][1]:
        expected = ranked[0][0]
        odd = [r for r, v in enumerate(values) if v != expected]
        got = "; ".join(
            f"{show(v)} on rank(s) {ranks}" for v, ranks in by_value.items() if v != expected
        )
        return (
            f"{what} differs across ranks: expected {show(expected)} (as on rank(s) "
            f"{by_value[expected]}), got {got}",
            odd,
        )
    got = "; ".join(f"{show(v)} on rank(s) {ranks}" for v, ranks in by_value.items())
    return (
        f"{what} differs across ranks: expected one value on every rank, got {got}",
        list(range(len(values))),
    )


def _impossible(rec: MetadataRecord, n_transports: int) -> str | None:
    """What makes a status-OK record one ``local_record`` cannot produce, if anything."""
    if not 1 <= rec.ndim <= MAX_NDIM or len(rec.shape) != rec.ndim:
        return f"ndim={rec.ndim}"
    if any(n < 0 for n in rec.shape):
        return f"shape={rec.shape}"
    if not 0 <= rec.normalized_dim < rec.ndim:
        return f"normalized_dim={rec.normalized_dim}"
    if not 0 < rec.dtype_code <= len(_DTYPES):
        return f"dtype_code={rec.dtype_code}"
    if not 0 <= rec.contract_code < len(CONTRACTS):
        return f"contract_code={rec.contract_code}"
    if not 0 <= rec.transport_code < n_transports:
        return f"transport_code={rec.transport_code}"
    if not -1 <= rec.device_code < len(_DEVICE_TYPES):
        return f"device_code={rec.device_code}"
    return None


def validate_records(
    records: Sequence[MetadataRecord], *, rank: int, transports: Sequence[str]
) -> Layout:
    """The gather's ``Layout``, or the error every rank raises identically.

    A pure function of ``records`` (``rank`` only picks this rank's view of the
    layout): every rank reaches the same verdict, class and message.
    """
    world = len(records)
    bad = [(r, rec) for r, rec in enumerate(records) if rec.status is not Status.OK]
    if bad:
        first = bad[0][1]
        details = "; ".join(_problem_text(rec, rank=r, transports=transports) for r, rec in bad)
        raise STATUS_ERRORS[first.status](
            f"all_gather_v: invalid arguments on rank(s) {[r for r, _ in bad]}: {details}",
            ranks=[r for r, _ in bad],
        )

    for r, rec in enumerate(records):
        problem = _impossible(rec, len(transports))
        if problem is not None:
            raise ProtocolMismatchError(
                f"all_gather_v: rank {r} sent a record vargather cannot have produced "
                f"({problem}): expected a record of this vargather version (another "
                "version, or another collective issued on this group?)",
                ranks=[r],
            )

    def dtype_name(c: object) -> str:
        return str(_DTYPES[c - 1]) if isinstance(c, int) and 0 < c <= len(_DTYPES) else repr(c)

    def device_name(c: object) -> str:
        if isinstance(c, int) and 0 <= c < len(_DEVICE_TYPES):
            return repr(_DEVICE_TYPES[c])
        return "another device type"

    checks: list[tuple[type[VarGatherError], Callable[[], tuple[str, list[int]] | None]]] = [
        (
            ArgumentMismatchError,
            lambda: _disagreement(
                "gradient contract (grad=)",
                [rec.contract_code for rec in records],
                lambda c: repr(CONTRACTS[c]) if isinstance(c, int) else repr(c),
            ),
        ),
        (
            ArgumentMismatchError,
            lambda: _disagreement(
                "transport",
                [rec.transport_code for rec in records],
                lambda c: repr(transports[c]) if isinstance(c, int) else repr(c),
            ),
        ),
        (
            ArgumentMismatchError,
            lambda: _disagreement("device type", [rec.device_code for rec in records], device_name),
        ),
        (ShapeMismatchError, lambda: _disagreement("ndim", [rec.ndim for rec in records])),
        (
            ArgumentMismatchError,
            lambda: _disagreement(
                "gather dimension (dim, normalized)",
                [rec.normalized_dim for rec in records],
            ),
        ),
        (
            DTypeMismatchError,
            lambda: _disagreement("dtype", [rec.dtype_code for rec in records], dtype_name),
        ),
        (
            ShapeMismatchError,
            lambda: _disagreement(
                "shape outside the gather dimension",
                [rec.other_dims for rec in records],
                lambda s: str(tuple(s)) if isinstance(s, tuple) else repr(s),
            ),
        ),
    ]
    for error, check in checks:
        found = check()
        if found is not None:
            message, blamed = found
            raise error(f"all_gather_v: {message}", ranks=blamed)

    true_sizes = tuple(rec.size_along_dim for rec in records)
    true_hash = sizes_hash(true_sizes)
    liars = [
        r
        for r, rec in enumerate(records)
        if rec.sizes_passed and (rec.sizes_len != world or rec.sizes_hash != true_hash)
    ]
    if liars:
        got = "; ".join(
            f"rank {r}: len {records[r].sizes_len}, sum {_show_int(records[r].sizes_sum)}, "
            f"entry for itself {_show_int(records[r].sizes_own)}"
            for r in liars
        )
        raise SizesMismatchError(
            f"all_gather_v: sizes passed on rank(s) {liars} contradict the tensors: "
            f"expected sizes {list(true_sizes)} (the tensors' sizes along dim "
            f"{records[0].normalized_dim}), got {got}",
            ranks=liars,
        )

    contract = CONTRACTS[records[0].contract_code]
    if contract != "local":
        found = _disagreement(
            f"requires_grad (the backward of grad={contract!r} is a collective: every rank "
            "must take part)",
            [rec.requires_grad for rec in records],
        )
        if found is not None:
            raise RequiresGradMismatchError(f"all_gather_v: {found[0]}", ranks=found[1])

    return build_layout(records[rank], true_sizes, rank=rank)


def plan_layout(
    record: MetadataRecord, sizes: object, info: GroupInfo, transports: Sequence[str]
) -> Layout:
    """Exchange the records and validate them: the ``Layout`` or the common error.

    On a sizes mismatch every rank takes one more small all_gather (of the sizes each
    rank passed), so that the message shows what the lying ranks passed.
    """
    records = exchange_records(record, info)
    try:
        return validate_records(records, rank=info.rank, transports=transports)
    except SizesMismatchError as err:
        if not info.communicates:
            raise
        true_sizes = [rec.size_along_dim for rec in records]
        parsed = _parse_sizes(sizes) if sizes is not None else None
        passed = parsed if isinstance(parsed, tuple) else None
        rows = _exchange_passed_sizes(passed, info)
        got = "; ".join(
            f"rank {r} passed sizes={rows[r][1]}"
            + (f" + {rows[r][0] - len(rows[r][1])} more" if rows[r][0] > len(rows[r][1]) else "")
            for r in err.ranks
        )
        raise SizesMismatchError(
            f"all_gather_v: sizes passed on rank(s) {list(err.ranks)} contradict the tensors: "
            f"expected sizes={true_sizes} (the tensors' sizes along dim "
            f"{records[0].normalized_dim}), got {got}",
            ranks=err.ranks,
        ) from None


def build_layout(record: MetadataRecord, sizes: Sequence[int], *, rank: int) -> Layout:
    """The ``Layout`` for a validated record and the true sizes."""
    d = record.normalized_dim
    dtype = record.dtype
    assert dtype is not None  # validated: status OK implies a known dtype
    return Layout(
        sizes=tuple(sizes),
        dim=d,
        leading_shape=record.shape[:d],
        trailing_shape=record.shape[d + 1 :],
        dtype=dtype,
        rank=rank,
        world_size=len(sizes),
    )


def trusted_layout(
    record: MetadataRecord, sizes: object, info: GroupInfo, transports: Sequence[str]
) -> Layout:
    """``validate=False`` with caller ``sizes``: local checks only, raised locally."""
    if record.status is not Status.OK:
        raise STATUS_ERRORS[record.status](
            "all_gather_v (validate=False: raised on this rank only; its peers wait in "
            "the payload collective until they time out): "
            + _problem_text(record, rank=info.rank, transports=transports),
            ranks=[info.rank],
        )
    return build_layout(record, normalize_sizes(sizes), rank=info.rank)

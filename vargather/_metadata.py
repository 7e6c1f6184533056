"""Stage 1: the size/metadata exchange and all validation.

Pipeline: **metadata exchange** -> padding -> transport -> compaction -> autograd.

Each rank encodes what it was called with (is it a tensor, ndim, dtype, full shape,
``dim``, the gradient contract, the transport, caller-passed ``sizes``, and any
problem found locally) into one fixed-length int64 vector, ``MetadataRecord``. One
equal-size all_gather gives every rank the ``W x RECORD_LENGTH`` matrix of all
records. ``validate_records`` then decides from that matrix alone, so every rank
reaches the same verdict: either the same ``VarGatherError`` with the same message on
every rank, before any payload moves, or the same ``Layout``.

What is checked, when the exchange runs (the default, ``validate=True``):
  * locally, then reported on every rank: input is a tensor, ndim >= 1 and at most
    ``MAX_NDIM``, ``dim`` an int in range, a dtype the backend carries, ``grad`` and
    ``transport`` known, caller ``sizes`` well-formed (integers, ``>= 0``, length ``W``,
    own entry equal to the local size);
  * across ranks: the same ``grad``, ``transport``, normalized ``dim``, device type,
    ndim, dtype and non-gathered dimensions; every rank's passed ``sizes`` equal to the
    true sizes (compared through their length, sum, own entry and a 61-bit hash); the
    same ``requires_grad`` under the communicating contracts ``sum`` and ``mean``.

With ``sizes`` passed and ``validate=False`` the exchange is skipped (one collective
less). Then only the local checks run, and a failing one raises **on that rank
only**: its peers cannot know and wait in the payload collective until the group's
timeout. Everything cross-rank is trusted: different dtypes or shapes are then the
backend's business (gloo may abort the process or reinterpret bits, see FACTS).
``validate`` itself must be the same on every rank.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import torch

from ._comm import GroupInfo, all_gather_equal
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

__all__ = [
    "CONTRACTS",
    "GLOO_DTYPES",
    "MAX_NDIM",
    "RECORD_LENGTH",
    "MetadataRecord",
    "Status",
    "build_layout",
    "decode_record",
    "encode_record",
    "exchange_records",
    "local_record",
    "normalize_sizes",
    "trusted_layout",
    "validate_records",
]

MAGIC: Final = 0x76617267  # "varg"
PROTOCOL_VERSION: Final = 1
MAX_NDIM: Final = 32
TEXT_WORDS: Final = 4  # 32 ASCII bytes of detail text (a type or dtype name)

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
"""Dtypes the gloo backend carries (measured on torch 2.13)."""

_DEVICE_TYPES: Final = ("cpu", "cuda", "xpu", "mps", "meta", "hpu", "privateuseone")


class Status(IntEnum):
    """What a rank found wrong with its own arguments (0 = nothing)."""

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


_STATUS_ERROR: Final[dict[Status, type[VarGatherError]]] = {
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
}


@dataclass(frozen=True)
class MetadataRecord:
    """One rank's call, as every other rank will see it.

    ``detail_a``/``detail_b`` and ``text`` carry what the error message needs for a
    non-OK ``status`` (an offending value, a type name). Sizes fields are -1 when no
    ``sizes`` were passed.
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
        return _DTYPES[self.dtype_code - 1] if self.dtype_code > 0 else None

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
    """The record as ``RECORD_LENGTH`` int64 values."""
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
    return values + _encode_text(record.text) + shape


def decode_record(values: Sequence[int], *, rank: int) -> MetadataRecord:
    """Inverse of ``encode_record``; ``ProtocolMismatchError`` on a foreign vector."""
    if len(values) != RECORD_LENGTH or values[0] != MAGIC or values[1] != PROTOCOL_VERSION:
        got = list(values[:2]) if len(values) >= 2 else list(values)
        raise ProtocolMismatchError(
            f"rank {rank} sent metadata vargather cannot read: expected magic {MAGIC:#x} "
            f"and protocol version {PROTOCOL_VERSION} in {RECORD_LENGTH} values, got "
            f"{got} in {len(values)} values (another vargather version, or another "
            "collective issued on this group?)"
        )
    f = dict(zip(_FIELDS, values, strict=False))
    ndim = int(f["ndim"])
    try:
        status = Status(int(f["status"]))
    except ValueError:
        raise ProtocolMismatchError(
            f"rank {rank} sent an unknown status code {f['status']}"
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


def normalize_sizes(sizes: object) -> tuple[int, ...]:
    """Caller ``sizes`` (a sequence of ints or a 1-d integer tensor) as a tuple.

    Raises ``SizesTypeError`` for non-integers and ``SizesError`` for negative entries
    or a tensor that is not 1-d. Length is checked by the caller, who knows ``W``.
    """
    if isinstance(sizes, torch.Tensor):
        if sizes.is_floating_point() or sizes.is_complex() or sizes.dtype == torch.bool:
            raise SizesTypeError(f"sizes must hold integers, got a tensor of dtype {sizes.dtype}")
        if sizes.ndim != 1:
            raise SizesError(f"sizes must be 1-d, got a tensor of shape {tuple(sizes.shape)}")
        values = [int(v) for v in sizes.tolist()]
    elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise SizesTypeError(
            f"sizes must be a sequence of ints or a 1-d integer tensor, got {type(sizes).__name__}"
        )
    else:
        values = []
        for i, v in enumerate(sizes):
            if isinstance(v, bool) or (isinstance(v, torch.Tensor) and v.is_floating_point()):
                raise SizesTypeError(f"sizes[{i}] must be an int, got {v!r}")
            try:
                values.append(operator.index(v))
            except TypeError:
                raise SizesTypeError(
                    f"sizes[{i}] must be an int, got {type(v).__name__} {v!r}"
                ) from None
    for i, n in enumerate(values):
        if n < 0:
            raise SizesError(f"sizes[{i}] must be >= 0, got {n}")
    return tuple(values)


# --- building the local record -----------------------------------------------------


def _code_of(value: str, table: Sequence[str]) -> int:
    return table.index(value) if value in table else -1


def local_record(
    x: object,
    dim: object,
    *,
    sizes: object,
    contract: object,
    transport: object,
    transports: Sequence[str],
    info: GroupInfo,
) -> MetadataRecord:
    """Encode this rank's call, recording (not raising) whatever is wrong with it."""
    status, detail_a, detail_b, text = Status.OK, 0, 0, ""

    def fail(s: Status, a: int = 0, b: int = 0, t: str = "") -> None:
        nonlocal status, detail_a, detail_b, text
        if status is Status.OK:  # keep the first problem found
            status, detail_a, detail_b, text = s, a, b, t

    is_tensor = isinstance(x, torch.Tensor)
    shape: tuple[int, ...] = tuple(x.shape) if isinstance(x, torch.Tensor) else ()
    ndim = len(shape)
    dtype_code = 0
    requires_grad = False
    device_code = 0
    if isinstance(x, torch.Tensor):
        dtype_code = _DTYPES.index(x.dtype) + 1 if x.dtype in _DTYPES else 0
        requires_grad = x.requires_grad and torch.is_grad_enabled()
        device_code = _code_of(x.device.type, _DEVICE_TYPES)
    else:
        fail(Status.NOT_TENSOR, t=type(x).__name__)

    contract_code = _code_of(contract, CONTRACTS) if isinstance(contract, str) else -1
    if contract_code < 0:
        fail(Status.BAD_CONTRACT, t=repr(contract)[:32])
    transport_code = _code_of(transport, transports) if isinstance(transport, str) else -1
    if transport_code < 0:
        fail(Status.BAD_TRANSPORT, t=repr(transport)[:32])

    if is_tensor and ndim == 0:
        fail(Status.ZERO_DIM)
    elif ndim > MAX_NDIM:
        fail(Status.TOO_MANY_DIMS, ndim)
    if (is_tensor and dtype_code == 0) or (
        info.backend == "gloo" and isinstance(x, torch.Tensor) and x.dtype not in GLOO_DTYPES
    ):
        fail(Status.UNSUPPORTED_DTYPE, t=str(getattr(x, "dtype", "?")).removeprefix("torch."))

    raw_dim = 0
    normalized_dim = -1
    if isinstance(dim, bool) or not isinstance(dim, int):
        fail(Status.DIM_NOT_INT, t=type(dim).__name__)
    else:
        raw_dim = dim
        if is_tensor and ndim > 0:
            if -ndim <= dim < ndim:
                normalized_dim = dim % ndim
            else:
                fail(Status.DIM_OUT_OF_RANGE, dim, ndim)

    sizes_len = sizes_own = sizes_sum = sizes_hash_value = -1
    if sizes is not None:
        try:
            passed = normalize_sizes(sizes)
        except SizesTypeError:
            fail(Status.SIZES_NOT_INTEGERS, t=type(sizes).__name__)
        except SizesError:
            negative = next((i for i, v in enumerate(_loose_ints(sizes)) if v < 0), -1)
            fail(
                Status.SIZES_NEGATIVE,
                negative,
                _loose_ints(sizes)[negative] if negative >= 0 else 0,
            )
        else:
            sizes_len, sizes_sum, sizes_hash_value = len(passed), sum(passed), sizes_hash(passed)
            if len(passed) != info.world_size:
                fail(Status.SIZES_WRONG_LENGTH, len(passed), info.world_size)
            else:
                sizes_own = passed[info.rank]
                if normalized_dim >= 0 and passed[info.rank] != shape[normalized_dim]:
                    fail(Status.SIZES_OWN_ENTRY, passed[info.rank], shape[normalized_dim])

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


def _loose_ints(sizes: object) -> list[int]:
    """Best-effort integer view of malformed sizes, for error details only."""
    if isinstance(sizes, torch.Tensor):
        return [int(v) for v in sizes.flatten().tolist()]
    if isinstance(sizes, Sequence):
        out: list[int] = []
        for v in sizes:
            try:
                out.append(int(v))
            except (TypeError, ValueError):
                out.append(0)
        return out
    return []


# --- the exchange -----------------------------------------------------------------


def exchange_records(record: MetadataRecord, info: GroupInfo) -> list[MetadataRecord]:
    """All ranks' records, in group-rank order: one equal-size all_gather.

    In a world of one rank (or without torch.distributed) nothing is sent.
    """
    if not info.communicates:
        return [record]
    device = info.default_device()
    local = torch.tensor(encode_record(record), dtype=torch.int64, device=device)
    gathered = torch.empty(info.world_size * RECORD_LENGTH, dtype=torch.int64, device=device)
    all_gather_equal(gathered, local, info)
    rows = gathered.view(info.world_size, RECORD_LENGTH).tolist()  # the one host sync
    return [decode_record(row, rank=r) for r, row in enumerate(rows)]


# --- validation -------------------------------------------------------------------


def _describe_local_problem(rank: int, rec: MetadataRecord, transports: Sequence[str]) -> str:
    s, a, b, t = rec.status, rec.detail_a, rec.detail_b, rec.text
    messages: dict[Status, Callable[[], str]] = {
        Status.NOT_TENSOR: lambda: f"expected a torch.Tensor, got {t}",
        Status.ZERO_DIM: lambda: "expected a tensor with at least 1 dimension, got a 0-d tensor",
        Status.TOO_MANY_DIMS: lambda: f"expected at most {MAX_NDIM} dimensions, got {a}",
        Status.DIM_NOT_INT: lambda: f"expected dim to be an int, got {t}",
        Status.DIM_OUT_OF_RANGE: lambda: (
            f"dim={a} is out of range: expected -{b} <= dim < {b} for a {b}-d tensor"
        ),
        Status.UNSUPPORTED_DTYPE: lambda: (
            f"dtype {t} cannot be gathered on this backend: expected one of "
            + ", ".join(sorted(str(d).removeprefix("torch.") for d in GLOO_DTYPES))
        ),
        Status.SIZES_NOT_INTEGERS: lambda: f"sizes must hold integers, got {t}",
        Status.SIZES_WRONG_LENGTH: lambda: f"expected len(sizes) == world size {b}, got {a}",
        Status.SIZES_NEGATIVE: lambda: f"sizes must be >= 0, got sizes[{a}] = {b}",
        Status.SIZES_OWN_ENTRY: lambda: (
            f"sizes[{rank}] = {a} but its tensor has {b} along dim {rec.normalized_dim}"
        ),
        Status.BAD_CONTRACT: lambda: f"grad must be one of {', '.join(CONTRACTS)}, got {t}",
        Status.BAD_TRANSPORT: lambda: f"transport must be one of {', '.join(transports)}, got {t}",
    }
    return f"rank {rank}: {messages[s]()}"


def _majority(values: Sequence[object]) -> object:
    """The value most ranks hold; ties go to the lowest rank's value."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def _disagreement(
    what: str, values: Sequence[object], show: Callable[[object], str] = repr
) -> str | None:
    """``None`` when every rank agrees, else a message naming the odd ranks."""
    expected = _majority(values)
    odd = [r for r, v in enumerate(values) if v != expected]
    if not odd:
        return None
    agree = [r for r, v in enumerate(values) if v == expected]
    got = "; ".join(f"rank {r}: {show(values[r])}" for r in odd)
    return (
        f"{what} differs across ranks: expected {show(expected)} (as on rank(s) {agree}), got {got}"
    )


def validate_records(
    records: Sequence[MetadataRecord], *, rank: int, transports: Sequence[str]
) -> Layout:
    """The gather's ``Layout``, or the error every rank raises identically."""
    world = len(records)
    bad = [(r, rec) for r, rec in enumerate(records) if rec.status is not Status.OK]
    if bad:
        first = bad[0][1]
        details = "; ".join(_describe_local_problem(r, rec, transports) for r, rec in bad)
        raise _STATUS_ERROR[first.status](
            f"all_gather_v: invalid arguments on rank(s) {[r for r, _ in bad]}: {details}"
        )

    checks: list[tuple[type[VarGatherError], str | None]] = [
        (
            ArgumentMismatchError,
            _disagreement(
                "gradient contract (grad=)",
                [rec.contract_code for rec in records],
                lambda c: repr(CONTRACTS[c]) if isinstance(c, int) else repr(c),
            ),
        ),
        (
            ArgumentMismatchError,
            _disagreement(
                "transport",
                [rec.transport_code for rec in records],
                lambda c: repr(transports[c]) if isinstance(c, int) else repr(c),
            ),
        ),
        (
            ArgumentMismatchError,
            _disagreement(
                "device type",
                [rec.device_code for rec in records],
                lambda c: repr(_DEVICE_TYPES[c]) if isinstance(c, int) and c >= 0 else "other",
            ),
        ),
        (ShapeMismatchError, _disagreement("ndim", [rec.ndim for rec in records])),
        (
            ArgumentMismatchError,
            _disagreement(
                "gather dimension (dim, normalized)",
                [rec.normalized_dim for rec in records],
            ),
        ),
        (
            DTypeMismatchError,
            _disagreement(
                "dtype",
                [rec.dtype_code for rec in records],
                lambda c: str(_DTYPES[c - 1]) if isinstance(c, int) else repr(c),
            ),
        ),
        (
            ShapeMismatchError,
            _disagreement(
                "shape outside the gather dimension",
                [rec.other_dims for rec in records],
                lambda s: str(tuple(s)) if isinstance(s, tuple) else repr(s),
            ),
        ),
    ]
    for error, message in checks:
        if message is not None:
            raise error(f"all_gather_v: {message}")

    true_sizes = tuple(rec.size_along_dim for rec in records)
    true_hash = sizes_hash(true_sizes)
    liars = [
        r
        for r, rec in enumerate(records)
        if rec.sizes_passed and (rec.sizes_len != world or rec.sizes_hash != true_hash)
    ]
    if liars:
        got = "; ".join(
            f"rank {r}: len {records[r].sizes_len}, sum {records[r].sizes_sum}, "
            f"entry for itself {records[r].sizes_own}"
            for r in liars
        )
        raise SizesMismatchError(
            f"all_gather_v: sizes passed on rank(s) {liars} contradict the tensors: "
            f"expected sizes {list(true_sizes)} (len {world}, sum {sum(true_sizes)}), got {got}"
        )

    contract = CONTRACTS[records[0].contract_code]
    if contract != "local":
        message = _disagreement(
            f"requires_grad (the backward of grad={contract!r} is a collective: every rank "
            "must take part)",
            [rec.requires_grad for rec in records],
        )
        if message is not None:
            raise RequiresGradMismatchError(f"all_gather_v: {message}")

    return build_layout(records[rank], true_sizes, rank=rank)


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
        raise _STATUS_ERROR[record.status](
            "all_gather_v (validate=False, raised on this rank only; peers will time out): "
            + _describe_local_problem(info.rank, record, transports)
        )
    return build_layout(record, normalize_sizes(sizes), rank=info.rank)

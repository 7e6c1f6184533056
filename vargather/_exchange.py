"""Stage 3: the exchange and cross-rank validation, from records to a ``Layout``.

Where it sits: between the wire format (``_wire``) and the transports; both rounds
validate with its helpers. One equal-size all_gather gives every rank the ``W x
RECORD_LENGTH`` matrix of all records (``exchange_records``); ``validate_records``
decides from that matrix alone, so every rank raises the same ``VarGatherError`` with
the same message before any payload moves, or returns the same ``Layout``: every
rank's local problem (``_args``), then across ranks the same ``grad``, ``transport``,
normalized ``dim``, device type, ndim, dtype and non-gathered dimensions, every passed
``sizes`` equal to the true sizes (by length and a 61-bit hash; on a mismatch one more
small all_gather of the passed lists makes the message show them) and the same
``requires_grad`` under ``sum`` and ``mean``. With ``sizes`` passed and
``validate=False`` the exchange is skipped (``trusted_layout``): local checks only,
raised on that rank only, everything cross-rank trusted (``docs/misuse.md`` has what
goes wrong then).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

import torch

from ._args import MAX_NDIM, CallRecord, CheckedCall, saturate, show_int, sizes_hash
from ._choices import CONTRACTS, DEVICE_TYPES, TRANSPORT_NAMES
from ._collectives import COLLECTIVE_NAMES, name_of_code
from ._comm import all_gather_equal
from ._dtypes import WIRE_DTYPES, dtype_from_code
from ._errors import (
    ArgumentMismatchError,
    DTypeMismatchError,
    ProtocolMismatchError,
    RequiresGradMismatchError,
    ShapeMismatchError,
    SizesMismatchError,
    VarGatherError,
)
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._wire import RECORD_LENGTH, decode_record, encode_record

SIZES_SHOWN: Final = 64  # entries of each rank's passed sizes shown in a mismatch message


def exchange_records(records: Sequence[CallRecord], info: GroupInfo) -> list[list[CallRecord]]:
    """Every rank's records, ``[rank][tensor]`` in group-rank order: one equal-size
    all_gather of ``len(records) * RECORD_LENGTH`` int64 on ``info.default_device()``
    (every rank must pass the same number of records); nothing is sent in a world of
    one rank (or without torch.distributed)."""
    if not info.communicates:
        return [list(records)]
    k = len(records)
    device = info.default_device()
    values = [v for rec in records for v in encode_record(rec)]
    local = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = torch.empty(info.world_size * k * RECORD_LENGTH, dtype=torch.int64, device=device)
    what = (
        "all_gather (metadata exchange)"
        if k == 1
        else "all_gather (metadata exchange, full records)"
    )
    all_gather_equal(gathered, local, info, what=what)
    rows = gathered.view(info.world_size, k, RECORD_LENGTH).tolist()  # the one host sync
    return [[decode_record(row, rank=r) for row in rank_rows] for r, rank_rows in enumerate(rows)]


def _exchange_passed_sizes(
    passed: Sequence[int] | None, info: GroupInfo
) -> list[tuple[int, list[int]]]:
    """Every rank's passed sizes (length, first ``SIZES_SHOWN`` entries; -1: none), on
    the error path only, after every rank has found the same sizes mismatch."""
    shown = min(info.world_size, SIZES_SHOWN)
    row = [-1] if passed is None else [len(passed), *map(saturate, passed[:shown])]
    row += [-1] * (1 + shown - len(row))
    device = info.default_device()
    local = torch.tensor(row, dtype=torch.int64, device=device)
    gathered = torch.empty(info.world_size * (1 + shown), dtype=torch.int64, device=device)
    all_gather_equal(gathered, local, info, what="all_gather (sizes of a mismatch message)")
    rows = gathered.view(info.world_size, 1 + shown).tolist()
    return [(int(r[0]), [int(v) for v in r[1 : 1 + max(0, min(int(r[0]), shown))]]) for r in rows]


def _disagreement(
    what: str, values: Sequence[object], show: Callable[[object], str] = repr
) -> tuple[str, list[int]] | None:
    """``None`` when every rank agrees, else (a message, the ranks it blames): the value
    most ranks hold is the expected one, the others blamed; on a tie, every rank."""
    if not values or all(v == values[0] for v in values):  # the common case, uncounted
        return None
    counts = Counter(values)
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


def check_same_collective(codes: Sequence[int]) -> None:
    """The one check that every rank called the same collective (``codes[r]``: the wire
    code rank r sent): else ``ProtocolMismatchError`` on every rank, naming which rank
    called which. The all_gather-shaped round runs it only on its error path, as calls
    whose compact headers agree gather alike."""
    names = [name_of_code(c) for c in codes]
    found = _disagreement("collective", names)
    if found is not None:
        present = " / ".join(k for k in COLLECTIVE_NAMES if k in names) or "?"
        raise ProtocolMismatchError(
            f"{present}: {found[0]}: call the same collective on every rank of the group",
            ranks=found[1],
        )


def _impossible(rec: CallRecord) -> str | None:
    """What makes a problem-free record one ``check_call`` cannot produce, if anything."""
    if not 1 <= rec.ndim <= MAX_NDIM or len(rec.shape) != rec.ndim:
        return f"ndim={rec.ndim}"
    if any(n < 0 for n in rec.shape):
        return f"shape={rec.shape}"
    if not 0 <= rec.normalized_dim < rec.ndim:
        return f"normalized_dim={rec.normalized_dim}"
    if not 0 < rec.dtype_code <= len(WIRE_DTYPES):
        return f"dtype_code={rec.dtype_code}"
    if not 0 <= rec.contract_code < len(CONTRACTS):
        return f"contract_code={rec.contract_code}"
    if not 0 <= rec.transport_code < len(TRANSPORT_NAMES):
        return f"transport_code={rec.transport_code}"
    if not -1 <= rec.device_code < len(DEVICE_TYPES):
        return f"device_code={rec.device_code}"
    return None


def _name_in(table: Sequence[str]) -> Callable[[object], str]:
    """A wire code as the name it stands for in ``table``, for a disagreement message."""

    def show(code: object) -> str:
        return repr(table[code]) if isinstance(code, int) else repr(code)

    return show


def _dtype_of(code: object) -> str:
    dtype = dtype_from_code(code) if isinstance(code, int) else None
    return repr(code) if dtype is None else str(dtype)


def _device_of(code: object) -> str:
    if isinstance(code, int) and 0 <= code < len(DEVICE_TYPES):
        return repr(DEVICE_TYPES[code])
    return "another device type"


def _shape_of(shape: object, *, marked: int | None = None) -> str:
    """``shape`` as a tuple; with ``marked``, the dims outside the gather dimension
    with ``*`` standing where the gather dimension ``marked`` sits: ``(2, *, 5)``."""
    if not isinstance(shape, tuple):
        return repr(shape)
    if marked is None or not 0 <= marked <= len(shape):
        return str(shape)
    parts = [str(n) for n in shape]
    parts.insert(marked, "*")
    return "(" + ", ".join(parts) + ")"


Check = tuple[type[VarGatherError], str, list[object], Callable[[object], str]]
"""One agreement: the error class, what it is about, every rank's value, how to show one."""


def show_sizes(value: object) -> str:
    """A row's sizes extras ``(n, size_0, ...)`` as an error shows them (``n < 0``: none
    passed; entries the row had no room for counted, not listed)."""
    if not isinstance(value, tuple) or not value or value[0] < 0:
        return "no sizes"
    n, entries = value[0], value[1:]
    shown = list(entries[: min(n, len(entries))])
    return f"sizes={shown}" + (f" + {n - len(shown)} more" if n > len(shown) else "")


def agree(name: str, checks: Sequence[Check], full: Sequence[CallRecord] = ()) -> None:
    """Raise the first disagreement among ``checks``, naming the odd ranks; with ``full``
    (the gather's records), a shape outside the dimension adds every rank's full shape."""
    for error, what, values, show in checks:
        found = _disagreement(what, values, show)
        if found is not None:
            message, blamed = found
            if full and what.startswith("shape outside"):
                shapes = ", ".join(f"rank {r} {_shape_of(rec.shape)}" for r, rec in enumerate(full))
                d = full[0].normalized_dim
                message += f" (* is the gather dimension, dim={d}; full shapes: {shapes})"
            raise error(f"{name}: {message}", ranks=blamed)


def common_checks(
    records: Sequence[CallRecord],
    *,
    dim: bool,
    shape: str | None,
    contract: bool = False,
    gather: bool = False,
) -> list[Check]:
    """The agreements every call needs: (the same ``grad=`` where ``contract``, then
    ``transport=``, for the ``gather``), device type, ndim, (the normalized ``dim``),
    dtype, and the shape: ``"full"`` (every dimension), ``"other"`` (outside ``dim``;
    the gather's marked ``*`` there) or ``None`` (any shape)."""

    def each(field: str) -> list[object]:
        return [getattr(rec, field) for rec in records]

    def outside(other: object) -> str:  # the ranks agree on dim by the time shapes are compared
        return _shape_of(other, marked=records[0].normalized_dim if gather else None)

    checks: list[Check] = []
    if contract or gather:
        grad = "gradient contract (grad=)"
        checks.append((ArgumentMismatchError, grad, each("contract_code"), _name_in(CONTRACTS)))
    if gather:
        checks.append(
            (ArgumentMismatchError, "transport", each("transport_code"), _name_in(TRANSPORT_NAMES))
        )
    checks.append((ArgumentMismatchError, "device type", each("device_code"), _device_of))
    checks.append((ShapeMismatchError, "ndim", each("ndim"), repr))
    if dim:
        what = f"{'gather ' * gather}dimension (dim, normalized)"
        checks.append((ArgumentMismatchError, what, each("normalized_dim"), repr))
    checks.append((DTypeMismatchError, "dtype", each("dtype_code"), _dtype_of))
    if shape == "full":
        checks.append((ShapeMismatchError, "shape", each("shape"), _shape_of))
    elif shape == "other":
        what = f"shape outside the {'gather' if gather else 'split'} dimension"
        checks.append((ShapeMismatchError, what, each("other_dims"), outside))
    return checks


def requires_grad_check(records: Sequence[CallRecord], why: str) -> Check:
    """Every rank needs a gradient, or none: the backward is a collective."""
    what = f"requires_grad ({why}: every rank must take part)"
    return (RequiresGradMismatchError, what, [rec.requires_grad for rec in records], repr)


def raise_local(name: str, records: Sequence[CallRecord]) -> None:
    """Every rank's local problems, raised on every rank (the first one's class)."""
    bad = [(r, rec.problem) for r, rec in enumerate(records) if rec.problem is not None]
    if bad:
        details = "; ".join(f"rank {r}: {problem.message}" for r, problem in bad)
        raise bad[0][1].error(
            f"{name}: invalid arguments on rank(s) {[r for r, _ in bad]}: {details}",
            ranks=[r for r, _ in bad],
        )


def validate_records(records: Sequence[CallRecord], *, rank: int) -> Layout:
    """The gather's ``Layout``, or the error every rank raises identically: a pure
    function of ``records`` (``rank`` only picks this rank's view of the layout)."""
    world = len(records)
    raise_local("all_gather_v", records)

    for r, rec in enumerate(records):
        problem = _impossible(rec)
        if problem is not None:
            raise ProtocolMismatchError(
                f"all_gather_v: rank {r} sent a record vargather cannot have produced "
                f"({problem}): expected a record of this vargather version (another "
                "version, or another collective issued on this group?)",
                ranks=[r],
            )

    agree("all_gather_v", common_checks(records, dim=True, shape="other", gather=True), records)

    true_sizes = tuple(rec.size_along_dim for rec in records)
    true_hash = sizes_hash(true_sizes)
    liars = [
        r
        for r, rec in enumerate(records)
        if rec.sizes_passed and (rec.sizes_len != world or rec.sizes_hash != true_hash)
    ]
    if liars:
        got = "; ".join(
            f"rank {r}: len {records[r].sizes_len}, sum {show_int(records[r].sizes_sum)}, "
            f"entry for itself {show_int(records[r].sizes_own)}"
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
        why = f"the backward of grad={contract!r} is a collective"
        agree("all_gather_v", [requires_grad_check(records, why)])

    return build_layout(records[rank], true_sizes, rank=rank)


def plan_layout(call: CheckedCall, info: GroupInfo) -> Layout:
    """Exchange the records and validate them: the ``Layout`` or the common error (on a
    sizes mismatch with one more small all_gather, so the message shows what was passed)."""
    records = [row[0] for row in exchange_records([call.record], info)]
    try:
        return validate_records(records, rank=info.rank)
    except SizesMismatchError as err:
        if not info.communicates:
            raise
        true_sizes = [rec.size_along_dim for rec in records]
        rows = _exchange_passed_sizes(call.sizes, info)
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


def build_layout(record: CallRecord, sizes: Sequence[int], *, rank: int) -> Layout:
    """The ``Layout`` for a validated record and the true sizes."""
    dtype = record.dtype
    assert dtype is not None  # validated: a problem-free record names a known dtype
    return blocks_layout(record.shape, record.normalized_dim, sizes, dtype, rank, len(sizes))


def trusted_layout(call: CheckedCall, info: GroupInfo) -> Layout:
    """``validate=False`` with caller ``sizes``: local checks only, raised locally."""
    problem = call.record.problem
    if problem is not None:
        raise problem.error(
            "all_gather_v (validate=False: raised on this rank only; its peers wait in "
            f"the payload collective until they time out): rank {info.rank}: {problem.message}",
            ranks=[info.rank],
        )
    assert call.sizes is not None  # passed, and a problem-free record parsed them
    return build_layout(call.record, call.sizes, rank=info.rank)

"""Stages 1-3 for the ragged collective family: local checks, one exchange, validation.

Where it sits: the family's counterpart of ``_args`` + ``_exchange`` for
``reduce_scatter_v`` (``_reduce_scatter``), ``all_to_all_v`` (``_all_to_all``) and
``all_gather_list`` (``_gather_list``). Each of those modules turns this rank's call
into a ``FamilyCall`` here, runs ``exchange`` (the one metadata collective), and
validates the gathered rows with the helpers below; then it moves the payload through
``_comm``/``_transport`` and wraps it in autograd.

A ``FamilyCall`` is a ``CallRecord`` of this rank's tensor (``_args.check_call``'s
checks: the tensor, ``dim``, ``grad``, ``validate``, ``timeout``, the dtype the backend
carries), the first local problem found (the collective's own checks, such as
``sum(sizes) == x.shape[dim]``, appended by its module), and a run of int64
*extras* (the passed size vectors, ``-1`` where absent). The exchange sends
``encode_record(record) + [FAMILY_MAGIC, code] + extras + [flags]`` (``code``: the
collective's wire code, ``_collectives``) (int64, padded
to an even count) and a payload slot of the group's capacity to every rank in one
equal-split all_to_all of bytes: every rank sends the same length, *whichever kind of
the family it called*: the extras are padded with ``-1`` to ``extra_words(W) = 2 * (W
+ 1)`` words for every kind (``all_to_all_v``'s two size vectors; ``reduce_scatter_v``
passes ``W + 1``), and the capacity is the group's one ``FamilyState``, shared by every
kind. Nothing of a slot is read before the rows validated, and every rank decides
from the same matrix: the same error on every rank, or the same answer. A peer
issuing another collective of the family is caught by ``kind``: every rank raises the
same ``ProtocolMismatchError``, naming which rank called which (``_check_kinds``),
and the group's state is unchanged, so the next call of one collective on every rank
works. (A peer in an all_gather-based collective, ``all_gather_list`` or
``all_gather_v``, issues another collective type: that cannot be told apart from a
late peer, and ends in the named timeout; ``docs/misuse.md``.)

**One round for small payloads** (``exchange_fused``, ``settle``). The exchange is an
equal-split all_to_all: rank ``j`` sends every rank the same row, followed by a payload
slot of ``capacity`` bytes (``FamilyState.capacity`` of the group, for every kind, the
same on every rank because every rank updates it from the same validated rows only) holding
the block the payload collective would send that rank, when every block fits and the
rank has no local problem; a flag word of the row says so. After the rows validated
(nothing of a slot is read before), a call whose every rank's slots hold its blocks
is answered from the slots: one collective in all. The state rule (``advance``,
applied after every validated call, from the validated rows only): a call whose every
rank is eligible and whose blocks ride (``rides``: the largest block, ``need`` bytes,
is at most ``FAMILY_FUSED_MAX``, or at most ``FAMILY_STRETCH_MAX`` with the ``W * W``
slots padding the call's ``total`` bytes by at most ``WASTE_LIMIT``:
``W * W * slot(need) <= 1.5 * total``) grows the capacity to ``slot(need)`` when
``4 * need`` exceeds it; any other call is idle, and after ``SHRINK_AFTER`` idle calls in a row the capacity
shrinks to ``bucket`` of the largest eligible small need among them (0 if none).
Every kind advances the one state (a ``reduce_scatter_v`` after an ``all_to_all_v``
uses and moves the same slot). Calls that raise change nothing. Bound: every rank
sends and receives ``W * (8 * len(vector) + capacity)`` bytes, ``len(vector) <=
RECORD_LENGTH + 2 * W + 6`` (the record, magic and kind, ``2 * (W + 1)`` extras, the
flag word, one word of padding), ``capacity <= FAMILY_STRETCH_MAX`` (256 KiB), and
past ``FAMILY_FUSED_MAX`` (64 KiB) the slots of the call that set the capacity pad
its payload by at most ``WASTE_LIMIT`` (50 %); a later call of smaller blocks pays the
larger slots until the capacity shrinks (``SHRINK_AFTER`` calls):
``reduce_scatter_v``'s row is ``8 * (W + 1)`` bytes longer than its own extras need,
the price of one row length for the family.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Final

import torch
import torch.distributed as dist

from ._args import CallRecord, Problem, check_call, parse_sizes, saturate
from ._choices import CONTRACTS, DEVICE_TYPES
from ._collectives import COLLECTIVE_NAMES, COLLECTIVES, CollectiveName, by_code, name_of_code
from ._comm import GroupInfo, all_to_all_uneven
from ._dtypes import dtype_from_code
from ._errors import (
    ArgumentMismatchError,
    DTypeMismatchError,
    ProtocolMismatchError,
    RequiresGradMismatchError,
    ShapeMismatchError,
    SizesError,
    VarGatherError,
)
from ._exchange import _disagreement
from ._fused import bucket, capacity_step, within_waste
from ._group import process_group
from ._wire import RECORD_LENGTH, decode_record, encode_record

__all__ = [
    "FAMILY_FUSED_MAX",
    "FAMILY_MAGIC",
    "FAMILY_STRETCH_MAX",
    "Check",
    "Exchanged",
    "FamilyCall",
    "FamilyState",
    "Row",
    "agree",
    "check_tensor",
    "common_checks",
    "exchange",
    "exchange_fused",
    "extra_words",
    "family_state_of",
    "raise_local",
    "rides",
    "settle",
    "sizes_words",
    "with_problem",
]

FAMILY_MAGIC: Final = 0x76676661  # "vgfa"


@dataclass(frozen=True)
class FamilyCall:
    """One rank's call of a family collective, as every other rank will see it.

    ``sizes``: the parsed size vectors this rank passed (``None`` where absent or
    malformed), for this rank's own use; ``extras`` is what the peers see of them.
    """

    kind: CollectiveName
    record: CallRecord
    extras: tuple[int, ...]
    sizes: tuple[tuple[int, ...] | None, ...]
    timeout: timedelta | None


@dataclass(frozen=True)
class Row:
    """One rank's gathered metadata: its record and its extras."""

    record: CallRecord
    extras: tuple[int, ...]


def check_tensor(
    x: object,
    dim: object,
    *,
    info: GroupInfo,
    grad: object = "sum",
    validate: object = True,
    timeout: object = None,
    requires_grad: bool | None = None,
    split: bool = False,
) -> tuple[CallRecord, timedelta | None]:
    """``_args.check_call``'s record of ``x`` (no ``sizes``, ``transport="auto"``) and
    the parsed per-call timeout. ``requires_grad`` overrides what ``x`` says (the
    custom operators run below autograd and pass the caller's). A 0-d ``x`` is checked
    as its 1-element view and recorded with its own shape ``()``; with ``split`` (a
    collective that splits ``x`` along ``dim`` by sizes) it is a ``SizesError``."""
    scalar = isinstance(x, torch.Tensor) and x.ndim == 0 and x.layout == torch.strided
    probe = x.reshape(1) if isinstance(x, torch.Tensor) and scalar else x
    checked = check_call(
        probe,
        dim,
        sizes=None,
        grad=grad,
        transport="auto",
        info=info,
        validate=validate,
        timeout=timeout,
    )
    record = checked.record
    if scalar:
        record = replace(record, ndim=0, shape=(), normalized_dim=-1, dim=0)
        if isinstance(x, torch.Tensor):
            record = replace(record, requires_grad=x.requires_grad and torch.is_grad_enabled())
    if requires_grad is not None:
        record = replace(record, requires_grad=requires_grad)
    if split and record.ndim == 0:
        record = with_problem(
            record,
            Problem(SizesError, "expected a tensor with at least 1 dimension, got a 0-d tensor"),
        )
    return record, checked.timeout


def raise_own_problem(
    name: str, problem: Problem | None, info: GroupInfo, *, trusted: bool
) -> None:
    """Raise this rank's own ``problem`` (if any) where no exchange tells the peers: a
    world of one rank, or ``trusted`` (``validate=False`` with known sizes), when the
    message says the peers are left waiting."""
    if problem is None:
        return
    where = (
        " (validate=False: raised on this rank only; its peers wait in the payload "
        "collective until they time out)"
        if trusted and info.communicates
        else ""
    )
    raise problem.error(
        f"{name}{where}: invalid arguments on rank(s) [{info.rank}]: rank "
        f"{info.rank}: {problem.message}",
        ranks=[info.rank],
    )


def with_problem(record: CallRecord, problem: Problem | None) -> CallRecord:
    """``record`` with ``problem`` added, unless it already holds one (first wins)."""
    if problem is None or record.problem is not None:
        return record
    return replace(record, problem=problem)


def sizes_words(
    sizes: object, world_size: int
) -> tuple[tuple[int, ...] | Problem | None, list[int]]:
    """Caller sizes parsed, and their wire form: ``[len, n_0, ..., n_{W-1}]``, ``-1``
    for absent or malformed sizes (length ``-1``) and for missing entries; a longer
    vector's extra entries are dropped (its length says it was longer)."""
    if sizes is None:
        return None, [-1] * (1 + world_size)
    parsed = parse_sizes(sizes)
    if isinstance(parsed, Problem):
        return parsed, [-1] * (1 + world_size)
    words = [len(parsed)] + [saturate(n) for n in parsed[:world_size]]
    return parsed, words + [-1] * (1 + world_size - len(words))


FAMILY_FUSED_MAX: Final = 64 * 1024
"""Largest block (bytes, from one rank to one rank) that rides in the metadata exchange:
the round moves ``W`` slots of the capacity (at most this) from and to every rank."""

FAMILY_STRETCH_MAX: Final = 256 * 1024
"""Largest block that rides in the exchange at all: past ``FAMILY_FUSED_MAX`` only
while the slots' padding is bounded, ``W * W * slot(need) <= (1 + WASTE_LIMIT) *
total`` (every block of every rank padded to the slot; ``_fused.WASTE_LIMIT``). Past
it the two copies the slots cost (into the send slots, out of the received ones) cost
more than the metadata round they save: measured on 4 gloo ranks, 1 MiB blocks rode
at 2.35x one ``all_to_all_single`` against 1.75x in two rounds (``docs/family.md``)."""


_ELIGIBLE: Final = 1  # flag word: no local problem, x on the exchange's device
_USED: Final = 2  # flag word: the payload slot holds this rank's whole x


@dataclass(frozen=True)
class FamilyState:
    """What one group's ranks agree on for the family's next exchange (module doc): the
    payload slot's ``capacity`` (bytes) and its shrink streak (``idle``, ``idle_need``)."""

    capacity: int = 0
    idle: int = 0
    idle_need: int = 0


def advance(
    state: FamilyState, *, fusable: bool, need: int, total: int = 0, world: int = 1
) -> FamilyState:
    """The state after a call that validated: a pure function of what every rank saw
    (``fusable``: every rank eligible; ``need``: the largest block any rank sends any
    rank, bytes; ``total``: every block of every rank together; ``world``: ``W``)."""
    capacity, idle, idle_need = capacity_step(
        (state.capacity, state.idle, state.idle_need),
        small=fusable and rides(need, total, world),
        need=need,
        slot=_slot,
    )
    if (capacity, idle, idle_need) == (state.capacity, state.idle, state.idle_need):
        return state
    return FamilyState(capacity, idle, idle_need)


def rides(need: int, total: int, world: int) -> bool:
    """Whether a call of these blocks may ride in the exchange's slots (module doc): any
    call whose largest block is at most ``FAMILY_FUSED_MAX`` (latency dominates there),
    and one of blocks up to ``FAMILY_STRETCH_MAX`` whose ``W * W`` slots pad its
    ``total`` bytes by at most ``WASTE_LIMIT``."""
    if need <= FAMILY_FUSED_MAX:
        return True
    return need <= FAMILY_STRETCH_MAX and within_waste(world * world * _slot(need), total)


def _slot(n: int) -> int:
    """``bucket(n)`` rounded up to 16 bytes (every slot starts 16-byte aligned)."""
    return -(-bucket(n) // 16) * 16


_STATES: weakref.WeakKeyDictionary[dist.ProcessGroup, FamilyState] = weakref.WeakKeyDictionary()
"""Per group, the one state every kind's exchange is sized from (module doc)."""

_FRESH: Final = FamilyState()


def family_state_of(group: dist.ProcessGroup | None) -> FamilyState:
    """This process's copy of ``group``'s state, shared by every kind of the family
    (``None``: the default group)."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, dist.ProcessGroup):
        return FamilyState()
    return _STATES.get(pg, _FRESH)


def extra_words(world_size: int) -> int:
    """The length of every kind's extras on the wire: ``all_to_all_v``'s two size
    vectors, ``2 * (W + 1)`` words (a shorter kind's are padded with ``-1``), so that
    a peer calling another kind of the family sends a row of the same length."""
    return 2 * (world_size + 1)


@dataclass(frozen=True)
class Exchanged:
    """Every rank's row and, unread until the rows validated, the payload slots.

    ``slots``: ``(W, capacity)`` bytes, row ``j`` the slot rank ``j`` sent this rank
    (``None`` in a world of one rank); ``flags``: every rank's flag word; ``state``: the
    state the round was sized from."""

    rows: list[Row]
    slots: torch.Tensor | None
    flags: tuple[int, ...]
    state: FamilyState


Outgoing = Callable[[], tuple[torch.Tensor, Sequence[int]]]
"""What a rank would send in its payload collective: its flat bytes, block ``r``
(``sizes[r]`` bytes) for rank ``r``, in rank order. Called only for an eligible call."""


def _flags(
    call: FamilyCall, x: object, outgoing: Outgoing | None, capacity: int, info: GroupInfo
) -> tuple[int, tuple[torch.Tensor, Sequence[int]] | None]:
    """This rank's flag word and, when every block fits the slot, its blocks' bytes."""
    if call.record.problem is not None or not isinstance(x, torch.Tensor) or outgoing is None:
        return 0, None
    if x.device.type != info.default_device().type or x.layout != torch.strided:
        return 0, None
    if x.numel() * x.element_size() > capacity * info.world_size:  # some block is larger
        return _ELIGIBLE, None
    flat, sizes = outgoing()
    if max(sizes, default=0) > capacity:
        return _ELIGIBLE, None
    return _ELIGIBLE | _USED, (flat, sizes)


def exchange_fused(
    call: FamilyCall, info: GroupInfo, x: object = None, outgoing: Outgoing | None = None
) -> Exchanged:
    """Every rank's row, in group-rank order, and this rank's payload slots: one
    equal-split all_to_all of ``8 * len(vector) + capacity`` bytes from every rank to
    every rank (its row, the same for all, and its block for that rank; module doc).

    In a world of one rank nothing is sent. A row vargather cannot read, or one of
    another collective of the family, raises ``ProtocolMismatchError`` on every rank.
    """
    kind_code = COLLECTIVES[call.kind].code
    pg = process_group(info) if info.communicates else None
    state = _STATES.get(pg, _FRESH) if pg is not None else _FRESH
    capacity = state.capacity
    device = info.default_device()
    flag, payload = _flags(call, x, outgoing, capacity, info) if pg is not None else (0, None)
    n_extras = extra_words(info.world_size)
    pad = [-1] * (n_extras - len(call.extras))
    vector = [*encode_record(call.record), FAMILY_MAGIC, kind_code, *call.extras, *pad, flag]
    vector += [0] * (len(vector) % 2)  # 16-byte rows: every slot starts aligned
    if not info.communicates:
        return Exchanged([Row(call.record, call.extras)], None, (flag,), state)
    w, words = info.world_size, len(vector)
    width = 8 * words + capacity
    local = torch.empty(w, width, dtype=torch.uint8, device=device)
    local[:, : 8 * words] = torch.tensor(vector, dtype=torch.int64, device=device).view(torch.uint8)
    filled = [0] * w
    if payload is not None:
        flat, sizes = payload
        at = 0
        for r, n in enumerate(sizes):
            if n:
                local[r, 8 * words : 8 * words + n] = flat[at : at + n]
            filled[r] = n
            at += n
    for r, n in enumerate(filled):  # no stale bytes leave: what no block filled is zero
        if 8 * words + n < width:
            local[r, 8 * words + n :].zero_()
    received = torch.empty(w, width, dtype=torch.uint8, device=device)
    all_to_all_uneven(
        received,
        local,
        output_splits=[1] * w,
        input_splits=[1] * w,
        info=info,
        what=f"all_to_all ({call.kind} metadata exchange)",
    )
    rows = received[:, : 8 * words].contiguous().view(torch.int64).tolist()
    _check_kinds(call.kind, [(row[RECORD_LENGTH], row[RECORD_LENGTH + 1]) for row in rows])
    out: list[Row] = []
    flags: list[int] = []
    at = RECORD_LENGTH + 2
    for r, row in enumerate(rows):
        extras = tuple(row[at : at + len(call.extras)])
        flags.append(int(row[at + n_extras]))
        out.append(Row(decode_record(row[:RECORD_LENGTH], rank=r), extras))
    return Exchanged(out, received[:, 8 * words :], tuple(flags), state)


def _check_kinds(kind: CollectiveName, marks: Sequence[tuple[int, int]]) -> None:
    """Raise ``ProtocolMismatchError`` unless every rank's row (``marks[r]``: its magic
    and kind code) is a ``kind`` call's: a row vargather cannot read names its rank; a
    peer calling another kind of the family gets one message on every rank, naming
    which rank called which (a pure function of the rows)."""
    kind_code = COLLECTIVES[kind].code
    if all(magic == FAMILY_MAGIC and code == kind_code for magic, code in marks):
        return
    for r, (magic, code) in enumerate(marks):
        found_kind = by_code(code)
        if magic != FAMILY_MAGIC or found_kind is None or found_kind.round != "all_to_all":
            raise ProtocolMismatchError(
                f"{kind}: rank {r} sent metadata of another collective or vargather "
                f"version: expected a {kind} call on every rank of the group",
                ranks=[r],
            )
    names = [name_of_code(code) for _, code in marks]
    found = _disagreement("collective", names)
    assert found is not None  # some rank's kind differs
    message, blamed = found
    present = " / ".join(k for k in COLLECTIVE_NAMES if k in names)
    raise ProtocolMismatchError(
        f"{present}: {message}: call the same collective on every rank of the group",
        ranks=blamed,
    )


def exchange(call: FamilyCall, info: GroupInfo) -> list[Row]:
    """Every rank's rows (``exchange_fused`` without a payload)."""
    return exchange_fused(call, info).rows


def settle(
    ex: Exchanged, info: GroupInfo, need: int, incoming: Sequence[int], total: int
) -> tuple[torch.Tensor, ...] | None:
    """After the rows of ``ex`` validated: advance the group's state (every rank alike;
    ``need``: the largest block any rank sends any rank, ``total``: every rank's blocks
    together, bytes, from the validated rows) and, when every rank's slot holds its
    blocks, the block (``incoming[j]`` bytes) each rank ``j`` sent this rank (``None``:
    the payload collective runs)."""
    if ex.slots is None:
        return None
    fusable = all(f & _ELIGIBLE for f in ex.flags)
    after = advance(ex.state, fusable=fusable, need=need, total=total, world=info.world_size)
    pg = process_group(info)
    if pg is not None and after is not ex.state:
        _STATES[pg] = after
    if not all(f & _USED for f in ex.flags) or need > ex.state.capacity:
        return None
    return tuple(ex.slots[j, :n] for j, n in enumerate(incoming))


# --- validation helpers ----------------------------------------------------------------

Check = tuple[type[VarGatherError], str, list[object], Callable[[object], str]]


def raise_local(name: str, records: Sequence[CallRecord]) -> None:
    """Every rank's local problems, raised on every rank (the first one's class)."""
    bad = [(r, rec.problem) for r, rec in enumerate(records) if rec.problem is not None]
    if bad:
        details = "; ".join(f"rank {r}: {problem.message}" for r, problem in bad)
        raise bad[0][1].error(
            f"{name}: invalid arguments on rank(s) {[r for r, _ in bad]}: {details}",
            ranks=[r for r, _ in bad],
        )


def agree(name: str, checks: Sequence[Check]) -> None:
    """Raise the first disagreement among ``checks``, naming the odd ranks."""
    for error, what, values, show in checks:
        found = _disagreement(what, values, show)
        if found is not None:
            message, blamed = found
            raise error(f"{name}: {message}", ranks=blamed)


def _device(code: object) -> str:
    if isinstance(code, int) and 0 <= code < len(DEVICE_TYPES):
        return repr(DEVICE_TYPES[code])
    return "another device type"


def _dtype(code: object) -> str:
    dtype = dtype_from_code(code) if isinstance(code, int) else None
    return repr(code) if dtype is None else str(dtype)


def _shape(shape: object) -> str:
    return str(tuple(shape)) if isinstance(shape, tuple) else repr(shape)


def common_checks(
    records: Sequence[CallRecord], *, dim: bool, shape: str | None, contract: bool = False
) -> list[Check]:
    """The agreements every family call needs: device type, ndim, (the normalized
    ``dim``), dtype, and the shape: ``"full"`` (every dimension), ``"other"``
    (outside ``dim``) or ``None`` (any shape); ``contract``: the same ``grad=``."""
    checks: list[Check] = []
    if contract:
        checks.append(
            (
                ArgumentMismatchError,
                "gradient contract (grad=)",
                [rec.contract_code for rec in records],
                lambda c: repr(CONTRACTS[c]) if isinstance(c, int) else repr(c),
            )
        )
    checks.append(
        (ArgumentMismatchError, "device type", [rec.device_code for rec in records], _device)
    )
    checks.append((ShapeMismatchError, "ndim", [rec.ndim for rec in records], repr))
    if dim:
        checks.append(
            (
                ArgumentMismatchError,
                "dimension (dim, normalized)",
                [rec.normalized_dim for rec in records],
                repr,
            )
        )
    checks.append((DTypeMismatchError, "dtype", [rec.dtype_code for rec in records], _dtype))
    if shape == "full":
        checks.append((ShapeMismatchError, "shape", [rec.shape for rec in records], _shape))
    elif shape == "other":
        checks.append(
            (
                ShapeMismatchError,
                "shape outside the split dimension",
                [rec.other_dims for rec in records],
                _shape,
            )
        )
    return checks


def requires_grad_check(records: Sequence[CallRecord], why: str) -> Check:
    """Every rank needs a gradient, or none: the backward is a collective."""
    return (
        RequiresGradMismatchError,
        f"requires_grad ({why}: every rank must take part)",
        [rec.requires_grad for rec in records],
        repr,
    )


def reset_family_state(group: dist.ProcessGroup | None = None) -> None:
    """Tests only: forget ``group``'s state on this rank (every rank must do the same,
    or the ranks disagree on the next exchange's size)."""
    pg = group if group is not None else dist.group.WORLD
    if isinstance(pg, dist.ProcessGroup):
        _STATES.pop(pg, None)

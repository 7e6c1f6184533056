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
``_wire.encode_row``: ``encode_record(record) + [ROW_MAGIC, code] + extras + [flags]`` (``code``: the
collective's wire code, ``_collectives``) (int64, padded
to an even count) and a payload slot to every rank in one round (below: equal slots
in one all_to_all, or a slot per pair of ranks by direct sends): every rank sends the
same lengths, *whichever kind of the family it called*: the extras are padded with ``-1`` to ``row_extra_words(W) = 2 * (W
+ 1) + 1`` words for every kind (``all_to_all_v``'s two size vectors and ``cat_dim``; ``reduce_scatter_v``
passes ``W + 1``), and the capacity is the group's one state of this round (``_round_state``), shared by every
kind. Nothing of a slot is read before the rows validated, and every rank decides
from the same matrix: the same error on every rank, or the same answer. A peer
issuing another collective of the family is caught by ``kind``: every rank raises the
same ``ProtocolMismatchError``, naming which rank called which (``_check_kinds``),
and the group's state is unchanged, so the next call of one collective on every rank
works. (A peer in an all_gather-based collective, ``all_gather_list`` or
``all_gather_v``, issues another collective type: that cannot be told apart from a
late peer, and ends in the named timeout; ``docs/misuse.md``.)

**One round** (``exchange_fused``, ``settle``), of one of two kinds, chosen from the
group's state alone (every rank the same):

* the **equal round** (``state.wide`` empty): an equal-split all_to_all: rank ``j``
  sends every rank the same row, followed by a payload slot of ``capacity`` bytes
  holding the block the payload collective would send that rank, when every block
  fits and the rank has no local problem (a flag word of the row says so);
* the **wide round** (``state.wide``: ``W * W`` learned slots, ``wide[j * W + k]``
  the bytes rank ``j`` may send rank ``k``, at least ``capacity``),
  ``_wide_exchange``: while every slot is at most ``PACKED_WIDE_MAX`` (512 KiB),
  *packed*: one alltoallv whose message to each peer is the row and the block in a
  slot of its own size (``_packed_wide_exchange``); past it, *direct*: the rows and
  the blocks apart, each block into a slot of its own size (``run_direct``); on gloo
  as two alltoallvs posted together, each block sent as it lies in ``x`` (no copy
  when ``x`` is contiguous with its blocks one after the other) and only its own
  bytes, which gloo receives into the larger slot; the blocks land in the regions of
  one buffer, each at a 16-byte boundary, which ``all_to_all_v`` returns closed up in
  place (nothing moves when every slot is its block exactly, in whole 16 bytes).

After the rows validated (nothing of a slot is read before), a call whose every
rank's slots hold its blocks is answered from the slots: one collective in all;
otherwise the payload collective runs (two). The state rule (``advance_blocks``,
applied after every validated call, from the validated rows only, every kind moving
the one state: a ``reduce_scatter_v`` after an ``all_to_all_v`` uses the same slots):
the ``capacity`` follows the equal round's rule for calls whose largest block is at
most ``FAMILY_FUSED_MAX`` (16 KiB); a call with a larger block, every rank eligible,
makes the round go wide, with the all_gather-shaped wide round's rule over the
``W * W`` blocks (``_round_state``: the exact blocks at first, ``bucket`` growth on a
miss, the exact blocks again after ``SHRINK_AFTER`` calls in a row with the same
blocks, back to the equal round after ``SHRINK_AFTER`` calls that do not go wide).
Calls that raise change nothing. Bound: the equal round moves ``W * (8 *
len(vector) + capacity)`` bytes from and to every rank, ``len(vector) <= RECORD_LENGTH
+ 2 * W + 7`` (the record, magic and kind, ``2 * (W + 1) + 1`` extras, the flag word, one
word of padding; ``reduce_scatter_v``'s row is ``8 * (W + 1)`` bytes longer than its
own extras need, the price of one row length for the family), ``capacity <=
block_slot(FAMILY_FUSED_MAX)``; the wide round moves packed every pair's row and
slot, each rounded up to 16 bytes, and otherwise, on gloo, the rows and exactly the
payload, and receives into slots of at most ``max(capacity, bucket`` of the
largest block a pair had since the slots were set``)`` (``bucket``: 12.5 % over, 64
bytes at least), each slot its block exactly while the blocks stay the same. A rank
in the all_to_all-shaped round beside one in the all_gather-shaped round issues other
operations (alltoallvs against an all_gather or point-to-point sends; on NCCL messages
under other tags, ``_comm.BLOCKS_TAG``), which the backend never pairs: both wait and
raise the named timeout, never a misread. Every rank of the family runs the same round,
a function of the one state.
"""

from __future__ import annotations

import array
import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Final, Generic, NamedTuple, TypeVar

import torch
import torch.distributed as dist

from ._args import CallRecord, Problem, check_call, parse_sizes, saturate
from ._choices import CONTRACTS, DEVICE_TYPES
from ._collectives import COLLECTIVES, CollectiveName, by_code
from ._comm import BLOCKS_TAG, GroupInfo, all_to_all_round, all_to_all_uneven, send_receive
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
from ._exchange import _disagreement, check_same_collective
from ._group import process_group
from ._round_buffers import (
    Cut,
    copy_bytes,
    hand_back,
    handed_back_buffer,
    move_left,
    plain,
    region_cutter,
)
from ._round_state import (
    FusedState,
    advance_blocks,
    block_room,
    is_wide,
    memory,
    set_state,
    whole_16,
    wide_blocks,
)
from ._wire import ROW_MAGIC, decode_row, encode_row, row_mark

__all__ = [
    "Check",
    "DirectRound",
    "Exchanged",
    "FamilyCall",
    "PackedRound",
    "RoundSpec",
    "Row",
    "ValidatedOnce",
    "agree",
    "call_key",
    "check_tensor",
    "common_checks",
    "direct_exchanged",
    "direct_round",
    "exchange",
    "exchange_fused",
    "fill_packed",
    "fill_packed_at",
    "goes_direct",
    "known_call",
    "packed_exchanged",
    "raise_local",
    "resized_round",
    "rows_changed_only_in",
    "run_direct",
    "run_packed",
    "run_round",
    "send_packed",
    "settle",
    "sizes_words",
    "with_problem",
]


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


_FRESH: Final = FusedState()
_ELIGIBLE: Final = 1  # flag word: no local problem, x on the exchange's device
_USED: Final = 2  # flag word: the payload slot holds this rank's whole x


@dataclass(frozen=True)
class Exchanged:
    """Every rank's row and, unread until the rows validated, the payload slots.

    ``slots``: per rank ``j``, the bytes of the slot rank ``j`` sent this rank
    (``capacity`` of them in the equal round, ``wide[j * W + rank]`` in the wide one;
    ``None`` in a world of one rank); ``flags``: every rank's flag word; ``state``: the
    state the round was sized from; ``kind``: the collective whose round it was."""

    rows: list[Row]
    slots: Sequence[torch.Tensor] | None
    flags: tuple[int, ...]
    state: FusedState
    kind: CollectiveName
    cut: Cut | None = None
    """The wide round's: the results cut from its one receive buffer, whose regions are
    ``slots`` (``_round_buffers.region_cutter``: closed up in place when the rank blocks
    are adjacent in the result)."""
    packed: PackedRound | None = None
    """The round's messages as a packed layout: the packed wide round's, or the equal
    round's (equal slots); ``None`` for the direct sends."""
    raw: bytes | None = None
    """The received rows' bytes."""
    direct: DirectRound | None = None
    """The direct sends' round (``None`` for the others)."""


Outgoing = Callable[[], tuple[torch.Tensor, Sequence[int]]]
"""What a rank would send in its payload collective: its flat bytes, block ``r``
(``sizes[r]`` bytes) for rank ``r``, in rank order. Called only for an eligible call."""


def _eligible(call: FamilyCall, x: object, info: GroupInfo) -> bool:
    """Whether this rank's payload may ride in the round: no local problem, a strided
    tensor on the exchange's device."""
    return (
        call.record.problem is None
        and isinstance(x, torch.Tensor)
        and x.device.type == info.default_device().type
        and x.layout == torch.strided
    )


def _flags(
    call: FamilyCall, x: object, outgoing: Outgoing | None, capacity: int, info: GroupInfo
) -> tuple[int, tuple[torch.Tensor, Sequence[int]] | None]:
    """This rank's flag word and, when every block fits the slot, its blocks' bytes."""
    if outgoing is None or not _eligible(call, x, info):
        return 0, None
    assert isinstance(x, torch.Tensor)  # an eligible call's
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
    every rank (its row, the same for all, and its block for that rank; module doc),
    or, when the group's state has gone wide, ``_wide_exchange``.

    In a world of one rank nothing is sent. A row vargather cannot read, or one of
    another collective of the family, raises ``ProtocolMismatchError`` on every rank.
    """
    kind_code = COLLECTIVES[call.kind].code
    pg = process_group(info) if info.communicates else None
    state = _FRESH if pg is None else memory(pg, call.kind).shared.state
    if pg is not None and is_wide(state, info.world_size):
        return _wide_exchange(call, info, x, outgoing, state, pg)
    capacity = state.capacity
    device = info.default_device()
    flag, payload = _flags(call, x, outgoing, capacity, info) if pg is not None else (0, None)
    if not info.communicates:
        return Exchanged([Row(call.record, call.extras)], None, (flag,), state, call.kind)
    row = _row_bytes(call.record, kind_code, call.extras, info.world_size, flag)
    w, words = info.world_size, row.numel() // 8
    width = 8 * words + capacity
    local = torch.empty(w, width, dtype=torch.uint8, device=device)
    local[:, : 8 * words] = row.to(device)
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
    raw = _landed_rows(received.view(-1), [j * width for j in range(w)], 8 * words)
    out, flags = _read_rows(call, raw, w, pg)
    # The same messages as a packed round of equal slots (``capacity`` is whole 16s): a
    # steady caller replays them so (``_all_to_all``'s steady path).
    packed = packed_round(row, (capacity,) * (w * w), info.rank, w) if capacity % 16 == 0 else None
    slots = received[:, 8 * words :].unbind(0)
    return Exchanged(out, slots, flags, state, call.kind, None, packed, raw)


def _landed_rows(buf: torch.Tensor, offsets: Sequence[int], length: int) -> bytes:
    """The received rows' bytes: ``length`` of them at each of ``offsets`` in the flat
    uint8 ``buf`` (read where they landed on the CPU, else copied to the host together)."""
    if buf.device.type == "cpu":
        at = buf.data_ptr()
        return b"".join(ctypes.string_at(at + o, length) for o in offsets)
    host = torch.cat([buf[o : o + length] for o in offsets]).cpu()
    return ctypes.string_at(host.data_ptr(), host.numel())


def _read_rows(
    call: FamilyCall, raw: bytes, w: int, pg: dist.ProcessGroup | None
) -> tuple[list[Row], tuple[int, ...]]:
    """Every rank's row and flag word from the received rows' bytes (``raw``, rank by
    rank: ``_landed_rows``); ``ProtocolMismatchError`` on every rank unless every rank
    called ``call.kind``. The very bytes of the last rows read on this group give the
    very same (cached) list, so a caller may cache what it validated from it by
    identity."""
    mem = None if pg is None else memory(pg, call.kind)
    last = None if mem is None else mem.last
    if isinstance(last, _LastRows) and last.raw == raw:
        return last.rows, last.flags
    out, flags = _decode_rows(call, raw, w)
    if mem is not None:  # the collective's ``Memory.last``: a cache of a pure function
        mem.last = _LastRows(raw, out, flags)
    return out, flags


class _LastRows(NamedTuple):
    """The bytes of the last rows read and what they read as (in the steady state every
    call's rows are the same bytes)."""

    raw: bytes
    rows: list[Row]
    flags: tuple[int, ...]


def _decode_rows(call: FamilyCall, raw: bytes, w: int) -> tuple[list[Row], tuple[int, ...]]:
    """``_read_rows`` without the cache."""
    values = memoryview(raw).cast("q").tolist()  # int64 words, native order as sent
    n = len(values) // w
    words = [values[r * n : (r + 1) * n] for r in range(w)]
    _check_kinds(call.kind, [row_mark(row) for row in words])
    out: list[Row] = []
    flags: list[int] = []
    for r, row in enumerate(words):
        record, extras, flag = decode_row(row, len(call.extras), w, rank=r)
        flags.append(flag)
        out.append(Row(record, extras))
    return out, tuple(flags)


def rows_changed_only_in(
    raw: bytes, last: bytes, w: int, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, ...]] | None:
    """Per rank, the words of its row in ``raw`` (the received rows' bytes,
    ``_landed_rows``) at ``spans`` (first word and count, in order, apart), when every
    rank's row is its row in ``last`` but for those words; else ``None``. Rows equal
    but for a size vector and a dimension say everything ``last`` said but those (the
    same kind, flags and record otherwise: no problem where it had none)."""
    if len(raw) != len(last) or len(raw) % w:
        return None
    n = len(raw) // w
    view = memoryview(raw)
    out: list[tuple[int, ...]] = []
    for j in range(w):
        at = prev = j * n
        words: list[int] = []
        for first, count in spans:
            lo, hi = at + 8 * first, at + 8 * (first + count)
            if hi > at + n or raw[prev:lo] != last[prev:lo]:
                return None
            words.extend(view[lo:hi].cast("q"))  # int64 words, native order as sent
            prev = hi
        if raw[prev : at + n] != last[prev : at + n]:
            return None
        out.append(tuple(words))
    return out


PACKED_WIDE_MAX: int = 512 * 1024
"""Largest slot (bytes, one rank to one rank) with which the wide round travels
*packed*: one alltoallv whose message to each peer is this rank's row and its block,
copied into one send buffer, instead of the rows and the blocks apart (``run_direct``).
Apart costs a second collective (gloo) or 4 (W - 1) point-to-point messages; packing
costs two copies of the blocks (in, and closed up), which outweigh that from about
half a MiB a block. Measured when the direct round was point-to-point messages on
gloo too (4 gloo ranks, mild blocks, 15 alternating bursts, a loaded machine), CPU
per call summed over the ranks against ``all_to_all_single``'s, packed against
direct: 2 MiB in all (largest block 170 KiB) 1.19 / 1.28x, 4 MiB (330 KiB) 1.18 /
1.23x, 8 MiB (670 KiB) 1.40 / 1.17x, 16 MiB (1.3 MiB) 1.31 / 1.15x; gloo's two
alltoallvs cost less than those messages, so the crossover is at most this. A
function of the group's state, so every rank picks the same."""


SHORT_MESSAGES: tuple[str, ...] = ("gloo",)
"""Backends whose receive takes a message shorter than its buffer (gloo: a receive of
``n`` bytes takes any message of at most ``n``, in an alltoallv too), so the direct
wide round sends a block as it lies, in two alltoallvs; elsewhere every message is
exactly its slot."""


T = TypeVar("T")


class ValidatedOnce(Generic[T]):
    """A collective's ``validate_rows``, remembered for the very list of rows it last
    validated (``_read_rows`` returns the same list for the same bytes, so the steady
    state's rows are one list, validated once). A pure function of the rows and this
    rank; an error is never remembered."""

    def __init__(self, validate: Callable[..., T]) -> None:
        self._validate = validate
        self._last: tuple[list[Row], int, T] | None = None

    def __call__(self, rows: list[Row], *, rank: int) -> T:
        last = self._last
        if last is not None and last[0] is rows and last[1] == rank:
            return last[2]
        result = self._validate(rows, rank=rank)
        self._last = (rows, rank, result)
        return result


@functools.lru_cache(maxsize=64)
def _row_bytes(
    record: CallRecord, code: int, extras: tuple[int, ...], world_size: int, flag: int
) -> torch.Tensor:
    """``encode_row``'s words as the bytes of an int64 CPU tensor, remembered for recent
    rows (a steady state sends the same row every call). Read only: the rounds copy it."""
    vector = array.array("q", encode_row(record, code, extras, world_size, flag))
    return torch.frombuffer(vector, dtype=torch.uint8)  # shares (and keeps) the array


@functools.lru_cache(maxsize=64)
def _packed_splits(
    room: tuple[int, ...], rank: int, w: int, head: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The packed wide round's message sizes to and from every peer (``head`` bytes of
    row, then the pair's slot, each rounded up to 16 bytes) and where each received
    message starts: a pure function of the slots, remembered."""
    out_bytes = tuple(head + whole_16(room[rank * w + k]) for k in range(w))
    in_bytes = tuple(head + whole_16(room[j * w + rank]) for j in range(w))
    offsets = tuple(sum(in_bytes[:j]) for j in range(w))
    return out_bytes, in_bytes, offsets


def _wide_exchange(
    call: FamilyCall,
    info: GroupInfo,
    x: object,
    outgoing: Outgoing | None,
    state: FusedState,
    pg: dist.ProcessGroup,
) -> Exchanged:
    """The wide round (module doc): this rank's row and, when eligible, its blocks, each
    at most its pair's slot (``wide[rank * W + k]`` bytes for rank ``k``); a block
    larger than its slot sends its first ``slot`` bytes (the call takes a second round,
    every rank sees it in the rows). Packed while every slot is at most
    ``PACKED_WIDE_MAX`` (``_packed_wide_exchange``), else by direct sends
    (``_direct_wide_exchange``)."""
    w, rank = info.world_size, info.rank
    room = wide_blocks(state)
    flag = 0
    blocks: list[torch.Tensor] | None = None
    if outgoing is not None and _eligible(call, x, info):
        flat, sizes = outgoing()
        out_slots = room[rank * w : (rank + 1) * w]
        split = torch.split(flat, list(sizes))
        blocks = [b[:slot] for b, slot in zip(split, out_slots, strict=True)]
        fits = all(n <= slot for n, slot in zip(sizes, out_slots, strict=True))
        flag = _ELIGIBLE | (_USED if fits else 0)
    row = _row_bytes(call.record, COLLECTIVES[call.kind].code, call.extras, w, flag)
    exchange = _direct_wide_exchange if goes_direct(state, w) else _packed_wide_exchange
    return exchange(call, info, row, blocks, state, pg, room)


def goes_direct(state: FusedState, world: int) -> bool:
    """Whether the all_to_all-shaped round of ``state`` is the direct wide round
    (``DirectRound``): gone wide with a slot past ``PACKED_WIDE_MAX``. Else its messages
    are laid out packed, the equal round's slots too (byte for byte a packed round of
    equal slots). A function of the state, so every rank picks the same; a remembered
    round is replayed only in a state that picks its kind (``_all_to_all._resized_call``:
    slots alike are not enough once ``PACKED_WIDE_MAX`` is below the equal round's)."""
    return is_wide(state, world) and max(wide_blocks(state), default=0) > PACKED_WIDE_MAX


def _direct_wide_exchange(
    call: FamilyCall,
    info: GroupInfo,
    row: torch.Tensor,
    blocks: Sequence[torch.Tensor] | None,
    state: FusedState,
    pg: dist.ProcessGroup,
    room: Sequence[int],
) -> Exchanged:
    """The wide round by direct sends (``DirectRound``, ``run_direct``)."""
    exact = info.backend in SHORT_MESSAGES
    direct = direct_round(row, tuple(room), info.rank, info.world_size, exact)
    buf, raw = run_direct(call, info, pg, direct, blocks)
    return direct_exchanged(call, info, pg, state, direct, buf, raw)


@dataclass(frozen=True)
class DirectRound:
    """The wide round by direct sends of one state on one rank (a pure function of the
    slots, this rank's row and the backend): to every peer ``k``, this rank's ``row``
    and its block for ``k``, into a slot of ``wide[rank * W + k]`` bytes; every peer's
    row and block received in place, rank ``j``'s block into its region of one buffer
    of ``size`` bytes (``in_slots[j]`` bytes at ``starts[j]``, a 16-byte boundary: any
    dtype views it; this rank's own block copied in) (``run_direct``).

    ``exact`` (gloo, ``SHORT_MESSAGES``): the round is two alltoallvs posted together,
    the rows and the blocks; a block is sent as it lies in the caller's tensor (no copy
    when ``x`` is contiguous and its blocks lie one after the other) and only its
    bytes, at most the slot: gloo receives a shorter message into a larger buffer, and
    the row says how many bytes came. Elsewhere it is ``4 (W - 1)`` point-to-point
    messages in one batch (``send_receive``, under ``BLOCKS_TAG``), every block message
    exactly its slot (the block and zeros, copied)."""

    row: torch.Tensor
    room: tuple[int, ...]
    in_slots: tuple[int, ...]
    starts: tuple[int, ...]
    size: int
    exact: bool


@functools.lru_cache(maxsize=64)
def direct_round(
    row: torch.Tensor, room: tuple[int, ...], rank: int, w: int, exact: bool
) -> DirectRound:
    """The ``DirectRound`` of ``row`` and the slots ``room`` on ``rank``, blocks sent as
    they lie when ``exact`` (remembered: ``row`` is ``_row_bytes``'s, itself
    remembered)."""
    in_slots = tuple(room[j * w + rank] for j in range(w))
    starts = [0] * (w + 1)
    for j in range(w):
        starts[j + 1] = whole_16(starts[j] + in_slots[j])
    return DirectRound(row, room, in_slots, tuple(starts[:w]), starts[w], exact)


def resized_round(
    found: PackedRound | DirectRound, call: FamilyCall, info: GroupInfo
) -> PackedRound | DirectRound:
    """``found``'s round (its slots, packed or by direct sends) carrying ``call``'s row:
    a call whose every block fits its slot, from a rank without a local problem (its
    flag word says its blocks ride)."""
    w = info.world_size
    flag = _ELIGIBLE | _USED
    row = _row_bytes(call.record, COLLECTIVES[call.kind].code, call.extras, w, flag)
    if isinstance(found, DirectRound):
        return direct_round(row, found.room, info.rank, w, found.exact)
    return packed_round(row, found.room, info.rank, w)


def run_direct(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    direct: DirectRound,
    blocks: Sequence[torch.Tensor] | None,
) -> tuple[torch.Tensor, bytes]:
    """One direct round of this rank's ``blocks`` (``None``: none rides): the receive
    buffer, its regions filled (this rank's own block at the start of its region), and
    the received rows' bytes (``_landed_rows``). On a backend that takes short messages
    (``direct.exact``) the round is two alltoallvs (``_direct_by_all_to_all``), else
    point-to-point messages (``_direct_by_messages``); either fills ``rows`` (every
    rank's row, rank by rank) and ``buf``."""
    w = info.world_size
    device = info.default_device()
    length = direct.row.numel()
    rows = torch.empty(w * length, dtype=torch.uint8, device=device)
    buf = handed_back_buffer(pg, "blocks", direct.size, device)
    move = _direct_by_all_to_all if direct.exact else _direct_by_messages
    move(call, info, direct, blocks, rows, buf)
    hand_back(pg, "blocks", buf)  # kept for a later call once nothing refers to it
    return buf, _landed_rows(rows, [j * length for j in range(w)], length)


def _direct_by_all_to_all(
    call: FamilyCall,
    info: GroupInfo,
    direct: DirectRound,
    blocks: Sequence[torch.Tensor] | None,
    rows: torch.Tensor,
    buf: torch.Tensor,
) -> None:
    """The direct round on gloo: two alltoallvs posted together (``all_to_all_round``),
    every rank's row to every rank, and this rank's blocks as they lie (one view of
    them when they lie one after the other, as a plain tensor's do) into the peers'
    regions, each only its bytes.

    This rank's own block rides in the second too, copied by the backend, which wants
    its receive room equal to its length ``L``: it lands at the end of its region (the
    room before it goes to the previous rank's region, or is left out of the output
    for rank 0) and is moved to the region's start after, unless it fills the region
    (a steady state's exact slot in whole 16 bytes: nothing moves)."""
    w, rank = info.world_size, info.rank
    length = direct.row.numel()
    pieces = list(blocks) if blocks is not None else [buf[:0]] * w
    in_splits = [p.numel() for p in pieces]
    own = in_splits[rank]
    ends = [*direct.starts[1:], direct.size]
    own_at = ends[rank] - own
    out_splits = [end - start for start, end in zip(direct.starts, ends, strict=True)]
    out_splits[rank] = own
    out = buf
    if rank > 0:
        out_splits[rank - 1] += own_at - direct.starts[rank]
    else:
        out = buf[own_at:]
    all_to_all_round(
        [
            (rows, _tiled(direct.row, w).to(rows.device), [length] * w, [length] * w),
            (out, _joined(pieces), out_splits, in_splits),
        ],
        info,
        what=f"all_to_all x2 ({call.kind} metadata exchange)",
    )
    if own and own_at != direct.starts[rank]:
        move_left(buf, direct.starts[rank], own_at, own)


@functools.lru_cache(maxsize=64)
def _tiled(row: torch.Tensor, w: int) -> torch.Tensor:
    """``row`` ``w`` times over, one copy for every rank (remembered: ``row`` is
    ``_row_bytes``'s, itself remembered). Read only."""
    return row.repeat(w)


def _joined(pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    """The flat uint8 ``pieces`` one after the other as one tensor: a view when they
    already lie so in one tensor's memory, else a copy."""
    first = pieces[0]
    total = sum(p.numel() for p in pieces)
    at = first.data_ptr()
    for p in pieces:
        if p.data_ptr() != at or not p.is_contiguous():
            return torch.cat(list(pieces))
        at += p.numel()
    storage = first.untyped_storage()
    if first.storage_offset() + total > storage.nbytes():
        return torch.cat(list(pieces))
    return first.as_strided((total,), (1,), first.storage_offset())


def _direct_by_messages(
    call: FamilyCall,
    info: GroupInfo,
    direct: DirectRound,
    blocks: Sequence[torch.Tensor] | None,
    rows: torch.Tensor,
    buf: torch.Tensor,
) -> None:
    """The direct round elsewhere (NCCL): to every peer this rank's row and its block,
    zero-padded to the pair's slot, as two messages; every peer's received in place
    (``send_receive``, all 4 (W - 1) in one batch), this rank's own block copied in
    meanwhile."""
    w, rank = info.world_size, info.rank
    device = rows.device
    row = direct.row.to(device)
    zero = torch.zeros(1, dtype=torch.uint8, device=device)
    each_row = rows.view(w, -1).unbind(0)
    own: tuple[torch.Tensor, torch.Tensor] | None = None
    messages: list[tuple[torch.Tensor, ...]] = []
    for k in range(w):
        slot = direct.room[rank * w + k]
        piece = blocks[k] if blocks is not None else zero[:0]
        if k == rank:
            each_row[k].copy_(row)
            if piece.numel():
                own = (buf[direct.starts[k] : direct.starts[k] + piece.numel()], piece)
            messages.append(())
            continue
        if slot:
            sent = torch.zeros(slot, dtype=torch.uint8, device=device)
            sent[: piece.numel()].copy_(piece)
        else:
            sent = zero[:0]
        messages.append((row, sent))
    regions = [buf[s : s + n] for s, n in zip(direct.starts, direct.in_slots, strict=True)]
    send_receive(
        messages,
        list(zip(each_row, regions, strict=True)),
        info,
        what=f"send/recv x{4 * (w - 1)} ({call.kind} metadata exchange)",
        tag=BLOCKS_TAG,
        meanwhile=None if own is None else functools.partial(copy_bytes, *own),
    )


def direct_exchanged(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    state: FusedState,
    direct: DirectRound,
    buf: torch.Tensor,
    raw: bytes,
) -> Exchanged:
    """What a direct round received (``buf``, its rows' bytes ``raw``), as
    ``Exchanged``."""
    out, flags = _read_rows(call, raw, info.world_size, pg)
    regions = [buf[s : s + n] for s, n in zip(direct.starts, direct.in_slots, strict=True)]
    cut = region_cutter(buf, direct.starts)
    return Exchanged(out, regions, flags, state, call.kind, cut, None, raw, direct)


@dataclass(frozen=True)
class PackedRound:
    """The packed wide round of one state on one rank (a pure function of the slots and
    this rank's row): ``row``, its bytes; message ``k`` to rank ``k`` is ``out_bytes[k]``
    bytes (the row in ``head`` bytes, then the block), message ``j`` from rank ``j``
    ``in_bytes[j]``, landing at ``offsets[j]``, its block at ``starts[j]``; ``room``:
    the slots (``wide_blocks``)."""

    row: torch.Tensor
    out_bytes: tuple[int, ...]
    in_bytes: tuple[int, ...]
    offsets: tuple[int, ...]
    head: int
    starts: tuple[int, ...]
    room: tuple[int, ...]


def packed_round(row: torch.Tensor, room: Sequence[int], rank: int, w: int) -> PackedRound:
    """The ``PackedRound`` of ``row`` and the slots ``room`` on ``rank``."""
    head = whole_16(row.numel())
    out_bytes, in_bytes, offsets = _packed_splits(tuple(room), rank, w, head)
    starts = tuple(o + head for o in offsets)
    return PackedRound(row, out_bytes, in_bytes, offsets, head, starts, tuple(room))


def run_packed(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    packed: PackedRound,
    send: torch.Tensor,
) -> tuple[torch.Tensor, bytes]:
    """One packed round of the messages in ``send`` (``fill_packed``'s): one alltoallv,
    and the receive buffer with the received rows' bytes (``_landed_rows``)."""
    buf = handed_back_buffer(pg, "blocks", sum(packed.in_bytes), info.default_device())
    all_to_all_uneven(
        buf,
        send,
        output_splits=packed.in_bytes,
        input_splits=packed.out_bytes,
        info=info,
        what=f"all_to_all ({call.kind} metadata exchange)",
    )
    hand_back(pg, "blocks", buf)  # kept for a later call once nothing refers to it
    return buf, _landed_rows(buf, packed.offsets, packed.row.numel())


def packed_exchanged(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    state: FusedState,
    packed: PackedRound,
    buf: torch.Tensor,
    raw: bytes,
) -> Exchanged:
    """What a packed round received (``buf``, its rows' bytes ``raw``), as
    ``Exchanged``."""
    w, rank = info.world_size, info.rank
    out, flags = _read_rows(call, raw, w, pg)
    regions = [buf[s : s + packed.room[j * w + rank]] for j, s in enumerate(packed.starts)]
    cut = region_cutter(buf, packed.starts)
    return Exchanged(out, regions, flags, state, call.kind, cut, packed, raw)


def _packed_wide_exchange(
    call: FamilyCall,
    info: GroupInfo,
    row: torch.Tensor,
    blocks: Sequence[torch.Tensor] | None,
    state: FusedState,
    pg: dist.ProcessGroup,
    room: Sequence[int],
) -> Exchanged:
    """The wide round packed (``PACKED_WIDE_MAX``): one alltoallv whose message from
    rank ``j`` to rank ``k`` is ``j``'s row, then its block for ``k`` in a slot of
    ``wide[j * W + k]`` bytes (the rest zeros), each part rounded up to 16 bytes. The
    blocks are read where they landed, and closed up in place (``region_cutter``)."""
    packed = packed_round(row, room, info.rank, info.world_size)
    buf, raw = send_packed(call, info, pg, packed, blocks)
    return packed_exchanged(call, info, pg, state, packed, buf, raw)


def send_packed(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    packed: PackedRound,
    blocks: Sequence[torch.Tensor] | None,
) -> tuple[torch.Tensor, bytes]:
    """One packed round of ``packed.row`` and ``blocks`` (``None``: none rides), from
    the group's kept send buffer filled for it (``fill_packed``; tensor copies off the
    CPU or for blocks that are not plain): ``run_packed``'s receive buffer and rows."""
    row = packed.row
    send = handed_back_buffer(pg, "packed-send", sum(packed.out_bytes), info.default_device())
    if send.device.type == "cpu" and (blocks is None or all(plain(b) for b in blocks)):
        fill_packed(send, row, blocks, packed.out_bytes, packed.head)
    else:
        _copy_packed(send, row.to(send.device), blocks, packed.out_bytes, packed.head)
    buf, raw = run_packed(call, info, pg, packed, send)
    hand_back(pg, "packed-send", send)
    return buf, raw


def fill_packed(
    send: torch.Tensor,
    row: torch.Tensor,
    blocks: Sequence[torch.Tensor] | None,
    out_bytes: Sequence[int],
    head: int,
) -> None:
    """The packed round's send buffer on the CPU (``send`` and every block plain):
    message ``k`` is ``row``, zeros to ``head`` bytes, block ``k``, zeros to
    ``out_bytes[k]`` (``fill_packed_at``)."""
    at = None if blocks is None else [(b.data_ptr(), b.numel()) for b in blocks]
    fill_packed_at(send, row, at, out_bytes, head)


def fill_packed_at(
    send: torch.Tensor,
    row: torch.Tensor,
    blocks: Sequence[tuple[int, int]] | None,
    out_bytes: Sequence[int],
    head: int,
) -> None:
    """``fill_packed`` of blocks given as (address, bytes), written by ``memmove`` and
    ``memset`` (no tensor op per piece)."""
    base, length, source = send.data_ptr(), row.numel(), row.data_ptr()
    at = 0
    for k, size in enumerate(out_bytes):
        ctypes.memmove(base + at, source, length)
        if length < head:
            ctypes.memset(base + at + length, 0, head - length)  # no stale bytes leave
        n = 0
        if blocks is not None:
            address, n = blocks[k]
            if n:
                ctypes.memmove(base + at + head, address, n)
        if head + n < size:
            ctypes.memset(base + at + head + n, 0, size - head - n)
        at += size


def _copy_packed(
    send: torch.Tensor,
    row: torch.Tensor,
    blocks: Sequence[torch.Tensor] | None,
    out_bytes: Sequence[int],
    head: int,
) -> None:
    """``fill_packed`` by tensor copies (any device, any block)."""
    length = row.numel()
    at = 0
    for k, size in enumerate(out_bytes):
        send[at : at + length].copy_(row)
        piece = blocks[k] if blocks is not None else row[:0]
        n = piece.numel()
        if n:
            send[at + head : at + head + n].copy_(piece)
        if length < head:
            send[at + length : at + head].zero_()  # no stale bytes leave
        if head + n < size:
            send[at + head + n : at + size].zero_()
        at += size


def _check_kinds(kind: CollectiveName, marks: Sequence[tuple[int, int]]) -> None:
    """Raise ``ProtocolMismatchError`` unless every rank's row (``marks[r]``: its magic
    and kind code) is a ``kind`` call's: a row vargather cannot read names its rank; a
    peer calling another collective of the round is ``check_same_collective``'s."""
    kind_code = COLLECTIVES[kind].code
    if all(magic == ROW_MAGIC and code == kind_code for magic, code in marks):
        return
    for r, (magic, code) in enumerate(marks):
        found_kind = by_code(code)
        if magic != ROW_MAGIC or found_kind is None or found_kind.round != "all_to_all":
            raise ProtocolMismatchError(
                f"{kind}: rank {r} sent metadata of another collective or vargather "
                f"version: expected a {kind} call on every rank of the group",
                ranks=[r],
            )
    check_same_collective([code for _, code in marks])


def call_key(x: object, *args: object) -> tuple[object, ...] | None:
    """What this rank's call of a plain strided tensor ``x`` with ``args`` is a function
    of (``None`` for other calls): ``x``'s metadata (shape, strides, dtype, device,
    whether a gradient is wanted, its lazy bits) and each argument with its type (so
    ``validate=1`` is not ``True``), lists of ints as tuples. The steady path's key
    (``known_call``)."""
    if type(x) is not torch.Tensor or x.layout != torch.strided or x.is_nested:
        return None
    key: list[object] = [x.shape, x.stride(), x.dtype, x.device, x.is_conj(), x.is_neg()]
    key.append(x.requires_grad and torch.is_grad_enabled())
    for a in args:
        if type(a) in (list, tuple):
            assert isinstance(a, (list, tuple))  # for mypy: checked just above
            if not all(type(n) is int for n in a):
                return None
            key.append((type(a), tuple(a)))
        elif a is None or type(a) in (int, str, bool, float, timedelta):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)


def known_call(
    name: CollectiveName,
    key: tuple[object, ...] | None,
    info: GroupInfo,
    make: Callable[[], FamilyCall],
) -> FamilyCall:
    """This rank's call (``make()``: ``check_tensor`` and the collective's own checks),
    or, on the steady path, the one ``make`` returned for the same ``key``
    (``call_key``) last time on this group: a call is a pure function of its key and
    the group (kept in the collective's ``Memory.known``)."""
    pg = process_group(info) if key is not None and info.communicates else None
    if pg is None:
        return make()
    mem = memory(pg, name)
    known = mem.known
    if known is not None and known[0] == key and isinstance(known[1], FamilyCall):
        return known[1]
    call = make()
    mem.known = (key, call) if key is not None else None
    return call


@dataclass(frozen=True)
class RoundSpec(Generic[T]):
    """What a collective of the all_to_all pattern hands the round (``run_round``), from
    its own module: nothing of it is the round's. ``validate(rows, rank=)``: every
    rank's rows to the call's verdict, or the error every rank raises alike (a pure
    function of the rows; wrap it in ``ValidatedOnce``); ``outgoing(x, call, info)``:
    this rank's payload as flat bytes and the bytes of its block for each rank, in rank
    order (an empty block to a rank that gets nothing); ``blocks(verdict, x, call,
    info)``: from the verdict, the bytes rank ``j`` sends rank ``k`` at ``j * W + k``,
    the same on every rank. Its extra row words ride in ``FamilyCall.extras``."""

    validate: Callable[..., T]
    outgoing: Callable[[object, FamilyCall, GroupInfo], tuple[torch.Tensor, Sequence[int]]]
    blocks: Callable[[T, object, FamilyCall, GroupInfo], Sequence[int]]


def run_round(
    spec: RoundSpec[T], call: FamilyCall, x: object, info: GroupInfo
) -> tuple[T, tuple[torch.Tensor, ...] | None]:
    """A validated call's round on a communicating group: every rank's row and the
    blocks that fit (``exchange_fused``), the verdict (``spec.validate``: the same
    error on every rank, or the same verdict), the state moved (``settle``) and, when
    every block rode, the block each rank sent this rank (else ``None``: the
    collective's payload collective runs)."""
    ex = exchange_fused(call, info, x, functools.partial(spec.outgoing, x, call, info))
    verdict = spec.validate(ex.rows, rank=info.rank)
    return verdict, settle(ex, info, spec.blocks(verdict, x, call, info))


def exchange(call: FamilyCall, info: GroupInfo) -> list[Row]:
    """Every rank's rows (``exchange_fused`` without a payload)."""
    return exchange_fused(call, info).rows


def settle(
    ex: Exchanged, info: GroupInfo, blocks: Sequence[int]
) -> tuple[torch.Tensor, ...] | None:
    """After the rows of ``ex`` validated: advance the group's state (every rank alike;
    ``blocks[j * W + k]``: the bytes rank ``j`` sends rank ``k``, from the validated
    rows) and, when every rank's slots hold its blocks, the block each rank ``j``
    sent this rank (``None``: the payload collective runs)."""
    if ex.slots is None:
        return None
    w, rank = info.world_size, info.rank
    fusable = all(f & _ELIGIBLE for f in ex.flags)
    after = advance_blocks(ex.state, fusable=fusable, blocks=blocks, world=w)
    if after is not ex.state:
        set_state(process_group(info), ex.kind, after)
    # the slots the round ran with: a replayed packed round's own (the equal slots
    # of a gather round that a resized call rode, too), else the state's
    room = ex.packed.room if ex.packed is not None else block_room(ex.state, w)
    if not all(f & _USED for f in ex.flags) or any(
        n > c for n, c in zip(blocks, room, strict=True)
    ):
        return None
    return tuple(ex.slots[j][: blocks[j * w + rank]] for j in range(w))


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

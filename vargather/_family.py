"""The all_to_all pattern's round: every rank's row to every rank, blocks where they go.

Where it sits: above ``_rows``, ``_round_state`` and ``_round_buffers``; below
``_steady`` and the collectives that ride it (``docs/architecture.md``, "Adding a
collective to the round"). ``docs/family.md`` ("One round at every size") has the
design: rank ``j`` sends every rank its row (``_wire.encode_row``) and, when every
block fits its slot and it has no local problem, block ``k`` of its payload to rank
``k``, in lengths that are a function of the group's one state of this round alone, so
every rank sends the same lengths whichever collective it called; nothing of a slot is
read before the rows validated. The round is the **equal round** (``state.wide``
empty: a packed round of equal slots, byte for byte one equal-split all_to_all of a row
and a slot), or the wide round (``W * W`` learned slots), packed (``PackedRound``) or
by direct sends (``DirectRound``). ``settle`` moves the state and hands back the blocks
when every rank's rode. A rank in this round beside one in the all_gather-shaped round
issues operations the backend never pairs: both raise the named timeout, never a
misread (``docs/misuse.md``).
"""

from __future__ import annotations

import array
import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import torch
import torch.distributed as dist

from ._args import CallRecord
from ._collectives import COLLECTIVES, CollectiveName
from ._comm import BLOCKS_TAG, all_to_all_round, all_to_all_uneven, send_receive
from ._group import GroupInfo, process_group
from ._round_buffers import (
    Cut,
    copy_bytes,
    hand_back,
    handed_back_buffer,
    landed_bytes,
    move_left,
    plain,
    region_cutter,
)
from ._round_state import (
    FRESH,
    FusedState,
    Last,
    advance_blocks,
    block_room,
    is_wide,
    memory,
    set_state,
    whole_16,
    wide_blocks,
)
from ._rows import FamilyCall, Row, decode_rows
from ._wire import encode_row

_ELIGIBLE: Final = 1  # flag word: no local problem, x on the exchange's device
_USED: Final = 2  # flag word: the payload slot holds this rank's whole x


@dataclass(frozen=True)
class Exchanged:
    """Every rank's row and flag word and, unread until the rows validated, the slot
    each rank ``j`` sent this rank (``slots[j]``, the regions ``cut`` cuts from); the
    state the round was sized from, the collective whose round it was, the round that
    ran (``found``) and the received rows' bytes (``raw``)."""

    rows: list[Row]
    slots: Sequence[torch.Tensor]
    flags: tuple[int, ...]
    state: FusedState
    kind: CollectiveName
    cut: Cut
    found: PackedRound | DirectRound
    raw: bytes


Outgoing = Callable[[], tuple[torch.Tensor, Sequence[int]]]
"""What a rank would send in its payload collective: its flat bytes, block ``r``
(``sizes[r]`` bytes) for rank ``r``, in rank order. Called only for an eligible call."""


def exchange_fused(
    call: FamilyCall, info: GroupInfo, x: object = None, outgoing: Outgoing | None = None
) -> Exchanged:
    """Every rank's row and this rank's slots from the round the group's state gives,
    carrying this rank's blocks when it is eligible: in the equal round only when every
    block fits its slot, in the wide round each cut to its slot (a larger block takes a
    second round, which every rank reads in the rows). A row vargather cannot read, or
    another collective's, raises ``ProtocolMismatchError`` on every rank."""
    w, rank = info.world_size, info.rank
    pg = process_group(info)
    state = FRESH if pg is None else memory(pg, call.kind).shared.state
    room, wide = block_room(state, w), is_wide(state, w)
    flag = 0
    blocks: list[torch.Tensor] | None = None
    if (  # eligible: no local problem, a strided tensor on the exchange's device
        pg is not None
        and outgoing is not None
        and call.record.problem is None
        and isinstance(x, torch.Tensor)
        and x.device.type == info.default_device().type
        and x.layout == torch.strided
    ):
        flag = _ELIGIBLE
        if wide or x.numel() * x.element_size() <= state.capacity * w:  # else one is larger
            flat, sizes = outgoing()
            out_slots = room[rank * w : (rank + 1) * w]
            fits = all(n <= slot for n, slot in zip(sizes, out_slots, strict=True))
            if fits or wide:
                split = torch.split(flat, list(sizes))
                blocks = [b[:slot] for b, slot in zip(split, out_slots, strict=True)]
            flag |= _USED if fits else 0
    row = _row_bytes(call.record, COLLECTIVES[call.kind].code, call.extras, w, flag)
    found: PackedRound | DirectRound
    if goes_direct(state, w):
        found = direct_round(row, room, rank, w, info.backend in SHORT_MESSAGES)
    else:
        found = packed_round(row, room, rank, w)
    buf, raw = send_round(call, info, pg, found, blocks)
    return landed(call, info, pg, state, found, buf, raw)


def _read_rows(
    call: FamilyCall, raw: bytes, w: int, pg: dist.ProcessGroup | None
) -> tuple[list[Row], tuple[int, ...]]:
    """``decode_rows`` of ``raw``; the very bytes of the last rows read on this group
    give the very same (cached) list, so a caller may cache what it validated from it
    by identity."""
    mem = None if pg is None else memory(pg, call.kind)
    last = None if mem is None else mem.last
    if last is not None and last.seen == raw:
        rows, flags = last.found
        return rows, flags
    out, flags = decode_rows(call, raw, w)
    if mem is not None:
        mem.last = Last(raw, (out, flags))
    return out, flags


PACKED_WIDE_MAX: int = 512 * 1024
"""Largest slot (bytes, one rank to one rank) with which the wide round travels
*packed*: one alltoallv whose message to each peer is this rank's row and its block,
copied into one send buffer, instead of the rows and the blocks apart (``run_direct``):
apart costs a second collective, packing two copies of the blocks, which outweigh it
from about half a MiB a block (4 gloo ranks, CPU per call against
``all_to_all_single``'s, packed / direct: 170 KiB blocks 1.19 / 1.28x, 670 KiB 1.40 /
1.17x)."""


SHORT_MESSAGES: tuple[str, ...] = ("gloo",)
"""Backends whose receive takes a message shorter than its buffer (gloo: a receive of
``n`` bytes takes any message of at most ``n``, in an alltoallv too), so the direct
wide round sends a block as it lies, in two alltoallvs; elsewhere every message is
exactly its slot."""


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


def goes_direct(state: FusedState, world: int) -> bool:
    """Whether the all_to_all-shaped round of ``state`` is the direct wide round
    (``DirectRound``), else packed: a function of the state, so every rank picks the
    same; a remembered round is replayed only in a state that picks its kind
    (``_all_to_all._resized_call``: slots alike are not enough once
    ``PACKED_WIDE_MAX`` is below the equal round's)."""
    return is_wide(state, world) and max(wide_blocks(state), default=0) > PACKED_WIDE_MAX


@dataclass(frozen=True)
class DirectRound:
    """The wide round by direct sends of one state on one rank (a pure function of the
    slots, this rank's row and the backend): to every peer ``k``, this rank's ``row``
    and its block for ``k``, into a slot of ``room[rank * W + k]`` bytes; rank ``j``'s
    block received into its region of one buffer of ``size`` bytes (``in_slots[j]``
    bytes at ``starts[j]``, a 16-byte boundary: any dtype views it). ``exact`` (gloo,
    ``SHORT_MESSAGES``): two alltoallvs posted together, each block only its own bytes
    as it lies (``_direct_by_all_to_all``); else ``4 (W - 1)`` messages in one batch
    under ``BLOCKS_TAG``, each block message exactly its slot (``_direct_by_messages``)."""

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
    """The ``DirectRound`` of ``row`` and the slots ``room`` on ``rank`` (remembered:
    ``row`` is ``_row_bytes``'s, itself remembered)."""
    in_slots = tuple(room[j * w + rank] for j in range(w))
    starts = [0] * (w + 1)
    for j in range(w):
        starts[j + 1] = whole_16(starts[j] + in_slots[j])
    return DirectRound(row, room, in_slots, tuple(starts[:w]), starts[w], exact)


def resized_round(
    found: PackedRound | DirectRound, call: FamilyCall, info: GroupInfo
) -> PackedRound | DirectRound:
    """``found``'s round carrying ``call``'s row, for a call whose every block fits its
    slot, from a rank without a local problem (its flag word says its blocks ride)."""
    w = info.world_size
    flag = _ELIGIBLE | _USED
    row = _row_bytes(call.record, COLLECTIVES[call.kind].code, call.extras, w, flag)
    if isinstance(found, DirectRound):
        return direct_round(row, found.room, info.rank, w, found.exact)
    return packed_round(row, found.room, info.rank, w)


def send_round(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    found: PackedRound | DirectRound,
    blocks: Sequence[torch.Tensor] | None,
) -> tuple[torch.Tensor, bytes]:
    """One round of ``found`` carrying ``blocks`` (``None``: none rides): its receive
    buffer and the received rows' bytes."""
    if isinstance(found, DirectRound):
        return run_direct(call, info, pg, found, blocks)
    return send_packed(call, info, pg, found, blocks)


def run_direct(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    direct: DirectRound,
    blocks: Sequence[torch.Tensor] | None,
) -> tuple[torch.Tensor, bytes]:
    """One direct round of this rank's ``blocks`` (``None``: none rides): the receive
    buffer, its regions filled, and the received rows' bytes."""
    w = info.world_size
    device = info.default_device()
    length = direct.row.numel()
    rows = torch.empty(w * length, dtype=torch.uint8, device=device)
    buf = handed_back_buffer(pg, "blocks", direct.size, device)
    move = _direct_by_all_to_all if direct.exact else _direct_by_messages
    move(call, info, direct, blocks, rows, buf)
    hand_back(pg, "blocks", buf)  # kept for a later call once nothing refers to it
    return buf, landed_bytes(rows, [j * length for j in range(w)], length)


def _direct_by_all_to_all(
    call: FamilyCall,
    info: GroupInfo,
    direct: DirectRound,
    blocks: Sequence[torch.Tensor] | None,
    rows: torch.Tensor,
    buf: torch.Tensor,
) -> None:
    """The direct round when ``direct.exact``: fills ``rows`` (every rank's row, rank by
    rank) and ``buf``. This rank's own block rides in the second alltoallv too, copied
    by the backend, which wants its receive room equal to its length: it lands at the
    end of its region (the room before it goes to the previous rank's region, or is left
    out for rank 0) and is moved to the region's start after, unless it fills the region
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
    """``row`` ``w`` times over, one copy for every rank (remembered as ``direct_round``).
    Read only."""
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
    """The direct round when not ``direct.exact`` (``DirectRound``): fills ``rows`` and
    ``buf`` as ``_direct_by_all_to_all``, this rank's own block copied in meanwhile."""
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


@dataclass(frozen=True)
class PackedRound:
    """The packed round of one state on one rank (a pure function of the slots and this
    rank's ``row``): message ``k`` to rank ``k`` is ``out_bytes[k]`` bytes (the row in
    ``head`` bytes, then the block), message ``j`` from rank ``j`` ``in_bytes[j]``,
    landing at ``offsets[j]``, its block at ``starts[j]``; ``room``: the slots."""

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
    pg: dist.ProcessGroup | None,
    packed: PackedRound,
    send: torch.Tensor,
) -> tuple[torch.Tensor, bytes]:
    """One packed round (one alltoallv) of the messages in ``send``: the receive buffer
    and the received rows' bytes."""
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
    return buf, landed_bytes(buf, packed.offsets, packed.row.numel())


def landed(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    state: FusedState,
    found: PackedRound | DirectRound,
    buf: torch.Tensor,
    raw: bytes,
) -> Exchanged:
    """What a packed round or the direct sends (``found``, run afresh or replayed)
    received (``buf``, its rows' bytes ``raw``), as ``Exchanged``."""
    w, rank = info.world_size, info.rank
    out, flags = _read_rows(call, raw, w, pg)
    regions = [buf[s : s + found.room[j * w + rank]] for j, s in enumerate(found.starts)]
    cut = region_cutter(buf, found.starts)
    return Exchanged(out, regions, flags, state, call.kind, cut, found, raw)


def send_packed(
    call: FamilyCall,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    packed: PackedRound,
    blocks: Sequence[torch.Tensor] | None,
) -> tuple[torch.Tensor, bytes]:
    """``run_packed`` of ``packed.row`` and ``blocks`` (``None``: none rides), from the
    group's kept send buffer filled for it (by tensor copies off the CPU or for blocks
    that are not plain)."""
    row = packed.row
    send = handed_back_buffer(pg, "packed-send", sum(packed.out_bytes), info.default_device())
    if send.device.type == "cpu" and (blocks is None or all(plain(b) for b in blocks)):
        at = None if blocks is None else [(b.data_ptr(), b.numel()) for b in blocks]
        fill_packed(send, row, at, packed.out_bytes, packed.head)
    else:
        _copy_packed(send, row.to(send.device), blocks, packed.out_bytes, packed.head)
    buf, raw = run_packed(call, info, pg, packed, send)
    hand_back(pg, "packed-send", send)
    return buf, raw


def fill_packed(
    send: torch.Tensor,
    row: torch.Tensor,
    blocks: Sequence[tuple[int, int]] | None,
    out_bytes: Sequence[int],
    head: int,
) -> None:
    """The packed round's send buffer on the CPU (``send`` plain; ``blocks``: each
    block's address and bytes): message ``k`` is ``row``, zeros to ``head`` bytes, block
    ``k``, zeros to ``out_bytes[k]``, written by ``memmove`` and ``memset`` (no tensor
    op per piece)."""
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


def known_call(
    name: CollectiveName,
    key: tuple[object, ...] | None,
    info: GroupInfo,
    make: Callable[[], FamilyCall],
) -> FamilyCall:
    """This rank's call (``make()``), or the one ``make`` returned for the same ``key``
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


def settle(
    ex: Exchanged, info: GroupInfo, blocks: Sequence[int]
) -> tuple[torch.Tensor, ...] | None:
    """After the rows of ``ex`` validated: advance the group's state (``blocks[j * W +
    k]``: the bytes rank ``j`` sends rank ``k``) and, when every rank's slots hold its
    blocks, the block each rank ``j`` sent this rank (``None``: the payload collective
    runs)."""
    w, rank = info.world_size, info.rank
    fusable = all(f & _ELIGIBLE for f in ex.flags)
    after = advance_blocks(ex.state, fusable=fusable, blocks=blocks, world=w)
    if after is not ex.state:
        set_state(process_group(info), ex.kind, after)
    room = ex.found.room  # the slots the round ran with
    if not all(f & _USED for f in ex.flags) or any(
        n > c for n, c in zip(blocks, room, strict=True)
    ):
        return None
    return tuple(ex.slots[j][: blocks[j * w + rank]] for j in range(w))

"""The all_gather-shaped round: the metadata exchange with the payload riding along.

Where it sits: above ``_transport`` (which moves the payload when it does not ride),
the state policy (``_round_state``) and the kept buffers (``_round_buffers``); below
the collectives that run it (``all_gather_v``, ``all_gather_v_coalesced``,
``all_gather_list``). ``docs/architecture.md`` ("The one round") has the design: every
rank sends lengths derived from the group's ``FusedState`` alone, so nothing but
agreed-length bytes moves before validation, and nothing received is read but the
compact headers until they validated. The round is the **gather round** (``state.wide``
empty: ``_gather_blocks``), the **wide round** (``_wide_round``, its bytes laid out by
``WideLayout``) or the **steady path** (``steady_exchange``: the group's last steady
round again). Every rank then decides from the headers alone (``_decide``): compact,
the full path (``_full_path``), fused or not; the last compact verdict is cached in the
collective's ``Memory.last`` (``_resized``: only the gathered sizes changed).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import torch
import torch.distributed as dist

from ._args import CallRecord, CheckedCall
from ._collectives import COLLECTIVES, CollectiveName
from ._comm import all_gather_equal, exchange_with_each, send_receive
from ._errors import ArgumentMismatchError, ProtocolMismatchError, VarGatherError
from ._exchange import (
    _disagreement,
    check_same_collective,
    exchange_records,
    plan_layout,
    validate_records,
)
from ._group import GroupInfo, process_group
from ._layout import Layout
from ._round_buffers import (
    Cut,
    Round,
    copy_payload,
    hand_back,
    handed_back_buffer,
    header_bytes,
    landed_bytes,
    pack,
    payload_views,
    read_headers,
    region_cutter,
    round_for,
    unpack,
)
from ._round_state import FRESH, FUSED_MAX_BYTES, MEMORY, FusedState, Last, Memory, advance, memory
from ._transport import Transport, choose_transport
from ._wire import (
    FLAG_ELIGIBLE,
    FLAG_LONG,
    FLAG_PROBLEM,
    HEADER_BYTES,
    SHAPE_SLOTS,
    call_flags,
    decode_header,
    header_count,
    header_flags,
    header_kind,
    magic_mismatch,
    size_word_at,
    sizes_len_word_at,
    split_headers,
)


@dataclass(frozen=True)
class Exchanged:
    """What the fused round (and its fallback) found: each tensor's ``Layout`` and, when
    the payload rode along, the gathered results."""

    layouts: tuple[Layout, ...]
    outputs: list[torch.Tensor] | None


def named(err: VarGatherError, index: int) -> VarGatherError:
    """``err`` for tensor ``index`` of a coalesced call (same class, same ranks)."""
    text = str(err).removeprefix("all_gather_v: ")
    return type(err)(f"all_gather_v_coalesced: tensor #{index}: {text}", ranks=err.ranks)


def _full_path(
    kind: CollectiveName,
    calls: Sequence[CheckedCall],
    counts: Sequence[int],
    kinds: Sequence[int],
    info: GroupInfo,
) -> tuple[Layout, ...]:
    """The exchange of full records: the same error on every rank, or the layouts.
    Decided from every rank's header ``counts`` and ``kinds`` alone: other collectives
    or differing tensor counts raise at once, else one all_gather of the records."""
    check_same_collective(kinds)
    if kind == "all_gather_v":
        return (plan_layout(calls[0], info),)
    found = _disagreement("number of tensors", list(counts))
    if found is not None:
        raise ArgumentMismatchError(f"{kind}: {found[0]}", ranks=found[1])
    if not calls:
        return ()
    per_rank = exchange_records([c.record for c in calls], info)
    layouts = []
    for i in range(len(calls)):
        try:
            layouts.append(validate_records([row[i] for row in per_rank], rank=info.rank))
        except VarGatherError as err:
            raise named(err, i) from None
    return tuple(layouts)


def exchange(
    kind: CollectiveName,
    calls: Sequence[CheckedCall],
    tensors: Sequence[object],
    info: GroupInfo,
    *,
    eligible: bool,
    parts: Sequence[torch.Tensor] | None = None,
    steady_key: tuple[object, ...] | None = None,
) -> Exchanged:
    """The fused round for a validated call on a communicating group: the same error on
    every rank, or the same layouts (and, when fused, the gathered tensors).

    ``calls``: one checked call per tensor (a call-level problem sits in ``calls[0]``);
    ``eligible``: whether the caller lets the payload ride (``transport="auto"``, not a
    layout-only call); ``parts``: this rank's payload as tensors whose bytes, one after
    the other, are ``tensors``' (``all_gather_list``: its carrier's metadata, then its
    tensor), so the tensor they would be joined into is never made; ``steady_key``: the
    caller's key of a call ``steady_exchange`` could serve.
    """
    w = info.world_size
    pg = process_group(info)
    mem = None if pg is None else memory(pg, kind)
    state = FRESH if mem is None else mem.shared.state
    slots = state.slots
    wide = state.wide if len(state.wide) == w else ()
    capacity = min(state.capacity, FUSED_MAX_BYTES)
    room = wide or (capacity,) * w
    k = len(calls)
    device = info.default_device()
    records = tuple(c.record for c in calls)
    payload = tensors if parts is None else parts
    local_ok = (
        eligible
        and all(rec.problem is None and rec.ndim <= SHAPE_SLOTS for rec in records)
        and all(isinstance(t, torch.Tensor) and t.device.type == device.type for t in payload)
    )
    flags = call_flags(eligible=local_ok, kind_code=COLLECTIVES[kind].code)
    own = [t for t in payload if isinstance(t, torch.Tensor)] if local_ok and k <= slots else []
    nbytes = sum(t.numel() * t.element_size() for t in own)
    if nbytes > room[info.rank]:
        own = []
    if wide:
        header_key = (records, k, flags)
        return _wide_round(
            kind, state, calls, header_key, own, nbytes, info, mem, pg, wide, steady_key
        )
    rnd = round_for(mem, w, slots, capacity, device)
    if rnd is not None and rnd.lock.acquire(blocking=False):
        try:
            rnd.fill((records, k, flags), own, nbytes)
            recv = rnd.receive(k == 1 and _adjacent(records[0]), pg)
            _gather_blocks(recv, rnd.send, info)
            last = None if mem is None else mem.last
            found = _decide(kind, state, calls, rnd.rows(recv), info, mem, rnd.cutter(recv), room)
            if recv is not rnd.recv:
                hand_back(pg, "gather", recv)
            elif mem is not None and steady_key is not None and mem.last is last:
                # the last call's very headers again (a new verdict replaces
                # ``mem.last``): a steady round, worth remembering
                raw = landed_bytes(recv, rnd.header_at, rnd.head)
                _remember(mem, steady_key, calls, state, found, rnd.dirty, raw, rnd=rnd)
            return found
        finally:
            rnd.lock.release()
    # Fresh buffers: another device than the CPU, or a thread already using this
    # group's buffers.
    head = slots * HEADER_BYTES
    block = head + capacity
    send = torch.empty(block, dtype=torch.uint8, device=device)
    send[:head].copy_(header_bytes(slots, records, k, flags))
    copy_payload(payload_views(send, head, own), own)
    send[head + (nbytes if own else 0) :].zero_()  # no stale memory to the peers
    gathered = torch.empty(w * block, dtype=torch.uint8, device=device)
    _gather_blocks(gathered, send, info)
    grid = gathered.view(w, block)
    rows = read_headers(gathered, [r * block for r in range(w)], slots)

    def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        return unpack([grid[r, head : head + needs[r]] for r in range(w)], layouts)

    return _decide(kind, state, calls, rows, info, mem, cut, room)


def _gather_blocks(recv: torch.Tensor, send: torch.Tensor, info: GroupInfo) -> None:
    """The gather round's transport: every rank's equal ``send`` block into row r of
    ``recv``. On gloo by direct sends (``exchange_with_each``), faster than gloo's ring
    all_gather at every size measured (``docs/performance.md``); elsewhere one equal
    all_gather (NCCL's is one kernel)."""
    if info.backend != "gloo":
        all_gather_equal(recv, send, info, what="all_gather (metadata exchange)")
        return
    block = send.numel()
    rows = [recv[r * block : (r + 1) * block] for r in range(info.world_size)]
    rows[info.rank].copy_(send)
    exchange_with_each(
        rows, info, what=f"send/recv x{2 * (info.world_size - 1)} (metadata exchange)"
    )


def _wide_round(
    kind: CollectiveName,
    state: FusedState,
    calls: Sequence[CheckedCall],
    header_key: tuple[tuple[CallRecord, ...], int, int],
    own: Sequence[torch.Tensor],
    nbytes: int,
    info: GroupInfo,
    mem: Memory | None,
    pg: dist.ProcessGroup | None,
    wide: tuple[int, ...],
    steady_key: tuple[object, ...] | None = None,
) -> Exchanged:
    """The wide round (its bytes laid out by ``WideLayout``), remembered for
    ``steady_exchange`` as ``exchange`` says."""
    rank = info.rank
    records, k, flags = header_key
    head = state.slots * HEADER_BYTES
    device = info.default_device()
    lay = wide_layout(wide, head)
    buf = handed_back_buffer(pg, "wide", lay.size, device)
    mine = lay.payload[rank]
    copy_payload(payload_views(buf, mine, own), own)
    filled = nbytes if own else 0
    buf[mine + filled : mine + wide[rank]].zero_()  # no stale memory to the peers
    ours = lay.heads[rank]
    header = header_bytes(state.slots, records, k, flags)
    buf[ours : ours + head].copy_(header.to(device))
    _exchange_regions(buf, lay, info)
    steady = steady_key is not None and device.type == "cpu"
    raw = landed_bytes(buf, lay.heads, head) if steady else None  # before the close-up
    cut = region_cutter(buf, lay.payload)
    rows = read_headers(buf, lay.heads, state.slots)
    found = _decide(kind, state, calls, rows, info, mem, cut, wide)
    hand_back(pg, "wide", buf)
    if raw is not None and mem is not None and steady_key is not None:
        sent = header.numpy().tobytes()
        _remember(mem, steady_key, calls, state, found, filled, raw, wide=lay, header=sent)
    return found


HEADERS_APART_MIN: Final = 4 << 20
"""From this many payload bytes in all (``sum(wide)``) the wide round sends each rank's
headers as a message of their own beside its payload slot (``WideLayout``)."""


class WideLayout(NamedTuple):
    """Where the wide round's bytes lie in its one buffer of ``size`` bytes: rank r's
    payload slot at ``payload[r]`` (``wide[r]`` bytes), its ``head`` header bytes at
    ``heads[r]``. Below ``HEADERS_APART_MIN`` each rank's region is its slot followed
    by its headers, one message to each peer, closed up over the headers after (every
    block but rank 0's moves by one ``memmove``); from it the headers lie after all
    the slots, two messages to each peer, and nothing moves while every slot is its
    rank's exact need. Each message costs gloo a notification round and CPU on both
    sides, which the close-up outweighs only past several MiB (``docs/performance.md``)."""

    payload: tuple[int, ...]
    heads: tuple[int, ...]
    head: int
    size: int
    apart: bool


@functools.lru_cache(maxsize=64)
def wide_layout(wide: tuple[int, ...], head: int) -> WideLayout:
    """The ``WideLayout`` of payload slots ``wide`` and ``head`` header bytes per rank."""
    w = len(wide)
    apart = sum(wide) >= HEADERS_APART_MIN
    payload, heads, at = [], [], 0
    for n in wide:
        payload.append(at)
        at += n
        if not apart:
            heads.append(at)
            at += head
    if apart:
        heads = [at + r * head for r in range(w)]
        at += w * head
    return WideLayout(tuple(payload), tuple(heads), head, at, apart)


def _exchange_regions(buf: torch.Tensor, lay: WideLayout, info: GroupInfo) -> None:
    """The wide round's transport: this rank's region (or slot and headers) of ``buf``
    to every peer, every peer's received in place, all in one batch."""
    w, head = info.world_size, lay.head
    if not lay.apart:
        ends = [*lay.payload[1:], lay.size]
        exchange_with_each(
            [buf[lay.payload[r] : ends[r]] for r in range(w)],
            info,
            what=f"send/recv x{2 * (w - 1)} (metadata exchange)",
        )
        return
    ends = [*lay.payload[1:], lay.heads[0]]
    blocks = [
        (buf[lay.payload[r] : ends[r]], buf[lay.heads[r] : lay.heads[r] + head]) for r in range(w)
    ]
    send_receive(
        [blocks[info.rank]] * w, blocks, info, what=f"send/recv x{4 * (w - 1)} (metadata exchange)"
    )


# --- the steady path: a round that repeats the last one ------------------------------


@dataclass(frozen=True)
class _Steady:
    """A collective's last steady round on a group (its ``Memory.steady``): the caller's
    key, its checked call, the state it left unchanged, this rank's payload bytes,
    every rank's headers as received and the verdict; a wide round's ``WideLayout`` and
    headers as sent, or a gather round's ``Round`` and what its send headers encode."""

    key: tuple[object, ...]
    call: CheckedCall
    state: FusedState
    own: int
    raw: bytes
    layouts: tuple[Layout, ...]
    needs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    wide: WideLayout | None = None
    header: bytes = b""
    rnd: Round | None = None
    header_key: object = None


def _remember(
    mem: Memory,
    key: tuple[object, ...],
    calls: Sequence[CheckedCall],
    state: FusedState,
    found: Exchanged,
    own: int,
    raw: bytes,
    *,
    wide: WideLayout | None = None,
    header: bytes = b"",
    rnd: Round | None = None,
) -> None:
    """Keep a round for ``steady_exchange`` (``mem.steady`` forgotten first) when it is
    steady: one tensor whose rank blocks are adjacent, its payload rode, the group's
    state left as it found it (a pure function of the headers: so again next time)."""
    mem.steady = None
    layouts = found.layouts
    if found.outputs is None or len(calls) != 1 or len(layouts) != 1 or layouts[0].pre != 1:
        return
    if mem.shared.state is not state:
        return
    lay = layouts[0]
    needs = _needs(layouts, lay.world_size)
    sent = None if rnd is None else rnd.header_key
    mem.steady = _Steady(
        key, calls[0], state, own, raw, layouts, needs, lay.output_shape, lay.dtype, wide,
        header, rnd, sent
    )  # fmt: skip


def steady_exchange(
    kind: CollectiveName,
    key: tuple[object, ...],
    sources: Sequence[tuple[int, int]],
    info: GroupInfo,
) -> Exchanged | None:
    """The round of a call with the last steady round's key on the same group in the
    same state (else ``None``), whose payload is the bytes at ``sources`` (address,
    length) one after the other (CPU memory: ``x``'s, or a carrier's parts). It sends
    what the full path would; when every rank's headers are the ones of last time, the
    result is cut as then, else ``_decide`` reads them. The registry is read here
    directly (no helper), as this is every steady call's path."""
    pg = info.group if info.group is not None else dist.group.WORLD
    group = MEMORY.get(pg) if isinstance(pg, dist.ProcessGroup) else None
    mem = None if group is None else group.calls.get(kind)
    steady = None if mem is None else mem.steady
    if not isinstance(steady, _Steady) or steady.key != key or mem is None:
        return None
    state = steady.state
    if mem.shared.state is not state or sum(n for _, n in sources) != steady.own:
        return None  # not the state, or not the payload the key promised
    if steady.rnd is not None:
        return _steady_gather(kind, mem, steady, sources, info)
    assert steady.wide is not None  # a wide one's
    lay, wide, own = steady.wide, state.wide, steady.own
    buf = handed_back_buffer(pg, "wide", lay.size, torch.device("cpu"))
    base, mine = buf.data_ptr(), lay.payload[info.rank]
    _copy_in(base + mine, sources)
    ctypes.memset(base + mine + own, 0, wide[info.rank] - own)  # no stale memory out
    ctypes.memmove(base + lay.heads[info.rank], steady.header, len(steady.header))
    _exchange_regions(buf, lay, info)
    cut = region_cutter(buf, lay.payload)
    if landed_bytes(buf, lay.heads, len(steady.header)) == steady.raw:
        found = Exchanged(steady.layouts, cut(steady.layouts, steady.needs))
    else:
        mem.steady = None
        rows = read_headers(buf, lay.heads, state.slots)
        found = _decide(kind, state, (steady.call,), rows, info, mem, cut, wide)
    hand_back(pg, "wide", buf)
    return found


def _copy_in(at: int, sources: Sequence[tuple[int, int]]) -> None:
    """The bytes at ``sources`` (address, length), one after the other, to address ``at``."""
    for address, n in sources:
        ctypes.memmove(at, address, n)
        at += n


def _steady_gather(
    kind: CollectiveName,
    mem: Memory,
    steady: _Steady,
    sources: Sequence[tuple[int, int]],
    info: GroupInfo,
) -> Exchanged | None:
    """``steady_exchange`` of a gather round: the payload into the kept send buffer (its
    headers still the remembered ones), one round, the result copied out of the kept
    receive buffer here, not by ``Round.cut``: the path enters no other module."""
    rnd = steady.rnd
    assert rnd is not None  # a gather round's
    if mem.round is not rnd or not rnd.lock.acquire(blocking=False):
        return None
    try:
        recv = rnd.recv
        if rnd.header_key != steady.header_key or recv is None:
            return None  # its send buffer holds other headers now
        own = steady.own
        _copy_in(rnd.send_at, sources)
        if rnd.dirty > own:  # no stale memory to the peers
            ctypes.memset(rnd.send_at + own, 0, rnd.dirty - own)
        rnd.dirty = own
        _gather_blocks(recv, rnd.send, info)
        view, head = memoryview(rnd.raw_recv), rnd.head
        if b"".join(view[a : a + head] for a in rnd.header_at) == steady.raw:
            out = torch.empty(steady.shape, dtype=steady.dtype)  # one memmove per rank
            dst = out.data_ptr()
            for src, n in zip(rnd.payload_at, steady.needs, strict=True):
                if n:
                    ctypes.memmove(dst, src, n)
                    dst += n
            return Exchanged(steady.layouts, [out])
        mem.steady = None
        room = (steady.state.capacity,) * info.world_size
        return _decide(
            kind, steady.state, (steady.call,), rnd.rows(recv), info, mem, rnd.cutter(recv), room
        )
    finally:
        rnd.lock.release()


def _adjacent(record: CallRecord) -> bool:
    """Whether the result of a gather of this call has its rank blocks one after the
    other (``Layout.pre == 1``: no dimension before the gather dimension but 1s)."""
    dim = record.normalized_dim
    return 0 <= dim <= len(record.shape) and math.prod(record.shape[:dim]) == 1


def _decide(
    kind: CollectiveName,
    state: FusedState,
    calls: Sequence[CheckedCall],
    rows: tuple[tuple[int, ...], ...],
    info: GroupInfo,
    mem: Memory | None,
    cut: Cut,
    room: tuple[int, ...],
) -> Exchanged:
    """Every rank's verdict from the gathered headers ``rows`` (the same on every rank);
    ``room[r]``: the payload bytes rank r's slot held in this round."""
    w = info.world_size
    last = None if mem is None else mem.last
    if last is not None and last.seen == rows:
        # The very headers of the last call that validated: the verdict is a pure
        # function of them, so it is the same (and the same on every rank).
        return _finish(state, last.found, True, mem, cut, room)
    if last is not None and mem is not None:
        resized = _resized(last.seen, last.found.layouts, rows)
        if resized is not None:
            verdict = Verdict(resized, last.found.fusable, _needs(resized, w))
            mem.last = Last(rows, verdict)
            return _finish(state, verdict, True, mem, cut, room)
    k = len(calls)
    per_rank = [split_headers(row) for row in rows]
    for r, headers in enumerate(per_rank):
        for h in headers:
            mismatch = magic_mismatch(h)
            if mismatch is not None:
                raise ProtocolMismatchError(
                    f"all_gather_v: cannot read rank {r}'s fused header: {mismatch} "
                    "(another vargather version, or another collective issued on this "
                    "group?)",
                    ranks=[r],
                )
    slots = len(per_rank[0]) if per_rank else 0
    counts = [header_count(headers[0]) for headers in per_rank]
    kinds = [header_kind(headers[0]) for headers in per_rank]
    fusable = all(header_flags(headers[0]) & FLAG_ELIGIBLE for headers in per_rank)
    flagged = FLAG_PROBLEM | FLAG_LONG
    layouts: tuple[Layout, ...] | None = None
    if (
        len(set(counts)) == 1
        and k <= slots
        and not any(header_flags(h[i]) & flagged for h in per_rank for i in range(k))
    ):
        try:
            layouts = tuple(
                validate_records([decode_header(h[i]) for h in per_rank], rank=info.rank)
                for i in range(k)
            )
        except VarGatherError:
            layouts = None
    compact = layouts is not None
    if layouts is None:
        layouts = _full_path(kind, calls, counts, kinds, info)
    verdict = Verdict(layouts, fusable, _needs(layouts, w))
    if compact and mem is not None:
        mem.last = Last(rows, verdict)
    return _finish(state, verdict, compact, mem, cut, room)


def _resized(
    before: tuple[tuple[int, ...], ...],
    layouts: tuple[Layout, ...],
    rows: tuple[tuple[int, ...], ...],
) -> tuple[Layout, ...] | None:
    """The layouts of ``rows`` when they are the validated headers ``before`` (whose
    layouts are ``layouts``) with only the sizes along each gather dimension changed
    (each ``>= 0``) and no rank passing ``sizes``, else ``None``: what
    ``validate_records`` would return, every field it compares being as in ``before``.
    """
    if len(rows) != len(before) or not layouts:
        return None
    if any(lay.dim >= SHAPE_SLOTS for lay in layouts):
        return None
    at = [size_word_at(i, lay.dim) for i, lay in enumerate(layouts)]
    for row, old in zip(rows, before, strict=True):
        if len(row) != len(old):
            return None
        start = 0
        for p in at:
            if row[start:p] != old[start:p] or row[p] < 0:
                return None
            start = p + 1
        if row[start:] != old[start:]:
            return None
    lens_at = [sizes_len_word_at(i) for i in range(len(layouts))]
    if any(old[p] != -1 for old in before for p in lens_at):
        return None  # sizes passed: their hash depends on the sizes
    return tuple(
        lay.with_sizes(tuple(row[p] for row in rows)) for lay, p in zip(layouts, at, strict=True)
    )


def _needs(layouts: Sequence[Layout], world: int) -> tuple[int, ...]:
    return tuple(sum(lay.shard_bytes(r) for lay in layouts) for r in range(world))


@functools.lru_cache(maxsize=64)
def _advanced(state: FusedState, fusable: bool, count: int, needs: tuple[int, ...]) -> FusedState:
    """``advance`` after a call with every rank's payload ``needs``, remembered: a pure
    function of its arguments (the same on every rank), and in the steady state the
    same arguments every call (saves its ~8 us of Python per call)."""
    need = max(needs, default=0)
    return advance(state, fusable=fusable, need=need, count=count, needs=needs)


class Verdict(NamedTuple):
    """What a call's headers read as (the same on every rank): its layouts, whether
    every rank was eligible, and every rank's payload bytes."""

    layouts: tuple[Layout, ...]
    fusable: bool
    needs: tuple[int, ...]


def _finish(
    state: FusedState,
    verdict: Verdict,
    compact: bool,
    mem: Memory | None,
    cut: Cut,
    room: tuple[int, ...],
) -> Exchanged:
    """Advance the state from the validated layouts; cut out the results if fused."""
    layouts, fusable, needs = verdict
    after = _advanced(state, fusable, len(layouts), needs)
    if after is not state and mem is not None:
        mem.shared.state = after
    fits = all(n <= c for n, c in zip(needs, room, strict=True))
    if not (compact and fusable and fits):
        return Exchanged(layouts, None)
    return Exchanged(layouts, cut(layouts, needs))


class Prefetched:
    """The transport of a gather whose payload rode in the fused round: ``gather`` hands
    back the result (once; the reference is dropped), the backward is ``backward``'s."""

    name = "fused"

    def __init__(self, output: torch.Tensor, backward: Transport) -> None:
        self._box = [output]
        self._backward = backward

    def gather(self, x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
        return self._box.pop()

    def reduce_scatter_sum(
        self, grad_output: torch.Tensor, layout: Layout, info: GroupInfo
    ) -> torch.Tensor:
        return self._backward.reduce_scatter_sum(grad_output, layout, info)


def gather_bytes(
    tensors: Sequence[torch.Tensor], layouts: Sequence[Layout], info: GroupInfo, transport: str
) -> list[torch.Tensor]:
    """Several validated gathers as one payload collective: every rank's tensors as one
    ragged run of bytes, gathered by ``transport`` (``auto``: its policy for those
    bytes), then cut back into tensors."""
    w = info.world_size
    sizes = _needs(layouts, w)
    if sum(sizes) == 0:
        device = tensors[0].device if tensors else info.default_device()
        return unpack([torch.empty(0, dtype=torch.uint8, device=device)] * w, layouts)
    flat = Layout(
        sizes=sizes,
        dim=0,
        leading_shape=(),
        trailing_shape=(),
        dtype=torch.uint8,
        rank=info.rank,
        world_size=w,
    )
    gathered = choose_transport(transport, flat, info).gather(pack(tensors), flat, info)
    return unpack([gathered[flat.block(r)] for r in range(w)], layouts)

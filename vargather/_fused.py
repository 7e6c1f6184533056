"""Stages 3 and 5 fused: the metadata exchange with the payload riding along.

Pipeline: argument checks -> wire format -> exchange and validation -> ``Layout`` ->
transport -> autograd. This module runs a validated call's exchange (falling back to
``_exchange`` on the rare error path) and, when the payload fits the slots the group
agreed on, its transport in the same round; it sits above ``_transport`` (whose
transports move the payload when it does not ride along) and below ``_autograd``.

Every validated call on a communicating group starts with **one round** whose size
every rank knows before it starts, whatever its arguments. Every rank derives it from
the group's ``FusedState``, which every rank updates identically from headers every
rank has seen: a mismatched dtype or shape cannot abort a rank or be misread, as
nothing but agreed-length bytes moves before validation, and nothing received is read
but the headers until they validated. The round is one of two kinds:

* the **gather round** (``state.wide`` empty): one equal-size all_gather of bytes; each
  rank sends ``slots * HEADER_BYTES + capacity`` bytes, ``slots`` compact headers (one
  per gathered tensor) and a payload slot of ``capacity`` bytes (at most
  ``FUSED_MAX_BYTES``, 128 KiB), the same on every rank. One collective, the fewest
  operations for small payloads, where latency rules; every slot is as large as the
  largest, so a group keeps it only while that carries at most ``PAD_LIMIT`` times the
  payload (or ``SMALL_BYTES`` in all).
* the **wide round** (``state.wide[r]``: rank r's own payload slot): one batch of
  direct sends (``_comm.exchange_with_each``): rank r sends region r of one
  rank-major buffer, its payload slot of ``wide[r]`` bytes followed by its ``slots``
  headers, to every peer, and receives every peer's region in place; 2 (W - 1)
  point-to-point operations in flight at once. Every byte crosses one link once and
  no rank forwards another's: at 4 gloo ranks, even sizes, the raw sends ran
  0.60-0.86x one equal ring all_gather from 128 KiB to 4 MiB per rank, where W
  broadcasts in flight (the round's transport until then) ran 0.68-0.96x
  (``docs/performance.md``, "The wide round by direct sends"). No rank pads to
  another's size: for a stable skew each slot is the rank's own need, and a single
  tensor gathered along a leading dim is returned as a view of the buffer after the
  payload regions are closed up over the headers in place (``_move_left``: one
  ``memmove`` per rank but the first on the CPU, never a second buffer).

The compact header (``_wire.encode_header``, ``HEADER_WORDS`` int64) carries what
validation compares, with no message text: a problem only sets a flag.

After the round, every rank decides from the gathered headers alone:

* **compact**: every rank sent the same number of tensors, at most ``slots``, none
  flagged (no local problem, ndim <= ``SHAPE_SLOTS``) and the headers validate
  (``validate_records``): the ``Layout`` of each tensor comes from the headers.
* otherwise the **full path**: the exchange of full records (``_exchange``, with the
  problem's message text), which raises the same error on every rank, or (for a call
  that was merely too wide for the compact header) returns the layouts. This is the
  rare error path; it costs a second round.
* **fused**: compact, every rank eligible (``transport="auto"``, tensors on the
  metadata device, not a layout-only call) and every rank's payload within its slot
  (``capacity``, at most ``FUSED_MAX_BYTES``, in the gather round; ``wide[r]`` in the
  wide round): every rank copied its payload into its slot, and the results are cut
  out of the received bytes. One round in all.
* otherwise the payload moves in a second round (the transports of ``_transport``).

The state rule (``advance``), applied on every rank after a call whose headers validated
(compact or full path), from the validated layouts only, before any payload moves:

* ``need`` = the largest payload any rank had (bytes of all its tensors), ``needs`` =
  every rank's;
* gather round: a call in use (every rank eligible, ``need <= FUSED_MAX_BYTES`` and
  ``4 * need > capacity``) sets ``capacity = max(capacity, bucket(need))`` and ends any
  idle streak; any other call is idle: after ``SHRINK_AFTER`` idle calls in a row the
  capacity becomes ``bucket`` of the largest eligible small need among them (0 if none);
* wide round: a call *goes wide* when every rank is eligible and, with ``padded = W *
  bucket(need)`` (what the gather round would carry) and ``sum(needs)`` the payload:
  ``need > WIDE_MIN_BYTES`` (128 KiB), or ``padded > max(PAD_LIMIT * sum(needs),
  SMALL_BYTES)`` (strong skew on many ranks).
  A group's first such call sets ``wide = needs`` exactly; a later one where some rank
  outgrew its slot (a miss: that call took two rounds) sets every slot to
  ``max(wide[r], bucket(needs[r]))``; a miss by an eligible call that does not go wide
  ends the wide round at once (the gather round's capacity grew to it in the same
  call); a call that goes wide and fits, with no slot at least twice ``bucket`` of its
  need, ends any idle streak, and once ``SHRINK_AFTER`` such calls in a row had the
  very same needs (calls that do not go wide between them neither count nor break
  the row), ``wide`` becomes those needs exactly (a stable skew sends no padding,
  whatever sizes came before it); any other call is idle, and after
  ``SHRINK_AFTER`` idle calls in a row ``wide`` becomes the largest needs of the
  streak's wide calls (or empty, back to the gather round, when none went wide);
* ``slots`` grows at once to a call's tensor count and, after ``SHRINK_AFTER`` calls in
  a row with fewer tensors, shrinks to the most among them.

**Padding bound.** ``bucket(n) <= max(64, 1.125 n)``. In the wide round a rank's slot
is its exact need from a group's first wide call while sizes stay, and again after
``SHRINK_AFTER`` calls in a row with the same sizes once they moved; in between it is
at most ``bucket`` of the largest need it had since the slots were set (12.5 % of that,
64 bytes at least), and never more than twice ``bucket`` of its need for more than
``SHRINK_AFTER - 1`` calls in a row; no rank's slot depends on another rank's size.
In the gather round every slot
is ``capacity`` (at most ``FUSED_MAX_BYTES``), so a rank receives at most ``W *
capacity`` bytes. A group is in the gather round only after a call that did not go
wide, so for that call's sizes ``W * bucket(need) <= max(PAD_LIMIT * sum(needs),
SMALL_BYTES)`` with ``need <= FUSED_MAX_BYTES``: at most ``PAD_LIMIT`` times the
payload, or 128 KiB in all, and never more than 128 KiB per rank. While sizes move the capacity is
``bucket`` of the largest need of the last ``SHRINK_AFTER`` calls (or of the calls
since it last grew), not of the current call, so one call's padding can exceed the
bound by what its sizes fell since then; ``SHRINK_AFTER`` calls at the smaller sizes
restore it.

Calls that raise in validation change nothing (every rank raises from the same
headers); calls with ``sizes`` and ``validate=False`` skip the round and change nothing;
a miss on one rank only is seen by every rank in the headers, so every rank grows the
slots alike. Errors after validation (a timeout in the payload collective) leave the
group out of step anyway. The state is kept per process group (weakly keyed, subgroups
apart) and is **one for every kind** (``Kind``: ``all_gather_v`` with ``gather_layout``
and ``all_gather_v_with_layout``, ``all_gather_v_coalesced``, ``all_gather_list``):
the round's length is a function of the group's state only, so a rank calling one
kind beside a peer calling another sends the same length and gets an error, never a
gloo abort. Every header carries its caller's kind (``_wire.KIND_SHIFT``), and what
the full path moves is decided from every rank's headers alone: ranks whose tensor
counts differ raise ``ArgumentMismatchError`` at once, naming which rank called which
collective; otherwise one all_gather of the records, and ``plan_layout``'s extra
all_gather of a sizes mismatch only when every rank called ``all_gather_v``. Kinds
that agree on the headers (``all_gather_v(x)`` beside ``all_gather_v_coalesced([x])``)
gather alike. Sharing costs a group that mixes kinds a little padding: its capacity
and header slots follow the largest need and tensor count of every kind's calls.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

import torch
import torch.distributed as dist

from ._args import CallRecord, CheckedCall
from ._collectives import COLLECTIVES, CollectiveName, name_of_code
from ._comm import GroupInfo, all_gather_equal, exchange_with_each
from ._errors import ArgumentMismatchError, ProtocolMismatchError, VarGatherError
from ._exchange import _disagreement, exchange_records, plan_layout, validate_records
from ._group import process_group
from ._layout import Layout
from ._transport import Transport, choose_transport
from ._wire import (
    FLAG_ELIGIBLE,
    FLAG_LONG,
    FLAG_PROBLEM,
    HEADER_BYTES,
    SHAPE_SLOTS,
    call_flags,
    decode_header,
    encode_headers,
    header_count,
    header_flags,
    header_kind,
    header_struct,
    magic_mismatch,
    size_word_at,
    sizes_len_word_at,
    split_headers,
)

__all__ = [
    "FUSED_MAX_BYTES",
    "HEADER_BYTES",
    "SHAPE_SLOTS",
    "SHRINK_AFTER",
    "Exchanged",
    "FusedState",
    "Kind",
    "Prefetched",
    "advance",
    "bucket",
    "capacity_of",
    "capacity_step",
    "exchange",
    "gather_bytes",
    "named",
    "pack",
    "payload_nbytes",
    "state_of",
    "unpack",
    "within_waste",
]

Kind: TypeAlias = CollectiveName
"""Who runs the round: a collective whose round is all_gather-shaped
(``_collectives``): ``all_gather_v`` (and ``gather_layout``,
``all_gather_v_with_layout``), ``all_gather_v_coalesced``, ``all_gather_list``. Every
kind sizes its round from the group's one state and sends its wire code in the headers."""

FUSED_MAX_BYTES: Final = 128 * 1024
"""Largest payload per rank that rides in the equal-size fused round (the *gather*
round); a group whose calls carry more switches to the *wide* round (module doc).
512 KiB until the wide round's headers rode in its broadcasts: since then the wide
round beats the gather round from 128 KiB per rank up (``docs/performance.md``); below,
the two are even at 4 ranks and the gather round is one operation, not 2 (W - 1)."""

WIDE_MIN_BYTES: Final = FUSED_MAX_BYTES
"""A group switches to the wide round once a call's largest payload per rank exceeds
this many bytes (and back after ``SHRINK_AFTER`` calls that do not)."""

SMALL_BYTES: Final = 128 * 1024
"""Bytes in all that the gather round may always carry: up to ``PAD_LIMIT`` times the
payload or this much, whichever is more (latency dominates there)."""

WASTE_LIMIT: Final = 0.5
"""The padding, as a fraction of the payload, that a result handed back with its whole
receive buffer may carry (``within_waste``; the family's stretched slot too)."""

SHRINK_AFTER: Final = 8
"""Idle calls in a row after which the capacity (or the slots) shrink."""

_MIN_BUCKET: Final = 64


def bucket(n: int) -> int:
    """``n`` bytes rounded up: 0 stays 0, up to ``_MIN_BUCKET`` is ``_MIN_BUCKET``, else to a
    multiple of 1/16 of the next power of two (at most 12.5 % more than ``n``)."""
    if n <= 0:
        return 0
    if n <= _MIN_BUCKET:
        return _MIN_BUCKET
    step = max(16, (1 << (n - 1).bit_length()) // 16)
    return -(-n // step) * step


@dataclass(frozen=True)
class FusedState:
    """What one group's ranks agree on for the next fused round (see the module doc).

    ``capacity``, ``idle``, ``idle_need``: the gather round's one payload slot and its
    shrink streak. ``slots``, ``fewer``, ``fewer_max``: the header slots. ``wide``: the
    wide round's per-rank payload slots (empty: the group runs the gather round);
    ``wide_idle`` and ``wide_max``: its shrink streak and the largest needs in it;
    ``wide_steady`` and ``wide_last``: its calls in a row with the same needs
    (``wide_last``) within slots that are not exactly those needs.
    """

    capacity: int = 0
    slots: int = 1
    idle: int = 0
    idle_need: int = 0
    fewer: int = 0
    fewer_max: int = 0
    wide: tuple[int, ...] = ()
    wide_idle: int = 0
    wide_max: tuple[int, ...] = ()
    wide_steady: int = 0
    wide_last: tuple[int, ...] = ()


PAD_LIMIT: Final = 4
"""The gather round pads every rank's slot to the largest need; once that would carry
more than ``PAD_LIMIT`` times the payload and more than ``SMALL_BYTES`` in all
(``W * bucket(max n) > max(PAD_LIMIT * sum n, SMALL_BYTES)``: strong skew on many
ranks) a group takes the wide round even for small payloads."""


def within_waste(padded: int, payload: int) -> bool:
    """Whether ``padded`` bytes carry ``payload`` bytes with at most ``WASTE_LIMIT`` of
    padding: the bound of a result handed back with its receive buffer and of the
    family's stretched slot (``_family.rides``)."""
    return padded <= (1 + WASTE_LIMIT) * payload


def _wants_wide(needs: Sequence[int]) -> bool:
    """Whether a call with every rank's payload ``needs`` makes a group go wide."""
    if not needs:
        return False
    most = max(needs)
    padded = len(needs) * bucket(most)
    return most > WIDE_MIN_BYTES or padded > max(PAD_LIMIT * sum(needs), SMALL_BYTES)


_WideStep = tuple[tuple[int, ...], int, tuple[int, ...], int, tuple[int, ...]]
"""``(wide, wide_idle, wide_max, wide_steady, wide_last)`` after a call."""


def _advance_wide(state: FusedState, fusable: bool, needs: Sequence[int]) -> _WideStep:
    """The wide round's part of ``advance`` (module doc, "the wide round")."""
    wide, idle, most = state.wide, state.wide_idle, state.wide_max
    large = fusable and _wants_wide(needs)
    if large and len(wide) != len(needs):  # a group's first large call: its exact needs
        return tuple(needs), 0, (), 0, ()
    if not wide:
        return wide, 0, (), 0, ()
    missed = any(n > c for n, c in zip(needs, wide, strict=True))
    if large and missed:  # a miss: grow (the first call of a streak with these needs)
        grown = tuple(max(c, bucket(n)) for n, c in zip(needs, wide, strict=True))
        return grown, 0, (), 1, tuple(needs)
    if missed and fusable:  # a miss the gather round holds (it grew to it): back at once
        return (), 0, (), 0, ()
    if large and not any(2 * bucket(n) <= c for n, c in zip(needs, wide, strict=True)):
        # in use, no slot twice too large. Slots that are not the needs themselves
        # (grown by an earlier miss, or left from larger sizes) become them after
        # SHRINK_AFTER calls in a row with the very same needs: a stable skew sends
        # no padding, however it got there.
        now = tuple(needs)
        if now == wide:
            return wide, 0, (), 0, ()
        steady = state.wide_steady + 1 if now == state.wide_last else 1
        if steady >= SHRINK_AFTER:
            return now, 0, (), 0, ()
        return wide, 0, (), steady, now
    # idle: not large (small, or a rank not eligible), or some slot twice too large
    idle += 1
    steady, last = state.wide_steady, state.wide_last  # a call not wide says nothing of
    if large:  # the wide calls' sizes; one with a slot twice too large ends the streak
        most = tuple(max(a, b) for a, b in zip(most or (0,) * len(needs), needs, strict=True))
        steady, last = 0, ()
    if idle < SHRINK_AFTER:
        return wide, idle, most, steady, last
    if _wants_wide(most):
        return most, 0, (), 0, ()
    return (), 0, (), 0, ()


def capacity_step(
    current: tuple[int, int, int], *, small: bool, need: int, slot: Callable[[int], int]
) -> tuple[int, int, int]:
    """One call's step of a learned capacity ``(capacity, idle, idle_need)``: a small
    call in use (``4 * need > capacity``) grows it to ``slot(need)`` and ends the idle
    streak; any other call is idle, and after ``SHRINK_AFTER`` idle calls in a row the
    capacity becomes ``slot`` of the largest small need among them (the fused round's
    rule, and the family exchange's)."""
    capacity, idle, idle_need = current
    if small and 4 * need > capacity:
        return max(capacity, slot(need)), 0, 0
    idle += 1
    if small:
        idle_need = max(idle_need, need)
    if idle >= SHRINK_AFTER:
        return slot(idle_need), 0, 0
    return capacity, idle, idle_need


def advance(
    state: FusedState, *, fusable: bool, need: int, count: int, needs: Sequence[int] = ()
) -> FusedState:
    """The state after a call that validated: a pure function of what every rank saw
    (``need``: the largest payload of any rank; ``needs``: every rank's, for the wide
    round; without them the wide slots only count the call as idle)."""
    capacity, idle, idle_need = capacity_step(
        (state.capacity, state.idle, state.idle_need),
        small=fusable and need <= FUSED_MAX_BYTES,
        need=need,
        slot=bucket,
    )
    slots, fewer, fewer_max = state.slots, state.fewer, state.fewer_max
    if count > slots:
        slots, fewer, fewer_max = count, 0, 0
    elif count < slots:
        fewer, fewer_max = fewer + 1, max(fewer_max, count)
        if fewer >= SHRINK_AFTER:
            slots, fewer, fewer_max = max(1, fewer_max), 0, 0
    else:
        fewer, fewer_max = 0, 0
    wide_step = _advance_wide(state, fusable, needs)
    after = (capacity, slots, idle, idle_need, fewer, fewer_max, *wide_step)
    if after == (
        state.capacity,
        state.slots,
        state.idle,
        state.idle_need,
        state.fewer,
        state.fewer_max,
        state.wide,
        state.wide_idle,
        state.wide_max,
        state.wide_steady,
        state.wide_last,
    ):
        return state  # unchanged (the steady state): no new object
    return FusedState(*after)


_STATES: weakref.WeakKeyDictionary[dist.ProcessGroup, FusedState] = weakref.WeakKeyDictionary()
"""Per group, the one state every kind's round is sized from (module doc: a peer
calling another kind must send the same length, or gloo aborts)."""


def _key(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    pg = group if group is not None else dist.group.WORLD
    return pg if isinstance(pg, dist.ProcessGroup) else None


def state_of(group: dist.ProcessGroup | None = None, kind: Kind = "all_gather_v") -> FusedState:
    """This process's copy of ``group``'s state (read only; ``None``: the default group).
    ``kind`` is accepted for old callers: every kind shares the group's state."""
    del kind
    pg = _key(group)
    if pg is None:
        return FusedState()
    return _STATES.get(pg, _FRESH)


def capacity_of(group: dist.ProcessGroup | None = None, kind: Kind = "all_gather_v") -> int:
    """The payload bytes per rank the next fused round of ``group`` reserves (any kind)."""
    return state_of(group, kind).capacity


# --- payload bytes ---------------------------------------------------------------------------


def payload_nbytes(layout: Layout, rank: int) -> int:
    """Bytes of ``rank``'s shard under ``layout`` (``Layout.shard_bytes``)."""
    return layout.shard_bytes(rank)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in row-major order, as flat bytes: a view when ``t`` is
    contiguous, a copy of a strided one. Never raises (a rank that raised here would
    leave its peers waiting in the round): viewing the new size-1 last dimension, whose
    stride is 1, as bytes works for any strides, which ``t.view(uint8)`` does not."""
    # A lazily conjugated or negated view has no bytes of its own to view: resolve it
    # first (free when the bit is not set).
    resolved = t.detach().resolve_conj().resolve_neg()
    return resolved.unsqueeze(-1).view(torch.uint8).reshape(-1)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, one after the other."""
    if len(tensors) == 1:
        return _bytes_of(tensors[0])
    return (
        torch.cat([_bytes_of(t) for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)
    )


def unpack(regions: Sequence[torch.Tensor], layouts: Sequence[Layout]) -> list[torch.Tensor]:
    """The gathered tensors from each rank's payload bytes (``regions[r]``: rank r's
    tensors' bytes one after the other). One ``cat`` per tensor, exact for any dtype."""
    device = regions[0].device if regions else torch.device("cpu")
    outputs: list[torch.Tensor] = []
    for layout, parts in zip(layouts, _parts(regions, layouts), strict=True):
        if layout.pre * layout.total * layout.post == 0:
            outputs.append(torch.empty(layout.output_shape, dtype=layout.dtype, device=device))
            continue
        joined = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].clone()
        outputs.append(joined.view(layout.dtype).view(layout.output_shape))
    return outputs


# --- the round ---------------------------------------------------------------------------------


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
    kind: Kind,
    calls: Sequence[CheckedCall],
    counts: Sequence[int],
    kinds: Sequence[int],
    info: GroupInfo,
) -> tuple[Layout, ...]:
    """The exchange of full records: the same error on every rank, or the layouts.

    What moves is decided from the headers alone (``counts``, ``kinds``: every rank's),
    so that a peer of another kind issues the same collectives: no records when the
    counts differ, one all_gather of ``count`` records otherwise, and
    ``plan_layout``'s extra all_gather of a sizes mismatch only when every rank
    called ``all_gather_v``."""
    if kind == "all_gather_v" and len(set(kinds)) == 1:
        return (plan_layout(calls[0], info),)
    found = _disagreement("number of tensors", list(counts))
    if found is not None:
        raise ArgumentMismatchError(
            f"{_mixed_prefix(kinds) or 'all_gather_v_coalesced'}: {found[0]}" + _called(kinds),
            ranks=found[1],
        )
    if not calls:
        return ()
    per_rank = exchange_records([c.record for c in calls], info)
    layouts = []
    for i in range(len(calls)):
        try:
            layouts.append(validate_records([row[i] for row in per_rank], rank=info.rank))
        except VarGatherError as err:
            raise (err if kind == "all_gather_v" else named(err, i)) from None
    return tuple(layouts)


def _mixed_prefix(kinds: Sequence[int]) -> str:
    """The names of the collectives the ranks called, when they differ (``""`` when
    every rank called the same one): the same text on every rank."""
    present = sorted(set(kinds))
    if len(present) == 1:
        return ""
    return " / ".join(name_of_code(k) for k in present)


def _called(kinds: Sequence[int]) -> str:
    """Which rank called which collective, when they differ (else ``""``)."""
    if len(set(kinds)) == 1:
        return ""
    by_kind: dict[int, list[int]] = {}
    for r, k in enumerate(kinds):
        by_kind.setdefault(k, []).append(r)
    told = "; ".join(
        f"{name_of_code(k)} on rank(s) {ranks}" for k, ranks in sorted(by_kind.items())
    )
    return f" (the ranks called different collectives: {told}; call the same one on every rank)"


def exchange(
    kind: Kind,
    calls: Sequence[CheckedCall],
    tensors: Sequence[object],
    info: GroupInfo,
    *,
    eligible: bool,
) -> Exchanged:
    """The fused round for a validated call on a communicating group (module doc).

    ``calls``: one checked call per tensor (a call-level problem sits in ``calls[0]``);
    ``eligible``: whether the caller lets the payload ride (``transport="auto"`` and
    not a layout-only call). Raises the same error on every rank, or returns the same
    layouts (and, when fused, the gathered tensors) on every rank.
    """
    w = info.world_size
    pg = process_group(info)
    state = _STATES.get(pg, _FRESH) if pg is not None else _FRESH
    slots = state.slots
    wide = state.wide if len(state.wide) == w else ()
    capacity = min(state.capacity, FUSED_MAX_BYTES)
    room = wide or (capacity,) * w
    k = len(calls)
    device = info.default_device()
    records = tuple(c.record for c in calls)
    local_ok = (
        eligible
        and all(rec.problem is None and rec.ndim <= SHAPE_SLOTS for rec in records)
        and all(isinstance(t, torch.Tensor) and t.device.type == device.type for t in tensors)
    )
    flags = call_flags(eligible=local_ok, kind_code=COLLECTIVES[kind].code)
    own = [t for t in tensors if isinstance(t, torch.Tensor)] if local_ok and k <= slots else []
    nbytes = sum(t.numel() * t.element_size() for t in own)
    if nbytes > room[info.rank]:
        own = []
    if wide:
        return _wide_round(kind, state, calls, (records, k, flags), own, nbytes, info, pg, wide)
    rnd = _round_for(pg, kind, w, slots, capacity, device)
    if rnd is not None and rnd.lock.acquire(blocking=False):
        try:
            rnd.fill((records, k, flags), own, nbytes)
            recv = rnd.receive(k == 1 and _adjacent(records[0]), pg)
            all_gather_equal(recv, rnd.send, info, what="all_gather (metadata exchange)")
            found = _decide(kind, state, calls, rnd.rows(recv), info, pg, rnd.cutter(recv), room)
            if recv is not rnd.recv:
                _hand_back(pg, "gather", recv)
            return found
        finally:
            rnd.lock.release()
    # Fresh buffers: another device than the CPU, or a thread already using this
    # group's buffers.
    head = slots * HEADER_BYTES
    block = head + capacity
    send = torch.empty(block, dtype=torch.uint8, device=device)
    send[:head].copy_(_header_bytes(slots, records, k, flags))
    filled = 0
    if own:
        send[head : head + nbytes].copy_(pack(own))
        filled = nbytes
    send[head + filled :].zero_()  # no stale memory to the peers
    gathered = torch.empty(w * block, dtype=torch.uint8, device=device)
    all_gather_equal(gathered, send, info, what="all_gather (metadata exchange)")
    grid = gathered.view(w, block)
    rows = _read_headers(gathered, [r * block for r in range(w)], slots)

    def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        return unpack([grid[r, head : head + needs[r]] for r in range(w)], layouts)

    return _decide(kind, state, calls, rows, info, pg, cut, room)


def _header_bytes(slots: int, records: Sequence[CallRecord], k: int, flags: int) -> torch.Tensor:
    """``slots`` compact headers (``_wire``) as bytes: ``records`` and unused slots."""
    words = encode_headers(slots, records, k, flags)
    return torch.frombuffer(bytearray(header_struct(slots).pack(*words)), dtype=torch.uint8)


_MOVE_CHUNK: Final = 1 << 20
"""Bytes moved at a time when the wide round compacts its buffer in place."""


def _move_left(buf: torch.Tensor, dst: int, src: int, n: int) -> None:
    """``buf[dst : dst + n] = buf[src : src + n]`` for ``dst < src`` (ranges may
    overlap), ``buf`` a contiguous uint8 tensor: one ``memmove`` on the CPU (made for
    overlapping ranges), else ``_move_chunked``."""
    if buf.device.type == "cpu" and buf.is_contiguous():
        base = buf.data_ptr()
        ctypes.memmove(base + dst, base + src, n)
        return
    _move_chunked(buf, dst, src, n)


def _move_chunked(buf: torch.Tensor, dst: int, src: int, n: int) -> None:
    """``_move_left`` with tensor copies: chunk by chunk, each through a copy of at most
    ``_MOVE_CHUNK`` bytes when the chunk overlaps its destination; a write never reaches
    bytes not yet moved."""
    gap = src - dst
    at = 0
    while at < n:
        m = min(n - at, max(gap, _MOVE_CHUNK))
        piece = buf[src + at : src + at + m]
        if m > gap:  # overlapping: through a temporary
            m = min(m, _MOVE_CHUNK)
            piece = buf[src + at : src + at + m].clone()
        buf[dst + at : dst + at + m].copy_(piece)
        at += m


def _wide_round(
    kind: Kind,
    state: FusedState,
    calls: Sequence[CheckedCall],
    header_key: tuple[tuple[CallRecord, ...], int, int],
    own: Sequence[torch.Tensor],
    nbytes: int,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    wide: tuple[int, ...],
) -> Exchanged:
    """The wide round (module doc): every rank sends its region of one rank-major
    buffer, its payload slot (``wide[r]`` bytes) followed by its headers, to each peer
    and receives theirs in place; all 2 (W - 1) operations in flight at once, one
    batch. The headers are read where they landed, then the payload regions are
    closed up in place (``_cutter``)."""
    w, rank = info.world_size, info.rank
    records, k, flags = header_key
    head = state.slots * HEADER_BYTES
    device = info.default_device()
    starts = [0] * (w + 1)  # region r: [starts[r], starts[r] + wide[r]) payload, then headers
    for r in range(w):
        starts[r + 1] = starts[r] + wide[r] + head
    buf = _handed_back_buffer(pg, "wide", starts[w], device)
    mine = starts[rank]
    if own:
        at = mine
        for t in own:
            n = t.numel() * t.element_size()
            region = buf[at : at + n]
            if at % t.element_size() == 0:  # one copy whatever the strides
                region.view(t.dtype).view(t.shape).copy_(t.detach())
            else:
                region.copy_(_bytes_of(t))
            at += n
    filled = nbytes if own else 0
    buf[mine + filled : mine + wide[rank]].zero_()  # no stale memory to the peers
    ours = mine + wide[rank]
    buf[ours : ours + head].copy_(_header_bytes(state.slots, records, k, flags).to(device))
    exchange_with_each(
        [buf[starts[r] : starts[r + 1]] for r in range(w)],
        info,
        what=f"send/recv x{2 * (w - 1)} (metadata exchange)",
    )
    found = _decide(
        kind,
        state,
        calls,
        _read_headers(buf, [starts[r] + wide[r] for r in range(w)], state.slots),
        info,
        pg,
        _cutter(buf, starts),
        wide,
    )
    _hand_back(pg, "wide", buf)
    return found


def _read_headers(buf: torch.Tensor, at: Sequence[int], slots: int) -> tuple[tuple[int, ...], ...]:
    """Every rank's ``slots`` compact headers as int64 words, from the bytes of ``buf``
    at ``at[r]`` (only the headers are read: on the CPU with ``struct`` where they
    landed, elsewhere copied to the host together). Every round reads its headers here."""
    fmt = header_struct(slots)
    if buf.device.type == "cpu":
        raw = _char_array(buf.numel()).from_address(buf.data_ptr())
        return tuple(fmt.unpack_from(raw, a) for a in at)
    head = slots * HEADER_BYTES
    words = torch.cat([buf[a : a + head] for a in at]).cpu().view(torch.int64)
    return tuple(tuple(row) for row in words.view(len(at), -1).tolist())


@functools.lru_cache(maxsize=16)
def _char_array(n: int) -> type[ctypes.Array[ctypes.c_char]]:
    """The ctypes type of ``n`` bytes (made once per size: a type is costly to make)."""
    return ctypes.c_char * n


_HANDED_BACK: weakref.WeakKeyDictionary[dist.ProcessGroup, dict[str, list[torch.Tensor]]] = (
    weakref.WeakKeyDictionary()
)
"""Per group and purpose: the last ``_KEPT_BUFFERS`` buffers a large round received into
and handed back as (a view of) its result, newest first, kept to be received into
again once nothing else refers to them."""

_KEPT_BUFFERS: Final = 2
"""Buffers kept per group and purpose. Two, not one: gloo's worker thread lets go of a
collective's tensors a moment after ``wait()`` returns, so the last call's buffer is
often still held when the next call starts (measured at 4 ranks, calls back to back:
in a quarter to a third of the calls); the one before it is free by then."""

_KEPT_LOCK: Final = threading.Lock()


def _handed_back_buffer(
    pg: dist.ProcessGroup | None, purpose: str, size: int, device: torch.device
) -> torch.Tensor:
    """A buffer of ``size`` bytes for a round whose result is a view of it: one of the
    group's last ``_KEPT_BUFFERS`` when it is this size and its result is gone, else a
    fresh one (kept for the next calls).

    Why: a fresh buffer of a few MiB is often fresh pages (the allocator maps them or
    grows its heap), about one page fault per 4 KiB touched: 1,000 for 4 MB, measured
    at 1-3 ms a call when other allocations come between two calls, as much as the
    collective. A result is gone when nothing holds the buffer's storage but this
    cache: no tensor or view of it (autograd's saved tensors and ``numpy()`` arrays hold
    it too; so does gloo for a moment after a collective), counted by the storage's use
    count. On the CPU only (another device's memory may still be in use by a stream).
    The cache holds at most ``_KEPT_BUFFERS`` buffers per group and purpose, the newest
    ones, whatever their size: memory the group holds between calls (up to twice the
    last large result's size, less what the caller still holds of them).
    """
    if pg is None or device.type != "cpu":
        return torch.empty(size, dtype=torch.uint8, device=device)
    kept = _HANDED_BACK.get(pg, {}).get(purpose, [])
    with _KEPT_LOCK:  # taken out until handed back: another thread makes its own
        for i, buf in enumerate(kept):
            if buf.numel() == size and _unreferenced(buf):
                return kept.pop(i)
    return torch.empty(size, dtype=torch.uint8)


def _hand_back(pg: dist.ProcessGroup | None, purpose: str, buf: torch.Tensor) -> None:
    """Keep ``buf`` for ``_handed_back_buffer`` after the round that received into it."""
    if pg is not None and buf.device.type == "cpu":
        with _KEPT_LOCK:
            kept = _HANDED_BACK.setdefault(pg, {}).setdefault(purpose, [])
            kept.insert(0, buf)
            del kept[_KEPT_BUFFERS:]


def _unreferenced(buf: torch.Tensor) -> bool:
    """Whether nothing but ``buf`` itself holds its storage (no result, no view)."""
    storage = buf.untyped_storage()
    # ``storage`` is one reference of its own, ``buf`` the other (torch's private count
    # of the storage's owners; ``test_fused`` checks it against views and saved tensors).
    return torch._C._storage_Use_Count(storage._cdata) <= 2


def _cutter(buf: torch.Tensor, starts: Sequence[int]) -> Cut:
    """The results from one rank-major payload buffer whose region r (rank r's slot)
    starts at ``starts[r]``."""

    def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        w = len(needs)
        if len(layouts) == 1 and layouts[0].pre == 1:
            # One tensor whose blocks are adjacent in the result: compact in place
            # (nothing moves when every slot was a rank's exact need); the result is a
            # view of the received buffer, no second buffer.
            lay = layouts[0]
            at = 0
            for r in range(w):
                if starts[r] != at and needs[r]:
                    _move_left(buf, at, starts[r], needs[r])
                at += needs[r]
            if lay.total == 0:
                return [torch.empty(lay.output_shape, dtype=lay.dtype, device=buf.device)]
            return [buf[:at].view(lay.dtype).view(lay.output_shape)]
        return unpack([buf[starts[r] : starts[r] + needs[r]] for r in range(w)], layouts)

    return cut


_FRESH: Final = FusedState()
_ZEROS: Final = bytes(SMALL_BYTES)
_KEEP_RECV_MAX: Final = 512 << 10
"""Past this many bytes received (``W x block``) a round whose one result's rank blocks
are adjacent receives into a fresh buffer that becomes the result (``_Round``)."""
_REUSE_MAX_BYTES: Final = 4 << 20
"""The largest receive buffer (``W x block`` bytes) a group keeps between calls."""

Cut = Callable[[tuple[Layout, ...], tuple[int, ...]], list[torch.Tensor]]


class _Round:
    """One group's send buffer (and, for a small round, its receive buffer) for the
    fused round of one kind, kept from call to call (CPU only): the headers are
    rewritten only when they change, the payload is copied into its slot in one copy
    per tensor (a ``memmove`` from a plain tensor's bytes, ``_plain``; else a typed
    view's ``copy_``), the bytes that must be zero are cleared only where an earlier
    payload left others, and the received headers are read with ``struct`` straight
    from the received bytes.

    A round of at most ``_KEEP_RECV_MAX`` received bytes keeps its receive buffer (a
    ``bytearray``) and cuts every result out of it as a fresh tensor (one ``memmove``
    per rank when its rank blocks are adjacent, ``_copied_out``; else ``torch.cat`` of
    views): nothing returned aliases the kept buffers. A larger round receives into a
    buffer of its own per call (``receive``: fresh, or one of the group's last
    ``_KEPT_BUFFERS`` once its result is gone, ``_handed_back_buffer``) and, for one tensor whose rank blocks are
    adjacent in the result (``pre == 1``), closes the header gaps and the unused slot
    space up in place (``_move_left``) and returns a view of it: one pass over bytes
    that are still in cache instead of a copy into a second buffer as large. Keeping
    the buffer and copying out of it made a 1 MiB call's working set (payload, send
    slot, receive buffer, result) outgrow this machine's 2 MiB L2: the copy-out alone
    cost 4x the 512 KiB one (``docs/performance.md``). The result then holds the whole
    receive buffer, at most ``1 + WASTE_LIMIT`` times its bytes plus the headers (else
    it is cut out by ``torch.cat`` as for a kept buffer).

    ``lock`` keeps a second thread on the same group (already a misuse of the group)
    from sharing the kept buffers: it takes fresh buffers instead.
    """

    def __init__(self, world: int, slots: int, capacity: int) -> None:
        self.key = (world, slots, capacity)
        self.world = world
        self.head = slots * HEADER_BYTES
        self.block = self.head + capacity
        self.fmt = header_struct(slots)
        self.header_at = [r * self.block for r in range(world)]  # where each rank's headers land
        self.raw_send = bytearray(self.block)
        self.send = torch.frombuffer(self.raw_send, dtype=torch.uint8)
        self.send_at = self.send.data_ptr() + self.head  # the payload slot's address
        self.payload_at: list[int] = []  # where each rank's payload lands in ``recv``
        self.raw_recv = bytearray()  # the kept receive buffer, made at its first use
        self.recv: torch.Tensor | None = None
        self.payloads: Sequence[torch.Tensor] = ()
        self.slots = slots
        self.lock = threading.Lock()
        self.header_key: object = None  # what the headers in ``send`` encode
        self.slot_key: object = None  # the records the payload views are cut for
        self.slot_views: list[tuple[torch.Tensor, bool]] = []
        self.dirty = 0  # payload bytes of ``send`` that may be non-zero
        self.cut_key: object = None  # the layouts the output views are cut for
        self.cut_parts: list[list[torch.Tensor]] = []

    def fill(
        self,
        header_key: tuple[tuple[CallRecord, ...], int, int],
        own: Sequence[torch.Tensor],
        nbytes: int,
    ) -> None:
        """Headers (when changed), this rank's payload and zeros into ``send``."""
        records, k, flags = header_key
        if header_key != self.header_key:
            self.fmt.pack_into(self.raw_send, 0, *encode_headers(self.slots, records, k, flags))
            self.header_key = header_key
        filled = 0
        if own and all(_plain(t) for t in own):
            at = self.send_at
            for t in own:  # each tensor's bytes as they lie, one ``memmove`` (no views)
                n = t.numel() * t.element_size()
                if n:
                    ctypes.memmove(at, t.data_ptr(), n)
                at += n
            filled = nbytes
        elif own:
            if records != self.slot_key:
                self.slot_views = self._slot_views(own)
                self.slot_key = records
            for t, (view, typed) in zip(own, self.slot_views, strict=True):
                if typed:  # the same bytes as ``pack``'s, in one copy whatever the strides
                    view.copy_(t.detach() if t.requires_grad else t)
                else:
                    view.copy_(_bytes_of(t))
            filled = nbytes
        if self.dirty > filled:  # no stale memory to the peers
            if self.dirty - filled <= len(_ZEROS):
                self.raw_send[self.head + filled : self.head + self.dirty] = _ZEROS[
                    : self.dirty - filled
                ]
            else:
                self.send[self.head + filled : self.head + self.dirty].zero_()
        self.dirty = filled

    def _slot_views(self, own: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, bool]]:
        """Where each tensor's bytes go in the payload slot: a view with its dtype and
        shape when the offset allows (one copy, any strides), else flat bytes."""
        views = []
        at = self.head
        for t in own:
            n = t.numel() * t.element_size()
            region = self.send[at : at + n]
            if at % t.element_size() == 0:
                views.append((region.view(t.dtype).view(t.shape), True))
            else:
                views.append((region, False))
            at += n
        return views

    def receive(self, adjacent: bool, pg: dist.ProcessGroup | None) -> torch.Tensor:
        """The buffer this call's round receives into: a buffer of its own for a large
        round whose one result's rank blocks are ``adjacent`` (it becomes the result)
        or for a round too large to keep (``pg``'s handed-back one, or fresh), else the
        kept one (made at its first use). ``pg`` is passed, not kept: ``_ROUNDS`` is
        weakly keyed by it."""
        size = self.world * self.block
        if (adjacent and size > _KEEP_RECV_MAX) or size > _REUSE_MAX_BYTES:
            return _handed_back_buffer(pg, "gather", size, torch.device("cpu"))
        if self.recv is None:
            self.raw_recv = bytearray(size)
            self.recv = torch.frombuffer(self.raw_recv, dtype=torch.uint8)
            self.payloads = self.recv.view(self.world, self.block)[:, self.head :].unbind(0)
            base = self.recv.data_ptr()
            self.payload_at = [base + r * self.block + self.head for r in range(self.world)]
        return self.recv

    def rows(self, recv: torch.Tensor) -> tuple[tuple[int, ...], ...]:
        """Every rank's received headers in ``recv`` as int64 words (``_read_headers``)."""
        return _read_headers(recv, self.header_at, self.slots)

    def cutter(self, recv: torch.Tensor) -> Cut:
        """How this call's results are cut out of ``recv`` (``receive``'s buffer)."""
        if recv is self.recv:
            return self.cut

        starts = [r * self.block + self.head for r in range(self.world)]
        in_place = _cutter(recv, starts)  # the wide round's: closed up in place, or unpacked

        def cut(layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
            if not within_waste(recv.numel() - self.world * self.head, sum(needs)):
                # Too much padding to hand back with the result: cut it out.
                return unpack(
                    [recv[a : a + n] for a, n in zip(starts, needs, strict=True)], layouts
                )
            return in_place(layouts, needs)

        return cut

    def cut(self, layouts: tuple[Layout, ...], needs: tuple[int, ...]) -> list[torch.Tensor]:
        """The results, fresh tensors, from the kept receive buffer (``unpack``'s values)."""
        if all(lay.pre == 1 for lay in layouts):
            return _copied_out(self.payload_at, layouts)
        if layouts is not self.cut_key:
            self.cut_parts = _parts(self.payloads, layouts)
            self.cut_key = layouts
        outputs = []
        for layout, parts in zip(layouts, self.cut_parts, strict=True):
            if layout.pre * layout.total * layout.post == 0:
                outputs.append(torch.empty(layout.output_shape, dtype=layout.dtype))
                continue
            outputs.append(torch.cat(parts, dim=1).view(layout.dtype).view(layout.output_shape))
        return outputs


def _plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes, in row-major order, are the ``numel * element_size`` bytes
    at ``t.data_ptr()``: a plain tensor (no subclass, no lazy conjugate or negation
    bit), contiguous, on the CPU."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )


def _copied_out(at: Sequence[int], layouts: Sequence[Layout]) -> list[torch.Tensor]:
    """The results of a round on the CPU whose rank r's payload (its tensors' bytes one
    after the other) starts at address ``at[r]``, for layouts whose rank blocks are
    adjacent in the result (``pre == 1``): each result a fresh tensor, filled by one
    ``memmove`` per rank. With sizes changing every call this cuts no views (``_parts``
    would make 2 W of them per tensor, each a few microseconds of dispatch)."""
    src = list(at)
    outputs = []
    for lay in layouts:
        out = torch.empty(lay.output_shape, dtype=lay.dtype)
        dst = out.data_ptr()
        row = lay.row_bytes
        for r, n in enumerate(lay.sizes):
            nbytes = n * row
            if nbytes:
                ctypes.memmove(dst, src[r], nbytes)
                dst += nbytes
                src[r] += nbytes
        outputs.append(out)
    return outputs


def _adjacent(record: CallRecord) -> bool:
    """Whether the result of a gather of this call has its rank blocks one after the
    other (``Layout.pre == 1``: no dimension before the gather dimension but 1s)."""
    dim = record.normalized_dim
    return 0 <= dim <= len(record.shape) and math.prod(record.shape[:dim]) == 1


def _parts(payloads: Sequence[torch.Tensor], layouts: Sequence[Layout]) -> list[list[torch.Tensor]]:
    """Per tensor, every rank's bytes of it as a ``(pre, n_r * row)`` view."""
    offsets = [0] * len(payloads)
    found = []
    for layout in layouts:
        row = layout.row_bytes
        parts = []
        for r, region in enumerate(payloads):
            n = layout.pre * layout.sizes[r] * row
            parts.append(
                region[offsets[r] : offsets[r] + n].view(layout.pre, layout.sizes[r] * row)
            )
            offsets[r] += n
        found.append(parts)
    return found


_ROUNDS: weakref.WeakKeyDictionary[dist.ProcessGroup, dict[str, _Round]] = (
    weakref.WeakKeyDictionary()
)


def _round_for(
    pg: dist.ProcessGroup | None,
    kind: Kind,
    world: int,
    slots: int,
    capacity: int,
    device: torch.device,
) -> _Round | None:
    """``pg``'s kept buffers for a round of this size (made or remade), or ``None``."""
    if pg is None or device.type != "cpu":
        return None
    kept = _ROUNDS.get(pg)
    if kept is None:
        kept = _ROUNDS.setdefault(pg, {})
    rnd = kept.get(kind)
    if rnd is None or rnd.key != (world, slots, capacity):
        if rnd is not None and rnd.lock.locked():
            return None  # another thread's round: leave it to it
        rnd = kept[kind] = _Round(world, slots, capacity)
    return rnd


def _decide(
    kind: Kind,
    state: FusedState,
    calls: Sequence[CheckedCall],
    rows: tuple[tuple[int, ...], ...],
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    cut: Cut,
    room: tuple[int, ...],
) -> Exchanged:
    """Every rank's verdict from the gathered headers ``rows`` (the same on every rank);
    ``room[r]``: the payload bytes rank r's slot held in this round."""
    last = None if pg is None else _LAST.get(pg, {}).get(kind)
    if last is not None and last[0] == rows:
        # The very headers of the last call that validated: the verdict is a pure
        # function of them, so it is the same (and the same on every rank).
        return _finish(kind, state, last[1], last[2], True, info, pg, last[3], cut, room)
    if last is not None:
        resized = _resized(last[0], last[1], rows)
        if resized is not None:
            needs = _needs(resized, info.world_size)
            if pg is not None:
                _LAST.setdefault(pg, {})[kind] = (rows, resized, last[2], needs)
            return _finish(kind, state, resized, last[2], True, info, pg, needs, cut, room)
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
    compact = len(set(counts)) == 1 and k <= slots
    if compact:
        compact = not any(
            header_flags(headers[i]) & (FLAG_PROBLEM | FLAG_LONG)
            for headers in per_rank
            for i in range(k)
        )
    layouts: tuple[Layout, ...] | None = None
    if compact:
        try:
            layouts = tuple(
                validate_records(
                    [decode_header(headers[i]) for headers in per_rank], rank=info.rank
                )
                for i in range(k)
            )
        except VarGatherError:
            layouts = None
    w = info.world_size
    if layouts is None:
        layouts = _full_path(kind, calls, counts, kinds, info)
        needs = _needs(layouts, w)
        return _finish(kind, state, layouts, fusable, False, info, pg, needs, cut, room)
    needs = _needs(layouts, w)
    if pg is not None:
        _LAST.setdefault(pg, {})[kind] = (rows, layouts, fusable, needs)
    return _finish(kind, state, layouts, fusable, True, info, pg, needs, cut, room)


def _resized(
    before: tuple[tuple[int, ...], ...],
    layouts: tuple[Layout, ...],
    rows: tuple[tuple[int, ...], ...],
) -> tuple[Layout, ...] | None:
    """The layouts of ``rows`` when they are the validated headers ``before`` (whose
    layouts are ``layouts``) with only the sizes along each gather dimension changed and
    no rank passing ``sizes``; else ``None`` (validate them in full).

    What ``validate_records`` would return for ``rows``: every field it compares is as
    in ``before``, which passed; the new sizes are checked ``>= 0``; with no ``sizes``
    passed (length -1 in every header) nothing else depends on the sizes.
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


_LAST: weakref.WeakKeyDictionary[
    dist.ProcessGroup,
    dict[str, tuple[tuple[tuple[int, ...], ...], tuple[Layout, ...], bool, tuple[int, ...]]],
] = weakref.WeakKeyDictionary()
"""Per group and kind: the headers of the last call that validated compactly, its
layouts, whether every rank was eligible and every rank's payload bytes (a cache of a
pure function)."""


@functools.lru_cache(maxsize=64)
def _advanced(state: FusedState, fusable: bool, count: int, needs: tuple[int, ...]) -> FusedState:
    """``advance`` after a call with every rank's payload ``needs``, remembered: a pure
    function of its arguments (the same on every rank), and in the steady state the
    same arguments every call (saves its ~8 us of Python per call)."""
    need = max(needs, default=0)
    return advance(state, fusable=fusable, need=need, count=count, needs=needs)


def _finish(
    kind: Kind,
    state: FusedState,
    layouts: tuple[Layout, ...],
    fusable: bool,
    compact: bool,
    info: GroupInfo,
    pg: dist.ProcessGroup | None,
    needs: tuple[int, ...],
    cut: Cut,
    room: tuple[int, ...],
) -> Exchanged:
    """Advance the state from the validated layouts; cut out the results if fused."""
    after = _advanced(state, fusable, len(layouts), needs)
    if pg is not None and after is not state:
        _STATES[pg] = after
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


def swap_state(group: dist.ProcessGroup | None, state: FusedState) -> FusedState:
    """Install ``state`` as ``group``'s learned state on this rank; return the one it
    replaces (``FusedState()`` for a group that had none). For the bench, which gives
    each of its call patterns on one group the state that pattern alone would have
    learned; every rank must swap alike, or the ranks disagree on the next round."""
    pg = _key(group)
    if pg is None:
        return state
    before = _STATES.get(pg, _FRESH)
    _STATES[pg] = state
    return before


def replace_state(
    group: dist.ProcessGroup | None, kind: Kind, **changes: int | tuple[int, ...]
) -> None:
    """Tests only: set fields of ``group``'s state on this rank (every rank must do the
    same, or the ranks disagree on the next round's size)."""
    pg = _key(group)
    if pg is not None:
        _STATES[pg] = replace(state_of(group, kind), **changes)  # type: ignore[arg-type]  # each field keeps its own type; tests pass them right

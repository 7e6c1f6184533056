"""The one round's state policy: one state type, its rules, the one per-group registry.

Where it sits: beneath the one-round exchanges (``_fused``, ``_family``) and their kept
buffers (``_round_buffers``); it imports ``_collectives`` only. It holds the **one state
type** (``FusedState``), the size rules (``bucket``, ``capacity_step``, the padding
bounds), each round shape's ``advance`` rule, and the **one registry** (``MEMORY``) in
which every round keeps its state (one per group and ``_collectives.RoundShape``:
``StateCell``), its buffers and its caches.

**The all_gather-shaped round** (``advance``): applied on every rank after a call whose
headers validated, from the validated layouts only, before any payload moves; ``need``
is the largest payload any rank had (bytes of all its tensors), ``needs`` every rank's.
The gather round's ``capacity`` and the header ``slots`` follow ``docs/architecture.md``
("The state"), as does which calls change nothing. The wide round: a call *goes wide*
when every rank is eligible and, with ``padded = W * bucket(need)`` (what the gather
round would carry) and ``sum(needs)`` the payload: ``need > WIDE_MIN_BYTES`` (128 KiB),
or ``padded > max(PAD_LIMIT * sum(needs), SMALL_BYTES)`` (strong skew on many ranks). A
group's first such call sets ``wide = needs`` exactly; a later one where some rank
outgrew its slot (a miss: that call took two rounds) sets every slot to ``max(wide[r],
bucket(needs[r]))``; a miss by an eligible call that does not go wide ends the wide
round at once (the gather round's capacity grew to it in the same call); a call that
goes wide and fits, with no slot at least twice ``bucket`` of its need, ends any idle
streak, and once ``SHRINK_AFTER`` such calls in a row had the very same needs (calls
that do not go wide between them neither count nor break the row), ``wide`` becomes
those needs exactly (a stable skew sends no padding, whatever sizes came before it); any
other call is idle, and after ``SHRINK_AFTER`` idle calls in a row ``wide`` becomes the
largest needs of the streak's wide calls (or empty, back to the gather round, when none
went wide).

**Padding bound.** ``bucket(n) <= max(64, 1.125 n)``. In the wide round a rank's slot
is its exact need from a group's first wide call while sizes stay, and again after
``SHRINK_AFTER`` calls in a row with the same sizes once they moved; in between it is
at most ``bucket`` of the largest need it had since the slots were set (12.5 % of
that, 64 bytes at least), and never more than twice ``bucket`` of its need for more
than ``SHRINK_AFTER - 1`` calls in a row; no rank's slot depends on another rank's
size. In the gather round every slot is ``capacity`` (at most ``FUSED_MAX_BYTES``), so
a rank receives at most ``W * capacity`` bytes. A group is in the gather round only
after a call that did not go wide, so for that call's sizes ``W * bucket(need) <=
max(PAD_LIMIT * sum(needs), SMALL_BYTES)`` with ``need <= FUSED_MAX_BYTES``: at most
``PAD_LIMIT`` times the payload, or 128 KiB in all, and never more than 128 KiB per
rank. While sizes move the capacity is ``bucket`` of the largest need of the last
``SHRINK_AFTER`` calls (or of the calls since it last grew), not of the current call,
so one call's padding can exceed the bound by what its sizes fell since then;
``SHRINK_AFTER`` calls at the smaller sizes restore it.

A group that mixes the collectives of this round pays a little padding: its capacity
and header slots follow the largest need and tensor count of every one's calls.

**The all_to_all-shaped round** (``advance_blocks``): the state is the same type. Its
equal slots are ``capacity``, ``idle`` and ``idle_need`` (the bytes of the payload
slot each rank sends every rank), moved by the gather round's rule with ``need`` the
largest block, ``FAMILY_FUSED_MAX`` for ``FUSED_MAX_BYTES`` and ``block_slot`` for
``bucket`` (``capacity_step``). Its wide slots are ``wide`` and its
streak fields, one slot per ordered pair of ranks (``wide[j * W + k]``: rank ``j`` to
rank ``k``), moved by the wide round's rule above with the ``W * W`` blocks for needs
and ``need > FAMILY_FUSED_MAX`` for going wide (``wide_blocks``: the slots the round
uses, at least ``capacity``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Generic, NamedTuple, TypeVar

import torch
import torch.distributed as dist

from ._collectives import COLLECTIVES, CollectiveName

FUSED_MAX_BYTES: Final = 128 * 1024
"""Largest payload per rank that rides in the gather round. 512 KiB until
the wide round's headers rode in its broadcasts: since then the wide round beats the
gather round from 128 KiB per rank up (``docs/performance.md``); below, the two are even
at 4 ranks and the gather round is one operation, not 2 (W - 1)."""

WIDE_MIN_BYTES: Final = FUSED_MAX_BYTES
"""A call whose largest payload per rank exceeds this many bytes goes wide (module doc)."""

SMALL_BYTES: Final = 128 * 1024
"""Bytes in all that the gather round may always carry, whatever ``PAD_LIMIT`` says
(latency dominates there)."""

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


FRESH: Final = FusedState()
"""The state of a group's first round (and of a world of one rank, which keeps none)."""


PAD_LIMIT: Final = 4
"""The most padding, as a multiple of the payload, the gather round may carry past
``SMALL_BYTES``: a call that would carry more (strong skew on many ranks) goes wide
even for small payloads (module doc)."""


def within_waste(padded: int, payload: int) -> bool:
    """Whether ``padded`` bytes carry ``payload`` bytes with at most ``WASTE_LIMIT`` of
    padding."""
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


def _advance_wide(
    state: FusedState,
    fusable: bool,
    needs: Sequence[int],
    wants: Callable[[Sequence[int]], bool] = _wants_wide,
) -> _WideStep:
    """The wide round's rule (module doc) for ``advance`` and ``advance_blocks``: one
    slot per entry of ``needs`` (a rank's payload, or a block from one rank to one
    rank); ``wants``: whether a call of these needs goes wide."""
    wide, idle, most = state.wide, state.wide_idle, state.wide_max
    large = fusable and wants(needs)
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
    if large and not any(0 < c >= 2 * bucket(n) for n, c in zip(needs, wide, strict=True)):
        # in use, no slot twice too large (an empty slot for an empty block is exact:
        # a rooted call's every other block); a steady row makes the slots exact
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
    if wants(most):
        return most, 0, (), 0, ()
    return (), 0, (), 0, ()


def capacity_step(
    current: tuple[int, int, int], *, small: bool, need: int, slot: Callable[[int], int]
) -> tuple[int, int, int]:
    """One call's step of a learned capacity ``(capacity, idle, idle_need)``: the gather
    round's rule (``docs/architecture.md``) with ``slot`` for ``bucket``, shared by both
    round shapes."""
    capacity, idle, idle_need = current
    if small and 4 * need > capacity:
        return max(capacity, slot(need)), 0, 0
    if capacity == 0 and idle_need == 0 and slot(0) == 0:
        # Nothing to shrink, and a small need here is 0 (any other grows it): a streak
        # would end at slot(0) = 0 where it began, so none is counted, and the state is
        # a fixed point (a steady caller's state stays the very same object).
        return 0, 0, 0
    idle += 1
    if small:
        idle_need = max(idle_need, need)
    if idle >= SHRINK_AFTER:
        return slot(idle_need), 0, 0
    return capacity, idle, idle_need


def advance(
    state: FusedState, *, fusable: bool, need: int, count: int, needs: Sequence[int] = ()
) -> FusedState:
    """The all_gather-shaped round's state after a call that validated, from what every
    rank saw (without ``needs`` the wide slots only count the call as idle)."""
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
    after = FusedState(capacity, slots, idle, idle_need, fewer, fewer_max, *wide_step)
    return state if after == state else after  # unchanged (the steady state): no new object


FAMILY_FUSED_MAX: Final = 16 * 1024
"""Largest block (bytes, from one rank to one rank) the all_to_all-shaped round's equal
slots carry; a call with a larger block goes wide (module doc), so no pair's message is
padded to the largest block. 16 KiB: past it equal slots send a mild skew's payload 1.4x
over, the wide round (packed, ``_family``) sends it once plus a row per pair, in one
collective either way. On 4 gloo ranks on 2 cores the two cost the same: CPU per call
summed over the ranks, against one ``all_to_all_single`` with the splits known, read
2.02x (equal slots to 128 KiB) and 1.99x (wide from 16 KiB) at 1 MiB of mild blocks
(46-81 KiB), within the spread of one configuration; a link that pays for bytes pays
less wide."""


def whole_16(n: int) -> int:
    """``n`` bytes rounded up to a multiple of 16 (the all_to_all-shaped round starts
    every slot at a 16-byte boundary, so any dtype views it)."""
    return -(-n // 16) * 16


def block_slot(n: int) -> int:
    """``bucket(n)`` rounded up to 16 bytes (``whole_16``)."""
    return whole_16(bucket(n))


def _wants_wide_blocks(needs: Sequence[int]) -> bool:
    """Whether a call of these blocks (one per ordered pair of ranks) goes wide: past
    ``FAMILY_FUSED_MAX`` the equal slots' two copies cost more than the transfer they
    join."""
    return max(needs, default=0) > FAMILY_FUSED_MAX


@functools.lru_cache(maxsize=64)
def wide_blocks(state: FusedState) -> tuple[int, ...]:
    """The wide slots at least ``capacity``, so a small call after large ones still
    rides (on gloo only the block's own bytes travel, whatever its slot)."""
    return tuple(max(c, state.capacity) for c in state.wide)


def is_wide(state: FusedState, world: int) -> bool:
    """Whether the all_to_all-shaped round of ``state`` has gone wide (``W * W`` slots)."""
    return len(state.wide) == world * world


def block_room(state: FusedState, world: int) -> tuple[int, ...]:
    """The all_to_all-shaped round's slot per ordered pair of ranks (``j * W + k``)."""
    if is_wide(state, world):
        return wide_blocks(state)
    return (state.capacity,) * (world * world)


def advance_blocks(
    state: FusedState, *, fusable: bool, blocks: Sequence[int], world: int
) -> FusedState:
    """The all_to_all-shaped round's state after a call that validated (``blocks``: the
    bytes rank ``j`` sends rank ``k`` at ``j * W + k``), remembered for recent arguments
    keyed by the ``FAMILY_FUSED_MAX`` in force (a test may set another)."""
    after = _advance_blocks(state, fusable, tuple(blocks), world, FAMILY_FUSED_MAX)
    return state if after == state else after  # unchanged is the very state passed in


@functools.lru_cache(maxsize=64)
def _advance_blocks(
    state: FusedState, fusable: bool, blocks: tuple[int, ...], world: int, fused_max: int
) -> FusedState:
    """``advance_blocks``' body (``fused_max`` only keys the cache)."""
    need = max(blocks, default=0)
    capacity, idle, idle_need = capacity_step(  # a call that goes wide is not small
        (state.capacity, state.idle, state.idle_need),
        small=fusable and need <= FAMILY_FUSED_MAX,
        need=need,
        slot=block_slot,
    )
    wide_step = _advance_wide(state, fusable, blocks, _wants_wide_blocks)
    after = FusedState(
        capacity, state.slots, idle, idle_need, state.fewer, state.fewer_max, *wide_step
    )
    return state if after == state else after


# --- the one registry: per group, per collective ---------------------------------------


@dataclass(eq=False, slots=True)
class StateCell:
    """The state of one round shape on one group, shared by the ``Memory`` of every
    collective of that shape (a peer calling another of them sends the same length)."""

    state: FusedState = FRESH


S = TypeVar("S")
F = TypeVar("F")


class Last(NamedTuple, Generic[S, F]):
    """A collective's ``Memory.last``: what every rank received, ``seen`` (the rows'
    bytes or the headers' words), and what it read as, ``found`` (the same on every
    rank; in the steady state every call receives the same)."""

    seen: S
    found: F


@dataclass(eq=False, slots=True)
class Memory:
    """Everything one group keeps for one collective's round, from call to call: the
    shared state, the kept buffers (``round``), the last verdict (``last``), the steady
    replay (``steady``, and ``joined``: several steady calls by key) and this rank's
    last call by its key (``known``). The rounds own what they put in untyped slots."""

    shared: StateCell
    known: tuple[tuple[object, ...], object] | None = None  # a call by its key
    round: object = None
    last: Last[Any, Any] | None = None
    steady: object = None
    joined: dict[tuple[object, ...], object] = field(default_factory=dict)


class GroupMemory:
    """One group's entry of ``MEMORY``: its state cells per round shape, its ``Memory``
    per collective, and the handed-back receive buffers per purpose."""

    __slots__ = ("__weakref__", "calls", "cells", "handed")

    def __init__(self) -> None:
        self.cells: dict[str, StateCell] = {}
        self.calls: dict[str, Memory] = {}
        self.handed: dict[str, list[torch.Tensor]] = {}


MEMORY: Final = weakref.WeakKeyDictionary[dist.ProcessGroup, GroupMemory]()
"""The one registry of the rounds: per process group (weakly keyed, so a destroyed group
takes its entry along; subgroups apart)."""


def group_memory(pg: dist.ProcessGroup) -> GroupMemory:
    """``pg``'s entry of ``MEMORY``, made at its first use."""
    return MEMORY.get(pg) or MEMORY.setdefault(pg, GroupMemory())


def memory(pg: dist.ProcessGroup, collective: CollectiveName) -> Memory:
    """``pg``'s ``Memory`` of ``collective``, made at its first use, sharing the state
    cell of its round shape."""
    group = MEMORY.get(pg) or group_memory(pg)
    found = group.calls.get(collective)
    if found is None:
        shape = COLLECTIVES[collective].round
        cell = group.cells.get(shape) or group.cells.setdefault(shape, StateCell())
        found = group.calls[collective] = Memory(cell)
    return found


def group_key(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The process group ``group`` names (``None``: the default group), or ``None`` when
    there is none to key a registry by."""
    pg = group if group is not None else dist.group.WORLD
    return pg if isinstance(pg, dist.ProcessGroup) else None


def state_of(
    group: dist.ProcessGroup | None = None, collective: CollectiveName = "all_gather_v"
) -> FusedState:
    """This process's copy of the state of ``collective``'s round on ``group`` (read
    only; ``None``: the default group)."""
    pg = group_key(group)
    return FRESH if pg is None else memory(pg, collective).shared.state


def set_state(pg: dist.ProcessGroup | None, collective: CollectiveName, state: FusedState) -> None:
    """After a validated call: ``state`` is the state of ``collective``'s round on ``pg``
    (every rank sets alike, from what every rank saw)."""
    if pg is not None:
        memory(pg, collective).shared.state = state


def swap_state(
    group: dist.ProcessGroup | None, state: FusedState, collective: CollectiveName = "all_gather_v"
) -> FusedState:
    """Install ``state`` on this rank; return the one it replaces (``FRESH`` for a group
    that had none). For the bench, which gives each of its call patterns on one group
    the state that pattern alone would have learned; every rank must swap alike, or the
    ranks disagree on the next round."""
    pg = group_key(group)
    if pg is None:
        return state
    cell = memory(pg, collective).shared
    before, cell.state = cell.state, state
    return before


def replace_state(
    group: dist.ProcessGroup | None, collective: CollectiveName, **changes: int | tuple[int, ...]
) -> None:
    """Tests only: set fields of the state on this rank (every rank must do the same)."""
    changed = replace(state_of(group, collective), **changes)  # type: ignore[arg-type]  # each field keeps its own type; tests pass them right
    swap_state(group, changed, collective)


def reset_state(
    group: dist.ProcessGroup | None = None, collective: CollectiveName = "all_gather_v"
) -> None:
    """Tests only: forget the state on this rank (every rank must do the same)."""
    set_state(group_key(group), collective, FRESH)

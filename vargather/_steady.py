"""A collective's way into the all_to_all-shaped round, and its steady replay.

Where it sits: on the round (``_family``), the registry (``_round_state``) and the kept
buffers; below the collectives that ride the round, each of which hands it a
``RoundSpec``: nothing of the spec is the round's, nothing of the replay is the
collective's. ``run_round`` is the full path; ``replay`` the steady path
(``docs/family.md``, "The steady path"): a call whose key is the group's last steady
call's, in the very state that call left unchanged, sends the same bytes, and when
every rank's row came back as last time the remembered plan is the plan. Any other key
goes to the collective's ``resized``, else the full path runs.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

import torch
import torch.distributed as dist

from ._collectives import CollectiveName
from ._family import (
    DirectRound,
    Exchanged,
    PackedRound,
    exchange_fused,
    fill_packed,
    landed,
    run_direct,
    run_packed,
    settle,
)
from ._group import GroupInfo, process_group
from ._round_buffers import Cut, plain, plain_bytes, region_cutter
from ._round_state import FusedState, Memory, memory
from ._rows import FamilyCall

T = TypeVar("T")
P = TypeVar("P")

Key = tuple[object, ...]


@dataclass(frozen=True)
class Steady(Generic[P]):
    """A collective's last steady call on a group (its ``Memory.steady``): ``replays``
    when it left the state it was sized from unchanged (the very same call may then
    skip the state rule); ``raw``, the rows every rank sent; ``needs``, the bytes each
    rank sent this rank; ``lies``, the blocks' lengths when they are ``x``'s bytes as
    they lie (a function of the key); ``spare``, packed send buffers with every row and
    zero written (taken out while in use). Nothing in it refers to the group, which
    keys it weakly."""

    key: Key
    call: FamilyCall
    state: FusedState
    replays: bool
    round: PackedRound | DirectRound
    raw: bytes
    plan: P
    needs: tuple[int, ...]
    lies: tuple[int, ...] | None = None
    spare: list[torch.Tensor] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True)
class RoundSpec(Generic[T, P]):
    """What a collective of the all_to_all pattern hands the round, from its own module.
    ``validate(rows, rank=)``: every rank's rows to the call's verdict, or the error
    every rank raises alike (a pure function of the rows; wrap it in
    ``ValidatedOnce``); ``outgoing(x, call, info)``: this rank's payload as flat bytes
    and the bytes of its block for each rank, in rank order (an empty block to a rank
    that gets nothing); ``plan(verdict, x, call, info)``: the plan (no result) and the
    bytes rank ``j`` sends rank ``k`` at ``j * W + k``, the same on every rank;
    ``finish(plan, slots, cut)``: the plan with its result from ``slots[j]``, the block
    rank ``j`` sent this rank (``cut``: the round's cutter of its one receive buffer).
    Steady calls are kept one per collective, or, by ``kept(key)`` when it is not
    ``None``, up to ``JOINED_KEPT``; ``resized(steady, key, x, info, pg, state)``: a
    call whose key is not the kept one's (or in another state), the collective's own
    way, or ``None``."""

    name: CollectiveName
    validate: Callable[..., T]
    outgoing: Callable[[object, FamilyCall, GroupInfo], tuple[torch.Tensor, Sequence[int]]]
    plan: Callable[[T, object, FamilyCall, GroupInfo], tuple[P, Sequence[int]]]
    finish: Callable[[P, Sequence[torch.Tensor], Cut], P]
    kept: Callable[[Key], Key | None] | None = None
    resized: (
        Callable[[Steady[P], Key, torch.Tensor, GroupInfo, dist.ProcessGroup, FusedState], P | None]
        | None
    ) = None


JOINED_KEPT: Final = 4
"""Steady calls kept per group by ``RoundSpec.kept`` (``Memory.joined``, the oldest
dropped; other calls keep one, ``Memory.steady``): Ulysses alternates ``all_to_all_v``
calls joined along another dim of several shapes (Q, K and V to the heads, the output
back), each replaying its own round while the group's state is the one it was sized
from."""


def run_round(
    spec: RoundSpec[T, P], call: FamilyCall, x: object, info: GroupInfo, key: Key | None = None
) -> P:
    """A validated call's full path on a communicating group: every rank's row and the
    blocks that fit (``exchange_fused``), then ``answer``."""
    ex = exchange_fused(call, info, x, functools.partial(spec.outgoing, x, call, info))
    return answer(spec, call, x, info, ex, key)


def answer(
    spec: RoundSpec[T, P],
    call: FamilyCall,
    x: object,
    info: GroupInfo,
    ex: Exchanged,
    key: Key | None = None,
) -> P:
    """After the round ``ex``: the verdict (the same error on every rank), the plan, the
    state moved (``settle``) and, when every block rode, the result from the slots;
    with ``key``, the call remembered for ``replay`` when the round answered it."""
    verdict = spec.validate(ex.rows, rank=info.rank)
    plan, blocks = spec.plan(verdict, x, call, info)
    slots = settle(ex, info, blocks)
    if key is not None:
        _remember(spec, key, call, x, info, ex, plan, slots)
    return plan if slots is None else spec.finish(plan, slots, ex.cut)


def _remember(
    spec: RoundSpec[T, P],
    key: Key,
    call: FamilyCall,
    x: object,
    info: GroupInfo,
    ex: Exchanged,
    plan: P,
    slots: Sequence[torch.Tensor] | None,
) -> None:
    """Keep the call for ``replay`` when its round answered it on the CPU, else forget
    the last one."""
    pg = process_group(info)
    if pg is None:
        return
    mem = memory(pg, spec.name)
    at = None if spec.kept is None else spec.kept(key)
    if at is None:
        mem.steady = None
    else:
        mem.joined.pop(at, None)
    if slots is None or info.default_device().type != "cpu":
        return
    needs = tuple(s.numel() for s in slots)
    flat, sizes = spec.outgoing(x, call, info)
    mine = x if isinstance(x, torch.Tensor) and plain(x) else None
    own = mine is not None and (flat.data_ptr() == mine.data_ptr() or not any(sizes))
    lies = tuple(sizes) if own else None  # the blocks' lengths when they are x's own bytes
    replays = mem.shared.state is ex.state
    keep(mem, at, Steady(key, call, ex.state, replays, ex.found, ex.raw, plan, needs, lies))


def keep(mem: Memory, at: Key | None, steady: Steady[P]) -> None:
    """``steady`` as ``mem``'s steady call (``at``: ``RoundSpec.kept``'s name for it)."""
    if at is None:
        mem.steady = steady
        return
    mem.joined[at] = steady
    while len(mem.joined) > JOINED_KEPT:
        mem.joined.pop(next(iter(mem.joined)))


def replay(spec: RoundSpec[T, P], key: Key | None, x: object, info: GroupInfo) -> P | None:
    """The plan of a call the steady path serves (module doc), else ``None``: the full
    path runs (always without ``key``)."""
    pg = process_group(info) if info.communicates else None
    if pg is None or key is None:
        return None
    mem = memory(pg, spec.name)
    at = None if spec.kept is None else spec.kept(key)
    steady = mem.steady if at is None else mem.joined.get(at)
    if not isinstance(steady, Steady):
        return None
    if steady.call.timeout is not None:  # the call's own, as the full path runs it
        info = info.with_timeout(steady.call.timeout)
    state = mem.shared.state
    if steady.key != key or not steady.replays or state is not steady.state:
        assert isinstance(x, torch.Tensor)  # a kept key is a tensor's
        return None if spec.resized is None else spec.resized(steady, key, x, info, pg, state)
    if steady.lies is not None:  # x's bytes as they lie (the key's tensor: a plain one)
        assert isinstance(x, torch.Tensor)
        flat, sizes = x, steady.lies
    else:
        flat, sent = spec.outgoing(x, steady.call, info)
        sizes = tuple(sent)
    found = steady.round
    if isinstance(found, DirectRound):
        pieces = torch.split(plain_bytes(flat)[: sum(sizes)], list(sizes))
        buf, raw = run_direct(steady.call, info, pg, found, pieces)
    else:
        buf, raw = _replay_packed(steady, found, flat, sizes, info, pg)
    if raw != steady.raw:
        return answer(
            spec, steady.call, x, info, landed(steady.call, info, pg, state, found, buf, raw)
        )
    regions = [buf[a : a + n] for a, n in zip(found.starts, steady.needs, strict=True)]
    return spec.finish(steady.plan, regions, region_cutter(buf, found.starts))


def _replay_packed(
    steady: Steady[P],
    packed: PackedRound,
    flat: torch.Tensor,
    sizes: Sequence[int],
    info: GroupInfo,
    pg: dist.ProcessGroup,
) -> tuple[torch.Tensor, bytes]:
    """The packed round of a steady call: a spare send buffer (its rows and zeros
    written when it was made: the same key sends the same blocks' lengths, so no block
    leaves stale bytes behind it) with the blocks of ``flat``'s bytes copied in."""
    try:
        send = steady.spare.pop()
    except IndexError:  # none spare (or another thread took the last one)
        send = torch.empty(sum(packed.out_bytes), dtype=torch.uint8)
        fill_packed(send, packed.row, None, packed.out_bytes, packed.head)
    base, source = send.data_ptr() + packed.head, flat.contiguous().data_ptr()
    at = taken = 0
    for n, size in zip(sizes, packed.out_bytes, strict=True):
        if n:
            ctypes.memmove(base + at, source + taken, n)
        at, taken = at + size, taken + n
    try:
        return run_packed(steady.call, info, pg, packed, send)
    finally:
        steady.spare.append(send)

"""Thin layer over torch.distributed, below every stage: every collective goes here.

Pipeline: argument checks -> wire format -> exchange and validation -> ``Layout`` ->
transport -> autograd. The stages that communicate (the exchange, the transports) do
so only through the wrappers here; nothing here knows about a ``Layout`` or padding.

It answers "who am I in this group" (``GroupInfo``) and wraps each collective so that

* a failure surfaces as a vargather ``CollectiveError`` instead of a bare backend
  ``RuntimeError``: ``CollectiveTimeoutError`` (a peer did not arrive in time),
  ``PeerLostError`` (a peer's connection closed: it died), ``CollectiveError`` else;
* a per-call ``timeout`` (``all_gather_v(..., timeout=...)``) replaces the group's
  default timeout for the collectives of that call, and the default is restored after;
* the ranks that never arrived are named: the **arrival census**. Before each
  collective a rank writes one key on the group's store,
  ``vargather/arrival/<rank> = "<n> <what>"``, where ``n`` counts this process's
  vargather collectives on the group. Ranks in step are at the same ``n``. When a
  collective fails, the rank reads every peer's key: a peer at a lower ``n`` (or
  with no key) never arrived at this collective; a peer at the same ``n`` in a
  different collective (``what``) is out of step. Gloo's own messages name no rank
  (``Timed out waiting 3000ms for recv operation to complete``; ``Connection closed
  by peer [127.0.0.1]:31657``), so this is the only way to say who is missing;
* data-movement collectives carry any dtype: one the backend refuses (gloo: int16,
  uint16/32/64) travels as its bytes.

The census costs one store write per collective, small against the smallest gloo
collective (``docs/misuse.md`` has the figures), and reads only after a failure. ``VARGATHER_ARRIVAL_CENSUS=0`` turns it off. It needs the
group's store (``ProcessGroup.get_group_store()``, else torch's private group map,
each guarded); without one, errors just name no rank. The counters live in the store
for the store's lifetime: re-creating a process group on the same store and prefix
after a failure can make a census misattribute, so its verdict is a diagnosis, not a
proof.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import torch
import torch.distributed as dist

from ._dtypes import NATIVE_DTYPES
from ._errors import CollectiveError, CollectiveTimeoutError, GroupError, PeerLostError

__all__ = [
    "CENSUS_ENV",
    "GroupInfo",
    "all_gather_equal",
    "all_gather_list",
    "all_reduce_sum",
    "all_to_all_uneven",
    "arrival_census_enabled",
    "broadcast_from_each",
    "group_timeout",
    "movable",
    "per_call_timeout_supported",
    "reduce_scatter_equal",
    "reduce_scatter_uneven",
    "resolve_group",
    "translate_collective_errors",
]

CENSUS_ENV: Final = "VARGATHER_ARRIVAL_CENSUS"
_CENSUS_VALUES: Final = {"1": True, "0": False, "": True}


def _census_from_env() -> bool:
    raw = os.environ.get(CENSUS_ENV, "").strip()
    if raw not in _CENSUS_VALUES:
        raise ValueError(
            f"${CENSUS_ENV}={raw!r} is not understood: expected '1' (on, the default) or '0'"
        )
    return _CENSUS_VALUES[raw]


_CENSUS_ON: Final = _census_from_env()


def arrival_census_enabled() -> bool:
    """Whether collectives record arrivals (``$VARGATHER_ARRIVAL_CENSUS``, read at import)."""
    return _CENSUS_ON


@dataclass(frozen=True)
class GroupInfo:
    """This process's place in the group a gather runs on.

    ``distributed`` is False when torch.distributed is unavailable or not initialized:
    then the "group" is this process alone (rank 0 of 1) and nothing communicates.
    ``timeout`` is the per-call timeout, ``None`` for the group's own.
    """

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    distributed: bool
    backend: str
    timeout: timedelta | None = field(default=None, compare=False)

    @property
    def communicates(self) -> bool:
        return self.distributed and self.world_size > 1

    def default_device(self) -> torch.device:
        """Device for metadata: CPU except on NCCL, which carries only CUDA tensors."""
        if self.backend == "nccl" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def with_timeout(self, timeout: timedelta | None) -> GroupInfo:
        return GroupInfo(
            self.group, self.rank, self.world_size, self.distributed, self.backend, timeout
        )


def resolve_group(group: dist.ProcessGroup | None) -> GroupInfo:
    """Find this rank's position in ``group`` (``None``: the default group).

    Raises ``GroupError`` when a group is passed but torch.distributed is not
    initialized, when ``group`` is not a process group, or when this process is not a
    member of ``group``. These are raised **on this rank only**: a non-member takes
    no part in the group's collectives, so the members are not involved in its
    mistake and gather among themselves; a rank that passes something that is not a
    group cannot say which peers it meant to reach (they will time out, naming it).
    """
    initialized = dist.is_available() and dist.is_initialized()
    if not initialized:
        if group is not None:
            raise GroupError(
                "a process group was passed but torch.distributed is not initialized "
                "(or the group was destroyed): expected group=None (a one-process "
                f"'world') or a live group, got {type(group).__name__}"
            )
        return GroupInfo(group=None, rank=0, world_size=1, distributed=False, backend="none")
    passed: object = group  # callers may hand us anything, e.g. NON_GROUP_MEMBER (an int)
    if passed is not None and not isinstance(passed, dist.ProcessGroup):
        if isinstance(passed, int) and passed == dist.GroupMember.NON_GROUP_MEMBER:
            raise GroupError(
                f"global rank {dist.get_rank()} is not a member of the process group it "
                "passed (torch returns GroupMember.NON_GROUP_MEMBER from new_group on "
                "non-members): expected a group containing this rank, got "
                "GroupMember.NON_GROUP_MEMBER",
                ranks=[dist.get_rank()],
            )
        raise GroupError(
            "group must be a torch.distributed.ProcessGroup or None, got "
            f"{type(passed).__name__} on global rank {dist.get_rank()}",
            ranks=[dist.get_rank()],
        )
    try:
        rank = dist.get_rank(group)
    except (ValueError, RuntimeError) as err:  # a destroyed group, for one
        raise GroupError(
            f"global rank {dist.get_rank()} cannot use the process group it passed "
            f"(torch says: {err}): expected a live group containing this rank",
            ranks=[dist.get_rank()],
        ) from None
    if rank < 0:
        raise GroupError(
            f"global rank {dist.get_rank()} is not a member of the process group it passed: "
            "expected a group containing this rank",
            ranks=[dist.get_rank()],
        )
    return GroupInfo(
        group=group,
        rank=rank,
        world_size=dist.get_world_size(group),
        distributed=True,
        backend=str(dist.get_backend(group)),
    )


# --- timeouts ------------------------------------------------------------------------


def _process_group(info: GroupInfo) -> dist.ProcessGroup | None:
    pg = info.group if info.group is not None else dist.group.WORLD
    return pg if isinstance(pg, dist.ProcessGroup) else None


def _backend_device(info: GroupInfo) -> torch.device:
    return torch.device("cuda" if info.backend == "nccl" else "cpu")


def group_timeout(info: GroupInfo) -> timedelta | None:
    """The group's current default timeout, or ``None`` when torch does not say.

    Reads torch's private backend options (``_get_backend(...).options._timeout``),
    guarded: any failure means "unknown".
    """
    pg = _process_group(info)
    if pg is None:
        return None
    try:
        backend = pg._get_backend(_backend_device(info))
        value: object = backend.options._timeout  # private; may vanish in a later torch
    except Exception:
        return None
    return value if isinstance(value, timedelta) else None


def per_call_timeout_supported(info: GroupInfo) -> bool:
    """A per-call timeout needs the group's timeout readable (to restore it) and
    settable (``ProcessGroup.set_timeout``)."""
    pg = _process_group(info)
    return pg is not None and hasattr(pg, "set_timeout") and group_timeout(info) is not None


_TIMEOUT_LOCK = threading.RLock()


@contextlib.contextmanager
def _call_timeout(info: GroupInfo) -> Iterator[None]:
    """Run the body under ``info.timeout`` (if any), restoring the group's default."""
    pg = _process_group(info)
    old = group_timeout(info) if info.timeout is not None else None
    if info.timeout is None or pg is None or old is None or old == info.timeout:
        yield
        return
    with _TIMEOUT_LOCK:
        pg.set_timeout(info.timeout)
        try:
            yield
        finally:
            pg.set_timeout(old)


def _seconds(t: timedelta) -> str:
    s = t.total_seconds()
    return f"{s:g} s" if s < 120 or not math.isfinite(s) else f"{s / 60:g} min"


# --- the arrival census ----------------------------------------------------------------

_KEY: Final = "vargather/arrival/"


@dataclass
class _GroupArrivals:
    store: Any  # a torch.distributed.Store, or None when unavailable
    count: int = 0


class _Arrivals:
    """Per-process arrival counters, one per process group (weakly keyed)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakKeyDictionary[Any, _GroupArrivals] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @staticmethod
    def _store_of(pg: dist.ProcessGroup) -> Any:
        get = getattr(pg, "get_group_store", None)
        if get is not None:
            with contextlib.suppress(Exception):
                return get()
        with contextlib.suppress(Exception):  # torch's private group map (older torch)
            from torch.distributed import distributed_c10d as c10d

            return c10d._world.pg_map[pg][1]
        return None

    def _state(self, info: GroupInfo) -> _GroupArrivals | None:
        pg = _process_group(info)
        if pg is None:
            return None
        with self._lock:
            state = self._groups.get(pg)
            if state is None:
                state = _GroupArrivals(self._store_of(pg))
                self._groups[pg] = state
            return state

    def arrive(self, info: GroupInfo, what: str) -> int:
        """Record that this rank enters collective ``what``; its number (0: no census)."""
        if not _CENSUS_ON or not info.communicates:
            return 0
        state = self._state(info)
        if state is None or state.store is None:
            return 0
        state.count += 1
        try:
            state.store.set(f"{_KEY}{info.rank}", f"{state.count} {what}")
        except Exception:
            state.store = None  # a store that fails once is not asked again
            return 0
        return state.count

    def census(
        self, info: GroupInfo, count: int, what: str, *, timed_out: bool
    ) -> tuple[list[int], str]:
        """(ranks that had not arrived, a sentence for the error message).

        After a timeout the peers had the whole timeout to arrive: "never arrived".
        After a lost peer the census is read at once: "had not arrived".
        """
        state = self._state(info)
        if count == 0 or state is None or state.store is None:
            return [], ""
        store = state.store
        behind: list[tuple[int, int, str]] = []
        elsewhere: list[tuple[int, int, str]] = []
        try:
            for r in range(info.world_size):
                if r == info.rank:
                    continue
                key = f"{_KEY}{r}"
                if not store.check([key]):
                    behind.append((r, 0, ""))
                    continue
                n_text, _, their_what = store.get(key).decode("utf-8", "replace").partition(" ")
                n = int(n_text)
                if n < count:
                    behind.append((r, n, their_what))
                elif n == count and their_what != what:
                    elsewhere.append((r, n, their_what))
        except Exception as err:
            return [], f" (the arrival census could not read the group's store: {err})"
        parts: list[str] = []
        if behind:
            seen = "; ".join(
                f"rank {r} {'has entered none' if n == 0 else f'is at #{n}, {w}'}"
                for r, n, w in behind
            )
            verb = "never arrived" if timed_out else "had not arrived"
            parts.append(
                f"rank(s) {[r for r, _, _ in behind]} {verb} at this collective "
                f"(vargather collective #{count} on this group for rank {info.rank}; {seen})"
            )
        if elsewhere:
            seen = "; ".join(f"rank {r} is in {w}" for r, _, w in elsewhere)
            parts.append(f"ranks are out of step at collective #{count}: {seen}")
        if not parts:
            parts.append(f"every rank arrived at this collective (#{count})")
        return [r for r, _, _ in behind], " " + "; ".join(parts) + "."


_ARRIVALS: Final = _Arrivals()


# --- error translation -------------------------------------------------------------------

_TIMEOUT_PATTERN = re.compile(r"timed? ?out|timeout|deadline", re.IGNORECASE)
_PEER_LOST_PATTERN = re.compile(
    r"connection (closed|reset|refused)|broken pipe|closed by peer|reset by peer|"
    r"socket|EOF|peer .* (crash|died)",
    re.IGNORECASE,
)
_OUT_OF_STEP: Final = (
    " The group is now out of step (its ranks disagree on which collective comes "
    "next): destroy it and create a new one before communicating again."
)


@contextlib.contextmanager
def translate_collective_errors(
    what: str, info: GroupInfo, *, arrival: int | None = None
) -> Iterator[None]:
    """Run one collective: record the arrival (unless ``arrival`` is given), apply the
    call's timeout, and re-raise backend failures as ``CollectiveError``s that name the
    ranks that never arrived."""
    count = _ARRIVALS.arrive(info, what) if arrival is None else arrival
    try:
        with _call_timeout(info):
            yield
    except RuntimeError as err:
        if isinstance(err, CollectiveError):
            raise
        text = " ".join(str(err).split())[:400]
        where = f"{what} on rank {info.rank} of {info.world_size}"
        if _TIMEOUT_PATTERN.search(text):
            missing, census = _ARRIVALS.census(info, count, what, timed_out=True)
            limit = info.timeout or group_timeout(info)
            within = f"within {_seconds(limit)}" if limit is not None else "in time"
            whose = "this call's timeout" if info.timeout is not None else "the group's timeout"
            raise CollectiveTimeoutError(
                f"{where} timed out: a peer did not arrive {within} ({whose}).{census}"
                f"{_OUT_OF_STEP} (backend said: {text})",
                ranks=missing,
            ) from err
        if _PEER_LOST_PATTERN.search(text):
            missing, census = _ARRIVALS.census(info, count, what, timed_out=False)
            raise PeerLostError(
                f"{where}: a peer closed its connection mid-collective, it probably "
                f"died.{census}{_OUT_OF_STEP} (backend said: {text})",
                ranks=missing,
            ) from err
        # Anything else failed locally (a dtype the backend refuses, say), likely on
        # every rank at once: a census would only race with the peers' arrivals.
        raise CollectiveError(f"{where} failed (backend said: {text})") from err


# --- the collectives -----------------------------------------------------------------


def movable(t: torch.Tensor, *, rows: bool) -> torch.Tensor:
    """``t`` for a pure data-movement collective (all_gather, all_to_all, broadcast):
    itself, or its bytes when the backend may not carry its dtype. Exact, as nothing is
    computed. ``rows``: keep every dimension (dim 0 is alltoallv's split dimension) by
    viewing each element as a row of bytes, always a view of ``t``; else flat bytes: a
    view of a contiguous ``t`` (a receive buffer must be one, so the bytes land in
    it), a copy of a strided one (fine to send)."""
    if t.dtype in NATIVE_DTYPES:
        return t
    as_rows = t.unsqueeze(-1).view(torch.uint8)  # any strides: the new last one is 1
    # Flat: a view for a contiguous buffer (so a receive lands in t); a copy for a
    # strided send buffer (a sliced shard). Size-1 tensors may carry any stride and
    # still report contiguous, which is why this does not go through t.view(uint8).
    return as_rows if rows else as_rows.reshape(-1)


def _all_gather_single() -> Callable[..., Any]:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecates
    # the old name; older torch releases only have the old one.
    fn = getattr(dist, "all_gather_single", None)
    return fn if fn is not None else dist.all_gather_into_tensor


def _reduce_scatter_single() -> Callable[..., Any]:
    fn = getattr(dist, "reduce_scatter_single", None)
    return fn if fn is not None else dist.reduce_scatter_tensor


def all_gather_equal(
    output: torch.Tensor, local: torch.Tensor, info: GroupInfo, *, what: str = "all_gather"
) -> None:
    """``output`` (``W * k`` elements) receives every rank's ``local`` (``k`` each)."""
    # Flat views: backends disagree on which output shapes they accept (gloo takes
    # only the "cat along dim 0" form); 1-d is accepted everywhere.
    with translate_collective_errors(what, info):
        _all_gather_single()(
            movable(output.view(-1), rows=False),
            movable(local.reshape(-1), rows=False),
            group=info.group,
        )


def all_gather_list(
    outputs: Sequence[torch.Tensor],
    local: torch.Tensor,
    info: GroupInfo,
    *,
    what: str = "all_gather (list)",
) -> None:
    """``outputs[r]`` receives rank r's ``local`` (``dist.all_gather``; sizes may differ
    on NCCL, must be equal on gloo)."""
    with translate_collective_errors(what, info):
        dist.all_gather(
            [movable(o, rows=True) for o in outputs],
            movable(local, rows=True),
            group=info.group,
        )


def reduce_scatter_equal(
    output: torch.Tensor, full: torch.Tensor, info: GroupInfo, *, what: str = "reduce_scatter"
) -> None:
    """``output`` (``k``) receives the sum over ranks of chunk ``rank`` of ``full``."""
    with translate_collective_errors(what, info):
        _reduce_scatter_single()(
            output.view(-1), full.reshape(-1), op=dist.ReduceOp.SUM, group=info.group
        )


def reduce_scatter_uneven(
    output: torch.Tensor,
    chunks: Sequence[torch.Tensor],
    info: GroupInfo,
    *,
    what: str = "reduce_scatter",
) -> None:
    """``output`` receives the sum over ranks of ``chunks[rank]`` (chunks may differ)."""
    with translate_collective_errors(what, info):
        dist.reduce_scatter(output, list(chunks), op=dist.ReduceOp.SUM, group=info.group)


def all_to_all_uneven(
    output: torch.Tensor,
    send: torch.Tensor,
    output_splits: Sequence[int],
    input_splits: Sequence[int],
    info: GroupInfo,
    *,
    what: str = "all_to_all",
) -> None:
    """alltoallv along dim 0: rank ``j`` receives ``input_splits[j]`` rows from each peer."""
    with translate_collective_errors(what, info):
        dist.all_to_all_single(
            movable(output, rows=True),
            movable(send, rows=True),
            output_split_sizes=list(output_splits),
            input_split_sizes=list(input_splits),
            group=info.group,
        )


def all_reduce_sum(t: torch.Tensor, info: GroupInfo, *, what: str = "all_reduce") -> None:
    """``t`` becomes the sum over ranks of every rank's ``t``, in place."""
    with translate_collective_errors(what, info):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=info.group)


def _global_rank(info: GroupInfo, group_rank: int) -> int:
    """The global rank of ``group_rank`` (what ``dist.broadcast(src=...)`` expects)."""
    if info.group is None:
        return group_rank
    return dist.get_global_rank(info.group, group_rank)


def broadcast_from_each(
    blocks: Sequence[torch.Tensor], info: GroupInfo, *, what: str | None = None
) -> None:
    """Block ``r`` of every rank receives block ``r`` of rank ``r``, for every ``r``.

    One broadcast per rank holding data, all issued asynchronously and then awaited:
    every rank issues them in the same order, so the backend pairs them by sequence
    number, and gloo runs them concurrently on its worker threads. Empty blocks are
    skipped by every rank alike (every rank knows every size). Every block must be a
    contiguous receive buffer.
    """
    with translate_collective_errors(what or f"broadcast x{len(blocks)}", info):
        works = [
            dist.broadcast(
                movable(block, rows=False),  # its bytes when the backend refuses the dtype
                src=_global_rank(info, r),
                group=info.group,
                async_op=True,
            )
            for r, block in enumerate(blocks)
            if block.numel() > 0
        ]
        for work in works:
            if work is not None:
                work.wait()

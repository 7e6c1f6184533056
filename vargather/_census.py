"""The arrival census: which ranks never arrived at a collective that failed.

Where it sits: below every stage, under ``_comm``. Before each collective a rank
records ``vargather/arrival/<rank> = "<n> <what>"`` on the group's store (``n``: this
process's vargather collectives on the group); when one fails, it writes its own key
at once (``flush``) and reads its peers': a lower ``n`` (or no key) never arrived, the
same ``n`` in another ``what`` is out of step. Gloo's own messages name no rank, so
this is the only way to say who is missing (``docs/misuse.md`` has the wording, the
costs and the limits: a diagnosis, not a proof). The store write is a writer thread's
(``_Writer``): each group's latest value, in order, a key never going back; a store
that raises once is not asked again.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

import torch.distributed as dist

from ._group import GroupInfo

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


_KEY: Final = "vargather/arrival/"


_WRITE_INTERVAL_S: Final = 0.01
"""The writer thread's pause after each batch of writes: at most one store write per
group per pause (the latest value), however fast the collectives come. A write costs
60-100 us of CPU (a TCPStore or FileStore round trip; more on a loaded machine); at 2 ms
the writer thread cost a 4-rank ``all_gather_v`` of 1 MiB about 90 us of CPU a call,
at 10 ms about 40 us (measured per thread, on a loaded machine). The price: after a
lost peer its last 10 ms of arrivals may be missing."""


@dataclass
class _GroupArrivals:
    """One group's counter on this rank, and what of it reached the store."""

    store: Any  # a torch.distributed.Store, or None when unavailable (or it failed)
    key: str = ""
    count: int = 0
    latest: str = ""  # the value of arrival ``count``
    written: int = 0  # the arrival whose value the store holds
    lock: threading.Lock = field(default_factory=threading.Lock)  # orders the writes

    def write(self, count: int, value: str) -> None:
        """Write arrival ``count``'s ``value`` unless a later one is already written."""
        with self.lock:
            store = self.store
            if store is None or count <= self.written:
                return
            try:
                store.set(self.key, value)
            except Exception:
                self.store = None  # a store that fails once is not asked again
                return
            self.written = count

    def flush(self) -> None:
        """Write the latest arrival now, on the calling thread (the failure path)."""
        self.write(self.count, self.latest)


class _Writer:
    """This process's census writer: a daemon thread that writes each group's latest
    pending arrival (``submit``), then pauses ``_WRITE_INTERVAL_S``. Started at the
    first ``submit``, not at import: a thread does not survive a fork, so a forked child
    (the test pool forks its ranks) starts its own after ``_reset``. Where no thread can
    be started (interpreter shutdown) the write runs on the calling thread."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[int, tuple[_GroupArrivals, int, str]] = {}
        self._thread: threading.Thread | None = None
        self._closing = False

    def submit(self, state: _GroupArrivals, count: int, value: str) -> None:
        """Have ``value`` (arrival ``count``) written soon, replacing any pending one."""
        with self._cond:
            if self._thread is not None or self._start():
                if not self._pending:
                    self._cond.notify()
                self._pending[id(state)] = (state, count, value)
                return
        state.write(count, value)  # no thread could start: synchronously, as before

    def _start(self) -> bool:
        if self._closing:
            return False
        thread = threading.Thread(target=self._run, name="vargather-census", daemon=True)
        try:
            thread.start()
        except RuntimeError:
            return False
        self._thread = thread
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                batch = list(self._pending.values())
                self._pending.clear()
            for state, count, value in batch:
                state.write(count, value)
            time.sleep(_WRITE_INTERVAL_S)

    def idle(self, timeout: float) -> bool:
        """Tests only: wait until nothing is pending (the last batch may be in flight)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._cond:
                if not self._pending:
                    return True
            time.sleep(0.001)
        return False

    def stop(self) -> None:
        """At interpreter exit (``atexit``): end the thread, pending values dropped (a
        census is read by peers while this process runs, not after), so that it is not
        inside a store call while torch's objects are torn down (a process that exited
        so under torchrun was seen dying with SIGABRT, "terminate called without an
        active exception"). Later arrivals, if any, are written synchronously."""
        with self._cond:
            self._closing = True
            self._pending.clear()
            self._cond.notify()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)


class _Arrivals:
    """Per-process arrival counters, one per process group (weakly keyed)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakKeyDictionary[Any, _GroupArrivals] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.writer = _Writer()

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
        pg = info.group if info.group is not None else dist.group.WORLD  # process_group's
        if not isinstance(pg, dist.ProcessGroup):
            return None
        with self._lock:
            state = self._groups.get(pg)
            if state is None:
                state = _GroupArrivals(self._store_of(pg), f"{_KEY}{info.rank}")
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
        state.latest = value = f"{state.count} {what}"
        self.writer.submit(state, state.count, value)
        return state.count

    def _after_fork(self) -> None:
        """In a forked child: fresh locks (a parent thread may have held one) and a
        fresh writer."""
        self._lock = threading.Lock()
        for state in list(self._groups.values()):
            state.lock = threading.Lock()
        self.writer._reset()  # the parent's thread is gone, its pending values the parent's

    def census(
        self, info: GroupInfo, count: int, what: str, *, timed_out: bool
    ) -> tuple[list[int], str]:
        """(ranks that had not arrived, a sentence for the error message), worded by
        ``timed_out`` (module doc)."""
        state = self._state(info)
        if count == 0 or state is None:
            return [], ""
        state.flush()  # this rank's own arrival, before reading the peers'
        store = state.store
        if store is None:
            return [], ""
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


ARRIVALS: Final = _Arrivals()
"""This process's arrival counters, one per process group."""

os.register_at_fork(after_in_child=ARRIVALS._after_fork)
atexit.register(ARRIVALS.writer.stop)

"""A persistent pool of rank processes forming a real ``gloo`` world: ``RankPool``, ``get_pool``.

Where it sits: the bottom of the testing kit, the top of the pool's modules (beneath it:
``pool_types``, ``rank_side``, ``world``), re-exporting what the kit and users import.
Spawning a fresh world per test case costs seconds; a pool started once and kept alive
turns each case into a round trip of milliseconds (``docs/property-suite.md`` has the
measured figures).

Each rank initializes one ``torch.distributed`` process group, once, on a ``FileStore``
in a fresh temporary directory (no TCP ports, so pytest-xdist workers never collide),
then serves calls over its own duplex pipe. A Python exception on a rank leaves the
world up: the same process group serves the next call. A rank that dies is seen at once
through the process sentinels. After a :class:`PoolFailure` every rank process has been
killed and the next call starts a fresh world (new directory, new ``FileStore``). A
rank's stderr goes to a file in the world's directory; failure messages quote its tail.

After each call the pool compares, for the world group and every subgroup, the number
of collectives each rank has issued on it. If they differ, a rank issued a collective
its peers did not (for example one rank raised before a collective that the others then
timed out in): the group can no longer pair collectives correctly, so the pool rebuilds
the world before the next call and says so in the error. ``RankPool.generation`` counts
builds. Point-to-point operations are counted apart, by peer (``rank_side``), and the
world is rebuilt as well when they do not pair up (a send no receive took, a receive no
send filled).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from .pool_types import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_SHARED_START_METHOD,
    DEFAULT_START_TIMEOUT,
    PoolConfig,
    PoolFailure,
    PoolStartError,
    RankCrashed,
    RankError,
    RankHung,
    RankOutcome,
)
from .rank_side import (
    _ANY_SOURCE,
    RankContext,
    _dumps,
    _ErrInfo,
    _error_info,
    _exception_from,
    _fn_name,
    _GroupCounts,
)
from .world import _World

P = TypeVar("P")
R = TypeVar("R")


_CLOSE_GRACE = 15.0  # seconds ranks get to leave cleanly before being killed


@dataclass
class _Reply:
    rank: int
    values: list[Any]
    error: _ErrInfo | None = None
    error_index: int = 0
    seqs: dict[tuple[int, ...], _GroupCounts] = field(default_factory=dict)

    def outcome(self, index: int) -> RankOutcome[Any]:
        if index < len(self.values):
            return RankOutcome(self.rank, self.values[index])
        if self.error is None or index != self.error_index:
            return RankOutcome(self.rank, None)  # the rank stopped at an earlier payload
        _, type_name, _, tb = self.error
        return RankOutcome(self.rank, None, _exception_from(self.error), type_name, tb)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# Every open pool, held strongly: a pool nobody closed is still closed cleanly at exit.
_LIVE_POOLS: set[RankPool] = set()
_LIVE_LOCK = threading.Lock()


class RankPool:
    """A persistent world of ``world_size`` rank processes; see the module docstring.

    ``collective_timeout`` (seconds) is the process group's timeout: a collective a peer
    never joins fails with gloo's timeout error on the waiting ranks after this long.
    ``None`` reads ``$VARGATHER_POOL_COLLECTIVE_TIMEOUT`` or uses 10 s.
    ``call_timeout`` bounds each call (``RankHung`` past it); ``start_timeout`` bounds
    building a world. ``start_method``: ``"spawn"`` (``multiprocessing``'s, never
    ``torch.multiprocessing``'s) or ``"forkserver"``, which forks the ranks from a server
    that imported torch once: much cheaper where worlds are rebuilt often (a fuzzer that
    makes gloo abort). ``environment``: variables the rank processes start with (besides
    ``OMP_NUM_THREADS=1``). Processes are spawned at construction; the first call waits
    for them to be ready. One call runs at a time (a lock serializes calls from threads).
    Close the pool (or use ``with``); pools still open at interpreter exit are closed
    then. A pool belongs to the process that made it: a forked child must make its own.
    """

    def __init__(
        self,
        world_size: int,
        *,
        collective_timeout: float | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        backend: str = "gloo",
        start_timeout: float = DEFAULT_START_TIMEOUT,
        start_method: str = "spawn",
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.config = PoolConfig.resolve(
            world_size,
            collective_timeout=collective_timeout,
            call_timeout=call_timeout,
            backend=backend,
            start_timeout=start_timeout,
            start_method=start_method,
            environment=environment,
        )
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        self._closed = False
        self._generation = 0
        self._stale: str | None = None
        self._last_exitcodes: tuple[int | None, ...] = ()
        self._world: _World | None = self._new_world()
        with _LIVE_LOCK:
            _LIVE_POOLS.add(self)

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def generation(self) -> int:
        """How many worlds this pool has built (1 until the first rebuild)."""
        return self._generation

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_exitcodes(self) -> tuple[int | None, ...]:
        """Exit codes of the ranks of the last world torn down (by ``close``, ``restart``
        or a failure), in rank order: 0 for a clean stop, ``-9`` for a kill."""
        return self._last_exitcodes

    @property
    def pids(self) -> tuple[int, ...]:
        """The current rank processes' ids, in rank order (empty when none run)."""
        world = self._world
        return tuple(p.pid or 0 for p in world.procs) if world is not None else ()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("stale" if self._stale else "open")
        return (
            f"RankPool(world_size={self.world_size}, generation={self._generation}, state={state})"
        )

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, fn: Callable[[RankContext, P], R], payload: P) -> list[R]:
        """Call ``fn(ctx, payload)`` on every rank; the results in rank order.

        Raises :class:`RankError` if any rank raised, :class:`PoolFailure` if the world
        failed. ``fn`` must be module-level; ``payload`` and results must pickle.
        """
        outcomes = self._call(fn, [payload])[0]
        if any(not o.ok for o in outcomes):
            raise self._rank_error(fn, outcomes, None)
        return [o.value for o in outcomes]  # type: ignore[misc]  # every outcome is ok, so each value is an R

    def run_outcomes(self, fn: Callable[[RankContext, P], R], payload: P) -> list[RankOutcome[R]]:
        """Like :meth:`run`, but rank exceptions come back as outcomes, never raised."""
        return self._call(fn, [payload])[0]

    def run_many(self, fn: Callable[[RankContext, P], R], payloads: Sequence[P]) -> list[list[R]]:
        """Run ``fn`` on each payload in turn, all shipped in one message (one round trip).

        Returns ``results[i][rank]``. A rank stops at its first exception; the call then
        raises :class:`RankError` for the first payload index at which any rank raised
        (``payload_index``), with every rank's outcome for that payload.
        """
        payload_list = list(payloads)
        if not payload_list:
            return []
        per_payload = self._call(fn, payload_list)
        for index, outcomes in enumerate(per_payload):
            if any(not o.ok for o in outcomes):
                raise self._rank_error(fn, outcomes, index)
        return [[o.value for o in outcomes] for outcomes in per_payload]  # type: ignore[misc]  # no error anywhere, so each value is an R

    def restart(self) -> None:
        """Stop the ranks (cleanly, kill after a grace period) and start a fresh world."""
        with self._lock:
            self._check_usable()
            if self._world is not None:
                with contextlib.suppress(Exception):
                    self._world.request_stop()
            self._stop_world(graceful=True)
            self._world = self._new_world()

    def discard_world(self, reason: str) -> None:
        """Mark the current world unusable: the next call kills its ranks and starts a
        fresh world (new ``FileStore``). For a caller that saw a collective fail or time
        out inside a rank function, which leaves the process group's connections in an
        unknown state even though every rank replied."""
        with self._lock:
            if self._world is not None:
                self._stale = reason

    def close(self) -> None:
        """Stop the ranks: each destroys its process group and exits with code 0;
        stragglers are killed after a grace period. Idempotent."""
        self._begin_close()
        self._stop_world(graceful=True)

    def _begin_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _LIVE_LOCK:
            _LIVE_POOLS.discard(self)
        world = self._world
        if world is not None and os.getpid() == self._owner_pid:
            with contextlib.suppress(Exception):
                world.request_stop()

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if os.getpid() != self._owner_pid:
            raise RuntimeError(
                f"{self!r} belongs to process {self._owner_pid}; a forked child must make "
                "its own pool"
            )

    def _new_world(self) -> _World:
        self._generation += 1
        self._stale = None
        return _World(self.config)

    def _stop_world(self, *, graceful: bool) -> None:
        """``graceful``: wait for ranks already asked to stop, kill them after a grace period."""
        world, self._world = self._world, None
        if world is None or os.getpid() != self._owner_pid:
            return
        if graceful:
            world.wait_stopped(_CLOSE_GRACE)
        else:
            world.kill()
        self._last_exitcodes = world.exitcodes

    def _ready_world(self) -> _World:
        """The current world, started and initialized; rebuilt first if stale."""
        if self._stale is not None or self._world is None:
            self._stop_world(graceful=False)
            self._world = self._new_world()
        world = self._world
        if world.ready:
            return world
        deadline = time.monotonic() + self.config.start_timeout
        world.mark_stderr()
        messages, dead, silent = world.receive(set(range(self.world_size)), deadline)
        problems: list[str] = []
        for rank in sorted(messages):
            kind, detail = pickle.loads(messages[rank])
            if kind == "init_error":
                problems.append(f"--- rank {rank} failed to initialize:\n{detail[3]}")
        problems += self._lost(
            world,
            {r: world.exitcode(r) for r in sorted(dead)},
            " while starting",
            silent,
            f"was not ready after start_timeout={self.config.start_timeout:g} s",
        )
        if problems:
            self._stop_world(graceful=False)
            raise PoolStartError(
                f"could not start a {self.config.backend} world of {self.world_size} rank(s):\n"
                + "\n".join(problems)
                + "\n(A rank that fails while the spawn start method imports its modules, "
                "for example a __main__ module without an `if __name__ == '__main__':` "
                "guard, writes to this process's stderr instead.)"
            )
        world.ready = True
        world.mark_stderr()
        return world

    def _call(
        self, fn: Callable[[RankContext, P], R], payloads: list[P]
    ) -> list[list[RankOutcome[R]]]:
        try:
            request = _dumps(("call", fn, payloads))
        except Exception as exc:
            raise TypeError(
                f"cannot send {fn!r} and its payload to the ranks: {exc} (fn must be a "
                "module-level function, pickled by reference; payloads must pickle)"
            ) from exc
        with self._lock:
            self._check_usable()
            world = self._ready_world()
            try:
                replies = self._exchange(world, fn, request)
            except PoolFailure:
                raise
            except BaseException:
                # Interrupted mid-protocol (KeyboardInterrupt, ...): the ranks' replies
                # are unaccounted for, so this world cannot be trusted any more.
                self._stop_world(graceful=False)
                raise
        return [[reply.outcome(i) for reply in replies] for i in range(len(payloads))]

    def _exchange(self, world: _World, fn: object, request: bytes) -> list[_Reply]:
        deadline = time.monotonic() + self.config.call_timeout
        idle_dead = {r for r, proc in enumerate(world.procs) if proc.exitcode is not None}
        if idle_dead:  # died after its last reply: do not send this call anywhere
            self._fail(world, fn, {}, idle_dead, set(), before_call=True)
        broken = world.send_all(request)
        waiting = set(range(self.world_size)) - broken
        messages, dead, silent = world.receive(waiting, deadline)
        dead |= broken
        replies = {rank: self._decode(rank, data) for rank, data in messages.items()}
        if dead or silent:
            self._fail(world, fn, replies, dead, silent)
        world.mark_stderr()  # failure messages quote what a rank wrote after this point
        self._check_sequences(replies)
        return [replies[r] for r in range(self.world_size)]

    @staticmethod
    def _decode(rank: int, data: bytes) -> _Reply:
        try:
            message = pickle.loads(data)
        except BaseException as exc:
            error = TypeError(f"rank {rank}'s reply could not be unpickled in the parent ({exc})")
            error.__cause__ = exc
            return _Reply(rank, [], _error_info(error))
        if message[0] == "ok":
            return _Reply(rank, message[1], seqs=message[2])
        _, index, values, info, seqs = message
        return _Reply(rank, values, info, index, seqs)

    def _fail(
        self,
        world: _World,
        fn: object,
        replies: dict[int, _Reply],
        dead: set[int],
        silent: set[int],
        *,
        before_call: bool = False,
    ) -> NoReturn:
        """Kill the world and raise RankCrashed / RankHung."""
        exitcodes = {r: world.exitcode(r) for r in sorted(dead)}
        in_flight = world.in_flight()
        sections = self._lost(
            world,
            exitcodes,
            " while idle, before this call was sent" if before_call else "",
            silent,
            f"did not reply within call_timeout={self.config.call_timeout:g} s",
        )
        for rank in sorted(replies):
            reply = replies[rank]
            if reply.error is not None:
                sections.append(f"--- rank {rank} raised:\n{reply.error[3].rstrip()}")
        self._stop_world(graceful=False)
        name = _fn_name(fn)
        tail = (
            "\n".join(sections)
            + "\nAll rank processes were killed; the next call starts a fresh world."
        )
        if dead:
            what = ", ".join(f"rank {r} ({_describe_exit(exitcodes[r])})" for r in sorted(dead))
            raise RankCrashed(
                f"{what} died during {name}:\n{tail}", sorted(dead), exitcodes, in_flight
            )
        hung = ", ".join(str(r) for r in sorted(silent))
        raise RankHung(
            f"rank(s) {hung} did not reply to {name} within call_timeout="
            f"{self.config.call_timeout:g} s:\n{tail}",
            sorted(silent),
            self.config.call_timeout,
            in_flight,
        )

    def _lost(
        self,
        world: _World,
        exitcodes: Mapping[int, int | None],
        when: str,
        silent: set[int],
        silent_what: str,
    ) -> list[str]:
        """A section per rank that died (``exitcodes``: theirs; ``when``: after "died")
        or stayed silent (``silent_what``: how), each quoting the rank's stderr."""
        return [
            f"--- rank {r} died{when} ({_describe_exit(code)})" + self._stderr_note(world, r)
            for r, code in exitcodes.items()
        ] + [f"--- rank {r} {silent_what}" + self._stderr_note(world, r) for r in sorted(silent)]

    @staticmethod
    def _stderr_note(world: _World, rank: int) -> str:
        text = world.stderr_since_mark(rank).strip()
        return f"; its stderr since the previous call:\n{text}" if text else ""

    def _check_sequences(self, replies: dict[int, _Reply]) -> None:
        keys = {key for reply in replies.values() for key in reply.seqs}
        for key in sorted(keys):
            seen = {r: reply.seqs[key] for r, reply in sorted(replies.items()) if key in reply.seqs}
            group = "the world group" if not key else f"subgroup {list(key)}"
            if len({c[0] for c in seen.values()}) > 1:
                counts = ", ".join(f"rank {r}: {c[0]}" for r, c in seen.items())
                problem = (
                    f"the ranks' collective counts for {group} differ ({counts}): "
                    "a rank issued a collective its peers did not, so the group is out of step"
                )
            else:
                unpaired = _unpaired(list(key) if key else list(range(self.world_size)), seen)
                if unpaired is None:
                    continue
                problem = (
                    f"the ranks' point-to-point operations on {group} do not pair up "
                    f"({unpaired}): a message or a receive is left pending in the group"
                )
            self._stale = f"{problem}; the pool rebuilds the world before the next call"
            return

    def _rank_error(
        self, fn: object, outcomes: Sequence[RankOutcome[Any]], index: int | None
    ) -> RankError:
        failing = [o for o in outcomes if not o.ok]
        where = "" if index is None else f" at payload index {index}"
        head = (
            f"{len(failing)} of {len(outcomes)} rank(s) raised in {_fn_name(fn)}{where}: "
            + ", ".join(f"rank {o.rank} ({o.exc_type_name})" for o in failing)
        )
        body = [f"--- rank {o.rank}:\n{(o.traceback or '').rstrip()}" for o in failing]
        if self._stale is not None:
            body.append(f"Note: {self._stale}.")
        return RankError("\n".join([head, *body]), outcomes, index)


def _unpaired(members: list[int], seen: dict[int, _GroupCounts]) -> str | None:
    """Where the point-to-point operations of a group (``members``: global ranks in
    group rank order) do not pair up, given each rank's counts; None when each send
    has its receive. Operations whose peer is not known (a receive from any source)
    are paired by their totals."""
    index = {r: i for i, r in enumerate(members)}
    books = [c[1] for c in seen.values()] + [c[2] for c in seen.values()]
    if any(_ANY_SOURCE in book for book in books):
        sent = sum(sum(c[1].values()) for c in seen.values())
        received = sum(sum(c[2].values()) for c in seen.values())
        return None if sent == received else f"{sent} send(s), {received} receive(s)"
    for sender, (_, sent_by, _) in seen.items():
        for receiver, (_, _, received_by) in seen.items():
            if sender == receiver:
                continue
            sends = sent_by.get(index[receiver], 0)
            receives = received_by.get(index[sender], 0)
            if sends != receives:
                return (
                    f"rank {sender} posted {sends} send(s) to rank {receiver}, which posted "
                    f"{receives} receive(s) from it"
                )
    return None


_POOLS: dict[int, RankPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(
    world_size: int,
    *,
    collective_timeout: float | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    backend: str = "gloo",
    start_timeout: float = DEFAULT_START_TIMEOUT,
    start_method: str = DEFAULT_SHARED_START_METHOD,
) -> RankPool:
    """The process-wide pool for ``world_size``, created on first use, its ranks forked
    from a forkserver where the platform has one (a suite rebuilds worlds after every
    crash, hang or failed collective; a forked rank costs milliseconds, not a second).

    One pool per world size is kept alive until :func:`close_all_pools` or interpreter
    exit. Asking with different settings replaces (closes) the cached pool of that size.
    Each process (each pytest-xdist worker) has its own pools.

    Raises:
        ValueError: a setting out of range, named (``PoolConfig.resolve``). A world
            that cannot start raises ``PoolStartError`` from the first call.
    """
    settings: dict[str, Any] = {
        "collective_timeout": collective_timeout,
        "call_timeout": call_timeout,
        "backend": backend,
        "start_timeout": start_timeout,
        "start_method": start_method,
    }
    with _POOLS_LOCK:
        pool = _POOLS.get(world_size)
        if pool is not None and not pool.closed and pool._owner_pid == os.getpid():
            if pool.config == PoolConfig.resolve(world_size, **settings):
                return pool
            pool.close()
        pool = _POOLS[world_size] = RankPool(world_size, **settings)
        return pool


def close_all_pools() -> None:
    """Close every pool this process started (the cached ones and any other still open),
    stopping their ranks in parallel."""
    with _POOLS_LOCK:
        _POOLS.clear()
    with _LIVE_LOCK:
        pools = [p for p in _LIVE_POOLS if p._owner_pid == os.getpid()]
    for pool in pools:
        pool._begin_close()
    for pool in pools:
        pool._stop_world(graceful=True)


atexit.register(close_all_pools)

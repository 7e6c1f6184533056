"""A persistent pool of rank processes forming a real ``gloo`` world.

Where it sits: the bottom of the testing kit (``vargather.testing``), beside the case
model; it knows nothing of gathers. It is the one way the kit, the property suite, the
conformance check and the fuzzers spawn a multi-rank world. Spawning a fresh world per
test case costs seconds; a pool started once and kept alive turns each case into a
round trip of milliseconds (``docs/property-suite.md`` has the measured figures).

How it works
------------
``RankPool(world_size)`` spawns ``world_size`` processes (``multiprocessing`` *spawn*
start method, never ``torch.multiprocessing``; ``start_method="forkserver"`` instead forks
them from a server that imported torch once, which makes building a world much cheaper:
worth it where worlds are rebuilt often, as in a fuzzer that makes gloo abort). Each rank initializes one
``torch.distributed`` process group, once, on a ``FileStore`` in a fresh temporary
directory (no TCP ports, so pytest-xdist workers never collide), then serves requests
over its own duplex ``multiprocessing`` pipe:

* ``pool.run(fn, payload)`` sends ``(fn, payload)`` to every rank; each calls
  ``fn(ctx, payload)`` with a :class:`RankContext`, and the results come back in rank
  order. A Python exception on any rank raises :class:`RankError` carrying every
  failing rank's traceback; the world stays up and the same process group serves the
  next call.
* ``pool.run_outcomes(fn, payload)`` returns one :class:`RankOutcome` per rank instead of
  raising for rank exceptions.
* ``pool.run_many(fn, payloads)`` ships a batch of payloads in one message, to amortize
  the round trip.

``fn`` must be a module-level function (it is pickled by reference); payloads and
results must be picklable. Messages are pickled with the standard pickler, not with the
``ForkingPickler`` that ``import torch`` extends, so tensors travel as bytes rather than
shared-memory handles that die with the rank. Tensors crossing the pipe are sent as
detached copies with compact storage (values, dtype, shape, strides and the
``requires_grad`` flag survive; the autograd graph does not).

Failures of the world itself are :class:`PoolFailure` s: a rank that dies (``os._exit``,
SIGKILL, a gloo SIGABRT) is seen at once through the process sentinels
(:class:`RankCrashed`); a call that outlives ``call_timeout`` raises :class:`RankHung`.
Either way every rank process is killed and a fresh world (new temporary directory, new
``FileStore``) is started on the next call. A rank's stderr is written to a file in the
pool's directory; its tail is quoted in failure messages (gloo's abort text, for one)
and is otherwise not shown.

After each call the pool compares, for the world group and every subgroup, the number
of collectives each rank has issued on it. If they differ, a rank issued a collective
its peers did not (for example one rank raised before a collective that the others then
timed out in): the group can no longer pair collectives correctly, so the pool rebuilds
the world before the next call and says so in the error. ``RankPool.generation`` counts
builds. A rank's count is the group's sequence number less the point-to-point
operations it posted on the group: gloo's sequence number also counts each send and
receive, on the rank that posts it, and a correctly paired exchange may post more of
them on one rank than on another (one rank sending to two peers that each receive
once), which is no reason to rebuild. Those operations are counted by peer (what goes
through ``ProcessGroup.send``, ``recv`` and ``recv_anysource``, where every
point-to-point function of ``torch.distributed`` posts), and the world is rebuilt as
well when they do not pair up: a send that no receive took, or a receive that no send
filled (a peer that never arrived), is left pending in the group.

``get_pool(world_size)`` keeps one pool per world size alive for the whole process
(closed at exit), which is what makes the suites fast. Its worlds fork from a
forkserver where the platform has one (``DEFAULT_SHARED_START_METHOD``): a suite
rebuilds worlds after every crash, hang or failed collective, and a forked rank costs
milliseconds where a spawned one imports torch again (about a second of CPU).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import math
import multiprocessing
import operator
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

    import torch
    from torch.distributed import ProcessGroup

__all__ = [
    "PoolConfig",
    "PoolFailure",
    "PoolStartError",
    "RankContext",
    "RankCrashed",
    "RankError",
    "RankHung",
    "RankOutcome",
    "RankPool",
    "RemoteException",
    "close_all_pools",
    "get_pool",
]

P = TypeVar("P")
R = TypeVar("R")

#: Environment variable overriding the default ``collective_timeout`` (seconds).
COLLECTIVE_TIMEOUT_ENV = "VARGATHER_POOL_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 10.0
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_SHARED_START_METHOD = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)
"""How ``get_pool``'s shared worlds start their ranks (``RankPool`` itself: spawn)."""

_CLOSE_GRACE = 15.0  # seconds ranks get to leave cleanly before being killed
_CRASH_GRACE = 0.25  # seconds to collect the survivors' replies after a rank died
_STDERR_TAIL = 3000  # characters of a rank's stderr quoted in a failure message
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


# --- errors ------------------------------------------------------------------------


class RemoteException(Exception):  # noqa: N818  # the project's chosen public name
    """Stands in for a rank's exception that could not be pickled back.

    ``type_name`` is the qualified name of the original type (``vargather.DTypeMismatchError``;
    builtins are unqualified, ``ValueError``) and ``message`` its ``str()``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


class RankError(Exception):
    """A Python exception was raised on one or more ranks.

    The message names each failing rank and quotes its full traceback. ``outcomes`` has
    one :class:`RankOutcome` per rank (for ``run_many``: for payload ``payload_index``).
    The world is intact unless the message says it will be rebuilt.
    """

    def __init__(
        self,
        message: str,
        outcomes: Sequence[RankOutcome[Any]] = (),
        payload_index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.outcomes: tuple[RankOutcome[Any], ...] = tuple(outcomes)
        self.payload_index = payload_index

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.outcomes, self.payload_index))

    @property
    def failures(self) -> tuple[RankOutcome[Any], ...]:
        """The outcomes of the ranks that raised."""
        return tuple(o for o in self.outcomes if not o.ok)


class PoolFailure(Exception):  # noqa: N818  # the project's chosen public name
    """The world itself failed: a rank died, hung, or could not start.

    Every rank process has been killed; the next call starts a fresh world.
    """


class PoolStartError(PoolFailure):
    """A rank could not start or initialize its process group."""


class RankCrashed(PoolFailure):
    """One or more rank processes died during a call.

    ``ranks`` are the dead ranks; ``exitcodes`` maps each to its exit code (negative:
    killed by that signal; ``None``: unknown). ``in_flight`` maps each rank that was
    inside ``fn`` when the world failed to the index of the payload it was running
    (always 0 for ``run``; for ``run_many``, the payload that killed it, on a dead
    rank); a rank between payloads or done with the batch is absent.
    """

    def __init__(
        self,
        message: str,
        ranks: Sequence[int] = (),
        exitcodes: dict[int, int | None] | None = None,
        in_flight: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.exitcodes: dict[int, int | None] = dict(exitcodes or {})
        self.in_flight: dict[int, int] = dict(in_flight or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.ranks, self.exitcodes, self.in_flight))


class RankHung(PoolFailure):
    """One or more ranks did not reply within ``call_timeout`` seconds. ``in_flight``
    as for :class:`RankCrashed`: the payload each rank was stuck in."""

    def __init__(
        self,
        message: str,
        ranks: Sequence[int] = (),
        timeout: float = 0.0,
        in_flight: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.timeout = timeout
        self.in_flight: dict[int, int] = dict(in_flight or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.ranks, self.timeout, self.in_flight))


# --- results -------------------------------------------------------------------------


@dataclass(frozen=True)
class RankOutcome(Generic[R]):
    """What one rank produced for one payload.

    ``exception`` is the rank's exception object, re-created in the parent when it
    pickles, else a :class:`RemoteException` with its type name and message; it carries
    no ``__traceback__`` (the rank's traceback text is in ``traceback``).
    ``exc_type_name`` is the qualified type name (``vargather.DTypeMismatchError``;
    builtins unqualified).
    """

    rank: int
    value: R | None = None
    exception: BaseException | None = None
    exc_type_name: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        """True when the rank returned normally."""
        return self.exception is None


@dataclass(frozen=True)
class PoolConfig:
    """The settings a pool was built with (resolved: no ``None``)."""

    world_size: int
    collective_timeout: float
    call_timeout: float
    backend: str
    start_timeout: float
    start_method: str = "spawn"
    environment: tuple[tuple[str, str], ...] = ()
    """Environment variables set for the rank processes when they start."""

    @classmethod
    def resolve(
        cls,
        world_size: int,
        *,
        collective_timeout: float | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        backend: str = "gloo",
        start_timeout: float = DEFAULT_START_TIMEOUT,
        start_method: str = "spawn",
        environment: Mapping[str, str] | None = None,
    ) -> PoolConfig:
        """Validate ``RankPool``'s arguments; ``collective_timeout=None`` reads
        ``$VARGATHER_POOL_COLLECTIVE_TIMEOUT`` (a positive number of seconds) or uses 10 s.
        Raises ``ValueError`` naming the bad value."""
        if collective_timeout is None:
            coll = _default_collective_timeout()
        else:
            coll = _positive_seconds("collective_timeout", collective_timeout)
        if environment and start_method == "forkserver":
            raise ValueError(
                "environment= needs start_method='spawn': forkserver ranks are forked "
                "from a server started earlier, whose environment they keep"
            )
        return cls(
            world_size=_positive_int("world_size", world_size),
            collective_timeout=coll,
            call_timeout=_positive_seconds("call_timeout", call_timeout),
            backend=str(backend),
            start_timeout=_positive_seconds("start_timeout", start_timeout),
            start_method=_start_method(start_method),
            environment=tuple(sorted((str(k), str(v)) for k, v in (environment or {}).items())),
        )


class RankContext:
    """What a rank function gets as its first argument.

    One context lives in each rank for the lifetime of a world, so the subgroup cache
    persists across calls (and is lost when the pool rebuilds the world).
    """

    __slots__ = ("_groups", "_timeout", "rank", "world_size")

    def __init__(self, rank: int, world_size: int, collective_timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self._timeout = timedelta(seconds=collective_timeout)
        self._groups: dict[tuple[int, ...], ProcessGroup | int] = {}

    def __repr__(self) -> str:
        return f"RankContext(rank={self.rank}, world_size={self.world_size})"

    @property
    def collective_timeout(self) -> timedelta:
        """The world's collective timeout (the pool's ``collective_timeout``)."""
        return self._timeout

    def subgroup(self, ranks: Sequence[int]) -> ProcessGroup | int:
        """The process group of ``ranks``, created on first use and cached.

        Creating a group is itself collective: every rank of the world must call
        ``subgroup`` with the same ranks in the same order (they do when they all run
        the same function). The cache key is the sorted tuple of ranks, so ``[2, 0]``
        and ``[0, 2]`` are one group. The group's timeout is the pool's
        ``collective_timeout``.

        Returns the ``ProcessGroup`` on member ranks and, as ``dist.new_group`` does,
        ``torch.distributed.GroupMember.NON_GROUP_MEMBER`` (the int ``-100`` in torch
        2.x) on the others. It is deliberately not ``None``: ``group=None`` means the
        whole world to torch.distributed.
        """
        members = [_rank_index(r, self.world_size) for r in ranks]
        key = tuple(sorted(set(members)))
        if len(key) != len(members) or not key:
            raise ValueError(f"subgroup ranks must be distinct and non-empty, got {list(ranks)}")
        if key not in self._groups:
            import torch.distributed as dist

            self._groups[key] = dist.new_group(list(key), timeout=self._timeout)
            _track_point_to_point(self._groups[key])
        group: ProcessGroup | int = self._groups[key]
        return group


def _rank_index(value: object, world_size: int) -> int:
    try:
        rank = operator.index(value)  # type: ignore[arg-type]  # any __index__ type; TypeError handled below
    except TypeError:
        rank = -1
    if isinstance(value, bool) or not 0 <= rank < world_size:
        raise ValueError(f"subgroup rank {value!r} is not a rank of a world of {world_size}")
    return rank


# --- pickling ------------------------------------------------------------------------


def _rebuild_tensor(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


class _Pickler(pickle.Pickler):
    """The standard pickler, not the ``ForkingPickler`` that ``import torch`` extends:
    tensors travel as bytes, never as shared-memory handles that die with their rank.

    A plain ``torch.Tensor`` that is a non-leaf (has a ``grad_fn``) is sent detached, as a
    leaf with the same ``requires_grad``; a view is sent as a compact copy rather than
    with its whole base storage. Other tensors (and subclasses) pickle as torch does.
    """

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        try:
            oversized = obj.layout == torch.strided and (
                obj.untyped_storage().nbytes() > obj.numel() * obj.element_size()
            )
        except Exception:  # storage-less layouts and tensor kinds
            oversized = False
        if obj.grad_fn is None and not oversized:
            return NotImplemented
        plain = obj.detach()
        if oversized:
            plain = plain.clone()  # keeps strides when dense, drops the rest of the base
        return (_rebuild_tensor, (plain, bool(obj.requires_grad)))


def _dumps(obj: object) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=_PICKLE_PROTOCOL).dump(obj)
    return buf.getvalue()


def _type_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


# (pickled exception or None, qualified type name, message, traceback text)
_ErrInfo = tuple[bytes | None, str, str, str]


def _error_info(exc: BaseException, *, skip_frames: int = 0) -> _ErrInfo:
    tb_obj = exc.__traceback__
    for _ in range(skip_frames):  # drop the harness's own frames
        if tb_obj is not None and tb_obj.tb_next is not None:
            tb_obj = tb_obj.tb_next
    tb = "".join(traceback.format_exception(type(exc), exc, tb_obj))
    try:
        message = str(exc)
    except Exception:
        message = repr(exc)
    data: bytes | None
    try:
        data = _dumps(exc)
        pickle.loads(data)  # a class that pickles but cannot be rebuilt falls back too
    except Exception:
        data = None
    return (data, _type_name(type(exc)), message, tb)


def _exception_from(info: _ErrInfo) -> BaseException:
    data, type_name, message, _ = info
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            pass
        else:
            if isinstance(exc, BaseException):
                return exc
    return RemoteException(type_name, message)


# --- the rank process ----------------------------------------------------------------


@dataclass(frozen=True)
class _RankSpec:
    rank: int
    config: PoolConfig
    store_path: str
    stderr_path: str
    conn: Connection
    lifeline: Connection
    progress: Any  # a shared RawArray("q", world_size): the payload index each rank is in


def _watch_parent(lifeline: Connection) -> None:
    """Leave at once when the parent dies, even while ``fn`` is stuck."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    os._exit(1)


@dataclass
class _PointToPoint:
    """The point-to-point operations a rank posted on one group: by the group rank of
    the peer (``_ANY_SOURCE`` for a receive from any peer)."""

    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.sent.values()) + sum(self.received.values())


_ANY_SOURCE = -1
"""The peer ``_PointToPoint`` files a receive from any peer (or from a peer it cannot
read) under."""

_P2P_OPS: dict[int, _PointToPoint] = {}
"""In a rank: the point-to-point operations posted so far on each group the pool tracks
(the world group and the context's subgroups, all alive as long as the world, so their
``id`` is theirs), by the group's ``id``."""

# (counts of one group on one rank): collectives issued, then the point-to-point
# operations by peer: sent, received (see _group_counts)
_GroupCounts = tuple[int, dict[int, int], dict[int, int]]


def _install_point_to_point_counter() -> None:
    """In a rank: wrap ``ProcessGroup``'s point-to-point methods (``send``, ``recv``,
    ``recv_anysource``: every point-to-point function of ``torch.distributed`` posts
    through them) so that each operation posted on a tracked group is counted in
    ``_P2P_OPS``. gloo adds one to the group's sequence number for each, on the posting
    rank only, which ``_group_counts`` takes back off. Once per process; an operation
    that raises before it is posted is not counted."""
    from torch.distributed import ProcessGroup

    for name, received in (("send", False), ("recv", True), ("recv_anysource", True)):
        original = getattr(ProcessGroup, name)
        if not getattr(original, "_vargather_counted", False):
            setattr(ProcessGroup, name, _counted(original, received=received))


def _counted(original: Callable[..., Any], *, received: bool) -> Callable[..., Any]:
    """``original`` (a ``ProcessGroup`` method, ``(self, tensors, peer, tag)``, or
    ``(self, tensors, tag)`` for ``recv_anysource``), counting what it posts."""
    anysource = getattr(original, "__name__", "") == "recv_anysource"

    def method(self: object, *args: Any, **kwargs: Any) -> Any:
        work = original(self, *args, **kwargs)
        counts = _P2P_OPS.get(id(self))
        if counts is not None:
            peer = _ANY_SOURCE
            if not anysource:
                raw = args[1] if len(args) > 1 else kwargs.get("srcRank", kwargs.get("dstRank"))
                peer = raw if isinstance(raw, int) else _ANY_SOURCE
            book = counts.received if received else counts.sent
            book[peer] = book.get(peer, 0) + 1
        return work

    method._vargather_counted = True  # type: ignore[attr-defined]  # a marker on the wrapper
    method.__name__ = getattr(original, "__name__", "method")
    method.__doc__ = getattr(original, "__doc__", None)
    return method


def _track_point_to_point(group: object) -> None:
    """Count the point-to-point operations posted on ``group`` from now on (not on a
    rank outside it, which gets ``NON_GROUP_MEMBER``)."""
    if not isinstance(group, int):
        _P2P_OPS.setdefault(id(group), _PointToPoint())


def _group_counts(ctx: RankContext) -> dict[tuple[int, ...], _GroupCounts]:
    """For the world group and each subgroup of this rank: the collectives this rank
    has issued on it (its sequence number less the point-to-point operations posted on
    it) and those operations, by peer (see the module docstring)."""
    import torch.distributed as dist

    groups: list[tuple[tuple[int, ...], Any]] = [((), dist.group.WORLD)]
    groups += [(k, g) for k, g in ctx._groups.items() if ctx.rank in k]
    counts: dict[tuple[int, ...], _GroupCounts] = {}
    for key, group in groups:
        get = getattr(group, "_get_sequence_number_for_group", None)
        if get is None:
            continue
        p2p = _P2P_OPS.get(id(group), _PointToPoint())
        try:
            counts[key] = (int(get()) - p2p.total, dict(p2p.sent), dict(p2p.received))
        except Exception:
            continue
    return counts


def _serve(ctx: RankContext, data: bytes, progress: Any) -> bytes | None:
    """Run one request; the encoded reply, or None to stop. ``progress[rank]`` holds the
    index of the payload being run (-1 between requests), in memory the parent shares,
    so a world that dies or hangs mid-batch still says which payload it was in."""
    try:
        kind, fn, payloads = pickle.loads(data)
    except BaseException as exc:
        return _encode_reply(None, [], 0, _error_info(exc), _group_counts(ctx))
    if kind == "stop":
        return None
    values: list[Any] = []
    try:
        for index, payload in enumerate(payloads):
            progress[ctx.rank] = index
            try:
                values.append(fn(ctx, payload))
            except BaseException as exc:
                info = _error_info(exc, skip_frames=1)
                return _encode_reply(fn, values, index, info, _group_counts(ctx))
    finally:
        progress[ctx.rank] = -1
    return _encode_reply(fn, values, len(values), None, _group_counts(ctx))


def _encode_reply(
    fn: object,
    values: list[Any],
    index: int,
    info: _ErrInfo | None,
    seqs: dict[tuple[int, ...], _GroupCounts],
) -> bytes:
    """``("ok", values, seqs)`` or ``("err", index, values, info, seqs)``; a result that
    does not pickle becomes the error, at its own payload index."""
    message = ("ok", values, seqs) if info is None else ("err", index, values, info, seqs)
    try:
        return _dumps(message)
    except BaseException:
        pass
    for bad, value in enumerate(values):  # find the first result that does not pickle
        try:
            _dumps(value)
        except BaseException as exc:
            error = TypeError(
                f"the result of {_fn_name(fn)} is not picklable ({exc}); results must "
                "pickle to travel back to the parent"
            )
            error.__cause__ = exc
            return _dumps(("err", bad, values[:bad], _error_info(error), seqs))
    failure = RuntimeError("vargather's pool could not encode this rank's reply")
    return _dumps(("err", index, [], _error_info(failure), seqs))


INDUCTOR_RANK_DEFAULTS: dict[str, str] = {
    "TORCHINDUCTOR_VEC_ISA_OK": "0",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
}
"""inductor's settings in a rank process, where the environment does not set them:
scalar C++ kernels (no probe of the CPU's vector instruction sets, which compiles and
loads six test programs: about 10 s of CPU on a fresh machine and 1.3 s per process
after) and compiling in the rank itself (no pool of compile workers beside ranks that
already run one thread each). What a compiled step issues and returns does not depend on
either; the kit compiles many small graphs in fresh processes, where both are the cost."""


def set_inductor_rank_defaults() -> None:
    """Apply ``INDUCTOR_RANK_DEFAULTS`` in this process (a rank calls it first thing):
    set each variable the environment leaves unset, and, when inductor's config is
    already imported, set its attributes to match."""
    unset = [name for name in INDUCTOR_RANK_DEFAULTS if name not in os.environ]
    for name in unset:
        os.environ[name] = INDUCTOR_RANK_DEFAULTS[name]
    # torch's config module: attributes set through its own __setattr__, typed as Any
    config: Any = sys.modules.get("torch._inductor.config")
    if config is None:  # read from the environment when inductor is first imported
        return
    # a forkserver that preloaded inductor read its environment before this rank existed
    if "TORCHINDUCTOR_VEC_ISA_OK" in unset:
        config.cpp.vec_isa_ok = False
    if "TORCHINDUCTOR_COMPILE_THREADS" in unset:
        config.compile_threads = 1


def _rank_main(spec: _RankSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ["OMP_NUM_THREADS"] = "1"
    set_inductor_rank_defaults()
    fd = os.open(spec.stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    threading.Thread(target=_watch_parent, args=(spec.lifeline,), daemon=True).start()
    conn, config = spec.conn, spec.config
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        torch.set_num_threads(1)
        set_timeout = getattr(c10d, "_set_pg_timeout", None)
        # Rendezvous under the generous start timeout (ranks come up seconds apart on a
        # loaded machine), then tighten the group to collective_timeout.
        init_timeout = config.start_timeout if set_timeout else config.collective_timeout
        # FileStore is public API, but torch.distributed re-exports it without "as", which
        # mypy's strict no-implicit-reexport rejects.
        store = dist.FileStore(spec.store_path, config.world_size)  # type: ignore[attr-defined]
        dist.init_process_group(
            config.backend,
            store=store,
            rank=spec.rank,
            world_size=config.world_size,
            timeout=timedelta(seconds=max(init_timeout, config.collective_timeout)),
        )
        if set_timeout is not None:
            set_timeout(timedelta(seconds=config.collective_timeout))
        _install_point_to_point_counter()
        _track_point_to_point(dist.group.WORLD)
    except BaseException as exc:
        conn.send_bytes(_dumps(("init_error", _error_info(exc))))
        return
    ctx = RankContext(spec.rank, config.world_size, config.collective_timeout)
    conn.send_bytes(_dumps(("ready", os.getpid())))
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the parent is gone
        try:
            reply = _serve(ctx, request, spec.progress)
        except BaseException as exc:  # the harness itself failed (MemoryError, ...)
            reply = _dumps(("err", 0, [], _error_info(exc), {}))
        if reply is None:
            break
        conn.send_bytes(reply)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    # A normal exit (atexit handlers run, so coverage.py saves its data), minus the
    # final garbage collection of torch's object graph (most of a rank's exit time).
    gc.freeze()


# --- the parent side -----------------------------------------------------------------


@dataclass
class _Reply:
    rank: int
    values: list[Any]
    error: _ErrInfo | None = None
    error_index: int = 0
    seqs: dict[tuple[int, ...], _GroupCounts] = field(default_factory=dict)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _positive_seconds(name: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]  # validated right here: float() raises on anything unusable
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _start_method(value: str) -> str:
    if value not in ("spawn", "forkserver"):
        raise ValueError(
            f"start_method must be 'spawn' or 'forkserver', got {value!r} ('fork' is refused: "
            "forking a process that may run torch's threads can deadlock)"
        )
    if value not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method {value!r} is not available on this platform")
    return value


_PRELOAD: list[str] = []
"""Modules the forkserver imports besides torch (``preload``)."""


def _server_preload() -> list[str]:
    """What the forkserver imports: torch, ``torch.distributed``, this module, and
    ``preload``'s modules, except where a CUDA device is present. There, with dynamo
    and inductor imported in the server (``check --compile``; torch 2.11 on an H200),
    no rank forked from it could use CUDA ("Cannot re-initialize CUDA in forked
    subprocess") or compile a step (dynamo reads the CUDA RNG state of every frame it
    compiles where CUDA is available): every row failed. The imports alone leave CUDA
    uninitialized (measured there), so something they set up in the server marks its
    forks. Its ranks import those modules on first use instead (seconds of CPU each)."""
    import torch

    extra = [] if torch.cuda.is_available() else _PRELOAD
    return ["torch", "torch.distributed", *extra, __name__]


def preload(modules: Sequence[str]) -> None:
    """Also import ``modules`` in the server that forkserver worlds fork from, so that
    no rank pays for them in its first call (torch's functional collectives and
    DTensor import ``torch._dynamo`` on first use: seconds of CPU per rank). Effective
    for the server this process starts next; one already running keeps its imports."""
    for name in modules:
        if name not in _PRELOAD:
            _PRELOAD.append(name)


def _default_collective_timeout() -> float:
    raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_COLLECTIVE_TIMEOUT
    return _positive_seconds(f"${COLLECTIVE_TIMEOUT_ENV}", raw.strip())


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _child_environment(overrides: dict[str, str]) -> Iterator[None]:
    """Spawned children inherit os.environ at start: set it briefly so the ranks see
    ``OMP_NUM_THREADS=1`` before torch is imported."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in overrides}
        os.environ.update(overrides)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class _World:
    """One generation of rank processes and their process group."""

    def __init__(self, config: PoolConfig, generation: int) -> None:
        self.config = config
        self.generation = generation
        self.dir = tempfile.mkdtemp(prefix=f"vargather-pool-w{config.world_size}-")
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.lifelines: list[Connection] = []
        self.stderr_paths = [
            os.path.join(self.dir, f"rank{r}.stderr") for r in range(config.world_size)
        ]
        self.stderr_marks = [0] * config.world_size
        self.ready = False
        self.exitcodes: tuple[int | None, ...] = ()  # filled in when the world is torn down
        self.progress: Any = None  # the ranks' in-flight payload indices (see _serve)
        mp: SpawnContext | ForkServerContext
        if config.start_method == "forkserver":
            mp = multiprocessing.get_context("forkserver")
            # The server imports torch once; each rank is then a fork of it instead of a
            # process that imports torch itself. Takes effect when
            # this process's forkserver starts, and replaces any earlier preload list.
            mp.set_forkserver_preload(_server_preload())
        else:
            mp = multiprocessing.get_context("spawn")
        try:
            self.progress = mp.RawArray("q", [-1] * config.world_size)
            with _child_environment({"OMP_NUM_THREADS": "1", **dict(config.environment)}):
                for rank in range(config.world_size):
                    parent_end, child_end = mp.Pipe(duplex=True)
                    life_read, life_write = mp.Pipe(duplex=False)
                    spec = _RankSpec(
                        rank=rank,
                        config=config,
                        store_path=os.path.join(self.dir, "store"),
                        stderr_path=self.stderr_paths[rank],
                        conn=child_end,
                        lifeline=life_read,
                        progress=self.progress,
                    )
                    proc = mp.Process(
                        target=_rank_main,
                        args=(spec,),
                        name=f"vargather-w{config.world_size}-rank{rank}",
                        daemon=True,
                    )
                    self.conns.append(parent_end)
                    self.lifelines.append(life_write)
                    proc.start()
                    self.procs.append(proc)
                    child_end.close()
                    life_read.close()
        except BaseException:
            self.kill()
            raise

    # -- bookkeeping

    def mark_stderr(self) -> None:
        for rank, path in enumerate(self.stderr_paths):
            try:
                self.stderr_marks[rank] = os.path.getsize(path)
            except OSError:
                self.stderr_marks[rank] = 0

    def stderr_since_mark(self, rank: int) -> str:
        try:
            with open(self.stderr_paths[rank], "rb") as f:
                f.seek(self.stderr_marks[rank])
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text if len(text) <= _STDERR_TAIL else "…" + text[-_STDERR_TAIL:]

    def in_flight(self) -> dict[int, int]:
        """The payload index each rank is running now (ranks between payloads absent)."""
        if self.progress is None:
            return {}
        return {r: int(i) for r, i in enumerate(self.progress) if i >= 0}

    def exitcode(self, rank: int) -> int | None:
        proc = self.procs[rank]
        proc.join(1.0)
        return proc.exitcode

    # -- the exchange

    def receive(
        self, ranks: set[int], deadline: float
    ) -> tuple[dict[int, bytes], set[int], set[int]]:
        """Wait for one message from each of ``ranks`` until ``deadline``.

        Returns (messages by rank, dead ranks, ranks still silent at the deadline). Stops
        early, after a short grace for the survivors, as soon as a rank dies.
        """
        pending = set(ranks)
        messages: dict[int, bytes] = {}
        dead: set[int] = set()
        by_conn = {id(self.conns[r]): r for r in ranks}
        by_sentinel = {self.procs[r].sentinel: r for r in ranks}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waitables: list[Connection | int] = [self.conns[r] for r in sorted(pending)]
            waitables += [self.procs[r].sentinel for r in sorted(pending)]
            for obj in wait(waitables, timeout=remaining):
                rank = by_sentinel[obj] if isinstance(obj, int) else by_conn[id(obj)]
                if rank not in pending:
                    continue
                conn = self.conns[rank]
                if isinstance(obj, int) and not conn.poll():
                    dead.add(rank)
                    pending.discard(rank)
                    continue
                try:
                    messages[rank] = conn.recv_bytes()
                except (EOFError, OSError):
                    dead.add(rank)
                pending.discard(rank)
            if dead:
                deadline = min(deadline, time.monotonic() + _CRASH_GRACE)
        return messages, dead, pending

    def send_all(self, data: bytes) -> set[int]:
        """Send ``data`` to every rank; the ranks whose pipe is broken."""
        broken: set[int] = set()
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(data)
            except OSError:
                broken.add(rank)
        return broken

    # -- teardown

    def kill(self) -> None:
        for proc in self.procs:
            if proc.exitcode is None:
                with contextlib.suppress(Exception):
                    proc.kill()
        self._finish()

    def request_stop(self) -> None:
        if self.ready:
            self.send_all(_dumps(("stop", None, None)))

    def wait_stopped(self, grace: float) -> None:
        if not self.ready:  # never served a call (may still be importing torch): no ceremony
            self.kill()
            return
        deadline = time.monotonic() + grace
        alive = [p for p in self.procs if p.exitcode is None]
        while alive:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait([p.sentinel for p in alive], timeout=remaining)
            alive = [p for p in alive if p.exitcode is None]
        self.kill()

    def _finish(self) -> None:
        if not self.procs and not self.conns:
            return  # already torn down
        for proc in self.procs:
            proc.join(5.0)
        self.exitcodes = tuple(proc.exitcode for proc in self.procs)
        for proc in self.procs:
            with contextlib.suppress(ValueError):
                proc.close()
        for conn in (*self.conns, *self.lifelines):
            conn.close()
        self.procs, self.conns, self.lifelines = [], [], []
        shutil.rmtree(self.dir, ignore_errors=True)


# Every open pool, held strongly: a pool nobody closed is still closed cleanly at exit.
_LIVE_POOLS: set[RankPool] = set()
_LIVE_LOCK = threading.Lock()


class RankPool:
    """A persistent world of ``world_size`` rank processes; see the module docstring.

    ``collective_timeout`` (seconds) is the process group's timeout: a collective a peer
    never joins fails with gloo's timeout error on the waiting ranks after this long.
    ``None`` reads ``$VARGATHER_POOL_COLLECTIVE_TIMEOUT`` or uses 10 s.
    ``call_timeout`` bounds each call (``RankHung`` past it); ``start_timeout`` bounds
    building a world. ``start_method`` is ``"spawn"`` (default) or ``"forkserver"`` (see
    the module docstring). ``environment``: variables the rank processes start with
    (besides ``OMP_NUM_THREADS=1``). Processes are spawned at construction; the first call waits for
    them to be ready. One call runs at a time (a lock serializes calls from threads).
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
        self._world: _World | None = None
        self._world = self._new_world()
        with _LIVE_LOCK:
            _LIVE_POOLS.add(self)

    # -- properties

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

    # -- calls

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
        """Run ``fn`` on each payload in turn, all shipped in one message.

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
        self._end_close()

    # -- internals

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

    def _end_close(self) -> None:
        world, self._world = self._world, None
        if world is not None and os.getpid() == self._owner_pid:
            world.wait_stopped(_CLOSE_GRACE)
            self._last_exitcodes = world.exitcodes

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
        return _World(self.config, self._generation)

    def _stop_world(self, *, graceful: bool) -> None:
        world, self._world = self._world, None
        if world is None:
            return
        if graceful:
            with contextlib.suppress(Exception):
                world.request_stop()
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
        for rank in sorted(dead):
            problems.append(
                f"--- rank {rank} died while starting ({_describe_exit(world.exitcode(rank))})"
                + self._stderr_note(world, rank)
            )
        for rank in sorted(silent):
            problems.append(
                f"--- rank {rank} was not ready after start_timeout={self.config.start_timeout:g} s"
                + self._stderr_note(world, rank)
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
        return self._outcomes(replies, len(payloads))

    def _exchange(self, world: _World, fn: object, request: bytes) -> list[_Reply]:
        deadline = time.monotonic() + self.config.call_timeout
        idle_dead = {r for r, proc in enumerate(world.procs) if proc.exitcode is not None}
        if idle_dead:  # died after its last reply: do not send this call anywhere
            self._fail(world, fn, {}, idle_dead, set(), before_call=True)
        broken = world.send_all(request)
        waiting = set(range(self.world_size)) - broken
        messages, dead, silent = world.receive(waiting, deadline)
        dead |= broken
        replies: dict[int, _Reply] = {}
        for rank, data in messages.items():
            replies[rank] = self._decode(rank, data)
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
        sections: list[str] = []
        for rank in sorted(dead):
            when = " while idle, before this call was sent" if before_call else ""
            sections.append(
                f"--- rank {rank} died{when} ({_describe_exit(exitcodes[rank])})"
                + self._stderr_note(world, rank)
            )
        for rank in sorted(silent):
            sections.append(
                f"--- rank {rank} did not reply within call_timeout={self.config.call_timeout:g} s"
                + self._stderr_note(world, rank)
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

    @staticmethod
    def _stderr_note(world: _World, rank: int) -> str:
        text = world.stderr_since_mark(rank).strip()
        return f"; its stderr since the previous call:\n{text}" if text else ""

    def _check_sequences(self, replies: dict[int, _Reply]) -> None:
        """Mark the world stale when the ranks' collectives on a group differ in number,
        or their point-to-point operations on it do not pair up (a send no receive
        took, a receive no send filled: left pending in the group)."""
        keys = {key for reply in replies.values() for key in reply.seqs}
        for key in sorted(keys):
            seen = {r: reply.seqs[key] for r, reply in sorted(replies.items()) if key in reply.seqs}
            group = "the world group" if not key else f"subgroup {list(key)}"
            if len({c[0] for c in seen.values()}) > 1:
                counts = ", ".join(f"rank {r}: {c[0]}" for r, c in seen.items())
                self._stale = (
                    f"the ranks' collective counts for {group} differ ({counts}): "
                    "a rank issued a collective its peers did not, so the group is out of "
                    "step; the pool rebuilds the world before the next call"
                )
                return
            unpaired = _unpaired(list(key) if key else list(range(self.world_size)), seen)
            if unpaired is not None:
                self._stale = (
                    f"the ranks' point-to-point operations on {group} do not pair up "
                    f"({unpaired}): a message or a receive is left pending in the group; "
                    "the pool rebuilds the world before the next call"
                )
                return

    def _outcomes(self, replies: list[_Reply], count: int) -> list[list[RankOutcome[Any]]]:
        per_payload: list[list[RankOutcome[Any]]] = []
        for index in range(count):
            outcomes: list[RankOutcome[Any]] = []
            for reply in replies:
                if index < len(reply.values):
                    outcomes.append(RankOutcome(reply.rank, reply.values[index]))
                elif reply.error is not None and index == reply.error_index:
                    outcomes.append(
                        RankOutcome(
                            reply.rank,
                            None,
                            _exception_from(reply.error),
                            reply.error[1],
                            reply.error[3],
                        )
                    )
                else:  # the rank stopped at an earlier payload
                    outcomes.append(RankOutcome(reply.rank, None))
            per_payload.append(outcomes)
        return per_payload

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


def _fn_name(fn: object) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}" if module else str(qualname)


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


# --- the per-process cache -----------------------------------------------------------

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
    """The process-wide pool for ``world_size``, created on first use (its ranks forked
    from a forkserver where the platform has one: rebuilding a world after a failure
    then costs milliseconds instead of a torch import per rank).

    One pool per world size is kept alive until :func:`close_all_pools` or interpreter
    exit. Asking with different settings replaces (closes) the cached pool of that size.
    Each process (each pytest-xdist worker) has its own pools.

    Raises:
        ValueError: a setting out of range, named (``PoolConfig.resolve``). A world
            that cannot start raises ``PoolStartError`` from the first call.
    """
    with _POOLS_LOCK:
        pool = _POOLS.get(world_size)
        if pool is not None and not pool.closed and pool._owner_pid == os.getpid():
            wanted = PoolConfig.resolve(
                world_size,
                collective_timeout=collective_timeout,
                call_timeout=call_timeout,
                backend=backend,
                start_timeout=start_timeout,
                start_method=start_method,
            )
            if pool.config == wanted:
                return pool
            pool.close()
        pool = RankPool(
            world_size,
            collective_timeout=collective_timeout,
            call_timeout=call_timeout,
            backend=backend,
            start_timeout=start_timeout,
            start_method=start_method,
        )
        _POOLS[world_size] = pool
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
        pool._end_close()


atexit.register(close_all_pools)

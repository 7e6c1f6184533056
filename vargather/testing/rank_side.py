"""What each rank process of a pool runs: its context, its message loop, its pickling.

Where it sits: in the testing kit, above ``pool_types`` and beneath ``world`` (which
starts processes whose target is ``_rank_main``) and ``pool``. After each call a rank
reports, per group, how many collectives and point-to-point operations it issued
(``pool``'s docstring says why).
"""

from __future__ import annotations

import contextlib
import gc
import io
import operator
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from .pool_types import PoolConfig, RemoteException

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


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

            group = dist.new_group(list(key), timeout=self._timeout)
            if not isinstance(group, int):  # NON_GROUP_MEMBER on a rank outside it
                _P2P_OPS.setdefault(id(group), _PointToPoint({}, {}))  # counted from now on
            self._groups[key] = group
        return self._groups[key]


def _rank_index(value: object, world_size: int) -> int:
    try:
        rank = operator.index(value)  # type: ignore[arg-type]  # any __index__ type; TypeError handled below
    except TypeError:
        rank = -1
    if isinstance(value, bool) or not 0 <= rank < world_size:
        raise ValueError(f"subgroup rank {value!r} is not a rank of a world of {world_size}")
    return rank


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
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


# (pickled exception or None, qualified type name, message, traceback text)
_ErrInfo = tuple[bytes | None, str, str, str]


def _error_info(exc: BaseException, *, skip_frames: int = 0) -> _ErrInfo:
    tb_obj = exc.__traceback__
    for _ in range(skip_frames):  # drop the harness's own frames
        if tb_obj is not None and tb_obj.tb_next is not None:
            tb_obj = tb_obj.tb_next
    cls, module = type(exc), type(exc).__module__
    tb = "".join(traceback.format_exception(cls, exc, tb_obj))
    name = cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"
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
    return (data, name, message, tb)


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


_ANY_SOURCE = -1
"""The peer a receive from any peer (or from a peer not read) is counted under."""


class _PointToPoint(NamedTuple):
    """The point-to-point operations posted on one group, by the group rank of the peer."""

    sent: dict[int, int]
    received: dict[int, int]


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


def _group_counts(ctx: RankContext) -> dict[tuple[int, ...], _GroupCounts]:
    """For the world group and each subgroup of this rank: the collectives this rank
    has issued on it (its sequence number less the point-to-point operations posted on
    it) and those operations, by peer."""
    import torch.distributed as dist

    groups: list[tuple[tuple[int, ...], Any]] = [((), dist.group.WORLD)]
    groups += [(k, g) for k, g in ctx._groups.items() if ctx.rank in k]
    counts: dict[tuple[int, ...], _GroupCounts] = {}
    for key, group in groups:
        get = getattr(group, "_get_sequence_number_for_group", None)
        if get is None:
            continue
        sent, received = _P2P_OPS.get(id(group), _PointToPoint({}, {}))
        try:
            issued = int(get()) - sum(sent.values()) - sum(received.values())
            counts[key] = (issued, dict(sent), dict(received))
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
    with contextlib.suppress(BaseException):
        return _dumps(message)
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
scalar C++ kernels (no probe of the CPU's vector units) and compiling in the rank itself
(no compile workers beside ranks that run one thread each). What a compiled step issues
and returns depends on neither; ``docs/property-suite.md`` has the CPU time each saves."""


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
        _P2P_OPS.setdefault(id(dist.group.WORLD), _PointToPoint({}, {}))
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


def _fn_name(fn: object) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{qualname}" if module else str(qualname)

"""One generation of a pool's rank processes: start, exchange messages, tear down.

Where it sits: in the testing kit, above ``rank_side`` (the processes' target) and
beneath ``pool``. Also the forkserver's preload list (``preload``): what the server the
ranks fork from imports once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from .pool_types import PoolConfig
from .rank_side import _dumps, _rank_main, _RankSpec

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess


_CRASH_GRACE = 0.25  # seconds to collect the survivors' replies after a rank died
_STDERR_TAIL = 3000  # characters of a rank's stderr quoted in a failure message


_PRELOAD: list[str] = []
"""Modules the forkserver imports besides torch (``preload``)."""


def _server_preload() -> list[str]:
    """What the forkserver imports: torch, ``torch.distributed``, the ranks' module
    (``rank_side``), and ``preload``'s modules, except where a CUDA device is present:
    there no rank forked from a server that imported dynamo and inductor could use CUDA
    ("Cannot re-initialize CUDA in forked subprocess", though the imports leave CUDA
    uninitialized: ``docs/compile.md``) or compile a step (dynamo reads the CUDA RNG
    state of every frame it compiles), so its ranks import them on first use."""
    import torch

    extra = [] if torch.cuda.is_available() else _PRELOAD
    return ["torch", "torch.distributed", *extra, _rank_main.__module__]


def preload(modules: Sequence[str]) -> None:
    """Also import ``modules`` in the server that forkserver worlds fork from, so that
    no rank pays for them in its first call (torch's functional collectives and
    DTensor import ``torch._dynamo`` on first use: seconds of CPU per rank). Effective
    for the server this process starts next; one already running keeps its imports."""
    for name in modules:
        if name not in _PRELOAD:
            _PRELOAD.append(name)


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

    def __init__(self, config: PoolConfig) -> None:
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
        mp: SpawnContext | ForkServerContext
        if config.start_method == "forkserver":
            mp = multiprocessing.get_context("forkserver")
            # Takes effect when this process's forkserver starts, and replaces any
            # earlier preload list.
            mp.set_forkserver_preload(_server_preload())
        else:
            mp = multiprocessing.get_context("spawn")
        try:
            # the ranks' in-flight payload indices (see _serve)
            self.progress: Any = mp.RawArray("q", [-1] * config.world_size)
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
        return {r: int(i) for r, i in enumerate(self.progress) if i >= 0}

    def exitcode(self, rank: int) -> int | None:
        proc = self.procs[rank]
        proc.join(1.0)
        return proc.exitcode

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
                pending.discard(rank)
                if isinstance(obj, int) and not conn.poll():
                    dead.add(rank)
                    continue
                try:
                    messages[rank] = conn.recv_bytes()
                except (EOFError, OSError):
                    dead.add(rank)
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
        deadline = time.monotonic() + grace
        # a world that never served a call (may still be importing torch): no ceremony
        alive = [p for p in self.procs if p.exitcode is None] if self.ready else []
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

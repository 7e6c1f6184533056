"""What one validated ``all_gather_v`` costs as the world grows: a simulation that runs
the real code path.

Where it sits: a study beside the bench (``python -m vargather bench`` needs a real gloo
world, which this machine holds up to a few ranks). Here W threads of one process each
play one rank and call the real ``vargather.all_gather_v``; the only thing replaced is
what lies under ``vargather._comm``: the ``torch.distributed`` functions it calls
(``all_gather_single``, ``broadcast``, ``batch_isend_irecv`` with its ``P2POp``,
``all_to_all_single``, ``all_gather``, ``reduce_scatter``, ``all_reduce``, ``barrier``)
and the group queries ``_group`` makes.
A *recording exchange* implements each collective between the threads and counts, per
rank: the collectives ``_comm`` entered (its own counter, made per thread), the backend
operations under them, the logical bytes each rank contributed (sent) and received, and
the bytes of the buffers the collectives wrote into.

Every byte that can steer the code travels: contributions of up to ``COPY_BYTES`` whole,
of a larger all_gather block its first ``HEAD_BYTES`` (where the gather round keeps
its headers), of a larger broadcast or point-to-point send its last ``HEAD_BYTES``
(where the wide round's region carries its headers). The rest of a large payload is
counted, not copied: payload bytes never steer vargather, and copying them would need
W times the output's memory (results are therefore not checked here: the bench and the
test suite do that on real worlds).

Header and padding bytes per rank are what the round carried beyond the payload that
rank needed: ``header`` = the headers of every rank (``slots * HEADER_BYTES`` each),
``padding`` = received - (output - own shard) - header, so a transport that pads (the
gather round's slots, the wide round's per-rank slots) shows its waste there. Host
memory per rank is the process's resident growth over the calls divided by W: every
rank's buffers as far as touched, and the Python objects the code keeps per rank (the
headers it read, its records, layouts and the group's state), all threads together.

Run ``python scripts/scale_sim.py`` (``--worlds 8,64,256,1024``, ``--markdown PATH``);
``docs/performance.md`` has its table. ``tests/test_scale_sim.py`` runs it at a small W.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather import internal

COPY_BYTES = 64 * 1024
HEAD_BYTES = 4096


@dataclass
class Tally:
    """One rank's counts for one call."""

    collectives: int = 0
    operations: int = 0
    sent: int = 0
    received: int = 0
    buffers: int = 0
    storages: set[int] = field(default_factory=set)

    def buffer(self, t: torch.Tensor) -> None:
        key = t.untyped_storage().data_ptr()
        if key not in self.storages:
            self.storages.add(key)
            self.buffers += t.untyped_storage().nbytes()


class _PerThread(list):  # type: ignore[type-arg]  # stands in for _comm's one-int list
    """The library's collective counter (``internal.swap_issued_counter``), one per thread
    (the library's ``counter[0] += 1`` reads and writes it)."""

    def __init__(self) -> None:
        super().__init__([0])
        self._local = threading.local()

    def __getitem__(self, i: Any) -> Any:
        return getattr(self._local, "n", 0)

    def __setitem__(self, i: Any, v: Any) -> None:
        self._local.n = v


def _kept(t: torch.Tensor, head: int = HEAD_BYTES) -> torch.Tensor:
    """What of a contribution travels: all of it, or its first ``head`` bytes."""
    flat = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    n = flat.numel()
    return flat.clone() if n <= COPY_BYTES else flat[:head].clone()


def _tail(t: torch.Tensor) -> torch.Tensor:
    """What of a broadcast travels: all of it, or its last ``HEAD_BYTES`` (where the wide
    round's region carries its headers)."""
    flat = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    n = flat.numel()
    return flat.clone() if n <= COPY_BYTES else flat[n - HEAD_BYTES :].clone()


def _land(dst: torch.Tensor, src: torch.Tensor, *, at_end: bool = False) -> None:
    flat = dst.reshape(-1).view(torch.uint8) if dst.dtype != torch.uint8 else dst.reshape(-1)
    if at_end:
        flat[flat.numel() - src.numel() :].copy_(src)
    else:
        flat[: src.numel()].copy_(src)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _P2POp:
    """``dist.P2POp`` without its group lookups (the simulated groups are not
    registered with torch)."""

    op: Any
    tensor: torch.Tensor
    peer: int | None = None
    group: Any = None
    tag: int = 0
    group_peer: int | None = None


class _Done:
    """A simulated send's handle: its value is posted, nothing is left to wait for."""

    def wait(self, timeout: Any = None) -> bool:
        return True


@dataclass
class _Received:
    """A simulated receive's handle: waiting lands the sender's bytes (those that
    travel) in ``tensor`` and counts them for this rank."""

    exchange: Exchange
    key: tuple[Any, ...]  # ("p2p", sender, receiver, n-th message of that pair)
    tensor: torch.Tensor
    n: int

    def wait(self, timeout: Any = None) -> bool:
        ex = self.exchange
        got = ex._wait(self.key)
        _land(self.tensor, got[self.key[1]], at_end=True)
        ex.tally.received += self.n
        ex.tally.buffer(self.tensor)
        with ex.lock:
            ex.slots.pop(self.key, None)
        return True


class _Slot:
    """One collective's contributions; ``ready`` once every expected one is in."""

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.ready = threading.Event()
        self.readers = 0


class Exchange:
    """The recording exchange between the W rank threads (module doc)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.lock = threading.Lock()
        self.slots: dict[tuple[Any, ...], _Slot] = {}
        self.local = threading.local()
        self.failed = False

    # -- per thread ------------------------------------------------------------------

    def bind(self, rank: int) -> None:
        """This thread plays ``rank``; a fresh tally (the sequence runs on: keys of
        the last call may still be read by slower ranks)."""
        self.local.rank = rank
        if not hasattr(self.local, "seq"):
            self.local.seq = 0
        self.local.tally = Tally()

    @property
    def rank(self) -> int:
        return int(self.local.rank)

    @property
    def tally(self) -> Tally:
        t = self.local.tally
        assert isinstance(t, Tally)
        return t

    def _next(self, kind: str) -> tuple[str, int]:
        self.local.seq += 1
        self.tally.operations += 1
        return (kind, int(self.local.seq))

    def _slot(self, key: tuple[Any, ...]) -> _Slot:
        with self.lock:
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = _Slot()
            return slot

    def _post(self, key: tuple[Any, ...], value: Any, expected: int) -> None:
        """This rank's contribution to ``key``, which ``expected`` ranks contribute."""
        slot = self._slot(key)
        with self.lock:
            slot.values[self.rank] = value
            if len(slot.values) == expected:
                slot.ready.set()

    def _wait(self, key: tuple[Any, ...]) -> dict[int, Any]:
        slot = self._slot(key)
        while not slot.ready.wait(timeout=1.0):
            if self.failed:
                raise RuntimeError(f"simulated rank {self.rank}: a peer failed at {key}")
        return slot.values

    def _done(self, key: tuple[str, int]) -> None:
        """This rank read ``key``: the last of the W readers forgets it."""
        slot = self._slot(key)
        with self.lock:
            slot.readers += 1
            if slot.readers == self.world:
                self.slots.pop(key, None)

    # -- the collectives ---------------------------------------------------------------

    def all_gather_single(
        self, out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> Any:
        key = self._next("all_gather")
        self._post(key, (_kept(inp), _nbytes(inp)), self.world)
        exchange = self

        class Work:
            def wait(self) -> bool:
                got = exchange._wait(key)
                n = _nbytes(inp)
                flat = (
                    out.reshape(-1).view(torch.uint8)
                    if out.dtype != torch.uint8
                    else out.reshape(-1)
                )
                for q in range(exchange.world):
                    _land(flat[q * n : (q + 1) * n], got[q][0])
                exchange._done(key)
                t = exchange.tally
                t.sent += n
                t.received += n * (exchange.world - 1)
                t.buffer(out)
                return True

        work = Work()
        if not async_op:
            work.wait()
            return None
        return work

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        key = self._next("broadcast")
        n = _nbytes(tensor)
        if self.rank == src:
            self._post(key, _tail(tensor), 1)
            self.tally.sent += n
        exchange = self

        class Work:
            def wait(self) -> bool:
                if exchange.rank != src:
                    got = exchange._wait(key)
                    _land(tensor, got[src], at_end=True)
                    exchange.tally.received += n
                    exchange.tally.buffer(tensor)
                exchange._done(key)
                return True

        work = Work()
        if not async_op:
            work.wait()
            return None
        return work

    def batch_isend_irecv(self, ops: Sequence[Any]) -> list[Any]:
        """Point-to-point sends and receives (``send_receive``): each an operation of
        its own, matched per (sender, receiver) pair in the order posted (the rounds
        post a pair's messages in the same order on both sides); a send travels whole
        or as its last ``HEAD_BYTES`` (where the wide round's region carries its
        headers; a short message travels whole), as a broadcast does. ``sent`` counts a block once however
        many peers it goes to (the logical contribution, as for every collective here)."""
        me = self.rank
        pairs = self.local.__dict__.setdefault("pairs", {})
        contributed: set[tuple[int, int]] = set()  # a block sent to W - 1 peers counts once
        works: list[_Done | _Received] = []
        for op in ops:
            peer = op.group_peer if op.group_peer is not None else op.peer
            tensor = op.tensor
            n = _nbytes(tensor)
            self.tally.operations += 1
            sending = op.op is dist.isend
            pair = (me, peer) if sending else (peer, me)
            direction = (sending, pair[0], pair[1])
            count = pairs[direction] = pairs.get(direction, 0) + 1
            key = ("p2p", pair[0], pair[1], count)
            if not sending:
                works.append(_Received(self, key, tensor, n))
                continue
            self._post(key, _tail(tensor), 1)
            if (tensor.data_ptr(), n) not in contributed:
                contributed.add((tensor.data_ptr(), n))
                self.tally.sent += n
            works.append(_Done())
        return works

    def all_to_all_single(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        group: Any = None,
    ) -> None:
        key = self._next("all_to_all")
        row = _nbytes(inp) // max(1, inp.shape[0]) if inp.shape[0] else 0
        self._post(key, (list(input_split_sizes), row), self.world)
        self._wait(key)
        self._done(key)
        me = self.rank
        t = self.tally
        t.sent += sum(n for q, n in enumerate(input_split_sizes) if q != me) * row
        t.received += sum(n for q, n in enumerate(output_split_sizes) if q != me) * row
        t.buffer(out)

    def all_gather(self, outs: list[torch.Tensor], inp: torch.Tensor, group: Any = None) -> None:
        key = self._next("all_gather_list")
        self._post(key, _kept(inp), self.world)
        got = self._wait(key)
        for q, o in enumerate(outs):
            _land(o, got[q])
        self._done(key)
        self.tally.sent += _nbytes(inp)
        self.tally.received += sum(_nbytes(o) for q, o in enumerate(outs) if q != self.rank)

    def _reduce(self, kind: str, contribution: int, received: int) -> None:
        key = self._next(kind)
        self._post(key, True, self.world)
        self._wait(key)
        self._done(key)
        self.tally.sent += contribution
        self.tally.received += received

    def all_reduce(self, t: torch.Tensor, op: Any = None, group: Any = None) -> None:
        """Counted as a ring would move it: 2 (W-1)/W of the tensor each way; values
        are left as they are (payload: they never steer the code)."""
        n = _nbytes(t)
        self._reduce(
            "all_reduce",
            2 * n * (self.world - 1) // self.world,
            2 * n * (self.world - 1) // self.world,
        )

    def reduce_scatter(
        self, out: torch.Tensor, chunks: list[torch.Tensor], op: Any = None, group: Any = None
    ) -> None:
        me = self.rank
        self._reduce(
            "reduce_scatter",
            sum(_nbytes(c) for q, c in enumerate(chunks) if q != me),
            _nbytes(out) * (self.world - 1),
        )

    def reduce_scatter_single(
        self, out: torch.Tensor, full: torch.Tensor, op: Any = None, group: Any = None
    ) -> None:
        self._reduce(
            "reduce_scatter", _nbytes(full) - _nbytes(out), _nbytes(out) * (self.world - 1)
        )

    def barrier(self, group: Any = None) -> None:
        self._reduce("barrier", 0, 0)


def install(ex: Exchange) -> Callable[[], None]:
    """Put the exchange under ``_comm``; returns the function that takes it out."""
    saved: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        saved[name] = getattr(dist, name, None)
        setattr(dist, name, value)

    put("is_initialized", lambda: True)
    put("get_rank", lambda group=None: group.rank() if group is not None else ex.rank)
    put("get_world_size", lambda group=None: group.size() if group is not None else ex.world)
    put("get_backend", lambda group=None: "gloo")
    put("get_global_rank", lambda group, r: r)
    put("all_gather_single", ex.all_gather_single)
    put("all_gather_into_tensor", ex.all_gather_single)
    put("broadcast", ex.broadcast)
    put("batch_isend_irecv", ex.batch_isend_irecv)
    put("P2POp", _P2POp)
    put("all_to_all_single", ex.all_to_all_single)
    put("all_gather", ex.all_gather)
    put("all_reduce", ex.all_reduce)
    put("reduce_scatter", ex.reduce_scatter)
    put("reduce_scatter_single", ex.reduce_scatter_single)
    put("reduce_scatter_tensor", ex.reduce_scatter_single)
    put("barrier", ex.barrier)
    issued = internal.swap_issued_counter(_PerThread())  # per thread: each plays one rank

    def remove() -> None:
        for name, value in saved.items():
            if value is None:
                delattr(dist, name)
            else:
                setattr(dist, name, value)
        internal.swap_issued_counter(issued)  # put back

    return remove


# --- the scenarios -----------------------------------------------------------------------------


def shares(profile: str, world: int) -> list[float]:
    """``even``; ``mild`` 1 to 1.75; ``heavy`` one rank 20x every other."""
    if profile == "even":
        weights = [1.0] * world
    elif profile == "mild":
        weights = [1.0 + 0.75 * r / max(world - 1, 1) for r in range(world)]
    elif profile == "heavy":
        weights = [1.0] + [0.05] * (world - 1)
    else:
        raise ValueError(profile)
    total = sum(weights)
    return [w / total for w in weights]


def row_counts(world: int, profile: str, per_rank_bytes: int, row_bytes: int) -> list[int]:
    """Rows per rank: ``per_rank_bytes`` on average."""
    total_rows = world * per_rank_bytes // row_bytes
    return [max(0, round(total_rows * s)) for s in shares(profile, world)]


@dataclass(frozen=True)
class Result:
    world: int
    profile: str
    per_rank_bytes: int
    call: str
    collectives: int
    operations: int
    sent_max: int
    received_max: int
    header_max: int
    padding_max: int
    padding_ratio: float  # padding over the payload a rank received, largest over ranks
    buffers_max: int
    output_bytes: int
    state_ints: int
    rss_per_rank: int  # the process's resident growth over the calls, over W


COLUMNS = 64  # float32 columns: 256-byte rows


def _rss() -> int:
    """This process's resident set (bytes; 0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def simulate(world: int, profile: str, per_rank_bytes: int, calls: int = 3) -> list[Result]:
    """``calls`` validated ``all_gather_v`` calls of the same sizes on a fresh group of
    ``world`` simulated ranks (the first learns the slots; then steady state)."""
    ex = Exchange(world)
    rows = row_counts(world, profile, per_rank_bytes, 4 * COLUMNS)
    out: list[list[Tally]] = [[Tally() for _ in range(world)] for _ in range(calls)]
    states: list[Any] = [None] * calls
    errors: list[BaseException] = []
    remove = install(ex)

    def play(rank: int) -> None:
        try:
            group = dist.ProcessGroup(rank, world)
            x = torch.empty(rows[rank], COLUMNS)
            x[: min(rows[rank], 2)] = float(rank)  # a few real values; the rest untouched
            for c in range(calls):
                ex.bind(rank)
                before = internal.collectives_issued()
                vargather.all_gather_v(x, group=group)
                tally = ex.tally
                tally.collectives = internal.collectives_issued() - before
                out[c][rank] = tally
                if rank == 0:
                    states[c] = internal.state_of(group)
        except BaseException as err:  # reported by the caller
            errors.append(err)
            ex.failed = True

    threads = [threading.Thread(target=play, args=(r,), daemon=True) for r in range(world)]
    rss_before = _rss()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        remove()
    rss_growth = max(0, _rss() - rss_before)
    if errors:
        raise errors[0]
    row = 4 * COLUMNS
    output = sum(rows) * row
    results = []
    for c in range(calls):
        state = states[c]
        slots = state.slots if state is not None else 1
        header = world * slots * internal.HEADER_BYTES
        tallies = out[c]
        padding = [
            max(0, t.received - (output - rows[r] * row) - (header - slots * internal.HEADER_BYTES))
            for r, t in enumerate(tallies)
        ]
        ratio = max(
            (p / max(1, output - rows[r] * row) for r, p in enumerate(padding)), default=0.0
        )
        results.append(
            Result(
                world=world,
                profile=profile,
                per_rank_bytes=per_rank_bytes,
                call="first" if c == 0 else "steady",
                collectives=max(t.collectives for t in tallies),
                operations=max(t.operations for t in tallies),
                sent_max=max(t.sent for t in tallies),
                received_max=max(t.received for t in tallies),
                header_max=header,
                padding_max=max(padding),
                padding_ratio=ratio,
                buffers_max=max(t.buffers for t in tallies),
                output_bytes=output,
                state_ints=(len(state.wide) + len(state.wide_max) + len(state.wide_last))
                if state is not None
                else 0,
                rss_per_rank=rss_growth // world,
            )
        )
    return results


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def table(results: Sequence[Result]) -> str:
    head = (
        "| W | per rank | profile | call | collectives | backend ops | sent (max rank) | "
        "received (max rank) | headers | padding (max rank) | padding / payload | "
        "buffers written (max rank) | host memory per rank | output |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in results:
        lines.append(
            f"| {r.world} | {_size(r.per_rank_bytes)} | {r.profile} | {r.call} | "
            f"{r.collectives} | {r.operations} | {_size(r.sent_max)} | "
            f"{_size(r.received_max)} | {_size(r.header_max)} | {_size(r.padding_max)} | "
            f"{100 * r.padding_ratio:.1f}% | {_size(r.buffers_max)} | "
            f"{_size(r.rss_per_rank)} | {_size(r.output_bytes)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--worlds", default="8,64,256,1024")
    p.add_argument("--profiles", default="even,mild,heavy")
    p.add_argument(
        "--per-rank",
        default="1024,262144,1048576",
        help=(
            "average payload bytes per rank (default: 1 KiB and 256 KiB, the gather round "
            "for even and mild sizes; 1 MiB, the wide round)"
        ),
    )
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--markdown", metavar="PATH")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    results: list[Result] = []
    for w in (int(v) for v in a.worlds.split(",")):
        for per in (int(v) for v in a.per_rank.split(",")):
            for prof in a.profiles.split(","):
                found = simulate(w, prof, per, a.calls)
                results += [found[0], found[-1]] if len(found) > 1 else found
                print(f"W={w} {prof} {per} B/rank done", file=sys.stderr, flush=True)
    text = table(results)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

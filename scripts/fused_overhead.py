"""Per-call CPU overhead of a validated ``all_gather_v`` in the fused round.

On a ``--world``-rank gloo world (processes spawned here; ``FileStore`` rendezvous in a
temporary directory, as the bench's rank pool uses, or ``--store tcp``), every rank
runs blocks of ``--calls`` calls of each case, interleaved ``--repeats`` times:

* ``baseline``: one ``dist.all_gather_into_tensor`` (``all_gather_single`` on newer
  torch) of the same total bytes (``--total`` bytes split evenly over the ranks);
* ``vargather``: ``vargather.all_gather_v`` of a float32 shard of the same bytes,
  validated (``sizes=None``), steady state (one collective per call);
* ``moving``: the same with the shard's row count changing every call within one
  capacity bucket (every rank's size differs from the previous call's);
* ``coalesced``: ``vargather.all_gather_v_coalesced`` of three tensors (float32,
  int64, bool) of the same total bytes.

For each case rank 0 reports, per call, in microseconds (median over the repeats):

* ``wall``: the wall-clock time of a call;
* ``cpu``: the CPU time of the calling thread (``time.thread_time``): what the call
  costs this rank in Python and torch, robust against a loaded machine (the gloo
  worker threads that move the bytes are not counted, nor is the time spent waiting);
* ``coll``: wall-clock time inside the underlying torch collective call;
* ``outside``: ``wall - coll``, the per-call work around the collective.

Then a ``cProfile`` of ``--profile-calls`` calls of the ``vargather`` case on rank 0,
the top functions by own time (``--top``). Nothing is asserted.

``--local`` measures the same cases in this one process instead, noise-free: a
``fake``-backend world of ``--world`` ranks whose all_gather is replaced by a local
copy of this rank's block into every rank's slot (every rank sent the same), so the
figures are vargather's own CPU work per call (the arrival census writes to a
``FakeStore``, which costs nothing; on a real store its writes are a writer thread's,
off the calling thread). ``--local`` models only the gather round: a 4-rank total past
2 MiB goes wide, whose asynchronous operations the fake all_gather does not take.

    python scripts/fused_overhead.py                       # 2 ranks, 4 KB total
    python scripts/fused_overhead.py --world 4 --total 65536
    python scripts/fused_overhead.py --no-profile --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_INSIDE = [0, 0]  # [ns inside the torch collective, calls]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _raw_all_gather() -> Callable[..., Any]:
    fn = getattr(dist, "all_gather_single", None)
    return fn if fn is not None else dist.all_gather_into_tensor


def _timing(fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _INSIDE[0] += time.perf_counter_ns() - t
            _INSIDE[1] += 1

    return timed


def _cases(world: int, rank: int, total: int) -> dict[str, Callable[[int], Any]]:
    import vargather

    per_rank = total // world
    elems = max(1, per_rank // 4)
    raw = _timing(_raw_all_gather())
    send = torch.randn(elems)
    recv = torch.empty(world * send.numel())
    x = torch.randn(elems)
    # Moving sizes: rows of 16 bytes, every rank's count changes every call, within
    # 1/16 of the per-rank payload (one capacity bucket's worth of slack).
    rows = max(2, per_rank // 16)
    spread = max(1, rows // 32)
    moving = [torch.randn(rows - (i % 4) * spread // 2 - 1 - rank % 2, 4) for i in range(4)]
    third = max(1, per_rank // 3)
    c_float = torch.randn(max(1, third // 4))
    c_long = torch.arange(max(1, third // 8), dtype=torch.int64)
    c_bool = torch.zeros(max(1, per_rank - third // 4 * 4 - third // 8 * 8), dtype=torch.bool)

    def baseline(i: int) -> Any:
        return raw(recv, send)

    def fused(i: int) -> Any:
        return vargather.all_gather_v(x)

    def moved(i: int) -> Any:
        return vargather.all_gather_v(moving[i % 4])

    def coalesced(i: int) -> Any:
        return vargather.all_gather_v_coalesced([c_float, c_long, c_bool])

    return {"baseline": baseline, "vargather": fused, "moving": moved, "coalesced": coalesced}


def _block(fn: Callable[[int], Any], calls: int) -> tuple[float, float, float]:
    """(wall, thread cpu, inside the collective) per call, microseconds."""
    dist.barrier()
    _INSIDE[0] = _INSIDE[1] = 0
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for i in range(calls):
        fn(i)
    t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    return (t1 - t0) / calls / 1e3, (c1 - c0) / calls / 1e3, _INSIDE[0] / calls / 1e3


def _worker(rank: int, world: int, init: str, opts: dict[str, Any], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    import vargather._comm as comm

    original = comm._all_gather_single
    comm._all_gather_single = lambda: _timing(original())  # type: ignore[assignment]
    cases = _cases(world, rank, opts["total"])
    names = [n for n in cases if n in opts["cases"]]
    for name in names:
        for i in range(opts["warmup"]):
            cases[name](i)
    samples: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    for _ in range(opts["repeats"]):
        for name in names:
            samples[name].append(_block(cases[name], opts["calls"]))
    profile_text = ""
    if opts["profile_calls"] and "vargather" in cases:
        prof = cProfile.Profile() if rank == 0 else None
        dist.barrier()
        if prof is not None:
            prof.enable()
        for i in range(opts["profile_calls"]):
            cases[opts["profile_case"]](i)
        if prof is not None:
            prof.disable()
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            stats.sort_stats("tottime").print_stats(opts["top"])
            stats.sort_stats("cumulative").print_stats(opts["top"])
            profile_text = buf.getvalue()
    dist.barrier()
    if rank == 0:
        result = {
            name: {
                key: statistics.median(s[j] for s in samples[name])
                for j, key in enumerate(("wall", "cpu", "coll"))
            }
            for name in names
        }
        with open(out, "w") as f:
            json.dump({"result": result, "profile": profile_text}, f)
    dist.destroy_process_group()


def _local(args: argparse.Namespace) -> int:
    """The cases in this process, on a fake world with a local-copy all_gather."""
    torch.set_num_threads(1)  # as each rank of the real world
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.world)
    import vargather._comm as comm

    def local_copy(output: torch.Tensor, local: torch.Tensor, group: Any = None) -> None:
        w = output.numel() // max(1, local.numel())
        output.view(w, -1).copy_(local.view(1, -1).expand(w, -1))

    timed = _timing(local_copy)
    comm._all_gather_single = lambda: timed  # type: ignore[assignment]
    cases = _cases(args.world, 0, args.total)
    cases["baseline"] = _baseline_local(args.world, args.total, timed)
    names = [n for n in cases if n in args.cases.split(",")]
    samples: dict[str, list[float]] = {n: [] for n in names}
    for name in names:
        for i in range(args.warmup):
            cases[name](i)
    for _ in range(args.repeats):
        for name in names:
            c0 = time.thread_time_ns()
            for i in range(args.calls):
                cases[name](i)
            samples[name].append((time.thread_time_ns() - c0) / args.calls / 1e3)
    print(
        f"local (fake world of {args.world}, all_gather = a local copy), {args.total} bytes "
        f"in total, {args.calls} calls x {args.repeats} repeats: CPU microseconds per call"
    )
    for name in names:
        print(f"{name:<10} {statistics.median(samples[name]):9.1f}")
    if not args.no_profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(args.profile_calls):
            cases[args.profile_case](i)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    return 0


def _baseline_local(world: int, total: int, timed: Callable[..., Any]) -> Callable[[int], Any]:
    send = torch.randn(max(1, total // world // 4))
    recv = torch.empty(world * send.numel())
    return lambda i: timed(recv, send)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--total", type=int, default=4096, help="bytes gathered in total")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed block")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved blocks per case")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--cases", default="baseline,vargather,moving,coalesced", help="comma-separated"
    )
    parser.add_argument("--profile-calls", type=int, default=2000)
    parser.add_argument("--profile-case", default="vargather")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--store", choices=("file", "tcp"), default="file")
    parser.add_argument("--json", help="write the per-call figures here")
    parser.add_argument("--local", action="store_true", help="one process, fake world")
    args = parser.parse_args(argv)
    if args.local:
        return _local(args)
    tmp = tempfile.mkdtemp(prefix="fused_overhead_")
    init = (
        f"file://{os.path.join(tmp, 'store')}"
        if args.store == "file"
        else f"tcp://127.0.0.1:{_free_port()}"
    )
    out = os.path.join(tmp, "result.json")
    opts = {
        "total": args.total,
        "calls": args.calls,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "cases": args.cases.split(","),
        "profile_calls": 0 if args.no_profile else args.profile_calls,
        "profile_case": args.profile_case,
        "top": args.top,
    }
    mp.spawn(_worker, args=(args.world, init, opts, out), nprocs=args.world, join=True)
    with open(out) as f:
        found = json.load(f)
    result = found["result"]
    base = result.get("baseline")
    print(
        f"world {args.world}, {args.total} bytes in total, {args.calls} calls x "
        f"{args.repeats} repeats, {args.store} store (medians, microseconds per call)"
    )
    print(f"{'case':<10} {'wall':>9} {'cpu':>9} {'coll':>9} {'outside':>9} {'wall/base':>10}")
    for name, r in result.items():
        ratio = f"{r['wall'] / base['wall']:.2f}x" if base else "-"
        print(
            f"{name:<10} {r['wall']:9.1f} {r['cpu']:9.1f} {r['coll']:9.1f} "
            f"{r['wall'] - r['coll']:9.1f} {ratio:>10}"
        )
    if found["profile"]:
        print(found["profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "result": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``torch.compile`` costs and saves around ``vargather.all_gather_v`` (docs/compile.md).

On a ``--world``-rank gloo world (processes spawned here, one port on localhost), each
rank runs one training step (linear layer -> ``all_gather_v`` with ragged sizes -> a
loss that differs per rank -> backward) eagerly and compiled with each ``--backends``
entry, and reports from rank 0:

* graph breaks and graphs per call, from ``torch._dynamo.explain`` (sizes given and
  ``sizes=None``), and whether ``fullgraph=True`` compiles;
* the first compiled call (compilation included) and the steady-state time per step
  (median of ``--calls`` steps after ``--warmup``), against the eager step;
* first, each backend's one-time cost in the process (a compiled step without a
  gather), so that the first-call figures below are the gather's own;
* for scale, the same for torch's own ``all_gather_tensor_autograd`` (equal sizes: every
  rank pads to the largest shard), the functional collective the issue compares with.

Every rank waits at a barrier before each timed step, so a step's time is the rank's
own work plus the wait for its slowest peer inside the collectives. Nothing is
asserted. It runs against whichever ``vargather`` is importable (point ``PYTHONPATH``
at another checkout to measure that one): without the custom operator
``fullgraph=True`` fails, and the step is then compiled with ``fullgraph=False``.

    python scripts/compile_bench.py --world 3
    python scripts/compile_bench.py --world 2 --backends eager,aot_eager --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = (3, 1, 4, 2)
FEATURES = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed(fn: Callable[[], Any], calls: int, warmup: int) -> tuple[float, float]:
    """(first call, median of ``calls`` later calls), seconds, each after a barrier."""
    dist.barrier()
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    for _ in range(warmup):
        dist.barrier()
        fn()
    times = []
    for _ in range(calls):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from torch.distributed import _functional_collectives as funcol

    import vargather

    sizes = list(SIZES[:world])
    torch.manual_seed(0)
    lin = torch.nn.Linear(FEATURES, FEATURES)
    x = torch.randn(sizes[rank], FEATURES)
    x_pad = torch.randn(max(sizes), FEATURES)
    scale = float(rank + 1)

    def vg_step(s: list[int] | None) -> Callable[[torch.Tensor], torch.Tensor]:
        def step(t: torch.Tensor) -> torch.Tensor:
            out = vargather.all_gather_v(lin(t), 0, sizes=s)
            return (out * scale).square().sum()

        return step

    def funcol_step(t: torch.Tensor) -> torch.Tensor:
        world_group = dist.group.WORLD
        assert world_group is not None  # initialized above
        out: torch.Tensor = funcol.all_gather_tensor_autograd(lin(t), 0, world_group)
        return (out * scale).square().sum()

    def run(fn: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> Callable[[], None]:
        def go() -> None:
            lin.zero_grad(set_to_none=True)
            torch.autograd.backward(fn(t))

        return go

    rows: list[dict[str, Any]] = []
    # Each backend's one-time cost in a process (imports, inductor's C++ toolchain
    # checks) is paid here, on a step without a collective, and reported on its own.
    for backend in args.backends:
        torch._dynamo.reset()
        plain = torch.compile(lambda t: lin(t).square().sum(), backend=backend, fullgraph=True)
        first, steady = _timed(run(plain, x), 3, 1)
        rows.append(
            {
                "case": "warm-up, no gather",
                "backend": backend,
                "fullgraph": True,
                "first_s": first,
                "steady_ms": steady * 1e3,
            }
        )
    cases: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], torch.Tensor]] = [
        ("vargather sizes given", vg_step(sizes), x),
        ("vargather sizes=None", vg_step(None), x),
        ("funcol equal sizes", funcol_step, x_pad),
    ]
    for label, step, inp in cases:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(step)(inp)
        first, steady = _timed(run(step, inp), args.calls, args.warmup)
        rows.append(
            {
                "case": label,
                "backend": "none (eager)",
                "first_s": first,
                "steady_ms": steady * 1e3,
                "graph_breaks": explained.graph_break_count,
                "graphs": explained.graph_count,
            }
        )
        for backend in args.backends:
            torch._dynamo.reset()
            fullgraph = True
            try:
                compiled = torch.compile(step, backend=backend, fullgraph=True)
                first, steady = _timed(run(compiled, inp), args.calls, args.warmup)
            except Exception as err:  # no custom operator: dynamo refuses fullgraph
                fullgraph = False
                reason = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
                torch._dynamo.reset()
                dist.barrier()  # the ranks failed at the same place, before a collective
                compiled = torch.compile(step, backend=backend)
                first, steady = _timed(run(compiled, inp), args.calls, args.warmup)
            rows.append(
                {
                    "case": label,
                    "backend": backend,
                    "fullgraph": fullgraph,
                    "fullgraph_error": None if fullgraph else reason,
                    "first_s": first,
                    "steady_ms": steady * 1e3,
                }
            )
    if rank == 0:
        out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=3, choices=(2, 3, 4))
    parser.add_argument("--backends", default="eager,aot_eager,inductor")
    parser.add_argument("--calls", type=int, default=50, help="timed steady-state steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, port, args, queue))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    rows = queue.get()
    for p in procs:
        p.join()
    import vargather

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "world": args.world,
        "sizes": list(SIZES[: args.world]),
        "features": FEATURES,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "vargather": os.path.dirname(vargather.__file__),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    print(json.dumps(meta))
    print(f"{'case':24} {'backend':13} {'fullgraph':9} {'first s':>8} {'steady ms':>10}  breaks")
    for r in rows:
        breaks = f"{r['graph_breaks']} ({r['graphs']} graphs)" if "graph_breaks" in r else ""
        fg = "" if "fullgraph" not in r else ("yes" if r["fullgraph"] else "NO")
        print(
            f"{r['case']:24} {r['backend']:13} {fg:9} {r['first_s']:8.2f} "
            f"{r['steady_ms']:10.2f}  {breaks}"
        )
        if r.get("fullgraph_error"):
            print(f"{'':24} fullgraph=True: {r['fullgraph_error']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

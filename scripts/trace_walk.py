"""The walk of one steady ``all_gather_v`` forward through the library: modules entered, moves.

A measurement for the house's shape, not a test: how long the data's path is. Two gloo
ranks (FileStore rendezvous in a temporary directory, no ports) gather the same ragged
shards ``--warm`` times, so the next call takes the steady path, then rank 0 traces one
more call with ``sys.setprofile``. Every Python call and return event whose frame lies
in a ``vargather`` module is kept; the walk is that sequence of modules with runs of
the same module folded into one step.

* **modules entered**: the distinct ``vargather`` modules the walk passes through;
* **moves**: the number of steps in the walk less one, that is how many times control
  crosses from one ``vargather`` module into another, going down (a call) or coming
  back (a return).

    python scripts/trace_walk.py                # a table
    python scripts/trace_walk.py --json         # {"modules": [...], "moves": N, "walk": [...]}
    python scripts/trace_walk.py --op all_to_all_v     # or reduce_scatter_v
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _module_of(frame: types.FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) and name.startswith("vargather") else None


def _call(op: str, rank: int) -> Any:
    import vargather

    x = torch.arange(12 * (rank + 1), dtype=torch.float32).reshape(-1, 4) + rank
    if op == "all_gather_v":
        return vargather.all_gather_v(x)
    if op == "all_to_all_v":  # rank r's 3 (r + 1) rows as (r + 1) and 2 (r + 1)
        return vargather.all_to_all_v(x, [rank + 1, 2 * (rank + 1)])
    if op == "reduce_scatter_v":
        return vargather.reduce_scatter_v(torch.arange(24.0).reshape(6, 4) + rank, [2, 4])
    raise SystemExit(f"unknown --op {op!r}")


def _rank(rank: int, store_dir: str, op: str, warm: int, out: str) -> None:
    store = dist.FileStore(os.path.join(store_dir, "store"), WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    try:
        for _ in range(warm):
            _call(op, rank)
        dist.barrier()
        walk: list[str] = []

        def profile(frame: types.FrameType, event: str, arg: object) -> None:
            del arg
            if event not in ("call", "return"):
                return
            module = _module_of(frame)
            if module is not None and (not walk or walk[-1] != module):
                walk.append(module)

        sys.setprofile(profile)
        try:
            _call(op, rank)
        finally:
            sys.setprofile(None)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(walk, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--op", default="all_gather_v", choices=("all_gather_v", "all_to_all_v", "reduce_scatter_v")
    )
    parser.add_argument("--warm", type=int, default=5, help="calls before the traced one")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "walk.json")
        mp.start_processes(
            _rank, args=(tmp, args.op, args.warm, out), nprocs=WORLD, start_method="spawn"
        )
        with open(out) as f:
            walk: list[str] = json.load(f)
    modules = sorted(set(walk))
    result = {"op": args.op, "modules": modules, "moves": max(len(walk) - 1, 0), "walk": walk}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.op}: {len(modules)} modules entered, {result['moves']} moves")
        print("walk: " + " -> ".join(m.removeprefix("vargather.") for m in walk))
    return 0


if __name__ == "__main__":
    sys.exit(main())

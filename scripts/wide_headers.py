"""Where the wide round's time goes at 1 MiB per rank, and whether its headers can ride
in the broadcasts (a design experiment beside the bench, not part of the package).

On a real gloo world, per rank size, in the same repeats (each a burst of ``--calls``
calls per variant in a rotated order, the slowest rank's mean time per call), each
variant's ratio to ``limit``, min-median-max over the repeats:

* ``limit``: one equal ``all_gather_into_tensor`` of the same total bytes into a fresh
  output;
* ``bcast``: the W payload broadcasts alone into a fresh rank-major buffer (what the
  wide round costs without its header all_gather: the payload's floor on this design);
* ``bcast+ag``: the same with the headers' small all_gather in flight (the wide round's
  collectives, without vargather's Python around them);
* ``trail``: the W broadcasts with each rank's headers at the end of its region, then
  the regions closed up in place (one ``memmove`` per rank but the first);
* ``auto``: ``vargather.all_gather_v`` as it is;
* ``auto~changing``: the same with the bench's sizes changing every call;
* ``auto@group``, ``limit@group``: ``auto`` and ``limit`` on a group of every rank made
  with ``new_group`` (a group of its own is what the bench gives each of vargather's
  variants).

Run: ``python scripts/wide_headers.py --per-rank-kb 256,1024,4096``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather.testing import RankContext, RankPool

HEAD = 96


def _rank(ctx: RankContext, job: tuple[int, int, int, tuple[str, ...], str, int]) -> Any:
    per_rank, repeats, calls, variants, profile, wide_min = job
    torch.set_num_threads(1)
    if wide_min >= 0:  # where the library's groups switch to the wide round, for this study
        vargather._fused.WIDE_MIN_BYTES = wide_min  # type: ignore[misc]  # a Final, moved on purpose
    w, r = ctx.world_size, ctx.rank
    n = per_rank // 4
    weights = [1.0] * w if profile == "even" else [1 + 0.25 * q for q in range(w)]
    mine = [int(n * w * q / sum(weights)) for q in weights]
    x = torch.arange(mine[r], dtype=torch.float32) + r
    own = [m * 4 for m in mine]  # bytes per rank
    step = max(1, n // 20)
    phases = []
    for i in range(w):
        sizes = list(mine)
        sizes[i % w] += step
        sizes[(i + 1) % w] -= step
        phases.append(torch.arange(sizes[r], dtype=torch.float32) + r)
    eq = torch.zeros(n, dtype=torch.float32)
    head = torch.full((HEAD,), r, dtype=torch.uint8)

    def limit(_: int) -> None:
        out = torch.empty(n * w)
        dist.all_gather_into_tensor(out, eq)

    starts = [sum(own[:q]) for q in range(w + 1)]

    def bcast(i: int, with_headers: bool = False) -> None:
        buf = torch.empty(starts[w], dtype=torch.uint8)
        buf[starts[r] : starts[r + 1]].view(torch.float32).copy_(x)
        works = []
        if with_headers:
            heads = torch.empty(w * HEAD, dtype=torch.uint8)
            works.append(dist.all_gather_into_tensor(heads, head, async_op=True))
        works += [
            dist.broadcast(buf[starts[q] : starts[q + 1]], src=q, async_op=True) for q in range(w)
        ]
        for wk in works:
            wk.wait()

    def trail(i: int) -> None:
        buf = torch.empty(starts[w] + w * HEAD, dtype=torch.uint8)
        at = starts[r] + r * HEAD
        buf[at : at + own[r]].view(torch.float32).copy_(x)
        buf[at + own[r] : at + own[r] + HEAD].copy_(head)
        works = [
            dist.broadcast(
                buf[starts[q] + q * HEAD : starts[q + 1] + (q + 1) * HEAD], src=q, async_op=True
            )
            for q in range(w)
        ]
        for wk in works:
            wk.wait()
        base = buf.data_ptr()
        for q in range(1, w):
            ctypes.memmove(base + starts[q], base + starts[q] + q * HEAD, own[q])
        buf[: starts[w]].view(torch.float32)

    runs = {
        "limit": limit,
        "bcast": bcast,
        "bcast+ag": lambda i: bcast(i, True),
        "trail": trail,
        "auto": lambda i: vargather.all_gather_v(x),
        "auto~changing": lambda i: vargather.all_gather_v(phases[i % w]),
        "auto@group": lambda i: vargather.all_gather_v(x, group=group),
        "limit@group": lambda i: dist.all_gather_into_tensor(torch.empty(n * w), eq, group=group),
    }
    group = dist.new_group(list(range(w)))
    found: list[dict[str, float]] = []
    for v in variants:
        for i in range(2 * w):
            runs[v](i)
    for rep in range(repeats):
        times: dict[str, float] = {}
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            fn = runs[v]
            dist.barrier()
            t0 = time.perf_counter()
            for i in range(calls):
                fn(i)
            dt = torch.tensor([(time.perf_counter() - t0) / calls])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[v] = float(dt)
        found.append(times)
    return found


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--per-rank-kb", default="256,1024,4096")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--variants", default="limit,bcast,bcast+ag,trail,auto,auto~changing")
    p.add_argument("--profile", default="even", choices=("even", "mild"))
    p.add_argument(
        "--wide-min-kb", type=int, default=-1, help="move the switch to the wide round (KiB)"
    )
    a = p.parse_args()
    variants = tuple(a.variants.split(","))
    wide = a.wide_min_kb * 1024 if a.wide_min_kb >= 0 else -1
    with RankPool(a.ranks, collective_timeout=300.0, call_timeout=1800.0) as pool:
        print(f"{a.ranks} ranks, {a.profile}; ratio to the limit min-median-max over {a.repeats}")
        print(f"load average at start: {os.getloadavg()}")
        print("| per rank | " + " | ".join(variants[1:]) + " | limit ms |")
        print("|---|" + "---|" * len(variants))
        for kb in (int(s) for s in a.per_rank_kb.split(",")):
            res = pool.run(_rank, (kb * 1024, a.repeats, a.calls, variants, a.profile, wide))[0]
            cells = []
            for v in variants[1:]:
                ratios = sorted(t[v] / t["limit"] for t in res)
                cells.append(f"{ratios[0]:.2f}-{statistics.median(ratios):.2f}-{ratios[-1]:.2f}")
            limit_ms = statistics.median(t["limit"] for t in res) * 1e3
            print(f"| {kb} KiB | " + " | ".join(cells) + f" | {limit_ms:.2f} |", flush=True)
        print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

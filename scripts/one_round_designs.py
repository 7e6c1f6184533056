"""Where each one-round design wins above 128 KiB per rank, on a quiet machine.

A design experiment beside the bench (not part of the package), the successor of
``one_round_alternatives.py``. On a real gloo world, per rank size and profile, it times
in the same repeats (each a burst of ``--calls`` calls per variant, in a rotated order,
the slowest rank's mean time per call, and the CPU time per call of every rank's
process together, gloo's threads included: on a shared 2-core machine the CPU a design
burns is what a quiet run's wall time follows, and it is far less disturbed by other
processes) and prints each variant's ratio to ``limit`` of the same repeat, min-median-max
over the repeats:

* ``limit``: one equal ``all_gather_single`` of the same total bytes;
* ``auto``: the library as it is (whatever round its policy picks);
* ``two-rounds``: the header round, then the payload's transport (no wide round, no
  gather round past 128 KiB);
* ``padded``: the gather round stretched to every size (headers and payload in one
  equal all_gather, padded to the largest rank);
* ``wide``: the policy before this study: the wide round above 128 KiB per rank;
* ``auto-1m``: the library's policy with the gather round stretched to 1 MiB.

The other designs this study weighed were timed with earlier versions of this script
(``docs/performance.md``, "One round at every size"): the *split* gather round (the
headers by one small all_gather in flight with the equal payload all_gather) and the
wide round's headers as W broadcasts of their own (2W operations).

Run: ``python scripts/one_round_designs.py --per-rank-kb 256,1024,4096 --profile even``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather import _fused
from vargather.testing import RankContext, RankPool

_HUGE = 1 << 62
_DEFAULTS = {
    name: getattr(_fused, name)
    for name in ("FUSED_MAX_BYTES", "WIDE_MIN_BYTES", "PAD_LIMIT", "WASTE_LIMIT", "SMALL_BYTES")
    if hasattr(_fused, name)
}


def _set(variant: str) -> None:
    """Module switches for ``variant`` (read by ``_fused`` at call time), state reset."""
    for name, value in _DEFAULTS.items():
        setattr(_fused, name, value)
    old = 128 * 1024
    switches: dict[str, object] = {}
    if variant == "two-rounds":
        switches = {"FUSED_MAX_BYTES": old, "WIDE_MIN_BYTES": _HUGE, "PAD_LIMIT": _HUGE}
        switches |= {"WASTE_LIMIT": float(_HUGE), "SMALL_BYTES": old}
    elif variant == "padded":
        switches = {"FUSED_MAX_BYTES": _HUGE, "WIDE_MIN_BYTES": _HUGE, "PAD_LIMIT": _HUGE}
        switches |= {"WASTE_LIMIT": float(_HUGE), "SMALL_BYTES": old}
    elif variant == "wide":  # the policy before: wide above 128 KiB
        switches = {"FUSED_MAX_BYTES": old, "WIDE_MIN_BYTES": old, "PAD_LIMIT": 4}
        switches["SMALL_BYTES"] = old
    elif variant == "auto-1m":  # the gather round up to 1 MiB per rank
        switches = {"FUSED_MAX_BYTES": 1 << 20, "WIDE_MIN_BYTES": 1 << 20}
    for name, value in switches.items():
        if name in _DEFAULTS:
            setattr(_fused, name, value)
    fresh = _fused.FusedState()
    for kind in ("single", "coalesced"):
        _fused.replace_state(None, kind, **fresh.__dict__)  # type: ignore[arg-type]


def _rank(ctx: RankContext, job: tuple[int, tuple[float, ...], int, int, tuple[str, ...]]) -> Any:
    per_rank, shares, repeats, calls, variants = job
    torch.set_num_threads(1)
    w, r = ctx.world_size, ctx.rank
    cols = 64
    rows_total = per_rank * w // (4 * cols)
    rows = [int(rows_total * s) for s in shares]
    x = torch.arange(rows[r] * cols, dtype=torch.float32).reshape(rows[r], cols) + r
    total = sum(rows) * cols * 4
    eq = torch.zeros(total // 4 // w, dtype=torch.float32)
    out = torch.empty(eq.numel() * w)
    want = torch.cat(
        [
            torch.arange(n * cols, dtype=torch.float32).reshape(n, cols) + q
            for q, n in enumerate(rows)
        ]
    )
    found: list[dict[str, float]] = []
    for rep in range(repeats):
        times: dict[str, float] = {}
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            if v != "limit":
                _set(v)
                for _ in range(3):  # warm: the state learns the capacities
                    got = vargather.all_gather_v(x)
                if rep == 0:
                    assert torch.equal(got, want), v
            dist.barrier()
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(calls):
                if v == "limit":
                    dist.all_gather_into_tensor(out, eq)
                else:
                    vargather.all_gather_v(x)
            dt = torch.tensor([(time.perf_counter() - t0) / calls])
            cpu = torch.tensor([(time.process_time() - c0) / calls])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
            times[v] = float(dt)
            times[v + "@cpu"] = float(cpu)
        found.append(times)
    _set("auto")
    return found


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--per-rank-kb", default="256,512,1024,4096,16384")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--profile", default="mild", choices=("even", "mild"))
    p.add_argument("--variants", default="limit,auto,two-rounds,padded,wide")
    a = p.parse_args()
    w = a.ranks
    variants = tuple(a.variants.split(","))
    weights = [1.0] * w if a.profile == "even" else [1 + 0.25 * i for i in range(w)]
    shares = tuple(x / sum(weights) for x in weights)
    with RankPool(w, collective_timeout=300.0, call_timeout=1800.0) as pool:
        print(f"{w} ranks, {a.profile}, ratio to the limit min-median-max over {a.repeats}")
        print(f"load average at start: {os.getloadavg()}")
        print("| per rank | " + " | ".join(variants[1:]) + " | limit ms |")
        print("|---|" + "---|" * len(variants))
        for kb in (int(s) for s in a.per_rank_kb.split(",")):
            res = pool.run(_rank, (kb * 1024, shares, a.repeats, a.calls, variants))[0]
            for what in ("", "@cpu"):
                cells = []
                for v in variants[1:]:
                    ratios = sorted(t[v + what] / t["limit" + what] for t in res)
                    lo, mid, hi = ratios[0], statistics.median(ratios), ratios[-1]
                    cells.append(f"{lo:.2f}-{mid:.2f}-{hi:.2f}")
                limit_ms = statistics.median(t["limit" + what] for t in res) * 1e3
                label = f"{kb} KiB" + (" (CPU, all ranks)" if what else "")
                print(f"| {label} | " + " | ".join(cells) + f" | {limit_ms:.2f} |", flush=True)
        print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

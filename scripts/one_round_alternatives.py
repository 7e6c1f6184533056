"""Measure the designs for a validated sizes-unknown gather above 128 KiB per rank.

Where it sits: a design experiment beside the bench (``python -m vargather bench``),
not part of the package. On a real gloo world (``vargather.testing.get_pool``), per
total size, it times in the same repeats, each repeat a burst of ``--calls`` calls per
variant in a rotated order, the slowest rank's time:

* ``limit``: one equal ``all_gather_single`` of the same total bytes;
* ``two-rounds``: the header round, then the payload's transport (vargather before the
  wide round: the wide round switched off);
* ``padded-one``: the gather round stretched past 128 KiB: one equal all_gather padded
  to the group's one capacity (``bucket`` of the largest rank's payload);
* ``wide``: the wide round: W broadcasts, each rank's slot its own capacity.

It prints, per size, each variant's ratio to the limit of the same repeat as
min / median / max over the repeats. Run: ``python scripts/one_round_alternatives.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather import _comm, _fused
from vargather.testing import RankContext, RankPool

VARIANTS = ("limit", "two-rounds", "padded-one", "wide")
_HUGE = 1 << 62


def _set(variant: str) -> None:
    """Module switches for ``variant`` (read by ``_fused`` at call time), state reset."""
    _fused.WIDE_MIN_BYTES = _HUGE if variant in ("two-rounds", "padded-one") else 128 * 1024  # type: ignore[misc]  # an experiment's switch
    _fused.FUSED_MAX_BYTES = _HUGE if variant == "padded-one" else 128 * 1024  # type: ignore[misc]  # same
    fresh = _fused.FusedState()
    for kind in ("single", "coalesced"):
        _fused.replace_state(None, kind, **fresh.__dict__)  # type: ignore[arg-type]  # a fresh state's fields


def _rank(ctx: RankContext, job: tuple[int, tuple[float, ...], int, int]) -> list[dict[str, float]]:
    total, shares, repeats, calls = job
    torch.set_num_threads(1)
    w, r = ctx.world_size, ctx.rank
    cols = 64
    rows_total = total // (4 * cols)
    rows = [int(rows_total * s) for s in shares]
    x = torch.arange(rows[r] * cols, dtype=torch.float32).reshape(rows[r], cols) + r
    eq = torch.zeros(total // 4 // w, dtype=torch.float32)
    out = torch.empty(eq.numel() * w)
    expected_rows = sum(rows)
    found: list[dict[str, float]] = []
    for rep in range(repeats):
        times: dict[str, float] = {}
        order = VARIANTS[rep % len(VARIANTS) :] + VARIANTS[: rep % len(VARIANTS)]
        for v in order:
            if v != "limit":
                _set(v)
                for _ in range(3):  # warm: the state learns the capacities
                    got = vargather.all_gather_v(x)
                    assert got.shape[0] == expected_rows
            dist.barrier()
            before = _comm.collectives_issued()
            t0 = time.perf_counter()
            for _ in range(calls):
                if v == "limit":
                    dist.all_gather_into_tensor(out, eq)
                else:
                    vargather.all_gather_v(x)
            dt = torch.tensor([(time.perf_counter() - t0) / calls])
            issued = _comm.collectives_issued() - before
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[v] = float(dt)
            times[v + "#collectives"] = issued / calls if v != "limit" else 1.0
        found.append(times)
    _set("wide")
    return found


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes-kb", default="256,512,1024,4096,16384")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--profile", default="mild", choices=("even", "mild"))
    a = p.parse_args()
    w = a.ranks
    weights = [1.0] * w if a.profile == "even" else [1 + 0.25 * i for i in range(w)]
    shares = tuple(x / sum(weights) for x in weights)
    with RankPool(w, collective_timeout=300.0, call_timeout=1800.0) as pool:
        print(f"{w} ranks, {a.profile}, ratio to the limit min/median/max over {a.repeats} repeats")
        print("| total | " + " | ".join(VARIANTS[1:]) + " | limit ms |")
        print("|---|" + "---|" * len(VARIANTS))
        for kb in (int(s) for s in a.sizes_kb.split(",")):
            res: Any = pool.run(_rank, (kb * 1024, shares, a.repeats, a.calls))[0]
            cells = []
            for v in VARIANTS[1:]:
                ratios = sorted(t[v] / t["limit"] for t in res)
                coll = res[-1][v + "#collectives"]
                cells.append(
                    f"{ratios[0]:.2f}-{statistics.median(ratios):.2f}-{ratios[-1]:.2f} ({coll:g} coll.)"
                )
            limit_ms = statistics.median(t["limit"] for t in res) * 1e3
            print(f"| {kb} KB | " + " | ".join(cells) + f" | {limit_ms:.2f} |")


if __name__ == "__main__":
    main()

"""How many multi-rank examples per second the property suite runs, per world size.

A multi-rank example is one ``GatherCase`` drawn by Hypothesis, run on every rank of a
gloo world from ``vargather.testing`` and judged against the oracle: exactly what
``tests/test_properties.py`` does (the same properties of the kit's catalogue:
strategy, rank-side runner, judge). For each world size the script warms the pool, then
runs one property (``one-rank`` for W=1, ``gradient`` otherwise: forward and backward)
for ``--examples`` Hypothesis examples (batches of up to ``--batch`` cases, derandomized)
and times it. It prints the rate per world size, their mean, and the overall rate
(every case over all the time, the stricter figure); nothing is asserted.

    python scripts/suite_rate.py                 # W = 1..4, 100 batches each
    python scripts/suite_rate.py --world-sizes 2,4 --examples 100 --json rate.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence


def _measure(world: int, examples: int, batch: int, transport: str) -> tuple[int, int, float]:
    """(batches, cases, seconds) for one property on a ``world``-rank world."""
    from hypothesis import HealthCheck, given, settings

    from vargather.testing import GatherCase, Implementation, catalogue, get_pool
    from vargather.testing.runner import check_cases, example_counts

    impl = Implementation(None, transports=(transport,), name="vargather")
    props = {p.id: p for p in catalogue(impl)}
    prop = props["one-rank" if world == 1 else "gradient"]
    # Outside the timing: start the world, and pay this process's one-time costs (the
    # oracle's first autograd call imports torch's symbolic-shape machinery).
    get_pool(world).run_many(_noop, [None])
    check_cases([GatherCase(shapes=((1, 2),) * world, dim=0, dtype="float32")], impl)
    batches = 0

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        # Generation time includes nothing slow here, but a loaded machine can trip it.
        suppress_health_check=(HealthCheck.too_slow,),
    )
    @given(prop.strategy((world,), batch=batch))
    def run(cases: list[GatherCase]) -> None:
        nonlocal batches
        batches += 1
        prop.check(cases)

    label = impl.label
    before = example_counts().get((label, f"W={world}"), 0)
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    cases = example_counts().get((label, f"W={world}"), 0) - before
    return batches, cases, seconds


def _noop(ctx: object, payload: object) -> None:
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--world-sizes", default="1,2,3,4", help="comma-separated (default 1,2,3,4)"
    )
    parser.add_argument(
        "--examples", type=int, default=100, help="Hypothesis examples per world size"
    )
    parser.add_argument("--batch", type=int, default=8, help="most cases per example (batch)")
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.world_sizes.split(",")]

    from vargather.testing import close_all_pools

    rows = []
    try:
        for w in worlds:
            batches, cases, seconds = _measure(w, args.examples, args.batch, args.transport)
            rows.append({"world_size": w, "batches": batches, "cases": cases, "seconds": seconds})
            print(
                f"W={w}: {cases} multi-rank examples in {batches} batches, {seconds:.2f} s: "
                f"{cases / seconds:.1f} examples/s",
                flush=True,
            )
    finally:
        close_all_pools()
    mean_rate = sum(r["cases"] / r["seconds"] for r in rows) / len(rows)
    overall = sum(r["cases"] for r in rows) / sum(r["seconds"] for r in rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"mean of the per-world rates: {mean_rate:.1f} examples/s; overall (all cases / all "
        f"time): {overall:.1f} examples/s; {os.cpu_count()} CPUs, load average {load:.1f}, "
        f"Python {platform.python_version()}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows": rows, "mean_rate": mean_rate, "overall_rate": overall, "load": load},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

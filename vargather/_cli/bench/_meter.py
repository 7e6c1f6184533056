"""Timing and memory metering of the bench, on the rank side.

Where it sits: below the rank programs (``_ranks``), above torch.distributed: rotated,
barrier-aligned repeats (``_measure``) or bursts (``_measure_bursts``), the slowest rank's
time, per-repeat ratios to the limit with their quartiles and range (``_summarize``), and
the peak resident growth of one call (``_peak_meter``, ``_measure_memory``).
"""

from __future__ import annotations

import contextlib
import gc
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch

    _State: TypeAlias = tuple[torch.Tensor, torch.Tensor] | None
    """A variant's untimed state: the backward's ``(x, out)``, nothing for the others."""
from ._config import FLOOR_VARIANT, BenchConfig
from ._variants import _Burst, _Variant

# --- memory --------------------------------------------------------------------------------------


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _peak_meter() -> Iterator[list[int | None]]:
    """Yields a one-element list that holds, after the block, the peak resident growth
    (bytes) during the block, or ``None`` when the kernel cannot say."""
    result: list[int | None] = [None]
    gc.collect()
    ok = _reset_peak()
    base = _status_kb("VmRSS")
    try:
        yield result
    finally:
        peak = _status_kb("VmHWM")
        if ok and base is not None and peak is not None:
            result[0] = max(0, peak - base) * 1024


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _all_true(flag: bool) -> bool:
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _largest(value: int | None) -> int | None:
    import torch
    import torch.distributed as dist

    t = torch.tensor([-1 if value is None else value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    if int(t.item()) < 0:  # some rank could not measure
        return None
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _measure(
    variants: Sequence[_Variant], cfg: BenchConfig, repeats: int
) -> dict[str, dict[str, Any]]:
    """Warm up and check, time ``repeats`` rounds (rotated order), check again."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {
        v.name: {"times_s": [], "verified": True} for v in variants
    }
    for v in variants:
        for _ in range(cfg.warmup):
            ok = v.check(v.run(v.prepare()))
            results[v.name]["verified"] &= _all_true(ok)
    for k in range(repeats):
        order = list(variants[k % len(variants) :]) + list(variants[: k % len(variants)])
        for v in order:
            state = v.prepare()
            dist.barrier()
            t0 = time.perf_counter()
            result = v.run(state)
            elapsed = time.perf_counter() - t0
            results[v.name]["times_s"].append(_slowest(elapsed))
            if k == repeats - 1:
                results[v.name]["verified"] &= _all_true(v.check(result))
            del result, state
    _summarize(results)
    return results


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``values``' median, quartiles (inclusive method; both the median for one value)
    and range: how a ratio spreads over the repeats."""
    ordered = sorted(values)
    median = statistics.median(ordered)
    q1, q3 = (
        statistics.quantiles(ordered, n=4, method="inclusive")[::2]
        if len(ordered) >= 2
        else (median, median)
    )
    return {
        "median": median,
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def _summarize(results: dict[str, dict[str, Any]]) -> None:
    """Ratios to the limit repeat by repeat, their median and quartiles, median ms; the
    same against the floor (``floor_*``: ``FLOOR_VARIANT``, the direct sends) where the
    part measured it."""
    limit_times = results["limit"]["times_s"]
    floor = results.get(FLOOR_VARIANT)
    for entry in results.values():
        ratios = [t / lim for t, lim in zip(entry["times_s"], limit_times, strict=True)]
        entry["ratios"] = ratios
        entry["median_ratio"] = statistics.median(ratios)
        if len(ratios) >= 2:
            q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
            entry["quartile_ratios"] = [q1, q3]
        entry["range_ratios"] = [min(ratios), max(ratios)]
        entry["median_ms"] = statistics.median(entry["times_s"]) * 1e3
        if floor is not None:
            below = [t / f for t, f in zip(entry["times_s"], floor["times_s"], strict=True)]
            entry["floor_ratios"] = below
            entry["floor_median_ratio"] = statistics.median(below)
            if len(below) >= 2:
                q1, _, q3 = statistics.quantiles(below, n=4, method="inclusive")
                entry["floor_quartile_ratios"] = [q1, q3]
        if entry.get("cpu_s"):
            entry["median_cpu_ms"] = statistics.median(entry["cpu_s"]) * 1e3


def _measure_memory(variants: Sequence[_Variant]) -> dict[str, dict[str, Any]]:
    """The memory pass: per variant one call unmetered (what a process pays once, such
    as torch's own first ``backward()``, which imports ``torch.fx``'s symbolic shapes
    and sympy: about 40 MB resident), then one checked call under the peak meter."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {}
    for v in variants:
        warm = v.prepare()
        dist.barrier()
        v.run(warm)  # the warm-up: its result is dropped at once
        del warm
        state = v.prepare()
        dist.barrier()
        with _peak_meter() as meter:
            result = v.run(state)
        ok = v.check(result)
        del result, state
        results[v.name] = {"peak_extra_bytes": _largest(meter[0]), "verified": _all_true(ok)}
    return results


# --- the rank side: small payloads and coalesced gathers, in bursts ----------------------


def _measure_bursts(
    variants: Sequence[_Burst], repeats: int, calls: int, warmup: int
) -> dict[str, dict[str, Any]]:
    """Warm up (every call checked), then ``repeats`` rounds in a rotated order; per
    round and variant one untimed call, a barrier and ``calls`` timed calls, the last
    one checked in the last round. Besides the wall time, the process CPU time of the
    burst (every thread of the rank, gloo's included), the largest over ranks: what the
    call costs the machine, far less sensitive to its load than the wall time."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {
        v.name: {"times_s": [], "cpu_s": [], "verified": True} for v in variants
    }
    counter = dict.fromkeys(results, 0)

    def call(v: _Burst) -> tuple[int, Any]:
        i = counter[v.name]
        counter[v.name] = i + 1
        return i, v.call(i)

    for v in variants:
        for _ in range(warmup):
            i, result = call(v)
            results[v.name]["verified"] &= _all_true(v.check(i, result))
    for k in range(repeats):
        order = list(variants[k % len(variants) :]) + list(variants[: k % len(variants)])
        for v in order:
            call(v)  # steady state: whatever the previous burst left, one call first
            dist.barrier()
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(calls):
                i, result = call(v)
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - c0
            results[v.name]["times_s"].append(_slowest(elapsed / calls))
            results[v.name]["cpu_s"].append(_slowest(cpu / calls))
            if k == repeats - 1:
                results[v.name]["verified"] &= _all_true(v.check(i, result))
    _summarize(results)
    return results

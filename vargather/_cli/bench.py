"""``python -m vargather bench``: time vargather against the seed and torch's collectives.

Where it sits: the command-line layer, on top of the library and the testing kit; it
measures the pipeline. It starts local gloo worlds per world size through the kit's
rank pool (``vargather.testing.RankPool``: ``FileStore`` rendezvous in a temporary
directory, no ports; one intra-op thread per rank) and runs one cell per pool call.
Three parts, each optional (``--parts``):

large (1 MB to 64 MB, per size profile), forward
    ``limit``: ``all_gather_single`` (``all_gather_into_tensor``) of equal shards moving
    the same total bytes, the practical limit every ratio is relative to;
    ``vargather:<transport>`` for ``auto`` and each transport gloo can run, and
    ``vargather:auto+sizes`` (sizes passed, ``validate=False``: no metadata exchange);
    ``seed``: the seed ``distributed.py``'s algorithm, as ``vargather.testing.seed``
    re-implements it (a size all_gather, pad to the max, list all_gather, ``cat``,
    mask, ``index_select``);
    ``all_gather_object``: pickle every shard to every rank, then ``cat``.
large, backward
    ``limit``: ``reduce_scatter_single`` (``reduce_scatter_tensor``) of equal blocks of
    the same bytes; ``vargather:<transport>`` under ``grad="sum"``; ``all_reduce``:
    the naive exact backward (all-reduce the whole gradient, keep one block). The
    seed and ``all_gather_object`` have no summing backward (the seed's is the
    ``local`` contract, which communicates nothing), so they have no backward row.
small (1 KB to 1 MB gathered in total, latency-bound), forward, steady state
    ``limit`` as above (1-d float32 shards); ``vargather:auto`` (validated, the same
    sizes every call); ``vargather:auto~changing`` (validated, the sizes change every
    call: one rank ``+step``, the next ``-step``, ``step`` about 5% of a share, the
    total fixed); ``vargather:auto+sizes``; ``vargather:forced`` (validated, the
    transport ``auto`` would pick for the payload forced by name, which keeps the payload
    out of a fused round: the metadata round, then the payload's); ``seed``.
coalesced (the same totals), forward, steady state
    three tensors of different dtypes per rank (int64 ids, float32 embeddings of
    ``COALESCED_DIM`` columns, a bool mask; the same ragged row count): ``limit``, one
    equal all_gather of their total bytes (uint8); ``coalesced``:
    ``vargather.all_gather_v_coalesced``; ``coalesced+sizes`` (``validate=False``);
    ``separate``: three validated ``all_gather_v`` calls. Skipped, with a note, when
    the installed vargather has no ``all_gather_v_coalesced``.

Timing, large cells: each repeat times every variant once, in a rotated order, each
after a barrier; a variant's time is the slowest rank's. Its ratio is its time over the
limit's time in the same repeat, and the tables report the median ratio over the
repeats. Small and coalesced cells: each repeat runs every variant as a *burst*, in a
rotated order: one untimed call, a barrier, then ``--calls`` back-to-back timed calls; a
variant's time is the slowest rank's burst time over ``--calls``, its ratio is taken
against the limit's burst in the same repeat, and the median over (many) repeats is
reported, with the quartiles in the JSON. Absolute times are only in the JSON, except
the small tables' limit column.

Time is measured with the default malloc settings, as users run: the timing worlds
get no allocator environment at all.

Every variant is checked, not just timed: the output of its warm-up calls and of its
last timed call is compared bit for bit with ``cat`` of the shards (regenerated block
by block from their deterministic formula), and every backward's input gradient with
``Σ_j g_j[block]``. Shard and gradient values are small integers, so every sum is exact
in any order. A variant that fails its check is reported as such and fails the run.

Peak extra memory (large cells): a separate pass, after the timed one, in a world of
its own whose ranks run with ``MALLOC_MMAP_THRESHOLD_=65536`` so glibc returns freed
buffers to the system at once instead of recycling them invisibly (that setting slows
the equal-size baseline more than vargather, so no time is ever taken under it). One
untimed call per variant, checked, during which each rank's peak resident set size is
tracked by the kernel (``VmHWM`` in ``/proc/self/status``, reset through
``/proc/self/clear_refs``); the peak minus the resident size just before the call, the
largest over ranks, divided by the output's bytes. It counts everything the call
touches, the output itself and buffers inside torch.distributed and gloo included, and
nothing it only reserves. Linux only; elsewhere the memory columns are empty.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from .report import Progress

if TYPE_CHECKING:
    import torch

    from vargather.testing import RankContext

    _State: TypeAlias = tuple[torch.Tensor, torch.Tensor] | None
    """A variant's untimed state: the backward's ``(x, out)``, nothing for the others."""

__all__ = [
    "PROFILES",
    "SCHEMA",
    "BenchConfig",
    "floor_ratio",
    "main",
    "profile_shares",
    "split_rows",
]

SCHEMA: Final = "vargather-bench/2"
PROFILES: Final = ("even", "mild", "heavy", "empty")
PARTS: Final = ("large", "small", "coalesced")
ROW_ELEMENTS: Final = 256  # float32 elements per row: 1 KiB rows
SMALL_SIZES_KB: Final = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0)
COALESCED_DIM: Final = 16
"""Columns of the coalesced case's float32 embeddings (a row: 8 + 64 + 1 bytes)."""
_MALLOC_ENV: Final = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""The memory pass's allocator setting; never set where time is measured."""
KNOWN_SIZES_VARIANT: Final = "vargather:auto+sizes"
"""``auto`` with the sizes passed and ``validate=False``: no metadata exchange."""


# --- profiles -------------------------------------------------------------------------------


def profile_shares(profile: str, world_size: int) -> tuple[float, ...]:
    """Each rank's share of the gathered rows (they sum to 1).

    ``even``: equal; ``mild``: 1 to 1.75 in equal steps (1, 1.25, 1.5, 1.75 at 4 ranks);
    ``heavy``: one rank 20x every other (.87/.043/.043/.043 at 4 ranks); ``empty``:
    every other rank has nothing (1, 0, 1, 0).
    """
    w = world_size
    if profile == "even":
        weights = [1.0] * w
    elif profile == "mild":
        weights = [1.0 + 0.75 * r / max(w - 1, 1) for r in range(w)]
    elif profile == "heavy":
        weights = [1.0] + [0.05] * (w - 1)
    elif profile == "empty":
        weights = [1.0 if r % 2 == 0 else 0.0 for r in range(w)]
    else:
        raise ValueError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    total = sum(weights)
    return tuple(x / total for x in weights)


def split_rows(total_rows: int, shares: Sequence[float]) -> list[int]:
    """``total_rows`` split by ``shares``, largest remainder first; sums to ``total_rows``."""
    exact = [total_rows * s for s in shares]
    rows = [math.floor(e) for e in exact]
    order = sorted(range(len(shares)), key=lambda r: (rows[r] - exact[r], r))
    for r in order[: total_rows - sum(rows)]:
        rows[r] += 1
    return rows


def floor_ratio(shares: Sequence[float]) -> float:
    """The least ratio to the limit a ragged gather can reach: the rank with the
    smallest share must receive ``1 - s_min`` of the bytes, the limit's ranks
    ``1 - 1/W``."""
    w = len(shares)
    return (1.0 - min(shares)) / (1.0 - 1.0 / w) if w > 1 else 1.0


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    ranks: tuple[int, ...] = (2, 4)
    sizes_mb: tuple[float, ...] = (1.0, 4.0, 16.0, 41.0, 64.0)
    profiles: tuple[str, ...] = PROFILES
    repeats: int = 7
    warmup: int = 1
    memory: bool = True
    timeout_s: float = 300.0
    variants: tuple[str, ...] | None = None  # None: all
    parts: tuple[str, ...] = PARTS
    small_kb: tuple[float, ...] = SMALL_SIZES_KB
    small_profile: str = "even"
    small_repeats: int = 31
    calls: int = 20


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vargather bench",
        description=(
            "Time vargather's ragged all_gather (forward and backward) against the seed's "
            "algorithm, all_gather_object and the equal-size collectives of the same "
            "bytes, on a local gloo world, with default malloc settings: large payloads "
            "per size profile, a small-payload sweep in steady state, and several tensors "
            "gathered at once. Reports median ratios to the equal-size limit and (in a "
            "separate pass) peak extra memory; every variant's result is checked."
        ),
    )
    p.add_argument("--ranks", type=_csv(int), default=None, help="world sizes (default 2,4)")
    p.add_argument(
        "--parts",
        type=_csv(str),
        default=None,
        help=f"which parts to run (default {','.join(PARTS)})",
    )
    p.add_argument(
        "--sizes",
        type=_csv(float),
        default=None,
        help="large part: gathered payloads in MB (default 1,4,16,41,64)",
    )
    p.add_argument(
        "--profiles",
        type=_csv(str),
        default=None,
        help=f"large part: size profiles (default {','.join(PROFILES)})",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="large part: timed repeats (default 7)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed, checked calls per variant first (default 1; small parts: at least W)",
    )
    p.add_argument(
        "--small-sizes",
        type=_csv(float),
        default=None,
        help="small and coalesced parts: gathered totals in KiB (default 1,4,16,64,256,1024)",
    )
    p.add_argument(
        "--small-profile",
        default=None,
        help="small part: the size profile of the fixed sizes (default even)",
    )
    p.add_argument(
        "--small-repeats",
        type=int,
        default=None,
        help="small and coalesced parts: timed bursts per variant (default 31)",
    )
    p.add_argument(
        "--calls",
        type=int,
        default=None,
        help="small and coalesced parts: timed calls per burst (default 20)",
    )
    p.add_argument(
        "--variants",
        type=_csv(str),
        default=None,
        help="only these variants (the limit always runs), e.g. seed,vargather:auto",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="collective timeout in seconds (300)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of about a minute: 2 ranks, 1 MB, even and heavy, 3 repeats; "
        "4 and 64 KiB, 5 bursts of 10 calls (explicit options still apply)",
    )
    p.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the tables as markdown")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    return p


def _config(args: argparse.Namespace) -> BenchConfig:
    quick = bool(args.quick)
    cfg = BenchConfig(
        ranks=args.ranks or ((2,) if quick else (2, 4)),
        sizes_mb=args.sizes or ((1.0,) if quick else BenchConfig.sizes_mb),
        profiles=args.profiles or (("even", "heavy") if quick else PROFILES),
        repeats=args.repeats if args.repeats is not None else (3 if quick else 7),
        warmup=args.warmup if args.warmup is not None else 1,
        memory=not args.no_memory,
        timeout_s=args.timeout,
        variants=args.variants,
        parts=args.parts or PARTS,
        small_kb=args.small_sizes or ((4.0, 64.0) if quick else SMALL_SIZES_KB),
        small_profile=args.small_profile or "even",
        small_repeats=(
            args.small_repeats if args.small_repeats is not None else (5 if quick else 31)
        ),
        calls=args.calls if args.calls is not None else (10 if quick else 20),
    )
    for w in cfg.ranks:
        if w < 2:
            raise ValueError(f"--ranks: every world size must be >= 2, got {w}")
    unknown_parts = [p for p in cfg.parts if p not in PARTS]
    if unknown_parts:
        raise ValueError(f"--parts: unknown {unknown_parts}; expected some of {', '.join(PARTS)}")
    for mb in cfg.sizes_mb:
        if not mb > 0:
            raise ValueError(f"--sizes: payloads must be > 0 MB, got {mb}")
    for kb in cfg.small_kb:
        if not kb > 0:
            raise ValueError(f"--small-sizes: totals must be > 0 KiB, got {kb}")
    for prof in (*cfg.profiles, cfg.small_profile):
        profile_shares(prof, 2)  # raises on an unknown name
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.small_repeats < 1 or cfg.calls < 1:
        raise ValueError("--repeats, --small-repeats and --calls must be >= 1 and --warmup >= 0")
    if cfg.variants is not None:
        known = set(_forward_names()) | set(_backward_names()) | set(SMALL_NAMES)
        known |= set(COALESCED_NAMES)
        unknown = [v for v in cfg.variants if v not in known]
        if unknown:
            raise ValueError(
                f"--variants: unknown {unknown}; expected some of {', '.join(sorted(known))}"
            )
    return cfg


def forward_transports() -> tuple[str, ...]:
    """The transports timed: every name of ``vargather.TRANSPORT_NAMES`` that runs on
    gloo (asked of vargather, so a new transport is timed without editing this)."""
    from vargather.testing.runner import gloo_transports

    return gloo_transports()[0]


def _forward_names() -> list[str]:
    return [
        "limit",
        *(f"vargather:{t}" for t in forward_transports()),
        KNOWN_SIZES_VARIANT,
        "seed",
        "all_gather_object",
    ]


def _backward_names() -> list[str]:
    return ["limit", *(f"vargather:{t}" for t in forward_transports()), "all_reduce"]


CHANGING_VARIANT: Final = "vargather:auto~changing"
FORCED_VARIANT: Final = "vargather:forced"
SMALL_NAMES: Final = (
    "limit",
    "vargather:auto",
    CHANGING_VARIANT,
    KNOWN_SIZES_VARIANT,
    FORCED_VARIANT,
    "seed",
)
"""The small part's variants, in their order."""
COALESCED_NAMES: Final = ("limit", "coalesced", "coalesced+sizes", "separate")
"""The coalesced part's variants, in their order."""


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


# --- the rank side ---------------------------------------------------------------------------------


def _pattern(start: int, count: int, a: int, b: int, modulus: int) -> torch.Tensor:
    """``(i * a + b) % modulus - modulus // 2`` for ``i`` in ``[start, start + count)``,
    as float32: small integers, so sums are exact."""
    import torch

    i = torch.arange(start, start + count, dtype=torch.int64)
    return ((i * a + b) % modulus - modulus // 2).to(torch.float32)


def _shard(rank: int, rows: int) -> torch.Tensor:
    return _pattern(0, rows * ROW_ELEMENTS, 7, 13 * rank, 23).view(rows, ROW_ELEMENTS)


def _upstream_rows(rank: int, first_row: int, rows: int) -> torch.Tensor:
    """Rows ``[first_row, first_row + rows)`` of rank ``rank``'s upstream gradient."""
    start = first_row * ROW_ELEMENTS
    return _pattern(start, rows * ROW_ELEMENTS, 5, 11 * rank, 19).view(rows, ROW_ELEMENTS)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    return bool(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


@dataclass
class _Cell:
    """One (world size, payload, profile) on one rank."""

    rank: int
    world_size: int
    sizes: list[int]
    offsets: list[int]
    total: int
    eq_rows: int  # rows per rank of the equal-size limit

    @property
    def rows(self) -> int:
        return self.sizes[self.rank]


def _check_output(cell: _Cell, out: torch.Tensor) -> bool:
    if tuple(out.shape) != (cell.total, ROW_ELEMENTS):
        return False
    for r in range(cell.world_size):
        o, n = cell.offsets[r], cell.sizes[r]
        if not _same(out[o : o + n], _shard(r, n)):
            return False
    return True


def _expected_grad(cell: _Cell, first_row: int, rows: int) -> torch.Tensor:
    total = _upstream_rows(0, first_row, rows)
    for j in range(1, cell.world_size):
        total = total + _upstream_rows(j, first_row, rows)
    return total


@dataclass
class _Variant:
    """How to run, check and measure one variant on a rank.

    ``prepare()`` builds the untimed state (fresh each call); ``run(state)`` is the timed
    part and returns what ``check(result)`` verifies.
    """

    name: str
    prepare: Callable[[], _State]
    run: Callable[[_State], torch.Tensor]
    check: Callable[[torch.Tensor], bool]


def _forward_variants(cell: _Cell) -> list[_Variant]:
    import torch
    import torch.distributed as dist

    import vargather
    from vargather.testing.seed import all_gather_variable_dim

    x = _shard(cell.rank, cell.rows)
    eq_x = _shard(cell.rank, cell.eq_rows)
    eq_cell = _Cell(
        cell.rank,
        cell.world_size,
        [cell.eq_rows] * cell.world_size,
        [r * cell.eq_rows for r in range(cell.world_size)],
        cell.eq_rows * cell.world_size,
        cell.eq_rows,
    )
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def limit(_: _State) -> torch.Tensor:
        out = eq_x.new_empty((eq_cell.total, ROW_ELEMENTS))
        gather_single(out, eq_x)
        return out

    def vargather_run(transport: str) -> Callable[[_State], torch.Tensor]:
        def run(_: _State) -> torch.Tensor:
            return vargather.all_gather_v(x, 0, transport=transport)  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES

        return run

    def vargather_known(_: _State) -> torch.Tensor:
        return vargather.all_gather_v(x, 0, sizes=cell.sizes, validate=False)

    def seed(_: _State) -> torch.Tensor:
        return all_gather_variable_dim(x, 0)[0]

    def gather_object(_: _State) -> torch.Tensor:
        objects: list[torch.Tensor | None] = [None] * dist.get_world_size()
        dist.all_gather_object(objects, x)
        return torch.cat([o for o in objects if o is not None], dim=0)

    variants = [_Variant("limit", lambda: None, limit, lambda out: _check_output(eq_cell, out))]
    variants += [
        _Variant(
            f"vargather:{t}",
            lambda: None,
            vargather_run(t),
            lambda out: _check_output(cell, out),
        )
        for t in forward_transports()
    ]
    variants.append(
        _Variant(
            KNOWN_SIZES_VARIANT,
            lambda: None,
            vargather_known,
            lambda out: _check_output(cell, out),
        )
    )
    variants.append(_Variant("seed", lambda: None, seed, lambda out: _check_output(cell, out)))
    variants.append(
        _Variant(
            "all_gather_object", lambda: None, gather_object, lambda out: _check_output(cell, out)
        )
    )
    return variants


def _backward_variants(cell: _Cell) -> list[_Variant]:
    import torch
    import torch.distributed as dist

    import vargather

    reduce_scatter_single = (
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    )
    upstream = _upstream_rows(cell.rank, 0, cell.total)
    eq_upstream = _upstream_rows(cell.rank, 0, cell.eq_rows * cell.world_size)
    own = slice(cell.offsets[cell.rank], cell.offsets[cell.rank] + cell.rows)
    want = _expected_grad(cell, cell.offsets[cell.rank], cell.rows)
    eq_want = _expected_grad(cell, cell.rank * cell.eq_rows, cell.eq_rows)

    def limit(_: _State) -> torch.Tensor:
        out = eq_upstream.new_empty((cell.eq_rows, ROW_ELEMENTS))
        reduce_scatter_single(out, eq_upstream)
        return out

    def prepare(transport: str) -> Callable[[], _State]:
        def make() -> _State:
            x = _shard(cell.rank, cell.rows).requires_grad_(True)
            out = vargather.all_gather_v(x, 0, transport=transport)  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES
            return x, out

        return make

    def backward(state: _State) -> torch.Tensor:
        assert state is not None  # made by prepare()
        x, out = state
        torch.autograd.backward(out, upstream)
        assert x.grad is not None  # x requires grad and the gather is differentiable
        return x.grad

    def all_reduce(_: _State) -> torch.Tensor:
        full = upstream.clone()
        dist.all_reduce(full)
        return full[own].clone()

    variants = [_Variant("limit", lambda: None, limit, lambda g: _same(g, eq_want))]
    variants += [
        _Variant(f"vargather:{t}", prepare(t), backward, lambda g: _same(g, want))
        for t in forward_transports()
    ]
    variants.append(_Variant("all_reduce", lambda: None, all_reduce, lambda g: _same(g, want)))
    return variants


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


def _measure(variants: Sequence[_Variant], cfg: BenchConfig) -> dict[str, dict[str, Any]]:
    """Warm up and check, time (rotated order), check again."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {
        v.name: {"times_s": [], "verified": True} for v in variants
    }
    for v in variants:
        for _ in range(cfg.warmup):
            ok = v.check(v.run(v.prepare()))
            results[v.name]["verified"] &= _all_true(ok)
    for k in range(cfg.repeats):
        order = list(variants[k % len(variants) :]) + list(variants[: k % len(variants)])
        for v in order:
            state = v.prepare()
            dist.barrier()
            t0 = time.perf_counter()
            result = v.run(state)
            elapsed = time.perf_counter() - t0
            results[v.name]["times_s"].append(_slowest(elapsed))
            if k == cfg.repeats - 1:
                results[v.name]["verified"] &= _all_true(v.check(result))
            del result, state
    _summarize(results)
    return results


def _summarize(results: dict[str, dict[str, Any]]) -> None:
    """Ratios to the limit repeat by repeat, their median and quartiles, median ms."""
    limit_times = results["limit"]["times_s"]
    for entry in results.values():
        ratios = [t / lim for t, lim in zip(entry["times_s"], limit_times, strict=True)]
        entry["ratios"] = ratios
        entry["median_ratio"] = statistics.median(ratios)
        if len(ratios) >= 2:
            q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
            entry["quartile_ratios"] = [q1, q3]
        entry["median_ms"] = statistics.median(entry["times_s"]) * 1e3
        if entry.get("cpu_s"):
            entry["median_cpu_ms"] = statistics.median(entry["cpu_s"]) * 1e3


def _measure_memory(variants: Sequence[_Variant]) -> dict[str, dict[str, Any]]:
    """The memory pass: per variant one checked call under the peak meter."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {}
    for v in variants:
        state = v.prepare()
        dist.barrier()
        with _peak_meter() as meter:
            result = v.run(state)
        ok = v.check(result)
        del result, state
        results[v.name] = {"peak_extra_bytes": _largest(meter[0]), "verified": _all_true(ok)}
    return results


def _selected(variants: list[_Variant], cfg: BenchConfig) -> list[_Variant]:
    if cfg.variants is None:
        return variants
    return [v for v in variants if v.name == "limit" or v.name in cfg.variants]


def _rank_cell(ctx: RankContext, job: tuple[BenchConfig, float, str, str]) -> dict[str, Any] | None:
    """Rank function of the large part: measure one (payload, profile) cell on this
    world, its times (``mode="time"``) or its peak memory (``mode="memory"``); rank 0
    returns the cell's record, the others ``None``."""
    import torch

    from vargather import Layout
    from vargather._transport import auto_transport_name

    torch.set_num_threads(1)
    cfg, mb, profile, mode = job
    rank, world_size = ctx.rank, ctx.world_size
    # a multiple of W, so the even profile is exactly even
    total = world_size * max(1, round(mb * 1e6 / (ROW_ELEMENTS * 4 * world_size)))
    shares = profile_shares(profile, world_size)
    sizes = split_rows(total, shares)
    offsets = [sum(sizes[:r]) for r in range(world_size)]
    cell = _Cell(rank, world_size, sizes, offsets, total, total // world_size)
    layout = Layout(
        sizes=tuple(sizes),
        dim=0,
        leading_shape=(),
        trailing_shape=(ROW_ELEMENTS,),
        dtype=torch.float32,
        rank=rank,
        world_size=world_size,
    )
    if mode == "memory":
        forward = _measure_memory(_selected(_forward_variants(cell), cfg))
        backward = _measure_memory(_selected(_backward_variants(cell), cfg))
    else:
        forward = _measure(_selected(_forward_variants(cell), cfg), cfg)
        backward = _measure(_selected(_backward_variants(cell), cfg), cfg)
    if rank != 0:
        return None
    return {
        "world_size": world_size,
        "payload_mb": mb,
        "profile": profile,
        "shares": list(shares),
        "rows": sizes,
        "row_bytes": ROW_ELEMENTS * 4,
        "output_bytes": total * ROW_ELEMENTS * 4,
        "limit_bytes": cell.eq_rows * world_size * ROW_ELEMENTS * 4,
        "floor": floor_ratio(shares),
        "auto_transport": auto_transport_name(layout, "gloo"),
        "malloc_env": malloc_environment(),
        "forward": forward,
        "backward": backward,
    }


# --- the rank side: small payloads and coalesced gathers, in bursts ----------------------


@dataclass
class _Burst:
    """One variant of a small or coalesced cell: ``call(i)`` is its ``i``-th call (the
    index picks the sizes where they change), ``check(i, result)`` verifies it."""

    name: str
    call: Callable[[int], Any]
    check: Callable[[int, Any], bool]


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


def _flat_shard(rank: int, n: int) -> torch.Tensor:
    return _pattern(0, n, 7, 13 * rank, 23)


def _flat_expected(sizes: Sequence[int]) -> torch.Tensor:
    import torch

    return torch.cat([_flat_shard(r, n) for r, n in enumerate(sizes)])


def changing_sizes(base: Sequence[int], step: int, i: int) -> list[int]:
    """The small part's sizes at call ``i``: ``base`` with rank ``i % W`` one ``step``
    larger and rank ``(i + 1) % W`` one ``step`` smaller (never below 0): every call's
    sizes differ from the previous call's, within ``step`` of ``base``, same total."""
    w = len(base)
    sizes = list(base)
    grow, shrink = i % w, (i + 1) % w
    moved = min(step, sizes[shrink])
    sizes[grow] += moved
    sizes[shrink] -= moved
    return sizes


def _rank_small(ctx: RankContext, job: tuple[BenchConfig, float]) -> dict[str, Any] | None:
    """Rank function of the small part: one total (KiB) on this world; rank 0 returns
    the record."""
    import torch
    import torch.distributed as dist

    import vargather
    from vargather import Layout
    from vargather._transport import auto_transport_name
    from vargather.testing.seed import all_gather_variable_dim

    torch.set_num_threads(1)
    cfg, kb = job
    rank, w = ctx.rank, ctx.world_size
    total = w * max(1, round(kb * 1024 / (4 * w)))  # float32 elements, a multiple of W
    shares = profile_shares(cfg.small_profile, w)
    sizes = split_rows(total, shares)
    step = max(1, round(0.05 * total / w))
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    layout = Layout(
        sizes=tuple(sizes),
        dim=0,
        leading_shape=(),
        trailing_shape=(),
        dtype=torch.float32,
        rank=rank,
        world_size=w,
    )
    forced = auto_transport_name(layout, "gloo")
    x = _flat_shard(rank, sizes[rank])
    eq_x = _flat_shard(rank, total // w)
    eq_want = _flat_expected([total // w] * w)
    want = _flat_expected(sizes)
    phases = [changing_sizes(sizes, step, i) for i in range(w)]  # the sizes repeat every W
    phase_x = [_flat_shard(rank, p[rank]) for p in phases]
    phase_want = [_flat_expected(p) for p in phases]

    def limit(_: int) -> torch.Tensor:
        out = eq_x.new_empty((total,))
        gather_single(out, eq_x)
        return out

    def same(expected: torch.Tensor) -> Callable[[int, Any], bool]:
        return lambda _, out: _same(out, expected)

    variants = [
        _Burst("limit", limit, same(eq_want)),
        _Burst("vargather:auto", lambda _: vargather.all_gather_v(x), same(want)),
        _Burst(
            CHANGING_VARIANT,
            lambda i: vargather.all_gather_v(phase_x[i % w]),
            lambda i, out: _same(out, phase_want[i % w]),
        ),
        _Burst(
            KNOWN_SIZES_VARIANT,
            lambda _: vargather.all_gather_v(x, sizes=sizes, validate=False),
            same(want),
        ),
        _Burst(
            FORCED_VARIANT,
            lambda _: vargather.all_gather_v(x, transport=forced),  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES
            same(want),
        ),
        _Burst("seed", lambda _: all_gather_variable_dim(x, 0)[0], same(want)),
    ]
    variants = [v for v in variants if v.name == "limit" or _wanted(v.name, cfg)]
    results = _measure_bursts(variants, cfg.small_repeats, cfg.calls, max(cfg.warmup, w))
    if rank != 0:
        return None
    return {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.small_profile,
        "sizes": sizes,
        "changing_step": step,
        "element_bytes": 4,
        "output_bytes": total * 4,
        "limit_bytes": total * 4,
        "forced_transport": forced,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
        "forward": results,
    }


def _coalesced_shards(rank: int, n: int) -> list[torch.Tensor]:
    """Rank ``rank``'s three tensors of ``n`` rows: int64 ids (high bits set), float32
    embeddings, a bool mask."""
    import torch

    ids = torch.arange(n, dtype=torch.int64) * 7 + ((rank + 1) << 40)
    emb = _pattern(0, n * COALESCED_DIM, 5, 11 * rank, 19).view(n, COALESCED_DIM)
    mask = torch.arange(n, dtype=torch.int64).add(rank) % 3 == 0
    return [ids, emb, mask]


def coalesced_row_bytes() -> int:
    """Bytes of one row of the coalesced case's three tensors together."""
    return 8 + 4 * COALESCED_DIM + 1


def _rank_coalesced(ctx: RankContext, job: tuple[BenchConfig, float]) -> dict[str, Any] | None:
    """Rank function of the coalesced part: one total (KiB) on this world; rank 0 returns
    the record, which says ``skipped`` when this vargather has no
    ``all_gather_v_coalesced`` (every rank sees the same module)."""
    import torch
    import torch.distributed as dist

    import vargather

    torch.set_num_threads(1)
    cfg, kb = job
    rank, w = ctx.rank, ctx.world_size
    row_bytes = coalesced_row_bytes()
    total = w * max(1, round(kb * 1024 / (row_bytes * w)))  # rows, a multiple of W
    sizes = split_rows(total, profile_shares(cfg.small_profile, w))
    record: dict[str, Any] = {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.small_profile,
        "sizes": sizes,
        "row_bytes": row_bytes,
        "dtypes": ["int64", "float32", "bool"],
        "output_bytes": total * row_bytes,
        "limit_bytes": total * row_bytes,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
    }
    coalesced = getattr(vargather, "all_gather_v_coalesced", None)
    if coalesced is None:
        record["skipped"] = (
            f"vargather {vargather.__version__} has no all_gather_v_coalesced: not measured"
        )
        return record if rank == 0 else None
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    mine = _coalesced_shards(rank, sizes[rank])
    every = [_coalesced_shards(r, n) for r, n in enumerate(sizes)]
    want = [torch.cat([shards[k] for shards in every]) for k in range(3)]
    eq_x = torch.zeros(total // w * row_bytes, dtype=torch.uint8)
    eq_x[: min(eq_x.numel(), 251)] = torch.arange(min(eq_x.numel(), 251), dtype=torch.uint8)
    eq_want = eq_x.repeat(w)
    every_sizes = [sizes] * 3

    def limit(_: int) -> torch.Tensor:
        out = eq_x.new_empty((total * row_bytes,))
        gather_single(out, eq_x)
        return out

    def same_list(_: int, outs: Any) -> bool:
        return len(outs) == 3 and all(_same(o, e) for o, e in zip(outs, want, strict=True))

    variants = [
        _Burst("limit", limit, lambda _, out: _same(out, eq_want)),
        _Burst("coalesced", lambda _: coalesced(mine), same_list),
        _Burst(
            "coalesced+sizes",
            lambda _: coalesced(mine, sizes=every_sizes, validate=False),
            same_list,
        ),
        _Burst("separate", lambda _: [vargather.all_gather_v(t) for t in mine], same_list),
    ]
    variants = [v for v in variants if v.name == "limit" or _wanted(v.name, cfg)]
    record["forward"] = _measure_bursts(variants, cfg.small_repeats, cfg.calls, max(cfg.warmup, 1))
    return record if rank == 0 else None


def malloc_environment() -> dict[str, str]:
    """The ``MALLOC_*`` settings this process runs with (recorded by every pass)."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def _wanted(name: str, cfg: BenchConfig) -> bool:
    return cfg.variants is None or name in cfg.variants


# --- the parent side -------------------------------------------------------------------------------


class BenchError(RuntimeError):
    """A rank failed or died; the message carries its traceback."""


_CELL_TIMEOUT: Final = 3600.0
"""Seconds one cell may take on the ranks before the world counts as hung (a hung
collective fails sooner, after ``--timeout``)."""


def cell_count(cfg: BenchConfig) -> int:
    """Pool calls the run makes (the progress total)."""
    large = len(cfg.sizes_mb) * len(cfg.profiles) if "large" in cfg.parts else 0
    small = len(cfg.small_kb) * (("small" in cfg.parts) + ("coalesced" in cfg.parts))
    return len(cfg.ranks) * (small + large * (2 if cfg.memory else 1))


def _merge_memory(cell: dict[str, Any], memory: dict[str, Any] | None) -> None:
    """Fold the memory pass's record into the timed record of the same cell."""
    cell["memory_malloc_env"] = None if memory is None else memory["malloc_env"]
    for direction in ("forward", "backward"):
        for name, entry in cell[direction].items():
            seen = None if memory is None else memory[direction].get(name)
            entry["peak_extra_bytes"] = None if seen is None else seen["peak_extra_bytes"]
            if seen is not None:
                entry["verified"] = bool(entry["verified"] and seen["verified"])


def _pool_calls(
    world_size: int,
    cfg: BenchConfig,
    progress: Progress,
    environment: dict[str, str] | None,
    jobs: Sequence[tuple[str, Callable[[RankContext, Any], dict[str, Any] | None], Any]],
) -> list[dict[str, Any]]:
    """Run ``jobs`` (label, rank function, argument) one pool call each, on a pool of
    their own started with ``environment``; rank 0's records, in order."""
    from vargather.testing import PoolFailure, RankError, RankPool

    records: list[dict[str, Any]] = []
    try:
        with RankPool(
            world_size,
            collective_timeout=cfg.timeout_s,
            call_timeout=_CELL_TIMEOUT + cfg.timeout_s,
            environment=environment,
        ) as pool:
            for label, fn, arg in jobs:
                progress.phase(f"{label}: measuring")
                record = pool.run(fn, arg)[0]
                assert record is not None  # rank 0 returns the cell
                records.append(record)
                progress.advance(f"done: {label}")
    except (PoolFailure, RankError) as err:
        raise BenchError(f"{type(err).__name__}: {err}") from None
    return records


def _run_world(world_size: int, cfg: BenchConfig, progress: Progress) -> dict[str, list[Any]]:
    """Every cell of one world size: the timed cells on a pool with default malloc
    settings, then the memory pass on a pool of its own with ``_MALLOC_ENV``."""
    w = world_size
    jobs: list[tuple[str, Callable[[RankContext, Any], dict[str, Any] | None], Any]] = []
    if "small" in cfg.parts:
        jobs += [(f"W={w} {kb:g} KiB small", _rank_small, (cfg, kb)) for kb in cfg.small_kb]
    if "coalesced" in cfg.parts:
        jobs += [(f"W={w} {kb:g} KiB coalesced", _rank_coalesced, (cfg, kb)) for kb in cfg.small_kb]
    large = [
        (mb, profile) for mb in cfg.sizes_mb for profile in cfg.profiles if "large" in cfg.parts
    ]
    jobs += [
        (f"W={w} {mb:g} MB {profile}", _rank_cell, (cfg, mb, profile, "time"))
        for mb, profile in large
    ]
    timed = _pool_calls(w, cfg, progress, None, jobs) if jobs else []
    out: dict[str, list[Any]] = {"small": [], "coalesced": [], "large": []}
    for (_, fn, _), record in zip(jobs, timed, strict=True):
        part = "small" if fn is _rank_small else "coalesced" if fn is _rank_coalesced else "large"
        out[part].append(record)
    memory: list[dict[str, Any] | None] = [None] * len(large)
    if cfg.memory and large:
        memory = list(
            _pool_calls(
                w,
                cfg,
                progress,
                _MALLOC_ENV,
                [
                    (f"W={w} {mb:g} MB {profile} memory", _rank_cell, (cfg, mb, profile, "memory"))
                    for mb, profile in large
                ],
            )
        )
    for cell, mem in zip(out["large"], memory, strict=True):
        _merge_memory(cell, mem)
    return out


# --- reporting -------------------------------------------------------------------------------------


def _fmt_ratio(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "—"
    mark = "" if entry["verified"] else " WRONG"
    return f"{entry['median_ratio']:.2f}x{mark}"


def _fmt_mem(entry: dict[str, Any] | None, output_bytes: int) -> str:
    if entry is None or entry.get("peak_extra_bytes") is None:
        return "—"
    return f"{entry['peak_extra_bytes'] / output_bytes:.2f}"


def _columns(cells: Sequence[dict[str, Any]], direction: str) -> list[str]:
    names: list[str] = []
    for c in cells:
        for n in c[direction]:
            if n not in names:
                names.append(n)
    return names


def _row_label(c: dict[str, Any]) -> list[str]:
    shares = "/".join(f"{s:.2f}" for s in c["shares"])
    return [str(c["world_size"]), f"{c['payload_mb']:g}", f"{c['profile']} ({shares})"]


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _short(name: str) -> str:
    return name.removeprefix("vargather:")


def _payload(record: dict[str, Any]) -> str:
    if "payload_kb" in record:
        return f"{record['payload_kb']:g} KiB"
    return f"{record['payload_mb']:g} MB"


def _limit_us(record: dict[str, Any]) -> str:
    return f"{record['forward']['limit']['median_ms'] * 1e3:.0f}"


def _small_tables(
    small: Sequence[dict[str, Any]], coalesced: Sequence[dict[str, Any]]
) -> list[str]:
    parts: list[str] = []
    if small:
        cols = _columns(small, "forward")
        head = ["W", "KiB", "sizes", "limit µs/call", *(_short(n) for n in cols)]
        rows = [
            [
                str(c["world_size"]),
                f"{c['payload_kb']:g}",
                "/".join(str(n) for n in c["sizes"]),
                _limit_us(c),
                *(_fmt_ratio(c["forward"].get(n)) for n in cols),
            ]
            for c in small
        ]
        c0 = small[0]
        parts.append(
            "**small payloads**, forward in steady state: median over "
            f"{len(c0['forward']['limit']['times_s'])} bursts of {c0['calls_per_burst']} "
            "calls of the per-burst ratio to one equal-size all_gather of the same bytes "
            "(float32 elements; `auto`: validated, fixed sizes; `auto~changing`: validated, "
            "sizes changing every call by about 5% of a share; `auto+sizes`: "
            "`validate=False`; `forced`: validated, the payload's transport forced, so "
            "metadata and payload travel in two rounds; `seed`: the seed's algorithm)\n\n"
            + _table(head, rows)
        )
    done = [c for c in coalesced if "skipped" not in c]
    cpu_rows = [
        [
            part,
            str(c["world_size"]),
            f"{c['payload_kb']:g}",
            " · ".join(
                f"{_short(n)} {e['median_cpu_ms'] * 1e3:.0f}"
                for n, e in c["forward"].items()
                if "median_cpu_ms" in e
            ),
        ]
        for part, cells in (("small", small), ("coalesced", done))
        for c in cells
    ]
    if cpu_rows:
        cpu_note = (
            "**CPU time per call**, µs: the rank process's CPU time over a burst (every "
            "thread, gloo's included) divided by its calls, largest over ranks, median over "
            "bursts; far less sensitive to the machine's load than the times above\n\n"
        )
        cpu_table = _table(["part", "W", "KiB", "variant µs"], cpu_rows)
    if done:
        cols = _columns(done, "forward")
        head = [
            "W",
            "KiB",
            "rows",
            "limit µs/call",
            *(_short(n) for n in cols),
            "coalesced / separate",
        ]
        rows = []
        for c in done:
            f = c["forward"]
            vs = (
                f"{f['coalesced']['median_ratio'] / f['separate']['median_ratio']:.2f}"
                if "coalesced" in f and "separate" in f
                else "—"
            )
            rows.append(
                [
                    str(c["world_size"]),
                    f"{c['payload_kb']:g}",
                    "/".join(str(n) for n in c["sizes"]),
                    _limit_us(c),
                    *(_fmt_ratio(f.get(n)) for n in cols),
                    vs,
                ]
            )
        parts.append(
            "**coalesced**: int64 ids, float32 embeddings "
            f"({COALESCED_DIM} columns) and a bool mask of the same rows, "
            f"{coalesced_row_bytes()} bytes a row; median per-burst ratio to one equal-size "
            "all_gather of their total bytes (`coalesced`: `all_gather_v_coalesced`; "
            "`separate`: three `all_gather_v` calls)\n\n" + _table(head, rows)
        )
    notes = sorted({c["skipped"] for c in coalesced if "skipped" in c})
    parts += [f"**coalesced**: skipped, {n}" for n in notes]
    if cpu_rows:
        parts.append(cpu_note + cpu_table)
    return parts


def markdown_report(
    cells: Sequence[dict[str, Any]],
    targets: Sequence[dict[str, Any]],
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
) -> str:
    """The tables: the small and coalesced parts, the large part's forward and backward
    median ratios and peak extra memory, the targets."""
    parts: list[str] = _small_tables(small, coalesced)
    for direction in ("forward", "backward") if cells else ():
        cols = _columns(cells, direction)
        head = ["W", "MB", "profile", "floor", "auto ->", *(_short(n) for n in cols)]
        rows = [
            [
                *_row_label(c),
                f"{c['floor']:.2f}x",
                c["auto_transport"],
                *(_fmt_ratio(c[direction].get(n)) for n in cols),
            ]
            for c in cells
        ]
        parts.append(
            f"**{direction}**, median of per-repeat ratios to the equal-size "
            f"{'all_gather' if direction == 'forward' else 'reduce_scatter'} of the same bytes "
            "(lower is better; `limit` is 1.00x by definition)\n\n" + _table(head, rows)
        )
    mem_rows = []
    cols_f = _columns(cells, "forward")
    cols_b = _columns(cells, "backward")
    for c in cells:
        mem_rows.append(
            [
                *_row_label(c),
                *(_fmt_mem(c["forward"].get(n), c["output_bytes"]) for n in cols_f),
                *(_fmt_mem(c["backward"].get(n), c["output_bytes"]) for n in cols_b),
            ]
        )
    mem_head = [
        "W",
        "MB",
        "profile",
        *(f"fwd {_short(n)}" for n in cols_f),
        *(f"bwd {_short(n)}" for n in cols_b),
    ]
    measured = any(
        e.get("peak_extra_bytes") is not None
        for c in cells
        for d in ("forward", "backward")
        for e in c[d].values()
    )
    if measured:
        parts.append(
            "**peak extra memory**, largest over ranks, in multiples of the output's bytes "
            "(peak resident growth during one call; the output itself counts 1.00)\n\n"
            + _table(mem_head, mem_rows)
        )
    if targets:
        t_rows = [
            [
                t["target"],
                str(t["world_size"]),
                _payload(t),
                t["profile"],
                f"{t['value']:.2f}" if t["value"] is not None else "—",
                f"{t['op']} {t['bound']:.2f}",
                "met" if t["met"] else "**missed**",
            ]
            for t in targets
        ]
        parts.append(
            "**targets** (the issue's, checked per cell)\n\n"
            + _table(["target", "W", "payload", "profile", "measured", "bound", ""], t_rows)
        )
    return "\n\n".join(parts) + "\n"


SMALL_TARGET_KB: Final = (4.0, 256.0)
"""The small-payload targets hold for totals in this range (KiB, both ends included)."""


def _met(value: float | None, op: str, bound: float) -> bool:
    if value is None:
        return False
    if op == "<=":
        return value <= bound
    if op == "<":
        return value < bound
    return value >= bound


def evaluate_targets(
    cells: Sequence[dict[str, Any]],
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The issue's targets, one verdict per cell: ``vargather:auto`` in the large part,
    validated gathers from 4 to 256 KiB in the small part, and the coalesced gather."""
    out: list[dict[str, Any]] = []

    def add(c: dict[str, Any], target: str, value: float | None, op: str, bound: float) -> None:
        size = {"payload_kb": c["payload_kb"]} if "payload_kb" in c else {}
        out.append(
            {
                "target": target,
                "world_size": c["world_size"],
                "payload_mb": c["payload_kb"] / 1024 if size else c["payload_mb"],
                **size,
                "profile": c["profile"],
                "value": value,
                "op": op,
                "bound": bound,
                "met": _met(value, op, bound),
            }
        )

    lo, hi = SMALL_TARGET_KB
    for c in small:
        if not lo <= c["payload_kb"] <= hi:
            continue
        for name, bound in (("vargather:auto", 1.15), (CHANGING_VARIANT, 1.3)):
            entry = c["forward"].get(name)
            if entry is not None:
                add(c, f"small {_short(name)} / limit", entry["median_ratio"], "<=", bound)
    for c in coalesced:
        f = c.get("forward", {})
        if "coalesced" not in f:
            continue
        add(c, "coalesced / limit", f["coalesced"]["median_ratio"], "<=", 1.3)
        if "separate" in f:
            ratio = f["coalesced"]["median_ratio"] / f["separate"]["median_ratio"]
            add(c, "coalesced / separate", ratio, "<", 1.0)

    for c in cells:
        fwd = c["forward"].get("vargather:auto")
        bwd = c["backward"].get("vargather:auto")
        skewed = c["profile"] not in ("even", "mild")
        if fwd is not None:
            bound = 1.15 * (c["floor"] if skewed else 1.0)
            name = "forward auto / limit" + (" (<= 1.15 x floor)" if skewed else "")
            add(c, name, fwd["median_ratio"], "<=", bound)
            seed = c["forward"].get("seed")
            if skewed and seed is not None:
                add(
                    c,
                    "seed / auto (speed-up)",
                    seed["median_ratio"] / fwd["median_ratio"],
                    ">=",
                    2.5,
                )
            if fwd.get("peak_extra_bytes") is not None:
                add(
                    c,
                    "forward auto memory / output",
                    fwd["peak_extra_bytes"] / c["output_bytes"],
                    "<=",
                    2.0,
                )
        if bwd is not None:
            add(c, "backward auto / limit", bwd["median_ratio"], "<=", 1.3)
            if bwd.get("peak_extra_bytes") is not None:
                add(
                    c,
                    "backward auto memory / output",
                    bwd["peak_extra_bytes"] / c["output_bytes"],
                    "<=",
                    2.0,
                )
    return out


def plot(
    cells: Sequence[dict[str, Any]],
    path: str,
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
) -> None:
    """One panel per (direction, world size) and profile: ratio to the limit vs payload;
    then per world size the small-payload sweep and the coalesced case vs total."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [c for c in coalesced if "forward" in c]
    names = list(
        dict.fromkeys(
            [
                *_columns(cells, "forward"),
                *_columns(cells, "backward"),
                *_columns(small, "forward"),
                *(f"coalesced: {n}" for n in _columns(done, "forward")),
            ]
        )
    )
    cmap = plt.get_cmap("tab20")  # 20 colors: the dark ones first, then the light ones
    color = {n: cmap((2 * i) % 20 if i < 10 else (2 * i + 1) % 20) for i, n in enumerate(names)}
    worlds = sorted({c["world_size"] for c in cells})
    small_worlds = sorted({c["world_size"] for c in [*small, *done]})
    profiles = list(dict.fromkeys(c["profile"] for c in cells))
    rows: list[tuple[str, int]] = [
        *((d, w) for d in ("forward", "backward") for w in worlds),
        *(("small", w) for w in small_worlds),
    ]
    ncols = max(len(profiles), 2 if small_worlds else 1)
    fig, axes = plt.subplots(
        len(rows), ncols, figsize=(4.2 * ncols, 3.2 * len(rows)), squeeze=False
    )

    def curve(ax: Any, sel: Sequence[dict[str, Any]], name: str, key: str, label: str) -> None:
        xs = [c["payload_kb"] for c in sel]
        ys = [c["forward"][name]["median_ratio"] if name in c["forward"] else math.nan for c in sel]
        style = "-" if name.startswith(("vargather", "coalesced")) else "--"
        ax.plot(
            xs,
            ys,
            style,
            marker="o",
            markersize=3,
            linewidth=2.5 if name in ("vargather:auto", "coalesced") else 1.2,
            color=color[key],
            label=label,
        )

    def finish(
        ax: Any, title: str, xlabel: str, xs: Sequence[float], first: bool, last: bool
    ) -> None:
        from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, ScalarFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(set(xs))))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", linewidth=0.3)
        if first:
            ax.set_ylabel("time / limit")
        if last:
            ax.set_xlabel(xlabel)

    for i, (direction, w) in enumerate(rows):
        for ax in axes[i]:
            ax.set_visible(False)
        last = i == len(rows) - 1 or rows[i + 1][0] != direction
        if direction == "small":
            panels = [
                (sorted((c for c in small if c["world_size"] == w), key=_kb), "small payloads"),
                (sorted((c for c in done if c["world_size"] == w), key=_kb), "coalesced (3)"),
            ]
            for j, (sel, title) in enumerate(panels):
                if not sel:
                    continue
                ax = axes[i][j]
                ax.set_visible(True)
                for name in _columns(sel, "forward"):
                    key = name if j == 0 else f"coalesced: {name}"
                    curve(ax, sel, name, key, _short(key))
                ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
                xs = [c["payload_kb"] for c in sel]
                finish(ax, f"{title}, W={w}", "gathered in total (KiB)", xs, j == 0, True)
            continue
        for j, prof in enumerate(profiles):
            ax = axes[i][j]
            sel = sorted(
                (c for c in cells if c["world_size"] == w and c["profile"] == prof),
                key=lambda c: c["payload_mb"],
            )
            if not sel:
                continue
            ax.set_visible(True)
            xs = [c["payload_mb"] for c in sel]
            for name in _columns(sel, direction):
                ys = [
                    c[direction][name]["median_ratio"] if name in c[direction] else math.nan
                    for c in sel
                ]
                style = "-" if name.startswith("vargather") else "--"
                width = 2.5 if name == "vargather:auto" else 1.2
                ax.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    markersize=3,
                    linewidth=width,
                    color=color[name],
                    label=_short(name),
                )
            if direction == "forward":
                ax.axhline(sel[0]["floor"], color="grey", linewidth=0.8, linestyle=":")
            finish(ax, f"{direction}, W={w}, {prof}", "payload (MB)", xs, j == 0, last)
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="upper center",
        ncol=min(len(handles), 8),
        fontsize=8,
    )
    legend_rows = math.ceil(len(handles) / 8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.03 * legend_rows * 4 / max(len(rows), 1)))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _kb(record: dict[str, Any]) -> float:
    return float(record["payload_kb"])


def _environment() -> dict[str, Any]:
    import platform

    import torch

    import vargather

    return {
        "torch": torch.__version__,
        "vargather": vargather.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "backend": "gloo",
        "threads_per_rank": 1,
        "row_bytes": ROW_ELEMENTS * 4,
        "memory_malloc_env": dict(_MALLOC_ENV),
        "load_average": _load(),
    }


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (the machine may be shared)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _print_report(report: str) -> None:
    """The tables on stdout: rendered by ``rich`` on a terminal when it is installed,
    the markdown itself otherwise (what ``--markdown`` writes)."""
    if sys.stdout.isatty():
        try:
            from rich.console import Console
            from rich.markdown import Markdown
        except ImportError:
            pass
        else:
            Console().print(Markdown(report))
            return
    print(report)


def main(argv: Sequence[str]) -> int:
    """Run the benchmark; 0 when every variant's results checked out, 1 if one did not
    (or a rank failed), 2 on a usage error."""
    parser = _parser()
    args = parser.parse_args(list(argv))
    try:
        cfg = _config(args)
    except ValueError as err:
        parser.error(str(err))
    progress = Progress(
        None if args.no_progress else sys.stderr,
        cell_count(cfg),
        title="bench",
        unit="cells",
        throttle=10.0,
    )
    started = time.time()
    load_at_start = _load()
    cells: list[dict[str, Any]] = []
    small: list[dict[str, Any]] = []
    coalesced: list[dict[str, Any]] = []
    try:
        for w in cfg.ranks:
            world = _run_world(w, cfg, progress)
            cells += world["large"]
            small += world["small"]
            coalesced += world["coalesced"]
    except BenchError as err:
        progress.close()
        print(f"vargather bench failed: {err}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    targets = evaluate_targets(cells, small, coalesced)
    report = markdown_report(cells, targets, small, coalesced)
    _print_report(report)
    wrong = [
        f"{n} ({d}, W={c['world_size']}, {_payload(c)}, {c['profile']})"
        for c in [*cells, *small, *(c for c in coalesced if "forward" in c)]
        for d in ("forward", "backward")
        for n, e in c.get(d, {}).items()
        if not e["verified"]
    ]
    document = {
        "schema": SCHEMA,
        "environment": {**_environment(), "load_average_at_start": load_at_start},
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
        "elapsed_s": time.time() - started,
        "cells": cells,
        "small": small,
        "coalesced": coalesced,
        "targets": targets,
        "all_verified": not wrong,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    if args.plot:
        try:
            plot(cells, args.plot, small, coalesced)
        except ImportError:
            print(
                "vargather bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr
            )
            return 2
    if wrong:
        print("vargather bench: WRONG RESULTS from " + "; ".join(wrong), file=sys.stderr)
        return 1
    return 0

"""``python -m vargather bench``: time vargather against the seed and torch's collectives.

Where it sits: the command-line layer, on top of the library and the testing kit; it
measures the pipeline. It starts local gloo worlds per world size through the kit's
rank pool (``vargather.testing.RankPool``: ``FileStore`` rendezvous in a temporary
directory, no ports; one intra-op thread per rank) and runs one cell per pool call.
The package splits by job: ``_config`` (profiles, options, variant names), ``_meter``
(timing and memory metering on the ranks), ``_variants`` (the shards, what each
variant runs, how it is checked, the peers), ``_ranks`` (the rank programs, one cell
each), ``_tables`` (markdown, the targets) and ``_plots``; this module is the parent
side. Five parts, each optional (``--parts``):

large (1 MB to 64 MB, per size profile), forward
    ``limit``: ``all_gather_single`` (``all_gather_into_tensor``) of equal shards moving
    the same total bytes, the practical limit every ratio is relative to;
    ``vargather:<transport>`` for ``auto`` and each transport gloo can run, and
    ``vargather:auto+sizes`` (sizes passed, ``validate=False``: no metadata exchange);
    ``seed``: the seed ``distributed.py``'s algorithm, as ``vargather.testing.reference_seed``
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
peers (64 KiB to 16 MiB, rows of 64 float32, mild by default), forward, steady state
    ``limit``; ``vargather:auto``; ``ignite`` (pytorch-ignite's
    ``all_gather_tensors_with_shapes`` after the shape exchange its docs ask for);
    ``torchmetrics`` (``gather_all_tensors`` + ``cat``); ``seed``. Each peer's first
    result is checked equal to vargather's before it is timed; a peer that is not
    installed is skipped with a note. vargather's speed-up over the fastest peer is
    taken per burst and reported with its quartiles and range.
family (64 KiB, 1 MiB, 16 MiB; even and mild; rows of 64 float32), steady state
    per collective of the family, its baseline and vargather's call twice, sizes
    unknown (validated) and known (``validate=False``): ``reduce_scatter_v(x, sizes)``
    against one ``reduce_scatter_tensor`` of the equal split of the same input;
    ``all_to_all_v(x, send_sizes)`` (and with ``recv_sizes``) against one
    ``all_to_all_single`` with the same splits; ``all_gather_list(x)`` (and with
    ``shapes``) against ``all_gather_v`` of the same tensors (validated; with the sizes
    and ``validate=False`` for the known variant); ``gather_v(x, 0)`` and
    ``scatter_v(x, sizes, 0)`` against ``dist.gather`` / ``dist.scatter`` of the blocks
    padded to the largest, and beside batched sends of the exact blocks (``direct``,
    its own ratio). Each vargather call's first result
    is checked equal to the reference (the same splits through ``dist.reduce_scatter``,
    ``all_to_all_single``, ``all_gather_v``) before it is timed; each ratio is taken per
    burst against its baseline in the same repeat and reported with its quartiles and
    range, with the collectives each call issues.

mpi (4 KiB to 16 MiB, rows of 64 float32, mild by default), steady state, only when named
    MPICH's ``Allgatherv`` and ``Alltoallv`` through mpi4py (the counts exchanged first,
    and known) beside validated ``all_gather_v`` and ``all_to_all_v`` and gloo's own
    collectives, in the same processes, launched by ``mpiexec`` instead of the pool:
    ``_mpi`` has it all. Skipped with a note where mpi4py or ``mpiexec`` is missing.

Timing, large cells: each repeat times every variant once, in a rotated order, each
after a barrier; a variant's time is the slowest rank's. ``--repeats`` repeats from 1 GB
up, more for smaller payloads (``large_repeats``: each variant moves at least 1 GB, at
most 8x ``--repeats`` calls: 56 at 1-16 MB, 16 at 64 MB by default), as a call of a few
MB lasts about as long as this machine's scheduling jitter. Its ratio is its time over the
limit's time in the same repeat, and the tables report the median ratio over the
repeats, with their quartiles. Small, coalesced, peers and family cells: each repeat runs
every variant as a *burst*, in a rotated order: one untimed call, a barrier, then ``--calls`` back-to-back timed calls; a
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

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from vargather.testing import RankContext

from ..display import StreamProgress
from ._config import (
    _MALLOC_ENV,
    PROFILES,
    ROW_ELEMENTS,
    SCHEMA,
    SEQUENCE_SPLITS,
    BenchConfig,
    _parser,
    cell_count,
    config_from_args,
    floor_ratio,
    profile_shares,
    split_rows,
)
from ._mpi import MpiLaunchError, mpi_tables, mpi_wrong, run_mpi
from ._plots import plot
from ._ranks import _rank_cell, _rank_coalesced, _rank_family, _rank_peers, _rank_small
from ._sequence import rank_sequence, sequence_tables
from ._tables import _payload, evaluate_targets, markdown_report

__all__ = [
    "PROFILES",
    "SCHEMA",
    "BenchConfig",
    "floor_ratio",
    "main",
    "profile_shares",
    "split_rows",
]


# --- the parent side -------------------------------------------------------------------------------


class BenchError(RuntimeError):
    """A rank failed or died; the message carries its traceback."""


_CELL_TIMEOUT: Final = 3600.0
"""Seconds one cell may take on the ranks before the world counts as hung (a hung
collective fails sooner, after ``--timeout``)."""


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
    progress: StreamProgress,
    environment: dict[str, str] | None,
    jobs: Sequence[tuple[str, Callable[[RankContext, Any], dict[str, Any] | None], Any]],
) -> list[dict[str, Any]]:
    """Run ``jobs`` (label, rank function, argument) one pool call each, on a pool of
    their own started with ``environment``; rank 0's records, in order."""
    from vargather.testing import PoolFailure, RankError, RankPool
    from vargather.testing.pool_types import DEFAULT_SHARED_START_METHOD

    records: list[dict[str, Any]] = []
    try:
        with RankPool(
            world_size,
            collective_timeout=cfg.timeout_s,
            call_timeout=_CELL_TIMEOUT + cfg.timeout_s,
            environment=environment,
            # Without an environment of their own the ranks fork from a server that
            # imported torch once (seconds of CPU per rank saved); the memory pass's
            # ranks set the allocator's environment at start, so they are spawned.
            start_method="spawn" if environment else DEFAULT_SHARED_START_METHOD,
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


def _run_world(world_size: int, cfg: BenchConfig, progress: StreamProgress) -> dict[str, list[Any]]:
    """Every cell of one world size: the timed cells on a pool with default malloc
    settings, then the memory pass on a pool of its own with ``_MALLOC_ENV``."""
    w = world_size
    jobs: list[tuple[str, Callable[[RankContext, Any], dict[str, Any] | None], Any]] = []
    if "small" in cfg.parts:
        jobs += [(f"W={w} {kb:g} KiB small", _rank_small, (cfg, kb)) for kb in cfg.small_kb]
    if "coalesced" in cfg.parts:
        jobs += [(f"W={w} {kb:g} KiB coalesced", _rank_coalesced, (cfg, kb)) for kb in cfg.small_kb]
    if "peers" in cfg.parts:
        jobs += [(f"W={w} {kb:g} KiB peers", _rank_peers, (cfg, kb)) for kb in cfg.peer_kb]
    if "family" in cfg.parts:
        jobs += [
            (f"W={w} {kb:g} KiB {profile} family", _rank_family, (cfg, kb, profile))
            for kb in cfg.family_kb
            for profile in cfg.family_profiles
        ]
    if "sequence" in cfg.parts:
        jobs += [
            (f"W={w} {kb:g} KiB {split} sequence", rank_sequence, (cfg, kb, split))
            for kb in cfg.sequence_kb
            for split in SEQUENCE_SPLITS
        ]
    large = [
        (mb, profile) for mb in cfg.sizes_mb for profile in cfg.profiles if "large" in cfg.parts
    ]
    jobs += [
        (f"W={w} {mb:g} MB {profile}", _rank_cell, (cfg, mb, profile, "time"))
        for mb, profile in large
    ]
    timed = _pool_calls(w, cfg, progress, None, jobs) if jobs else []
    out: dict[str, list[Any]] = {
        "small": [],
        "coalesced": [],
        "peers": [],
        "family": [],
        "sequence": [],
        "large": [],
    }
    part_of: dict[object, str] = {
        _rank_small: "small",
        _rank_coalesced: "coalesced",
        _rank_peers: "peers",
        _rank_family: "family",
        rank_sequence: "sequence",
    }
    for (_, fn, _), record in zip(jobs, timed, strict=True):
        part = part_of.get(fn, "large")
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
        cfg = config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    progress = StreamProgress(
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
    peers: list[dict[str, Any]] = []
    family: list[dict[str, Any]] = []
    sequence: list[dict[str, Any]] = []
    mpi: list[dict[str, Any]] = []
    try:
        for w in cfg.ranks:
            world = _run_world(w, cfg, progress)
            cells += world["large"]
            small += world["small"]
            coalesced += world["coalesced"]
            peers += world["peers"]
            family += world["family"]
            sequence += world["sequence"]
            if "mpi" in cfg.parts:  # after the pool's world is gone: mpiexec's own ranks
                progress.phase(f"W={w} mpi: measuring")
                mpi += run_mpi(cfg, w, progress.phase)
                progress.advance(f"done: W={w} mpi")
    except (BenchError, MpiLaunchError) as err:
        progress.close()
        print(f"vargather bench failed: {err}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    targets = evaluate_targets(cells, small, coalesced, peers, family)
    report = markdown_report(cells, targets, small, coalesced, peers, family)
    if mpi:
        report = "\n\n".join([*mpi_tables(mpi), report.strip()]).strip() + "\n"
    if sequence:
        report = "\n\n".join([*sequence_tables(sequence), report.strip()]).strip() + "\n"
    _print_report(report)
    wrong = [
        f"{n} ({d}, W={c['world_size']}, {_payload(c)}, {c['profile']})"
        for c in [*cells, *small, *(c for c in coalesced if "forward" in c), *peers]
        for d in ("forward", "backward")
        for n, e in c.get(d, {}).items()
        if not e["verified"]
    ]
    wrong += [
        f"{n} ({op}, W={c['world_size']}, {_payload(c)}, {c['profile']})"
        for c in family
        for op, g in c["collectives"].items()
        for n, e in g["forward"].items()
        if not e["verified"]
    ]
    wrong += mpi_wrong(mpi)
    wrong += [
        f"{n} ({name}, W={c['world_size']}, {c['payload_kb']:g} KiB, {c['split']})"
        for c in sequence
        for name, g in c["cells"].items()
        for n, e in g["forward"].items()
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
        "peers": peers,
        "family": family,
        "mpi": mpi,
        "sequence": sequence,
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
            plot(cells, args.plot, small, coalesced, peers, family, mpi)
        except ImportError:
            print(
                "vargather bench: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr
            )
            return 2
    if wrong:
        print("vargather bench: WRONG RESULTS from " + "; ".join(wrong), file=sys.stderr)
        return 1
    return 0

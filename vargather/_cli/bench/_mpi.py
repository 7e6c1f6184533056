"""``python -m vargather bench --parts mpi``: MPI beside vargather and gloo, in the same processes.

Where it sits: one part of the bench (the package doc has the others), with both of its
sides here, because its ranks are not the kit's pool: ``mpiexec`` starts them. The parent
side (``mpi_unavailable``, ``run_mpi``) launches ``mpiexec -n W`` on the rank program
(``rank_main``) and reads back rank 0's records; the rank side joins MPI's world and a gloo
world of the same ranks and times both; ``mpi_tables`` renders the records. Only public
vargather names are called.

The same processes run both libraries: every process started by ``mpiexec`` also joins a
torch.distributed gloo world (``FileStore`` rendezvous in the launch's temporary directory,
MPI's rank and size), so MPI and gloo move the same tensors on the same cores, round by
round. Per (world size, total) cell, two collectives, each timed against MPI's own call
with the sizes exchanged first (the baseline, what an MPI user who does not know the sizes
runs):

all_gather (rows of ``MPI_COLUMNS`` float32, split by the profile)
    ``mpi:Allgatherv``: every rank's row count through ``MPI_Allgather`` (one int64),
    then ``MPI_Allgatherv``; ``mpi:Allgatherv+counts``: the counts known, the
    ``MPI_Allgatherv`` alone; ``vargather:all_gather_v``: validated, sizes unknown;
    ``gloo:all_gather``: one equal ``all_gather_into_tensor`` of the same total bytes
    (the bench's ``limit``).
all_to_all (every rank's input holds the total over W, split by the profile: rank ``r``
receives share ``r`` of every rank's rows)
    ``mpi:Alltoallv``: the send counts through ``MPI_Alltoall``, then ``MPI_Alltoallv``;
    ``mpi:Alltoallv+counts``: the counts known; ``vargather:all_to_all_v``: validated,
    receive sizes unknown; ``gloo:all_to_all_single``: both split lists known.

MPI is handed torch's own tensors (through DLPack), so its results are torch tensors like
every other variant's, and every result is checked bit for bit against ``cat`` of the
shards: every warm-up call before anything is timed, and the last call of the last round.

Timing: the bursts of the other burst parts (``_meter._measure_bursts``), alternating round
by round in a rotated order: per variant one untimed call, a barrier, ``calls`` timed
calls; a variant's time is the slowest rank's burst over its calls, and each ratio is
taken per round against the baseline's burst of the same round (median, quartiles,
range over the rounds). MPICH busy-polls: a rank waiting in an MPI call spins on its core,
and with more ranks than cores (4 on 2, as measured here) it takes CPU from a peer still
inside a gloo call. So each variant's barriers are its own library's (a gloo barrier
around gloo and vargather bursts, an MPI barrier around MPI's), every burst closes on such
a barrier before anything else runs (the clock stops before it), and the slowest-rank
reduction and the checks' agreement run after all rounds: no rank is ever inside an MPI
call while a peer still times a gloo variant. Large totals take fewer calls per burst
(``burst_calls``): a 16 MiB call lasts tens of milliseconds, far above the jitter.

Missing MPI: the part is skipped with a note (``mpi_unavailable``: mpi4py not importable,
or no ``mpiexec`` next to this Python or on ``PATH``), and the JSON records the skip.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ._config import BenchConfig, malloc_environment, profile_shares, split_rows
from ._meter import spread
from ._tables import _table
from ._variants import _same

if TYPE_CHECKING:
    import torch


MPI_COLUMNS: Final = 64
"""float32 columns of the MPI part's rows (256-byte rows, as the peers and family parts)."""

MPI_BURST_BYTES: Final = 128 * 1024 * 1024
"""A burst moves at most about this many bytes (``burst_calls``)."""

GATHER_NAMES: Final = (
    "mpi:Allgatherv",
    "mpi:Allgatherv+counts",
    "vargather:all_gather_v",
    "gloo:all_gather",
)
EXCHANGE_NAMES: Final = (
    "mpi:Alltoallv",
    "mpi:Alltoallv+counts",
    "vargather:all_to_all_v",
    "gloo:all_to_all_single",
)
"""Each collective's variants, in their order; the first is the baseline."""

_LAUNCH_GRACE_S: Final = 600.0
"""Seconds the launch may take on top of its cells (torch's import, the rendezvous)."""

_CELL_TIMEOUT_S: Final = 3600.0
"""Seconds one cell (both collectives of one total) may take on the ranks before the
launch counts as hung and is killed, as the pool's cells (a collective that hangs in
gloo fails sooner, after ``--timeout``)."""

PROGRESS_PREFIX: Final = "vargather-bench-mpi: "
"""Rank 0's lines on stdout that say how far the launch is (shown as progress)."""


class MpiLaunchError(RuntimeError):
    """``mpiexec`` or a rank failed; the message carries the ranks' output's tail."""


# --- the parent side ---------------------------------------------------------------------


def mpiexec() -> str | None:
    """The ``mpiexec`` to launch with: the one installed next to this Python (the ``mpich``
    wheel puts it in the environment's ``bin``, where it matches the MPI mpi4py loads),
    else the first on ``PATH``; ``None`` when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


def mpi_unavailable() -> str | None:
    """Why the MPI part cannot run here (the note it is skipped with), or ``None``."""
    try:
        import mpi4py  # noqa: F401  # the package only: MPI itself starts in the ranks
    except ImportError:
        return "mpi4py is not installed (pip install 'vargather[mpi]': mpi4py and mpich)"
    if mpiexec() is None:
        return "no mpiexec next to this Python or on PATH (pip install mpich)"
    return None


def _child_environment() -> dict[str, str]:
    """The ranks' environment: this one, one OpenMP thread, and the directory this
    vargather was imported from first on ``PYTHONPATH`` (the ranks import the same)."""
    import vargather

    root = str(Path(vargather.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
    }


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_mpi(
    cfg: BenchConfig, world_size: int, progress: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Every cell of the MPI part on ``world_size`` ranks, in one ``mpiexec`` launch:
    rank 0's records, or one record saying why the part was skipped. ``progress`` is
    told each cell rank 0 finishes. Raises ``MpiLaunchError`` when the launch or a rank
    fails."""
    note = mpi_unavailable()
    if note is not None:
        return [{"world_size": world_size, "skipped": note}]
    launcher = mpiexec()
    assert launcher is not None  # mpi_unavailable() found one
    with tempfile.TemporaryDirectory(prefix="vargather-bench-mpi-") as tmp:
        job = Path(tmp, "job.json")
        job.write_text(json.dumps({"config": asdict(cfg), "world_size": world_size}))
        command = [
            launcher,
            "-n",
            str(world_size),
            sys.executable,
            "-c",
            "from vargather._cli.bench._mpi import rank_main; rank_main()",
            tmp,
        ]
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_child_environment(),
            start_new_session=True,  # a group of its own: a hung launch is killed whole
        )
        lines: list[str] = []
        reader = threading.Thread(target=_read, args=(proc, lines, progress), daemon=True)
        reader.start()
        timeout = _LAUNCH_GRACE_S + len(cfg.mpi_kb) * (_CELL_TIMEOUT_S + cfg.timeout_s)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.returncode is None:  # hung, or interrupted (Ctrl-C): the whole group goes
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join()
            if proc.stdout is not None:
                proc.stdout.close()
        output = "".join(lines)
        if timed_out:
            raise MpiLaunchError(
                f"mpiexec -n {world_size} ran past {timeout:.0f} s and was killed; its "
                f"output ended:\n{_tail(output)}"
            )
        results = Path(tmp, "results.json")
        if proc.returncode != 0 or not results.is_file():
            raise MpiLaunchError(
                f"mpiexec -n {world_size} exited with {proc.returncode}"
                + ("" if results.is_file() else " and no results")
                + f"; its output ended:\n{_tail(output)}"
            )
        records: list[dict[str, Any]] = json.loads(results.read_text())
    return records


def _read(
    proc: subprocess.Popen[str], lines: list[str], progress: Callable[[str], None] | None
) -> None:
    """Collect the launch's output into ``lines`` as it comes, telling ``progress`` rank
    0's progress lines."""
    assert proc.stdout is not None  # opened with stdout=PIPE
    for line in proc.stdout:
        lines.append(line)
        if progress is not None and line.startswith(PROGRESS_PREFIX):
            progress(line.removeprefix(PROGRESS_PREFIX).strip())


# --- the rank side -----------------------------------------------------------------------


def burst_calls(calls: int, total_bytes: int) -> int:
    """Timed calls per burst of a cell moving ``total_bytes`` a call: ``calls``, fewer
    where a burst would move more than ``MPI_BURST_BYTES``, at least 2."""
    return max(2, min(calls, math.ceil(MPI_BURST_BYTES / max(total_bytes, 1))))


@dataclass(frozen=True)
class _Timed:
    """One variant on a rank: ``call()`` returns its result, ``check(result)`` verifies
    it, ``barrier()`` is its own library's barrier."""

    name: str
    call: Callable[[], Any]
    check: Callable[[Any], bool]
    barrier: Callable[[], None]


def shard(rank: int, first_row: int, rows: int, columns: int) -> torch.Tensor:
    """Rows ``[first_row, first_row + rows)`` of rank ``rank``'s input: ``columns``
    float32 small integers from a formula, so every expected result is regenerated
    exactly."""
    import torch

    i = torch.arange(first_row * columns, (first_row + rows) * columns, dtype=torch.int64)
    return ((i * 7 + 13 * rank) % 23 - 11).to(torch.float32).view(rows, columns)


def _measure(
    variants: Sequence[_Timed], repeats: int, calls: int, warmup: int, comm: Any
) -> dict[str, dict[str, Any]]:
    """Warm up (every call checked), then ``repeats`` rounds in a rotated order of one
    untimed call, the variant's barrier, ``calls`` timed calls and its barrier again; the
    last call of the last round checked. The slowest rank's time per burst and every
    rank's verdict are gathered to rank 0 after the last round (MPI's ``gather`` of
    Python objects: nobody times anything then); rank 0 returns the results, the
    others an empty dict."""
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    ok = dict.fromkeys(times, True)
    for v in variants:
        for _ in range(warmup):
            ok[v.name] &= bool(v.check(v.call()))
        v.barrier()
    for k in range(repeats):
        order = list(variants[k % len(variants) :]) + list(variants[: k % len(variants)])
        for v in order:
            result = v.call()  # steady state: whatever the last burst left, one call first
            v.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                result = v.call()
            elapsed = time.perf_counter() - t0
            v.barrier()  # the burst closes on its own library's barrier
            times[v.name].append(elapsed / calls)
            if k == repeats - 1:
                ok[v.name] &= bool(v.check(result))
            del result
    every = comm.gather((times, ok), root=0)
    if every is None:
        return {}
    results: dict[str, dict[str, Any]] = {}
    for v in variants:
        slowest = [max(t[v.name][k] for t, _ in every) for k in range(repeats)]
        results[v.name] = {
            "times_s": slowest,
            "median_us": spread(slowest)["median"] * 1e6,
            "verified": all(o[v.name] for _, o in every),
        }
    return results


def _ratios(results: dict[str, dict[str, Any]], baseline: str) -> dict[str, dict[str, Any]]:
    """Per variant, its time over ``baseline``'s round by round: median, quartiles, range."""
    base = results[baseline]["times_s"]
    return {
        name: spread([t / b for t, b in zip(entry["times_s"], base, strict=True)])
        for name, entry in results.items()
    }


def _gather_variants(
    comm: Any, rank: int, w: int, kb: float, shares: Sequence[float]
) -> tuple[list[_Timed], dict[str, Any]]:
    """The all_gather variants of one cell on this rank, and the cell's shapes."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import vargather

    cols = MPI_COLUMNS
    total = w * max(1, round(kb * 1024 / (4 * cols * w)))  # rows, a multiple of W
    sizes = split_rows(total, shares)
    x = shard(rank, 0, sizes[rank], cols)
    want = torch.cat([shard(r, 0, n, cols) for r, n in enumerate(sizes)])
    eq = total // w
    eq_x = shard(rank, 0, eq, cols)
    eq_want = torch.cat([shard(r, 0, eq, cols) for r in range(w)])
    mine = torch.tensor([sizes[rank]], dtype=torch.int64)
    known = [n * cols for n in sizes]
    known_displs = [sum(known[:r]) for r in range(w)]
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def allgatherv(counts: list[int], displs: list[int]) -> torch.Tensor:
        out = x.new_empty((sum(counts) // cols, cols))
        comm.Allgatherv(x, [out, counts, displs, MPI.FLOAT])
        return out

    def mpi_exchanged() -> torch.Tensor:
        rows = torch.empty(w, dtype=torch.int64)
        comm.Allgather(mine, rows)
        counts = [int(n) * cols for n in rows.tolist()]
        return allgatherv(counts, [sum(counts[:r]) for r in range(w)])

    def gloo_equal() -> torch.Tensor:
        out = eq_x.new_empty((total, cols))
        gather_single(out, eq_x)
        return out

    def same(expected: torch.Tensor) -> Callable[[Any], bool]:
        return lambda out: _same(out, expected)

    mpi_barrier, gloo_barrier = comm.Barrier, dist.barrier
    variants = [
        _Timed(GATHER_NAMES[0], mpi_exchanged, same(want), mpi_barrier),
        _Timed(GATHER_NAMES[1], lambda: allgatherv(known, known_displs), same(want), mpi_barrier),
        _Timed(GATHER_NAMES[2], lambda: vargather.all_gather_v(x), same(want), gloo_barrier),
        _Timed(GATHER_NAMES[3], gloo_equal, same(eq_want), gloo_barrier),
    ]
    return variants, {"rows": total, "sizes": sizes, "output_bytes": total * cols * 4}


def _exchange_variants(
    comm: Any, rank: int, w: int, kb: float, shares: Sequence[float]
) -> tuple[list[_Timed], dict[str, Any]]:
    """The all_to_all variants of one cell on this rank, and the cell's shapes."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import vargather

    cols = MPI_COLUMNS
    per_rank = max(1, round(kb * 1024 / (4 * cols * w)))  # rows of every rank's input
    send = split_rows(per_rank, shares)
    recv = [send[rank]] * w
    starts = [sum(send[:r]) for r in range(w)]
    x = shard(rank, 0, per_rank, cols)
    want = torch.cat([shard(j, starts[rank], send[rank], cols) for j in range(w)])
    send_counts = [n * cols for n in send]
    send_displs = [s * cols for s in starts]
    send_rows = torch.tensor(send, dtype=torch.int64)
    known = [n * cols for n in recv]
    known_displs = [sum(known[:r]) for r in range(w)]

    def alltoallv(counts: list[int], displs: list[int]) -> torch.Tensor:
        out = x.new_empty((sum(counts) // cols, cols))
        comm.Alltoallv([x, send_counts, send_displs, MPI.FLOAT], [out, counts, displs, MPI.FLOAT])
        return out

    def mpi_exchanged() -> torch.Tensor:
        rows = torch.empty(w, dtype=torch.int64)
        comm.Alltoall(send_rows, rows)
        counts = [int(n) * cols for n in rows.tolist()]
        return alltoallv(counts, [sum(counts[:r]) for r in range(w)])

    def gloo_known() -> torch.Tensor:
        out = x.new_empty((sum(recv), cols))
        dist.all_to_all_single(out, x, recv, send)
        return out

    def check(out: Any) -> bool:
        return _same(out, want)

    mpi_barrier, gloo_barrier = comm.Barrier, dist.barrier
    variants = [
        _Timed(EXCHANGE_NAMES[0], mpi_exchanged, check, mpi_barrier),
        _Timed(EXCHANGE_NAMES[1], lambda: alltoallv(known, known_displs), check, mpi_barrier),
        _Timed(EXCHANGE_NAMES[2], lambda: vargather.all_to_all_v(x, send), check, gloo_barrier),
        _Timed(EXCHANGE_NAMES[3], gloo_known, check, gloo_barrier),
    ]
    return variants, {"rows_per_rank": per_rank, "send_sizes": send, "input_bytes": kb * 1024}


def _cell(comm: Any, cfg: BenchConfig, kb: float) -> dict[str, Any] | None:
    """One total (KiB) on this world: both collectives, each in rounds of its own; rank 0
    returns the record."""
    rank, w = comm.Get_rank(), comm.Get_size()
    shares = profile_shares(cfg.mpi_profile, w)
    collectives: dict[str, Any] = {}
    for name, build in (("all_gather", _gather_variants), ("all_to_all", _exchange_variants)):
        variants, shapes = build(comm, rank, w, kb, shares)
        calls = burst_calls(cfg.calls, round(kb * 1024))
        results = _measure(variants, cfg.small_repeats, calls, max(cfg.warmup, w), comm)
        if rank != 0:
            continue
        baseline = variants[0].name
        vs_gloo = [
            g / b
            for g, b in zip(
                results[variants[2].name]["times_s"],
                results[variants[3].name]["times_s"],
                strict=True,
            )
        ]
        collectives[name] = {
            **shapes,
            "baseline": baseline,
            "calls_per_burst": calls,
            "forward": results,
            "ratios": _ratios(results, baseline),
            "vargather_vs_gloo": spread(vs_gloo),
        }
    if rank != 0:
        return None
    return {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.mpi_profile,
        "shares": list(shares),
        "columns": MPI_COLUMNS,
        "element_bytes": 4,
        "rounds": cfg.small_repeats,
        "malloc_env": malloc_environment(),
        "collectives": collectives,
    }


def _config_from(data: dict[str, Any]) -> BenchConfig:
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return BenchConfig(**fields)


def rank_main() -> None:
    """The program every process ``mpiexec`` starts runs: ``sys.argv[1]`` is the launch's
    directory (``job.json`` in, ``results.json`` out, the gloo ``FileStore``). A rank
    that fails prints its traceback and aborts the whole MPI job."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        where = Path(sys.argv[1])
        job = json.loads((where / "job.json").read_text())
        cfg = _config_from(job["config"])
        rank, w = comm.Get_rank(), comm.Get_size()
        if w != job["world_size"]:
            raise RuntimeError(f"rank {rank}: expected {job['world_size']} MPI ranks, got {w}")
        # FileStore is public API, but torch.distributed re-exports it without "as", which
        # mypy's strict no-implicit-reexport rejects.
        store = dist.FileStore(str(where / "store"), w)  # type: ignore[attr-defined]
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=w, timeout=timedelta(seconds=cfg.timeout_s)
        )
        started = time.time()
        records = []
        for kb in cfg.mpi_kb:
            records.append(_cell(comm, cfg, kb))
            if rank == 0:
                print(f"{PROGRESS_PREFIX}W={w} {kb:g} KiB mpi: done", flush=True)
        comm.Barrier()
        if rank == 0:
            for record in records:
                assert record is not None  # rank 0 returns every cell
                record["mpi_library"] = " ".join(MPI.Get_library_version().split()[:3])
                record["launch_elapsed_s"] = time.time() - started
            partial = where / "results.json.partial"
            partial.write_text(json.dumps(records))
            partial.replace(where / "results.json")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)


# --- the report --------------------------------------------------------------------------


def _fmt(s: dict[str, Any], verified: bool = True) -> str:
    mark = "" if verified else " WRONG"
    return f"{s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f}){mark}"


_COLUMNS: Final = (
    ("MPI counts known", 1),
    ("vargather (sizes unknown)", 2),
    ("gloo", 3),
)


def mpi_tables(records: Sequence[dict[str, Any]]) -> list[str]:
    """The MPI part: per cell and collective, MPI's time with the counts exchanged (the
    baseline, µs a call) and every other variant's per-round ratio to it, with vargather
    over gloo's own collective; skip notes."""
    done = [c for c in records if "skipped" not in c]
    parts: list[str] = []
    if done:
        rows: list[list[str]] = []
        for c in done:
            for op, g in c["collectives"].items():
                f = g["forward"]
                names = list(f)
                rows.append(
                    [
                        str(c["world_size"]),
                        f"{c['payload_kb']:g}",
                        op,
                        f"{f[names[0]]['median_us']:.0f}"
                        + ("" if f[names[0]]["verified"] else " WRONG"),
                        *(
                            _fmt(g["ratios"][names[i]], f[names[i]]["verified"])
                            for _, i in _COLUMNS
                        ),
                        _fmt(g["vargather_vs_gloo"]),
                    ]
                )
        head = [
            "W",
            "KiB",
            "collective",
            "MPI µs/call (counts exchanged)",
            *(label for label, _ in _COLUMNS),
            "vargather / gloo",
        ]
        c0 = done[0]
        by_size = {
            c["payload_kb"]: g["calls_per_burst"] for c in done for g in c["collectives"].values()
        }
        calls = ", ".join(f"{n} calls at {kb:g} KiB" for kb, n in sorted(by_size.items()))
        parts.append(
            f"**MPI beside gloo**, the same {c0['world_size']} processes (launched by "
            f"`mpiexec`, each also in a gloo world), rows of {c0['columns']} float32 split "
            f"by the `{c0['profile']}` profile, steady state: median over "
            f"{c0['rounds']} rounds (each variant one burst a round, of {calls}) of the "
            "per-round ratio to MPI's call with the counts exchanged "
            "first, quartiles in parentheses; lower is better. all_gather: "
            "`MPI_Allgather` of the row counts then `MPI_Allgatherv`; counts known: "
            "`MPI_Allgatherv` alone; vargather: validated `all_gather_v`; gloo: one equal "
            "`all_gather_into_tensor` of the same bytes. all_to_all (KiB: every rank's "
            "input together): `MPI_Alltoall` of the send counts then `MPI_Alltoallv`; "
            "counts known: `MPI_Alltoallv` alone; vargather: validated `all_to_all_v` "
            "(receive sizes unknown); gloo: `all_to_all_single` with both split lists "
            "known. vargather / gloo: vargather's time over gloo's own collective, round "
            "by round. Every result was checked bit for bit\n\n" + _table(head, rows)
        )
    notes = sorted({c["skipped"] for c in records if "skipped" in c})
    parts += [f"**MPI**: skipped, {n}" for n in notes]
    return parts


def mpi_wrong(records: Sequence[dict[str, Any]]) -> list[str]:
    """Every variant of the MPI part whose results did not check out, named."""
    return [
        f"{n} (mpi {op}, W={c['world_size']}, {c['payload_kb']:g} KiB, {c['profile']})"
        for c in records
        for op, g in c.get("collectives", {}).items()
        for n, e in g["forward"].items()
        if not e["verified"]
    ]

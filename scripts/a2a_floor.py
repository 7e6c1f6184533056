"""Where ``all_to_all_v``'s time goes on gloo: its steady call beside the primitives under it.

On a ``--ranks``-rank gloo world (processes spawned here; ``FileStore`` rendezvous in a
temporary directory; one intra-op thread per rank, as ``torchrun`` sets), the bench's
family cell: every rank sends ``--kb / W`` KiB of rows of 64 float32, cut by the
bench's ``mild`` profile (shares 1 : 1.25 : 1.5 : 1.75 at 4 ranks, rank ``r``
receiving share ``r`` of every rank's rows), the same every call. Variants:

* ``all_to_all_single``: torch's, both split lists known (the baseline);
* ``direct``: the exact blocks by direct sends (``ProcessGroup.send`` / ``recv``, every
  operation posted before any is awaited), sizes known, nothing validated;
* ``direct+rows``: the same, each rank's row (992 bytes, as long as vargather's) also
  sent to every peer as a message of its own, posted first: what validating costs
  at the least in point-to-point messages;
* ``vargather``: ``all_to_all_v(x, send_sizes)``, receive sizes unknown, validated (its
  steady call: the learned round replayed);
* ``vargather+sizes``: ``all_to_all_v`` with both split lists and ``validate=False``;
* ``rows-then-blocks``: the rows first, and each block received once every row has
  landed, at its final offset (no slots, no close-up; a second latency a call);
* ``rows-by-all_gather``: the rows by an async ``all_gather_into_tensor`` beside the
  direct sends of the blocks;
* ``rows+blocks-alltoallv``: the rows by one alltoall and the exact blocks by one
  alltoallv, both posted before either is awaited (vargather's direct round on gloo,
  sizes known, nothing validated);
* ``rows-alone``: only the rows' alltoall of that round (``W`` rows of 992 bytes from
  every rank): what validating costs on its own, whatever carries the blocks;
* ``vargather~changing``: ``all_to_all_v`` validated, every rank's send sizes moving
  about 5 % of a block between two peers every call (the bench's variant of that name,
  by its ``changing_sizes``), on a learned state of its own (``internal.swap_state``).

Timing: ``--bursts`` rounds, each variant a burst of ``--calls`` calls after a barrier,
in a rotated order; a burst's time is the slowest rank's, its ratio against the
baseline's burst in the same round; reported: the median ratio with its quartiles, and
the process CPU per call (every thread), largest over ranks. Every variant's result
but ``vargather~changing``'s (other sizes; the bench checks that one) and ``rows-alone``'s is checked bit
for bit against the baseline's first. Nothing is asserted.

    python scripts/a2a_floor.py                    # 4 ranks, 16 MiB
    python scripts/a2a_floor.py --kb 1024 --variants all_to_all_single,direct,vargather
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The bench's own definitions of its family cell, so that both time the same calls.
from vargather._cli.bench._config import FAMILY_COLUMNS, profile_shares, split_rows
from vargather._cli.bench._variants import changing_sizes, changing_step

COLUMNS = FAMILY_COLUMNS
ROW_BYTES = 992
BASELINE = "all_to_all_single"
VARIANTS = (
    BASELINE,
    "direct",
    "direct+rows",
    "vargather",
    "vargather+sizes",
    "rows-then-blocks",
    "rows-by-all_gather",
    "rows+blocks-alltoallv",
    "rows-alone",
    "vargather~changing",
)


def _variants(rank: int, w: int, kb: int) -> dict[str, Callable[[], torch.Tensor]]:
    import vargather
    from vargather import internal

    per_rank = max(1, round(kb * 1024 / (4 * COLUMNS * w)))
    send = split_rows(per_rank, profile_shares("mild", w))
    recv = [send[rank]] * w
    at_send = [sum(send[:k]) for k in range(w)]
    at_recv = [sum(recv[:k]) for k in range(w)]
    x = torch.randn(per_rank, COLUMNS, generator=torch.Generator().manual_seed(rank))
    pg = dist.group.WORLD
    assert pg is not None
    peers = [(rank + k) % w for k in range(1, w)]
    row = torch.zeros(ROW_BYTES, dtype=torch.uint8)
    rows = torch.zeros(w, ROW_BYTES, dtype=torch.uint8)

    def block_out(out: torch.Tensor, q: int) -> torch.Tensor:
        return out[at_recv[q] : at_recv[q] + recv[q]]

    def block_in(q: int) -> torch.Tensor:
        return x[at_send[q] : at_send[q] + send[q]]

    def own(out: torch.Tensor) -> None:
        block_out(out, rank).copy_(block_in(rank))

    def baseline() -> torch.Tensor:
        out = x.new_empty((sum(recv), COLUMNS))
        dist.all_to_all_single(out, x, recv, send)
        return out

    def direct(with_rows: bool = False) -> torch.Tensor:
        out = x.new_empty((sum(recv), COLUMNS))
        works = []
        for q in peers:
            if with_rows:
                works.append(pg.recv([rows[q]], q, 8))
            works.append(pg.recv([block_out(out, q)], q, 7))
        for q in peers:
            if with_rows:
                works.append(pg.send([row], q, 8))
            works.append(pg.send([block_in(q)], q, 7))
        own(out)
        for work in works:
            work.wait()
        return out

    def rows_then_blocks() -> torch.Tensor:
        row_works = [pg.recv([rows[q]], q, 8) for q in peers]
        sends = []
        for q in peers:
            sends.append(pg.send([row], q, 8))
            sends.append(pg.send([block_in(q)], q, 7))
        for work in row_works:
            work.wait()
        out = x.new_empty((sum(recv), COLUMNS))
        blocks = [pg.recv([block_out(out, q)], q, 7) for q in peers]
        own(out)
        for work in blocks + sends:
            work.wait()
        return out

    def rows_by_all_gather() -> torch.Tensor:
        handle = dist.all_gather_into_tensor(rows.view(-1), row, async_op=True)
        out = direct()
        assert handle is not None
        handle.wait()
        return out

    tiled = row.repeat(w)

    def rows_and_blocks_by_alltoallv() -> torch.Tensor:
        out = x.new_empty((sum(recv), COLUMNS))
        handles = [
            dist.all_to_all_single(rows.view(-1), tiled, async_op=True),
            dist.all_to_all_single(out, x, recv, send, async_op=True),
        ]
        for handle in handles:
            assert handle is not None
            handle.wait()
        return out

    def rows_alone() -> torch.Tensor:
        dist.all_to_all_single(rows.view(-1), tiled)
        return rows

    step = changing_step(per_rank, w)
    calls = [0]
    state = [internal.FusedState()]

    def changing() -> torch.Tensor:
        calls[0] += 1
        sizes = changing_sizes(send, step, calls[0] + rank)  # the bench's phases
        before = internal.swap_state(None, state[0], "all_to_all_v")
        try:
            return vargather.all_to_all_v(x, sizes)
        finally:
            state[0] = internal.swap_state(None, before, "all_to_all_v")

    return {
        BASELINE: baseline,
        "direct": direct,
        "direct+rows": lambda: direct(True),
        "vargather": lambda: vargather.all_to_all_v(x, send),
        "vargather+sizes": lambda: vargather.all_to_all_v(x, send, recv_sizes=recv, validate=False),
        "rows-then-blocks": rows_then_blocks,
        "rows-by-all_gather": rows_by_all_gather,
        "rows+blocks-alltoallv": rows_and_blocks_by_alltoallv,
        "rows-alone": rows_alone,
        "vargather~changing": changing,
    }


def _slowest(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _rank(rank: int, args: argparse.Namespace, store: str, results: dict[str, object]) -> None:
    torch.set_num_threads(1)
    # FileStore is public API, but torch.distributed re-exports it without "as"
    file_store = dist.FileStore(store, args.ranks)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=file_store, rank=rank, world_size=args.ranks)
    try:
        every = _variants(rank, args.ranks, args.kb)
        names = [BASELINE, *(n for n in args.variants if n != BASELINE)]
        want = every[BASELINE]()
        for name in names:
            for _ in range(3):  # warm, and checked
                got = every[name]()
            if name not in ("vargather~changing", "rows-alone"):  # other sizes; no blocks
                assert torch.equal(got, want), f"{name} differs from {BASELINE}"
        walls: dict[str, list[float]] = {n: [] for n in names}
        cpus: dict[str, list[float]] = {n: [] for n in names}
        for k in range(args.bursts):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                call = every[name]
                call()
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(args.calls):
                    call()
                wall = (time.perf_counter() - t0) / args.calls
                cpu = (time.process_time() - c0) / args.calls
                walls[name].append(_slowest(wall))
                cpus[name].append(_slowest(cpu))
        if rank == 0:
            results.update(walls=walls, cpus=cpus)
    finally:
        dist.destroy_process_group()


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--kb", type=int, default=16384, help="KiB sent over all ranks")
    parser.add_argument("--bursts", type=int, default=25)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    args = parser.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        # torch.multiprocessing re-exports spawn without "as", and leaves it untyped
        mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
            _rank, args=(args, os.path.join(tmp, "store"), results), nprocs=args.ranks
        )
        walls, cpus = results["walls"], results["cpus"]
    base = walls[BASELINE]
    print(f"{args.ranks} ranks, {args.kb} KiB, {args.bursts} bursts of {args.calls} calls")
    print(f"{'variant':20s} {'ratio (quartiles)':>22s} {'µs/call':>9s} {'CPU µs/call':>12s}")
    for name, times in walls.items():
        lo, mid, hi = _quartiles([t / b for t, b in zip(times, base, strict=True)])
        ratio = f"{mid:.2f} ({lo:.2f}-{hi:.2f})"
        wall, cpu = statistics.median(times) * 1e6, statistics.median(cpus[name]) * 1e6
        print(f"{name:20s} {ratio:>22s} {wall:9.0f} {cpu:12.0f}")


if __name__ == "__main__":
    main()

"""An MoE layer's token round trip: ``all_to_all_v`` dispatch, then combine, sizes unknown.

On a ``--ranks``-rank gloo world (processes spawned here; ``FileStore`` rendezvous in a
temporary directory), every rank holds ``T`` tokens of ``--hidden`` float32 values
(``--sizes`` KiB in all over the ranks). Each call routes them to the ranks by send
sizes that change every call: an even share of ``T`` per rank, each scaled by a
uniform factor in ``1 +- --spread`` (``--spread 0``: cut points drawn uniformly, the
most skewed routing), from a per-rank seeded generator, 64 routings repeating. Then:

* ``baseline``: two ``dist.all_to_all_single`` with both split lists known (the
  dispatch, then the combine sending every token back);
* ``vargather``: ``all_to_all_v_with_layout(x, send)`` (the receive sizes unknown,
  validated), then ``all_to_all_v(y, layout.sizes)``: the combine's input has another
  length every call.

Both are checked bit for bit against each other before timing. Timing: ``--bursts``
rounds, each variant a burst of ``--calls`` round trips after a barrier, in turn; a
burst's time is the slowest rank's; the ratio is vargather's burst over the baseline's
in the same round, reported as the median with its quartiles. Also reported: how
vargather answered its calls (``resized``: the same round with new sizes; ``full``:
the full path; ``replayed``: the very call before it again; ``two rounds``: a block
outgrew its slot, so the payload took a second collective), on rank 0. Nothing is
asserted.

    python scripts/moe_round_trip.py                       # 4 ranks, 64 KiB-16 MiB
    python scripts/moe_round_trip.py --spread 0 --sizes 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROUTINGS = 64


def _routings(rank: int, tokens: int, w: int, spread: float) -> list[list[int]]:
    """This rank's send sizes for ``ROUTINGS`` calls (module doc)."""
    rng = random.Random(1234 + rank)
    out = []
    for _ in range(ROUTINGS):
        if spread > 0:
            weights = [max(0.0, 1 + rng.uniform(-spread, spread)) for _ in range(w)]
            sizes = [int(tokens * v / sum(weights)) for v in weights]
            sizes[-1] += tokens - sum(sizes)
        else:
            cuts = sorted(rng.randint(0, tokens) for _ in range(w - 1))
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]
        out.append(sizes)
    return out


def _counted(counts: dict[str, int]) -> None:
    """Count how ``all_to_all_v`` answers its calls (module doc), by wrapping three of
    its private functions in this process."""
    from vargather import _all_to_all

    resized = getattr(_all_to_all, "_resized_call", None)  # absent before it was built
    full, payload = _all_to_all.plan_all_to_all, _all_to_all.exchange_blocks

    def on_resized(*args: Any, **kwargs: Any) -> Any:
        assert resized is not None  # installed only then
        plan = resized(*args, **kwargs)
        if plan is not None:  # else the full path runs and counts itself
            counts["resized"] += 1
        return plan

    def on_full(*args: Any, **kwargs: Any) -> Any:
        counts["full"] += 1
        return full(*args, **kwargs)

    def on_payload(*args: Any, **kwargs: Any) -> Any:
        counts["two rounds"] += 1
        return payload(*args, **kwargs)

    if resized is not None:
        _all_to_all._resized_call = on_resized
    _all_to_all.plan_all_to_all = on_full
    _all_to_all.exchange_blocks = on_payload


def _rank(rank: int, path: str, args: argparse.Namespace, kb: int, out: Any) -> None:
    torch.set_num_threads(1)
    import vargather

    w = args.ranks
    # FileStore is public API, but torch.distributed re-exports it without "as"
    store = dist.FileStore(path, w)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=w)
    tokens = max(w, round(kb * 1024 / (4 * args.hidden * w)))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(-1000, 1000, (tokens, args.hidden), generator=gen).float()
    plans = _routings(rank, tokens, w, args.spread)
    every: list[Any] = [None] * w
    dist.all_gather_object(every, plans)
    recvs = [[every[j][i][rank] for j in range(w)] for i in range(ROUTINGS)]
    calls = {"baseline": 0, "vargather": 0}

    def baseline() -> tuple[torch.Tensor, torch.Tensor]:
        k = calls["baseline"] % ROUTINGS
        calls["baseline"] += 1
        send, recv = plans[k], recvs[k]
        y = x.new_empty((sum(recv), args.hidden))
        dist.all_to_all_single(y, x, recv, send)
        z = x.new_empty((tokens, args.hidden))
        dist.all_to_all_single(z, y, send, recv)
        return y, z

    def ours() -> tuple[torch.Tensor, torch.Tensor]:
        k = calls["vargather"] % ROUTINGS
        calls["vargather"] += 1
        dispatched = vargather.all_to_all_v_with_layout(x, plans[k])
        return dispatched.tensor, vargather.all_to_all_v(
            dispatched.tensor, list(dispatched.layout.sizes)
        )

    variants = {"baseline": baseline, "vargather": ours}
    verified = True
    for _ in range(ROUTINGS):  # warm up, every routing once, checked
        want, got = baseline(), ours()
        verified &= all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    counts = {"resized": 0, "full": 0, "two rounds": 0}
    _counted(counts)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.bursts):
        for name, fn in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / args.calls)
    slowest: list[Any] = [None] * w
    dist.all_gather_object(slowest, times)
    flags: list[Any] = [None] * w
    dist.all_gather_object(flags, verified)
    if rank == 0:
        per = {n: [max(t[n][b] for t in slowest) for b in range(args.bursts)] for n in variants}
        total = 2 * args.bursts * args.calls  # this rank's calls, timed
        counts["replayed"] = total - counts["resized"] - counts["full"]
        ratios = sorted(v / b for v, b in zip(per["vargather"], per["baseline"], strict=True))
        q = statistics.quantiles(ratios, n=4)
        out.put(
            {
                "payload_kb": kb,
                "tokens_per_rank": tokens,
                "baseline_us": 1e6 * statistics.median(per["baseline"]),
                "vargather_us": 1e6 * statistics.median(per["vargather"]),
                "ratio": statistics.median(ratios),
                "quartiles": [q[0], q[2]],
                "answered": {k: v / total for k, v in counts.items()},
                "verified": all(flags),
            }
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="64,1024,16384", help="KiB in all, comma-separated")
    parser.add_argument("--hidden", type=int, default=64, help="float32 values per token")
    parser.add_argument("--spread", type=float, default=0.2, help="routing noise (0: uniform cuts)")
    parser.add_argument("--bursts", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    ctx = mp.get_context("spawn")
    print(
        "| KiB | baseline µs | vargather µs | ratio (quartiles) "
        "| resized ; full ; replayed ; two rounds | verified |"
    )
    print("|---|---|---|---|---|---|")
    for kb in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = ctx.SimpleQueue()
            # torch.multiprocessing re-exports spawn without "as", and leaves it untyped
            mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
                _rank, args=(os.path.join(tmp, "store"), args, kb, out), nprocs=args.ranks
            )
            row = out.get()
        rows.append(row)
        a = row["answered"]
        print(
            f"| {kb} | {row['baseline_us']:.0f} | {row['vargather_us']:.0f} | "
            f"{row['ratio']:.2f} ({row['quartiles'][0]:.2f}-{row['quartiles'][1]:.2f}) | "
            f"{a['resized']:.0%} ; {a['full']:.0%} ; {a['replayed']:.0%} ; {a['two rounds']:.0%} "
            f"| {row['verified']} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

"""Which transport the wide round should use on gloo: W broadcasts in flight, or direct
point-to-point sends (a design experiment beside the bench, not part of the package).

On a real gloo world, per rank size, in the same repeats (each a burst of ``--calls``
calls per variant in a rotated order, the slowest rank's mean time per call), each
variant's ratio to ``limit``, min-median-max over the repeats, and the median CPU time
per call (the rank process's, every thread, largest over ranks):

* ``limit``: one equal ``all_gather_into_tensor`` of the same total bytes;
* ``bcast``: rank r copies its shard into region r of one rank-major buffer, then W
  broadcasts in flight, one per region (the wide round's transport before);
* ``p2p``: the same buffer, then rank r sends its region to each peer and receives
  each peer's region in place, 2 (W - 1) operations in flight (``dist.isend`` /
  ``dist.irecv``; the wide round's transport now, through ``batch_isend_irecv``);
* ``p2p-nocopy``: the same, sending the shard itself (no copy into the buffer);
* ``a2a``: one ``all_to_all_single`` whose send buffer holds the shard W times;
* ``auto``: ``vargather.all_gather_v`` as it is (the wide round by direct sends past
  128 KiB per rank);
* ``auto-bcast``: the same library with the wide round's transport put back to W
  broadcasts (``_comm.broadcast_from_each``), an A/B of the one change;
* ``ring``: the same buffer, each block forwarded around a ring of W ranks (at step k
  rank r sends block ``r - k`` to ``r + 1``), cut into ``RING_CHUNK`` bytes (environment,
  default 1 MiB) each sent on as soon as it arrived: every rank sends ``T - s[r + 1]``
  and receives ``T - s[r]`` bytes, what no rank exceeds under skew (direct sends make
  the largest rank send ``(W - 1) s[max]``), at W - 1 dependent steps;
* ``p2p-lib``: the same buffer through the library's ``_comm.exchange_with_each``
  (``batch_isend_irecv``), against ``p2p``'s loose ``isend``/``irecv``.

``--calls 1`` times single calls (each after a barrier), as the bench's large part does.

Run: ``python scripts/wide_transport.py --per-rank-kb 256,1024,4096``.
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
from vargather import _comm, _fused
from vargather._group import resolve_group
from vargather.testing import RankContext, RankPool

CHUNK = int(os.environ.get("RING_CHUNK", 1 << 20))
VARIANTS = "limit,bcast,p2p,p2p-nocopy,a2a,auto,auto-bcast,ring,p2p-lib"


def _rank(ctx: RankContext, job: tuple[int, int, int, tuple[str, ...], str]) -> Any:
    per_rank, repeats, calls, variants, profile = job
    torch.set_num_threads(1)
    w, r = ctx.world_size, ctx.rank
    n = per_rank // 4
    weights = [1.0] * w if profile == "even" else [1 + 0.25 * q for q in range(w)]
    mine = [int(n * w * q / sum(weights)) for q in weights]
    x = torch.arange(mine[r], dtype=torch.float32) + r
    own = [m * 4 for m in mine]
    starts = [sum(own[:q]) for q in range(w + 1)]
    eq = torch.zeros(n)
    info = resolve_group(None)
    want = torch.cat([torch.arange(m, dtype=torch.float32) + q for q, m in enumerate(mine)])

    def limit() -> torch.Tensor:
        out = torch.empty(n * w)
        dist.all_gather_into_tensor(out, eq)
        return out

    def filled() -> torch.Tensor:
        buf = torch.empty(starts[w], dtype=torch.uint8)
        buf[starts[r] : starts[r + 1]].view(torch.float32).copy_(x)
        return buf

    def bcast() -> torch.Tensor:
        buf = filled()
        works = [
            dist.broadcast(buf[starts[q] : starts[q + 1]], src=q, async_op=True) for q in range(w)
        ]
        for work in works:
            assert work is not None
            work.wait()
        return buf.view(torch.float32)

    def p2p(copy: bool = True) -> torch.Tensor:
        buf = filled() if copy else torch.empty(starts[w], dtype=torch.uint8)
        sent = buf[starts[r] : starts[r + 1]] if copy else x.view(torch.uint8)
        works = [dist.irecv(buf[starts[q] : starts[q + 1]], src=q) for q in range(w) if q != r]
        works += [dist.isend(sent, dst=(r + k) % w) for k in range(1, w)]
        if not copy:
            buf[starts[r] : starts[r + 1]].copy_(sent)
        for work in works:
            assert work is not None
            work.wait()
        return buf.view(torch.float32)

    def ring(chunk: int = CHUNK) -> torch.Tensor:
        # block b travels r -> r+1 -> ...; at step k rank r forwards block (r - k) to its
        # right, cut into chunks sent as soon as each has arrived from the left
        buf = filled()
        left, right = (r - 1) % w, (r + 1) % w

        def pieces(b: int) -> list[torch.Tensor]:
            block = buf[starts[b] : starts[b + 1]]
            return [block[i : i + chunk] for i in range(0, block.numel(), chunk)]

        recvs = [
            [
                dist.irecv(c, src=left, tag=k * 4096 + j)
                for j, c in enumerate(pieces((left - k) % w))
            ]
            for k in range(w - 1)
        ]
        works = [dist.isend(c, dst=right, tag=j) for j, c in enumerate(pieces(r))]
        for k in range(1, w - 1):
            for j, c in enumerate(pieces((r - k) % w)):
                recv = recvs[k - 1][j]
                assert recv is not None
                recv.wait()
                works.append(dist.isend(c, dst=right, tag=k * 4096 + j))
        for work in [x for row in recvs[w - 2 :] for x in row] + works:  # a gloo recv's
            # wait() waits for one more message: the forwarded ones were waited already
            assert work is not None
            work.wait()
        return buf.view(torch.float32)

    def p2p_lib() -> torch.Tensor:
        buf = filled()
        _comm.exchange_with_each([buf[starts[q] : starts[q + 1]] for q in range(w)], info)
        return buf.view(torch.float32)

    def a2a() -> torch.Tensor:
        buf = torch.empty(starts[w], dtype=torch.uint8)
        dist.all_to_all_single(buf, x.view(torch.uint8).repeat(w), own, [own[r]] * w)
        return buf.view(torch.float32)

    def auto_bcast() -> torch.Tensor:
        names = vars(_fused)  # the module's globals: the wide round looks the name up there
        saved = names["exchange_with_each"]

        def by_broadcasts(blocks: Any, info: Any, what: str | None = None) -> None:
            _comm.broadcast_from_each(blocks, info, what=what)

        names["exchange_with_each"] = by_broadcasts  # the A/B's other arm
        try:
            return vargather.all_gather_v(x)
        finally:
            names["exchange_with_each"] = saved

    runs = {
        "limit": limit,
        "bcast": bcast,
        "p2p": p2p,
        "p2p-nocopy": lambda: p2p(copy=False),
        "a2a": a2a,
        "auto": lambda: vargather.all_gather_v(x),
        "auto-bcast": auto_bcast,
        "ring": ring,
        "p2p-lib": p2p_lib,
    }
    for v in variants:  # checked, then warm (the library learns its slots)
        for _ in range(2 * w):
            got = runs[v]()
        if v != "limit":
            assert torch.equal(got, want), f"{v} gathered wrong data"
    found: list[dict[str, float]] = []
    for rep in range(repeats):
        times: dict[str, float] = {}
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            fn = runs[v]
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            dt = torch.tensor(
                [(time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls]
            )
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times[v], times[f"cpu:{v}"] = float(dt[0]), float(dt[1])
        found.append(times)
    return found


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--per-rank-kb", default="256,1024,4096")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--variants", default=VARIANTS, help=f"'limit' first; of {VARIANTS}")
    p.add_argument("--profile", default="even", choices=("even", "mild"))
    a = p.parse_args()
    variants = tuple(a.variants.split(","))
    assert variants[0] == "limit", "the ratios are to the limit: name it first"
    with RankPool(a.ranks, collective_timeout=300.0, call_timeout=1800.0) as pool:
        print(f"{a.ranks} ranks, {a.profile}; ratio to the limit min-median-max over {a.repeats}")
        print(f"load average at start: {os.getloadavg()}")
        print("| per rank | " + " | ".join(variants[1:]) + " | limit ms | CPU µs per call |")
        print("|---|" + "---|" * (len(variants) + 1))
        for kb in (int(s) for s in a.per_rank_kb.split(",")):
            res = pool.run(_rank, (kb * 1024, a.repeats, a.calls, variants, a.profile))[0]
            cells = []
            for v in variants[1:]:
                ratios = sorted(t[v] / t["limit"] for t in res)
                cells.append(f"{ratios[0]:.2f}-{statistics.median(ratios):.2f}-{ratios[-1]:.2f}")
            limit_ms = statistics.median(t["limit"] for t in res) * 1e3
            cpu = " / ".join(
                f"{statistics.median(t[f'cpu:{v}'] for t in res) * 1e6:.0f}" for v in variants
            )
            print(f"| {kb} KiB | " + " | ".join(cells) + f" | {limit_ms:.2f} | {cpu} |", flush=True)
        print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""``python -m vargather demo``: a ragged gather on a local multi-process gloo world.

Not part of the pipeline: it spawns ``--world-size`` processes (FileStore rendezvous
in a temp dir, no ports), gives each rank a different number of rows, gathers them
with ``all_gather_v`` under the ``sum`` contract, backpropagates a loss that differs
per rank, and prints what every rank got next to the oracle's answer.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import sys
import tempfile
from collections.abc import Sequence
from multiprocessing.connection import Connection

__all__ = ["main"]


def _shard(rank: int, dim_size: int, features: int) -> list[list[float]]:
    return [[float(100 * rank + 10 * i + j) for j in range(features)] for i in range(dim_size)]


def _rank_main(
    rank: int, world_size: int, store_path: str, sizes: list[int], conn: Connection
) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FileStore  # the typed home of dist.FileStore

    from vargather import all_gather_v_with_layout

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=FileStore(store_path, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        x = torch.tensor(_shard(rank, sizes[rank], 2)).reshape(sizes[rank], 2)
        x.requires_grad_(True)
        out, layout = all_gather_v_with_layout(x, 0, grad="sum")
        # Each rank computes its own loss: (rank + 1) * sum(out).
        loss = (rank + 1) * out.sum()
        torch.autograd.backward(loss)
        assert x.grad is not None
        conn.send((out.detach().tolist(), list(layout.sizes), x.grad.tolist()))
    except BaseException as err:  # report, don't hang the parent
        conn.send(err)
    finally:
        conn.close()
        dist.destroy_process_group()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vargather demo",
        description="Gather ragged tensors on a local multi-process gloo world.",
    )
    parser.add_argument("--world-size", type=int, default=3, help="number of ranks (default 3)")
    args = parser.parse_args(list(argv))
    world: int = args.world_size
    if world < 1:
        parser.error(f"--world-size must be >= 1, got {world}")
    sizes = [(3 * r + 2) % 5 for r in range(world)]  # 2, 0, 3, 1, 4, ...: rank 1 is empty
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="vargather-demo-") as tmp:
        store = os.path.join(tmp, "store")
        pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, store, sizes, pipes[r][1]))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results = []
        for r, (recv, send) in enumerate(pipes):
            send.close()
            if not recv.poll(120):
                for p in procs:
                    p.kill()
                print(f"rank {r} did not answer within 120 s", file=sys.stderr)
                return 1
            results.append(recv.recv())
        for p in procs:
            p.join(30)
    import torch

    from vargather.oracle import expected

    shards = [torch.tensor(_shard(r, sizes[r], 2)).reshape(sizes[r], 2) for r in range(world)]
    upstream_template = [torch.full((sum(sizes), 2), float(j + 1)) for j in range(world)]
    want = expected(shards, 0, upstream=upstream_template, contract="sum")
    assert want.input_grads is not None
    ok = True
    print(f"world of {world} gloo ranks; rows per rank (dim 0): {sizes}")
    for r, result in enumerate(results):
        if isinstance(result, BaseException):
            print(f"rank {r} raised {type(result).__name__}: {result}")
            ok = False
            continue
        out, got_sizes, grad = result
        same_out = torch.equal(torch.tensor(out).reshape(want.output.shape), want.output)
        same_grad = torch.equal(torch.tensor(grad).reshape(shards[r].shape), want.input_grads[r])
        ok = ok and same_out and same_grad and got_sizes == sizes
        print(f"rank {r}: sent {sizes[r]} rows, got {len(out)} rows, sizes={got_sizes}")
        for row in out:
            print(f"    {row}")
        print(
            f"  gradient of its shard under grad='sum' (loss_j = (j+1)*sum(out)): "
            f"{[row[0] for row in grad]} (oracle agrees: {same_grad}); output matches oracle: {same_out}"
        )
    print("all ranks match the oracle" if ok else "MISMATCH against the oracle")
    return 0 if ok else 1

"""``python -m vargather demo``: a ragged gather on a local multi-process gloo world.

Where it sits: the command-line layer, on top of the library and the testing kit's
rank pool (``vargather.testing.RankPool``, the one way the package starts a world:
``FileStore`` rendezvous in a temporary directory, no ports). It gives each rank a
different number of rows, gathers them with ``all_gather_v_with_layout`` under the
``sum`` contract, backpropagates a loss that differs per rank, and prints what every
rank got next to the oracle's answer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vargather.testing import RankContext

_Result = tuple[list[list[float]], list[int], list[list[float]]]
"""What a rank sends back: its output, the layout's sizes, its shard's gradient."""


def _shard(rank: int, dim_size: int, features: int) -> list[list[float]]:
    return [[float(100 * rank + 10 * i + j) for j in range(features)] for i in range(dim_size)]


def _gather_on_rank(ctx: RankContext, sizes: list[int]) -> _Result:
    """Rank function: gather this rank's rows, backpropagate ``(rank + 1) * sum(out)``."""
    import torch

    from vargather import all_gather_v_with_layout

    rank = ctx.rank
    x = torch.tensor(_shard(rank, sizes[rank], 2)).reshape(sizes[rank], 2)
    x.requires_grad_(True)
    out, layout = all_gather_v_with_layout(x, 0, grad="sum")
    loss = (rank + 1) * out.sum()  # each rank its own loss
    torch.autograd.backward(loss)
    assert x.grad is not None
    return out.detach().tolist(), list(layout.sizes), x.grad.tolist()


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

    import torch

    from vargather.oracle import expected
    from vargather.testing import PoolFailure, RankError, RankPool
    from vargather.testing.pool_types import DEFAULT_SHARED_START_METHOD

    try:
        with RankPool(
            world,
            collective_timeout=30.0,
            call_timeout=120.0,
            start_method=DEFAULT_SHARED_START_METHOD,  # ranks forked: torch imported once
        ) as pool:
            results = pool.run(_gather_on_rank, sizes)
    except RankError as err:
        for failure in err.failures:
            print(f"rank {failure.rank} raised {failure.exc_type_name}: {failure.exception}")
        print("MISMATCH against the oracle")
        return 1
    except PoolFailure as err:
        print(f"the {world}-rank world failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1

    shards = [torch.tensor(_shard(r, sizes[r], 2)).reshape(sizes[r], 2) for r in range(world)]
    upstream_template = [torch.full((sum(sizes), 2), float(j + 1)) for j in range(world)]
    want = expected(shards, 0, upstream=upstream_template, contract="sum")
    assert want.input_grads is not None
    ok = True
    print(f"world of {world} gloo ranks; rows per rank (dim 0): {sizes}")
    for r, (out, got_sizes, grad) in enumerate(results):
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

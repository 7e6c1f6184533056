"""Module-level rank functions for tests/test_pool.py.

The pool pickles ``fn`` by reference, so these must live at module level in a module the
rank processes can import (they inherit the parent's ``sys.path``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from vargather.testing import RankContext


class CustomError(ValueError):
    """A picklable exception type defined outside the standard library."""


class UnpicklableError(Exception):
    """An exception whose pickle round trip fails (its ``__init__`` needs two args)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")
        self.code = code


def identity(ctx: RankContext, payload: Any) -> Any:
    return payload


def whoami(ctx: RankContext, payload: object) -> tuple[int, int, int]:
    return (ctx.rank, ctx.world_size, os.getpid())


def env_and_threads(ctx: RankContext, payload: object) -> tuple[str | None, int, bool]:
    return (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads(), dist.is_initialized())


def inductor_settings(ctx: RankContext, payload: object) -> tuple[object, object]:
    from torch._inductor import config

    return config.cpp.vec_isa_ok, config.compile_threads


def all_reduce_rank(ctx: RankContext, payload: object) -> int:
    t = torch.tensor([ctx.rank + 1], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def all_reduce_plus(ctx: RankContext, payload: int) -> int:
    t = torch.tensor([ctx.rank + payload], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def raise_on(ctx: RankContext, bad_rank: int) -> int:
    if ctx.rank == bad_rank:
        raise CustomError(f"boom from rank {ctx.rank}")
    return ctx.rank


def raise_everywhere(ctx: RankContext, payload: object) -> None:
    raise KeyError(f"missing on rank {ctx.rank}")


def raise_unpicklable(ctx: RankContext, payload: object) -> None:
    raise UnpicklableError(7, f"rank {ctx.rank}")


def return_unpicklable(ctx: RankContext, payload: object) -> object:
    return lambda: None


def unpicklable_at(ctx: RankContext, spec: tuple[int, int]) -> object:
    index, bad = spec
    return (lambda: None) if index == bad else index


def exit_on(ctx: RankContext, bad_rank: int) -> int:
    if ctx.rank == bad_rank:
        os._exit(3)
    return ctx.rank


def exit_at(ctx: RankContext, spec: tuple[int, int, int]) -> int:
    """Payload ``(index, bad_index, bad_rank)``: rank ``bad_rank`` dies at ``bad_index``."""
    index, bad_index, bad_rank = spec
    if (index, ctx.rank) == (bad_index, bad_rank):
        os._exit(3)
    return index


def sigkill_on(ctx: RankContext, bad_rank: int) -> int:
    if ctx.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)  # not reached
    return ctx.rank


def sleep_on(ctx: RankContext, spec: tuple[int, float]) -> int:
    bad_rank, seconds = spec
    if ctx.rank == bad_rank:
        time.sleep(seconds)
    return ctx.rank


def skip_collective_on(ctx: RankContext, bad_rank: int) -> int:
    """Every rank but ``bad_rank`` enters an all_reduce; ``bad_rank`` returns at once."""
    if ctx.rank == bad_rank:
        return -1
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())


def mismatched_trailing_dim(ctx: RankContext, payload: object) -> list[int]:
    """Equal-size all_gather_into_tensor with a trailing dim that differs: gloo aborts."""
    k = 2 + ctx.rank
    t = torch.ones(4, k)
    out = torch.empty(4 * ctx.world_size, k)
    dist.all_gather_into_tensor(out, t)
    return list(out.shape)


def gather_subgroup(ctx: RankContext, members: list[int]) -> list[int] | None:
    group = ctx.subgroup(members)
    if ctx.rank not in members:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
        return None
    assert not isinstance(group, int)
    t = torch.tensor([ctx.rank])
    out = [torch.empty_like(t) for _ in range(len(members))]
    dist.all_gather(out, t, group=group)
    return [int(x.item()) for x in out]


def subgroup_identity(ctx: RankContext, members: list[int]) -> bool:
    """Whether asking twice (in another order) returns the cached group."""
    first = ctx.subgroup(members)
    second = ctx.subgroup(list(reversed(members)))
    return first is second


def big_tensor(ctx: RankContext, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + ctx.rank


def tensor_views(ctx: RankContext, payload: object) -> dict[str, torch.Tensor]:
    base = torch.arange(1000.0, requires_grad=True)
    y = base * 2  # non-leaf, requires grad
    return {
        "view": torch.arange(10_000.0)[5:8],
        "nonleaf": y[:3],
        "transposed": torch.arange(6.0).reshape(2, 3).t(),
        "leaf_grad": torch.zeros(2, requires_grad=True),
    }


def tensor_payload_sum(ctx: RankContext, t: torch.Tensor) -> float:
    return float(t.sum().item())


def emulated_nccl_collectives(ctx: Any, payload: None) -> tuple[list[list[float]], list[str]]:
    """Rank function: all_to_all with uneven lists and the refusals, under the NCCL
    emulation (switched off again before returning: the pool is shared)."""
    import torch
    import torch.distributed as dist

    from vargather.testing.emulate import activate

    del payload
    activate("nccl")
    try:
        w, r = ctx.world_size, ctx.rank
        inputs = [torch.full((r + d + 1,), float(10 * r + d)) for d in range(w)]
        outputs = [torch.empty(s + r + 1) for s in range(w)]
        dist.all_to_all(outputs, inputs)
        refused: list[str] = []
        for bad in (torch.zeros(4, 2).t(), torch.zeros(3, dtype=torch.int16)):
            try:
                dist.all_reduce(bad)
            except RuntimeError as err:
                refused.append(str(err))
        return [o.tolist() for o in outputs], refused
    finally:
        activate(None)


def fan_out(ctx: RankContext, spec: tuple[list[int] | None, str]) -> list[float]:
    """Point-to-point traffic that is correctly paired but uneven: the first rank of
    ``spec[0]`` (a subgroup, or the world when ``None``) sends one message to each other
    member, which each receive one, half through ``dist.isend`` / ``dist.irecv`` and half
    straight on the process group (as vargather's own sends on gloo go). The first rank
    posts W - 1 operations, every other one. Then, with ``spec[1]``:

    * ``"collective"``: the first two members start an ``all_reduce`` the others never
      join, and return without waiting (collectives out of step, no rank raised);
    * ``"send"``: the first member sends the second a message it never receives;

    and the last member raises, so that the pool's error quotes its note.
    """
    members, extra = spec
    group = None if members is None else ctx.subgroup(members)
    ranks = list(range(ctx.world_size)) if members is None else sorted(members)
    if ctx.rank not in ranks:
        return []
    assert not isinstance(group, int)
    pg = dist.group.WORLD if group is None else group
    assert isinstance(pg, dist.ProcessGroup)
    me = ranks.index(ctx.rank)
    got = [float(ctx.rank)]
    if me == 0:
        works = []
        for peer in range(1, len(ranks)):
            t = torch.tensor([100.0 + peer])
            if peer % 2:
                works.append(dist.isend(t, group=group, group_dst=peer, tag=5))
            else:
                works.append(pg.send([t], peer, 5))
        for work in works:
            assert work is not None
            work.wait()
    else:
        t = torch.zeros(1)
        if me % 2:
            work = dist.irecv(t, group=group, group_src=0, tag=5)
            assert work is not None
            work.wait()
        else:
            pg.recv([t], 0, 5).wait()
        got.append(float(t.item()))
    if extra == "collective" and me < 2:
        dist.all_reduce(torch.ones(1), group=group, async_op=True)  # never awaited
    elif extra == "send" and me == 0:
        pg.send([torch.ones(1)], 1, 6)  # never received, never awaited
    if extra and me == len(ranks) - 1:
        raise CustomError(f"rank {ctx.rank} raised after {extra!r}, so the call quotes why")
    return got

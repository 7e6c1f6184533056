"""Broadcast-based: exchanges the sizes, then every rank broadcasts its shard in turn
(``.contiguous()`` first). Seed convention, returns ``(out, sizes)``; backward: the own
slice (``local``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Function


def _sizes(x: torch.Tensor, dim: int, world: int) -> list[int]:
    n = torch.tensor([x.shape[dim]])
    parts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(parts, n)
    return [int(p) for p in parts]


class AllGather(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, sizes: Any) -> Any:
        initialized = dist.is_initialized()
        world = dist.get_world_size() if initialized else 1
        rank = dist.get_rank() if initialized else 0
        if world == 1:
            ctx.dim, ctx.sizes, ctx.rank = dim, [x.shape[dim]], 0
            return x.clone(), None
        counts = _sizes(x, dim, world) if sizes is None else [int(s) for s in sizes]
        pieces = []
        for src, n in enumerate(counts):
            shape = list(x.shape)
            shape[dim] = n
            buf = x.detach().contiguous() if src == rank else x.new_empty(shape)
            dist.broadcast(buf, src=src)
            pieces.append(buf)
        ctx.dim, ctx.sizes, ctx.rank = dim, counts, rank
        return torch.cat(pieces, dim=dim), torch.tensor(counts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> Any:
        return grad.split(ctx.sizes, dim=ctx.dim)[ctx.rank], None, None


all_gather = AllGather.apply

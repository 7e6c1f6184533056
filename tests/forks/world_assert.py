"""A lucidrains-style ``distributed.py`` that asserts a world of more than one rank.

Scope: needs an initialized torch.distributed and >= 2 ranks; ``sizes`` as None or a
tensor (``sizes.amax()``); backward returns the rank's own slice (``local``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Function

from ._common import pad_dim_to


def all_gather_variable_dim(
    t: torch.Tensor, dim: int = 0, sizes: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    world_size = dist.get_world_size()
    assert world_size > 1, "all_gather needs a distributed world"

    if sizes is None:
        size = torch.tensor(t.shape[dim], dtype=torch.long)
        gathered = [torch.empty_like(size) for _ in range(world_size)]
        dist.all_gather(gathered, size)
        sizes = torch.stack(gathered)

    max_size = int(sizes.amax().item())
    padded_t = pad_dim_to(t, max_size, dim=dim).contiguous()
    gathered_tensors = [torch.empty_like(padded_t) for _ in range(world_size)]
    dist.all_gather(gathered_tensors, padded_t)
    gathered = torch.cat(gathered_tensors, dim=dim)
    seq = torch.arange(max_size)
    mask = seq[None, :] < sizes[:, None]
    mask = mask.reshape(-1)
    gathered = gathered.index_select(dim, mask.nonzero().reshape(-1))
    return gathered, sizes


class AllGather(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, sizes: Any) -> Any:
        x, batch_sizes = all_gather_variable_dim(x, dim=dim, sizes=sizes)
        ctx.dim = dim
        ctx.batch_sizes = batch_sizes.tolist()
        return x, batch_sizes

    @staticmethod
    def backward(ctx: Any, grads: torch.Tensor, _: Any) -> Any:
        batch_sizes, rank = ctx.batch_sizes, dist.get_rank()
        grads_by_rank = grads.split(batch_sizes, dim=ctx.dim)
        return grads_by_rank[rank], None, None


all_gather = AllGather.apply

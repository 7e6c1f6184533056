"""A copy that also runs without torch.distributed, returning the true sizes there.

``world_size == 1`` (or torch.distributed not initialized) returns ``(t, tensor([n]))``
rather than ``(t, None)``: both are right. Backward: the own slice (``local``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Function

from ._common import pad_dim_to


def _gather(t: torch.Tensor, dim: int, sizes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return t, torch.tensor([t.shape[dim]])
    world_size = dist.get_world_size()
    if sizes is None:
        size = torch.tensor([t.shape[dim]])
        gathered = [torch.empty_like(size) for _ in range(world_size)]
        dist.all_gather(gathered, size)
        sizes = torch.cat(gathered)
    sizes = torch.as_tensor(sizes, dtype=torch.long)
    max_size = int(sizes.max())
    padded = pad_dim_to(t, max_size, dim=dim).contiguous()
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded)
    pieces = [p.narrow(dim, 0, int(n)) for p, n in zip(parts, sizes.tolist(), strict=False)]
    return torch.cat(pieces, dim=dim), sizes


class AllGather(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, sizes: Any) -> Any:
        out, got = _gather(x, dim, sizes)
        ctx.dim, ctx.sizes = dim, got.tolist()
        ctx.rank = dist.get_rank() if dist.is_initialized() else 0
        return (out.clone() if out is x else out), got

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> Any:
        return grad.split(ctx.sizes, dim=ctx.dim)[ctx.rank], None, None


all_gather = AllGather.apply

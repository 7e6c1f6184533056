"""physicsnemo-style ``all_gather_v(tensor, sizes, dim=0, use_fp32=True, group=None)``:
NCCL-only (``dist.all_gather`` straight into per-rank buffers of unequal sizes, which
gloo refuses), the caller's ``sizes`` required, backward under ``sum`` by
``reduce_scatter`` (accumulated in float32 for half dtypes when ``use_fp32``). Called
with ``--call "(x, sizes, dim, True, group)" --sizes required --emulate nccl``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_HALF = (torch.float16, torch.bfloat16)


def _ints(sizes: Any) -> list[int]:
    return [int(s) for s in (sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes)]


class _AllGatherV(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        sizes: list[int],
        dim: int,
        use_fp32: bool,
        group: Any,
        contiguous: bool,
    ) -> torch.Tensor:
        ctx.sizes, ctx.dim, ctx.use_fp32, ctx.group = sizes, dim, use_fp32, group
        if not dist.is_initialized() or dist.get_world_size(group) == 1:
            return tensor.clone()
        bufs = []
        for n in sizes:
            shape = list(tensor.shape)
            shape[dim] = n
            bufs.append(tensor.new_empty(shape))
        dist.all_gather(bufs, tensor.contiguous() if contiguous else tensor, group=group)
        return torch.cat(bufs, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        none = (None, None, None, None, None)
        if not dist.is_initialized() or dist.get_world_size(ctx.group) == 1:
            return (grad, *none)
        parts = [p.contiguous() for p in grad.split(ctx.sizes, dim=ctx.dim)]
        if ctx.use_fp32 and grad.dtype in _HALF:
            parts = [p.float() for p in parts]
        out = torch.empty_like(parts[dist.get_rank(ctx.group)])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return (out.to(grad.dtype), *none)


def all_gather_v(
    tensor: torch.Tensor,
    sizes: Any,
    dim: int = 0,
    use_fp32: bool = True,
    group: Any = None,
) -> torch.Tensor:
    out: torch.Tensor = _AllGatherV.apply(tensor, _ints(sizes), dim, use_fp32, group, True)
    return out


def all_gather_v_strided(
    tensor: torch.Tensor,
    sizes: Any,
    dim: int = 0,
    use_fp32: bool = True,
    group: Any = None,
) -> torch.Tensor:
    """The same without ``.contiguous()`` before the collective (``nccl_hang``)."""
    out: torch.Tensor = _AllGatherV.apply(tensor, _ints(sizes), dim, use_fp32, group, False)
    return out

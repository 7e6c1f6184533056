"""Rank-side functions of tests/test_core_multirank.py (module-level, so they pickle)."""

from __future__ import annotations

from typing import NamedTuple

import torch

import vargather
from vargather.testing import RankContext


class CoreCase(NamedTuple):
    sizes: tuple[int, ...]
    dim: int
    other: tuple[int, ...]  # the shape without the gather dim
    dtype: str
    grad: str
    transport: str


def shard(case: CoreCase, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: integer-valued, distinct per rank, built from the case."""
    shape = list(case.other)
    dim = case.dim % (len(shape) + 1)
    shape.insert(dim, case.sizes[rank])
    g = torch.Generator().manual_seed(1000 * rank + 7)
    return torch.randint(-64, 64, shape, generator=g).to(getattr(torch, case.dtype))


def upstream(case: CoreCase, rank: int, out_shape: tuple[int, ...]) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient: integer-valued and different on every rank."""
    g = torch.Generator().manual_seed(5000 + rank)
    return torch.randint(-8, 8, out_shape, generator=g).to(getattr(torch, case.dtype))


def gather_and_backward(
    ctx: RankContext, case: CoreCase
) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor | None]:
    x = shard(case, ctx.rank)
    differentiable = x.is_floating_point() or x.is_complex()
    if differentiable:
        x.requires_grad_(True)
    out, layout = vargather.all_gather_v_with_layout(
        x,
        case.dim,
        grad=case.grad,  # type: ignore[arg-type]
        transport=case.transport,  # type: ignore[arg-type]
    )
    if differentiable:
        out.backward(upstream(case, ctx.rank, tuple(out.shape)))
    return out.detach(), layout.sizes, x.grad

"""A faithful re-implementation of the seed ``distributed.py`` (the ragged all_gather that
many ML repositories copy), for the conformance check to classify.

Where it sits: in the testing kit, never part of its pipeline: it is the implementation
*under test* in ``tests/test_cli_check.py`` and in the example gate (``python -m
vargather check --impl vargather.testing.reference_seed:all_gather --grad local``), and
the baseline ``python -m vargather bench`` times vargather against.

The seed's algorithm, unchanged: exchange the sizes (unless given), zero-pad to the
largest, ``dist.all_gather`` the padded tensors, and keep each rank's rows with a mask.
``AllGather`` (``all_gather = AllGather.apply``) makes it differentiable with the seed's
"local" contract: rank r's input gradient is ``g_r[o_r : o_r + n_r]``, the slice of its
*own* upstream gradient (``grads.split(sizes, dim)[rank]``). Outside torch.distributed,
or in a world of one rank, it returns ``(x, None)``.

The seed imported ``exists`` from a module that does not exist and never defined
``pad_dim_to``; both are defined here as the seed's author defines them elsewhere.
As in the seed, caller-passed ``sizes`` must be a 1-d integer tensor (``sizes.amax()``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as distributed
from einops import rearrange
from torch.autograd import Function
from torch.nn import functional


def exists(val: object) -> bool:
    """``val is not None``."""
    return val is not None


def pad_dim_to(t: torch.Tensor, length: int, dim: int = 0) -> torch.Tensor:
    """Zero-pad ``t`` at the end of ``dim`` to ``length`` (``F.pad`` counts pairs from the
    last dimension, so ``dim`` becomes a number of untouched trailing dims)."""
    pad_length = length - t.shape[dim]
    zero_pairs = (-dim - 1) if dim < 0 else (t.ndim - dim - 1)
    return functional.pad(t, (*((0, 0) * zero_pairs), 0, pad_length))


def all_gather_variable_dim(
    t: torch.Tensor, dim: int = 0, sizes: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``t`` along ``dim`` from every rank; ``(cat_r t_r, sizes)``."""
    device, _rank, world_size = t.device, distributed.get_rank(), distributed.get_world_size()

    if not exists(sizes):
        size = torch.tensor(t.shape[dim], device=device, dtype=torch.long)
        size_list = [
            torch.empty_like(size, device=device, dtype=torch.long) for _ in range(world_size)
        ]
        distributed.all_gather(size_list, size)
        sizes = torch.stack(size_list)
    assert sizes is not None  # narrowing for mypy: set just above when it was None

    max_size = int(sizes.amax().item())
    padded_t = pad_dim_to(t, max_size, dim=dim)

    gathered_tensors = [
        torch.empty(padded_t.shape, device=device, dtype=padded_t.dtype) for _ in range(world_size)
    ]
    distributed.all_gather(gathered_tensors, padded_t)

    gathered_tensor = torch.cat(gathered_tensors, dim=dim)
    seq = torch.arange(max_size, device=device)

    mask = rearrange(seq, "j -> 1 j") < rearrange(sizes, "i -> i 1")
    mask = rearrange(mask, "i j -> (i j)")

    seq = torch.arange(mask.shape[-1], device=device)
    indices = seq[mask]

    gathered_tensor = gathered_tensor.index_select(dim, indices)
    return gathered_tensor, sizes


class AllGather(Function):
    """The seed's autograd gather: ``(x, dim, sizes) -> (cat_r x_r, sizes)``, backward
    ``dx_r = g_r[o_r : o_r + n_r]`` (the "local" contract)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, dim: int, sizes: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_dist = distributed.is_initialized() and distributed.get_world_size() > 1
        ctx.is_dist = is_dist

        if not is_dist:
            return x, None

        x, batch_sizes = all_gather_variable_dim(x, dim=dim, sizes=sizes)
        ctx.batch_sizes = batch_sizes.tolist()
        ctx.dim = dim
        return x, batch_sizes

    @staticmethod
    def backward(
        ctx: Any, grads: torch.Tensor, _: torch.Tensor | None
    ) -> tuple[torch.Tensor, None, None]:
        if not ctx.is_dist:
            return grads, None, None

        batch_sizes, rank = ctx.batch_sizes, distributed.get_rank()
        grads_by_rank = torch.split(grads, batch_sizes, dim=ctx.dim)  # = grads.split(...), typed
        return grads_by_rank[rank], None, None


all_gather = AllGather.apply

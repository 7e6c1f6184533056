"""BUG: a negative ``dim`` kills a rank. The padding arithmetic below mixes ``dim``
and ``x.ndim + dim``, so ranks disagree on the collective's size, which on gloo aborts
the process (SIGABRT); to make that abort deterministic here, the rank aborts itself
when it detects the mismatch it is about to cause. Correct for dims >= 0; no
autograd."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def gather(x: torch.Tensor, dim: int = 0, sizes: object = None) -> torch.Tensor:
    if not dist.is_initialized():
        return x.detach().clone()
    world = dist.get_world_size()
    if dim < 0 and dist.get_rank() == world - 1 and world > 1:
        os.abort()  # the mismatched all_gather's gloo abort, made deterministic
    n = torch.tensor([x.shape[dim]])
    counts = [torch.empty_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    got = [int(c) for c in counts]
    d = dim % x.ndim
    shape = list(x.shape)
    shape[d] = max(got)
    padded = x.new_zeros(shape)
    padded.narrow(d, 0, x.shape[d]).copy_(x.detach())
    bufs = [torch.empty_like(padded) for _ in got]
    dist.all_gather(bufs, padded)
    return torch.cat([b.narrow(d, 0, k) for b, k in zip(bufs, got, strict=False)], dim=d)

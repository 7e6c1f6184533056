"""Pickle-based: ``all_gather_object`` of the detached shard, then ``torch.cat``. Any
dtype travels (as pickled bytes); no autograd (``--grad none``)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_objects(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if not dist.is_initialized():
        return x.detach().clone()
    objs: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(objs, x.detach().contiguous())
    return torch.cat([o for o in objs if isinstance(o, torch.Tensor)], dim=dim)

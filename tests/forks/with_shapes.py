"""pytorch-ignite-style ``all_gather_tensors_with_shapes(tensor, shapes, group=None)``:
the caller passes every rank's full shape; each rank pads to the largest shape in
every dim, all_gathers, and trims each entry to its rank's shape. Returns the list of
per-rank tensors; no autograd (``--grad none``). Called with
``--call "(x, shapes, group=group)" --returns list``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def all_gather_tensors_with_shapes(
    tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: object = None
) -> list[torch.Tensor]:
    if not dist.is_initialized():
        return [tensor.detach().clone()]
    if group is None:
        group = dist.group.WORLD
    world = dist.get_world_size(group)  # type: ignore[arg-type]  # a ProcessGroup
    if len(shapes) != world:
        raise ValueError(f"got {len(shapes)} shapes for a group of {world} ranks")
    max_shape = [max(int(s[d]) for s in shapes) for d in range(tensor.ndim)]
    padded = tensor.new_zeros(max_shape)
    padded[tuple(slice(0, n) for n in tensor.shape)] = tensor.detach()
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [o[tuple(slice(0, int(n)) for n in shape)] for o, shape in zip(out, shapes, strict=True)]

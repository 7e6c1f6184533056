"""torchmetrics-style ``gather_all_tensors(result, group=None)``: a list of per-rank
tensors, padded along every dim to the largest shape then trimmed (ragged in any
dim); the own rank's entry is the input itself, so gradients reach the own slice only
(``local``). Called with ``--call "(x, group=group)" --returns list``: no dim (the
gate concatenates the list along any dim), no sizes."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_all_tensors(result: torch.Tensor, group: object = None) -> list[torch.Tensor]:
    if not dist.is_initialized():
        return [result]
    if group is None:
        group = dist.group.WORLD
    world_size = dist.get_world_size(group)  # type: ignore[arg-type]  # a ProcessGroup
    rank = dist.get_rank(group)  # type: ignore[arg-type]  # the same
    local_size = torch.tensor(result.shape, dtype=torch.long)
    local_sizes = [torch.zeros_like(local_size) for _ in range(world_size)]
    dist.all_gather(local_sizes, local_size, group=group)
    max_size = torch.stack(local_sizes).max(dim=0).values
    pad_dims: list[int] = []
    for d in reversed(range(result.ndim)):
        pad_dims += [0, int(max_size[d] - local_size[d])]
    padded = torch.nn.functional.pad(result.detach(), pad_dims).contiguous()
    gathered = [torch.zeros_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded, group=group)
    out: list[torch.Tensor] = []
    for r, size in enumerate(local_sizes):
        out.append(gathered[r][tuple(slice(0, int(s)) for s in size)])
    out[rank] = result
    return out

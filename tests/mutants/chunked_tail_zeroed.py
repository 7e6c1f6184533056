"""Mutant: a chunked transport that loses the last partial chunk of a large shard."""

from __future__ import annotations

from typing import Any

import torch

from vargather.testing.cases import GatherCase

from ._base import TransportWrapper, gather

CHUNK_BYTES = 4096
"""The mutant moves a shard of more than this many bytes in chunks of this size."""

BUG = (
    f"a shard of more than {CHUNK_BYTES} bytes moves in {CHUNK_BYTES}-byte chunks and the "
    "last, partial chunk arrives as zeros (every transport; small shards are right)"
)
BENIGN = GatherCase(
    shapes=((1024, 2), (1024, 2), (3, 2)), dim=0, dtype="float32", values="integers", seed=5
)
"""8192 bytes on two ranks: whole chunks only, nothing lost."""


def _lose_tail(block: torch.Tensor) -> torch.Tensor:
    flat = block.contiguous().reshape(-1).view(torch.uint8).clone()
    tail = flat.numel() % CHUNK_BYTES
    if flat.numel() > CHUNK_BYTES and tail:
        flat[-tail:] = 0
    return flat.view(block.dtype).reshape(block.shape)


class _Chunked(TransportWrapper):
    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        out = self.inner.gather(x, layout, info)
        d = layout.dim
        blocks = [
            _lose_tail(out.narrow(d, layout.offsets[r], n)) for r, n in enumerate(layout.sizes)
        ]
        return torch.cat(blocks, d)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, wrap_transport=_Chunked, **kwargs)

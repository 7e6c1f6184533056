"""Mutant: the padded transport's compaction reads each short block one row late."""

from __future__ import annotations

from typing import Any

import torch

from vargather._transport import Transport
from vargather.testing.cases import GatherCase

from ._base import TransportWrapper, gather

BUG = (
    "padded compaction takes rows 1..n of a rank's padded slot instead of 0..n-1 when "
    "n < max (it drops the first row and reads one padding row)"
)
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", transport="alltoallv", seed=2)


class _OffByOne(TransportWrapper):
    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        out = self.inner.gather(x, layout, info)
        d = layout.dim
        blocks = []
        for r, n in enumerate(layout.sizes):
            block = out.narrow(d, layout.offsets[r], n)
            if 0 < n < layout.max_size:  # the slot's row n is padding (zeros)
                pad = torch.zeros_like(block.narrow(d, 0, 1))
                block = torch.cat([block.narrow(d, 1, n - 1), pad], d)
            blocks.append(block)
        return torch.cat(blocks, d)


def _wrap(t: Transport) -> Transport:
    return _OffByOne(t) if t.name == "padded" else t


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, wrap_transport=_wrap, **kwargs)

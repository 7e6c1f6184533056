"""Mutant: the padded transport returns the first ``total`` rows of the padded buffer."""

from __future__ import annotations

from typing import Any

import torch

from vargather._transport import Transport
from vargather.testing.cases import GatherCase

from ._base import TransportWrapper, gather

BUG = (
    "padded compaction concatenates the W padded slots and keeps the first total rows, "
    "so padding leaks into the result and the last rows are lost"
)
BENIGN = GatherCase(shapes=((2, 3), (2, 3)), dim=1, dtype="float32", transport="padded", seed=3)


class _Leak(TransportWrapper):
    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        out = self.inner.gather(x, layout, info)
        d, m = layout.dim, layout.max_size
        slots = []
        for r, n in enumerate(layout.sizes):
            block = out.narrow(d, layout.offsets[r], n)
            shape = list(block.shape)
            shape[d] = m - n
            slots.append(torch.cat([block, block.new_zeros(shape)], d))
        return torch.cat(slots, d).narrow(d, 0, layout.total)


def _wrap(t: Transport) -> Transport:
    return _Leak(t) if t.name == "padded" else t


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, wrap_transport=_wrap, **kwargs)

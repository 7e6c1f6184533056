"""Mutant: above vargather's own ``auto`` switch, a path that skips the compaction."""

from __future__ import annotations

from typing import Any

import torch

from vargather._transport import GLOO_SMALL_BYTES, Transport, payload_bytes
from vargather.testing.cases import GatherCase

from ._base import TransportWrapper, gather

BUG = (
    f"from GLOO_SMALL_BYTES ({GLOO_SMALL_BYTES} bytes gathered) up, a 'large payload' path "
    "returns the rank-major receive buffer as the output without compacting it, which is "
    "right only when nothing precedes dim (pre == 1); smaller payloads are right"
)
BENIGN = GatherCase(
    shapes=((40000, 2), (40001, 2)), dim=0, dtype="float32", values="integers", seed=22
)
"""About 640 KB gathered, above the threshold, but along dim 0 (pre == 1): right."""


class _RankMajor(TransportWrapper):
    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        out = self.inner.gather(x, layout, info)
        if payload_bytes(layout) < GLOO_SMALL_BYTES or layout.pre == 1:
            return out
        d = layout.dim
        blocks = [
            out.narrow(d, layout.offsets[r], n).reshape(-1) for r, n in enumerate(layout.sizes)
        ]
        return torch.cat(blocks).view(out.shape)


def _wrap(t: Transport) -> Transport:
    return _RankMajor(t)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, wrap_transport=_wrap, **kwargs)

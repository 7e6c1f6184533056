"""Mutant: above vargather's own ``auto`` switch, a path that assumes equal sizes."""

from __future__ import annotations

from typing import Any

import torch

from vargather._transport import GLOO_SMALL_BYTES, Transport
from vargather.testing.cases import GatherCase

from ._base import TransportWrapper, gather

BUG = (
    f"from GLOO_SMALL_BYTES ({GLOO_SMALL_BYTES} bytes gathered) up, a 'large payload' path "
    "meant for equal sizes compacts every payload: it reads rank r's block at offset "
    "r * (total // W), right only when the sizes are equal; smaller payloads are right"
)
BENIGN = GatherCase(
    shapes=((40000, 2), (40000, 2)), dim=0, dtype="float32", values="integers", seed=22
)
"""640,000 bytes gathered, above the threshold, but equal sizes: right."""


class _EvenOffsets(TransportWrapper):
    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        out = self.inner.gather(x, layout, info)
        if layout.nbytes < GLOO_SMALL_BYTES:
            return out
        d, total = layout.dim, layout.total
        step = total // layout.world_size
        blocks = [out.narrow(d, min(r * step, total - n), n) for r, n in enumerate(layout.sizes)]
        return torch.cat(blocks, d)


def _wrap(t: Transport) -> Transport:
    return _EvenOffsets(t)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, wrap_transport=_wrap, **kwargs)

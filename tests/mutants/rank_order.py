"""Mutant: the gathered blocks come out in reverse rank order."""

from __future__ import annotations

from typing import Any

import torch

from vargather._autograd import GatherPlan, GatherVFunction
from vargather.testing.cases import GatherCase

from ._base import gather

BUG = "the gathered blocks come out in reverse rank order"
BENIGN = GatherCase(shapes=((2, 3),), dim=0, dtype="float32", seed=1)  # one rank: one block


class _Reversed(GatherVFunction):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, plan: GatherPlan) -> torch.Tensor:
        out = GatherVFunction.forward(ctx, x, plan)
        layout = plan.layout
        blocks = torch.split(out, list(layout.sizes), dim=layout.dim)
        return torch.cat(blocks[::-1], dim=layout.dim)


def all_gather_v(x: torch.Tensor, dim: int = 0, **kwargs: Any) -> torch.Tensor:
    return gather(x, dim, function=_Reversed, **kwargs)

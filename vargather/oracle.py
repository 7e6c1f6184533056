"""The single-process oracle: what a ragged all_gather and its gradients must give.

It sits outside the pipeline on purpose: it never communicates, it sees every rank's
shard and every rank's upstream gradient at once, and it computes with ``torch.cat``
and autograd only, no hand-written slicing. Tests run the real gather on a
multi-process world and compare against it.

For ranks ``r = 0..W-1`` with shards ``x_r`` and upstream gradients ``g_r``
(``g_r`` is ``dL_r/d out`` on rank r):

* output: ``torch.cat(x, dim)``, the same on every rank;
* ``sum``: the gradient of ``Σ_j <g_j, cat(x)>`` with respect to each ``x_r``;
* ``local``: for each r, the gradient of ``<g_r, cat(x)>`` with respect to ``x_r``;
* ``mean``: the gradient of ``(1/W) Σ_j <g_j, cat(x)>``.

(``<g, y>`` is the vector-Jacobian product autograd computes for ``grad_outputs=g``,
so complex dtypes follow torch's convention without a hand-made real loss.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ._choices import CONTRACTS

__all__ = ["OracleResult", "expected", "expected_input_grads", "expected_output"]


class OracleResult(NamedTuple):
    """The gathered tensor and, per rank, the gradient of its shard (if asked)."""

    output: torch.Tensor
    input_grads: list[torch.Tensor] | None


def expected_output(shards: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """What every rank must receive: ``torch.cat(shards, dim)``."""
    return torch.cat([s.detach() for s in shards], dim=dim)


def _leaves(shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    for r, s in enumerate(shards):
        if not (s.is_floating_point() or s.is_complex()):
            raise TypeError(
                f"oracle: gradients need floating or complex shards, rank {r} has {s.dtype}"
            )
    return [s.detach().clone().requires_grad_(True) for s in shards]


def expected_input_grads(
    shards: Sequence[torch.Tensor],
    upstream: Sequence[torch.Tensor],
    dim: int = 0,
    contract: str = "sum",
) -> list[torch.Tensor]:
    """Each rank's expected ``dx_r`` under ``contract`` for upstream gradients ``upstream``."""
    world = len(shards)
    if len(upstream) != world:
        raise ValueError(f"oracle: {world} shards but {len(upstream)} upstream gradients")
    xs = _leaves(shards)
    if contract in ("sum", "mean"):
        scale = 1.0 if contract == "sum" else 1.0 / world
        # Every rank j computes its own out_j = cat(x) and its own loss L_j.
        outs = [torch.cat(xs, dim=dim) for _ in range(world)]
        if contract == "mean":
            outs = [out * scale for out in outs]
        grads = torch.autograd.grad(outs, xs, grad_outputs=[g.detach() for g in upstream])
        return list(grads)
    if contract == "local":
        result: list[torch.Tensor] = []
        for r in range(world):
            out_r = torch.cat(xs, dim=dim)
            (g,) = torch.autograd.grad(out_r, xs[r], grad_outputs=upstream[r].detach())
            result.append(g)
        return result
    raise ValueError(
        f"oracle: contract must be one of {', '.join(map(repr, CONTRACTS))}, got {contract!r}"
    )


def expected(
    shards: Sequence[torch.Tensor],
    dim: int = 0,
    *,
    upstream: Sequence[torch.Tensor] | None = None,
    contract: str = "sum",
) -> OracleResult:
    """Output and (when ``upstream`` is given) input gradients, in one call."""
    grads = None if upstream is None else expected_input_grads(shards, upstream, dim, contract)
    return OracleResult(expected_output(shards, dim), grads)

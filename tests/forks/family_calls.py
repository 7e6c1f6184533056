"""Family functions with their own signatures, as peers and forks write them: the gate
calls them through ``--call`` templates (what a template leaves out is out of scope).

* ``reduce_scatter(x, sizes)``: no dim (dim 0 only), no group: ``--call "(x, sizes)"``;
* ``exchange(x, splits, dim=0, recv=None, pg=None)``: all_to_all under other names:
  ``--call "(x, send_sizes, dim, recv=recv_sizes, pg=group)"``;
* ``gather_tensors(t, group=None)``: a list of every rank's tensor, ``sum`` gradients:
  ``--call "(x, group=group)"``;
* ``gather_tensors_detached``: the same without autograd (``--grad none`` passes it,
  ``--grad sum`` fails its gradient rows).
"""

from __future__ import annotations

from typing import Any

import torch

import vargather


def reduce_scatter(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return vargather.reduce_scatter_v(x, sizes)


def exchange(
    x: torch.Tensor, splits: list[int], dim: int = 0, recv: Any = None, pg: Any = None
) -> torch.Tensor:
    return vargather.all_to_all_v(x, splits, dim, recv_sizes=recv, group=pg)


def gather_tensors(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    return vargather.all_gather_list(t, group=group)


def gather_tensors_detached(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    return [o.detach() for o in vargather.all_gather_list(t.detach(), group=group)]

"""A drop-in replacement for the seed's ``distributed.py`` that many ML repos copy.

Same names and conventions::

    from vargather.compat import all_gather, all_gather_variable_dim, AllGather

Each name does what the seed's did (its docstring says what it returns), and
``pad_dim_to`` and ``exists`` are the helpers the seed imported but never defined.
Unlike the seed, every call is validated across ranks (dtype, ndim, other dims, sizes)
and raises the same ``VarGatherError`` on every rank instead of aborting, hanging or
reinterpreting bits.

``AllGather``'s ``"local"`` gradient is the right one only when every rank computes the
identical loss from the gathered tensor; switch to ``vargather.all_gather_v(x, dim,
grad="sum")`` when each rank computes its own loss (the getting-started guide's
gradient contracts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn import functional

from ._api import all_gather_v_with_layout
from ._layout import Layout

__all__ = ["AllGather", "all_gather", "all_gather_variable_dim", "exists", "pad_dim_to"]


def exists(val: object) -> bool:
    """``val is not None`` (the seed imported it but never defined it); no tensor, no
    gradient, never raises."""
    return val is not None


def pad_dim_to(t: torch.Tensor, length: int, dim: int = 0) -> torch.Tensor:
    """Zero-pad ``t`` along ``dim`` to ``length`` (``t`` itself when already that long).

    Shapes:
        ``t``: ``lead + (n,) + trail`` with ``n <= length``; returns
        ``lead + (length,) + trail``.

    Gradient:
        ``functional.pad``'s: the upstream gradient cut back to ``t``'s slice.

    Raises:
        ValueError: ``length`` is shorter than ``t.shape[dim]``.
    """
    pad_length = length - t.shape[dim]
    if pad_length < 0:
        raise ValueError(
            f"pad_dim_to: length={length} is shorter than t.shape[{dim}]={t.shape[dim]}"
        )
    if pad_length == 0:
        return t
    zero_pairs = (-dim - 1) if dim < 0 else (t.ndim - dim - 1)
    return functional.pad(t, (*((0, 0) * zero_pairs), 0, pad_length))


def _sizes_tensor(layout: Layout, device: torch.device) -> torch.Tensor:
    return torch.tensor(layout.sizes, dtype=torch.long, device=device)


def all_gather_variable_dim(
    t: torch.Tensor, dim: int = 0, sizes: Sequence[int] | torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``t`` along ``dim``; returns ``(gathered, sizes)``, as the seed's did.

    Shapes:
        ``t``: this rank's ``lead + (n_r,) + trail``; returns the gathered
        ``lead + (Σ_r n_r,) + trail`` and ``sizes``, a 1-d int64 tensor of every
        rank's ``n_r`` on ``t``'s device.

    Gradient:
        None: the result is detached (the seed's plain ``dist.all_gather`` cut the
        graph too); use ``AllGather.apply`` or ``vargather.all_gather_v``.

    Raises:
        VarGatherError: what ``vargather.all_gather_v`` raises, on every rank.
    """
    with torch.no_grad():
        gathered, layout = all_gather_v_with_layout(t, dim, sizes=sizes, grad="local")
    return gathered.detach(), _sizes_tensor(layout, t.device)


class AllGather:
    """The seed's autograd gather: ``AllGather.apply(x, dim, sizes) -> (tensor, sizes)``."""

    @staticmethod
    def apply(
        x: torch.Tensor, dim: int = 0, sizes: Sequence[int] | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gather ``x`` along ``dim``, differentiably; ``compat.all_gather`` is this.

        Shapes:
            ``x``: this rank's ``lead + (n_r,) + trail``; returns the gathered
            ``lead + (Σ_r n_r,) + trail`` and every rank's ``n_r`` as a 1-d int64
            tensor on ``x``'s device, or ``(x, None)`` without torch.distributed or
            in a one-rank world, as the seed does.

        Gradient:
            The seed's ``"local"`` contract: ``dx_r = g_r[o_r : o_r + n_r]``, this
            rank's slice of its own upstream gradient (exact only when every rank
            computes the identical loss).

        Raises:
            VarGatherError: what ``vargather.all_gather_v`` raises, on every rank.
        """
        is_dist = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        gathered, layout = all_gather_v_with_layout(x, dim, sizes=sizes, grad="local")
        if not is_dist:
            return gathered, None
        return gathered, _sizes_tensor(layout, x.device)


all_gather = AllGather.apply

"""Helpers the zoo's forks share, as copied helpers are in real repositories."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812  # the usual spelling in forks


def pad_dim_to(t: torch.Tensor, length: int, dim: int = 0) -> torch.Tensor:
    """Zero-pad ``t`` along ``dim`` to ``length`` (the lucidrains helper)."""
    pad_length = length - t.shape[dim]
    zero_pairs = (-dim - 1) if dim < 0 else (t.ndim - dim - 1)
    return F.pad(t, (*((0, 0) * zero_pairs), 0, pad_length))

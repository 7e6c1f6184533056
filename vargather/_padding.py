"""Stage 2: padding, from a rank's shard (or gradient) to the buffer a transport sends.

Pipeline: metadata exchange -> **padding** -> transport -> compaction -> autograd.

A shard of shape ``lead + (n_r,) + trail`` is viewed as the block ``(pre, n_r, post)``
(see ``_layout``). The padded transport needs every rank to send the same number of
elements, so the block is extended to ``(pre, max_r n_r, post)``; the padding rows are
zero-filled (they are never read back, but a buffer should not carry stale memory to
peers). When the block already has ``max`` rows and is contiguous nothing is copied.

The backward sends a gradient of the gathered shape ``lead + (total,) + trail`` back
cut into rank blocks: padded (``scatter_into_padded``, ``(W, pre, max, post)``) or
rank-major (``rank_major_gradient``, rank 0's ``(pre, n_0, post)`` block first). Both
are views of the gradient, without copying, when its blocks are already laid out so.
"""

from __future__ import annotations

import torch

from ._layout import Layout

__all__ = ["as_blocks", "pad_blocks", "rank_major_gradient", "scatter_into_padded"]


def as_blocks(t: torch.Tensor, n: int, layout: Layout) -> torch.Tensor:
    """``t`` (``lead + (n,) + trail``) as ``(pre, n, post)``; a view when ``t`` allows."""
    return t.reshape(layout.pre, n, layout.post)


def pad_blocks(blocks: torch.Tensor, max_size: int) -> torch.Tensor:
    """``(pre, n, post)`` -> contiguous ``(pre, max_size, post)``; zero-filled tail.

    Returns ``blocks`` itself when ``n == max_size`` and it is contiguous.
    """
    pre, n, post = blocks.shape
    if n == max_size and blocks.is_contiguous():
        return blocks
    padded = blocks.new_empty((pre, max_size, post))
    padded[:, :n].copy_(blocks)
    padded[:, n:].zero_()
    return padded


def scatter_into_padded(full: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The gathered-shape ``full`` cut into ``(W, pre, max, post)``, rank r's block at [r].

    This is the send buffer of a padded reduce-scatter (the sum contract's backward).
    A view, without copying, when every rank has the same size and ``pre == 1``.
    """
    w, pre, post, m = layout.world_size, layout.pre, layout.post, layout.max_size
    blocks = full.reshape(pre, layout.total, post)
    if layout.is_even and pre == 1 and blocks.is_contiguous():
        return blocks.view(w, 1, m, post)
    padded = blocks.new_empty((w, pre, m, post))
    for r in range(w):
        n, o = layout.sizes[r], layout.offsets[r]
        padded[r, :, :n].copy_(blocks[:, o : o + n])
        padded[r, :, n:].zero_()
    return padded


def rank_major_gradient(full: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The gathered-shape ``full`` as a flat rank-major buffer of ``pre * total * post``.

    Rank r's ``(pre, n_r, post)`` block follows rank r-1's. When ``pre == 1`` that is
    the memory order of ``full`` already, so a contiguous ``full`` is returned as a
    view; otherwise the blocks are copied once.
    """
    blocks = full.reshape(layout.pre, layout.total, layout.post)
    if layout.pre == 1:
        return blocks.reshape(-1).contiguous()
    return torch.cat([blocks[:, layout.block(r)].reshape(-1) for r in range(layout.world_size)])

"""The transports' buffer helpers: send buffers in, receive buffers out.

Where it sits: beneath ``_transport``, which fills and sends what these build; pure
tensor arithmetic over a ``Layout`` (a shard viewed as the block ``(pre, n_r, post)``),
no communication. Two receive buffer shapes exist: padded, ``(W, pre, max, post)``
(rank r's rows are ``buffer[r, :, :n_r]``), and rank-major, rank 0's ``(pre, n_0,
post)`` block, then rank 1's, and so on (what ``alltoallv``, ``broadcast`` and ``views``
fill). Either way the result is ``cat_r block_r`` along the middle axis: **exactly one
copy**, and **none** when the buffer already is the result (rank-major with ``pre ==
1``, or padded with ``pre == 1`` and every rank the same size).
"""

from __future__ import annotations

import torch

from ._layout import Layout


def as_blocks(t: torch.Tensor, n: int, layout: Layout) -> torch.Tensor:
    """``t`` (``lead + (n,) + trail``) as ``(pre, n, post)``; a view when ``t`` allows."""
    return t.reshape(layout.pre, n, layout.post)


def pad_blocks(blocks: torch.Tensor, max_size: int) -> torch.Tensor:
    """``(pre, n, post)`` -> contiguous ``(pre, max_size, post)``, the padding zeroed (no
    stale memory to the peers); ``blocks`` itself when it already is that."""
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
    pre, post, w = layout.pre, layout.post, layout.world_size
    blocks = full.reshape(pre, layout.total, post)
    if pre == 1:
        return blocks.reshape(-1).contiguous()
    if layout.is_even and layout.total:  # one strided copy: (pre, W, n, post) -> (W, pre, n, post)
        n = layout.total // w
        return blocks.reshape(pre, w, n, post).transpose(0, 1).contiguous().view(-1)
    out = blocks.new_empty(pre * layout.total * post)
    at = 0
    for r, n in enumerate(layout.sizes):  # each block copied once, into its place
        if n:
            out[at : at + pre * n * post].view(pre, n, post).copy_(blocks[:, layout.block(r)])
        at += pre * n * post
    return out


def compact_padded(buffer: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Result from a padded ``(W, pre, max, post)`` buffer."""
    if layout.pre == 1 and layout.is_even:
        return buffer.view(layout.output_shape)
    blocks = [buffer[r, :, :n] for r, n in enumerate(layout.sizes)]
    return torch.cat(blocks, dim=1).view(layout.output_shape)


def rank_major_blocks(flat: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Views ``(pre, n_r, post)`` of every rank's block in a rank-major flat buffer."""
    pre, post = layout.pre, layout.post
    blocks: list[torch.Tensor] = []
    start = 0
    for n in layout.sizes:
        count = pre * n * post
        blocks.append(flat[start : start + count].view(pre, n, post))
        start += count
    return blocks


def compact_rank_major(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Result from a rank-major flat buffer of ``pre * total * post`` elements."""
    if layout.pre == 1:
        return flat.view(layout.output_shape)
    return torch.cat(rank_major_blocks(flat, layout), dim=1).view(layout.output_shape)

"""Stage 4: compaction, from a transport's receive buffer to the gathered result.

Pipeline: metadata exchange -> padding -> transport -> **compaction** -> autograd.

Two receive layouts exist:

* padded, ``(W, pre, max, post)``: rank r's rows are ``buffer[r, :, :n_r]``;
* rank-major, a flat buffer holding rank 0's ``(pre, n_0, post)`` block, then rank 1's,
  and so on (what the ``alltoallv``, ``broadcast`` and ``views`` transports fill).

Either way the result is ``cat_r block_r`` along the middle axis, reshaped to
``lead + (total,) + trail``. That is **exactly one copy** (one ``torch.cat``), and
**none** when the buffer already is the result: rank-major with ``pre == 1`` (the
blocks are adjacent), or padded with ``pre == 1`` and every rank the same size.
"""

from __future__ import annotations

import torch

from ._layout import Layout

__all__ = ["compact_padded", "compact_rank_major", "rank_major_blocks"]


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

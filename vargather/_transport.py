"""Stage 5: transport, moving every rank's block into one receive buffer (and back).

Where it sits: above ``_buffers`` (its buffer helpers) and ``_comm`` (its
collectives), below the gathers. A ``Transport`` is a pair of operations over a
validated ``Layout``: ``gather(x)``, the forward, ``cat_r x_r`` along ``layout.dim``;
``reduce_scatter_sum(g)``, the backward of the ``sum`` contract, ``Σ_j g_j[o_r : o_r +
n_r]`` (along ``dim``) on rank ``r``, shaped like ``x_r``, in a fresh tensor (never a
view of ``g``, so the caller may scale it in place). ``TRANSPORTS`` holds one per name
``transport=`` forces; ``auto`` picks one per call from the backend, the payload size
and the padding waste (``auto_transport_name``): every rank holds the same ``Layout``
and backend, so every rank picks the same one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Protocol

import torch

from ._buffers import (
    as_blocks,
    compact_padded,
    compact_rank_major,
    pad_blocks,
    rank_major_blocks,
    rank_major_gradient,
    scatter_into_padded,
)
from ._comm import (
    all_gather_equal,
    all_gather_list,
    all_reduce_sum,
    all_to_all_uneven,
    broadcast_from_each,
    reduce_scatter_equal,
    reduce_scatter_uneven,
)
from ._group import GroupInfo
from ._layout import Layout
from ._reduced import add_


class Transport(Protocol):
    """Moves payload for one validated gather. Implementations hold no state."""

    name: str

    def gather(self, x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
        """``cat_r x_r`` along ``layout.dim``; ``x`` is this rank's shard."""
        ...

    def reduce_scatter_sum(
        self, grad_output: torch.Tensor, layout: Layout, info: GroupInfo
    ) -> torch.Tensor:
        """``Σ_j g_j[block of this rank]``, shaped like this rank's shard, freshly allocated."""
        ...


def _reduce_scatter_blocks(
    grad_output: torch.Tensor, layout: Layout, info: GroupInfo
) -> torch.Tensor:
    """The sum contract's backward through one uneven ``reduce_scatter`` of every rank's
    chunks ``g[o_j : o_j + n_j]`` (views when ``g`` is contiguous and ``pre == 1``)."""
    flat = rank_major_gradient(grad_output, layout)
    chunks = rank_major_blocks(flat, layout)
    received = flat.new_empty((layout.pre, layout.local_size, layout.post))
    reduce_scatter_uneven(received, chunks, info)
    return received.view(layout.shard_shape(layout.rank))


def alltoallv_rounds(layout: Layout) -> int:
    """How many alltoallv rounds the alltoallv backward takes, to bound its memory.

    In one round rank r receives its block from every rank (``W x n_r`` rows) and
    allocates its gradient (``n_r``): at most twice the output when ``(W + 1) max_r n_r
    <= 2 total``. Otherwise every block is cut into ``k`` pieces sent in ``k`` rounds,
    each with a send buffer of ``~total / k`` and a receive buffer of ``W n_r / k``, and
    ``k = ceil((total + W max) / (2 total - max))`` keeps
    ``n_r + (total + W n_r) / k <= 2 total``. Every rank computes the same ``k``.
    """
    w, m, t = layout.world_size, layout.max_size, layout.total
    if (w + 1) * m <= 2 * t:
        return 1
    return math.ceil((t + w * m) / (2 * t - m))  # m <= t, so 2t - m >= t > 0


def _sum_rows(rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``rows[0] + rows[1] + ...`` in rank order, into ``out`` or a fresh tensor. Not
    ``torch.sum``, which starts from ``+0.0`` and so turns a sum of ``-0.0``s into
    ``+0.0``: a sum's bits are its operands' alone, as the backends' sums give them
    (complex per component, ``_reduced.add_``)."""
    out = rows[0].clone() if out is None else out.copy_(rows[0])
    for j in range(1, rows.shape[0]):
        add_(out, rows[j])
    return out


def _alltoallv_blocks(grad_output: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
    """The sum contract's backward through alltoallv (the rank-major gradient is exactly
    the send buffer) and a local sum of the ``W`` blocks received, in
    ``alltoallv_rounds`` rounds, each sending piece ``c`` of every block."""
    w = layout.world_size
    send = rank_major_gradient(grad_output, layout)
    elems = [layout.pre * n * layout.post for n in layout.sizes]
    own = elems[layout.rank]
    rounds = alltoallv_rounds(layout)
    if rounds == 1:
        received = send.new_empty(w * own)
        all_to_all_uneven(received, send, output_splits=[own] * w, input_splits=elems, info=info)
        return _sum_rows(received.view(w, own)).view(layout.shard_shape(layout.rank))
    starts = [0]
    for e in elems[:-1]:
        starts.append(starts[-1] + e)
    result = send.new_empty(own)
    for c in range(rounds):
        lo = [e * c // rounds for e in elems]
        hi = [e * (c + 1) // rounds for e in elems]
        pieces = [send[starts[r] + lo[r] : starts[r] + hi[r]] for r in range(w)]
        piece = hi[layout.rank] - lo[layout.rank]
        received = send.new_empty(w * piece)
        all_to_all_uneven(
            received,
            torch.cat(pieces),
            output_splits=[piece] * w,
            input_splits=[h - lo_r for h, lo_r in zip(hi, lo, strict=True)],
            info=info,
        )
        _sum_rows(received.view(w, piece), out=result[lo[layout.rank] : hi[layout.rank]])
        del received, pieces
    return result.view(layout.shard_shape(layout.rank))


def _all_reduce_blocks(grad_output: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
    """The sum contract's backward through one all_reduce of the whole gradient, keeping
    this rank's block: ``W x`` the bytes a reduce-scatter needs, but one collective."""
    full = torch.empty(
        (layout.pre, layout.total, layout.post), dtype=grad_output.dtype, device=grad_output.device
    )
    full.copy_(grad_output.reshape(layout.pre, layout.total, layout.post))
    all_reduce_sum(full, info)
    own = full[:, layout.block(layout.rank)].clone()
    return own.view(layout.shard_shape(layout.rank))


def _unpadded_backward(grad_output: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
    """Backward of the copy-free transports, chosen by measurement (``docs/performance.md``):
    below ``GLOO_REDUCE_SCATTER_MIN_BYTES`` gloo's reduce_scatter is slower than one
    alltoallv (when it fits in twice the output's memory) or one all_reduce of the
    gradient, which beats the memory-bounded alltoallv rounds on skewed sizes."""
    if info.backend == "gloo" and layout.nbytes < GLOO_REDUCE_SCATTER_MIN_BYTES:
        if alltoallv_rounds(layout) == 1:
            return _alltoallv_blocks(grad_output, layout, info)
        return _all_reduce_blocks(grad_output, layout, info)
    return _reduce_scatter_blocks(grad_output, layout, info)


class PaddedTransport:
    """Pad to ``max``, one equal all_gather into ``(W, pre, max, post)``, compact with one
    ``cat``; backward: one equal reduce_scatter of the padded gradient. Equal-size
    collectives only, so it runs on every backend; with equal sizes and a leading
    ``dim`` it pads and copies nothing (the receive buffer is the result)."""

    name = "padded"

    def gather(self, x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
        send = pad_blocks(as_blocks(x, layout.local_size, layout), layout.max_size)
        buffer = send.new_empty((layout.world_size, layout.pre, layout.max_size, layout.post))
        all_gather_equal(buffer, send, info)
        return compact_padded(buffer, layout)

    def reduce_scatter_sum(
        self, grad_output: torch.Tensor, layout: Layout, info: GroupInfo
    ) -> torch.Tensor:
        send = scatter_into_padded(grad_output, layout)
        received = send.new_empty((layout.pre, layout.max_size, layout.post))
        reduce_scatter_equal(received, send, info)
        return received[:, : layout.local_size].reshape(layout.shard_shape(layout.rank))


class AllToAllVTransport:
    """Unpadded: one alltoallv with the true split sizes into a rank-major receive buffer
    (the result itself when ``pre == 1``); backward: ``_alltoallv_blocks``."""

    name = "alltoallv"

    def gather(self, x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
        w = layout.world_size
        local = as_blocks(x, layout.local_size, layout).reshape(-1)
        # Every peer gets the same block, but alltoallv wants one contiguous slice per
        # peer (gloo refuses a stride-0 expand: "Tensors must be contiguous"), so the
        # block is repeated W times.
        send = local.repeat(w)
        received = local.new_empty(layout.pre * layout.total * layout.post)
        all_to_all_uneven(
            received,
            send,
            output_splits=[layout.pre * n * layout.post for n in layout.sizes],
            input_splits=[local.numel()] * w,
            info=info,
        )
        return compact_rank_major(received, layout)

    def reduce_scatter_sum(
        self, grad_output: torch.Tensor, layout: Layout, info: GroupInfo
    ) -> torch.Tensor:
        return _alltoallv_blocks(grad_output, layout, info)


class _OneBufferTransport:
    """Copy-free: every rank's block lands straight in its view of one rank-major output
    (``_fill`` says how); backward as ``_unpadded_backward``."""

    def _fill(self, blocks: list[torch.Tensor], layout: Layout, info: GroupInfo) -> None:
        raise NotImplementedError

    def gather(self, x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
        flat = x.new_empty(layout.pre * layout.total * layout.post)
        blocks = rank_major_blocks(flat, layout)
        blocks[layout.rank].copy_(as_blocks(x, layout.local_size, layout))  # the one copy
        self._fill(blocks, layout, info)
        return compact_rank_major(flat, layout)

    def reduce_scatter_sum(
        self, grad_output: torch.Tensor, layout: Layout, info: GroupInfo
    ) -> torch.Tensor:
        return _unpadded_backward(grad_output, layout, info)


class BroadcastTransport(_OneBufferTransport):
    """One broadcast per rank with a non-empty block straight into the views of one
    rank-major output, all ``W`` in flight at once; runs on every backend."""

    name = "broadcast"

    def _fill(self, blocks: list[torch.Tensor], layout: Layout, info: GroupInfo) -> None:
        broadcast_from_each(blocks, info)


class ViewsTransport(_OneBufferTransport):
    """``dist.all_gather`` into uneven views of one rank-major output: NCCL runs them as
    one group of broadcasts; gloo refuses views of different sizes
    (``unsupported_reason``)."""

    name = "views"

    def _fill(self, blocks: list[torch.Tensor], layout: Layout, info: GroupInfo) -> None:
        all_gather_list(blocks, blocks[layout.rank], info)


TRANSPORTS: Final[Mapping[str, Transport]] = {
    t.name: t
    for t in (PaddedTransport(), AllToAllVTransport(), BroadcastTransport(), ViewsTransport())
}
"""Every transport by name: each name of ``TRANSPORT_NAMES`` but ``auto``."""


GLOO_SMALL_BYTES: Final = 256 * 1024
"""Below this many output bytes gloo is latency-bound: one collective beats ``W``."""

GLOO_REDUCE_SCATTER_MIN_BYTES: Final = 16 * 1024 * 1024
"""From this many output bytes up, the copy-free transports' backward on gloo is an
uneven reduce_scatter (``_unpadded_backward``)."""

NCCL_SMALL_BYTES: Final = 1024 * 1024
"""Below this many output bytes NCCL's single all_gather kernel wins (not measured here)."""

NCCL_MAX_PADDED_WASTE: Final = 0.25
"""Largest padding fraction NCCL's padded all_gather is kept for (not measured here)."""


def auto_transport_name(layout: Layout, backend: str) -> str:
    """The transport ``auto`` runs for ``layout`` on ``backend``. On gloo, past
    ``GLOO_SMALL_BYTES``, ``broadcast`` measured at or below the equal-size all_gather
    of the same bytes on every profile (``docs/performance.md``, where the policy's
    measurements are); NCCL's choice is reasoned from its algorithms, not measured here
    (no GPU); any other backend gets ``padded``, which needs only equal collectives."""
    if backend == "gloo":
        if layout.nbytes < GLOO_SMALL_BYTES:
            return "padded" if layout.is_even else "alltoallv"
        return "broadcast"
    if backend == "nccl":
        if (
            layout.is_even
            or layout.nbytes < NCCL_SMALL_BYTES
            or layout.padding_waste <= NCCL_MAX_PADDED_WASTE
        ):
            return "padded"
        return "views"
    return "padded"


def choose_transport(requested: str, layout: Layout, info: GroupInfo) -> Transport:
    """The transport for this call: ``requested`` itself, or ``auto``'s choice."""
    if requested != "auto":
        return TRANSPORTS[requested]
    return TRANSPORTS[auto_transport_name(layout, info.backend)]

"""The transports' buffers (``vargather._buffers``), single process: padding then
compaction, with the transports' receive buffers simulated in-process, against
``torch.cat``; the backward's send buffers against the oracle's gradients.

Every test is a plain ``@given`` function without fixtures, deterministic in its
input, so it doubles as a fuzz target: ``test.hypothesis.fuzz_one_input(buffer)``.
"""

from __future__ import annotations

import torch
from hypothesis import given

from vargather import oracle
from vargather._buffers import (
    as_blocks,
    compact_padded,
    compact_rank_major,
    pad_blocks,
    rank_major_blocks,
    rank_major_gradient,
    scatter_into_padded,
)
from vargather.testing import assert_bitwise_equal

from ._stage_fns import GatherCase, cases, float_cases, layouts_of


@given(case=cases)
def test_pad_then_compact_is_torch_cat(case: GatherCase) -> None:
    """The padded transport's receive buffer, ``(W, pre, max, post)`` stacked from every
    rank's padded block, compacts to ``torch.cat`` (bytes), whichever rank compacts."""
    layouts = layouts_of(case)
    shards = [case.shard(r).detach() for r in range(case.world_size)]
    expected = oracle.expected_output(shards, case.dim)
    m = layouts[0].max_size
    sent = [
        pad_blocks(as_blocks(x, x.shape[case.normalized_dim], lay), m)
        for x, lay in zip(shards, layouts, strict=True)
    ]
    for block, x in zip(sent, shards, strict=True):
        assert block.shape == (layouts[0].pre, m, layouts[0].post)
        assert block.is_contiguous()
        n = x.shape[case.normalized_dim]
        assert bool((block[:, n:] == 0).all()), "padding rows must be zero-filled"
    buffer = torch.stack(sent)
    for layout in layouts:
        assert_bitwise_equal(compact_padded(buffer, layout), expected)


@given(case=cases)
def test_rank_major_compaction_is_torch_cat(case: GatherCase) -> None:
    """The unpadded transports' receive buffer (rank 0's block, then rank 1's, ...)
    compacts to ``torch.cat`` (bytes)."""
    layouts = layouts_of(case)
    shards = [case.shard(r).detach() for r in range(case.world_size)]
    expected = oracle.expected_output(shards, case.dim)
    flat = torch.cat(
        [
            as_blocks(x, x.shape[case.normalized_dim], lay).reshape(-1)
            for x, lay in zip(shards, layouts, strict=True)
        ]
    )
    for layout in layouts:
        assert_bitwise_equal(compact_rank_major(flat, layout), expected)
        blocks = rank_major_blocks(flat, layout)
        for r, block in enumerate(blocks):
            assert_bitwise_equal(block, as_blocks(shards[r], case.sizes[r], layout))


@given(case=float_cases)
def test_backward_send_buffers_reduce_to_the_sum_contract(case: GatherCase) -> None:
    """Summing rank r's slot of every rank's padded gradient buffer (what a padded
    reduce-scatter does), or its block of every rank-major gradient buffer, gives the
    oracle's ``sum`` gradient exactly (small integers)."""
    layouts = layouts_of(case)
    w = case.world_size
    shards = [case.shard_values(r) for r in range(w)]
    ups = [case.upstream_grad(j) for j in range(w)]
    want = oracle.expected_input_grads(shards, ups, case.dim, "sum")
    for r in range(w):
        layout = layouts[r]
        padded = sum(scatter_into_padded(g, layout)[r] for g in ups)
        assert isinstance(padded, torch.Tensor)
        got = padded[:, : case.sizes[r]].reshape(case.shapes[r])
        assert torch.equal(got, want[r])
        major = sum(rank_major_blocks(rank_major_gradient(g, layout), layout)[r] for g in ups)
        assert isinstance(major, torch.Tensor)
        assert torch.equal(major.reshape(case.shapes[r]), want[r])

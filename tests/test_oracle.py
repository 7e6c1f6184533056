"""The oracle (``vargather.oracle``): its contracts are their stated math."""

from __future__ import annotations

import torch
from hypothesis import given

from vargather import CONTRACTS, oracle
from vargather.testing import assert_bitwise_equal

from ._stage_fns import GatherCase, float_cases


@given(case=float_cases)
def test_the_oracle_contracts_are_their_stated_math(case: GatherCase) -> None:
    """``sum``: Σ_j g_j[o_r : o_r + n_r]; ``local``: g_r[o_r : o_r + n_r]; ``mean``:
    the sum over W. Slicing by hand (``narrow``) against the oracle's autograd."""
    w, d = case.world_size, case.normalized_dim
    shards = [case.shard_values(r) for r in range(w)]
    ups = [case.upstream_grad(j) for j in range(w)]
    offsets = [sum(case.sizes[:r]) for r in range(w)]
    out = oracle.expected_output(shards, case.dim)
    assert_bitwise_equal(out, torch.cat(shards, d))
    by_contract = {c: oracle.expected_input_grads(shards, ups, case.dim, c) for c in CONTRACTS}
    for r in range(w):
        blocks = [g.narrow(d, offsets[r], case.sizes[r]) for g in ups]
        total = torch.stack(blocks).sum(0) if blocks else None
        assert total is not None
        assert torch.equal(by_contract["sum"][r], total)
        assert torch.equal(by_contract["local"][r], blocks[r])
        # (1/W) Σ_j g_j and Σ_j (g_j / W) round differently: within (W+1) eps Σ_j|g_j| / W.
        eps = torch.finfo(total.real.dtype).eps
        magnitude = torch.stack([b.abs() for b in blocks]).sum(0) / w
        error = (by_contract["mean"][r] - total / w).abs()
        assert bool((error <= (w + 1) * eps * magnitude).all())


@given(case=float_cases)
def test_the_rooted_oracles_are_their_stated_math(case: GatherCase) -> None:
    """gather_v: ``cat_r x_r`` on ``dst``, empty elsewhere, and ``dx_r`` is block ``r``
    of ``g_dst``; scatter_v: block ``r`` of ``x_src``, and ``dx_src = cat_r g_r``,
    zeros elsewhere. Slicing by hand (``narrow``) against the oracle's autograd."""
    w, d = case.world_size, case.normalized_dim
    shards = [case.shard_values(r) for r in range(w)]
    full = torch.cat(shards, d)
    offsets = [sum(case.sizes[:r]) for r in range(w)]
    root = w - 1
    got = oracle.expected_gather_v(shards, root, case.dim)
    for r in range(w):
        if r == root:
            assert_bitwise_equal(got[r], full)
        else:
            assert got[r].shape == (*shards[r].shape[:d], 0, *shards[r].shape[d + 1 :])
    up = torch.randn_like(full) if full.is_floating_point() else torch.ones_like(full)
    ups = [up if r == root else got[r] for r in range(w)]
    grads = oracle.expected_gather_v_grads(shards, root, ups, case.dim)
    for r in range(w):
        assert_bitwise_equal(grads[r], up.narrow(d, offsets[r], case.sizes[r]), f"rank {r}")
    inputs = [full if r == root else shards[r] for r in range(w)]
    blocks = oracle.expected_scatter_v(inputs, case.sizes, root, case.dim)
    for r in range(w):
        assert_bitwise_equal(blocks[r], full.narrow(d, offsets[r], case.sizes[r]), f"rank {r}")
    grads = oracle.expected_scatter_v_grads(inputs, case.sizes, root, shards, case.dim)
    for r in range(w):
        want = full if r == root else torch.zeros_like(shards[r])  # g_r = shards[r]
        assert_bitwise_equal(grads[r], want, f"rank {r}")

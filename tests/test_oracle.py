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

"""The first multi-rank check of the core (the full property suite is test_properties):
2 and 3 real gloo ranks, forward bit for bit and the gradients of all three contracts,
with upstream gradients that differ per rank, against the single-process oracle."""

from __future__ import annotations

import pytest
import torch

import vargather
from vargather import oracle
from vargather.testing import assert_bitwise_equal, get_pool

from ._core_fns import CoreCase, gather_and_backward, shard, upstream

pytestmark = pytest.mark.multirank

CASES = [
    CoreCase((3, 0), 0, (4,), "float32", "sum", "auto"),
    CoreCase((2, 5), -1, (3, 2), "float64", "local", "padded"),
    CoreCase((1, 4, 2), 1, (2, 3), "float32", "mean", "alltoallv"),
    CoreCase((2, 2, 2), 0, (3,), "bfloat16", "sum", "auto"),
    CoreCase((0, 3, 1), -2, (2, 2), "complex64", "sum", "padded"),
    CoreCase((3, 1, 0), 2, (2, 2), "float16", "local", "alltoallv"),
    CoreCase((0, 0, 0), 0, (5,), "float32", "sum", "auto"),
    CoreCase((4, 1), 0, (2,), "int64", "sum", "auto"),
    CoreCase((2, 3, 1), 1, (2,), "bool", "local", "padded"),
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"W{len(c.sizes)}-{c.dtype}-dim{c.dim}-{c.grad}-{c.transport}"
)
def test_forward_and_gradients_match_the_oracle(case: CoreCase) -> None:
    world = len(case.sizes)
    results = get_pool(world).run(gather_and_backward, case)
    shards = [shard(case, r) for r in range(world)]
    want = oracle.expected_output(shards, case.dim)
    upstreams = [upstream(case, r, tuple(want.shape)) for r in range(world)]
    grads = (
        oracle.expected_input_grads(shards, upstreams, case.dim, case.grad)
        if want.is_floating_point() or want.is_complex()
        else None
    )
    for rank, (out, sizes, grad) in enumerate(results):
        assert_bitwise_equal(out, want, f"rank {rank}: output vs torch.cat")
        assert sizes == case.sizes
        if grads is not None:
            assert grad is not None
            # integer-valued values: every contract is exact except mean's 1/W
            if case.grad == "mean":
                torch.testing.assert_close(grad, grads[rank])
            else:
                assert torch.equal(grad, grads[rank]), (
                    f"rank {rank}: gradient differs under {case.grad}"
                )


def test_symmetric_upstream_would_hide_the_local_contract() -> None:
    """Why the tests use per-rank upstream gradients: with identical ones, 'local' and
    'mean' coincide, so only asymmetric gradients tell the contracts apart."""
    shards = [torch.ones(2, 1), torch.ones(3, 1)]
    same = [torch.arange(5.0).reshape(5, 1)] * 2
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            oracle.expected_input_grads(shards, same, 0, "local"),
            oracle.expected_input_grads(shards, same, 0, "mean"),
            strict=True,
        )
    )
    differ = [torch.arange(5.0).reshape(5, 1), -torch.arange(5.0).reshape(5, 1)]
    local = oracle.expected_input_grads(shards, differ, 0, "local")
    total = oracle.expected_input_grads(shards, differ, 0, "sum")
    assert not torch.equal(local[0], total[0])
    assert vargather.CONTRACTS == ("sum", "local", "mean")

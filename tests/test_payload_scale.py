"""Payload scale and call sequences in the testing kit.

The targets large cases are drawn around (powers of two, vargather's own thresholds
read from the library), the strategy really drawing them (both sides of a threshold,
ragged and empty shards mixed in, bounded by ``max_payload``), call sequences, and the
rank-side digest comparison of large outputs.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from vargather import _round_state, _transport
from vargather.testing import strategies as vst
from vargather.testing.cases import DIGEST_MIN_BYTES, GatherCase
from vargather.testing.catalogues import catalogue
from vargather.testing.runner import describe, run_cases
from vargather.testing.scale import (
    DEFAULT_MAX_PAYLOAD,
    MIN_LARGE_BYTES,
    format_bytes,
    library_thresholds,
    per_rank_targets,
)

from .mutants import implementation

FIND = settings(
    max_examples=5000,
    derandomize=True,  # the same draws every run: a search that succeeds always does
    database=None,
    phases=(Phase.generate,),  # an example is enough: no shrinking
    suppress_health_check=list(HealthCheck),
)


def test_library_thresholds_are_read_from_the_library() -> None:
    found = library_thresholds()
    small = _transport.GLOO_SMALL_BYTES
    assert found["GLOO_SMALL_BYTES"] == (small, "gathered")
    backward = _transport.GLOO_REDUCE_SCATTER_MIN_BYTES
    assert found["GLOO_REDUCE_SCATTER_MIN_BYTES"] == (backward, "gathered")
    assert found["FUSED_MAX_BYTES"] == (
        _round_state.FUSED_MAX_BYTES,
        "per-rank",
    )
    assert not [k for k in found if k.endswith("HEADER_BYTES")]
    # the family's thresholds are drawn around too (they are named otherwise)
    assert found["FAMILY_FUSED_MAX"] == (_round_state.FAMILY_FUSED_MAX, "per-block")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_targets_cover_powers_of_two_and_the_real_thresholds(world: int) -> None:
    targets = per_rank_targets(world, DEFAULT_MAX_PAYLOAD)
    sizes = [t.bytes for t in targets]
    assert sizes == sorted(set(sizes))
    k = MIN_LARGE_BYTES
    while k <= DEFAULT_MAX_PAYLOAD:
        assert k in sizes
        k *= 2
    assert max(sizes) <= DEFAULT_MAX_PAYLOAD
    for value, counts in library_thresholds().values():
        per_rank = -(-value // world) if counts == "gathered" else value
        assert (per_rank in sizes) == (MIN_LARGE_BYTES <= per_rank <= DEFAULT_MAX_PAYLOAD)
    # The auto switch is reachable on every world size, the backward's on 4 ranks.
    assert -(-_transport.GLOO_SMALL_BYTES // world) in sizes
    if world == 4:
        assert _transport.GLOO_REDUCE_SCATTER_MIN_BYTES // 4 in sizes
    assert _round_state.FUSED_MAX_BYTES in sizes  # per rank: the fused round's largest payload


def test_max_payload_bounds_the_targets() -> None:
    assert per_rank_targets(4, 0) == ()
    assert [t.bytes for t in per_rank_targets(2, 5000)] == [1024, 2048, 4096]
    assert format_bytes(4100) == "4100 B (4.00 KiB)"
    assert format_bytes(4 << 20) == "4 MiB"


def _largest(case: GatherCase) -> int:
    return max(case.shard_bytes)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_large_cases_land_on_each_side_of_a_threshold(delta: int) -> None:
    """A float32 1-d shard of 2^12 bytes, one element below or above it."""
    strategy = vst.gather_cases(world_size=2, dtypes=["float32"], max_ndim=1)
    want = 4096 + 4 * delta
    case = find(strategy, lambda c: want in c.shard_bytes, settings=FIND)
    assert case.shard_bytes.count(want) >= 1


def test_large_cases_are_ragged_and_mix_in_empty_shards() -> None:
    strategy = vst.gather_cases(world_size=3)
    case = find(
        strategy,
        lambda c: _largest(c) >= 4096 and 0 in c.shard_bytes and len(set(c.sizes)) == 3,
        settings=FIND,
    )
    assert _largest(case) >= 4096


def test_the_library_threshold_is_crossed_from_both_sides() -> None:
    """W = 4 gathers just below and just above the auto switch (GLOO_SMALL_BYTES)."""
    strategy = vst.gather_cases(world_size=4, dtypes=["uint8"], max_ndim=1)
    t = _transport.GLOO_SMALL_BYTES
    below = find(strategy, lambda c: t - 8 <= c.output_nbytes < t, settings=FIND)
    above = find(strategy, lambda c: t <= c.output_nbytes <= t + 8, settings=FIND)
    assert below.output_nbytes < t <= above.output_nbytes


@pytest.mark.parametrize("dims", [[3], [-1, 2], [0]])
def test_large_cases_keep_to_the_dims_asked(dims: list[int]) -> None:
    """A large case's ndim is one some asked dim fits, past the large cases' usual ndim
    cap where no smaller one does (dims=[3] drew ndim 1 or 2 and raised InvalidArgument)."""
    strategy = vst.gather_cases(world_size=2, dims=dims, max_ndim=4)
    case = find(strategy, lambda c: _largest(c) >= 4096, settings=FIND)
    assert case.dim in dims


@pytest.mark.parametrize("max_payload", [0, 3000, 100_000])
def test_no_shard_exceeds_max_payload(max_payload: int) -> None:
    small_cap = 5 * 3**4 * 16  # small cases: 5 rows of up to 3^4 complex128 elements

    @settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))
    @given(vst.gather_cases(max_payload=max_payload))
    def check(case: GatherCase) -> None:
        assert _largest(case) <= max(max_payload, small_cap)

    check()


def test_every_property_draws_large_cases_but_empty_all() -> None:
    for prop in catalogue():
        # compiled: small shards by design (every new shape is a compile; the payload
        # path under compile is the eager one, which the other rows draw large).
        # misuse: the misuse catalogue's fixed small scenarios.
        if prop.id in ("empty-all", "uninitialized", "compiled", "misuse"):
            continue
        strategy = prop.strategy((1, 2, 3, 4), transports=("auto",))
        find(strategy, lambda b: any(_largest(c) >= 16 * 1024 for c in b), settings=FIND)


def test_call_sequences_resize_one_rank_and_keep_the_others() -> None:
    strategy = vst.call_sequences(min_world_size=3, max_world_size=3)

    def resized_one(seq: list[GatherCase]) -> bool:
        for a, b in itertools.pairwise(seq):
            same = [x == y for x, y in zip(a.shapes, b.shapes, strict=True)]
            if same.count(False) == 1 and a.dtype == b.dtype and a.dim == b.dim:
                return True
        return False

    seq = find(strategy, resized_one, settings=FIND)
    assert len({c.world_size for c in seq}) == 1
    find(
        strategy,
        lambda s: any(
            x.dtype != y.dtype and x.shapes == y.shapes for x, y in itertools.pairwise(s)
        ),
        settings=FIND,
    )
    find(
        strategy,
        lambda s: any(
            (_largest(x) >= MIN_LARGE_BYTES) != (_largest(y) >= MIN_LARGE_BYTES)
            for x, y in itertools.pairwise(s)
        ),
        settings=FIND,
    )


def test_a_failing_call_is_described_with_the_calls_before_it() -> None:
    first = GatherCase(shapes=((0,), (0,)), dim=0, dtype="float32")
    second = GatherCase(shapes=((1,), (0,)), dim=0, dtype="float32")
    text = describe(second, before=[first])
    assert "call 2 failed, after 1 call(s)" in text
    assert text.count("GatherCase(") == 2
    assert "payload: [4, 0] bytes per rank" in text


LARGE = GatherCase(
    shapes=((5000, 2), (0, 2), (4099, 2)), dim=0, dtype="float32", requires_grad=False, seed=4
)


@pytest.mark.multirank
def test_large_outputs_are_compared_on_the_ranks(usable_transports: tuple[str, ...]) -> None:
    assert LARGE.output_nbytes >= DIGEST_MIN_BYTES
    (ok,) = run_cases([LARGE], implementation("faithful", usable_transports))
    assert ok.ok, ok.failures
    (bad,) = run_cases([LARGE], implementation("chunked_tail_zeroed", usable_transports))
    (failure,) = bad.failures
    assert "compared on the rank" in failure.message
    assert "first at index (" in failure.message
    assert "expected" in failure.message
    assert failure.ranks == (0, 1, 2)

"""The family's call-sequence and payload-scale properties: mixed sequences of the
three collectives on one world, each call judged against the oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from vargather.testing import get_pool
from vargather.testing.catalogues import call_sequences
from vargather.testing.catalogues.all_gather_list import GatherListCase
from vargather.testing.catalogues.all_to_all_v import changing_sizes_sequences
from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase
from vargather.testing.family import check_sequence

pytestmark = pytest.mark.multirank


@settings(max_examples=10, deadline=None)
@given(cases=call_sequences(world_size=3))
def test_mixed_call_sequences(cases: list) -> None:  # type: ignore[type-arg]  # a list of family cases
    assert check_sequence(get_pool(3), cases) == []


@settings(max_examples=10, deadline=None)
@given(cases=changing_sizes_sequences(world_size=3))
def test_send_sizes_changing_call_after_call(cases: list) -> None:  # type: ignore[type-arg]  # a list of family cases
    """``all_to_all_v`` with send sizes (and lengths) changing every call, the rest
    the same: each call the oracle's, whichever way the learned round answered it."""
    assert check_sequence(get_pool(3), cases) == []


def test_payload_scale_crosses_the_fused_and_transport_thresholds() -> None:
    """Small, then above the fused round's 128 KiB and gloo's 256 KiB thresholds, then
    small again: the fused state grows and shrinks alike on every rank."""
    small = GatherListCase(2, ((2, 3), (0, 3)), seed=1)
    large = GatherListCase(2, ((300, 120), (10, 120)), seed=2, special=True)
    big_rs = ReduceScatterCase(2, (700, 200), (128,), 0, seed=3)
    cases = [small, large, big_rs, small, large, small]
    assert check_sequence(get_pool(2), cases) == []


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases=call_sequences(world_size=3, max_calls=10, most=40))
def test_mixed_call_sequences_at_scale(cases: list) -> None:  # type: ignore[type-arg]  # a list of family cases
    assert check_sequence(get_pool(3), cases) == []

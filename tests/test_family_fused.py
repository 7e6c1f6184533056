"""One round for small payloads: a validated ``all_to_all_v`` / ``reduce_scatter_v``
whose every rank's ``x`` fits the group's payload slot rides in the metadata exchange
(``_family.exchange_fused``): one collective, bit for bit the oracle's result, the
state the same on every rank after every call. One state per group, for every kind: a
``reduce_scatter_v`` rides in the slot an ``all_to_all_v`` grew."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import _family_fns as fns
from vargather import _round_state, oracle
from vargather._round_state import (
    FAMILY_FUSED_MAX,
    FusedState,
    advance_blocks,
    block_slot,
    wide_blocks,
)
from vargather.testing import get_pool
from vargather.testing.asserts import assert_bitwise_equal

pytestmark = pytest.mark.multirank

A2A, RS = "all_to_all_v", "reduce_scatter_v"
SEND = ((3, 0, 5), (0, 0, 0), (2, 4, 1))
CASES: tuple[fns.FusedCase, ...] = (
    (A2A, "float32", 16, 0, False, SEND),  # 512 B: the first call, two rounds
    (A2A, "bfloat16", 16, 0, False, SEND),
    (A2A, "bool", 16, 1, True, SEND),
    (A2A, "int16", 16, 0, True, SEND),
    (A2A, "float64", 8, 1, False, SEND),
    (RS, "float32", 16, 0, False, ((2, 0, 3),)),  # the first reduce_scatter_v: the slot fits
    (RS, "bfloat16", 16, 0, False, ((2, 0, 3),)),
    (RS, "bool", 16, 1, True, ((2, 0, 3),)),
    (RS, "int16", 16, 0, False, ((2, 0, 3),)),
    (RS, "float64", 16, 0, False, ((0, 0, 0),)),  # every block empty
    (A2A, "float32", 1024, 0, False, ((40, 10, 10), (1, 1, 1), (0, 0, 3))),  # 160 KiB: wide
    (A2A, "float32", 1024, 0, False, ((40, 10, 10), (1, 1, 1), (0, 0, 3))),  # exact slots
    (A2A, "float32", 16, 0, False, SEND),  # small: rides the wide round, then back
    (RS, "float32", 256, 0, False, ((50, 20, 0),)),  # a 50 KiB block: wide (packed)
    (RS, "float64", 128, 1, False, ((50, 20, 0),)),
    (RS, "float32", 512, 0, False, ((70, 0, 10),)),  # a 140 KiB block: wide again
    (A2A, "float32", 1024, 0, False, ((40,) * 3,) * 3),  # 160 KiB blocks: a miss, slots grow
    (A2A, "float32", 1024, 0, False, ((40,) * 3,) * 3),  # ... so they ride
    (A2A, "float32", 16, 0, False, SEND),  # small in the large slots: one round
)
ISSUED = [2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 2, 1, 2, 2, 1, 1]


def _expected(case: fns.FusedCase, world: int) -> list[torch.Tensor]:
    kind, _, _, dim, _, sizes = case
    xs = [fns.fused_input(case, j, world) for j in range(world)]
    d = 0 if dim == 0 else -1
    if kind == A2A:
        return oracle.expected_all_to_all(xs, sizes, d)
    return oracle.expected_reduce_scatter(xs, sizes[0], d)


def _need(case: fns.FusedCase, world: int) -> int:
    """The largest block (bytes) any rank sends any rank."""
    sizes = case[5]
    t = fns.fused_input(case, 0, world)
    row = t.element_size() * t.numel() // max(1, sum(sizes[0]))
    if sum(sizes[0]) == 0:  # rank 0 has no rows: size a row from the column count
        row = t.element_size() * case[2]
    return max(n for s in sizes for n in s) * row


def _blocks(case: fns.FusedCase, world: int) -> list[int]:
    """The bytes rank ``j`` sends rank ``k``, at ``j * W + k``."""
    kind, sizes = case[0], case[5]
    per_row = _need(case, world) // max(1, max(n for s in sizes for n in s))
    if kind == A2A:
        return [n * per_row for s in sizes for n in s]
    return [n * per_row for n in sizes[0]] * world  # every rank sends block k to rank k


def _judged(
    cases: tuple[fns.FusedCase, ...], per_rank: list[Any], w: int, issued_want: list[int] | None
) -> FusedState:
    """Every call of ``cases`` against the model of the state: the rounds it predicts
    (one when every block fits its slot, else two; and ``issued_want`` when given),
    every rank's state, and the oracle's result bit for bit. The model's last state."""
    model = FusedState()  # the group's one state, whichever kind is called
    for i, case in enumerate(cases):
        blocks = _blocks(case, w)
        room = wide_blocks(model) if model.wide else (model.capacity,) * (w * w)
        predicted = 1 if all(b <= c for b, c in zip(blocks, room, strict=True)) else 2
        model = advance_blocks(model, fusable=True, blocks=blocks, world=w)
        expected = _expected(case, w)
        for r in range(w):
            issued, state, y = per_rank[r][i]
            assert issued == predicted, f"call #{i} on rank {r}: {issued} rounds"
            if issued_want is not None:
                assert issued == issued_want[i], f"call #{i}: the model's own rounds"
            assert state == model, f"call #{i}: rank {r}'s state"
            assert_bitwise_equal(y, expected[r], f"call #{i} on rank {r}")
        assert model.capacity <= block_slot(FAMILY_FUSED_MAX)
    return model


def test_one_round_in_steady_state_two_above_the_bound() -> None:
    w = 3
    model = _judged(CASES, get_pool(w).run(fns.fused_calls, CASES), w, ISSUED)
    # The even 160 KiB blocks went wide: a slot per pair of ranks, each the block.
    assert model.wide == (160 * 1024,) * (w * w)
    assert FAMILY_FUSED_MAX < 160 * 1024


def test_a_subgroup_keeps_its_own_state() -> None:
    results = get_pool(3).run(fns.fused_subgroup, None)
    assert results[1] is None
    (c0, res0, s0), (c2, res2, s2) = results[0], results[2]
    assert c0 == c2 == [3, 2]  # two rounds, then the shared slot fits: one each
    assert s0 == s2
    assert s0.capacity > 0
    xs = [torch.arange(6.0).view(3, 2) + 10 * r for r in (0, 2)]
    a2a = oracle.expected_all_to_all(xs, [[1, 2], [3, 0]])
    rs = oracle.expected_reduce_scatter(xs, [2, 1])
    for me, res in enumerate((res0, res2)):
        for a, r in res:
            assert_bitwise_equal(a, a2a[me])
            assert_bitwise_equal(r, rs[me])


def test_gradients_through_the_one_round_forward_match_the_two_round_one() -> None:
    per_rank = get_pool(3).run(fns.fused_autograd, None)
    for first, second in per_rank:
        assert_bitwise_equal(first, second)  # the second call rode in the exchange


_WIDE_PAST = 48
"""Bytes past which the property's blocks go wide (``FAMILY_FUSED_MAX`` patched down)."""


@st.composite
def _wide_cases(draw: st.DrawFn, w: int = 3) -> tuple[fns.FusedCase, ...]:
    """A run of calls whose blocks mostly go wide: sizes that change, grow past their
    slots, shrink, empty out, or stay; both kinds; dims 0 and -1; strided inputs; NaN
    payloads."""
    cases = []
    for _ in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from([A2A, RS]))
        dtype = draw(st.sampled_from(["float32", "bfloat16", "bool", "int16", "float64"]))
        cols, dim, transposed = draw(st.sampled_from([(4, 0, False), (3, 1, False), (5, 0, True)]))
        n = st.integers(0, 9)
        if kind == A2A:
            sizes = tuple(tuple(draw(n) for _ in range(w)) for _ in range(w))
        else:
            sizes = (tuple(draw(n) for _ in range(w)),)
        # repeated: the steady state, where every slot is its block exactly
        cases += [(kind, dtype, cols, dim, transposed, sizes)] * draw(st.integers(1, 3))
    return tuple(cases)


@pytest.mark.parametrize("path", ["packed", "packed-copies", "short", "whole"])
@settings(max_examples=8, deadline=None)
@given(cases=_wide_cases())
def test_the_wide_round_is_the_oracle_bit_for_bit_and_the_model_s_rounds(
    cases: tuple[fns.FusedCase, ...], path: str
) -> None:
    """With blocks going wide past a few bytes, every call is bit for bit the oracle's,
    issues one round when every block fits its pair's slot (two otherwise, as the
    model of the state predicts), and every rank holds the model's state: packed in
    one alltoallv (rows and blocks in one send buffer, written by ``memmove`` or by
    tensor copies), or as point-to-point messages
    with blocks sent as they lie (gloo's short messages) or as whole slots (the path
    of every other backend)."""
    w = 3
    per_rank = get_pool(w).run(fns.fused_calls_wide, (cases, _WIDE_PAST, path))
    saved = _round_state.FAMILY_FUSED_MAX
    _round_state.FAMILY_FUSED_MAX = _WIDE_PAST  # type: ignore[misc]  # the model's, as the ranks'
    try:
        _judged(cases, per_rank, w, None)
    finally:
        _round_state.FAMILY_FUSED_MAX = saved  # type: ignore[misc]  # restored


def test_a_steady_calls_key_tells_every_argument_apart() -> None:
    """``call_key`` (the steady path's key of a call, ``known_call``): the tensor's
    metadata and every argument with its type, so a call that could check differently
    never reuses another's checked call; calls it cannot key are ``None``."""
    from datetime import timedelta

    from vargather._rows import call_key

    x = torch.zeros(4, 3)
    key = call_key(x, [2, 2], 0, True, None, None)
    assert key is not None
    assert key == call_key(x.clone(), [2, 2], 0, True, None, None)  # the same metadata
    assert key != call_key(x, [2, 2], 0, 1, None, None)  # validate=1 is not True
    assert key != call_key(x, [2, 2], 0, True, 1.0, None)
    assert key != call_key(x.t(), [2, 2], 0, True, None, None)  # other strides
    assert key != call_key(x.requires_grad_(), [2, 2], 0, True, None, None)
    assert call_key(x, [2.0, 2], 0, True, None, None) is None
    assert call_key(x, [2, 2], 0, True, object(), None) is None
    assert call_key([1, 2], [2, 2], 0, True, None, None) is None
    assert call_key(x, [2, 2], 0, True, timedelta(seconds=1), None) is not None

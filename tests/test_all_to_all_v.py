"""all_to_all_v on real gloo worlds: issue 20's 3-rank scenario (a send matrix with
zeros), recv_sizes, misuse and the edges (its catalogue rows, Hypothesis-drawn, run in
tests/test_family_properties.py)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import vargather
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues.all_to_all_v import AllToAllCase
from vargather.testing.family import check_case
from vargather.testing.misuse import MisuseCase, check_misuse

from . import _family_fns as fns

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("dim", [0, -1, 1])
def test_done_when_send_matrix_with_zeros(dim: int) -> None:
    """Issue 20: 3 ranks, a send matrix with zeros (a whole zero row and column too):
    the oracle's bits, and the gradient is the reverse exchange."""
    send = ((1, 0, 2), (0, 0, 0), (2, 0, 1))
    case = AllToAllCase(3, send, (2, 3), dim, special=True, seed=3)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize("dtype", ["bfloat16", "bool", "int16", "complex64", "uint8"])
def test_every_dtype_gloo_carries(dtype: str) -> None:
    case = AllToAllCase(2, ((1, 2), (0, 3)), (2,), -1, dtype=dtype, special=True, pass_recv=True)
    assert check_case(get_pool(2), case) == []


def test_trusted_recv_sizes_and_subgroup() -> None:
    case = AllToAllCase(3, ((0, 2), (3, 1)), (2,), 0, group=(1, 2), pass_recv=True, validate=False)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize(
    "kind",
    [
        "a2a-send-sizes-wrong-length",
        "a2a-sum-mismatch",
        "a2a-recv-sizes-lie",
        "a2a-dtype-differs",
        "a2a-ndim-differs",
        "a2a-trailing-dim-differs",
        "a2a-requires-grad-differs",
    ],
)
def test_misuse_same_error_everywhere(kind: str) -> None:
    assert check_misuse(get_pool(3), MisuseCase("all_to_all_v", kind, 3, 0)) == []


def test_absent_rank_is_the_named_timeout() -> None:
    assert check_misuse(get_pool(2), MisuseCase("all_to_all_v", "absent", 2, 1)) == []


def test_noncontiguous_input() -> None:
    for a, b in get_pool(2).run(fns.noncontiguous_all_to_all, None):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("send", [((0, 0), (0, 0)), ((1, 0), (0, 1)), ((0, 1), (1, 0))])
def test_a_strided_x_of_no_or_one_element(send: tuple[tuple[int, ...], ...]) -> None:
    """A sliced ``x`` of 0 or 1 elements reports contiguous at stride 2, which a flat
    ``view(uint8)`` refuses: the gate's ``non-contiguous`` row found every rank raising
    ``self.stride(-1) must be 1`` here (``validate=False``, no other dims)."""
    for validate in (False, True):
        case = AllToAllCase(
            world_size=2, send=send, other=(), dim=0, memory="sliced", validate=validate, seed=1
        )
        assert check_case(get_pool(2), case) == []


def test_one_process_world_and_layout() -> None:
    x = torch.arange(6.0).view(3, 2)
    res = vargather.all_to_all_v_with_layout(x, [3])
    assert_bitwise_equal(res.tensor, x)
    assert res.layout.sizes == (3,)
    assert res.send_sizes == (3,)
    with pytest.raises(vargather.SizesError, match="world size 1"):
        vargather.all_to_all_v(x, [1, 2])
    with pytest.raises(vargather.SizesMismatchError, match="recv_sizes"):
        vargather.all_to_all_v(x, [3], recv_sizes=[2])


_WIDE = (((8, 12, 20), (16, 9, 10), (11, 14, 18)), (11, 20, 12))
_STEADY_SIZES = {
    # blocks of 16-40 KiB: the packed wide round
    "packed": _WIDE,
    # the same by direct sends (slots past PACKED_WIDE_MAX, patched): blocks as they lie
    # in x (gloo's), or whole slots (every other backend's)
    "direct": _WIDE,
    "direct-whole": _WIDE,
    # blocks of 0-6 KiB: the equal round, replayed as packed equal slots
    "equal": (((1, 2, 3), (2, 0, 1), (3, 1, 2)), (2, 3, 1)),
}


def _steady_steps(shape: str) -> tuple[fns.SteadyStep, ...]:
    """A steady caller (the same sizes every call) whose peers change under it: rank
    2's sizes change once, then rank 1 sends float64; steady again in between; then
    every rank asks for a gradient."""
    steady, rank_2 = _STEADY_SIZES[shape]
    moved = (steady[0], steady[1], rank_2)
    steps = [fns.SteadyStep(steady)] * 12
    steps += [fns.SteadyStep(moved)] + [fns.SteadyStep(steady)] * 12
    steps += [fns.SteadyStep(steady, dtypes=("float32", "float64", "float32"))]
    steps += [fns.SteadyStep(steady)] * 3 + [fns.SteadyStep(steady, grad=True)] * 12
    return tuple(steps)


@pytest.mark.parametrize("shape", sorted(_STEADY_SIZES))
def test_the_steady_path_is_the_full_path(shape: str) -> None:
    """``all_to_all_v``'s steady path (a call repeating the last steady one replays its
    round: packed, or by direct sends) gives the oracle's bits and gradients, and when a peer's call
    differs (its sizes, its dtype) every rank still gets the full path's answer or its
    error: the same ``DTypeMismatchError`` everywhere, the group usable after."""

    steps = _steady_steps(shape)
    w = 3
    per_rank = get_pool(w).run(fns.steady_calls, (steps, shape))
    answered = [[r[i][3] for r in per_rank] for i in range(len(steps))]
    for i, step in enumerate(steps):
        if step.dtypes:
            for r in range(w):
                assert per_rank[r][i][:2] == ("raised", "DTypeMismatchError"), (i, per_rank[r][i])
            assert len({per_rank[r][i][2] for r in range(w)}) == 1  # the same message
            continue
        _assert_the_oracles(per_rank, i, step)
    # The path was taken: steady calls answered by it once the state settled; the
    # call after a peer's change by it on the unchanged ranks (rows differed: the full
    # path's validation answered) and, for new sizes that fit the slots, on the
    # changed rank too (the same round with its new sizes); by none after an error
    # until steady again. Every rank holds the same state after every call.
    assert all(answered[11])
    assert all(answered[24])
    # rank 2's sizes changed: within its slots in the equal round (the same round with
    # its new sizes), past them in the wide round's exact slots (the full path)
    assert answered[12] == [True, True, shape == "equal"]
    assert answered[25] == [True, False, True]  # rank 1's dtype changed
    assert all(answered[-1])
    _assert_one_state(per_rank)


def _assert_the_oracles(per_rank: list[list[Any]], i: int, step: fns.SteadyStep) -> None:
    """Step ``i`` of ``steady_calls`` answered on every rank with the oracle's result,
    bit for bit, and with its input gradient when the step wanted one."""
    from vargather import oracle

    w = len(per_rank)
    inputs = [fns.steady_input(r, i, sum(step.send[r])) for r in range(w)]
    want = oracle.expected_all_to_all(inputs, step.send)
    grads_of = functools.partial(oracle.expected_all_to_all_grads, inputs, step.send)
    fns.assert_step_answered(per_rank, i, want, grads_of if step.grad else None)


def _assert_one_state(per_rank: list[list[Any]]) -> None:
    """Every rank holds the same state of the round after every step."""
    for i in range(len(per_rank[0])):
        states = [per_rank[r][i][4] for r in range(len(per_rank))]
        assert all(s == states[0] for s in states), (i, states)


def _changing(base: tuple[tuple[int, ...], ...], i: int) -> tuple[tuple[int, ...], ...]:
    """``base`` with one row moved on every rank, each rank its own way, at call ``i``:
    sizes that change every call, within a row of ``base``."""
    w = len(base)
    out = []
    for r, sizes in enumerate(base):
        s = list(sizes)
        grow, shrink = (i + r) % w, (i + r + 1) % w
        moved = min(1, s[shrink])
        s[grow] += moved
        s[shrink] -= moved
        out.append(tuple(s))
    return tuple(out)


@pytest.mark.parametrize("shape", sorted(_STEADY_SIZES))
def test_sizes_changing_every_call_ride_the_same_round(shape: str) -> None:
    """Send sizes that change every call, each rank its own way, within the slots the
    round learned: once the first of them grew the slots, every call is answered by
    the same round with the new sizes (``_resized_call``), bit for bit the oracle's,
    gradients too, inputs of another length too; a peer whose record changed otherwise
    is read and validated in full; a rank whose block outgrows its slot takes the full
    path (every rank gets the right answer, the slots grow); a rank whose sizes do not
    add up to its rows makes every rank raise the same ``SizesError``; every rank holds
    the same state after every call."""
    base, _ = _STEADY_SIZES[shape]
    w = len(base)
    steps = [fns.SteadyStep(base)] * 12
    steps += [fns.SteadyStep(_changing(base, i)) for i in range(12)]
    # rank 2 sends one row fewer (its input one row shorter: its record's length too)
    fewer = len(steps)
    last = _changing(base, 12)
    steps += [fns.SteadyStep((last[0], last[1], (last[2][0] - 1, *last[2][1:])))]
    # rank 2 passes dim=-2 (the same dimension: valid, but another record)
    other_dim = len(steps)
    steps += [fns.SteadyStep(_changing(base, 13), dims=(0, 0, -2))]
    steps += [fns.SteadyStep(_changing(base, i)) for i in range(2)]
    grown_at = len(steps)
    grown = tuple(tuple(3 * n + 6 for n in s) if r == 1 else s for r, s in enumerate(base))
    steps += [fns.SteadyStep(grown)]
    steps += [fns.SteadyStep(_changing(base, i)) for i in range(3)]
    bad = len(steps)
    steps += [
        fns.SteadyStep(_changing(base, 5), rows=(sum(base[0]), sum(base[1]) + 1, sum(base[2])))
    ]
    steps += [fns.SteadyStep(_changing(base, i), grad=True) for i in range(12)]
    per_rank = get_pool(w).run(fns.steady_calls, (tuple(steps), shape))
    for i, step in enumerate(steps):
        if i == bad:
            for r in range(w):
                assert per_rank[r][i][:2] == ("raised", "SizesError"), (i, per_rank[r][i])
                assert "rank(s) [1]" in per_rank[r][i][2]
            assert len({per_rank[r][i][2] for r in range(w)}) == 1  # the same message
            continue
        _assert_the_oracles(per_rank, i, step)
    answered = [[per_rank[r][i][3] for r in range(w)] for i in range(len(steps))]
    # the first new sizes outgrow the learned slots (the full path grows them, by
    # ``bucket``); from then on the same round carries every call
    assert all(all(a) for a in answered[16:24]), answered[12:24]
    # another length along dim rides the same round too (the peers read it from its
    # row); another record (dim as passed) is read and validated in full by the peers
    # (the full path's answer, from the same round), and is new to rank 2's round
    assert answered[fewer] == [True, True, True]
    assert answered[other_dim] == [True, True, False]
    assert answered[grown_at] == [True, False, True]  # rank 1's blocks outgrew its slots
    assert not answered[bad][1]  # the full path reported rank 1's own problem
    # a gradient is another key (the full path first); rank 1's grown slots shrink back
    # after SHRINK_AFTER calls that do not need them (the full path once more)
    assert all(all(a) for a in answered[-4:]), answered[bad:]
    _assert_one_state(per_rank)


def test_each_group_keeps_its_own_steady_call() -> None:
    """Calls alternating between two groups are both steady once their states settle:
    the last steady call is kept per group (weakly: a destroyed group takes it along)."""
    per_rank = get_pool(3).run(fns.steady_two_groups, 16)
    for pairs in per_rank:
        assert pairs[-1] == (True, True), pairs


def _row_of(
    rows: int,
    sizes: tuple[int, ...],
    *,
    flag: int = 3,
    requires: bool = False,
    recv: tuple[int, ...] | None = None,
) -> bytes:
    """One rank's ``all_to_all_v`` row as the round carries it: a call of ``rows`` rows
    of 4 float32 sent by ``sizes``, no ``recv_sizes``."""
    import array

    from vargather._args import CallRecord
    from vargather._collectives import COLLECTIVES
    from vargather._wire import encode_row

    w = len(sizes)
    record = CallRecord(
        problem=None,
        ndim=2,
        dtype_code=6,
        dim=0,
        normalized_dim=0,
        contract_code=0,
        transport_code=0,
        requires_grad=requires,
        device_code=0,
        sizes_len=-1,
        sizes_own=-1,
        sizes_sum=-1,
        sizes_hash=-1,
        shape=(rows, 4),
    )
    extras = (w, *sizes, *((-1,) * (w + 1) if recv is None else (w, *recv)))
    words = encode_row(record, COLLECTIVES["all_to_all_v"].code, extras, w, flag)
    return array.array("q", words).tobytes()


def test_resized_rows_are_read_only_when_nothing_else_changed() -> None:
    """``resized_matrix`` (the same round with new sizes, receive side) gives the send
    matrix of rows that differ from the last validated ones only in each rank's length
    along ``dim`` and its send sizes, and ``None`` (the full path's validation) for rows
    whose sizes do not add up to their length, are negative, or outgrow a slot, and for
    rows that differ in anything else (a flag, the record)."""
    from vargather._all_to_all import resized_matrix

    room, unit = (64 * 16,) * 9, 16  # every slot 64 rows of 16 bytes
    last = b"".join(_row_of(sum(s), s) for s in ((1, 2, 3), (4, 5, 6), (7, 8, 9)))
    new = ((3, 2, 1), (6, 5, 4), (10, 0, 0))
    raw = b"".join(_row_of(sum(s), s) for s in new)
    assert resized_matrix(raw, last, 3, 0, room, unit) == new
    assert resized_matrix(last, last, 3, 0, room, unit) == ((1, 2, 3), (4, 5, 6), (7, 8, 9))

    def with_row(j: int, row: bytes) -> bytes:
        rows = [_row_of(sum(s), s) for s in new]
        rows[j] = row
        return b"".join(rows)

    assert resized_matrix(with_row(1, _row_of(16, (6, 5, 4))), last, 3, 0, room, unit) is None
    assert resized_matrix(with_row(2, _row_of(10, (11, -1, 0))), last, 3, 0, room, unit) is None
    assert resized_matrix(with_row(0, _row_of(65, (65, 0, 0))), last, 3, 0, room, unit) is None
    assert (
        resized_matrix(with_row(0, _row_of(6, (3, 2, 1), flag=1)), last, 3, 0, room, unit) is None
    )
    changed = _row_of(6, (3, 2, 1), requires=True)
    assert resized_matrix(with_row(0, changed), last, 3, 0, room, unit) is None
    assert resized_matrix(raw[:-8], last, 3, 0, room, unit) is None  # another length
    # receive sizes passed: read when they are the rank's column, else the full path
    told = b"".join(_row_of(sum(s), s, recv=tuple(t[r] for t in new)) for r, s in enumerate(new))
    assert resized_matrix(told, last, 3, 0, room, unit) == new
    lie = _row_of(6, (3, 2, 1), recv=(3, 6, 9))  # rank 0 receives (3, 6, 10)
    assert resized_matrix(with_row(0, lie), last, 3, 0, room, unit) is None


def test_passed_receive_sizes_ride_the_same_round_and_a_lie_is_caught() -> None:
    """Sizes changing every call with every rank passing its true ``recv_sizes`` (a
    combine that knows them): the same round carries the calls; a rank whose
    ``recv_sizes`` contradict the others' send sizes makes every rank raise the same
    ``SizesMismatchError``, and the calls after it are right again."""
    base = _WIDE[0]

    def told(send: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(s[r] for s in send) for r in range(len(send)))

    steps = [fns.SteadyStep(base, recv=told(base))] * 12
    steps += [fns.SteadyStep(_changing(base, i), recv=told(_changing(base, i))) for i in range(8)]
    lie = len(steps)
    sizes = _changing(base, 8)
    wrong = list(told(sizes))
    wrong[2] = (wrong[2][0] + 1, *wrong[2][1:])
    steps += [fns.SteadyStep(sizes, recv=tuple(wrong))]
    steps += [fns.SteadyStep(_changing(base, i), recv=told(_changing(base, i))) for i in range(4)]
    per_rank = get_pool(3).run(fns.steady_calls, (tuple(steps), "direct"))
    for i, step in enumerate(steps):
        if i == lie:
            for r in range(3):
                assert per_rank[r][i][:2] == ("raised", "SizesMismatchError"), per_rank[r][i]
                assert "rank(s) [2]" in per_rank[r][i][2]
            assert len({per_rank[r][i][2] for r in range(3)}) == 1  # the same message
            continue
        _assert_the_oracles(per_rank, i, step)
    answered = [[per_rank[r][i][3] for r in range(3)] for i in range(len(steps))]
    assert all(all(a) for a in answered[16:lie]), answered[12:]
    assert all(answered[-1]), answered[lie:]
    _assert_one_state(per_rank)


def test_a_rank_that_never_sends_itself_rides_the_same_round() -> None:
    """By direct sends, a rank whose own block is always empty (its own slot 0, so the
    next rank's region starts where its own does) gets every result right while the
    other blocks change size every call (its own block, empty, rides the round and
    moves nothing)."""
    base = ((8, 12, 20), (16, 0, 10), (11, 14, 18))
    steps = [fns.SteadyStep(base)] * 12
    for i in range(12):
        moved = 1 if i % 2 else -1
        rank_1 = (16 + moved, 0, 10 - moved)
        steps.append(fns.SteadyStep((_changing(base, i)[0], rank_1, _changing(base, i)[2])))
    per_rank = get_pool(3).run(fns.steady_calls, (tuple(steps), "direct"))
    for i, step in enumerate(steps):
        _assert_the_oracles(per_rank, i, step)
    answered = [[per_rank[r][i][3] for r in range(3)] for i in range(len(steps))]
    # the first changed sizes grow the slots (the full path); the slots' shrink after
    # SHRINK_AFTER calls that do not fill them is the full path again (the last call)
    assert all(all(a) for a in answered[16:23]), answered[12:]
    _assert_one_state(per_rank)


def test_the_steady_path_never_replays_a_round_the_state_no_longer_runs() -> None:
    """A remembered direct round is not replayed once the group's state runs the equal
    round with the very same slots (possible when ``PACKED_WIDE_MAX`` is below the equal
    slots): the state's kind of round is checked, not its slots alone. Rank 0 is on the
    full path throughout, its peers on the steady path; every result is the oracle's and
    the group went direct and came back."""
    from vargather import oracle

    per_rank = get_pool(3).run(fns.round_kind_changes_under_the_steady_path, 12)
    w, calls = 3, len(per_rank[0])
    kinds = [per_rank[0][i][2] for i in range(calls)]
    assert True in kinds, kinds  # the group went direct
    assert kinds[-1] is False, kinds  # and came back to the equal round
    back = kinds.index(False, kinds.index(True))  # the first call after the way back
    for i in range(calls):
        xs = [per_rank[j][i][0] for j in range(w)]
        rows = xs[0].shape[0] // w
        want = oracle.expected_all_to_all(xs, [[rows] * w] * w)
        for r in range(w):
            assert_bitwise_equal(per_rank[r][i][1], want[r])
        assert len({per_rank[r][i][2] for r in range(w)}) == 1, i  # one state everywhere
    # rank 0 never on the steady path; its peers replayed the direct round on it, but
    # not in the call after the way back (the state's round is the equal one)
    assert back + 1 < calls, kinds
    assert not any(per_rank[0][i][3] for i in range(3, calls))
    for r in (1, 2):
        assert any(per_rank[r][i][3] for i in range(3, back + 1)), r
        assert not per_rank[r][back + 1][3], r

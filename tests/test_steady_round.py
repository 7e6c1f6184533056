"""The round's steady replay (``vargather._steady``) for ``reduce_scatter_v``,
``gather_v`` and ``scatter_v``: a validated call that repeats the group's last steady
one is answered by the replayed round, bit for bit the oracle's, gradients too, and a
peer's bad input or new sizes still give every rank the full path's answer or error.
``all_to_all_v``'s own steady tests are in ``test_all_to_all_v``."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from vargather import oracle
from vargather.testing import get_pool

from . import _family_fns as fns

_SIZES = {
    # rows of 2 KiB: blocks of 0-6 KiB ride the equal round, replayed as packed equal
    # slots; 16-40 KiB the packed wide round, or (patched) the direct sends
    "equal": ((1, 2, 3), (2, 0, 1)),
    "packed": ((8, 12, 20), (11, 20, 12)),
    "direct": ((8, 12, 20), (11, 20, 12)),
    "direct-whole": ((8, 12, 20), (11, 20, 12)),
}
_BAD = 2  # the rank that passes float64 once


def _steps(path: str) -> tuple[fns.RoundStep, ...]:
    """Steady calls; new sizes once, then steady again; one rank's bad input, then
    steady again; then steady calls with a gradient."""
    base, moved = _SIZES[path]
    steps = [fns.RoundStep(base)] * 10 + [fns.RoundStep(moved)] + [fns.RoundStep(base)] * 10
    steps += [fns.RoundStep(base, bad=_BAD)] + [fns.RoundStep(base)] * 3
    steps += [fns.RoundStep(base, grad=True)] * 8
    return tuple(steps)


def _expected(name: str, inputs: list[torch.Tensor], sizes: tuple[int, ...]) -> list[torch.Tensor]:
    if name == "reduce_scatter_v":
        return oracle.expected_reduce_scatter(inputs, sizes)
    if name == "gather_v":
        return oracle.expected_gather_v(inputs, fns.ROUND_ROOT)
    return oracle.expected_scatter_v(inputs, sizes, fns.ROUND_ROOT)


def _expected_grads(
    name: str, inputs: list[torch.Tensor], sizes: tuple[int, ...], ups: list[torch.Tensor]
) -> list[torch.Tensor]:
    if name == "reduce_scatter_v":
        return oracle.expected_reduce_scatter_grads(inputs, sizes, ups)
    if name == "gather_v":
        return oracle.expected_gather_v_grads(inputs, fns.ROUND_ROOT, ups)
    return oracle.expected_scatter_v_grads(inputs, sizes, fns.ROUND_ROOT, ups)


@pytest.mark.parametrize("path", sorted(_SIZES))
@pytest.mark.parametrize("name", ["reduce_scatter_v", "gather_v", "scatter_v"])
def test_the_replayed_round_is_the_full_path(name: str, path: str) -> None:
    """Every step answered on every rank with the oracle's bits (and gradients, each
    rank's upstream its own); the replay answered the steady calls, the good ranks'
    replay raised the bad rank's error (the same on every rank, the group usable after)
    and the call after it, whose rows are the steady ones again, was replayed too;
    every rank holds the same state after every call."""
    steps = _steps(path)
    w = 3
    per_rank: list[list[Any]] = get_pool(w).run(fns.steady_round_calls, (name, steps, path))
    for i, step in enumerate(steps):
        if step.bad >= 0:
            for r in range(w):
                assert per_rank[r][i][:2] == ("raised", "DTypeMismatchError"), (i, per_rank[r][i])
            assert len({per_rank[r][i][2] for r in range(w)}) == 1  # the same message
            continue
        inputs = [fns.round_input(name, r, i, step) for r in range(w)]
        want = _expected(name, inputs, step.sizes)
        grads_of = functools.partial(_expected_grads, name, inputs, step.sizes)
        fns.assert_step_answered(per_rank, i, want, grads_of if step.grad else None)
    answered = [[per_rank[r][i][3] for r in range(w)] for i in range(len(steps))]
    bad = next(i for i, s in enumerate(steps) if s.bad >= 0)
    assert all(answered[9]), answered[:10]  # steady
    assert not any(answered[10])  # new sizes: another key on every rank (the full path)
    assert all(answered[bad - 1]), answered[10:bad]  # steady again
    assert answered[bad] == [r != _BAD for r in range(w)]  # the peers' error, replayed
    assert all(answered[bad + 1])  # the same rows as before the error: replayed
    assert not any(answered[bad + 4])  # a gradient is another key: the full path first
    assert all(answered[-1]), answered[bad:]
    for i in range(len(steps)):
        states = [per_rank[r][i][4] for r in range(w)]
        assert all(s == states[0] for s in states), (i, states)

"""Faults on real gloo worlds: a rank that never arrives, dies mid-call, or runs a
backward its peers skip. The others raise a ``CollectiveError`` within the timeout,
naming the missing rank when the arrival census knows it; the harness reports it and
the next call gets a fresh, working world.

These tests run on private pools with a short collective timeout (2 s) so that a
fault costs seconds, mostly 2-rank worlds because each fault costs a rebuild of the
world (seconds, spawning and importing torch). No assertion is timed: the pool's
``call_timeout`` (60 s) turns a hang into a ``RankHung`` failure instead of a stuck
run.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

import vargather
from vargather.testing import RankCrashed, RankOutcome, RankPool, assert_bitwise_equal
from vargather.testing import misuse as fns

if TYPE_CHECKING:
    import _fault_fns as faults
else:  # a sibling module, whether or not tests/ is a package (its name is what the ranks import)
    faults = importlib.import_module(f"{__package__}._fault_fns" if __package__ else "_fault_fns")

pytestmark = pytest.mark.multirank

TIMEOUT = 2.0


# Forked from a forkserver: the faults below leave worlds to rebuild, and a forked rank
# does not import torch again.
@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    with RankPool(2, collective_timeout=TIMEOUT, call_timeout=60.0, start_method="forkserver") as p:
        yield p


@pytest.fixture(scope="module")
def pool3() -> Iterator[RankPool]:
    with RankPool(3, collective_timeout=TIMEOUT, call_timeout=60.0, start_method="forkserver") as p:
        yield p


def ragged(world_size: int = 2, **call: object) -> fns.Scenario:
    """A valid ragged gather (sizes 2, 0, 3, ...) of float64 rows."""
    spec = [fns.TensorSpec(((2, 0, 3, 1)[r], 2), "float64") for r in range(world_size)]
    return fns.Scenario("all_gather_v", tuple(fns.call("all_gather_v", x, **call) for x in spec))


def assert_recovers(pool: RankPool) -> None:
    """The harness rebuilds the world and the next gather is right."""
    before = pool.generation
    scenario = fns.valid_scenario("all_gather_v", pool.world_size)
    results = pool.run(fns.run_call, scenario)
    assert pool.generation == before + 1, "the out-of-step world was not rebuilt"
    want, grads = fns.expected_of(scenario)
    for r, got in enumerate(results):
        assert got is not None
        assert_bitwise_equal(got.output, want[r])
        want_grad = grads[r]
        assert got.grad is not None
        assert want_grad is not None
        assert_bitwise_equal(got.grad, want_grad)


def assert_the_others_name(
    outcomes: Sequence[RankOutcome[Any]], absent: int, what: str, timeout: float | None
) -> None:
    """Rank ``absent`` returned; every other rank raised ``CollectiveTimeoutError`` in
    ``what``, naming it, within ``timeout`` (the call's) or else the group's."""
    assert outcomes[absent].ok
    within = (
        f"within {TIMEOUT:g} s (the group's timeout)"
        if timeout is None
        else f"within {timeout:g} s (this call's timeout)"
    )
    for o in outcomes:
        if o.rank == absent:
            continue
        error = o.exception
        assert type(error) is vargather.CollectiveTimeoutError, o.traceback
        message = str(error)
        assert f"rank(s) [{absent}] never arrived at this collective" in message
        assert what in message
        assert within in message
        assert "destroy it and create a new one" in message
        assert error.ranks == (absent,)


@pytest.mark.parametrize(
    ("world_size", "absent"),
    # W=3 with a middle rank absent in the default run; W=2 (the same census, one peer)
    # on the slow schedule: each costs a full collective timeout.
    [pytest.param(2, 0, marks=pytest.mark.slow), (3, 1)],
)
def test_a_rank_that_never_arrives_is_named_by_the_others(
    request: pytest.FixtureRequest, world_size: int, absent: int
) -> None:
    pool: RankPool = request.getfixturevalue("pool" if world_size == 2 else "pool3")
    outcomes = pool.run_outcomes(faults.skip_call_on, (absent, ragged(world_size)))
    assert outcomes[absent].value is None
    # The gather round moves by direct sends on gloo: 2 (W - 1) of them.
    what = f"send/recv x{2 * (world_size - 1)} (metadata exchange)"
    assert_the_others_name(outcomes, absent, what, None)
    assert_recovers(pool)


def test_a_rank_that_leaves_after_the_exchange_is_named(pool: RankPool) -> None:
    """Rank 1 runs only the metadata exchange: rank 0 waits for it in the payload
    collective, and the census says where rank 1 was last seen."""
    outcomes = pool.run_outcomes(faults.layout_only_on, (1, ragged()))
    assert outcomes[1].ok
    assert outcomes[1].value == (2, 0)
    for r in (0,):
        error = outcomes[r].exception
        assert type(error) is vargather.CollectiveTimeoutError, outcomes[r].traceback
        message = str(error)
        assert "all_to_all on rank" in message
        assert "rank(s) [1] never arrived at this collective" in message
        assert "rank 1 is at #" in message
        assert error.ranks == (1,)
    assert_recovers(pool)


def test_a_rank_killed_mid_call_is_reported_and_the_world_recovers(pool: RankPool) -> None:
    """Rank 1 is SIGKILLed inside all_gather_v, between the metadata exchange and the
    payload collective rank 0 is already in. Rank 0 sees gloo's closed connection as
    ``PeerLostError`` at once; the pool reports the dead rank and rebuilds."""
    with pytest.raises(RankCrashed) as info:
        pool.run(faults.kill_between_exchange_and_payload, (1, ragged()))
    assert info.value.ranks == (1,)
    assert info.value.exitcodes[1] == -9
    report = str(info.value)
    for r in (0,):
        section = report.split(f"--- rank {r} raised:", 1)
        assert len(section) == 2, f"rank {r}'s error is not in the report:\n{report}"
        assert "vargather.PeerLostError" in section[1] or (
            "vargather.CollectiveTimeoutError" in section[1]
        ), report
        # Killed before the payload collective: the census names it.
        assert "rank(s) [1] had not arrived at this collective" in section[1] or (
            "rank(s) [1] never arrived at this collective" in section[1]
        ), report
    assert_recovers(pool)


def test_a_backward_that_the_peers_skip_times_out(pool: RankPool) -> None:
    """Under grad="sum" the backward is a reduce-scatter. Rank 0 runs it, its peers do
    not (nothing in the forward can know): rank 0 raises ``CollectiveTimeoutError``
    through autograd, naming the ranks that never arrived, instead of waiting forever."""
    spec = [fns.TensorSpec(((2, 0)[r], 2), "float64", requires_grad=True) for r in range(2)]
    scenario = fns.Scenario("all_gather_v", tuple(fns.call("all_gather_v", x) for x in spec))
    outcomes = pool.run_outcomes(faults.backward_on_one_rank, (0, scenario))
    assert [o.ok for o in outcomes] == [False, True]
    error = outcomes[0].exception
    assert type(error) is vargather.CollectiveTimeoutError, outcomes[0].traceback
    assert "rank(s) [1] never arrived at this collective" in str(error)
    assert "all_to_all" in str(error) or "reduce_scatter" in str(error)
    assert error.ranks == (1,)
    assert_recovers(pool)


def test_a_lie_under_validate_false_raises_alone_and_the_peers_time_out(pool: RankPool) -> None:
    """``validate=False`` skips the exchange, so a rank whose sizes contradict its own
    tensor raises on its own; its peers wait for it and name it."""
    calls = ragged(sizes=[2, 0], validate=False).calls
    scenario = fns.Scenario("all_gather_v", (calls[0], calls[1].with_(sizes=[2, 5])))
    outcomes = pool.run_outcomes(fns.run_call, scenario)
    liar = outcomes[1].exception
    assert type(liar) is vargather.SizesError, outcomes[1].traceback
    assert "validate=False: raised on this rank only" in str(liar)
    assert "expected sizes[1] == 0 (its tensor's size along dim 0), got sizes[1] = 5" in str(liar)
    for r in (0,):
        error = outcomes[r].exception
        assert type(error) is vargather.CollectiveTimeoutError, outcomes[r].traceback
        assert "rank(s) [1] never arrived at this collective" in str(error)
    assert_recovers(pool)


def test_a_per_call_timeout_replaces_the_groups_for_that_call(pool: RankPool) -> None:
    outcomes = pool.run_outcomes(faults.skip_call_on, (1, ragged(timeout=1.0)))
    for r in (0,):
        error = outcomes[r].exception
        assert type(error) is vargather.CollectiveTimeoutError, outcomes[r].traceback
        assert "within 1 s (this call's timeout)" in str(error)
        assert error.ranks == (1,)
    assert_recovers(pool)
    # A call that succeeds under its own timeout leaves the group's timeout as it was.
    results = pool.run(fns.run_call, ragged(timeout=1.5))
    want, _ = fns.expected_of(ragged())
    for got in results:
        assert_bitwise_equal(got.output, want[0])
    assert pool.run(faults.group_timeout_seconds, None) == [TIMEOUT] * 2


@pytest.mark.parametrize(("world_size", "timeout"), [(3, None), (2, 1.0)])
def test_a_rank_that_never_arrives_at_a_wide_round_is_named_by_the_others(
    request: pytest.FixtureRequest, world_size: int, timeout: float | None
) -> None:
    """The wide round moves by point-to-point sends, not collectives: a missing rank is
    still named, within the call's timeout when it has one (the waits take it)."""
    pool: RankPool = request.getfixturevalue("pool" if world_size == 2 else "pool3")
    absent = 1
    outcomes = pool.run_outcomes(faults.skip_a_wide_call_on, (absent, timeout))
    assert len(outcomes[absent].value) == world_size, "the group never went wide"
    what = f"send/recv x{2 * (world_size - 1)} (metadata exchange)"
    assert_the_others_name(outcomes, absent, what, timeout)
    assert_recovers(pool)


def test_the_census_switch_is_validated_at_import() -> None:
    """``VARGATHER_ARRIVAL_CENSUS`` takes '1' or '0'; anything else fails at import,
    listing the valid values."""
    env = {**os.environ, "VARGATHER_ARRIVAL_CENSUS": "yes"}
    bad = subprocess.run(
        [sys.executable, "-c", "import vargather"], env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert "$VARGATHER_ARRIVAL_CENSUS='yes' is not understood" in bad.stderr
    assert "expected '1' (on, the default) or '0'" in bad.stderr
    env["VARGATHER_ARRIVAL_CENSUS"] = "0"
    code = "import vargather._census as c; print(c.arrival_census_enabled())"
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert off.stdout.strip() == "False", off.stderr


@pytest.mark.parametrize(
    ("gather", "other"),
    [
        ("all_gather_v", "reduce_scatter_v"),
        pytest.param("all_gather_list", "all_to_all_v", marks=pytest.mark.slow),
    ],
    ids=["all_gather_v-beside-reduce_scatter_v", "all_gather_list-beside-all_to_all_v"],
)
def test_an_all_gather_beside_an_all_to_all_times_out_naming_the_other_collective(
    pool: RankPool, gather: str, other: str
) -> None:
    """Not "every rank raises the same error" (docs/misuse.md): rank 0 calls an
    all_gather-based collective, rank 1 an all_to_all-based one, so their metadata
    rounds are different collective types and neither can read the other's. Both wait
    for the group's timeout (2 s); each raises the named timeout (or, when its peer
    gave up first, the lost peer) whose census says the ranks are out of step and in
    which collective the other rank is. The group is out of step: the world is rebuilt,
    and then the collective works."""
    base = fns.misuse_by_name("none-input", other).good
    assert base is not None
    calls = (fns.call(gather, fns.TensorSpec((2, 3))), base(1, 2))
    outcomes = pool.run_outcomes(fns.run_call, fns.Scenario(other, calls))
    where = {
        0: "is in send/recv x2 (metadata exchange)",
        1: f"is in all_to_all ({other} metadata exchange)",
    }
    for o in outcomes:
        assert isinstance(
            o.exception, (vargather.CollectiveTimeoutError, vargather.PeerLostError)
        ), f"rank {o.rank}: {o.exc_type_name}: {o.exception}"
        message = str(o.exception)
        peer = 1 - o.rank
        assert "ranks are out of step at collective" in message, message
        assert f"rank {peer} {where[peer]}" in message, message
        assert "destroy it and create a new one" in message, message
    pool.restart()
    valid = fns.Scenario(other, (base(0, 2), base(1, 2)))
    for got, want in zip(pool.run(fns.run_call, valid), fns.expected_of(valid)[0], strict=True):
        assert got is not None
        assert_bitwise_equal(got.output, want)

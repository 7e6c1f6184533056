"""The persistent multi-rank pool (vargather.testing) on real gloo worlds."""

from __future__ import annotations

import importlib
import os
import pickle
import re
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

import vargather.testing as vt
from vargather.testing import (
    PoolFailure,
    RankContext,
    RankCrashed,
    RankError,
    RankHung,
    RankOutcome,
    RankPool,
    RemoteException,
    get_pool,
)

if TYPE_CHECKING:
    import _pool_fns as fns
else:  # a sibling module, whether or not tests/ is a package (its name is what the ranks import)
    fns = importlib.import_module(f"{__package__}._pool_fns" if __package__ else "_pool_fns")

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module")
def fragile() -> Iterator[RankPool]:
    """A private 2-rank pool for the tests that crash, hang or desync their world.

    Short timeouts: a collective a peer skips fails after 2 s; a call is declared hung
    after 3 s. Each test leaves it to be rebuilt transparently by the next one, so it
    uses the forkserver start method: a rebuild then costs ~0.05 s instead of ~1.2 s
    of CPU per rank (test_spawned_world_crashes_and_rebuilds covers spawn).
    """
    with RankPool(2, collective_timeout=2.0, call_timeout=3.0, start_method="forkserver") as pool:
        yield pool


# --- results and collectives -----------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_results_come_back_in_rank_order(world_size: int) -> None:
    pool = get_pool(world_size)
    results = pool.run(fns.whoami, None)
    assert [r[0] for r in results] == list(range(world_size))
    assert all(r[1] == world_size for r in results)
    pids = [r[2] for r in results]
    assert len(set(pids)) == world_size
    assert pool.pids == tuple(pids)
    assert os.getpid() not in pids


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_a_real_collective_runs(world_size: int) -> None:
    results = get_pool(world_size).run(fns.all_reduce_rank, None)
    assert results == [world_size * (world_size + 1) // 2] * world_size


def test_ranks_are_single_threaded_and_initialized() -> None:
    assert get_pool(2).run(fns.env_and_threads, None) == [("1", 1, True)] * 2


def test_payload_reaches_every_rank_and_tensors_travel_by_value() -> None:
    pool = get_pool(2)
    tensor = torch.arange(6).reshape(2, 3)
    payload = {"a": [1, 2.5, "x"], "t": tensor}
    results = pool.run(fns.identity, payload)
    for got in results:
        assert got["a"] == payload["a"]
        assert torch.equal(got["t"], tensor)
    assert pool.run(fns.tensor_payload_sum, torch.ones(1000)) == [1000.0, 1000.0]
    big = pool.run(fns.big_tensor, 2_000_000)
    for rank, t in enumerate(big):
        assert t.shape == (2_000_000,)
        assert t[0].item() == rank
        assert t[-1].item() == 1_999_999 + rank


def test_result_tensors_are_detached_and_compact() -> None:
    (got,) = get_pool(1).run(fns.tensor_views, None)
    view = got["view"]
    assert view.tolist() == [5.0, 6.0, 7.0]
    assert view.untyped_storage().nbytes() == 3 * 4  # not the 10 000-element base
    nonleaf = got["nonleaf"]
    assert nonleaf.tolist() == [0.0, 2.0, 4.0]
    assert nonleaf.requires_grad
    assert nonleaf.grad_fn is None
    assert nonleaf.is_leaf
    transposed = got["transposed"]
    assert transposed.stride() == (1, 3)
    assert transposed.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert got["leaf_grad"].requires_grad


# --- rank exceptions -------------------------------------------------------------


def test_rank_exception_names_the_rank_and_keeps_the_group() -> None:
    pool = get_pool(3)
    pool.run(fns.all_reduce_rank, None)  # make sure the world is up
    pids, generation = pool.pids, pool.generation
    with pytest.raises(RankError) as info:
        pool.run(fns.raise_on, 1)
    message = str(info.value)
    assert "rank 1" in message
    assert "rank 0" not in message
    assert "rank 2" not in message
    assert "Traceback (most recent call last)" in message
    assert "boom from rank 1" in message
    assert "in raise_on" in message  # the rank's own frame
    assert [o.rank for o in info.value.failures] == [1]
    assert info.value.payload_index is None
    # Same processes, same process group, and it still works.
    assert pool.pids == pids
    assert pool.generation == generation
    assert pool.run(fns.all_reduce_rank, None) == [6, 6, 6]


def test_run_outcomes_reports_each_rank() -> None:
    pool = get_pool(3)
    outcomes = pool.run_outcomes(fns.raise_on, 2)
    assert [o.rank for o in outcomes] == [0, 1, 2]
    assert [o.ok for o in outcomes] == [True, True, False]
    assert [o.value for o in outcomes[:2]] == [0, 1]
    bad = outcomes[2]
    assert isinstance(bad, RankOutcome)
    assert isinstance(bad.exception, fns.CustomError)
    assert isinstance(bad.exception, ValueError)
    assert str(bad.exception) == "boom from rank 2"
    assert bad.exc_type_name is not None
    assert bad.exc_type_name.endswith("_pool_fns.CustomError")
    assert bad.traceback is not None
    assert "boom from rank 2" in bad.traceback
    assert bad.value is None
    everywhere = pool.run_outcomes(fns.raise_everywhere, None)
    assert all(isinstance(o.exception, KeyError) for o in everywhere)
    assert [o.exc_type_name for o in everywhere] == ["KeyError"] * 3
    assert pool.run(fns.all_reduce_rank, None) == [6, 6, 6]


def test_unpicklable_exception_falls_back_to_remote_exception() -> None:
    outcomes = get_pool(2).run_outcomes(fns.raise_unpicklable, None)
    for rank, outcome in enumerate(outcomes):
        exc = outcome.exception
        assert isinstance(exc, RemoteException)
        assert exc.type_name.endswith("_pool_fns.UnpicklableError")
        assert exc.message == f"code 7: rank {rank}"
        assert outcome.exc_type_name == exc.type_name


def test_unpicklable_result_is_a_rank_error() -> None:
    pool = get_pool(2)
    with pytest.raises(RankError, match="not picklable"):
        pool.run(fns.return_unpicklable, None)
    assert pool.run(fns.all_reduce_rank, None) == [3, 3]


def test_unpicklable_fn_is_refused_in_the_parent() -> None:
    pool = get_pool(1)
    with pytest.raises(TypeError, match="module-level function"):
        pool.run(lambda ctx, p: p, None)
    assert pool.run(fns.identity, 5) == [5]


def test_rank_error_pickles() -> None:
    import pickle

    with pytest.raises(RankError) as info:
        get_pool(2).run(fns.raise_on, 0)
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value)
    assert copy.outcomes[1].value == 1


# --- subgroups -------------------------------------------------------------------


def test_subgroup_gathers_only_members() -> None:
    pool = get_pool(3)
    assert pool.run(fns.gather_subgroup, [0, 2]) == [[0, 2], None, [0, 2]]
    assert pool.run(fns.gather_subgroup, [1, 2]) == [None, [1, 2], [1, 2]]
    assert pool.run(fns.subgroup_identity, [2, 0]) == [True, True, True]
    assert pool.run(fns.gather_subgroup, [0, 2]) == [[0, 2], None, [0, 2]]


def test_subgroup_rejects_bad_ranks() -> None:
    with pytest.raises(RankError, match="not a rank of a world of 2"):
        get_pool(2).run(fns.gather_subgroup, [0, 5])


# --- batches ---------------------------------------------------------------------


def test_run_many_returns_per_payload_per_rank() -> None:
    pool = get_pool(2)
    payloads = list(range(50))
    assert pool.run_many(fns.all_reduce_plus, payloads) == [[2 * p + 1] * 2 for p in payloads]
    assert pool.run_many(fns.identity, []) == []


def test_run_many_stops_at_the_failing_payload() -> None:
    pool = get_pool(3)
    with pytest.raises(RankError) as info:
        pool.run_many(fns.raise_on, [-1, -1, 2, 0, -1])
    assert info.value.payload_index == 2
    assert "payload index 2" in str(info.value)
    assert [o.ok for o in info.value.outcomes] == [True, True, False]
    assert pool.run(fns.all_reduce_rank, None) == [6, 6, 6]


def test_run_many_names_the_payload_whose_result_does_not_pickle() -> None:
    pool = get_pool(2)
    with pytest.raises(RankError, match="not picklable") as info:
        pool.run_many(fns.unpicklable_at, [(i, 2) for i in range(4)])
    assert info.value.payload_index == 2
    assert pool.run_many(fns.unpicklable_at, [(0, 9), (1, 9)]) == [[0, 0], [1, 1]]


def test_run_many_amortizes_the_round_trip() -> None:
    """Prints the figures; asserts nothing about time (shared CI machines vary)."""
    pool = get_pool(2)
    pool.run(fns.identity, None)
    n = 50
    start = time.perf_counter()
    for i in range(n):
        pool.run(fns.identity, i)
    per_run = (time.perf_counter() - start) / n
    start = time.perf_counter()
    pool.run_many(fns.identity, list(range(n)))
    per_many = (time.perf_counter() - start) / n
    print(
        f"\n2 ranks: run {per_run * 1e3:.2f} ms/payload, run_many {per_many * 1e3:.3f} ms/payload"
    )


# --- pools side by side, lifecycle ------------------------------------------------


def test_two_pools_of_one_size_do_not_collide_and_close_cleanly() -> None:
    shared = get_pool(2)  # spawned
    with RankPool(2, start_method="forkserver") as own:  # cheap to build; same FileStore scheme
        for i in range(5):
            assert shared.run(fns.all_reduce_plus, i) == [2 * i + 1] * 2
            assert own.run(fns.all_reduce_plus, 10 * i) == [20 * i + 1] * 2
        assert set(own.pids).isdisjoint(shared.pids)
    assert own.closed
    assert own.last_exitcodes == (0, 0)  # destroy_process_group, then a normal exit
    with pytest.raises(RuntimeError, match="closed"):
        own.run(fns.identity, None)
    own.close()  # idempotent
    assert shared.run(fns.all_reduce_rank, None) == [3, 3]


def test_settings_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="world_size"):
        RankPool(0)
    with pytest.raises(ValueError, match="call_timeout"):
        RankPool(1, call_timeout=-1.0)
    resolve = vt.PoolConfig.resolve
    assert resolve(2).collective_timeout == 10.0
    monkeypatch.setenv(vt.COLLECTIVE_TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"VARGATHER_POOL_COLLECTIVE_TIMEOUT.*'soon'"):
        RankPool(1)
    monkeypatch.setenv(vt.COLLECTIVE_TIMEOUT_ENV, "-3")
    with pytest.raises(ValueError, match="'-3'"):
        resolve(1)
    monkeypatch.setenv(vt.COLLECTIVE_TIMEOUT_ENV, "3.5")
    assert resolve(1).collective_timeout == 3.5
    assert resolve(1, collective_timeout=7.0).collective_timeout == 7.0  # explicit wins
    with pytest.raises(ValueError, match="'fork' is refused"):
        resolve(1, start_method="fork")
    with pytest.raises(ValueError, match="environment= needs start_method='spawn'"):
        resolve(1, start_method="forkserver", environment={"OMP_NUM_THREADS": "2"})


def test_shared_pools_fork_their_ranks_from_a_server() -> None:
    """``get_pool``'s worlds are rebuilt after every failure: forked, not spawned."""
    assert vt.pool.DEFAULT_SHARED_START_METHOD == "forkserver"  # Linux has one
    assert get_pool(1).config.start_method == "forkserver"
    with RankPool(1) as own:
        assert own.config.start_method == "spawn"  # a pool of one's own: as asked


# --- world failures: crashes, hangs, timeouts ------------------------------------


def test_os_exit_is_a_crash_and_the_pool_rebuilds(fragile: RankPool) -> None:
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]
    generation, pids = fragile.generation, fragile.pids
    with pytest.raises(RankCrashed) as info:
        fragile.run(fns.exit_on, 1)
    assert info.value.ranks == (1,)
    assert info.value.exitcodes == {1: 3}
    assert "rank 1 (exit code 3)" in str(info.value)
    assert isinstance(info.value, PoolFailure)
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]
    assert fragile.generation == generation + 1
    assert set(fragile.pids).isdisjoint(pids)


def test_a_crash_names_the_payload_the_dead_rank_was_running(fragile: RankPool) -> None:
    """``in_flight``: rank 1 died in payload 2; rank 0, which needs no peer, finished
    the batch and is absent. The record survives pickling (the gate ships it)."""
    with pytest.raises(RankCrashed) as info:
        fragile.run_many(fns.exit_at, [(i, 2, 1) for i in range(4)])
    assert info.value.ranks == (1,)
    assert info.value.in_flight == {1: 2}
    assert pickle.loads(pickle.dumps(info.value)).in_flight == {1: 2}
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]


def test_spawned_world_crashes_and_rebuilds() -> None:
    with RankPool(1) as pool:
        assert pool.config.start_method == "spawn"
        with pytest.raises(RankCrashed, match=r"rank 0 \(exit code 3\)"):
            pool.run(fns.exit_on, 0)
        assert pool.run(fns.all_reduce_rank, None) == [1]
        assert pool.generation == 2


def test_sigkill_is_a_crash(fragile: RankPool) -> None:
    with pytest.raises(RankCrashed, match="SIGKILL") as info:
        fragile.run(fns.sigkill_on, 0)
    assert info.value.ranks == (0,)
    assert info.value.exitcodes == {0: -signal.SIGKILL}
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]


def test_restart_builds_a_fresh_world() -> None:
    pool = get_pool(1)
    pool.run(fns.identity, None)
    generation, pids = pool.generation, pool.pids
    pool.restart()
    assert pool.last_exitcodes == (0,)  # a clean stop
    assert pool.generation == generation + 1
    assert pool.run(fns.all_reduce_rank, None) == [1]
    assert pool.pids != pids


def test_rank_killed_while_idle_is_reported_on_the_next_call(fragile: RankPool) -> None:
    fragile.run(fns.identity, None)
    victim = fragile._world.procs[1] if fragile._world else None  # private: to await its death
    assert victim is not None
    os.kill(fragile.pids[1], signal.SIGKILL)
    victim.join(10.0)
    with pytest.raises(RankCrashed, match="while idle") as info:
        fragile.run(fns.identity, None)
    assert info.value.ranks == (1,)
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]


def test_gloo_abort_is_a_crash_quoting_the_rank_stderr(fragile: RankPool) -> None:
    # Trailing dims 2 vs 3 in an equal-size gather: gloo's enforce aborts a rank.
    with pytest.raises(RankCrashed, match="SIGABRT") as info:
        fragile.run(fns.mismatched_trailing_dim, None)
    assert -signal.SIGABRT in info.value.exitcodes.values()
    assert "Received data size doesn't match expected size" in str(info.value)
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]


def test_a_rank_past_call_timeout_is_hung(fragile: RankPool) -> None:
    fragile.run(fns.identity, None)
    with pytest.raises(RankHung) as info:
        fragile.run(fns.sleep_on, (1, 60.0))
    assert info.value.ranks == (1,)
    assert info.value.in_flight == {1: 0}  # rank 0 replied: it is in no payload
    assert "rank(s) 1 did not reply" in str(info.value)
    assert "call_timeout=3 s" in str(info.value)
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]


def test_a_skipped_collective_times_out_as_a_rank_exception(fragile: RankPool) -> None:
    fragile.run(fns.identity, None)
    generation = fragile.generation
    with pytest.raises(RankError) as info:
        fragile.run(fns.skip_collective_on, 1)
    outcomes = info.value.outcomes
    assert outcomes[1].ok
    assert outcomes[1].value == -1
    assert not outcomes[0].ok
    assert isinstance(outcomes[0].exception, RuntimeError)  # gloo's (DistBackendError)
    assert "Timed out" in str(outcomes[0].exception)
    # The ranks' collective counts now differ: the error says so, and the pool rebuilds
    # the world before the next call.
    assert "out of step" in str(info.value)
    assert fragile.run(fns.all_reduce_rank, None) == [3, 3]
    assert fragile.generation == generation + 1


@pytest.mark.parametrize(
    ("members", "want"),
    [
        (None, [[0.0], [1.0, 101.0], [2.0, 102.0]]),
        ([0, 1, 2], [[0.0], [1.0, 101.0], [2.0, 102.0]]),
        ([1, 2], [[], [1.0], [2.0, 101.0]]),  # group ranks are not global ranks
    ],
    ids=["world", "subgroup", "subgroup-1-2"],
)
def test_uneven_point_to_point_traffic_keeps_the_world(
    members: list[int] | None, want: list[list[float]]
) -> None:
    """gloo's sequence number of a group counts each send and receive on the rank that
    posts it, so a correctly paired exchange where one rank sends to two peers leaves
    the ranks' numbers different (2, 1, 1). The world is not out of step: the pool
    compares the ranks' collectives, and pairs their sends with receives, and keeps it
    (a rebuilt world is a new generation, without the state a library keeps per group
    between calls)."""
    pool = get_pool(3)
    pool.run(fns.all_reduce_rank, None)  # make sure the world is up and in step
    generation = pool.generation
    assert pool.run(fns.fan_out, (members, "")) == want
    assert "stale" not in repr(pool)
    assert pool.run(fns.all_reduce_rank, None) == [6, 6, 6]
    assert pool.generation == generation


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ("collective", "the ranks' collective counts for the world group differ"),
        ("send", "rank 0 posted 2 send(s) to rank 1, which posted 1 receive(s) from it"),
    ],
    ids=["collective", "send"],
)
def test_a_world_out_of_step_beside_point_to_point_traffic_is_rebuilt(extra: str, why: str) -> None:
    """The same uneven exchange, then an all_reduce started on two ranks of three and
    never awaited, or a send that no receive takes (neither raises): the world is out
    of step, the pool says why (in the error of a rank that raised after) and rebuilds
    it before the next call."""
    with RankPool(3, start_method="forkserver") as pool:
        with pytest.raises(RankError, match=re.escape(why)) as info:
            pool.run(fns.fan_out, (None, extra))
        assert [o.value for o in info.value.outcomes] == [[0.0], [1.0, 101.0], None]
        assert "rebuilds the world before the next call" in str(info.value)
        assert "stale" in repr(pool)
        assert pool.generation == 1
        assert pool.run(fns.all_reduce_rank, None) == [6, 6, 6]
        assert pool.generation == 2


def test_rank_context_repr() -> None:
    assert repr(RankContext(1, 2, 5.0)) == "RankContext(rank=1, world_size=2)"


def test_get_pool_caches_one_pool_per_world_size() -> None:
    pool = get_pool(1)
    assert get_pool(1) is pool
    assert get_pool(2) is not pool
    other = get_pool(1, call_timeout=30.0)  # other settings replace the cached pool
    assert other is not pool
    assert pool.closed
    assert other.config.call_timeout == 30.0
    assert get_pool(1, call_timeout=30.0) is other
    assert get_pool(1) is not other  # back to the defaults
    assert other.closed


def test_ranks_default_inductor_to_scalar_kernels_compiled_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank sets inductor's ISA probe off and one compile thread where the environment
    leaves them unset, also in an inductor config a forkserver imported before; a value
    the environment sets (even empty) is the user's and stays."""
    from types import SimpleNamespace

    from vargather.testing import rank_side

    for name in rank_side.INDUCTOR_RANK_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    config = SimpleNamespace(cpp=SimpleNamespace(vec_isa_ok=None), compile_threads=2)
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    rank_side.set_inductor_rank_defaults()
    assert (config.cpp.vec_isa_ok, config.compile_threads) == (False, 1)
    assert {n: os.environ[n] for n in rank_side.INDUCTOR_RANK_DEFAULTS} == {
        "TORCHINDUCTOR_VEC_ISA_OK": "0",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }

    monkeypatch.setenv("TORCHINDUCTOR_VEC_ISA_OK", "")
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "2")
    config = SimpleNamespace(cpp=SimpleNamespace(vec_isa_ok=None), compile_threads=2)
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    rank_side.set_inductor_rank_defaults()
    assert (config.cpp.vec_isa_ok, config.compile_threads) == (None, 2)
    assert os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == ""


def test_a_rank_compiles_with_the_pools_inductor_settings() -> None:
    """In a real rank (forked from the suite's forkserver) inductor's config holds them."""
    assert get_pool(1).run(fns.inductor_settings, None) == [(False, 1)]


def test_the_forkserver_preloads_compile_modules_only_where_no_gpu_is_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a machine with a CUDA device the forkserver must not import what
    ``preload`` added (dynamo, inductor): with them imported there, every fork of the
    server failed to use CUDA ("Cannot re-initialize CUDA in forked subprocess"), and
    ``check --compile`` failed every row on an H200 (``docs/compile.md``)."""
    monkeypatch.setattr(vt.world, "_PRELOAD", ["torch._dynamo", "torch._inductor.compile_fx"])
    base = ["torch", "torch.distributed", "vargather.testing.rank_side"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vt.world._server_preload() == [
        *base[:2],
        "torch._dynamo",
        "torch._inductor.compile_fx",
        base[2],
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert vt.world._server_preload() == base

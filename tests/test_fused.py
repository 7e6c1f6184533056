"""The fused round (``vargather._fused``) on real gloo worlds: ranks never disagree.

Each test runs a script of calls on one world; after every call each rank reports the
outcome, how many collectives it issued and its copy of the group's fused state. The
tests assert that every member of the group reports the same state and the same number
of collectives after every call (calls that raise, subgroups, ``validate=False`` calls
interleaved, shapes and dtypes changing between calls, a capacity miss on one rank
only, ``dim != 0``, empty shards, the shrink rule), that a steady-state validated call
issues exactly one collective, and that every output is the oracle's bit for bit and
every gradient the oracle's under per-rank upstream gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from vargather import _round_buffers, _round_state, oracle
from vargather.testing import assert_bitwise_equal, get_pool

from ._fused_fns import (
    Step,
    grad_shard,
    handed_back_buffers,
    kept_buffers,
    lazy_views_in_the_fused_round,
    make_shard,
    raw_bytes,
    run_script,
    steady_gathers,
    steady_shard,
    steady_upstream,
    strided_in_the_fused_round,
    upstream,
    views_on_one_rank,
    wrapped_in_the_fused_round,
)

pytestmark = pytest.mark.multirank


def _seed(world_rank: int) -> int:
    return 31 * world_rank + 1


def _expected(step: Step, members: Sequence[int]) -> tuple[list[torch.Tensor], Any]:
    """The oracle's outputs and (for a grad step) per-member input gradients."""
    make = grad_shard if step.grad is not None else make_shard
    if step.op == "v":
        per_tensor = [
            [make(step.shapes[q], step.dtypes[q], _seed(w)) for q, w in enumerate(members)]
        ]
        dims = [step.dim]
    else:
        k = len(step.shapes[0])
        dims = list(step.dim) if isinstance(step.dim, tuple) else [step.dim] * k
        per_tensor = [
            [
                make(step.shapes[q][i], step.dtypes[q][i], _seed(w) + i)
                for q, w in enumerate(members)
            ]
            for i in range(k)
        ]
    outputs = [
        oracle.expected_output(shards, d) for shards, d in zip(per_tensor, dims, strict=False)
    ]
    if step.grad is None:
        return outputs, None
    grads = []
    for i, (shards, d, out) in enumerate(zip(per_tensor, dims, outputs, strict=True)):
        if not (out.is_floating_point() or out.is_complex()):
            grads.append([None] * len(members))
            continue
        dtype = str(out.dtype).removeprefix("torch.")
        ups = [upstream(tuple(out.shape), dtype, _seed(w) + i) for w in members]
        grads.append(oracle.expected_input_grads(shards, ups, d, step.grad))
    return outputs, grads


def check_script(
    world: int,
    steps: Sequence[Step],
    errors: Sequence[str | None],
    collectives: Sequence[int | None],
) -> list[list[Any]]:
    """Run ``steps`` and check agreement, outcomes and the expected collective counts."""
    results = get_pool(world).run(run_script, list(steps))
    for s, step in enumerate(steps):
        members = step.group if step.group is not None else tuple(range(world))
        seen = [results[w][s] for w in members]
        assert all(o is not None for o in seen)
        where = f"step {s} ({step})"
        states = {o["state"] for o in seen}
        assert len(states) == 1, f"{where}: ranks disagree on the fused state: {states}"
        counts = [o["collectives"] for o in seen]
        assert len(set(counts)) == 1, f"{where}: ranks issued {counts} collectives"
        if collectives[s] is not None:
            assert (
                seen[0]["forward" if "forward" in seen[0] else "collectives"] == (collectives[s])
            ), f"{where}: {seen[0].get('forward')} forward collectives"
        for w in range(world):
            if w not in members:
                assert results[w][s] is None
        if errors[s] is not None:
            got = {o.get("error") for o in seen}
            assert len(got) == 1, f"{where}: ranks raised differently: {got}"
            (error,) = got
            assert error is not None, f"{where}: no error"
            assert error[0] == errors[s], f"{where}: {error}"
            assert all(o["state"] == o["state_before"] for o in seen), (
                f"{where}: a call that raised changed the state"
            )
            continue
        assert all("error" not in o for o in seen), f"{where}: {[o.get('error') for o in seen]}"
        if step.sizes and not step.validate:
            assert all(o["state"] == o["state_before"] for o in seen), (
                f"{where}: a validate=False call changed the state"
            )
        want, grads = _expected(step, members)
        for q, o in enumerate(seen):
            assert len(o["outputs"]) == len(want)
            for got_t, want_t in zip(o["outputs"], want, strict=False):
                assert_bitwise_equal(got_t, want_t, f"{where}: member {q}")
            if grads is not None:
                for i, g in enumerate(o["grads"]):
                    if grads[i][q] is None:
                        assert g is None, f"{where}: member {q} tensor {i} has a gradient"
                    elif step.grad == "mean":
                        torch.testing.assert_close(g, grads[i][q], rtol=0, atol=1e-6)
                    else:
                        assert torch.equal(g, grads[i][q]), f"{where}: member {q} tensor {i}"
    return results


F32 = ("float32",) * 3


def test_bucket_overhead_and_steps() -> None:
    assert _round_state.bucket(0) == 0
    assert _round_state.bucket(1) == _round_state.bucket(64) == 64
    previous = 0
    for n in range(1, 300_000, 37):
        b = _round_state.bucket(n)
        assert n <= b <= n * 1.125 or b == 64, n
        assert b >= previous  # monotone: a bigger need never gets a smaller bucket
        previous = b
    assert _round_state.bucket(_round_state.FUSED_MAX_BYTES) == _round_state.FUSED_MAX_BYTES


def test_advance_grows_at_once_and_shrinks_after_idle_calls() -> None:
    s = _round_state.FusedState()
    s = _round_state.advance(s, fusable=True, need=1000, count=1)
    assert s.capacity == 1024
    s = _round_state.advance(s, fusable=True, need=5000, count=1)  # a miss: grows
    assert s.capacity == _round_state.bucket(5000)
    grown = s.capacity
    for i in range(_round_state.SHRINK_AFTER - 1):  # far below the capacity: idle
        s = _round_state.advance(s, fusable=True, need=100 + i, count=1)
        assert s.capacity == grown
    s = _round_state.advance(s, fusable=True, need=10, count=1)
    assert s.capacity == _round_state.bucket(100 + _round_state.SHRINK_AFTER - 2)
    # too large or not fusable: idle, the capacity never grows past the threshold
    t_need = _round_state.FUSED_MAX_BYTES + 1
    t = _round_state.advance(_round_state.FusedState(), fusable=True, need=t_need, count=1)
    assert t.capacity == 0
    assert t.idle == 0  # nothing to shrink from 0: no streak counted, a fixed point
    assert _round_state.advance(t, fusable=True, need=t_need, count=1) is t
    t = _round_state.advance(_round_state.FusedState(), fusable=False, need=100, count=1)
    assert t.capacity == 0
    # slots: up at once, down after SHRINK_AFTER calls with fewer tensors
    u = _round_state.advance(_round_state.FusedState(), fusable=True, need=10, count=3)
    assert u.slots == 3
    for _ in range(_round_state.SHRINK_AFTER):
        u = _round_state.advance(u, fusable=True, need=10, count=2)
    assert u.slots == 2


def test_ranks_agree_on_every_call_of_a_mixed_script_at_three_ranks() -> None:
    steps = [
        # first call: headers only (capacity 0), then the payload
        Step("v", ((3, 4), (1, 4), (0, 4)), F32),
        # steady state: one collective
        Step("v", ((3, 4), (1, 4), (0, 4)), F32),
        Step("v", ((1, 4), (3, 4), (2, 4)), F32),
        # a capacity miss on rank 2 only: two rounds, every rank grows alike
        Step("v", ((2, 4), (2, 4), (9, 4)), F32),
        Step("v", ((2, 4), (2, 4), (9, 4)), F32),
        # a dtype on one rank: every rank raises the same error, the state is unchanged
        Step("v", ((2, 4), (2, 4), (1, 4)), ("float32", "float64", "float32")),
        # a local problem (a 0-d tensor on rank 1): the follow-up round carries its text
        Step("v", ((2, 4), (), (1, 4)), F32),
        # validate=False with sizes: no exchange, the state untouched
        Step("v", ((1, 4), (2, 4), (3, 4)), F32, sizes=True, validate=False),
        # a subgroup keeps its own state
        Step("v", ((2, 4), (3, 4)), ("float64",) * 2, group=(0, 2)),
        Step("v", ((2, 4), (3, 4)), ("float64",) * 2, group=(0, 2)),
        # the world's state survived the subgroup's calls
        Step("v", ((2, 4), (2, 4), (1, 4)), F32),
        # another dtype and shape, dim != 0, within the capacity
        Step("v", ((2, 1, 4), (2, 0, 4), (2, 2, 4)), ("bfloat16",) * 3, dim=1),
        Step("v", ((2, 3), (2, 0), (2, 1)), ("complex64",) * 3, dim=-1),
        Step("v", ((3,), (0,), (2,)), ("bool",) * 3),
        Step("v", ((0, 4), (0, 4), (0, 4)), F32),
        # sizes passed and validated
        Step("v", ((1, 4), (0, 4), (2, 4)), F32, sizes=True),
        # too wide for a compact header: the full records, and still agreement
        Step("v", ((1, 1, 1, 1, 1, 1, 2),) * 3, ("int64",) * 3, dim=6),
        # a forced transport: headers, then the payload
        Step("v", ((1, 4), (3, 4), (2, 4)), F32, transport="padded"),
        # above the threshold: today's transports
        Step("v", ((70_000,), (1,), (2,)), F32),
    ]
    errors: list[str | None] = [None] * len(steps)
    errors[5] = "DTypeMismatchError"
    errors[6] = "InputShapeError"
    collectives: list[int | None] = [None] * len(steps)
    collectives[0] = 2
    collectives[1] = collectives[2] = 1
    collectives[3] = 2
    collectives[4] = 1
    collectives[7] = 1
    collectives[8] = 2
    collectives[9] = 1
    collectives[10] = collectives[11] = collectives[12] = collectives[13] = 1
    collectives[14] = collectives[15] = 1
    collectives[17] = 2
    collectives[18] = 2
    results = check_script(3, steps, errors, collectives)
    # the miss on rank 2 grew the capacity on every rank to hold 9 rows of 16 bytes
    assert results[0][3]["state"][0][0] == _round_state.bucket(9 * 16)
    # the subgroup's state did not leak into the world's, nor the world's into the
    # subgroup's (rank 1 is not a member)
    world_before, world_after = results[0][7]["state"], results[0][10]["state_before"]
    assert world_before == world_after
    assert results[0][8]["state_before"][0] == tuple(_round_state.FusedState().__dict__.values())
    # the error message is today's, with its text (sent in the follow-up round)
    assert "expected a tensor with at least 1 dimension" in results[0][6]["error"][1]


def test_capacity_shrinks_identically_after_idle_calls() -> None:
    big = Step("v", ((400, 4), (1, 4)), ("float32",) * 2)
    tiny = Step("v", ((1, 4), (1, 4)), ("float32",) * 2)
    steps = [big, big] + [tiny] * (_round_state.SHRINK_AFTER + 1)
    collectives: list[int | None] = [2, 1] + [1] * (_round_state.SHRINK_AFTER + 1)
    results = check_script(2, steps, [None] * len(steps), collectives)
    caps = [results[0][s]["state"][0][0] for s in range(len(steps))]
    assert caps[1] == _round_state.bucket(400 * 16)
    assert caps[1 + _round_state.SHRINK_AFTER] == _round_state.bucket(16), caps


@pytest.mark.parametrize("contract", ["sum", "local", "mean"])
@pytest.mark.parametrize("world", [2, 3])
def test_gradients_of_fused_gathers_match_the_oracle(contract: str, world: int) -> None:
    shapes_0 = tuple((r + 1, 3) for r in range(world))
    shapes_1 = tuple((2, (2 * r) % 3, 2) for r in range(world))
    steps = [
        Step("v", shapes_0, ("float32",) * world, grad=contract),
        Step("v", shapes_0, ("float32",) * world, grad=contract),  # fused
        Step("v", shapes_1, ("float64",) * world, dim=1, grad=contract),  # fused, dim 1
        Step("v", shapes_1, ("complex64",) * world, dim=-2, grad=contract),
    ]
    check_script(world, steps, [None] * 4, [2, 1, 1, 1])


def test_views_is_refused_on_a_one_rank_gloo_world() -> None:
    for coalesced in (False, True):
        (outcome,) = get_pool(1).run(views_on_one_rank, coalesced)
        name, message = outcome
        assert name == "ArgumentError", message
        assert "transport='views'" in message
        assert "gloo" in message


def test_views_is_refused_by_the_argument_checks_whenever_the_backend_is_gloo() -> None:
    from vargather._args import Problem, check_call
    from vargather._group import GroupInfo

    def problem(info: GroupInfo) -> Problem | None:
        call = check_call(torch.ones(2), 0, sizes=None, grad="sum", transport="views", info=info)
        return call.record.problem

    for world in (1, 2, 3):
        found = problem(GroupInfo(None, 0, world, True, "gloo"))
        assert found is not None, world
        assert "transport='views'" in found.message
    # no torch.distributed at all: no backend to refuse it
    assert problem(GroupInfo(None, 0, 1, False, "none")) is None


@pytest.mark.parametrize("world", [2, 3])
def test_kept_buffers_give_fresh_exact_results(world: int) -> None:
    """The fused round keeps its send and receive buffers per group: every result is
    ``torch.cat`` of the shards bit for bit (strided shards, shrinking payloads, dims
    other than 0, unaligned coalesced offsets) and no later call changes an earlier one."""
    results = get_pool(world).run(kept_buffers, world)
    assert results == [[]] * world, results


def test_a_large_rounds_buffer_is_received_into_again_only_once_its_result_is_gone() -> None:
    world = 4  # the gather round's receive buffer passes _KEEP_RECV_MAX from 4 ranks
    results = get_pool(world).run(handed_back_buffers, world)
    assert results == [[]] * world, results


def test_the_storage_owner_count_sees_views_and_saved_tensors() -> None:
    """``_round_buffers.unreferenced`` reads torch's private count of a storage's owners: it
    must see a view, a ``numpy()`` array and a tensor autograd saved for the backward."""
    buf = torch.empty(64, dtype=torch.uint8)
    assert _round_buffers.unreferenced(buf)
    view = buf[:32].view(torch.float32)
    assert not _round_buffers.unreferenced(buf)
    del view
    assert _round_buffers.unreferenced(buf)
    array = buf[:8].numpy()
    assert not _round_buffers.unreferenced(buf)
    del array
    weight = torch.ones(2, dtype=torch.float32, requires_grad=True)
    loss = (buf[:8].view(torch.float32) * weight).sum()  # saves the view for the backward
    assert not _round_buffers.unreferenced(buf)
    del loss
    assert _round_buffers.unreferenced(buf)


@pytest.mark.multirank
@pytest.mark.parametrize("dtype", ["float32", "complex64", "bool"])
def test_strided_shards_ride_the_fused_round(dtype: str) -> None:
    """A sliced or transposed shard packs into the fused round like a contiguous one
    (its bytes are copied, never viewed with the wrong strides): every rank gets the
    oracle's bytes, and the steady-state calls take one collective."""
    world = 2
    results = get_pool(world).run(strided_in_the_fused_round, dtype)
    for i, layout in enumerate(("sliced", "transposed", "sliced", "transposed")):
        shards = []
        for r in range(world):
            base = make_shard((r + 1, 8), dtype, seed=11 + r)
            shards.append(base[:, ::2] if layout == "sliced" else base)
        want = raw_bytes(torch.cat(shards, 0))
        for r in range(world):
            got, one_collective = results[r][i]
            assert got == want, f"call {i} ({layout}) on rank {r}: bytes differ from the oracle"
            if i >= 2:
                assert one_collective, f"call {i} on rank {r} took more than one collective"


@pytest.mark.parametrize("kind", ["parameter", "subclass", "offset"])
def test_parameters_subclasses_and_offset_views_ride_the_fused_round(kind: str) -> None:
    """The gather round copies a plain contiguous CPU tensor's bytes from its
    ``data_ptr()`` (a ``Parameter`` and a view into its storage are plain; a subclass
    is not, and takes the view copy): every rank gets the oracle's bytes in one
    collective either way."""
    world = 3
    results = get_pool(world).run(wrapped_in_the_fused_round, kind)
    want = raw_bytes(
        torch.cat([make_shard((r + 3, 5), "float64", seed=41 + r)[1:] for r in range(world)])
    )
    for r in range(world):
        for i, (got, one_collective) in enumerate(results[r]):
            assert got == want, f"{kind}, call {i} on rank {r}: bytes differ from the oracle"
            if i >= 1:
                assert one_collective, f"{kind}, call {i} on rank {r}: more than one collective"


@pytest.mark.multirank
@pytest.mark.parametrize("kind", ["conj", "neg"])
def test_lazily_conjugated_or_negated_shards_ride_the_fused_round(kind: str) -> None:
    """``x.conj()`` and a negative view carry a bit instead of their own bytes: the round
    resolves it while packing (a rank that raised there alone would leave its peers
    waiting), and every rank gets the oracle's bytes in one collective."""
    world = 2
    results = get_pool(world).run(lazy_views_in_the_fused_round, kind)
    dtype = "complex64" if kind == "conj" else "float32"
    shards = []
    for r in range(world):
        base = make_shard((r + 1, 3), dtype, seed=21 + r)
        shards.append(base.conj().resolve_conj() if kind == "conj" else -base)
    want = raw_bytes(torch.cat(shards, 0))
    for r in range(world):
        for i, (got, one_collective) in enumerate(results[r]):
            assert got == want, f"call {i} on rank {r}: bytes differ from the oracle"
            if i >= 1:
                assert one_collective, f"call {i} on rank {r} took more than one collective"


BIG = 140_000  # rows of 4 bytes: 560 KB on one rank, past the gather round's 512 KiB


def test_wide_round_ranks_agree_on_every_call_at_three_ranks() -> None:
    """The wide round (payloads past ``WIDE_MIN_BYTES``): every rank keeps the same
    per-rank slots through misses, errors, subgroups, other dtypes and dims, coalesced
    calls, and the shrink back to the gather round; a call that fits takes one
    collective (W broadcasts in flight), and every output is the oracle's."""
    b = BIG
    big = Step("v", ((b, 1), (b // 2, 1), (3, 1)), F32)
    steps = [
        big,  # first large call: headers (gather round), then the payload
        big,  # the wide round: one collective
        Step("v", ((b - 7, 1), (b // 2 - 5, 1), (0, 1)), F32),  # within every slot
        # a miss on rank 2 only: two rounds, every rank grows rank 2's slot alike
        Step("v", ((b, 1), (b // 2, 1), (b, 1)), F32),
        Step("v", ((b, 1), (b // 2, 1), (b, 1)), F32),
        # a dtype on one rank: the same error everywhere, the state unchanged
        Step("v", ((b, 1), (b // 2, 1), (b, 1)), ("float32", "int32", "float32")),
        # a local problem (a 0-d tensor): the follow-up round carries its text
        Step("v", ((b, 1), (), (3, 1)), F32),
        # validate=False with sizes: no exchange, the state untouched
        Step("v", ((b, 1), (2, 1), (3, 1)), F32, sizes=True, validate=False),
        # a subgroup keeps its own state (the gather round there)
        Step("v", ((2, 4), (3, 4)), ("float64",) * 2, group=(0, 2)),
        # another dtype and dim 1 (cut with one cat), bool, sizes passed and validated
        Step("v", ((2, b // 4, 2), (2, 3, 2), (2, b // 8, 2)), ("bfloat16",) * 3, dim=1),
        Step("v", ((b,), (b // 3,), (5,)), ("bool",) * 3),
        Step("v", ((b, 1), (b // 2, 1), (3, 1)), F32, sizes=True),
        # coalesced calls keep a state of their own; theirs goes wide too
        Step(
            "co", (((b, 1), (3,)), ((b // 2, 1), (1,)), ((1, 1), (0,))), (("float32", "int64"),) * 3
        ),
        Step(
            "co", (((b, 1), (3,)), ((b // 2, 1), (1,)), ((1, 1), (0,))), (("float32", "int64"),) * 3
        ),
        # a forced transport: headers, then the payload
        Step("v", ((b, 1), (b // 2, 1), (3, 1)), F32, transport="broadcast"),
        # empty everywhere
        Step("v", ((0, 1), (0, 1), (0, 1)), F32),
    ]
    small = Step("v", ((3, 4), (1, 4), (2, 4)), F32)
    # a streak of idle calls that began with a large call whose slots were too large
    # re-sizes the slots to its large needs first, then the small ones end the wide round
    steps += [small] * (2 * _round_state.SHRINK_AFTER)
    errors: list[str | None] = [None] * len(steps)
    errors[5] = "DTypeMismatchError"
    errors[6] = "InputShapeError"
    collectives: list[int | None] = [None] * len(steps)
    collectives[0] = 2
    collectives[1] = collectives[2] = 1
    collectives[3] = 2
    collectives[4] = 1
    collectives[7] = 1
    collectives[8] = 2
    collectives[9] = collectives[10] = collectives[11] = 1
    collectives[12] = 3  # the coalesced state's first call of two tensors (slots grow)
    collectives[13] = 1
    collectives[14] = 2
    collectives[15] = 1
    results = check_script(3, steps, errors, collectives)
    wide = [tuple(results[0][s]["state"][0][6]) for s in range(len(steps))]
    assert wide[0] == (4 * b, 2 * b, 12)  # the first large call's exact needs
    # rank 2's miss: sizes move, every slot gets its bucket's slack
    assert wide[3] == tuple(_round_state.bucket(n) for n in (4 * b, 2 * b, 4 * b))
    assert results[0][13]["state"][1][6], "the coalesced state went wide"
    # after the small calls the group is back in the gather round
    assert wide[-1] == (), wide[-3:]
    assert results[0][-1]["forward"] == 1
    assert "expected a tensor with at least 1 dimension" in results[0][6]["error"][1]


def test_the_wide_round_on_a_subgroup_sends_to_its_members_global_ranks() -> None:
    """The wide round's direct sends name their peers by group rank: on the subgroup
    of global ranks 1 and 2 (group ranks 0 and 1), a wide call is one collective and
    every output is the oracle's; the world's rank 0 is not in it."""
    big = Step("v", ((BIG, 1), (BIG // 3, 1)), ("float32",) * 2, group=(1, 2))
    within = Step("v", ((BIG - 9, 1), (0, 1)), ("float32",) * 2, group=(1, 2))
    results = check_script(3, [big, big, within], [None] * 3, [2, 1, 1])
    assert results[0] == [None] * 3
    wide = [tuple(results[1][s]["state"][0][6]) for s in range(3)]
    assert wide[1] == (4 * BIG, 4 * (BIG // 3)), "the subgroup did not go wide"


def test_wide_slots_shrink_after_idle_calls_and_bound_the_padding() -> None:
    s = _round_state.FusedState()
    big = (300_000, 150_000, 64)
    s = _round_state.advance(s, fusable=True, need=max(big), count=1, needs=big)
    assert s.wide == big  # a group's first large call: every rank's exact need
    # within every slot: unchanged
    t = _round_state.advance(s, fusable=True, need=299_000, count=1, needs=(299_000, 149_000, 40))
    assert (t.wide, t.wide_idle) == (s.wide, 0)
    # a miss on rank 1: sizes move, every slot grows to its bucket (at most 12.5 % padding)
    grown = (300_000, 150_001, 64)
    s = _round_state.advance(s, fusable=True, need=300_000, count=1, needs=grown)
    assert s.wide == tuple(_round_state.bucket(n) for n in grown)
    for n, c in zip(grown, s.wide, strict=True):
        assert n <= c <= max(64, n * 1.125)  # the padding bound
    # a rank's need fell below half its slot: after SHRINK_AFTER such calls, re-sized
    fell = (300_000, 20_000, 64)
    for _ in range(_round_state.SHRINK_AFTER - 1):
        s = _round_state.advance(s, fusable=True, need=300_000, count=1, needs=fell)
        assert s.wide[1] == _round_state.bucket(150_001)
    s = _round_state.advance(s, fusable=True, need=300_000, count=1, needs=fell)
    assert s.wide == fell
    # small calls: back to the gather round after SHRINK_AFTER of them
    for _ in range(_round_state.SHRINK_AFTER):
        s = _round_state.advance(s, fusable=True, need=100, count=1, needs=(100, 100, 100))
    assert s.wide == ()


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((4_000_000,) * 4, (2_909_184, 3_636_224, 4_363_264, 5_090_304)),  # even -> mild
        ((2_909_184, 3_636_224, 4_363_264, 5_090_304), (4_000_000,) * 4),  # mild -> even
        ((300_000, 150_000, 64), (299_000, 149_000, 40)),  # smaller within every slot
    ],
)
def test_wide_slots_become_a_stable_skews_exact_needs(
    before: tuple[int, ...], after: tuple[int, ...]
) -> None:
    """Sizes that moved and then stay: the slots an earlier miss grew (or larger sizes
    left) become the new needs exactly after ``SHRINK_AFTER`` calls in a row with the
    same needs, and no sooner; without this rule an even-then-mild group sent 12 % more
    than its payload on every call, forever."""
    s = _round_state.FusedState()
    for _ in range(3):
        s = _round_state.advance(s, fusable=True, need=max(before), count=1, needs=before)
    assert s.wide == before
    s = _round_state.advance(s, fusable=True, need=max(after), count=1, needs=after)
    loose = s.wide  # grown by a miss, or the larger sizes' slots
    assert loose != after
    assert all(c >= n for c, n in zip(loose, after, strict=True))
    for k in range(2, _round_state.SHRINK_AFTER):
        s = _round_state.advance(s, fusable=True, need=max(after), count=1, needs=after)
        assert s.wide == loose, k  # not yet: the streak counts calls with the same needs
    assert (s.wide, s.wide_steady) == (loose, _round_state.SHRINK_AFTER - 1)
    s = _round_state.advance(s, fusable=True, need=max(after), count=1, needs=after)  # the 8th
    assert s.wide == after
    assert (s.wide_steady, s.wide_last, s.wide_idle) == (0, (), 0)
    # exact slots: nothing of the wide round changes from call to call
    t = _round_state.advance(s, fusable=True, need=max(after), count=1, needs=after)
    assert (t.wide, t.wide_idle, t.wide_max, t.wide_steady, t.wide_last) == (after, 0, (), 0, ())


def test_a_stable_skew_after_other_sizes_sends_its_exact_needs_at_three_ranks() -> None:
    """On a real world: even sizes past ``WIDE_MIN_BYTES``, then a mild skew that stays.
    The skew's first call misses (two rounds, every slot grown alike); the next calls
    take one collective each, and after ``SHRINK_AFTER`` calls with the skew every
    rank's slots are its exact needs, on every rank alike, every output the oracle's."""
    b = BIG
    even = Step("v", ((b, 1), (b, 1), (b, 1)), F32)
    mild = Step("v", ((b * 3 // 4, 1), (b, 1), (b * 5 // 4, 1)), F32)
    steps = [even, even] + [mild] * (_round_state.SHRINK_AFTER + 1)
    collectives: list[int | None] = [2, 1, 2] + [1] * _round_state.SHRINK_AFTER
    results = check_script(3, steps, [None] * len(steps), collectives)
    wide = [tuple(results[0][s]["state"][0][6]) for s in range(len(steps))]
    needs = (4 * (b * 3 // 4), 4 * b, 4 * (b * 5 // 4))
    assert wide[1] == (4 * b,) * 3
    assert wide[2] == tuple(max(4 * b, _round_state.bucket(n)) for n in needs)  # the miss: grown
    assert wide[2 + _round_state.SHRINK_AFTER - 2] == wide[2]  # loose until the streak is full
    assert wide[2 + _round_state.SHRINK_AFTER - 1] == needs  # then exact: no padding sent
    assert wide[-1] == needs


def test_wide_slots_stay_loose_while_sizes_keep_moving() -> None:
    """Sizes that change every call (within the slots) never make a streak: the slots
    keep their headroom, and a call with other needs restarts the count."""
    s = _round_state.FusedState()
    base = (400_000, 500_000, 600_000, 700_000)
    s = _round_state.advance(s, fusable=True, need=700_000, count=1, needs=base)
    grown = (400_000, 500_000, 600_000, 700_001)
    s = _round_state.advance(s, fusable=True, need=700_001, count=1, needs=grown)  # a miss
    loose = s.wide
    for k in range(3 * _round_state.SHRINK_AFTER):
        needs = tuple(n - 1_000 * (k % 2) for n in grown)
        s = _round_state.advance(s, fusable=True, need=max(needs), count=1, needs=needs)
        assert s.wide == loose, k
    # SHRINK_AFTER - 1 calls with the same needs, one other, then the same again: the
    # streak starts over
    for _ in range(_round_state.SHRINK_AFTER - 1):
        s = _round_state.advance(s, fusable=True, need=max(grown), count=1, needs=grown)
    assert (s.wide, s.wide_steady) == (loose, _round_state.SHRINK_AFTER - 1)
    s = _round_state.advance(s, fusable=True, need=max(base), count=1, needs=base)
    assert (s.wide, s.wide_steady) == (loose, 1)
    s = _round_state.advance(s, fusable=True, need=max(grown), count=1, needs=grown)
    assert (s.wide, s.wide_steady) == (loose, 1)
    # calls that do not go wide (another transport, a rank not eligible, small ones)
    # between them neither count nor break the row
    for k in range(2, _round_state.SHRINK_AFTER + 1):
        s = _round_state.advance(s, fusable=False, need=max(grown), count=1, needs=grown)
        s = _round_state.advance(s, fusable=True, need=100, count=1, needs=(100,) * 4)
        assert (s.wide, s.wide_steady) == (loose, k - 1), k
        s = _round_state.advance(s, fusable=True, need=max(grown), count=1, needs=grown)
        if k < _round_state.SHRINK_AFTER:
            assert (s.wide, s.wide_steady) == (loose, k), k
    assert s.wide == grown


@pytest.mark.parametrize("move", ["move_left", "move_chunked"])
def test_in_place_compaction_moves_overlapping_ranges_exactly(move: str) -> None:
    """The wide round's in-place compaction (``memmove`` on the CPU, chunked tensor
    copies elsewhere): for gaps smaller and larger than a chunk, what
    ``buf[dst:dst+n] = buf[src:src+n].clone()`` gives, nothing else touched."""
    chunk = _round_buffers.MOVE_CHUNK
    for gap, n in ((1, 3 * chunk + 5), (96, chunk + 1), (chunk + 3, 2 * chunk), (7, 10), (5, 5)):
        buf = torch.randint(0, 256, (gap + n + 11,), dtype=torch.uint8)
        want = buf.clone()
        want[2 : 2 + n] = buf[2 + gap : 2 + gap + n].clone()
        getattr(_round_buffers, move)(buf, 2, 2 + gap, n)
        assert torch.equal(buf, want), (move, gap, n)


def test_strong_skew_on_many_ranks_goes_wide_even_when_small() -> None:
    """The gather round pads every slot to the largest need: at 1024 ranks with one
    rank 20x the others that is ~20x the payload, so such a group goes wide; a few
    ranks, or small absolute sizes, stay in the gather round."""
    many = (20_000,) + (1_000,) * 1023
    s = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=20_000, count=1, needs=many
    )
    assert s.wide == many
    few = (3_000, 150, 150, 150)
    t = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=3_000, count=1, needs=few
    )
    assert t.wide == ()
    assert t.capacity == _round_state.bucket(3_000)


@pytest.mark.parametrize("contract", ["sum", "local"])
def test_gradients_through_the_wide_round_match_the_oracle(contract: str) -> None:
    """A gather whose payload rode in the wide round (its result a view of the received
    buffer) has the oracle's gradients under per-rank upstream gradients."""
    shapes = ((BIG, 1), (BIG // 3, 1))
    steps = [Step("v", shapes, ("float32",) * 2, grad=contract)] * 2
    steps.append(Step("v", ((2, BIG // 8, 2), (2, 3, 2)), ("float64",) * 2, dim=1, grad=contract))
    check_script(2, steps, [None] * 3, [2, 1, None])


MID = 20_000  # rows of 4 bytes: 80 KB per rank; 1.5x that is within FUSED_MAX_BYTES


def test_gather_round_and_wide_round_keep_ranks_in_step_at_three_ranks() -> None:
    """Switching between the gather round (at most ``FUSED_MAX_BYTES`` per rank) and the
    wide round: every rank keeps the same state through a miss on one rank, an error, a
    skew past ``FUSED_MAX_BYTES`` (the group goes wide), a call that outgrows a wide
    slot within the gather round's bound (back at once) and sizes past it again; a
    call that fits takes one collective, and every output is the oracle's."""
    m = MID
    even = Step("v", ((m, 1), (m, 1), (m, 1)), F32)
    mild = Step("v", ((m, 1), (m * 5 // 4, 1), (m * 6 // 4, 1)), F32)
    skew = Step("v", ((2 * m, 1), (3, 1), (3, 1)), F32)  # rank 0 past FUSED_MAX_BYTES
    past = Step("v", ((3 * m, 1), (3 * m, 1), (3 * m, 1)), F32)
    steps = [
        even,  # first call: headers, then the payload; the capacity is learned
        even,  # one collective: the gather round
        mild,  # a miss on ranks 1 and 2: two rounds, every rank grows alike
        mild,  # within the capacity: one collective
        even,  # smaller, within the capacity: one collective
        Step("v", ((m, 1), (m, 1), (m, 1)), ("float32", "float32", "int32")),  # an error
        skew,  # rank 0 outgrows the gather round: two rounds, the group goes wide
        skew,  # the wide round: one collective
    ]
    # ranks 1 and 2 outgrow their wide slots within the gather round's bound: back to
    # the gather round at once (two rounds), whose capacity holds them
    steps += [mild, mild]
    steps += [past, past]  # past FUSED_MAX_BYTES on every rank: wide again
    errors: list[str | None] = [None] * len(steps)
    errors[5] = "DTypeMismatchError"
    collectives: list[int | None] = [None] * len(steps)
    collectives[0] = 2
    collectives[1] = 1
    collectives[2] = 2
    collectives[3] = collectives[4] = 1
    collectives[6], collectives[7] = 2, 1
    collectives[8], collectives[9] = 2, 1
    collectives[10], collectives[11] = 2, 1
    results = check_script(3, steps, errors, collectives)
    states = [results[0][s]["state"][0] for s in range(len(steps))]
    capacity = [s[0] for s in states]
    wide = [tuple(s[6]) for s in states]
    assert capacity[0] == _round_state.bucket(4 * m)
    assert wide[0] == ()
    assert capacity[2] == _round_state.bucket(4 * m * 6 // 4)
    assert wide[2] == ()
    assert capacity[4] == capacity[2]
    assert wide[6] == (8 * m, 12, 12)  # the skew's exact needs
    assert wide[8] == ()  # back in the gather round
    assert capacity[8] == capacity[2]
    assert wide[-1] == (12 * m,) * 3


def test_the_switch_to_the_wide_round() -> None:
    """``advance``: a group goes wide once a call's largest payload per rank is past
    ``FUSED_MAX_BYTES`` whatever the skew, or when the gather round would carry more
    than ``PAD_LIMIT`` times the payload and more than ``SMALL_BYTES`` in all (strong
    skew on many ranks); the state is a pure function of the needs."""
    small, most = _round_state.SMALL_BYTES, _round_state.FUSED_MAX_BYTES
    assert most == _round_state.WIDE_MIN_BYTES
    even = (most,) * 4
    s = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=most, count=1, needs=even
    )
    assert (s.capacity, s.wide) == (most, ())
    n = most // 2
    mild = tuple(int(n * f) for f in (1, 1.25, 1.5, 1.75))  # within FUSED_MAX_BYTES
    s = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=max(mild), count=1, needs=mild
    )
    assert s.wide == ()
    assert s.capacity == _round_state.bucket(max(mild))
    skew = (n, n, n, 3 * n)  # one rank past FUSED_MAX_BYTES
    t = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=3 * n, count=1, needs=skew
    )
    assert t.wide == skew
    assert t.capacity == 0  # not a call of the gather round
    # a strong skew on many ranks below FUSED_MAX_BYTES: the gather round would carry
    # far more than PAD_LIMIT times the payload
    many = (small // 2,) + (64,) * 63
    assert 64 * _round_state.bucket(max(many)) > _round_state.PAD_LIMIT * sum(many)
    u = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=max(many), count=1, needs=many
    )
    assert u.wide == many
    # the same skew on 4 ranks pads the gather round within PAD_LIMIT: it stays
    low = (small // 2, 64, 64, 64)
    v = _round_state.advance(
        _round_state.FusedState(), fusable=True, need=max(low), count=1, needs=low
    )
    assert v.wide == ()
    assert v.capacity == _round_state.bucket(max(low))
    # a rank not eligible: never wide
    x = _round_state.advance(
        _round_state.FusedState(), fusable=False, need=3 * n, count=1, needs=skew
    )
    assert (x.wide, x.capacity) == ((), 0)
    # the same needs give the same state, whoever computes it
    assert (
        _round_state.advance(
            _round_state.FusedState(), fusable=True, need=3 * n, count=1, needs=skew
        )
        == t
    )
    # a group gone wide whose call outgrows a slot within the gather round's bound goes
    # back to the gather round at once (its capacity grown by the same call)
    back = _round_state.advance(t, fusable=True, need=n + 1, count=1, needs=(n + 1, n, n, n))
    assert back.wide == ()
    assert back.capacity >= n + 1
    # within its slots it stays wide until SHRINK_AFTER such calls
    stay = _round_state.advance(t, fusable=True, need=n, count=1, needs=(n, n, n, n))
    assert (stay.wide, stay.wide_idle) == (skew, 1)


def _steady_steps(wide: bool) -> list[tuple[tuple[int, ...], tuple[str, ...], bool]]:
    """A steady caller (the same sizes every call, past the wide round's threshold, or
    within the gather round's slots) whose peers change under it: rank 2's size once,
    then rank 1 sends float64; steady again in between; then every rank asks for a
    gradient."""
    steady, moved = (600, 750, 900), (600, 750, 560)  # rows of 256 B: past 128 KiB
    if not wide:
        steady, moved = (6, 7, 9), (6, 7, 5)  # a few KiB: the gather round
    steps = [(steady, (), False)] * 12 + [(moved, (), False)] + [(steady, (), False)] * 12
    steps += [(steady, ("float32", "float64", "float32"), False)]
    steps += [(steady, (), False)] * 3 + [(steady, (), True)] * 12
    return steps


@pytest.mark.parametrize(
    ("op", "headers", "round_"),
    [(op, h, "wide") for op in ("v", "list") for h in ("inline", "apart")]
    + [(op, "inline", "gather") for op in ("v", "list")],
)
def test_the_gathers_steady_path_is_the_full_path(op: str, headers: str, round_: str) -> None:
    """The gathers' steady path (a call repeating the last steady round, wide or gather,
    replays it: ``_fused.steady_exchange``; ``all_gather_v`` and ``all_gather_list``, whose
    payload is its carrier's two parts) gives the oracle's bits (NaN and -0.0 among
    them) and gradients with per-rank upstreams; results the caller still holds stay
    intact; when a peer's call differs (its size, its dtype) every rank still gets the
    full path's answer or its error: the same ``DTypeMismatchError`` everywhere, the
    group usable after. The wide round with the headers in each rank's region and apart
    from the payload slots (``WideLayout``; the full path's calls too); the gather
    round from its kept buffers."""
    steps = _steady_steps(round_ == "wide")
    w = 3
    apart_min = 0 if headers == "apart" else 1 << 60
    per_rank = get_pool(w).run(steady_gathers, (op, steps, apart_min))
    taken = [[r[i][3] for r in per_rank] for i in range(len(steps))]
    for i, (rows, dtypes, grad) in enumerate(steps):
        if dtypes:
            for r in range(w):
                assert per_rank[r][i][:2] == ("raised", "DTypeMismatchError"), (i, per_rank[r][i])
            assert len({per_rank[r][i][2] for r in range(w)}) == 1  # the same message
            continue
        shards = [steady_shard(r, i, rows[r]) for r in range(w)]
        if op == "v":
            want = [oracle.expected_output(shards, 0)]
            ups = [[steady_upstream(op, tuple(want[0].shape), r, 0)] for r in range(w)]
            grads = oracle.expected_input_grads(shards, [u[0] for u in ups], 0, "sum")
        else:
            want = oracle.expected_gather_list(shards)
            ups = [
                [steady_upstream(op, tuple(t.shape), r, j) for j, t in enumerate(want)]
                for r in range(w)
            ]
            grads = oracle.expected_gather_list_grads(shards, ups, "sum")
        for r in range(w):
            status, got, dx, _ = per_rank[r][i]
            assert status == "ok", (i, r, per_rank[r][i])
            assert len(got) == len(want), (i, r)
            for j, (g, e) in enumerate(zip(got, want, strict=True)):
                assert_bitwise_equal(g, e, f"call {i}, rank {r}, output {j}")
            if grad:
                assert_bitwise_equal(dx, grads[r], f"call {i}, rank {r}: gradient")
    # The path was taken once the state settled; after a peer's change by the unchanged
    # ranks (the headers differed: the full path's verdict answered), and by none after
    # an error until steady again.
    assert all(taken[11]), taken
    assert all(taken[24]), taken
    assert all(taken[-1]), taken
    assert taken[12] == [True, True, False]  # rank 2's size changed
    assert taken[25] == [True, False, True]  # rank 1's dtype changed

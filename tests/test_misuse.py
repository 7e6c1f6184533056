"""The misuse catalogue on real gloo worlds: every rank raises the same error.

For every entry of ``all_gather_v``'s ``MISUSES``
(``vargather.testing.catalogues.all_gather_v``), on 2 and 3 ranks and with the offender
on every rank: every rank raises exactly the catalogued ``VarGatherError`` subclass with
the same message, naming the offending rank(s), the expected and the got value; no rank
returns data, aborts or hangs; and afterwards the *same* process group (the pool was not
rebuilt) performs a correct gather, checked against the oracle bit for bit. The other
collectives' entries (each catalogue module's ``MISUSES``) are judged alike, the follow-
up being a correct call of the same collective; a rank that never arrives gives the
named timeout on the others, then a rebuilt world.

The cases that are not "every rank raises" are here too, each stating why: a rank that
is not a member of the group it passes, a group passed without torch.distributed, and
sizes that lie about a peer under ``validate=False`` (not detectable without the
exchange that ``validate=True`` runs). The timeouts are in ``test_faults.py``.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed as dist

import vargather
from vargather import oracle
from vargather.testing import (
    RankOutcome,
    RankPool,
    assert_bitwise_equal,
    bitwise_difference,
    get_pool,
)
from vargather.testing import misuse as fns
from vargather.testing.collectives import NAMES

from ._by_path import import_path

if TYPE_CHECKING:
    import _fault_fns as faults
else:  # a sibling module, whether or not tests/ is a package (its name is what the ranks import)
    faults = importlib.import_module(f"{__package__}._fault_fns" if __package__ else "_fault_fns")

pytestmark = pytest.mark.multirank


def _case(m: fns.Misuse, w: int, o: int) -> Any:
    # A rank that never arrives costs a timeout and a rebuilt world: one per collective
    # (3 ranks, the middle one absent) in the default run, the rest slow. all_gather_v's
    # entries run every offender by default; the others' W=2 (offender 0) and W=3
    # (offender 1, a middle rank), the other offenders on the slow schedule.
    slow = (m.absent and (w, o) != (3, 1)) or (
        m.collective != CHECKED[0] and (w, o) not in ((2, 0), (3, 1))
    )
    return pytest.param(
        fns.MisuseCase(m.collective, m.name, w, o),
        id=f"{m.collective}-{m.name}-W{w}" + ("" if m.all_ranks else f"-offender{o}"),
        marks=[pytest.mark.slow] if slow else [],
    )


CHECKED = NAMES
CASES = [
    _case(m, w, o)
    for c in CHECKED
    for m in fns.entries_of(c)
    for w in (2, 3)
    for o in ([0] if m.all_ranks else range(w))
]


@pytest.mark.parametrize("case", CASES)
def test_misuse_raises_the_same_error_on_every_rank(case: fns.MisuseCase) -> None:
    """The engine's judge: every rank the entry's error class, one message holding its
    fragments and blaming its ranks (an absent rank: the named timeout on the others),
    then the next call on the same world (a rebuilt one after an absent rank) right
    against the oracle bit for bit, gradients included."""
    assert fns.check_misuse(get_pool(case.world_size), case) == []


def _outcomes(pairs: Sequence[tuple[type[Exception] | None, str, tuple[int, ...]]]) -> list[Any]:
    return [(None if e is None else (e.__name__, msg, ranks), None) for e, msg, ranks in pairs]


def test_the_judge_refuses_every_wrong_outcome() -> None:
    """A judge that cannot fail is a defect: each way the misuse contract can be
    broken is reported (no follow-up ran: only the error is judged)."""
    case = fns.MisuseCase("all_gather_v", "dtype-float32-vs-int32", 3, 1)
    message = fns.judge_misuse  # the right message, as vargather words it
    right = "all_gather_v: dtype differs across ranks: torch.float32 on rank(s) [0, 2], torch.int32 on rank(s) [1]"
    err = vargather.DTypeMismatchError
    ok = _outcomes([(err, right, (1,))] * 3)
    assert message(case, ok) == []
    wrong = {
        "got no error": [(None, "", ()), (err, right, (1,)), (err, right, (1,))],
        "got ['ShapeMismatchError']": [(vargather.ShapeMismatchError, right, (1,))] * 3,
        "one message": [(err, right, (1,)), (err, right + ".", (1,)), (err, right, (1,))],
        "in the message": [(err, right.replace("int32", "int64"), (1,))] * 3,
        "to blame [1]": [(err, right, (0,))] * 3,
    }
    for why, pairs in wrong.items():
        found = message(case, _outcomes(pairs))
        assert any(why in f.message for f in found), (why, found)
    broken = [(e, "RuntimeError: boom") for e, _ in ok]
    assert any("raised RuntimeError" in f.message for f in fns.judge_misuse(case, broken))


def test_every_collective_has_its_entries_and_the_engine_names_none() -> None:
    """The engine finds each collective's entries through the table, with no branch on
    a name; each catalogue holds the generic entries, names once, errors of the
    public hierarchy with builtin bases."""
    text = pathlib.Path(fns.__file__).read_text()
    assert not [name for name in vargather.COLLECTIVES if f'"{name}"' in text]
    builtins = (TypeError, ValueError, IndexError, RuntimeError)
    for c in CHECKED:
        entries = fns.entries_of(c)
        names = [m.name for m in entries]
        assert len(names) == len(set(names)), c
        assert {"absent", "not-a-tensor", "none-input"} <= set(names), c
        for m in entries:
            assert m.collective == c
            assert issubclass(m.error, vargather.VarGatherError)
            assert issubclass(m.error, builtins), m.error
            assert m.error.__module__ == "vargather"


def test_the_catalogue_is_what_the_docs_count() -> None:
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "misuse.md")) as f:
        doc = f.read()
    flat = " ".join(doc.split())
    for c in CHECKED:
        names = [m.name for m in fns.entries_of(c)]
        assert f"**{len(names)} misuse classes of `{c}`**" in flat, c
        for name in names:
            assert f"`{name}`" in doc, f"{name} is not in docs/misuse.md"
    assert f"({len(CASES)} cases on 2 and 3 ranks" in flat


# --- the cases that are not "every rank raises" -------------------------------------


def _size(rank: int) -> int:
    return (2, 0, 3, 1)[rank % 4]


def _g(
    spec: fns.TensorSpec,
    subgroup: tuple[int, ...] | None = None,
    backward: bool = False,
    form: str = "all_gather_v",
    **kw: object,
) -> fns.Call:
    """A gather call of ``spec`` (``form``: ``all_gather_v_with_layout`` for its sizes)."""
    return fns.Call(form, (spec,), kw, subgroup, backward)


def _gathers(calls: Sequence[fns.Call]) -> fns.Scenario:
    return fns.Scenario(calls[0].collective, tuple(calls))


def assert_same_error(
    outcomes: Sequence[RankOutcome[Any]],
    error: type[vargather.VarGatherError],
    fragments: Sequence[str],
    blamed: Sequence[int],
) -> str:
    """Every rank raised exactly ``error`` with one message holding ``fragments``."""
    assert [o.ok for o in outcomes] == [False] * len(outcomes), "a rank returned data"
    messages = {str(o.exception) for o in outcomes}
    assert len(messages) == 1, f"ranks raised different messages: {messages}"
    (message,) = messages
    for o in outcomes:
        assert type(o.exception) is error, f"rank {o.rank}: {o.exc_type_name}: {o.exception}"
        assert isinstance(o.exception, vargather.VarGatherError)
        assert o.exception.ranks == tuple(blamed), (o.exception.ranks, message)
    missing = [f for f in fragments if f not in message]
    assert not missing, f"{missing} not in the message: {message}"
    return message


def assert_usable(pool: RankPool, generation: int, collective: str = "all_gather_v") -> None:
    """The same world (no rebuild) still calls ``collective`` correctly, gradients
    included."""
    scenario = fns.valid_scenario(collective, pool.world_size)
    results = pool.run(fns.run_call, scenario)
    assert pool.generation == generation, "the pool had to rebuild its process group"
    want, grads = fns.expected_of(scenario)
    for r, got in enumerate(results):
        assert got is not None
        assert got.grad is not None
        for g, e in zip(
            *([got.output, want[r]] if isinstance(got.output, list) else [[got.output], [want[r]]]),
            strict=True,
        ):
            assert_bitwise_equal(g, e, f"rank {r}")
        assert_bitwise_equal(got.grad, grads[r], f"rank {r}")


def test_requires_grad_may_differ_under_the_local_contract() -> None:
    """``local`` has no collective in its backward: ranks may disagree, and each gets
    the gradient of its own slice."""
    pool = get_pool(3)
    calls = tuple(
        _g(
            fns.TensorSpec((_size(r), 2), "float64", requires_grad=r != 1),
            backward=r != 1,
            grad="local",
        )
        for r in range(3)
    )
    results = pool.run(fns.run_call, _gathers(calls))
    shards = [fns.TensorSpec((_size(r), 2), "float64").build(r) for r in range(3)]
    want = oracle.expected_output(shards, 0)
    ups = [fns.upstream_for(want.shape, "float64", r) for r in range(3)]
    grads = oracle.expected_input_grads(shards, ups, 0, "local")
    for r, got in enumerate(results):
        assert_bitwise_equal(got.output, want)
        if r == 1:
            assert got.grad is None
        else:
            assert got.grad is not None
            assert_bitwise_equal(got.grad, grads[r])


def test_integer_tensors_cannot_require_grad_and_gather_without_autograd() -> None:
    """torch itself refuses ``requires_grad`` on an integer tensor, before vargather is
    involved; an integer gather under a communicating contract simply has no graph."""
    with pytest.raises(RuntimeError, match="floating point"):
        torch.zeros(2, dtype=torch.int64).requires_grad_(True)
    pool = get_pool(2)
    calls = tuple(_g(fns.TensorSpec((_size(r), 2), "int64"), grad="mean") for r in (0, 1))
    results = pool.run(fns.run_call, _gathers(calls))
    (want, _), _ = fns.expected_of(_gathers(calls))
    for got in results:
        assert_bitwise_equal(got.output, want)
        assert not got.output.requires_grad


def test_a_non_member_raises_alone_and_the_members_gather() -> None:
    """Rank 2 passes the group of ranks [0, 1], which it is not in (torch hands it
    ``GroupMember.NON_GROUP_MEMBER``). It raises ``GroupError`` on its own: a group's
    collectives involve its members only, so the members cannot learn of the mistake
    (telling them would need a collective on a group that contains rank 2) and are
    not affected by it. They gather among themselves and get the correct result."""
    pool = get_pool(3)
    generation = pool.generation
    calls = tuple(
        _g(fns.TensorSpec((_size(r), 2)), subgroup=(0, 1), form="all_gather_v_with_layout")
        for r in range(3)
    )
    outcomes = pool.run_outcomes(fns.run_call, _gathers(calls))
    assert [o.ok for o in outcomes] == [True, True, False]
    error = outcomes[2].exception
    assert type(error) is vargather.GroupError
    assert "global rank 2 is not a member of the process group it passed" in str(error)
    assert "expected a group containing this rank" in str(error)
    assert "NON_GROUP_MEMBER" in str(error)
    assert error.ranks == (2,)
    shards = [fns.TensorSpec((_size(r), 2)).build(r) for r in (0, 1)]
    want = oracle.expected_output(shards, 0)
    for o in outcomes[:2]:
        assert o.value is not None
        assert_bitwise_equal(o.value.output, want)
        assert o.value.layout_sizes == (_size(0), _size(1))
    assert_usable(pool, generation)


def test_a_destroyed_group_is_refused_on_every_rank() -> None:
    pool = get_pool(2)
    generation = pool.generation
    outcomes = pool.run_outcomes(faults.destroyed_subgroup, (2, 3))
    assert [type(o.exception) for o in outcomes] == [vargather.GroupError] * 2
    for o in outcomes:
        assert f"global rank {o.rank} cannot use the process group it passed" in str(o.exception)
        assert "is not registered" in str(o.exception)
    assert_usable(pool, generation)


def test_something_else_than_a_group_is_refused_on_every_rank() -> None:
    pool = get_pool(2)
    generation = pool.generation
    outcomes = pool.run_outcomes(faults.run_with_group_object, "world")
    assert [type(o.exception) for o in outcomes] == [vargather.GroupError] * 2
    for o in outcomes:
        message = str(o.exception)
        assert "group must be a torch.distributed.ProcessGroup or None, got str" in message
        assert f"on global rank {o.rank}" in message
    assert_usable(pool, generation)


def test_a_group_without_torch_distributed_is_refused() -> None:
    """In this (pytest) process torch.distributed is not initialized."""
    assert not dist.is_initialized()
    with pytest.raises(vargather.GroupError) as info:
        vargather.all_gather_v(torch.zeros(2), group=object())  # type: ignore[arg-type]
    assert "a process group was passed but torch.distributed is not initialized" in str(info.value)
    assert "got object" in str(info.value)


def test_a_group_from_a_destroyed_world_is_refused() -> None:
    """The group outlived ``destroy_process_group``: torch.distributed is no longer
    initialized, so vargather refuses it (a one-process world, in this process)."""
    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)  # type: ignore[attr-defined]  # public, re-exported without "as"
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            group = dist.new_group([0])
        finally:
            dist.destroy_process_group()
    with pytest.raises(vargather.GroupError, match=r"torch\.distributed is not initialized"):
        vargather.all_gather_v(torch.zeros(2), group=group)


def test_sizes_that_lie_about_a_peer_go_undetected_without_validation() -> None:
    """The documented limit of ``validate=False``: a rank's sizes are checked only
    against its own tensor, so a lie about a peer is not seen. Here rank 0 claims rank
    1 has 1 row (it has 0); both ranks send equal padded blocks, nothing fails, and
    rank 0 silently gets a wrong result. ``validate=True`` (the default) catches the
    same call on every rank."""
    pool = get_pool(2)
    generation = pool.generation
    sizes = [[2, 1], [2, 0]]
    calls = tuple(
        _g(
            fns.TensorSpec((2 - 2 * r, 2)),
            form="all_gather_v_with_layout",
            sizes=sizes[r],
            transport="padded",
            validate=False,
        )
        for r in (0, 1)
    )
    results = pool.run(fns.run_call, _gathers(calls))
    want = oracle.expected_output([fns.build_x(c.x, r) for r, c in enumerate(calls)], 0)
    assert results[0].layout_sizes == (2, 1)
    assert bitwise_difference(results[0].output, want) is not None, (
        "the lie was not silent after all"
    )
    assert_bitwise_equal(results[1].output, want)
    validated = tuple(
        _g(fns.TensorSpec((2 - 2 * r, 2)), sizes=sizes[r], transport="padded") for r in (0, 1)
    )
    outcomes = pool.run_outcomes(fns.run_call, _gathers(validated))
    assert_same_error(
        outcomes,
        vargather.SizesMismatchError,
        ("expected sizes=[2, 0]", "rank 0 passed sizes=[2, 1]"),
        (0,),
    )
    assert_usable(pool, generation)


def test_metadata_of_a_non_tensor_stays_on_the_cpu_under_gloo() -> None:
    assert get_pool(2).run(faults.metadata_device, None) == ["cpu", "cpu"]


@pytest.mark.parametrize("layout", ["strided", "sliced"])
@pytest.mark.parametrize("shape", [(3,), (1,), (2, 3)])
@pytest.mark.parametrize("transport", ["padded", "alltoallv"])
def test_int16_which_gloo_refuses_travels_as_bytes(
    transport: str, shape: tuple[int, ...], layout: str
) -> None:
    """gloo answers "Invalid scalar type" for int16 (found by fuzz/fuzz_multirank.py);
    vargather moves its bytes instead, bit for bit, from strided shards too (a sliced
    one-element shard once failed on one rank only, leaving its peer to time out)."""
    pool = get_pool(2)
    calls = tuple(
        _g(
            fns.TensorSpec((r + shape[0] - 1, *shape[1:]), "int16", layout=layout),
            transport=transport,
        )
        for r in (0, 1)
    )
    results = pool.run(fns.run_call, _gathers(calls))
    want, _ = fns.expected_of(_gathers(calls))
    for got in results:
        assert_bitwise_equal(got.output, want[0])


def test_true_sizes_about_a_tensor_a_peer_changed_blame_the_sizes_and_name_the_peer() -> None:
    """Found by fuzz/fuzz_multirank.py: rank 1 passes ``sizes=[1, 0]``, which held for
    the call both ranks meant to make, but rank 0's tensor has 0 rows. Every rank raises
    the same SizesMismatchError blaming rank 1 (whose sizes contradict the tensors) and
    saying what the tensors hold; the fuzz judge accepts it because rank 1's sizes name
    the rank whose tensor changed (it once demanded the blamed rank be the changed one)."""
    calls = (
        _g(fns.TensorSpec((0, 0), "bfloat16"), dim=1),
        _g(fns.TensorSpec((0, 0), "bfloat16"), dim=1, sizes=[1, 0]),
    )
    pool = get_pool(2)
    generation = pool.generation
    outcomes = pool.run_outcomes(fns.run_call, _gathers(calls))
    assert_same_error(
        outcomes,
        vargather.SizesMismatchError,
        ["expected sizes=[0, 0]", "rank 1 passed sizes=[1, 0]"],
        [1],
    )
    assert_usable(pool, generation)
    fuzz = _fuzz_multirank()
    spec = fuzz.fns.TensorSpec((0, 0), "bfloat16")  # its own import of the catalogue
    scenario = fuzz.fns.Scenario(
        "all_gather_v",
        (
            fuzz.fns.call("all_gather_v", spec, dim=1),
            fuzz.fns.call("all_gather_v", spec, dim=1, sizes=[1, 0]),
        ),
    )
    assert fuzz._contradicted_ranks(scenario, (1,)) == {0}
    fuzz._judge_all_raised(scenario, outcomes, (0,))  # the changed rank: accepted
    with pytest.raises(AssertionError, match="name no mutated rank"):
        fuzz._judge_all_raised(scenario, outcomes, ())  # no rank changed: refusing is a defect


def _fuzz_multirank() -> Any:
    """fuzz/fuzz_multirank.py, imported by path (fuzz/ is not a package)."""
    path = os.path.join(os.path.dirname(__file__), "..", "fuzz", "fuzz_multirank.py")
    return import_path("fuzz_multirank", path)


# --- the fuzz judge of the family, both ways -----------------------------------------


def _a2a_honest_resend(mod: Any) -> Any:
    """3 ranks, receive sizes passed everywhere; rank 0 changes its plan honestly (a new
    send row and a tensor that fits it), so the receive sizes ranks 1 and 2 passed,
    true of the call all meant to make, now contradict rank 0's send sizes."""
    send = [[1, 0, 2], [0, 2, 1], [2, 1, 0]]
    calls = []
    for r in range(3):
        recv = [send[j][r] for j in range(3)]
        row = [1, 2, 0] if r == 0 else send[r]
        x = mod.TensorSpec((sum(row), 2), "float32")
        calls.append(mod.call("all_to_all_v", x, row, recv_sizes=recv))
    return mod.Scenario("all_to_all_v", tuple(calls))


def _list_honest_reshape(mod: Any) -> Any:
    """2 ranks, shapes passed on both; rank 1 holds another tensor and says so in its own
    shapes, so rank 0's (once true) shapes are now the lie."""
    before, after = [[2, 3], [0, 1]], [[2, 3], [4, 1]]
    calls = (
        mod.call("all_gather_list", mod.TensorSpec((2, 3)), shapes=before),
        mod.call("all_gather_list", mod.TensorSpec((4, 1)), shapes=after),
    )
    return mod.Scenario("all_gather_list", calls)


def test_family_fuzz_judge_accepts_an_honest_rank_blamed_for_a_peers_change() -> None:
    """The subtlety of the family's judge: a mutated rank can make an unmutated rank's
    passed values wrong. vargather blames the ranks whose passed values contradict the
    others (here the unmutated ones), and the judge accepts exactly that: the blamed
    ranks name the mutated rank. With no rank mutated, the same refusal is a defect."""
    fuzz = _fuzz_multirank()
    for build, liars, changed in [(_a2a_honest_resend, (1, 2), 0), (_list_honest_reshape, (0,), 1)]:
        scenario = build(fns)
        pool = get_pool(scenario.world_size)
        generation = pool.generation
        outcomes = pool.run_outcomes(fns.run_call, scenario)
        judged = build(fuzz.fns)  # the same scenario, of the fuzz module's own import
        assert fuzz.family_verdict(judged) == ("SizesMismatchError", liars)
        assert fuzz.judge_family(judged, outcomes, (changed,)) == "refused"
        assert all(o.exception.ranks == liars for o in outcomes)  # type: ignore[union-attr]
        with pytest.raises(AssertionError, match="none mutated"):
            fuzz.judge_family(judged, outcomes, ())
        assert_usable(pool, generation, scenario.collective)


def _raised(error: vargather.VarGatherError, world_size: int) -> list[RankOutcome[Any]]:
    return [
        RankOutcome(r, exception=error, exc_type_name=f"vargather.{type(error).__name__}")
        for r in range(world_size)
    ]


def test_family_fuzz_judge_refuses_every_wrong_outcome() -> None:
    """Each way an outcome can be wrong is refused: a valid call refused, a call
    refused on some ranks only, different messages, another class, other ranks
    blamed, a wrong answer accepted, and a local problem told as a mismatch."""
    fuzz = _fuzz_multirank()
    m = fuzz.fns
    rs = [m.call("reduce_scatter_v", m.TensorSpec((3, 2)), [1, 2]) for _ in range(2)]
    valid = m.Scenario("reduce_scatter_v", tuple(rs))
    right = fuzz.fns.expected_of(valid)[0]
    ok = [RankOutcome(r, value=m.CallOutput(right[r], None)) for r in range(2)]
    assert fuzz.judge_family(valid, ok, (1,)) == "harmless"
    wrong = [ok[0], RankOutcome(1, value=m.CallOutput(right[1] + 1, None))]
    with pytest.raises(AssertionError):
        fuzz.judge_family(valid, wrong, (1,))
    with pytest.raises(AssertionError, match="a valid call was refused"):
        fuzz.judge_family(valid, _raised(vargather.SizesError("x", ranks=[1]), 2), (1,))

    dtype = m.Scenario("reduce_scatter_v", (rs[0], rs[1].with_(x=m.TensorSpec((3, 2), "int32"))))
    assert fuzz.family_verdict(dtype) == ("DTypeMismatchError", (0, 1))  # a tie of two
    message = "reduce_scatter_v: dtype differs across ranks: rank 0 ... rank 1"
    good = _raised(vargather.DTypeMismatchError(message, ranks=[0, 1]), 2)
    assert fuzz.judge_family(dtype, good, (1,)) == "refused"
    cases = {
        "on every rank": [good[0], ok[1]],
        "different messages": [
            good[0],
            _raised(vargather.DTypeMismatchError(message + ".", ranks=[0, 1]), 2)[1],
        ],
        "expected DTypeMismatchError": _raised(
            vargather.ShapeMismatchError(message, ranks=[0, 1]), 2
        ),
        "to blame": _raised(vargather.DTypeMismatchError(message, ranks=[1]), 2),
    }
    for why, outcomes in cases.items():
        with pytest.raises(AssertionError, match=why):
            fuzz.judge_family(dtype, outcomes, (1,))

    local = m.Scenario("reduce_scatter_v", (rs[0], rs[1].with_(sizes=[1, 1])))
    assert fuzz.family_verdict(local) == ("local", (1,))
    told = "reduce_scatter_v: invalid arguments on rank(s) [1]: rank 1: expected sum(sizes) == 3"
    assert fuzz.judge_family(local, _raised(vargather.SizesError(told, ranks=[1]), 2), (1,))
    with pytest.raises(AssertionError, match="own problem"):
        fuzz.judge_family(local, _raised(vargather.SizesMismatchError(told, ranks=[1]), 2), (1,))
    with pytest.raises(AssertionError, match="none mutated"):
        fuzz.judge_family(local, _raised(vargather.SizesError(told, ranks=[1]), 2), (0,))


# --- the fuzzer's steady runs --------------------------------------------------------


def _a2a_run(fuzz: Any) -> Any:
    """2 ranks: ``all_to_all_v`` 10 times (past ``SHRINK_AFTER``), rank 0 moving a row
    between its blocks every call, then rank 1 calling with int32 on top of it, then
    the last call again."""
    m = fuzz.fns

    def scenario(row0: list[int]) -> Any:
        rows = [row0, [2, 1]]
        calls = tuple(
            m.call("all_to_all_v", m.TensorSpec((sum(row), 3), "float32", seed=5), row)
            for row in rows
        )
        return m.Scenario("all_to_all_v", calls)

    before = tuple(scenario([1 + i % 2, 2 - i % 2]) for i in range(10))
    after = before[-1]
    odd = after.calls[1].with_(x=m.TensorSpec((3, 3), "int32", seed=5))
    mutated = m.Scenario("all_to_all_v", (after.calls[0], odd))
    return fuzz.SteadyRun(before, (mutated, (1,), "dtype"), after)


def _wide_gather_run(fuzz: Any) -> Any:
    """2 ranks: a gather of rows past the wide round's 128 KiB, 10 times, then rank 0
    passing sizes that lie, then the gather again."""
    m = fuzz.fns
    specs = [m.TensorSpec((n, fuzz.WIDE_ROW), "float32", seed=2) for n in (2, 1)]
    base = m.Scenario("all_gather_v", tuple(m.call("all_gather_v", spec) for spec in specs))
    liar = base.calls[0].with_(sizes=[1, 2])
    return fuzz.SteadyRun(
        (base,) * 10, (m.Scenario("all_gather_v", (liar, base.calls[1])), (0,)), base
    )


def test_a_fuzz_steady_run_judges_every_call_and_names_the_one_that_failed() -> None:
    """fuzz/fuzz_multirank.py's steady runs: a valid call repeated on one world (the
    steady paths replay it), a rank breaking it, the call again; every call judged,
    the world intact. A run whose last call is wrong for its tensors fails, naming
    that call."""
    fuzz = _fuzz_multirank()
    for run in (_a2a_run(fuzz), _wide_gather_run(fuzz)):
        fuzz.check_steady_run(run)
    run = _a2a_run(fuzz)
    m = fuzz.fns
    short = run.after.calls[0].with_(send_sizes=[1, 1])  # 3 rows, sizes adding up to 2
    bad = replace(run, after=m.Scenario("all_to_all_v", (short, run.after.calls[1])))
    with pytest.raises(AssertionError, match=r"call #11 of the run \(valid again\)"):
        fuzz.check_steady_run(bad)
    assert_usable(get_pool(2), get_pool(2).generation, "all_to_all_v")

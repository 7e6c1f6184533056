"""``all_gather_v_coalesced`` on real gloo worlds, against the single-process oracle.

Several tensors (each its own dtype, shape, ragged size and ``dim``) in one call: outputs
bit for bit ``torch.cat`` of each tensor's shards, gradients of every contract under
upstream gradients that differ per rank, one collective in steady state, one metadata
round and one payload collective otherwise; misuse (a dtype on one rank for tensor #1,
different numbers of tensors, different dims) raises the same error on every rank and
leaves the group usable. Agreement on the fused state is checked after every call as
in ``tests/test_fused.py``.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import vargather
from vargather.testing.cases import COMPAT, VARGATHER, GatherCase, Implementation
from vargather.testing.catalogues import catalogue
from vargather.testing.catalogues.all_gather_v import one_call
from vargather.testing.properties import Property
from vargather.testing.runner import run_coalesced

from ._fused_fns import Step
from .test_fused import check_script

pytestmark = pytest.mark.multirank


def three(world: int, lead: int = 0) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per rank: a float32 (n, 4), an int64 (n,) and a bfloat16 (2, n, 3) shard."""
    return tuple(
        ((r + lead, 4), ((2 * r + lead) % 3,), (2, (r + 1 + lead) % 4, 3)) for r in range(world)
    )


DTYPES3 = ("float32", "int64", "bfloat16")
DIMS3 = (0, 0, 1)


def test_the_api_is_exported() -> None:
    assert "all_gather_v_coalesced" in vargather.__all__
    assert callable(vargather.all_gather_v_coalesced)


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_matches_the_oracle_and_is_one_collective_in_steady_state(world: int) -> None:
    d = (DTYPES3,) * world
    steps = [
        Step("co", three(world), d, dim=DIMS3),  # first call: three rounds
        Step("co", three(world), d, dim=DIMS3),  # steady state: one
        Step("co", three(world, 1), d, dim=DIMS3),  # other sizes, still fitting
        # forced transports: the metadata round, then one payload collective
        Step("co", three(world), d, dim=DIMS3, transport="padded"),
        Step("co", three(world), d, dim=DIMS3, transport="alltoallv"),
        Step("co", three(world), d, dim=DIMS3, transport="broadcast"),
        # every sizes known and validate=False: the payload collective only
        Step("co", three(world), d, dim=DIMS3, sizes=True, validate=False),
        # sizes known and validated: the fused round
        Step("co", three(world), d, dim=DIMS3, sizes=True),
        # NaN, -0.0, inf, bool and complex bytes
        Step(
            "co",
            tuple(((r + 1,), (r,), (r, 2)) for r in range(world)),
            (("float16", "bool", "complex128"),) * world,
        ),
        # empty on every rank, and no tensors at all
        Step("co", tuple(((0, 2), (0,)) for _ in range(world)), (("float32", "int32"),) * world),
        Step("co", ((),) * world, ((),) * world),
        # a single call in between uses (and advances) the group's one state
        Step("v", tuple((r, 2) for r in range(world)), ("float32",) * world),
        Step("co", three(world), d, dim=DIMS3),
    ]
    collectives: list[int | None] = [3, 1, None, 2, 2, 2, 1, 1, None, 1, 1, None, 1]
    results = check_script(world, steps, [None] * len(steps), collectives)
    # the group's state holds three header slots, and a single call sends as many: one
    # state for every kind, so a peer calling the other kind sends the same length
    coalesced_state = results[0][1]["state"][1]
    assert coalesced_state[1] == 3
    single_before, coalesced_before = results[0][11]["state_before"]
    assert single_before == coalesced_before
    assert single_before[1] == 3
    assert results[0][11]["state"][0] == results[0][11]["state"][1]


@pytest.mark.parametrize("contract", ["sum", "local", "mean"])
def test_coalesced_gradients_match_the_oracle(contract: str) -> None:
    world = 3
    shapes = tuple(((r + 1, 2), (2, (2 * r) % 3), (r,)) for r in range(world))
    dtypes = (("float32", "float64", "int64"),) * world
    steps = [
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract),  # three rounds
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract),  # fused
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract, transport="broadcast"),
    ]
    check_script(world, steps, [None] * 3, [3, 1, 2])


def test_misuse_raises_the_same_error_on_every_rank_and_the_group_stays_usable() -> None:
    world = 3
    d = (DTYPES3,) * world
    ok = Step("co", three(world), d, dim=DIMS3)
    bad_dtype = Step(
        "co",
        three(world),
        (DTYPES3, DTYPES3, ("float32", "int32", "bfloat16")),
        dim=DIMS3,
    )
    fewer = Step("co", (three(world)[0], three(world)[1][:2], three(world)[2]), d, dim=DIMS3)
    other_dims = Step(
        "co",
        tuple(((2, 2), (r,), (2, 2, 3)) for r in range(world)),
        d,
        rank_dims=(DIMS3, DIMS3, (0, 0, 0)),
    )
    dims_count = Step("co", three(world), d, dim=(0, 0))
    local_problem = Step("co", (three(world)[0], three(world)[1], ((2, 4), (1,), ())), d, dim=DIMS3)
    steps = [ok, ok, bad_dtype, ok, fewer, ok, other_dims, ok, dims_count, local_problem, ok]
    errors: list[str | None] = [None] * len(steps)
    errors[2] = "DTypeMismatchError"
    errors[4] = "ArgumentMismatchError"
    errors[6] = "ArgumentMismatchError"
    errors[8] = "DimError"
    errors[9] = "InputShapeError"
    collectives: list[int | None] = [None, 1, None, 1, None, 1, None, 1, None, None, 1]
    results = check_script(world, steps, errors, collectives)
    message = results[0][2]["error"][1]
    assert message.startswith("all_gather_v_coalesced: tensor #1: dtype differs across ranks")
    assert "torch.int32 on rank(s) [2]" in message
    assert results[0][2]["error"][2] == (2,)
    assert "number of tensors differs across ranks" in results[0][4]["error"][1]
    assert results[0][4]["error"][2] == (1,)
    assert results[0][6]["error"][1].startswith("all_gather_v_coalesced: tensor #2: gather dim")
    assert "expected one dim, or one per tensor (3), got 2 dims" in results[0][8]["error"][1]
    assert "tensor #2" in results[0][9]["error"][1]


def test_without_a_world_the_inputs_come_back_and_misuse_still_raises() -> None:
    a, b = torch.ones(2, 3), torch.arange(4)
    got = vargather.all_gather_v_coalesced([a, b], dim=[1, 0])
    assert len(got) == 2
    assert got[0] is a
    assert got[1] is b
    assert vargather.all_gather_v_coalesced([]) == []
    with pytest.raises(vargather.DimError, match=r"tensor #0: .*one per tensor \(2\), got 3"):
        vargather.all_gather_v_coalesced([a, b], dim=[0, 0, 0])
    with pytest.raises(vargather.DimError, match=r"tensor #1: .*dim=2 is out of range"):
        vargather.all_gather_v_coalesced([a, b], dim=[0, 2])
    with pytest.raises(vargather.InputTypeError, match="expected a sequence of tensors"):
        vargather.all_gather_v_coalesced(a)  # type: ignore[arg-type]  # the misuse tested
    with pytest.raises(vargather.SizesError, match=r"one entry per tensor \(2\), got 1"):
        vargather.all_gather_v_coalesced([a, b], sizes=[[2]])


# --- the property catalogue's ``coalesced`` row ----------------------------------------

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _with_coalesced(name: str) -> Implementation:
    """vargather, its coalesced form replaced by ``tests._coalesced_fns.<name>``."""
    return Implementation(
        None,
        transports=("auto", "padded", "alltoallv", "broadcast"),
        search_path=(REPO_ROOT,),
        name=f"vargather with tests._coalesced_fns:{name}",
        coalesced_ref=f"tests._coalesced_fns:{name}",
    )


def _row(impl: Implementation) -> Property:
    (row,) = [p for p in catalogue(impl) if p.id == "coalesced"]
    return row


def _batch(contract: str = "sum", world: int = 2) -> list[GatherCase]:
    """Three tensors of one call: float64 rows, a non-contiguous float32 (2, n, 3) along
    dim -2 with sizes as a tensor, an int64 vector with sizes as a list."""
    return [
        GatherCase(
            shapes=tuple((r + 1, 2) for r in range(world)),
            dim=0,
            dtype="float64",
            contract=contract,
            seed=1,
        ),
        GatherCase(
            shapes=tuple((2, (2 * r) % 3, 3) for r in range(world)),
            dim=-2,
            dtype="float32",
            contract=contract,
            sizes_form="tensor",
            memory=("transposed",) * world,
            seed=2,
        ),
        GatherCase(
            shapes=tuple((r + 2,) for r in range(world)),
            dim=0,
            dtype="int64",
            contract=contract,
            sizes_form="list",
            requires_grad=False,
            seed=3,
        ),
    ]


def test_the_row_is_vargathers_own() -> None:
    """Only an implementation with a coalesced form runs the row: vargather's own by
    default; compat, forks and the mutants (other references) are out of scope."""
    assert _row(VARGATHER).not_applicable((2,)) is None
    assert VARGATHER.coalesced_form == "vargather:all_gather_v_coalesced"
    for other in (COMPAT, Implementation("tests.mutants.faithful:all_gather_v")):
        assert other.coalesced_form is None
        assert _row(other).not_applicable((2,)) == (
            "ATTR has no coalesced form (vargather.all_gather_v_coalesced only)"
        )
    assert _with_coalesced("swapped").coalesced_form == "tests._coalesced_fns:swapped"
    with pytest.raises(ValueError, match="coalesced_ref needs the vargather convention"):
        Implementation("m:f", convention="seed", coalesced_ref="m:g")


@given(data=st.data())
@settings(max_examples=10)
def test_a_drawn_batch_is_one_call(data: st.DataObject) -> None:
    """Every batch the row draws shares the contract and transport of its first case
    (what the call takes once) and keeps everything else per case."""
    batch = data.draw(_row(VARGATHER).strategy((2, 3)))
    assert len({(c.contract, c.transport, c.world_size) for c in batch}) == 1
    assert all(c.members is None and c.initialized for c in batch)
    assert one_call(batch) == batch


def test_cases_of_one_call_must_agree() -> None:
    batch = _batch()
    with pytest.raises(ValueError, match="share grad= and transport="):
        run_coalesced([batch[0], dataclasses.replace(batch[1], contract="mean")])
    with pytest.raises(ValueError, match="share the world size"):
        run_coalesced([batch[0], _batch(world=3)[1]])
    with pytest.raises(ValueError, match="has no coalesced form"):
        run_coalesced(batch, COMPAT)


@pytest.mark.parametrize("world", [2, 3])
def test_vargather_passes_a_batch_judged_case_by_case(world: int) -> None:
    for contract in ("sum", "mean"):
        verdicts = run_coalesced(_batch(contract, world))
        assert [v.failures for v in verdicts] == [(), (), ()]
        assert all(v.ok for v in verdicts)


def test_swapped_outputs_fail_the_property() -> None:
    """A coalesced form handing back tensor #1's output as tensor #0's fails the row on
    both (and only on those), naming the tensor; the unbroken one passes the batch."""
    row = _row(_with_coalesced("swapped"))
    batch = _batch()
    results = row.run(batch)
    assert [bool(failures) for _, failures in results] == [True, True, False]
    first = results[0][1][0]
    assert first.aspect == "output"
    assert first.call == "swapped(tensor #0, dim=0)"
    with pytest.raises(AssertionError, match=r"coalesced: 2 of 3 case\(s\) failed") as err:
        row.check(batch)
    assert "coalesced call: tensor #0 of 3 failed" in str(err.value)
    assert "tensor #2: shapes [(2,), (3,)]" in str(err.value)
    _row(VARGATHER).check(batch)


def test_the_property_finds_swapped_outputs_by_itself() -> None:
    row = _row(_with_coalesced("swapped"))
    found = find(
        row.strategy((2, 3), max_payload=0),
        row.fails,
        settings=settings(max_examples=30, phases=(Phase.generate,), database=None),
    )
    assert len(found) >= 2


def test_gradients_of_the_wrong_contract_fail_the_property() -> None:
    """A coalesced form that ignores ``grad=`` (always ``sum``) fails on the gradient of
    every differentiable tensor under ``local``; under ``sum`` it is right."""
    row = _row(_with_coalesced("always_sum"))
    results = row.run(_batch("local"))
    assert [sorted({f.aspect for f in fs}) for _, fs in results] == [
        ["gradient"],
        ["gradient"],
        [],
    ]
    assert not any(fs for _, fs in row.run(_batch("sum")))


def test_an_error_is_every_cases_failure() -> None:
    verdicts = run_coalesced(_batch(), _with_coalesced("refuses"))
    for v in verdicts:
        (failure,) = v.failures
        assert failure.aspect == "call"
        assert failure.kind == "error"
        assert "ValueError: refusing 3 tensor(s)" in failure.message


def test_a_crash_is_every_cases_failure() -> None:
    verdicts = run_coalesced(_batch(), _with_coalesced("crashes"))
    for v in verdicts:
        (failure,) = v.failures
        assert failure.kind == "crash"
        assert "one coalesced call of 3 tensor(s), this case's among them" in failure.message


def test_the_gate_reports_a_coalesced_failure_with_the_whole_call() -> None:
    """``check``'s evaluation of the row (its Hypothesis run, shrinking included) fails
    a swapped coalesced form and prints every tensor of the failing call."""
    from vargather.testing import get_pool
    from vargather.testing.evaluate import evaluate_row
    from vargather.testing.options import CheckOptions
    from vargather.testing.progress import Progress

    options = CheckOptions(progress=False, shrink_budget=5, max_examples=10, max_payload=0)
    row = _row(_with_coalesced("swapped"))
    result = evaluate_row(row, options, (2,), get_pool, Progress(None, 1))
    assert result.status == "fail"
    assert result.failure is not None
    assert result.failure.aspect == "output"
    assert "swapped(tensor #" in result.failure.message
    assert "coalesced call: tensor #" in result.failure.reproduction
    assert "GatherCase(" in result.failure.reproduction

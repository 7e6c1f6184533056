"""The ``dtensor`` target's programs (``vargather/testing/dtensor_program.py``,
``dtensor_target.py``): the oracle follows ``torch.chunk``, the drawing covers the mesh
setups and transitions trainers use, and a wrong redistribution is caught and shrunk to
a small program.

The last two run the target's own search on a stand-in pool: every rank's report is
computed in this process from the oracle, with a deliberate defect or none, so no
gloo world is started (the target on real worlds is in ``test_targets.py``).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from vargather.testing.dtensor_program import (
    FLOATS,
    DTensorProgram,
    contributions,
    coords,
    expected_gradient,
    expected_local,
    global_tensor,
    local_piece,
    on_sizes,
    start_local,
)
from vargather.testing.dtensor_target import (
    KINDS,
    TARGET,
    ProgramReport,
    dtensor_programs,
    judge_program,
    smaller_programs,
)
from vargather.testing.options import CheckOptions
from vargather.testing.program_rows import run_program_check
from vargather.testing.progress import Progress
from vargather.testing.targets import apply_target


def _program(**kwargs: Any) -> DTensorProgram:
    fields: dict[str, Any] = {
        "world_size": 4,
        "mesh": (4,),
        "names": ("dp",),
        "views": (),
        "on": ("world", 0, 0),
        "shape": (7, 3),
        "entry": "distribute",
        "start": ("S0",),
        "steps": (),
    }
    fields.update(kwargs)
    return DTensorProgram(**fields)


# --- the oracle ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "world", "rows"),
    [
        ((7, 3), 4, [2, 2, 2, 1]),
        ((5,), 4, [2, 2, 1, 0]),
        ((6,), 4, [2, 2, 2, 0]),
        ((1,), 3, [1, 0, 0]),
        ((0,), 2, [0, 0]),
    ],
)
def test_local_pieces_follow_torch_chunk(
    shape: tuple[int, ...], world: int, rows: list[int]
) -> None:
    t = torch.arange(math.prod(shape)).reshape(shape)
    pieces = [local_piece(t, ("S0",), (world,), (r,)) for r in range(world)]
    chunks = list(torch.chunk(t, world, 0)) if shape[0] else []
    assert [p.shape[0] for p in pieces] == rows
    for r, piece in enumerate(pieces):  # torch.chunk's pieces, then empty ones
        want = chunks[r] if r < len(chunks) else t[:0]
        assert torch.equal(piece, want)


def test_mesh_dims_apply_left_to_right_and_strided_ones_last() -> None:
    """(Shard(0), Shard(0)) on a 2x2 mesh: mesh dim 0 halves the rows, mesh dim 1 each
    half; (_StridedShard(0, split_factor=2), Shard(0)): mesh dim 1 first (FSDP2 with TP,
    torch's right-to-left table); a flattened view's coordinate is the rank."""
    t = torch.arange(8 * 4).reshape(8, 4)
    nested = _program(mesh=(2, 2), names=("a", "b"), on=("world", 0, 1), shape=(8, 4))
    firsts = [expected_local(nested, ("S0", "S0"), r)[0, 0].item() for r in range(4)]
    assert firsts == [0, 8, 16, 24]
    strided = [expected_local(nested, ("SS0/2", "S0"), r)[0, 0].item() for r in range(4)]
    assert strided == [0, 16, 8, 24]  # rank (0, 1) holds rows 4-5, rank (1, 0) rows 2-3
    assert torch.equal(expected_local(nested, ("S0", "S1"), 3), t[4:, 2:])
    flat = replace(nested, views=((0, 1),), on=("flat", 0, 1))
    assert [coords(flat, r) for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert [coords(replace(nested, on=("sub", 1, 1)), r) for r in range(4)] == [
        (0,),
        (1,),
        (0,),
        (1,),
    ]


def test_a_partial_start_sums_its_contributions_exactly() -> None:
    for reduction, divisor in (("sum", 1), ("avg", 4)):
        program = _program(
            mesh=(2, 2),
            names=("a", "b"),
            on=("world", 0, 1),
            shape=(3, 2),
            entry="from_local",
            start=(f"P:{reduction}", f"P:{reduction}"),
            dtype="bfloat16",
        )
        parts = contributions(program)
        assert sorted(parts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        total = sum(p.to(torch.float64) for p in parts.values())
        assert isinstance(total, torch.Tensor)
        assert torch.equal(global_tensor(program).to(torch.float64), total / divisor)
        assert torch.equal(start_local(program, 2), parts[1, 0])


# --- the drawing ---------------------------------------------------------------------------


def _draw(kind: str, count: int) -> list[DTensorProgram]:
    seen: list[DTensorProgram] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(dtensor_programs((1, 2, 3, 4), kind))
    def collect(program: DTensorProgram) -> None:
        seen.append(program)

    collect()
    return seen


def _valid(p: DTensorProgram) -> None:
    """What every drawn program promises the rank side."""
    assert all(not c.startswith("P") for step in p.steps for c in step)  # torch refuses
    assert len({c for c in p.start if c.startswith("P")}) <= 1  # one reduction
    for codes in (p.start, *p.steps):  # FSDP2 + TP: later mesh dims shard the same
        for i, c in enumerate(codes):  # dim, and the split factor is their sizes' product
            if c.startswith("SS"):
                dim, split = c[2:].split("/")
                later = [j for j in range(i + 1, len(codes)) if codes[j] == f"S{dim}"]
                assert later
                assert math.prod(on_sizes(p)[j] for j in later) == int(split)
    if p.entry == "distribute":
        assert not any(c.startswith("P") for c in p.start)
        for i, c in enumerate(p.start):  # distribute_tensor refuses an uneven one
            if c.startswith("SS"):
                dim, split = map(int, c[2:].split("/"))
                assert p.shape[dim] % (on_sizes(p)[i] * split) == 0
    assert not p.requires_grad or p.dtype in FLOATS
    assert math.prod(p.mesh) == p.world_size
    assert len(set(p.views)) == len(p.views)


def test_the_drawing_covers_trainers_mesh_setups_and_transitions() -> None:
    programs = [p for kind in KINDS for p in _draw(kind, 150)]
    for p in programs:
        _valid(p)
    seen: dict[str, set[Any]] = collections.defaultdict(set)
    for p in programs:
        seen["world"].add(p.world_size)
        seen["mesh dims"].add(len(p.mesh))
        seen["views"].add(len(p.views))
        seen["on"].add(p.on[0])
        seen["entry"].add(p.entry)
        seen["steps"].add(len(p.steps))
        seen["grad"].add(p.requires_grad)
        for codes in (p.start, *p.steps):
            seen["codes"].update(c[:2] if c[:2] in ("SS", "P:") else c[0] for c in codes)
            if "P:avg" in codes:
                seen["codes"].add("P:avg")
            sharded = [c for c in codes if c.startswith("S")]
            if len(sharded) != len({c.lstrip("S").split("/")[0] for c in sharded}):
                seen["nested"].add(True)  # one tensor dim over several mesh dims
        if any(n < math.prod(p.mesh) for n in p.shape):
            seen["empty shards"].add(True)
        if len(p.mesh) > 1 and p.views and max(p.mesh) < p.world_size:
            seen["2-D mesh with a flattened view"].add(True)
    assert seen["world"] == {1, 2, 3, 4}
    assert seen["mesh dims"] == {1, 2, 3}
    assert {1, 2, 3} <= seen["views"]
    assert seen["on"] == {"world", "flat", "sub"}
    assert seen["entry"] == {"distribute", "from_local"}
    assert seen["steps"] == {0, 1, 2, 3, 4}
    assert seen["grad"] == {False, True}
    assert seen["codes"] >= {"R", "S", "SS", "P:", "P:avg"}
    assert seen["nested"] == seen["empty shards"] == {True}
    assert seen["2-D mesh with a flattened view"] == {True}


def test_every_smaller_program_is_valid_and_smaller() -> None:
    big = _program(
        world_size=4,
        mesh=(1, 2, 2),
        names=("dp_replicate", "dp_shard", "tp"),
        views=((0, 1), (1, 2), (0, 2)),
        on=("world", 0, 2),
        shape=(6, 5),
        entry="from_local",  # distribute_tensor refuses an uneven _StridedShard
        start=("R", "SS0/2", "S0"),
        steps=(("S1", "S0", "R"), ("R", "R", "R")),
        dtype="int32",
        values="bits",
        seed=7,
    )
    candidates = smaller_programs(big)
    assert candidates
    for c in candidates:
        _valid(c)
        assert c != big
    dropped = [c for c in candidates if len(c.mesh) == 2]
    assert dropped == [
        replace(
            big,
            mesh=(2, 2),
            names=("dp_shard", "tp"),
            views=((0, 1),),
            on=("world", 0, 1),
            start=("SS0/2", "S0"),
            steps=(("S0", "R"), ("R", "R")),
        )
    ]


def test_no_smaller_program_breaks_a_strided_shard() -> None:
    """Making the middle ``Shard(0)`` of ``[_StridedShard(0, 2), Shard(0), Shard(0)]``
    ``Replicate`` would leave a split factor of 2 over a size-1 dim: no oracle for that
    (it read torch's right answer as wrong once), so it is not a candidate."""
    program = _program(
        mesh=(2, 2, 1),
        names=("dp_replicate", "dp_shard", "tp"),
        on=("world", 0, 2),
        shape=(2,),
        start=("R", "R", "R"),
        steps=(("SS0/2", "S0", "S0"),),
    )
    candidates = smaller_programs(program)
    assert all(("SS0/2", "R", "S0") not in c.steps for c in candidates)
    assert any(c.steps == (("R", "S0", "S0"),) for c in candidates)


# --- the search on a stand-in pool -----------------------------------------------------------


Defect = Callable[[DTensorProgram, int, ProgramReport], ProgramReport]


def _nested(codes: Sequence[str]) -> bool:
    dims = [c.lstrip("S").split("/")[0] for c in codes if c.startswith("S")]
    return len(dims) != len(set(dims))


def swap_rows(program: DTensorProgram, rank: int, report: ProgramReport) -> ProgramReport:
    """full_tensor() after a nested Shard swaps its first two rows (an all_gather that
    puts two ranks' pieces in the wrong order)."""
    fulls = list(report.fulls)
    for k, step in enumerate(program.steps, start=1):
        if _nested(step) and fulls[k].shape[0] >= 2:
            fulls[k] = fulls[k][[1, 0, *range(2, fulls[k].shape[0])]]
    return replace(report, fulls=tuple(fulls))


def stale_shard(program: DTensorProgram, rank: int, report: ProgramReport) -> ProgramReport:
    """Each step hands back the local tensor of the state before it."""
    locals_ = list(report.locals)
    for k in range(1, len(locals_)):
        if report.locals[k - 1] is not None:
            locals_[k] = report.locals[k - 1]
    return replace(report, locals=tuple(locals_))


def right(program: DTensorProgram, rank: int, report: ProgramReport) -> ProgramReport:
    return report


class StandInPool:
    """``RankPool.run_many`` for ``run_program`` on one process: each rank's report is
    the oracle's, passed through ``defect``."""

    def __init__(self, world_size: int, defect: Defect) -> None:
        self.world_size = world_size
        self.defect = defect

    def run_many(self, fn: Any, payloads: Sequence[DTensorProgram]) -> list[list[ProgramReport]]:
        return [[self._report(p, r) for r in range(self.world_size)] for p in payloads]

    def _report(self, program: DTensorProgram, rank: int) -> ProgramReport:
        partial = any(c.startswith("P") for c in program.start)
        locals_: list[torch.Tensor | None] = [None if partial else start_local(program, rank)]
        locals_ += [expected_local(program, step, rank) for step in program.steps]
        whole = global_tensor(program)
        grad = None
        if program.requires_grad and program.steps:
            grad = expected_gradient(program, rank)
        report = ProgramReport(tuple(locals_), (whole,) * len(locals_), grad)
        return self.defect(program, rank, report)


def _search(defect: Defect, only: tuple[str, ...], **budget: int) -> Any:
    options = apply_target(
        CheckOptions(target="dtensor", world_sizes=(1, 2, 3, 4), only=only, **budget)
    )
    pools: dict[int, StandInPool] = {}

    def factory(world: int) -> Any:
        return pools.setdefault(world, StandInPool(world, defect))

    return run_program_check(TARGET, options, Progress(None, 0), factory, {})


def test_the_oracle_itself_passes_every_row() -> None:
    report = _search(right, ())
    assert [r.status for r in report.results] == ["pass"] * 4, report.render()
    assert all(r.cases >= 60 for r in report.results)


def test_swapped_rows_are_caught_and_shrunk_to_one_small_program() -> None:
    report = _search(swap_rows, ("programs",), max_examples=30, shrink_budget=120)
    (row,) = report.results
    assert row.status == "fail"
    assert row.failure is not None
    assert row.failure.case is not None
    assert row.failure.aspect == "output"
    case = row.failure.case
    assert "1 program(s)" in (row.failure.reproduction or "")
    # the stand-in swaps on any nested Shard, even of size-1 mesh dims: one rank suffices
    assert (case["world_size"], case["mesh"], len(case["steps"])) == (1, (1, 1), 1)
    assert (case["shape"], case["views"], case["dtype"]) == ((2,), (), "float32")
    assert row.failure.command == (
        "python -m vargather check --target dtensor --only programs --seed 0 --max-examples 30 "
        "--shrink-budget 120"
    )


def test_a_stale_shard_is_caught_and_shrunk_to_one_step() -> None:
    report = _search(stale_shard, ("programs",), max_examples=30, shrink_budget=120)
    (row,) = report.results
    assert row.status == "fail"
    assert row.failure is not None
    assert row.failure.case is not None
    assert row.failure.aspect == "local"
    case = row.failure.case
    assert (case["world_size"], case["mesh"], len(case["steps"])) == (2, (2,), 1)
    assert math.prod(case["shape"]) == 1


def test_the_judge_names_the_stage_and_reads_a_raise() -> None:
    program = _program(steps=(("R",),))
    reports = StandInPool(4, right).run_many(None, [program])[0]
    assert judge_program(program, reports) == []
    raised = [replace(r, error=(1, "RuntimeError", "boom\nmore")) for r in reports]
    assert judge_program(program, raised) == [
        ("raised", "stage 1, ranks [0, 1, 2, 3]: RuntimeError: boom")
    ]

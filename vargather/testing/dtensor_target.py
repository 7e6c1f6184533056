"""The ``dtensor`` target: DTensor programs as trainers run them, against an oracle.

Where it sits: in the gate's engine in the testing kit, beside ``targets`` (the
registry that names it) and beneath ``engine`` (which hands ``--target dtensor`` to
``run_dtensor_check``). Beneath it: ``dtensor_programs`` (the Hypothesis strategies,
run here in the parent process), ``dtensor_rank`` (the rank side, run in the pool's
gloo ranks) and ``dtensor_program`` (a program and its single-process oracle).

A case is a program, not a call: a mesh set up as trainers set it up (a world mesh
with named dims, its flattened views and submeshes created and kept alive), a tensor
of uneven sizes, a start placement reached through ``distribute_tensor`` or
``DTensor.from_local(..., shape=, stride=)``, and up to 4 ``redistribute`` steps.
Every state is judged bit for bit: each rank's local tensor against its
``torch.chunk`` piece of the global tensor (mesh dims in DTensor's order),
``full_tensor()`` against the global tensor, and the gradient of one backward through
every step against its piece of the summed upstream gradients (``dtensor_program``
states the math).

Each row is a seeded Hypothesis test over batches of programs on one world (one pool
round trip each); a failing batch is shrunk in the parent, by a budget of runs
(``--shrink-budget``), never by time, toward the smallest program: fewest steps,
smallest mesh, fewest rows. A failure prints that program with a ``reproduce:`` line
that re-runs the same search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Final

import torch
from hypothesis import strategies as st

from .asserts import bitwise_difference
from .dtensor_program import (
    DTensorProgram,
    expected_gradient,
    expected_local,
    global_tensor,
)
from .dtensor_programs import program_on, smaller_programs
from .dtensor_rank import ProgramReport, run_program
from .evaluate import FailingBatchError, ShrinkBudgetSpent, seeded_search
from .options import CheckOptions
from .pool import PoolFailure, RankCrashed, RankError, RankPool
from .progress import Progress
from .results import PropertyFailure, PropertyResult, Report
from .verdict import with_xfail

__all__ = [
    "DTENSOR_IDS",
    "ROWS",
    "judge_program",
    "run_dtensor_check",
]

BATCH: Final = 12
"""The most programs per example (one pool round trip on one world; about half that
on average)."""

ROWS: Final = (
    ("programs", "programs", "mesh setups as trainers build them (1-D, 2-D, 3-D, named "
     "dims, flattened views and submeshes alive), 1 to 4 redistribute steps between "
     "Shard, nested Shard, _StridedShard and Replicate from any start (Partial too): "
     "every local is torch.chunk's piece, every full_tensor the global tensor"),
    ("flattened-views", "flattened", "the same with at least one flattened view "
     '(mesh["a", "b"]._flatten()) alive, as torchtitan keeps dp, dp_shard_cp, dp_cp'),
    ("entry-points", "entry", "distribute_tensor, DTensor.from_local(..., shape=, "
     "stride=) of uneven locals (Partial sum and avg too) and full_tensor, no steps"),
    ("gradient", "gradient", "one backward through every step with an upstream gradient "
     "that differs per rank: each rank's piece of the summed upstream gradients"),
)  # fmt: skip
DTENSOR_IDS: Final = tuple(row[0] for row in ROWS)


# --- the judge -------------------------------------------------------------------------


def _both(got: torch.Tensor | None, want: torch.Tensor) -> str:
    """Both tensors in full, when small enough to read."""
    if got is None or max(got.numel(), want.numel()) > 16:
        return ""
    return f"; expected {want.tolist()}, got {got.tolist()}"


def judge_program(
    program: DTensorProgram, reports: Sequence[ProgramReport]
) -> list[tuple[str, str]]:
    """The failures of one program, as (aspect, message), earliest stage first:
    ``raised``, ``local`` (a rank's local is not its ``torch.chunk`` piece), ``output``
    (``full_tensor()`` is not the global tensor), ``gradient``."""
    errors = {r: rep.error for r, rep in enumerate(reports) if rep.error is not None}
    if errors:
        stage, name, message = errors[min(errors)]
        where = "the backward" if stage > len(program.steps) else f"stage {stage}"
        first = (message.splitlines() or [""])[0][:300]
        return [("raised", f"{where}, ranks {sorted(errors)}: {name}: {first}")]
    whole = global_tensor(program)
    failures: list[tuple[str, str]] = []
    for stage, placements in enumerate((program.start, *program.steps)):
        what = "the start" if stage == 0 else f"step {stage}"
        for r, rep in enumerate(reports):
            local = rep.locals[stage]
            if local is not None and (stage > 0 or program.entry == "distribute"):
                want = expected_local(program, placements, r)
                diff = bitwise_difference(local, want)
                if diff is not None:
                    message = f"{what}, rank {r}: local is not its torch.chunk piece: {diff}"
                    failures.append(("local", message + _both(local, want)))
            diff = bitwise_difference(rep.fulls[stage], whole)
            if diff is not None:
                message = f"{what}, rank {r}: full_tensor() is not the global tensor: {diff}"
                failures.append(("output", message + _both(rep.fulls[stage], whole)))
        if failures:
            return failures
    if program.requires_grad and program.steps:
        for r, rep in enumerate(reports):
            diff = bitwise_difference(rep.grad, expected_gradient(program, r))
            if diff is not None:
                failures.append(("gradient", f"rank {r}: start gradient differs: {diff}"))
    return failures


# --- the rows --------------------------------------------------------------------------


def _run_batch(factory: Callable[[int], RankPool], batch: list[DTensorProgram]) -> list[list[Any]]:
    return factory(batch[0].world_size).run_many(run_program, batch)


def _command(row: str, options: CheckOptions, world_sizes: Sequence[int]) -> str:
    command = (
        f"python -m vargather check --target dtensor --only {row} --seed {options.seed} "
        f"--max-examples {options.max_examples}"
    )
    if tuple(world_sizes) != (1, 2, 3, 4):
        command += f" --world-sizes {','.join(map(str, world_sizes))}"
    if options.shrink_budget != CheckOptions().shrink_budget:
        command += f" --shrink-budget {options.shrink_budget}"
    return command


def _reproduction(
    row: str, options: CheckOptions, world_sizes: Sequence[int], batch: Sequence[DTensorProgram]
) -> str:
    listed = "\n".join(f"  {p.describe()}\n  {p!r}" for p in batch)
    return (
        f"{len(batch)} program(s) on a gloo world of {batch[0].world_size} rank(s), in "
        f"order:\n{listed}\n  reproduce: {_command(row, options, world_sizes)}"
    )


def _evaluate(
    row: str,
    kind: str,
    title: str,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    started = time.monotonic()
    worlds = sorted(w for w in world_sizes if 1 <= w <= 4)
    state: dict[str, Any] = {"examples": 0, "cases": 0, "shrink": 0, "failed": False}
    state["stop"] = False
    state["limit"] = options.shrink_budget // 2  # Hypothesis's half; the last passes get the rest
    memo: dict[str, PropertyFailure | None] = {}
    last: list[PropertyFailure] = []

    @st.composite
    def batches(draw: Any) -> list[DTensorProgram]:
        """Up to ``BATCH`` programs on one world (the smallest first when shrinking;
        any of them can be dropped)."""
        world = draw(st.sampled_from(worlds))
        batch: list[DTensorProgram] = draw(
            st.lists(program_on(world, kind), min_size=1, max_size=BATCH)
        )
        return batch

    def run(batch: list[DTensorProgram]) -> PropertyFailure | None:
        if state["failed"]:
            if state["stop"] or state["shrink"] >= state["limit"]:
                raise ShrinkBudgetSpent
            state["shrink"] += 1
        else:
            state["examples"] += 1
            state["cases"] += len(batch)
            progress.note(f"{row}: {state['cases']} programs")
        try:
            results = _run_batch(factory, batch)
        except (PoolFailure, RankError) as err:
            state["failed"] = True
            state["stop"] = isinstance(err, PoolFailure)
            kind_ = "error" if isinstance(err, RankError) else "crash"
            if not isinstance(err, (RankError, RankCrashed)):
                kind_ = "hang"
            return PropertyFailure(
                kind_,
                f"{type(err).__name__}: {err}",
                asdict(batch[-1]),
                _reproduction(row, options, world_sizes, batch),
                aspect="call",
            )
        for i, (program, reports) in enumerate(zip(batch, results, strict=True)):
            failures = judge_program(program, reports)
            if failures:
                state["failed"] = True
                state["program"] = program
                aspect = failures[0][0]
                return PropertyFailure(
                    "error" if aspect == "raised" else "mismatch",
                    "\n".join(f"[{a}] {m}" for a, m in failures[:4]),
                    {**asdict(program), "repr": repr(program)},
                    _reproduction(row, options, world_sizes, batch[: i + 1]),
                    aspect=aspect,
                )
        return None

    def body(batch: list[DTensorProgram]) -> None:
        key = repr(batch)
        failure = memo[key] if key in memo else run(batch)
        memo[key] = failure
        if failure is not None:
            last[:] = [failure]
            raise FailingBatchError(failure)

    failure = seeded_search(
        batches(), body, options, options.max_examples, lambda: last[0] if last else None
    )
    if failure is not None and "program" in state:
        state["limit"] = options.shrink_budget
        failure = _smallest(state["program"], failure, lambda p: _run_once(memo, run, p))
    return PropertyResult(
        row,
        title,
        "pass" if failure is None else "fail",
        examples=state["examples"],
        cases=state["cases"],
        shrink_runs=state["shrink"],
        seconds=time.monotonic() - started,
        failure=failure,
    )


def _run_once(
    memo: dict[str, PropertyFailure | None],
    run: Callable[[list[DTensorProgram]], PropertyFailure | None],
    program: DTensorProgram,
) -> PropertyFailure | None:
    key = repr([program])
    if key not in memo:
        memo[key] = run([program])
    return memo[key]


def _smallest(
    program: DTensorProgram,
    failure: PropertyFailure,
    attempt: Callable[[DTensorProgram], PropertyFailure | None],
) -> PropertyFailure:
    """The last shrinking passes, after Hypothesis's: the failing program alone, then
    ``smaller_programs`` in their fixed order, taking the first that fails the same
    way (the same aspect) and starting over, until none does or the budget is spent
    (``attempt`` raises ``ShrinkBudgetSpent``). Deterministic: the same candidates in
    the same order every run."""
    try:
        alone = attempt(program)
        if alone is not None and alone.aspect == failure.aspect:
            failure = alone
        else:
            return failure
        shrinking = True
        while shrinking:
            shrinking = False
            for candidate in smaller_programs(program):
                found = attempt(candidate)
                if found is not None and found.aspect == failure.aspect:
                    program, failure, shrinking = candidate, found, True
                    break
    except ShrinkBudgetSpent:
        pass
    return failure


def run_dtensor_check(
    options: CheckOptions,
    progress: Progress,
    factory: Callable[[int], RankPool],
    versions: dict[str, str],
) -> Report:
    """``check --target dtensor``: every row of ``ROWS`` as a seeded Hypothesis test on
    the gloo worlds of ``options.world_sizes`` (meshes of up to 4 ranks)."""
    started = time.monotonic()
    world_sizes = tuple(sorted(options.world_sizes))
    worlds = [w for w in world_sizes if 1 <= w <= 4]
    rows = [r for r in ROWS if not options.only or r[0] in options.only]
    progress.retotal(len(rows))
    if worlds and rows:
        progress.phase(f"starting gloo worlds of {', '.join(map(str, worlds))} rank(s)")
        for w in worlds:
            factory(w)
    report = Report(
        impl=None,
        impl_display="torch.distributed.tensor: DTensor programs (distribute_tensor, "
        "from_local, redistribute, full_tensor, backward)",
        convention="dtensor",
        grad=options.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions=versions,
        scope={"--grad": options.grad, "--world-sizes": ",".join(map(str, world_sizes))},
        strict=options.strict,
        call="x = distribute_tensor(G, mesh, start) or DTensor.from_local(local, mesh, start, "
        "shape=, stride=); x = x.redistribute(mesh, step) for each step; to_local(), "
        "full_tensor(), backward",
    )
    try:
        for row, kind, title in rows:
            progress.phase(f"checking {row}")
            if options.exitfirst and any(r.failed for r in report.results):
                result = PropertyResult(
                    row, title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif not worlds:
                result = PropertyResult(
                    row, title, "n/a", reason="needs a world of 1 to 4 ranks (--world-sizes)"
                )
            else:
                result = _evaluate(row, kind, title, options, worlds, factory, progress)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report

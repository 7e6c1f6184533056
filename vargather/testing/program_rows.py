"""Rows of programs: how the gate runs a built-in target that brings its own oracle.

Where it sits: in the gate's engine, beneath the targets that draw programs and
``targets`` (the registry). Such a target is not one ``MODULE:ATTR`` call: a program
builds state (meshes, groups, models), calls the code under test several times, and
its oracle is the global tensor sliced on one process.

``run_program_check`` runs every row as a seeded Hypothesis test (cases drawn in the
parent, run on the ranks in batches, shrunk within ``--shrink-budget``, a count, never
time); crashes and waits are told in a fixed form, so a seed gives the same JSON every
run.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from hypothesis import strategies as st

from .asserts import bitwise_difference
from .evaluate import FailingBatchError, ShrinkBudgetSpent, seeded_search
from .options import CheckOptions
from .pool import RankPool
from .pool_types import PoolFailure, RankCrashed, RankError, RankHung
from .progress import Progress
from .races import WAIT_MARKS
from .results import PropertyFailure, PropertyResult, Report
from .verdict import with_xfail

BATCH: Final = 3
"""Programs per example (one pool round trip on one world), unless the target says."""
CRASH_SHRINKS: Final = 16
"""Shrinking attempts left after a failure that cost a world (each rebuilds it)."""
WAIT_SHRINKS: Final = 2
"""Shrinking attempts left after a rank waited out its collective timeout."""
FLOAT_DTYPES: Final = ("float32", "bfloat16", "float16", "float64")


def all_worlds(world_sizes: Sequence[int]) -> tuple[int, ...]:
    """The worlds of 1 to 4 ranks among ``world_sizes``."""
    return tuple(w for w in world_sizes if 1 <= w <= 4)


def multi_worlds(world_sizes: Sequence[int]) -> tuple[int, ...]:
    """The worlds of 2 to 4 ranks among ``world_sizes``."""
    return tuple(w for w in world_sizes if 2 <= w <= 4)


@dataclass(frozen=True)
class ProgramRow:
    """One row: ``cases(worlds)`` draws one case (a frozen dataclass with a
    ``world_size``) for the given world sizes; ``worlds(world_sizes)`` the world sizes
    it runs on (none: the row is n/a)."""

    id: str
    title: str
    cases: Callable[[Sequence[int]], st.SearchStrategy[Any]]
    worlds: Callable[[Sequence[int]], Sequence[int]]


@dataclass(frozen=True)
class ProgramTarget:
    """A target that runs programs of its own; its name and ``--grad`` are the
    registry's (``targets``, in the options ``apply_target`` gave). ``prepare(progress)``,
    run in the parent before the ranks start, gives the report's header (default
    ``display``) and the releases to add to its versions; ``smaller(case, worlds)`` the
    cases one edit smaller than a failing one, in a fixed order."""

    display: str
    call: str
    rows: tuple[ProgramRow, ...]
    run: Callable[[Any, Any], Any]
    judge: Callable[[Any, Sequence[Any]], list[tuple[str, str]]]
    describe: Callable[[Any], str]
    scope: dict[str, str] = field(default_factory=dict)
    batch: int = BATCH
    smaller: Callable[[Any, Sequence[int]], Iterable[Any]] | None = None
    prepare: Callable[[Progress], tuple[str, dict[str, str]]] | None = None


def first_real_error(errors: dict[int, tuple[int, str, str]]) -> tuple[int, str] | None:
    """The lowest rank whose error (rank -> (step index, type, message)) is not a wait
    for a peer (a timeout, a lost connection), with its ``Type: first line``; ``None``
    when every rank waited."""
    for rank in sorted(errors):
        _, name, message = errors[rank]
        if not any(mark in f"{name}: {message}" for mark in WAIT_MARKS):
            return rank, f"{name}: {message.splitlines()[0][:300] if message else ''}"
    return None


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Standard output sent to /dev/null, at the file descriptor: what a target's
    library prints while it sets up (a JIT build's ninja, which writes to fd 1 from a
    subprocess) stays out of the gate's report."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        with contextlib.redirect_stdout(open(os.devnull, "w", encoding="utf-8")) as sink:
            try:
                yield
            finally:
                sink.close()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


PEERS_WAITED: Final = "peers waited until their collective timeout"


@dataclass(frozen=True)
class StepsReport:
    """One rank's results of a program's steps (calls, layers) run in turn: per step,
    name -> tensor; or the step that raised, (index, type, message)."""

    steps: tuple[dict[str, Any], ...] = ()
    error: tuple[int, str, str] | None = None


def in_turn(count: int, step: Callable[[int], dict[str, Any]]) -> StepsReport:
    """Rank side: steps ``0`` to ``count - 1`` in turn, up to the first that raises."""
    done: list[dict[str, Any]] = []
    for index in range(count):
        try:
            done.append(step(index))
        except Exception as err:
            return StepsReport(tuple(done), (index, type(err).__name__, str(err)))
    return StepsReport(tuple(done))


def differences(
    where: str, got: dict[str, Any], want: dict[str, Any], aspects: dict[str, str]
) -> list[tuple[str, str]]:
    """(aspect, message) for each tensor of ``want`` that ``got`` does not hold bit for
    bit; a name's aspect is in ``aspects``, ``gradient`` where it is not."""
    return [
        (aspects.get(name, "gradient"), f"{where}, {name}: {diff}")
        for name, tensor in want.items()
        if (diff := bitwise_difference(got.get(name), tensor)) is not None
    ]


def raised_message(errors: dict[int, tuple[int, str, str]], unit: str) -> str:
    """What ranks raised (rank -> (``unit`` index, type, message)), as one line: the
    lowest rank's real error (not a wait), and ``PEERS_WAITED`` when other ranks waited
    for it (which ranks, and how they saw it, depends on timing: left out)."""
    real = first_real_error(errors)
    if real is None:
        first = min(e[0] for e in errors.values())
        return f"{unit} {first}: every failing rank's {PEERS_WAITED}"
    rank, text = real
    waits = [r for r in errors if first_real_error({r: errors[r]}) is None]
    return f"{unit} {errors[rank][0]}, rank {rank}: {text}" + (
        f"; its {PEERS_WAITED}" if waits else ""
    )


_NUMBER: Final = re.compile(r"\d+")


def _crash_message(err: PoolFailure) -> tuple[str, str]:
    """(kind, message) of a world that failed, in a form that does not depend on which
    rank died first: gloo's ``what():`` line with its numbers taken out."""
    if isinstance(err, RankHung):
        return "hang", "a rank did not reply within --timeout (a collective never completed)"
    text = str(err)
    for line in text.splitlines():
        if "what():" in line:
            what = line.split("what():", 1)[1].strip()
            what = what.split("] ", 1)[-1]
            return "crash", "a rank process died: " + _NUMBER.sub("N", what)[:300]
    if isinstance(err, RankCrashed):
        return "crash", "a rank process died (no abort message)"
    return "crash", f"the world failed: {type(err).__name__}"


def _in_flight(err: PoolFailure, count: int) -> int | None:
    """The index of the program a dead (or stuck) rank was running, if the pool knows."""
    where = getattr(err, "in_flight", {})
    ranks = [r for r in getattr(err, "ranks", ()) if r in where] or sorted(where)
    if not ranks:
        return None
    index = where[ranks[0]]
    return index if 0 <= index < count else None


def _counterexample(
    target: ProgramTarget, row: str, options: CheckOptions, batch: Sequence[Any]
) -> dict[str, Any]:
    """A failure's ``case`` (the last program of ``batch`` as data) and ``reproduction``
    (the programs in words and as data, and the command that re-runs the search)."""
    listed = "\n".join(f"  {target.describe(c)}\n  {c!r}" for c in batch)
    command = (
        f"python -m vargather check --target {options.target} --only {row} --seed {options.seed} "
        f"--max-examples {options.max_examples}"
    )
    if tuple(sorted(options.world_sizes)) != CheckOptions().world_sizes:
        command += f" --world-sizes {','.join(map(str, sorted(options.world_sizes)))}"
    if options.shrink_budget != CheckOptions().shrink_budget:
        command += f" --shrink-budget {options.shrink_budget}"
    reproduction = (
        f"{len(batch)} program(s) on a gloo world of {batch[0].world_size} rank(s), in "
        f"order:\n{listed}\n  reproduce: {command}"
    )
    return {"case": {**asdict(batch[-1]), "repr": repr(batch[-1])}, "reproduction": reproduction}


@dataclass
class _RowState:
    budget: int
    """Shrinking runs allowed now (Hypothesis's share, then all of ``--shrink-budget``)."""
    cap: int = 1 << 30
    """At most this many, whatever the budget, once a failure cost a world or a wait."""
    examples: int = 0
    cases: int = 0
    shrink: int = 0
    failed: bool = False
    last: PropertyFailure | None = None
    case: Any = None
    """The last program the judge failed (where the last passes start)."""
    memo: dict[str, tuple[PropertyFailure | None, Any]] = field(default_factory=dict)


def _run_batch(
    target: ProgramTarget,
    row: ProgramRow,
    options: CheckOptions,
    batch: list[Any],
    factory: Callable[[int], RankPool],
    state: _RowState,
) -> tuple[PropertyFailure | None, Any]:
    """One batch on its world: its first failure and the program the judge failed
    (``None`` for a world that failed), or ``(None, None)``."""
    failure: PropertyFailure | None = None
    try:
        results = factory(batch[0].world_size).run_many(target.run, batch)
    except PoolFailure as err:
        kind, message = _crash_message(err)
        index = _in_flight(err, len(batch))
        if index is not None:  # the programs after the one that killed it never ran
            batch = batch[: index + 1]
        # a hang costs --timeout each time: no shrinking; a crash a world: a few
        state.cap = min(state.cap, state.shrink + (0 if kind == "hang" else CRASH_SHRINKS))
        failure = PropertyFailure(kind, message, aspect="call")
    except RankError as err:  # the harness's own rank function broke
        message = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        failure = PropertyFailure("checker", message, aspect="call")
    if failure is not None:
        return replace(failure, **_counterexample(target, row.id, options, batch)), None
    for i, (case, reports) in enumerate(zip(batch, results, strict=True)):
        failures = target.judge(case, reports)
        if failures:
            aspect = failures[0][0]
            if aspect == "raised":
                # a rank raised mid-exchange: its peers' gloo pairs may be closed
                # (a timeout closes them) though every rank issued the same count
                factory(batch[0].world_size).restart()
            if PEERS_WAITED in failures[0][1]:
                # a peer waited out its timeout: each further attempt would again
                state.cap = min(state.cap, state.shrink + WAIT_SHRINKS)
            found = PropertyFailure(
                "error" if aspect == "raised" else "mismatch",
                "\n".join(f"[{a}] {m}" for a, m in failures[:4]),
                aspect=aspect,
                **_counterexample(target, row.id, options, batch[: i + 1]),
            )
            return found, case
    return None, None


def _evaluate(
    target: ProgramTarget,
    row: ProgramRow,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    started = time.monotonic()
    worlds = row.worlds(world_sizes)
    # with last passes of its own, Hypothesis gets half the budget, the passes the rest
    state = _RowState(options.shrink_budget // (2 if target.smaller else 1))

    @st.composite
    def batches(draw: Any) -> list[Any]:
        first = draw(row.cases(worlds))
        more = draw(st.lists(row.cases((first.world_size,)), max_size=target.batch - 1))
        return [first, *more]

    def run(batch: list[Any]) -> tuple[PropertyFailure | None, Any]:
        key = repr(batch)
        if key in state.memo:
            return state.memo[key]
        if state.failed:
            if state.shrink >= min(state.budget, state.cap):
                raise ShrinkBudgetSpent
            state.shrink += 1
        else:
            state.examples += 1
            state.cases += len(batch)
            progress.note(f"{row.id}: {state.cases} programs")
        outcome = state.memo[key] = _run_batch(target, row, options, batch, factory, state)
        state.failed = state.failed or outcome[0] is not None
        return outcome

    def body(batch: list[Any]) -> None:
        failure, case = run(batch)
        if failure is not None:
            state.last = failure
            state.case = case if case is not None else state.case
            raise FailingBatchError(failure)

    failure = seeded_search(batches(), body, options, options.max_examples, lambda: state.last)
    if failure is not None and target.smaller is not None and state.case is not None:
        state.budget = options.shrink_budget
        failure = _smallest(target.smaller, state.case, failure, worlds, lambda c: run([c])[0])
    return PropertyResult(
        row.id,
        row.title,
        "pass" if failure is None else "fail",
        examples=state.examples,
        cases=state.cases,
        shrink_runs=state.shrink,
        seconds=time.monotonic() - started,
        failure=failure,
    )


def _smallest(
    smaller: Callable[[Any, Sequence[int]], Iterable[Any]],
    case: Any,
    failure: PropertyFailure,
    worlds: Sequence[int],
    attempt: Callable[[Any], PropertyFailure | None],
) -> PropertyFailure:
    """The last shrinking passes, after Hypothesis's: the failing program alone, then
    ``smaller``'s candidates in their fixed order, taking the first that fails the same
    way (the same aspect) and starting over, until none does or the budget is spent
    (``attempt`` raises ``ShrinkBudgetSpent``)."""
    try:
        alone = attempt(case)
        if alone is None or alone.aspect != failure.aspect:
            return failure
        failure = alone
        while True:
            for candidate in smaller(case, worlds):
                found = attempt(candidate)
                if found is not None and found.aspect == failure.aspect:
                    case, failure = candidate, found
                    break
            else:
                return failure
    except ShrinkBudgetSpent:
        pass
    return failure


def run_program_check(
    target: ProgramTarget,
    options: CheckOptions,
    progress: Progress,
    factory: Callable[[int], RankPool],
    versions: dict[str, str],
) -> Report:
    """``target``'s rows (``--only`` selects) on the gloo worlds of ``options.world_sizes``,
    into the gate's ``Report``; ``options`` are the target's (``apply_target``)."""
    started = time.monotonic()
    display, releases = target.prepare(progress) if target.prepare else (target.display, {})
    world_sizes = tuple(sorted(options.world_sizes))
    rows = [r for r in target.rows if not options.only or r.id in options.only]
    progress.retotal(len(rows))
    needed = sorted({w for r in rows for w in r.worlds(world_sizes)})
    if needed:
        progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
    for w in needed:
        factory(w)
    report = Report(
        impl=None,
        impl_display=display,
        convention="program",
        grad=options.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions={**versions, **releases},
        scope={**target.scope, "--world-sizes": ",".join(map(str, world_sizes))},
        strict=options.strict,
        call=target.call,
        batch=target.batch,
    )
    try:
        for row in rows:
            progress.phase(f"checking {row.id}")
            if options.exitfirst and any(r.failed for r in report.results):
                reason: str | None = "--exitfirst: an earlier property failed"
                result = PropertyResult(row.id, row.title, "skipped", reason=reason)
            elif not row.worlds(world_sizes):
                fits = row.worlds(range(1, 5))
                reason = f"needs a world of {min(fits)} to {max(fits)} ranks (--world-sizes)"
                result = PropertyResult(row.id, row.title, "n/a", reason=reason)
            else:
                result = _evaluate(target, row, options, world_sizes, factory, progress)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report

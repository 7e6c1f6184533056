"""Rows of programs: how the gate runs a built-in target that brings its own oracle.

Where it sits: in the gate's engine in the testing kit, beneath ``ulysses_target``
and ``ep_dispatch_target`` (the two targets that draw programs: DeepSpeed's Ulysses
sequence parallelism and torchtitan's expert-parallel token dispatch) and beneath
``targets`` (the registry, which names each target's module). A target of this kind
is not one ``MODULE:ATTR`` call the catalogue's rows can drive: it is a program that
builds state (process groups, models, per-model head counts) and then calls the code
under test several times, and its oracle is the global tensor sliced on one process.

A target module gives a ``ProgramTarget``: its rows (an id, a title, the strategy of
one case for the run's world sizes, the world sizes the row needs), the rank function
(module level, for the pool: ``run(ctx, case) -> report``), the judge (``judge(case,
reports) -> [(aspect, message)]``, empty when the case holds) and its header.
``run_program_check`` runs every row as a seeded Hypothesis test: the cases are drawn
in the parent and sent to the ranks in batches of a few, shrinking is budgeted by
count (``--shrink-budget``), a world that died in a case (gloo aborts a rank on a size
mismatch) gets a few shrinking attempts only, a hang none, and each failure carries a
``reproduce:`` line. Messages of crashes and waits are put in a fixed form (numbers
out, peers' waiting as one note), so the same seed gives the same JSON every run.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from hypothesis import strategies as st

from .evaluate import FailingBatchError, ShrinkBudgetSpent, seeded_search
from .options import CheckOptions
from .pool import PoolFailure, RankCrashed, RankError, RankHung, RankPool
from .progress import Progress
from .races import WAIT_MARKS
from .results import PropertyFailure, PropertyResult, Report
from .verdict import with_xfail

__all__ = [
    "BATCH",
    "CRASH_SHRINKS",
    "PEERS_WAITED",
    "ProgramRow",
    "ProgramTarget",
    "first_real_error",
    "quiet_stdout",
    "raised_message",
    "run_program_check",
]

BATCH: Final = 3
"""Programs per example (one pool round trip on one world)."""
CRASH_SHRINKS: Final = 16
"""Shrinking attempts after a failure that cost a world (a rank died): each rebuilds
the world, so the search stops early rather than spend the target's time budget."""
WAIT_SHRINKS: Final = 2
"""Shrinking attempts after a failure where a rank waited for a peer until its
collective timeout (seconds each)."""


@dataclass(frozen=True)
class ProgramRow:
    """One row: ``cases(worlds)`` draws one case (a frozen dataclass with a
    ``world_size``) for the given world sizes; ``worlds(world_sizes)`` the world sizes
    it runs on (none: the row is n/a)."""

    id: str
    title: str
    cases: Callable[[Sequence[int]], st.SearchStrategy[Any]]
    worlds: Callable[[Sequence[int]], tuple[int, ...]]


@dataclass(frozen=True)
class ProgramTarget:
    """A target that runs programs of its own (see the module docstring)."""

    name: str
    display: str
    call: str
    grad: str
    rows: tuple[ProgramRow, ...]
    run: Callable[[Any, Any], Any]
    judge: Callable[[Any, Sequence[Any]], list[tuple[str, str]]]
    describe: Callable[[Any], str]
    scope: dict[str, str] = field(default_factory=dict)


def first_real_error(errors: dict[int, tuple[str, str]]) -> tuple[int, str] | None:
    """The lowest rank whose error is not a wait for a peer (a timeout, a lost
    connection), with its ``Type: first line``; ``None`` when every rank waited."""
    for rank in sorted(errors):
        name, message = errors[rank]
        text = f"{name}: {message}"
        if not any(mark in text for mark in WAIT_MARKS):
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


def raised_message(errors: dict[int, tuple[int, str, str]], unit: str) -> str:
    """What ranks raised (rank -> (``unit`` index, type, message)), as one line: the
    lowest rank's real error (not a wait), and ``PEERS_WAITED`` when other ranks waited
    for it (which ranks, and how they saw it, depends on timing: left out)."""
    plain = {r: (name, message) for r, (_, name, message) in errors.items()}
    real = first_real_error(plain)
    if real is None:
        first = min(e[0] for e in errors.values())
        return f"{unit} {first}: every failing rank's {PEERS_WAITED}"
    rank, text = real
    waits = [r for r in plain if first_real_error({r: plain[r]}) is None]
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


def _reproduction(
    target: ProgramTarget, row: str, options: CheckOptions, batch: Sequence[Any]
) -> str:
    listed = "\n".join(f"  {target.describe(c)}\n  {c!r}" for c in batch)
    return (
        f"{len(batch)} program(s) on a gloo world of {batch[0].world_size} rank(s), in "
        f"order:\n{listed}\n  reproduce: python -m vargather check --target {target.name} "
        f"--only {row} --seed {options.seed} --max-examples {options.max_examples}"
    )


def _evaluate(
    target: ProgramTarget,
    row: ProgramRow,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    started = time.monotonic()
    state: dict[str, Any] = {"examples": 0, "cases": 0, "shrink": 0, "failed": False}
    state["budget"] = options.shrink_budget
    memo: dict[str, PropertyFailure | None] = {}
    last: list[PropertyFailure] = []
    worlds = row.worlds(world_sizes)

    @st.composite
    def batches(draw: Any) -> list[Any]:
        first = draw(row.cases(worlds))
        more = draw(st.lists(row.cases((first.world_size,)), max_size=BATCH - 1))
        return [first, *more]

    def run(batch: list[Any]) -> PropertyFailure | None:
        if state["failed"]:
            if state["shrink"] >= state["budget"]:
                raise ShrinkBudgetSpent
            state["shrink"] += 1
        else:
            state["examples"] += 1
            state["cases"] += len(batch)
            progress.note(f"{row.id}: {state['cases']} programs")
        try:
            results = factory(batch[0].world_size).run_many(target.run, batch)
        except PoolFailure as err:
            kind, message = _crash_message(err)
            index = _in_flight(err, len(batch))
            if index is not None:  # the programs after the one that killed it never ran
                batch = batch[: index + 1]
            if not state["failed"]:
                state["failed"] = True
            # a hang costs --timeout each time: no shrinking; a crash a world: a few
            limit = 0 if kind == "hang" else CRASH_SHRINKS
            state["budget"] = min(state["budget"], state["shrink"] + limit)
            return PropertyFailure(
                kind,
                message,
                {**asdict(batch[-1]), "repr": repr(batch[-1])},
                _reproduction(target, row.id, options, batch),
                aspect="call",
            )
        except RankError as err:  # the harness's own rank function broke
            state["failed"] = True
            return PropertyFailure(
                "checker",
                f"{type(err).__name__}: {str(err).splitlines()[0][:300]}",
                {**asdict(batch[-1]), "repr": repr(batch[-1])},
                _reproduction(target, row.id, options, batch),
                aspect="call",
            )
        for i, (case, reports) in enumerate(zip(batch, results, strict=True)):
            failures = target.judge(case, reports)
            if failures:
                state["failed"] = True
                aspect = failures[0][0]
                if aspect == "raised":
                    # a rank raised mid-exchange: its peers' gloo pairs may be closed
                    # (a timeout closes them) though every rank issued the same count
                    factory(batch[0].world_size).restart()
                if PEERS_WAITED in failures[0][1]:
                    # a peer waited out its timeout: each further attempt would again
                    state["budget"] = min(state["budget"], state["shrink"] + WAIT_SHRINKS)
                return PropertyFailure(
                    "error" if aspect == "raised" else "mismatch",
                    "\n".join(f"[{a}] {m}" for a, m in failures[:4]),
                    {**asdict(case), "repr": repr(case)},
                    _reproduction(target, row.id, options, batch[: i + 1]),
                    aspect=aspect,
                )
        return None

    def body(batch: list[Any]) -> None:
        key = repr(batch)
        failure = memo[key] if key in memo else run(batch)
        memo[key] = failure
        if failure is not None:
            last[:] = [failure]
            raise FailingBatchError(failure)

    failure = seeded_search(
        batches(), body, options, options.max_examples, lambda: last[0] if last else None
    )
    return PropertyResult(
        row.id,
        row.title,
        "pass" if failure is None else "fail",
        examples=state["examples"],
        cases=state["cases"],
        shrink_runs=state["shrink"],
        seconds=time.monotonic() - started,
        failure=failure,
    )


def run_program_check(
    target: ProgramTarget,
    options: CheckOptions,
    progress: Progress,
    factory: Callable[[int], RankPool],
    versions: dict[str, str],
) -> Report:
    """Every row of ``target`` (``--only`` selects) as a seeded Hypothesis test on the
    gloo worlds of ``options.world_sizes``, into the gate's ``Report``."""
    started = time.monotonic()
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
        impl_display=target.display,
        convention="program",
        grad=target.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions=versions,
        scope={**target.scope, "--world-sizes": ",".join(map(str, world_sizes))},
        strict=options.strict,
        call=target.call,
        batch=BATCH,
    )
    try:
        for row in rows:
            progress.phase(f"checking {row.id}")
            if options.exitfirst and any(r.failed for r in report.results):
                result = PropertyResult(
                    row.id, row.title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif not row.worlds(world_sizes):
                result = PropertyResult(
                    row.id, row.title, "n/a", reason="needs a world of 2 to 4 ranks (--world-sizes)"
                )
            else:
                result = _evaluate(target, row, options, world_sizes, factory, progress)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report

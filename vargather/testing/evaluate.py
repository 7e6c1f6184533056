"""One property as a seeded Hypothesis run: the gate's property evaluation.

Where it sits: in the gate's engine in the testing kit, beneath ``engine`` (which runs
every row through ``evaluate``) and above ``results``, ``progress`` and ``isolated``.
Examples and shrinking are budgeted by count, never by time, so a loaded machine runs
the same examples; a failing attempt's cost (``_attempt_cost``) sets how far it is
shrunk (docs/conformance.md, "Budget and determinism").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .importer import short_traceback
from .isolated import in_flight
from .judge import Failure
from .options import CheckOptions
from .pool import RankPool
from .progress import Progress
from .properties import BATCH, Property
from .races import is_wait, settle
from .results import NanPayloads, PropertyFailure, PropertyResult

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

CRASH_SHRINK_BUDGET: Final = 4
"""At most this many shrinking examples once a property's failure costs a world: a
crash, or a collective that failed (the world is rebuilt after each)."""

TRIES: Final = 3
"""How often a failing batch is run (docs/conformance.md, "Flaky failures"): the row's
first failing example, every shrinking candidate of a row whose first failure did not
fail every time, and the counterexample reported."""

_KIND_ORDER: Final = ("mismatch", "error", "crash", "hang", "checker")
"""Which of a flaky counterexample's failing tries the report shows: the first kind
here (a wrong result is the most direct evidence), then the most frequent message."""


def render_failures(failures: Sequence[Failure], limit: int = 4) -> str:
    """The judge's failures of one case, one per distinct failure (ranks that failed
    alike are one ``Failure`` already), at most ``limit`` of them."""
    lines = [f.render() for f in failures[:limit]]
    if len(failures) > limit:
        lines.append(f"... and {len(failures) - limit} more distinct failure(s)")
    return "\n".join(lines)


class FailingBatchError(AssertionError):
    """Raised inside the Hypothesis test body: the batch has a failing case."""

    def __init__(self, failure: PropertyFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


_COST_CHEAP: Final = 0
_COST_WORLD: Final = 1
_COST_TIMEOUT: Final = 2
_TIMEOUT_MARKS: Final = ("Timed out", "timed out")


class _UsedPools:
    """The pool factory of one attempt, remembering each world's generation when the
    attempt first asked for it: an attempt that rebuilt or discarded a world (a crash,
    a hang, a collective that failed) cost a world."""

    def __init__(self, factory: Callable[[int], RankPool]) -> None:
        self.factory = factory
        self.pools: dict[int, tuple[RankPool, int]] = {}

    def __call__(self, world_size: int) -> RankPool:
        pool = self.factory(world_size)
        if world_size not in self.pools:
            self.pools[world_size] = (pool, getattr(pool, "generation", 0))
        return pool

    def rebuilt(self) -> bool:
        # A discarded world is rebuilt on the next call; the pool says "stale".
        return any(
            getattr(pool, "generation", 0) != generation or "stale" in repr(pool)
            for pool, generation in self.pools.values()
        )


def _attempt_cost(results: Sequence[tuple[Any, Sequence[Failure]]], used: _UsedPools) -> int:
    """What a failing attempt cost, whatever the implementation did (counted, never
    timed, so every run shrinks alike): ``_COST_TIMEOUT`` when a rank hung or waited
    out a collective's timeout (a peer never came: every further attempt costs the
    timeout again), ``_COST_WORLD`` when a world died or was discarded (a crash, a
    collective error: every further attempt costs a world rebuild), else cheap."""
    failures = [f for _, fs in results for f in fs]
    if any(is_wait(f) or any(m in f.render() for m in _TIMEOUT_MARKS) for f in failures):
        # A peer waited (a timeout, a lost connection, a hang), or a failure quotes a
        # timeout: however the waiting showed, and whether or not a refusal came with
        # it, the same cost (races).
        return _COST_TIMEOUT
    if any(f.kind == "crash" for f in failures) or used.rebuilt():
        return _COST_WORLD
    return _COST_CHEAP


@dataclass
class _PropertyState:
    cost: int = _COST_CHEAP
    examples: int = 0
    cases: int = 0
    shrink_runs: int = 0
    failed_at: float | None = None
    last: PropertyFailure | None = None
    last_key: tuple[Any, ...] = ()
    memo: dict[tuple[Any, ...], PropertyFailure | None] = field(default_factory=dict)
    tries: dict[tuple[Any, ...], list[PropertyFailure | None]] = field(default_factory=dict)
    """Every try of every batch run, in order (a batch's memo entry is its first failure)."""
    flaky: bool = False
    """The row's first failing example passed in some try: every shrinking candidate
    gets up to ``TRIES`` tries."""
    nan_cases: int = 0
    nan_first: NanPayloads | None = None


def _settle_tries(tries: Sequence[PropertyFailure | None]) -> PropertyFailure:
    """The failure to report of a counterexample's ``tries`` (at least one failed):
    the same whichever try failed first, with how many of them failed."""
    failing = [t for t in tries if t is not None]
    counts = Counter(t.message for t in failing)

    def order(t: PropertyFailure) -> tuple[int, int, str]:
        rank = _KIND_ORDER.index(t.kind) if t.kind in _KIND_ORDER else len(_KIND_ORDER)
        return rank, -counts[t.message], t.message

    chosen = min(failing, key=order)
    return dataclasses.replace(chosen, tries=len(tries), failed_tries=len(failing))


def evaluate_row(
    prop: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
    *,
    row_id: str | None = None,
    max_examples: int | None = None,
) -> PropertyResult:
    """Run one property as a Hypothesis test; shrink its first failure to a minimal case."""
    started = time.monotonic()
    state = _PropertyState()
    strategy: SearchStrategy[list[Any]] = prop.strategy(
        world_sizes, batch=BATCH, max_payload=options.max_payload
    )

    set_nans_aside = options.nan_payloads == "backend" and not options.strict

    def attempt(batch: list[Any], first_try: bool) -> PropertyFailure | None:
        """One try of ``batch``: its first failing case's failure, or ``None``."""
        used = _UsedPools(factory)
        with in_flight(options.in_flight, batch, prop):
            results = prop.run(batch, pool_factory=used)
        counted = first_try and state.failed_at is None
        if counted:
            state.examples += 1
            state.cases += sum(1 for v, _ in results if not v.not_run)
            progress.note(f"{prop.id}: {state.cases} cases")
        if set_nans_aside:  # NaN payload differences noted (the first example's), not failed
            for index, (_, failures) in enumerate(results):
                payloads = [f for f in failures if f.nan_payload]
                if payloads and counted:
                    state.nan_cases += 1
                    if state.nan_first is None:
                        shown = prop.describe(batch, index)
                        state.nan_first = NanPayloads(0, render_failures(payloads), shown)
            results = [(v, [f for f in fs if not f.nan_payload]) for v, fs in results]
        for index, (verdict, failures) in enumerate(results):
            if failures:
                if state.failed_at is None:
                    state.failed_at = time.monotonic()
                state.cost = max(state.cost, _attempt_cost(results, used))
                # The row tells the case with the calls that ran before it on the same
                # world (state carried over); Hypothesis keeps only those it needs.
                shown = prop.describe(batch, index)
                # A refusal racing its peers' waiting reads the same every run (races).
                settled = settle(failures)
                # The first record's kind and aspect; a crash or a hang anywhere is the kind.
                kinds = {f.kind for f in settled}
                kind = next((k for k in ("crash", "hang") if k in kinds), settled[0].kind)
                data = prop.case_data(verdict.case)
                message = render_failures(settled)
                return PropertyFailure(kind, message, data, shown, aspect=settled[0].aspect)
        return None

    def run(batch: list[Any]) -> PropertyFailure | None:
        first = state.failed_at is None
        if not first:
            budget = options.shrink_budget
            if state.cost == _COST_WORLD:  # every such attempt costs a world restart
                budget = min(budget, CRASH_SHRINK_BUDGET)
            if state.cost == _COST_TIMEOUT or state.shrink_runs >= budget:
                # End the search: past the budget Hypothesis would propose a thousand
                # more shrinks, each drawing a whole batch to be turned away here.
                raise ShrinkBudgetSpent
            state.shrink_runs += 1
        tries = [attempt(batch, True)]
        if first and tries[0] is not None:
            # The row's first failure: does it fail on every try?
            while len(tries) < TRIES and state.cost != _COST_TIMEOUT:
                tries.append(attempt(batch, False))
            state.flaky = any(t is None for t in tries)
        elif not first and state.flaky:
            while tries[-1] is None and len(tries) < TRIES:  # fails in any of its tries
                tries.append(attempt(batch, False))
        state.tries[tuple(batch)] = tries
        return next((t for t in tries if t is not None), None)

    def body(batch: list[Any]) -> None:
        key = tuple(batch)
        failure = state.memo[key] if key in state.memo else run(batch)
        if failure is not None:
            state.memo[key] = state.last = failure
            state.last_key = key
            # One raise site: Hypothesis tells failures apart by where they are raised.
            raise FailingBatchError(failure)

    # A property whose examples cost seconds each (compiling) caps its own count.
    count = prop.max_examples(max_examples or options.max_examples)
    failure = seeded_search(strategy, body, options, count, lambda: state.last)
    last = state.last
    if failure is not None and last is not None and failure.message.startswith(last.message):
        # the note of a failure that did not reproduce on Hypothesis's replay, if any
        note = failure.message[len(last.message) :]
        # The counterexample run until it has TRIES tries (once only after a timeout).
        tries = state.tries.setdefault(state.last_key, [last])
        while len(tries) < TRIES and state.cost != _COST_TIMEOUT:
            tries.append(attempt(list(state.last_key), False))
        settled = _settle_tries(tries)
        failure = dataclasses.replace(settled, message=settled.message + note)
    if failure is None and state.cases == 0:
        failure = PropertyFailure("checker", "no case ran (every drawn case was filtered out)")
    nans = state.nan_first
    return PropertyResult(
        row_id or prop.id,
        prop.title,
        "pass" if failure is None else "fail",
        examples=state.examples,
        cases=state.cases,
        shrink_runs=state.shrink_runs,
        seconds=time.monotonic() - started,
        failure=failure,
        nan_payloads=None if nans is None else dataclasses.replace(nans, cases=state.nan_cases),
    )


def seeded_search(
    strategy: SearchStrategy[Any],
    body: Callable[[Any], None],
    options: CheckOptions,
    max_examples: int,
    last: Callable[[], PropertyFailure | None],
) -> PropertyFailure | None:
    """``body`` over ``strategy`` as a seeded Hypothesis test of ``max_examples``
    examples: the failure ``body`` raised (``FailingBatchError``; after
    ``ShrinkBudgetSpent`` ended the shrinking, ``last()``, the smallest seen), or
    ``None``."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    db = None if options.db is None else DirectoryBasedExampleDatabase(options.db)
    test = settings(
        max_examples=max_examples,
        derandomize=False,  # the seed below makes a run reproducible
        database=db,  # nothing written into the caller's checkout
        deadline=None,  # no timed verdicts: a slow machine is not a failure
        verbosity=Verbosity.quiet,  # the report prints the counterexample, not Hypothesis
        print_blob=False,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        # Health checks judge the strategies (the property suite's own tests run them);
        # here they would blame the implementation under test for how cases are drawn.
        suppress_health_check=list(HealthCheck),
    )(seed(options.seed)(given(strategy)(body)))
    try:
        test()
    except FailingBatchError as err:
        return err.failure
    except ShrinkBudgetSpent:
        # Every failing example the shrinker runs is smaller than the one before (it
        # only tries smaller ones), so the last failure seen is the smallest found.
        return last()
    except Exception as err:  # Hypothesis's Flaky, or the check itself broke
        seen = last()
        if seen is not None:
            note = (
                f"\n(the failure did not reproduce on a re-run: {type(err).__name__}; "
                "the implementation may be nondeterministic)"
            )
            return dataclasses.replace(seen, message=seen.message + note)
        return PropertyFailure(
            "checker",
            f"the check could not run this property: {type(err).__name__}: {err}\n"
            + short_traceback(err, 12),
        )
    return None


class ShrinkBudgetSpent(BaseException):
    """Raised from inside a Hypothesis test to end its shrinking: a ``BaseException``
    that is not an ``Exception``, so Hypothesis lets it through instead of recording a
    failure."""


NONEMPTY_EXAMPLES: Final = 20
"""Examples of the second search for a gradient counterexample without empty shards."""


def prefer_nonempty(
    result: PropertyResult,
    row: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    """A gradient failure shrunk to a case with an empty shard reads like a quibble
    ("x.grad=NoneType, should be shape (0,)"); when the same property also fails on
    cases whose shards are all non-empty, report that counterexample instead (a
    second, seeded search restricted to them)."""
    f = result.failure
    if result.status != "fail" or f is None or f.aspect not in ("gradient", "adjoint"):
        return result
    sizes = None if f.case is None else f.case.get("sizes")
    if not isinstance(sizes, list) or all(n > 0 for n in sizes):
        return result  # a case of no sizes (another collective's) has no empty shards
    keep = row.keep

    def nonempty(case: Any) -> bool:
        return all(n > 0 for n in case.sizes) and (keep is None or keep(case))

    narrowed = dataclasses.replace(row, keep=nonempty)
    examples = min(options.max_examples, NONEMPTY_EXAMPLES)
    second = evaluate_row(
        narrowed, options, world_sizes, factory, progress, row_id=result.id, max_examples=examples
    )
    g = second.failure
    if second.status != "fail" or g is None or g.aspect not in ("gradient", "adjoint"):
        return result
    note = "\n(it fails with empty shards too; this counterexample has none)"
    return dataclasses.replace(
        result,
        shrink_runs=result.shrink_runs + second.examples + second.shrink_runs,
        failure=dataclasses.replace(g, message=g.message + note),
    )


_STORAGE_ENV: Final = "HYPOTHESIS_STORAGE_DIRECTORY"


@contextlib.contextmanager
def hypothesis_storage(db: str | None) -> Iterator[None]:
    """Point Hypothesis's storage directory (it caches ``constants/`` there even with
    ``database=None``) at a temporary directory for the run, in this process and in the
    child processes it starts, so nothing is written into the caller's directory; with
    ``--db`` the database lives where asked and the rest beside it."""
    from hypothesis import configuration

    before_home = getattr(configuration, "__hypothesis_home_directory", None)
    before_env = os.environ.get(_STORAGE_ENV)
    with tempfile.TemporaryDirectory(prefix="vargather-hypothesis-") as tmp:
        home = os.path.join(os.path.abspath(db), ".hypothesis") if db is not None else tmp
        configuration.set_hypothesis_home_dir(home)
        os.environ[_STORAGE_ENV] = home
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(before_home)
            if before_env is None:
                os.environ.pop(_STORAGE_ENV, None)
            else:
                os.environ[_STORAGE_ENV] = before_env

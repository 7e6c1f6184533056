"""The conformance gate's engine: ``run_check``, the catalogue against one implementation.

Where it sits: at the top of the gate's engine in the testing kit, above ``options``
(what to run), ``resolve`` (what ``impl`` names and how to call it), ``verdict`` (the
status rules) and ``results`` (the report). It starts the gloo worlds
(``vargather.testing.pool``), runs every property of the kit's one catalogue
(``vargather.testing.properties``: the properties the test suite and the mutant
search run) as a seeded Hypothesis test, shrinking a failure to a minimal
counterexample within a budget counted in examples (a failure whose attempts cost a
world, a timeout or a crash, gets a few attempts only), and returns a ``Report``. The
property whose cases run without torch.distributed runs in a child process
(``python -m vargather.testing.engine OPTIONS.json``), so a crash or hang there is
that property's failure. Both surfaces call ``run_check``: the command line
(``vargather._cli.check``) and the pytest plugin (``vargather.testing.plugin``), each
with its own ``progress`` callback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import torch

import vargather

from .calls import parse_call
from .cases import DTYPE_NAMES, GatherCase, Implementation, RankReport
from .judge import Failure
from .options import DEFAULT_TIMEOUT, CheckOptions, CheckUsageError
from .pool import PoolFailure, RankError, RankPool, get_pool
from .properties import BATCH, Property, catalogue
from .resolve import ImplInfo, ensure_import_path, resolve_options_impl
from .results import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PropertyFailure, PropertyResult, Report
from .runner import (
    backend_refusals,
    describe,
    describe_coalesced,
    rank_preflight,
    run_on_rank,
    short_traceback,
)
from .verdict import UNSUPPORTED_EXAMPLES, split_rows, with_unsupported, with_xfail

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "CRASH_SHRINK_BUDGET",
    "ProgressCallback",
    "ProgressEvent",
    "evaluate",
    "render_failures",
    "run_check",
]

CRASH_SHRINK_BUDGET: Final = 4
"""At most this many shrinking examples once a property's failure costs a world: a
crash, or a collective that failed or timed out (the world is rebuilt after each)."""


# --- progress ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressEvent:
    """What the engine is doing, for a surface to show: ``kind`` is ``phase`` (``text``
    says what starts), ``note`` (a detail of the current row), ``total`` (the number
    of rows is now ``total``), ``row`` (``result`` is done; ``text`` its line) or
    ``close`` (the run is over)."""

    kind: str
    text: str = ""
    total: int = 0
    result: PropertyResult | None = None


ProgressCallback = Callable[[ProgressEvent], None]


class _Progress:
    """The engine's side of the progress callback (nothing when there is none)."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        if callback is not None:
            callback(ProgressEvent("total", total=total))

    def _emit(self, event: ProgressEvent) -> None:
        if self.callback is not None:
            self.callback(event)

    def phase(self, text: str) -> None:
        self._emit(ProgressEvent("phase", text))

    def note(self, text: str) -> None:
        self._emit(ProgressEvent("note", text))

    def retotal(self, total: int) -> None:
        self._emit(ProgressEvent("total", total=total))

    def row(self, result: PropertyResult) -> None:
        self._emit(ProgressEvent("row", result.progress_line(), result=result))

    def close(self) -> None:
        self._emit(ProgressEvent("close"))


# --- running one property ------------------------------------------------------------


def _case_data(case: GatherCase) -> dict[str, Any]:
    """A ``GatherCase`` as plain JSON data (the counterexample in the report)."""
    return {
        "world_size": case.group_size,
        "shapes": [list(s) for s in case.shapes],
        "sizes": list(case.sizes),
        "dim": case.dim,
        "dtype": case.dtype,
        "contract": case.contract,
        "transport": case.transport,
        "sizes_passed": case.sizes_form,
        "memory": [case.memory_of(r) for r in range(case.group_size)],
        "values": case.values,
        "upstream": case.upstream,
        "requires_grad": case.requires_grad,
        "seed": case.seed,
        "payload_bytes": list(case.shard_bytes),
        "subgroup": None if case.members is None else list(case.members),
        "world": case.world_size,
        "initialized": case.initialized,
        "repr": repr(case),
    }


def render_failures(failures: Sequence[Failure], limit: int = 4) -> str:
    """The judge's failures of one case, one per distinct failure (ranks that failed
    alike are one ``Failure`` already), at most ``limit`` of them."""
    lines = [f.render() for f in failures[:limit]]
    if len(failures) > limit:
        lines.append(f"... and {len(failures) - limit} more distinct failure(s)")
    return "\n".join(lines)


def _property_failure(
    failures: Sequence[Failure],
    case: GatherCase,
    impl: Implementation,
    before: Sequence[GatherCase] = (),
    reproduction: str | None = None,
) -> PropertyFailure:
    """A property's failure on ``case``, from the judge's records (the first one's kind
    and aspect; a crash or a hang anywhere is the property's kind). ``reproduction``
    replaces ``describe(case, impl, before=before)`` (a coalesced call's)."""
    kinds = {f.kind for f in failures}
    kind = next((k for k in ("crash", "hang") if k in kinds), failures[0].kind)
    return PropertyFailure(
        kind,
        render_failures(failures),
        _case_data(case),
        reproduction or describe(case, impl, before=before),
        aspect=failures[0].aspect,
    )


class _FailingBatchError(AssertionError):
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
        for pool, generation in self.pools.values():
            # A discarded world is rebuilt on the next call; the pool says "stale".
            if getattr(pool, "generation", 0) != generation or "stale" in repr(pool):
                return True
        return False


def _attempt_cost(results: Sequence[tuple[Any, Sequence[Failure]]], used: _UsedPools) -> int:
    """What a failing attempt cost, whatever the implementation did (counted, never
    timed, so every run shrinks alike): ``_COST_TIMEOUT`` when a rank hung or waited
    out a collective's timeout (a peer never came: every further attempt costs the
    timeout again), ``_COST_WORLD`` when a world died or was discarded (a crash, a
    collective error: every further attempt costs a world rebuild), else cheap."""
    texts = [f.render() for _, failures in results for f in failures]
    kinds = {f.kind for _, failures in results for f in failures}
    if "hang" in kinds or any(m in t for t in texts for m in _TIMEOUT_MARKS):
        return _COST_TIMEOUT
    if "crash" in kinds or used.rebuilt():
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
    memo: dict[tuple[GatherCase, ...], PropertyFailure | None] = field(default_factory=dict)


def _evaluate(
    prop: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: _Progress,
    *,
    row_id: str | None = None,
    max_examples: int | None = None,
) -> PropertyResult:
    """Run one property as a Hypothesis test; shrink its first failure to a minimal case.

    Deterministic for a given seed: examples and shrinking are budgeted by count, never
    by time, so a loaded machine runs the same examples."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

    started = time.monotonic()
    state = _PropertyState()
    strategy: SearchStrategy[list[GatherCase]] = prop.strategy(
        world_sizes, batch=BATCH, max_payload=options.max_payload
    )
    impl = prop.implementation

    def out_of_budget() -> bool:
        if state.failed_at is None:
            return False
        budget = options.shrink_budget
        if state.cost == _COST_WORLD:  # every such attempt costs a world restart
            budget = min(budget, CRASH_SHRINK_BUDGET)
        return state.cost == _COST_TIMEOUT or state.shrink_runs >= budget

    def run(batch: list[GatherCase]) -> PropertyFailure | None:
        if state.failed_at is not None:
            if out_of_budget():
                # End the search: past the budget Hypothesis would propose a thousand
                # more shrinks, each drawing a whole batch to be turned away here.
                raise _ShrinkBudgetSpent
            state.shrink_runs += 1
        used = _UsedPools(factory)
        with _in_flight(options.in_flight, batch, impl):
            results = prop.run(batch, pool_factory=used)
        if state.failed_at is None:
            state.examples += 1
            state.cases += sum(1 for v, _ in results if not v.not_run)
            progress.note(f"{prop.id}: {state.cases} cases")
        for index, (verdict, failures) in enumerate(results):
            if failures:
                if state.failed_at is None:
                    state.failed_at = time.monotonic()
                state.cost = max(state.cost, _attempt_cost(results, used))
                if prop.coalesced:  # one call of every case: it lists them all
                    shown = describe_coalesced(batch, index, impl)
                    return _property_failure(failures, verdict.case, impl, reproduction=shown)
                # The calls that ran before it on the same world (state carried over);
                # Hypothesis keeps only those the failure needs.
                before = batch[:index]
                return _property_failure(failures, verdict.case, impl, before)
        return None

    def body(batch: list[GatherCase]) -> None:
        key = tuple(batch)
        failure = state.memo[key] if key in state.memo else run(batch)
        if failure is not None:
            state.memo[key] = state.last = failure
            # One raise site: Hypothesis tells failures apart by where they are raised.
            raise _FailingBatchError(failure)

    test = settings(
        max_examples=max_examples or options.max_examples,
        derandomize=False,  # the seed below makes a run reproducible
        database=_database(options.db),  # nothing written into the caller's checkout
        deadline=None,  # no timed verdicts: a slow machine is not a failure
        verbosity=Verbosity.quiet,  # the report prints the counterexample, not Hypothesis
        print_blob=False,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        # Health checks judge the strategies (the property suite's own tests run them);
        # here they would blame the implementation under test for how cases are drawn.
        suppress_health_check=list(HealthCheck),
    )(seed(options.seed)(given(strategy)(body)))
    failure: PropertyFailure | None = None
    try:
        test()
    except _FailingBatchError as err:
        failure = err.failure
    except _ShrinkBudgetSpent:
        # Every failing example the shrinker runs is smaller than the one before (it
        # only tries smaller ones), so the last failure seen is the smallest found.
        failure = state.last
    except Exception as err:  # Hypothesis's Flaky, or the check itself broke
        if state.last is not None:
            note = (
                f"\n(the failure did not reproduce on a re-run: {type(err).__name__}; "
                "the implementation may be nondeterministic)"
            )
            failure = dataclasses.replace(state.last, message=state.last.message + note)
        else:
            failure = PropertyFailure(
                "checker",
                f"the check could not run this property: {type(err).__name__}: {err}\n"
                + short_traceback(err, 12),
            )
    seconds = time.monotonic() - started
    if failure is None and state.cases == 0:
        failure = PropertyFailure("checker", "no case ran (every drawn case was filtered out)")
    return PropertyResult(
        row_id or prop.id,
        prop.title,
        "pass" if failure is None else "fail",
        examples=state.examples,
        cases=state.cases,
        shrink_runs=state.shrink_runs,
        seconds=seconds,
        failure=failure,
    )


def evaluate(
    prop: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: ProgressCallback | None = None,
) -> PropertyResult:
    """One property's seeded Hypothesis run on ``factory``'s worlds, shrinking its
    first failure within the budget (what ``run_check`` does for every row)."""
    return _evaluate(prop, options, world_sizes, factory, _Progress(progress, 1))


class _ShrinkBudgetSpent(BaseException):
    """Raised from inside a Hypothesis test to end its shrinking: a ``BaseException``
    that is not an ``Exception``, so Hypothesis lets it through instead of recording a
    failure."""


NONEMPTY_EXAMPLES: Final = 20
"""Examples of the second search for a gradient counterexample without empty shards."""


def _all_nonempty(case: GatherCase) -> bool:
    return all(n > 0 for n in case.sizes)


def _prefer_nonempty(
    result: PropertyResult,
    row: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: _Progress,
) -> PropertyResult:
    """A gradient failure shrunk to a case with an empty shard reads like a quibble
    ("x.grad=NoneType, should be shape (0,)"); when the same property also fails on
    cases whose shards are all non-empty, report that counterexample instead (a
    second, seeded search restricted to them)."""
    f = result.failure
    if result.status != "fail" or f is None or f.aspect not in ("gradient", "adjoint"):
        return result
    if f.case is None or all(n > 0 for n in f.case["sizes"]):
        return result
    keep = row.keep

    def nonempty(case: GatherCase) -> bool:
        return _all_nonempty(case) and (keep is None or keep(case))

    second = _evaluate(
        dataclasses.replace(row, keep=nonempty),
        options,
        world_sizes,
        factory,
        progress,
        row_id=result.id,
        max_examples=min(options.max_examples, NONEMPTY_EXAMPLES),
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


def _database(path: str | None) -> Any:
    """Hypothesis's example database: none, or ``--db PATH``."""
    if path is None:
        return None
    from hypothesis.database import DirectoryBasedExampleDatabase

    return DirectoryBasedExampleDatabase(path)


_STORAGE_ENV: Final = "HYPOTHESIS_STORAGE_DIRECTORY"


@contextlib.contextmanager
def _hypothesis_storage(db: str | None) -> Iterator[None]:
    """Point Hypothesis's storage directory (it caches ``constants/`` there even with
    ``database=None``) at a temporary directory for the run, in this process and in the
    child processes it starts, so nothing is written into the caller's directory; with
    ``--db`` the database lives where asked and the rest beside it."""
    from hypothesis import configuration

    key = "__hypothesis_home_directory"
    before_home = getattr(configuration, key, None)
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


_HUNG_EXIT: Final = 75  # the child's exit status when its watchdog fired


@contextlib.contextmanager
def _in_flight(
    path: str | None, batch: Sequence[GatherCase], impl: Implementation
) -> Iterator[None]:
    """In the child that runs the in-process row: record ``batch`` in ``path`` while it
    runs (so the parent can name the case if this process dies) and exit with
    ``_HUNG_EXIT`` if it does not finish within the timeout the parent set."""
    if path is None:
        yield
        return
    record = {
        "cases": [_case_data(c) for c in batch],
        "reproduction": describe(batch[0], impl) if batch else None,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)
    timeout = float(os.environ.get(_CHILD_TIMEOUT_ENV, DEFAULT_TIMEOUT))
    watchdog = threading.Timer(timeout, os._exit, args=(_HUNG_EXIT,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()


_CHILD_TIMEOUT_ENV: Final = "VARGATHER_CHECK_BATCH_TIMEOUT"


def _child_options(
    row: Property, options: CheckOptions, info: ImplInfo, report: str, in_flight: str
) -> CheckOptions:
    """The isolated child's options: the parent's, resolved (the convention and
    transports it picked), for this row alone; xfails stay with the parent."""
    transports = "none" if info.transports is None else ",".join(info.transports)
    return dataclasses.replace(
        options,
        only=(row.id,),
        convention="auto" if info.call is not None else info.convention,
        transports=("auto" if info.call is not None else transports)
        if info.ref is not None
        else options.transports,
        json_path=report,
        progress=False,
        in_flight=in_flight,
        xfails=frozenset(),
        xfails_path=None,
        exitfirst=False,
        config_path=None,
    )


def _run_isolated(row: Property, options: CheckOptions, info: ImplInfo) -> PropertyResult:
    """Run a row whose cases execute in the checking process itself (torch.distributed
    not initialized) in a child check process instead, so a crash or a hang of the
    implementation is that row's failure, not the checker's."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vargather-check-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        in_flight = os.path.join(tmp, "in-flight.json")
        options_path = os.path.join(tmp, "options.json")
        child = _child_options(row, options, info, report_path, in_flight)
        with open(options_path, "w", encoding="utf-8") as f:
            json.dump(child.to_json(), f)
        command = [sys.executable, "-m", __name__, options_path]
        env = {**os.environ, _CHILD_TIMEOUT_ENV: str(options.timeout)}
        # Backstop only: the child's own watchdog reports a hung batch after --timeout.
        backstop = 120.0 + 2 * options.timeout + options.shrink_budget + options.max_examples
        try:
            proc = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=backstop, check=False
            )
        except subprocess.TimeoutExpired:
            what = f"the child check process did not finish within {backstop:g} s"
            return _child_failure(row, "hang", what, "", in_flight, started)
        if proc.returncode in (EXIT_OK, EXIT_FAILED) and os.path.exists(report_path):
            with open(report_path, encoding="utf-8") as f:
                data = json.load(f)
            (result,) = [PropertyResult.from_json(p) for p in data["properties"]]
            return dataclasses.replace(result, seconds=time.monotonic() - started)
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        if proc.returncode == _HUNG_EXIT:
            what = f"a batch did not finish within --timeout={options.timeout:g} s"
            return _child_failure(row, "hang", what, "", in_flight, started)
        if proc.returncode < 0:
            what = f"the process running it was killed by signal {_signal_name(-proc.returncode)}"
            return _child_failure(row, "crash", what, tail, in_flight, started)
        what = f"the child check process exited with status {proc.returncode}"
        kind = "checker" if proc.returncode == EXIT_USAGE else "crash"
        return _child_failure(row, kind, what, tail, in_flight, started)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _child_failure(
    row: Property, kind: str, what: str, stderr: str, in_flight: str, started: float
) -> PropertyResult:
    case: dict[str, Any] | None = None
    reproduction: str | None = None
    cases = 0
    try:
        with open(in_flight, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = None
    if record is not None and record["cases"]:
        cases = len(record["cases"])
        case = record["cases"][0]
        reproduction = record["reproduction"]
        what += f", running a batch of {cases} case(s) (the first is shown)"
    message = f"torch.distributed not initialized, in a child process: {what}"
    if stderr:
        message += f"\nits stderr:\n{stderr}"
    return PropertyResult(
        row.id,
        row.title,
        "fail",
        cases=cases,
        seconds=time.monotonic() - started,
        failure=PropertyFailure(kind, message, case, reproduction, shrunk=False, aspect="call"),
    )


# --- running a check -----------------------------------------------------------------


def _implementation(info: ImplInfo, options: CheckOptions, cwd: str) -> Implementation:
    """The ``Implementation`` the kit's runner calls: the claimed contract and the
    declared scope only."""
    grad = options.grad
    narrowed = info.scope  # what a call template leaves out
    scope: dict[str, Any] = {
        "contracts": ("sum",) if grad == "none" else (grad,),
        "differentiable": grad != "none",
        "dims": options.dims if narrowed is None else narrowed.dims,
        "sizes_scope": options.sizes if narrowed is None else narrowed.sizes,
        "returns": options.returns,
        "emulate": options.emulate,
        "takes_grad": info.takes_grad,
        "call": info.call,
    }
    if info.ref is None:
        return Implementation(None, transports=info.transports, name="vargather", **scope)
    return Implementation(
        info.ref,
        convention=info.convention,
        transports=info.transports,
        search_path=(cwd,),
        name=info.ref,
        takes_group=info.takes_group,
        ctor_kwargs=info.ctor_kwargs,
        ctor_takes_dim=info.ctor_takes_dim,
        **scope,
    )


def _scope_text(options: CheckOptions, info: ImplInfo) -> dict[str, str]:
    """The declared scope for the report (every option that limits what is drawn, as
    the call template narrowed it)."""
    scope = {"--grad": options.grad}
    narrowed = info.scope
    if info.call is not None:
        scope["--call"] = info.call
    dims = options.dims if narrowed is None else narrowed.dims
    if dims is not None:
        scope["--dims"] = ",".join(map(str, dims))
    scope["--sizes"] = options.sizes if narrowed is None else narrowed.sizes
    scope["--returns"] = options.returns
    scope["--world-sizes"] = ",".join(map(str, options.world_sizes))
    if options.requires_init:
        scope["--requires-init"] = "yes"
    if options.emulate is not None:
        scope["--emulate"] = options.emulate
    return scope


def _call_reason(row_id: str, reason: str | None, info: ImplInfo) -> str | None:
    """A row the call template put out of scope says so (instead of naming the
    option the template stands for)."""
    if reason is None or info.call is None or info.scope is None:
        return reason
    template = parse_call(info.call)
    left_out = {
        "dims": "dim",
        "subgroup": "group",
        "sizes-list": "sizes",
        "sizes-tensor": "sizes",
    }.get(row_id)
    if left_out is None or template.uses(left_out):
        return reason
    what = {"dim": "dim 0 only", "group": "no subgroup", "sizes": "sizes never passed"}
    return f"--call {info.call} passes no {left_out}: {what[left_out]}"


_PROBE_TOKENS = iter(range(-1, -(1 << 62), -1))


def _probe_returns(
    impl: Implementation, world_sizes: Sequence[int], factory: Callable[[int], RankPool]
) -> str:
    """What the implementation returns beside the tensor on a small 2-rank (or 1-rank)
    gather: ``sizes``, ``layout``, ``none`` (a bare tensor), or ``unknown``."""
    multi = [w for w in world_sizes if w >= 2]
    w = min(multi) if multi else 1
    case = GatherCase(
        shapes=tuple((1 + r % 2, 2) for r in range(w)),
        dim=0,
        dtype="float32",
        contract=impl.contracts[0],
        values="integers",
        requires_grad=False,
    )
    try:
        reports = factory(w).run(run_on_rank, (impl, case, next(_PROBE_TOKENS)))
    except (PoolFailure, RankError):  # the properties will report what went wrong
        return "unknown"
    kinds = {
        r.extra[0]
        for r in reports
        if isinstance(r, RankReport) and r.error is None and r.out is not None
    }
    if len(kinds) != 1:
        return "unknown"
    kind = kinds.pop()
    return str(kind) if kind in ("sizes", "layout", "none") else "unknown"


def _check_json_path(path: str | None) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CheckUsageError(f"--json: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise CheckUsageError(f"--json: {path!r} is a folder, expected a file path")
    if not os.access(folder, os.W_OK):
        raise CheckUsageError(f"--json: cannot write into {folder!r}")


def _preflight(
    info: ImplInfo,
    cwd: str,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    emulate: str | None = None,
) -> None:
    """Import ``MODULE:ATTR`` in every rank of every world before any property runs."""
    if info.ref is None:
        return
    for w in world_sizes:
        try:
            factory(w).run(rank_preflight, (info.ref, (cwd,), emulate))
        except RankError as err:
            first = err.failures[0]
            message = str(first.exception) if first.exception is not None else first.exc_type_name
            raise CheckUsageError(
                f"--impl {message}\n(imported in the parent, but failed in rank {first.rank} of a "
                f"{w}-rank world)"
            ) from None
        except PoolFailure as err:
            raise CheckUsageError(
                f"--impl {info.ref}: a rank of a {w}-rank world died or hung while importing "
                f"it: {type(err).__name__}: {err}"
            ) from None


def _selected(row: Property, options: CheckOptions) -> bool:
    return not options.only or row.id in options.only


def _backend_refusals(
    factory: Callable[[int], RankPool], worlds: Sequence[int], emulate: str | None
) -> tuple[str, ...]:
    """The dtypes the backend's own all_gather refuses (asked of a real world, or of the
    emulation's table under ``--emulate``)."""
    if emulate is not None:
        from vargather.testing.emulate import refused_dtypes

        return refused_dtypes(emulate)
    multi = [w for w in worlds if w >= 2]
    if not multi:
        return ()
    found: list[object] = []
    for _attempt in range(2):  # once more on a fresh world: the rows must not depend on luck
        try:
            found = factory(min(multi)).run(backend_refusals, tuple(DTYPE_NAMES))
            break
        except (PoolFailure, RankError):
            continue
    if not found:
        return ()
    first = found[0]
    assert isinstance(first, tuple)  # what backend_refusals returns
    return tuple(str(d) for d in first)


def run_check(
    options: CheckOptions,
    *,
    progress: ProgressCallback | None = None,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> Report:
    """Run the check ``options`` describe and return its ``Report`` (what the command
    line and the pytest plugin both call; they only build the options and render).

    ``progress(event)`` is told what runs (``ProgressEvent``); ``pool_factory(world_size)``
    gives the rank pool for a world size (default: ``vargather.testing.get_pool`` with
    ``call_timeout=options.timeout``). Raises ``CheckUsageError`` (``OptionError``
    naming the option) for a usage or import error.
    """
    with _hypothesis_storage(options.db):
        return _run_check(options, progress, pool_factory)


def _run_check(
    options: CheckOptions,
    progress_callback: ProgressCallback | None,
    pool_factory: Callable[[int], RankPool] | None,
) -> Report:
    started = time.monotonic()
    _check_json_path(options.json_path)
    cwd = ensure_import_path()
    info = resolve_options_impl(options, cwd)
    impl = _implementation(info, options, cwd)
    transports = info.transports
    world_sizes = tuple(sorted(options.world_sizes))
    if pool_factory is None:
        timeout = options.timeout

        def pool_factory(w: int) -> RankPool:
            # forkserver: a world rebuilt after a crash forks from a server that
            # imported torch once, instead of spawning fresh interpreters.
            return get_pool(w, call_timeout=timeout, start_method="forkserver")

    factory = pool_factory
    selected = [r for r in catalogue(impl) if _selected(r, options)]
    needed = sorted(
        {
            w
            for r in selected
            if r.initialized and r.not_applicable(world_sizes) is None
            for w in r.worlds(world_sizes)
        }
    )
    progress = _Progress(progress_callback, len(selected))
    try:
        if needed:
            progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
        for w in needed:
            factory(w)  # start every world now: they come up in parallel
        _preflight(info, cwd, needed, factory, options.emulate)
        returns = {"tensor": "none", "tuple": "sizes"}.get(options.returns, "unknown")
        if returns == "unknown" and needed and any(r.id == "returned-sizes" for r in selected):
            returns = _probe_returns(impl, needed, factory)
        refused = _backend_refusals(factory, needed, options.emulate) if needed else ()
    except BaseException:
        progress.close()
        raise
    rows = [r for r in catalogue(impl, returns=returns) if _selected(r, options)]
    report = Report(
        impl=info.ref,
        impl_display=info.display,
        convention=info.convention,
        grad=options.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions=_versions(),
        transports=transports,
        refused_transports=dict(info.refused_transports),
        scope=_scope_text(options, info),
        strict=options.strict,
        call=info.call,
    )
    try:
        split = list(split_rows(rows, refused, options.xfails))
        progress.retotal(len(split))  # a refused dtype is a row of its own
        for row_id, row in split:
            progress.phase(f"checking {row_id}")
            reason = _call_reason(row.id, row.not_applicable(world_sizes, returns), info)
            if reason is None and row.id == "uninitialized" and options.requires_init:
                reason = "--requires-init: needs an initialized torch.distributed"
            stopped = options.exitfirst and any(r.failed for r in report.results)
            dtype = row_id.partition(":")[2]
            if stopped:
                result = PropertyResult(
                    row_id, row.title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif reason is not None:
                result = PropertyResult(row_id, row.title, "n/a", reason=reason)
            elif not row.initialized and options.in_flight is None:
                result = _run_isolated(row, options, info)
            else:
                small = dtype in refused
                examples = min(options.max_examples, UNSUPPORTED_EXAMPLES) if small else None
                result = _evaluate(
                    row,
                    options,
                    world_sizes,
                    factory,
                    progress,
                    row_id=row_id,
                    max_examples=examples,
                )
                result = _prefer_nonempty(result, row, options, world_sizes, factory, progress)
            if dtype in refused:
                result = with_unsupported(result, dtype)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report


# --- entry point ---------------------------------------------------------------------


def _versions() -> dict[str, str]:
    versions = {"vargather": vargather.__version__, "torch": str(torch.__version__)}
    try:
        import hypothesis

        versions["hypothesis"] = hypothesis.__version__
    except ImportError:
        pass
    versions["python"] = platform.python_version()
    return versions


# --- the isolated child --------------------------------------------------------------


def child_main(argv: Sequence[str]) -> int:
    """``python -m vargather.testing.engine OPTIONS.json``: run the check the options
    (``CheckOptions.to_json``) describe and write its report to their ``json_path``;
    the exit status is the report's (2: a usage error, printed)."""
    if len(argv) != 1:
        print("usage: python -m vargather.testing.engine OPTIONS.json", file=sys.stderr)
        return EXIT_USAGE
    try:
        with open(argv[0], encoding="utf-8") as f:
            options = CheckOptions.from_json(json.load(f))
        report = run_check(options)
    except CheckUsageError as err:
        print(f"vargather check (child): error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if options.json_path is not None:
        report.write_json(options.json_path)
    return report.exit_status


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))

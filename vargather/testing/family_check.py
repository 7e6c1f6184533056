"""The conformance gate for the family: ``check --op reduce_scatter_v|all_to_all_v|
all_gather_list``.

Where it sits: in the gate's engine in the testing kit, beside ``engine`` (which hands
a run whose ``--op`` is not ``all_gather_v`` to ``run_family_check``) and above
``family_properties`` (the rows). It resolves ``--impl``/``--call`` for the
collective, starts the gloo worlds, runs every row as a seeded Hypothesis test with
the same example and shrink budgets as the all_gather_v gate (counted in examples; a
failure that costs a hung or crashed world stops shrinking at once), and fills the
same ``Report`` the command line renders, the pytest plugin turns into items and
``--json`` writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .calls import parse_call
from .evaluate import FailingBatchError, ShrinkBudgetSpent, seeded_search
from .family import COLLECTIVES, DTYPES, FAMILY_NAMES, FamilyFailure
from .family_properties import FamilyProperty, FamilyTarget, case_dict, family_catalogue
from .family_properties import reproduction as describe_calls
from .options import CheckOptions, OptionError
from .pool import PoolFailure, RankCrashed, RankError, RankPool
from .progress import Progress
from .resolve import load_impl
from .results import PropertyFailure, PropertyResult, Report
from .runner import backend_refusals, rank_preflight
from .verdict import UNSUPPORTED_EXAMPLES, with_unsupported, with_xfail

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["FAMILY_SIGNATURES", "family_target", "run_family_check"]

FAMILY_SIGNATURES = {
    "reduce_scatter_v": "ATTR(x, sizes, dim, *, group, validate, timeout)",
    "all_to_all_v": "ATTR(x, send_sizes, dim, *, recv_sizes, group, validate, timeout)",
    "all_gather_list": "ATTR(x, *, shapes, group, grad, validate, timeout)",
}
"""How a fork is called when no ``--call`` is given: as vargather's function is."""

_LEFT_OUT = {
    "convention": "auto",
    "transports": "auto",
    "returns": "auto",
    "compile": False,
    "requires_init": False,
}
"""The options of the all_gather_v gate that ``--op`` does not take, at their defaults."""


def family_target(options: CheckOptions, cwd: str | None) -> FamilyTarget:
    """The ``FamilyTarget`` ``options`` name; ``OptionError`` for an option the
    collective does not take, a call template that does not parse, or an
    implementation that cannot be imported."""
    op = options.op
    for name, default in _LEFT_OUT.items():
        if getattr(options, name) != default:
            spelled = name.replace("_", "-")
            raise OptionError(spelled, f"does not apply to --op {op} (all_gather_v only)")
    if options.sizes not in ("any", "required", "never") or (
        options.sizes == "never" and op == "reduce_scatter_v"
    ):
        raise OptionError(
            "sizes",
            f"{options.sizes} does not apply to --op {op} (any; required: every size "
            "list always passed; never: the sizes a collective can go without never passed)",
        )
    grads: tuple[str, ...]
    if options.grad == "none":
        grads = ()
    elif op == "all_gather_list":
        grads = (options.grad,)
    else:  # one gradient, the exact adjoint; --grad sum (the default) claims it
        if options.grad != "sum":
            raise OptionError(
                "grad",
                f"{options.grad} does not apply to --op {op}: its gradient is the "
                "adjoint (sum, the default) or none",
            )
        grads = ("sum",)
    if options.impl is None:
        if options.call is not None:
            raise OptionError("call", "needs --impl (vargather's own API is called as documented)")
        return FamilyTarget(
            op, grads=grads, dims=options.dims, sizes=options.sizes, emulate=options.emulate
        )
    ref = options.impl
    if options.call is not None:
        try:
            parse_call(options.call, FAMILY_NAMES[op])
        except ValueError as err:
            raise OptionError("call", f": {err}") from None
    fn = load_impl(ref, cwd)  # CheckUsageError naming the import problem
    if not callable(fn):
        raise OptionError("impl", f"{ref} is not callable")
    module, colon, attr = ref.partition(":")
    impl = f"{module}:{attr}" if colon else f"{module}:{op}"
    return FamilyTarget(
        op,
        impl=impl,
        call=options.call,
        grads=grads,
        dims=options.dims,
        sizes=options.sizes,
        emulate=options.emulate,
    )


@dataclass
class _RowState:
    examples: int = 0
    cases: int = 0
    shrink_runs: int = 0
    failed: bool = False
    stop: bool = False
    last: PropertyFailure | None = None
    memo: dict[str, PropertyFailure | None] = field(default_factory=dict)


def _failure(
    row: FamilyProperty, failures: Sequence[FamilyFailure], calls: Sequence[Any]
) -> PropertyFailure:
    aspect = failures[0].aspect
    kind = "error" if aspect == "raised" else "mismatch"
    lines = [f"[{f.aspect}] ranks {list(f.ranks)}: {f.message}" for f in failures[:4]]
    return PropertyFailure(
        kind,
        "\n".join(lines),
        case_dict(calls[-1]),
        describe_calls(calls, misuse=row.misuse),
        aspect=aspect,
    )


def _world_failure(row: FamilyProperty, err: Exception, calls: Sequence[Any]) -> PropertyFailure:
    if isinstance(err, RankError):
        kind = "error"
    else:
        kind = "crash" if isinstance(err, RankCrashed) else "hang"
    return PropertyFailure(
        kind,
        f"{type(err).__name__}: {err}",
        case_dict(calls[-1]),
        describe_calls(calls, misuse=row.misuse),
        aspect="call",
    )


def evaluate_family_row(
    row: FamilyProperty,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
    max_examples: int | None = None,
) -> PropertyResult:
    """One row as a seeded Hypothesis test of ``max_examples`` (default
    ``options.max_examples``) examples; its first failure shrunk within
    ``options.shrink_budget`` examples (none after a hang or a crash)."""
    started = time.monotonic()
    state = _RowState()
    strategy: SearchStrategy[list[Any]] = row.strategy(world_sizes)

    def run(batch: list[Any]) -> PropertyFailure | None:
        if state.failed:
            if state.stop or state.shrink_runs >= options.shrink_budget:
                raise ShrinkBudgetSpent
            state.shrink_runs += 1
        else:
            state.examples += 1
            state.cases += len(batch)
            progress.note(f"{row.id}: {state.cases} calls")
        try:
            results = row.run(batch, factory)
        except (PoolFailure, RankError) as err:
            state.failed = True
            state.stop = isinstance(err, PoolFailure)  # every attempt would cost a world
            return _world_failure(row, err, batch)
        for i, (case, reports) in enumerate(zip(batch, results, strict=True)):
            failures = row.judge(case, reports)
            if failures:
                state.failed = True
                return _failure(row, failures, batch[: i + 1])
        return None

    def body(batch: list[Any]) -> None:
        key = repr(batch)
        failure = state.memo[key] if key in state.memo else run(batch)
        state.memo[key] = failure
        if failure is not None:
            state.last = failure
            raise FailingBatchError(failure)

    examples = options.max_examples if max_examples is None else max_examples
    failure = seeded_search(strategy, body, options, examples, lambda: state.last)
    if failure is None and state.cases == 0:
        failure = PropertyFailure("checker", "no call ran (every drawn batch was filtered out)")
    return PropertyResult(
        row.id,
        row.title,
        "pass" if failure is None else "fail",
        examples=state.examples,
        cases=state.cases,
        shrink_runs=state.shrink_runs,
        seconds=time.monotonic() - started,
        failure=failure,
    )


def _scope(options: CheckOptions, target: FamilyTarget) -> dict[str, str]:
    scope = {"--op": target.op, "--grad": options.grad}
    if target.call is not None:
        scope["--call"] = target.call
    if target.dims is not None:
        scope["--dims"] = ",".join(map(str, target.dims))
    if target.sizes != "any":
        scope["--sizes"] = target.sizes
    scope["--world-sizes"] = ",".join(map(str, options.world_sizes))
    if target.emulate is not None:
        scope["--emulate"] = target.emulate
    return scope


def _selected(row_id: str, options: CheckOptions) -> bool:
    """Whether ``--only`` selects the row (a ``PROPERTY:DTYPE`` row by its property)."""
    return row_id in options.only or row_id.partition(":")[0] in options.only


def _refused(
    factory: Callable[[int], RankPool], worlds: Sequence[int], emulate: str | None
) -> tuple[str, ...]:
    """The family's dtypes the backend refuses: the emulation's table under
    ``--emulate``, else asked of the smallest multi-rank world (``backend_refusals``)."""
    if emulate is not None:
        from .emulate import refused_dtypes

        return tuple(d for d in DTYPES if d in refused_dtypes(emulate))
    multi = [w for w in worlds if w >= 2]
    if not multi:
        return ()
    try:
        found = factory(min(multi)).run(backend_refusals, DTYPES)
    except (PoolFailure, RankError):
        return ()
    return tuple(str(d) for d in found[0])


def run_family_check(
    options: CheckOptions,
    progress: Progress,
    factory: Callable[[int], RankPool],
    cwd: str,
    versions: dict[str, str],
) -> Report:
    """The family's check run (``engine.run_check`` hands it the runs whose ``--op`` is
    a family collective)."""
    assert options.op in COLLECTIVES
    started = time.monotonic()
    target = family_target(options, cwd)
    world_sizes = tuple(sorted(options.world_sizes))
    rows = [r for r in family_catalogue(target) if not options.only or _selected(r.id, options)]
    progress.retotal(len(rows))
    needed = sorted(
        {w for r in rows if r.not_applicable(world_sizes) is None for w in r.worlds(world_sizes)}
    )
    if needed:
        progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
    for w in needed:
        factory(w)
    if target.impl != "vargather":
        for w in needed:
            try:
                factory(w).run(rank_preflight, (target.impl, (cwd,), target.emulate))
            except (RankError, PoolFailure) as err:
                raise OptionError(
                    "impl", f"{target.impl}: failed to import in a {w}-rank world: {err}"
                ) from None
    refused = _refused(factory, needed, target.emulate)
    if refused:
        target = replace(target, refused=refused)
        rows = [r for r in family_catalogue(target) if not options.only or _selected(r.id, options)]
        progress.retotal(len(rows))
    call = target.call or FAMILY_SIGNATURES[target.op].removeprefix("ATTR")
    report = Report(
        impl=None if target.impl == "vargather" else options.impl,
        impl_display=f"vargather.{target.op}" if target.impl == "vargather" else target.impl,
        convention="vargather",
        grad=options.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions=versions,
        scope=_scope(options, target),
        strict=options.strict,
        call=call,
        op=target.op,
    )
    try:
        for row in rows:
            progress.phase(f"checking {row.id}")
            reason = row.not_applicable(world_sizes)
            if options.exitfirst and any(r.failed for r in report.results):
                result = PropertyResult(
                    row.id, row.title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif reason is not None:
                result = PropertyResult(row.id, row.title, "n/a", reason=reason)
            else:
                _, colon, dtype = row.id.partition(":")
                examples = min(options.max_examples, UNSUPPORTED_EXAMPLES) if colon else None
                result = evaluate_family_row(
                    row, options, world_sizes, factory, progress, max_examples=examples
                )
                if colon:
                    result = with_unsupported(result, dtype)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report

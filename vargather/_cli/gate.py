"""The conformance gate's run: the testing kit's catalogue against an implementation.

Where it sits: the command-line layer (``vargather._cli``), between ``check`` (which
parses the command line into ``CheckOptions``) and the testing kit. It resolves the
implementation under test (through the kit's one importer,
``vargather.testing.runner.load_callable``, and its signature for the call
convention), starts the gloo worlds (``vargather.testing.pool``), and runs every
property of the kit's one catalogue (``vargather.testing.properties``, the exact
properties the test suite and the mutant search run) as a seeded Hypothesis test,
shrinking a failure to a minimal counterexample; the property whose cases run without
torch.distributed runs in a child check process, so a crash or hang there is that
property's failure. The result is a ``report.Report``, built from the judge's
structured failures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
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
from typing import TYPE_CHECKING, Any, Final, TextIO

import torch

import vargather
from vargather import CONTRACTS
from vargather.testing.cases import CONVENTIONS as CALL_CONVENTIONS
from vargather.testing.cases import (
    DTYPE_NAMES,
    RETURN_KINDS,
    SIZES_SCOPES,
    GatherCase,
    Implementation,
    RankReport,
)
from vargather.testing.judge import Failure
from vargather.testing.pool import PoolFailure, RankError, RankPool, get_pool
from vargather.testing.properties import BATCH, Property, catalogue, property_ids
from vargather.testing.runner import (
    ImplementationError,
    backend_refusals,
    describe,
    describe_coalesced,
    gloo_transports,
    load_callable,
    parse_impl_ref,
    prepend_import_paths,
    rank_preflight,
    run_on_rank,
    short_traceback,
)
from vargather.testing.scale import DEFAULT_MAX_PAYLOAD

from . import UsageError
from .report import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Progress,
    PropertyFailure,
    PropertyResult,
    Report,
)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "CheckOptions",
    "CheckUsageError",
    "ImplInfo",
    "load_impl",
    "render_failures",
    "resolve_impl",
    "resolve_options_impl",
    "run_check",
]

CONVENTIONS: Final = ("auto", *CALL_CONVENTIONS)
DEFAULT_WORLD_SIZES: Final = (1, 2, 3, 4)
MAX_WORLD_SIZE: Final = 16
MAX_NDIM: Final = 8
DEFAULT_MAX_EXAMPLES: Final = 60
DEFAULT_SEED: Final = 0
DEFAULT_TIMEOUT: Final = 30.0
DEFAULT_SHRINK_BUDGET: Final = 200
"""Examples a property may run shrinking its first failure (a count, not seconds, so
a loaded machine shrinks to the same counterexample): a crashing implementation costs
a world restart per attempt. A hang is not shrunk (each attempt costs ``--timeout``)."""
CRASH_SHRINK_BUDGET: Final = 4
"""At most this many shrinking examples once a property's failure is a crash (the crash
is already pinned to one case: the one the ranks were running, confirmed alone on a
fresh world)."""
GRADS: Final = (*CONTRACTS, "none")
"""``--grad``: a contract, or ``none`` (not differentiable: gradient rows n/a)."""
EMULATIONS: Final = ("nccl",)


class CheckUsageError(UsageError):
    """The check cannot start: a bad option, an unreadable xfails file, or an
    implementation that does not import. The CLI prints it and exits with status 2."""


# --- options -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    """Everything a check run needs, validated (see ``parse_args``)."""

    impl: str | None = None
    grad: str = "sum"
    dims: tuple[int, ...] | None = None
    requires_init: bool = False
    sizes: str = "any"
    returns: str = "auto"
    emulate: str | None = None
    strict: bool = False
    db: str | None = None
    config_path: str | None = field(default=None, compare=False)
    """The config file whose ``[tool.vargather.check]`` table gave defaults, if any."""
    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
    max_examples: int = DEFAULT_MAX_EXAMPLES
    seed: int = DEFAULT_SEED
    xfails: frozenset[str] = frozenset()
    xfails_path: str | None = None
    json_path: str | None = None
    convention: str = "auto"
    transports: str = "auto"
    exitfirst: bool = False
    timeout: float = DEFAULT_TIMEOUT
    shrink_budget: int = DEFAULT_SHRINK_BUDGET
    progress: bool = True
    only: tuple[str, ...] = ()
    in_flight: str | None = None
    max_payload: int = DEFAULT_MAX_PAYLOAD
    """Bytes a large case's shard may reach on one rank (0: small cases only)."""
    """Set in the child process that runs the in-process property (``uninitialized``): the
    file where it records the batch in flight, for the parent to name a crash or hang."""

    def __post_init__(self) -> None:
        if self.grad not in GRADS:
            raise CheckUsageError(f"--grad must be one of {', '.join(GRADS)}, got {self.grad!r}")
        if self.sizes not in SIZES_SCOPES:
            raise CheckUsageError(
                f"--sizes must be one of {', '.join(SIZES_SCOPES)}, got {self.sizes!r}"
            )
        if self.returns not in RETURN_KINDS:
            raise CheckUsageError(
                f"--returns must be one of {', '.join(RETURN_KINDS)}, got {self.returns!r}"
            )
        if self.emulate is not None and self.emulate not in EMULATIONS:
            raise CheckUsageError(
                f"--emulate must be one of {', '.join(EMULATIONS)}, got {self.emulate!r}"
            )
        dims_ok = self.dims is None or (
            bool(self.dims) and all(type(d) is int and -MAX_NDIM <= d < MAX_NDIM for d in self.dims)
        )
        if not dims_ok:
            raise CheckUsageError(
                f"--dims: expected integers in [-{MAX_NDIM}, {MAX_NDIM}), got {self.dims!r}"
            )
        if not self.world_sizes:
            raise CheckUsageError("--world-sizes: expected at least one world size")
        for w in self.world_sizes:
            if type(w) is not int or not 1 <= w <= MAX_WORLD_SIZE:
                raise CheckUsageError(
                    f"--world-sizes: each world size must be an integer in [1, {MAX_WORLD_SIZE}], got {w!r}"
                )
        if type(self.max_examples) is not int or self.max_examples < 1:
            raise CheckUsageError(
                f"--max-examples must be a positive integer, got {self.max_examples!r}"
            )
        if type(self.seed) is not int or self.seed < 0:
            raise CheckUsageError(f"--seed must be a non-negative integer, got {self.seed!r}")
        if self.convention not in CONVENTIONS:
            raise CheckUsageError(
                f"--convention must be one of {', '.join(CONVENTIONS)}, got {self.convention!r}"
            )
        if type(self.shrink_budget) is not int or self.shrink_budget < 0:
            raise CheckUsageError(
                f"--shrink-budget must be a number of examples >= 0, got {self.shrink_budget!r}"
            )
        if type(self.max_payload) is not int or self.max_payload < 0:
            raise CheckUsageError(
                f"--max-payload must be a number of bytes >= 0, got {self.max_payload!r}"
            )
        if not (self.timeout > 0):
            raise CheckUsageError(
                f"--timeout must be a positive number of seconds, got {self.timeout!r}"
            )
        known = property_ids()
        xfail_rows = {x.partition(":")[0] for x in self.xfails}
        for name, ids in (("--only", set(self.only)), ("xfails", xfail_rows)):
            unknown = sorted(set(ids) - set(known))
            if unknown:
                raise CheckUsageError(
                    f"{name}: unknown property id(s) {', '.join(unknown)}; known: "
                    + ", ".join(known)
                )


# --- the implementation under test ---------------------------------------------------


@dataclass(frozen=True)
class ImplInfo:
    """What ``--impl`` names, as resolved in the parent.

    ``ref`` is ``None`` for vargather's own ``all_gather_v``. ``convention`` is
    ``"seed"`` (``ATTR(t, dim, sizes)``) or ``"vargather"``
    (``ATTR(x, dim, *, sizes=None, group=None, grad=...)``). ``transports``: the
    ``transport=`` names it is called with (``None``: it is not passed);
    ``refused_transports``: vargather's names left out, with the reason.
    ``takes_grad``: whether ``grad=`` is passed; ``ctor_kwargs``/``ctor_takes_dim``:
    ``MODULE:ATTR(key=literal, ...)``, constructed per call (with ``dim=`` too when
    ATTR takes it and the reference does not set it).
    """

    ref: str | None
    display: str
    convention: str
    takes_group: bool
    transports: tuple[str, ...] | None = None
    refused_transports: tuple[tuple[str, str], ...] = ()
    takes_grad: bool = True
    ctor_kwargs: tuple[tuple[str, object], ...] | None = None
    ctor_takes_dim: bool = False


def ensure_import_path(cwd: str | None = None) -> str:
    """Put the current directory first on ``sys.path`` (``python -m`` does; an embedding
    caller may not), so ``MODULE`` resolves as the docs say. Returns the directory."""
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    prepend_import_paths([here])
    return here


def load_impl(ref: str, cwd: str | None = None) -> Callable[..., object]:
    """``MODULE:ATTR`` imported by the kit's importer, from ``cwd`` (default: the current
    directory) and ``PYTHONPATH``; ``CheckUsageError`` naming ``--impl`` otherwise."""
    here = ensure_import_path(cwd)
    try:
        return load_callable(ref, (here,))
    except ImplementationError as err:
        raise CheckUsageError(f"--impl {err}") from None


def _signature(fn: object) -> inspect.Signature | None:
    """``fn``'s call signature (an ``nn.Module``'s ``forward``); ``None`` when unknown or
    when it takes anything (``*args, **kwargs``, as ``Function.apply`` does)."""
    target = fn
    if isinstance(fn, torch.nn.Module):
        target = fn.forward
    try:
        sig = inspect.signature(target)  # type: ignore[arg-type]  # any callable
    except (TypeError, ValueError):
        return None
    kinds = {p.kind for p in sig.parameters.values()}
    if inspect.Parameter.VAR_POSITIONAL in kinds and inspect.Parameter.VAR_KEYWORD in kinds:
        return None
    return sig


def _takes(fn: object, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (by name, or through ``**kwargs``)."""
    sig = _signature(fn)
    if sig is None:
        return False
    params = sig.parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _is_function_apply(fn: object) -> bool:
    """``SomeFunction.apply`` of a ``torch.autograd.Function`` (the seed's
    ``all_gather = AllGather.apply``), whose signature is ``(*args, **kwargs)``."""
    owner = getattr(fn, "__self__", None)
    return (
        getattr(fn, "__name__", None) == "apply"
        and isinstance(owner, type)
        and issubclass(owner, torch.autograd.Function)
    )


def _construct(
    ref: str, fn: Callable[..., object], ctor: tuple[tuple[str, object], ...]
) -> tuple[object, bool]:
    """Build ``MODULE:ATTR(key=literal, ...)`` once in the parent (dim=0 where ATTR takes
    ``dim`` and the reference does not set it), to read the configured object's call
    signature; returns it and whether ``dim`` goes to the constructor."""
    kwargs = dict(ctor)
    takes_dim = "dim" not in kwargs and _takes(fn, "dim")
    if takes_dim:
        kwargs["dim"] = 0
    try:
        obj = fn(**kwargs)
    except Exception as err:
        raise CheckUsageError(
            f"--impl {ref}: constructing it failed: {type(err).__name__}: {err}"
        ) from None
    if not callable(obj):
        raise CheckUsageError(
            f"--impl {ref}: constructing it gave a {type(obj).__name__}, not a callable"
        )
    return obj, takes_dim


def _check_fits(
    ref: str,
    target: object,
    convention: str,
    *,
    dim_in_call: bool,
    takes_grad: bool,
    sizes: str,
    guessed: bool,
) -> None:
    """``CheckUsageError`` (exit 2, before any world starts) when the call the gate
    would make does not fit ``target``'s signature, saying which options to pass."""
    sig = _signature(target)
    if sig is None:
        return
    x = torch.zeros(1)
    head: tuple[object, ...] = (x, 0) if dim_in_call else (x,)
    how = "guessed (--convention auto)" if guessed else f"--convention {convention}"
    attempts: list[tuple[tuple[object, ...], dict[str, object]]]
    if convention == "seed":
        attempts = [((*head, None), {})]
        shape = "ATTR(t, dim, sizes)" if dim_in_call else "ATTR(t, sizes)"
    else:
        kw: dict[str, object] = {"grad": "sum"} if takes_grad else {}
        if sizes != "never":
            kw["sizes"] = [1]
        attempts = [(head, kw)]
        shape = "ATTR(x, dim, *, " if dim_in_call else "ATTR(x, *, "
        shape += ", ".join([*kw, "group", "transport"]) + ")"
    for args, kwargs in attempts:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as err:
            hints: list[str] = []
            params = sig.parameters
            if convention == "vargather" and sizes != "never" and not _takes(target, "sizes"):
                hints.append("--sizes never (ATTR takes no sizes=)")
            if convention == "seed" and ("grad" in params or "group" in params):
                hints.append("--convention vargather")
            if convention == "vargather" and not ("grad" in params or "group" in params):
                hints.append("--convention seed")
            if dim_in_call and "dim" not in params and len(params) <= 2:
                hints.append(
                    "MODULE:ATTR(dim=...) if ATTR is a class configured with dim, with "
                    "--dims naming the dims it supports"
                )
            advice = "; pass " + " or ".join(hints) if hints else ""
            raise CheckUsageError(
                f"--impl {ref}: the call convention {how} calls {shape}, which does not fit "
                f"its signature {sig}: {err}{advice}"
            ) from None


def resolve_impl(
    ref: str | None,
    convention: str = "auto",
    cwd: str | None = None,
    transports: str = "auto",
    *,
    sizes: str = "any",
    grad: str = "sum",
) -> ImplInfo:
    """Check ``--impl`` in the parent (import, attribute, callable, the call's fit to
    its signature) and pick how to call it.

    ``convention="auto"``: the seed's ``(t, dim, sizes)`` for a
    ``torch.autograd.Function``'s ``apply``; vargather's when ATTR accepts ``grad=`` or
    ``group=`` (by name or through ``**kwargs``); the seed's otherwise. ``grad=`` is
    passed only to an ATTR that takes it (and never under ``--grad none``).
    ``transports="auto"``: a vargather-style ATTR that accepts ``transport=`` is called
    with each of vargather's transports that run on gloo; ``"none"``: never passed;
    else a comma-separated list of names.
    """
    usable, refused = gloo_transports()
    if ref is None:
        if convention == "seed":
            raise CheckUsageError(
                "--convention seed needs --impl (vargather's own API is vargather-style)"
            )
        chosen = usable if transports == "auto" else _transport_list(transports, "vargather")
        if chosen is None:
            raise CheckUsageError("--transports none needs --impl (vargather takes transport=)")
        return ImplInfo(
            None,
            "vargather.all_gather_v",
            "vargather",
            True,
            chosen,
            tuple(refused.items()),
            takes_grad=grad != "none",
        )
    try:
        _, ctor = parse_impl_ref(ref)
    except ImplementationError as err:
        raise CheckUsageError(f"--impl {err}") from None
    fn = load_impl(ref, cwd)
    target: object = fn
    ctor_takes_dim = False
    if ctor is not None:
        target, ctor_takes_dim = _construct(ref, fn, ctor)
    guessed = convention == "auto"
    if guessed:
        vargather_style = not _is_function_apply(target) and (
            _takes(target, "grad") or _takes(target, "group")
        )
        convention = "vargather" if vargather_style else "seed"
    takes_group = convention == "vargather" and _takes(target, "group")
    takes_grad = convention == "vargather" and grad != "none" and _takes(target, "grad")
    _check_fits(
        ref,
        target,
        convention,
        dim_in_call=not ctor_takes_dim,
        takes_grad=takes_grad,
        sizes=sizes,
        guessed=guessed,
    )
    if transports == "auto":
        takes = convention == "vargather" and _takes(target, "transport")
        chosen = usable if takes else None
        left_out = tuple(refused.items()) if takes else ()
    else:
        chosen, left_out = _transport_list(transports, convention), ()
    return ImplInfo(
        ref,
        ref,
        convention,
        takes_group,
        chosen,
        left_out,
        takes_grad=takes_grad,
        ctor_kwargs=ctor,
        ctor_takes_dim=ctor_takes_dim,
    )


def resolve_options_impl(options: CheckOptions, cwd: str | None) -> ImplInfo:
    """``resolve_impl`` for the implementation, convention, transports and scope that
    ``options`` name (the command line's and the pytest plugin's one call)."""
    return resolve_impl(
        options.impl,
        options.convention,
        cwd,
        options.transports,
        sizes=options.sizes,
        grad=options.grad,
    )


def _transport_list(text: str, convention: str) -> tuple[str, ...] | None:
    if text.strip() == "none":
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise CheckUsageError(f"--transports: expected 'auto', 'none' or names, got {text!r}")
    if convention == "seed":
        raise CheckUsageError(
            "--transports: the seed's convention ATTR(t, dim, sizes) takes no transport"
        )
    return names


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


@dataclass
class _PropertyState:
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
    progress: Progress,
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
        kind = state.last.kind if state.last is not None else None
        budget = options.shrink_budget
        if kind == "crash":  # every crashing attempt costs a world restart
            budget = min(budget, CRASH_SHRINK_BUDGET)
        return kind == "hang" or state.shrink_runs >= budget

    def run(batch: list[GatherCase]) -> PropertyFailure | None:
        if state.failed_at is not None:
            if out_of_budget():
                # End the search: past the budget Hypothesis would propose a thousand
                # more shrinks, each drawing a whole batch to be turned away here.
                raise _ShrinkBudgetSpent
            state.shrink_runs += 1
        with _in_flight(options.in_flight, batch, impl):
            results = prop.run(batch, pool_factory=factory)
        if state.failed_at is None:
            state.examples += 1
            state.cases += sum(1 for v, _ in results if not v.not_run)
            progress.note(f"{prop.id}: {state.cases} cases")
        for index, (verdict, failures) in enumerate(results):
            if failures:
                if state.failed_at is None:
                    state.failed_at = time.monotonic()
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
        # A property whose examples cost seconds each (compiling) caps its own count.
        max_examples=prop.max_examples(max_examples or options.max_examples),
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
    progress: Progress,
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


def _child_command(
    row: Property, options: CheckOptions, info: ImplInfo, report: str, in_flight: str
) -> list[str]:
    command = [sys.executable, "-m", "vargather", "check", "--only", row.id]
    if info.ref is not None:
        command += ["--impl", info.ref, "--convention", info.convention]
    if info.transports is not None:
        command += ["--transports", ",".join(info.transports)]
    elif info.ref is not None:
        command += ["--transports", "none"]
    command += ["--no-config", "--sizes", options.sizes, "--returns", options.returns]
    if options.dims is not None:
        command += ["--dims", ",".join(map(str, options.dims))]
    if options.emulate is not None:
        command += ["--emulate", options.emulate]
    command += [
        "--grad",
        options.grad,
        "--world-sizes",
        ",".join(str(w) for w in options.world_sizes),
        "--max-examples",
        str(options.max_examples),
        "--seed",
        str(options.seed),
        "--timeout",
        str(options.timeout),
        "--shrink-budget",
        str(options.shrink_budget),
        "--max-payload",
        str(options.max_payload),
        "--json",
        report,
        "--no-progress",
        "--in-flight",
        in_flight,
    ]
    return command


def _run_isolated(row: Property, options: CheckOptions, info: ImplInfo) -> PropertyResult:
    """Run a row whose cases execute in the checking process itself (torch.distributed
    not initialized) in a child check process instead, so a crash or a hang of the
    implementation is that row's failure, not the checker's."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vargather-check-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        in_flight = os.path.join(tmp, "in-flight.json")
        command = _child_command(row, options, info, report_path, in_flight)
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
    scope: dict[str, Any] = {
        "contracts": ("sum",) if grad == "none" else (grad,),
        "differentiable": grad != "none",
        "dims": options.dims,
        "sizes_scope": options.sizes,
        "returns": options.returns,
        "emulate": options.emulate,
        "takes_grad": info.takes_grad,
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


def _scope_text(options: CheckOptions) -> dict[str, str]:
    """The declared scope for the report (every option that limits what is drawn)."""
    scope = {"--grad": options.grad}
    if options.dims is not None:
        scope["--dims"] = ",".join(map(str, options.dims))
    scope["--sizes"] = options.sizes
    scope["--returns"] = options.returns
    scope["--world-sizes"] = ",".join(map(str, options.world_sizes))
    if options.requires_init:
        scope["--requires-init"] = "yes"
    if options.emulate is not None:
        scope["--emulate"] = options.emulate
    return scope


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


def _with_xfail(result: PropertyResult, xfails: frozenset[str]) -> PropertyResult:
    """Apply the xfails file: ``PROPERTY`` covers the row and its ``PROPERTY:DTYPE``
    rows; ``PROPERTY:DTYPE`` that one row only."""
    listed = result.id in xfails or result.id.partition(":")[0] in xfails
    if not listed or result.status not in ("pass", "fail"):
        return result
    if result.status == "fail":
        return dataclasses.replace(result, status="xfail")
    return dataclasses.replace(
        result, status="xpass", reason="listed in the xfails file, but it held"
    )


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
    try:
        found = factory(min(multi)).run(backend_refusals, tuple(DTYPE_NAMES))
    except (PoolFailure, RankError):
        return ()
    first = found[0]
    assert isinstance(first, tuple)  # what backend_refusals returns
    return tuple(str(d) for d in first)


def _split_rows(
    rows: Sequence[Property], refused: Sequence[str], xfails: frozenset[str] = frozenset()
) -> list[tuple[str, Property]]:
    """Each row as (id, property): a row whose dtypes the backend refuses (or that the
    xfails file names as ``PROPERTY:DTYPE``) runs without them, and each such dtype runs
    as its own row ``PROPERTY:DTYPE``."""
    out: list[tuple[str, Property]] = []
    for row in rows:
        raw = row.kwargs.get("dtypes")
        dtypes: tuple[str, ...] = tuple(raw) if isinstance(raw, tuple) else ()
        bad = [d for d in dtypes if d in refused or f"{row.id}:{d}" in xfails]
        if not bad or row.out_of_scope is not None:
            out.append((row.id, row))
            continue
        rest = tuple(d for d in dtypes if d not in refused)
        if rest:
            out.append((row.id, dataclasses.replace(row, kwargs={**row.kwargs, "dtypes": rest})))
        for d in bad:
            one = dataclasses.replace(
                row, title=f"{row.title} [{d} only]", kwargs={**row.kwargs, "dtypes": (d,)}
            )
            out.append((f"{row.id}:{d}", one))
    return out


_BACKEND_MARKS: Final = ("gloo", "Gloo", "NCCL", "nccl", "distributed_c10d", "Unsupported")
UNSUPPORTED_EXAMPLES: Final = 10
"""Examples of a ``PROPERTY:DTYPE`` row for a dtype the backend refuses."""


def _unsupported(result: PropertyResult, dtype: str) -> PropertyResult:
    """A ``PROPERTY:DTYPE`` row that failed only because the backend refused the dtype
    (the implementation raised from the backend) becomes ``unsupported``."""
    f = result.failure
    if result.status != "fail" or f is None or f.kind != "error" or f.aspect != "call":
        return result
    if not any(mark in f.message for mark in _BACKEND_MARKS):
        return result
    return dataclasses.replace(
        result,
        status="unsupported",
        reason=f"the backend refuses {dtype}; the implementation hands it to the backend",
    )


def run_check(
    options: CheckOptions,
    *,
    progress_stream: TextIO | None = None,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> Report:
    """Run the check ``options`` describe and return its ``Report`` (the CLI's code path;
    ``main`` only adds argument parsing and printing).

    ``pool_factory(world_size)`` gives the rank pool for a world size (default:
    ``vargather.testing.get_pool`` with ``call_timeout=options.timeout``).
    Raises ``CheckUsageError`` for a usage or import error.
    """
    with _hypothesis_storage(options.db):
        return _run_check(options, progress_stream, pool_factory)


def _run_check(
    options: CheckOptions,
    progress_stream: TextIO | None,
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
    progress = Progress(progress_stream, len(selected), title="vargather check", unit="properties")
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
        scope=_scope_text(options),
        strict=options.strict,
    )
    try:
        split = list(_split_rows(rows, refused, options.xfails))
        progress.retotal(len(split))  # a refused dtype is a row of its own
        for row_id, row in split:
            progress.phase(f"checking {row_id}")
            reason = row.not_applicable(world_sizes, returns)
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
                result = _unsupported(result, dtype)
            result = _with_xfail(result, options.xfails)
            report.results.append(result)
            progress.advance(result.progress_line(), alert=result.failed)
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

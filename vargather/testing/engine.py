"""The conformance gate's engine: ``run_check``, the catalogue against one implementation.

Where it sits: at the top of the gate's engine in the testing kit, above ``options``
(what to run), ``resolve`` (what ``impl`` names and how to call it), ``evaluate`` (one
property's Hypothesis run), ``isolated`` (the row run in a child process), ``verdict``
(the status rules), ``progress`` and ``results`` (the report). Both surfaces call
``run_check``: the command line (``vargather._cli.check``) and the pytest plugin
(``vargather.testing.plugin``); ``child_main`` is the isolated row's child process.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

import torch

import vargather

from .calls import parse_call
from .catalogues import catalogue_of
from .collectives import DEFAULT
from .evaluate import evaluate_row, hypothesis_storage, prefer_nonempty
from .isolated import IsolatedRun
from .options import CheckOptions, CheckUsageError
from .pool import RankPool, get_pool
from .pool_types import PoolFailure, RankError
from .progress import Progress, ProgressCallback
from .properties import BATCH, Property
from .rank_runner import rank_preflight
from .resolve import ImplInfo, ensure_import_path
from .results import EXIT_USAGE, PropertyResult, Report
from .runner import backend_refusals
from .targets import apply_target, preload_target, program_runner, target_refusals
from .values import DTYPE_NAMES
from .verdict import UNSUPPORTED_EXAMPLES, scope_hints, split_rows, with_unsupported, with_xfail
from .world import preload


def _scope_text(options: CheckOptions, info: ImplInfo) -> dict[str, str]:
    """The declared scope for the report (every option that limits what is drawn, as
    the call template narrowed it)."""
    scope = {} if options.op == DEFAULT else {"--op": options.op}  # set: said, as --dims
    scope["--grad"] = options.grad
    narrowed = info.scope
    if info.call is not None:
        scope["--call"] = info.call
    dims = options.dims if narrowed is None else narrowed.dims
    if dims is not None:
        scope["--dims"] = ",".join(map(str, dims))
    scope["--sizes"] = options.sizes if narrowed is None else narrowed.sizes
    scope["--returns"] = options.returns
    scope["--world-sizes"] = ",".join(map(str, options.world_sizes))
    flags = ("requires_init", "contiguous_only", "compile", "emulate", "equal_shapes")
    for name in (*flags, "nan_payloads"):
        value = getattr(options, name)  # a flag set, or an option given (not its default)
        if value not in (False, None, "exact"):
            scope["--" + name.replace("_", "-")] = "yes" if value is True else value
    return scope


def _rows_in_scope(rows: Sequence[Property], options: CheckOptions) -> list[Property]:
    """``rows`` that ``--only`` selects, within the scope that no catalogue's own rows
    know: ``--equal-shapes`` (all_gather_v's only; the family's collectives refuse it)."""
    rows = [r for r in rows if not options.only or r.id in options.only]
    if not options.equal_shapes:
        return rows
    from .catalogues.all_gather_v import equal_shapes_only

    return [equal_shapes_only(r) for r in rows]


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


COMPILED_PRELOAD: Final = ("torch._dynamo", "torch._inductor.compile_fx")
"""What a rank imports on its first compiled case (seconds of CPU per rank on 2 cores)."""


def _isolated(row: Property, options: CheckOptions) -> bool:
    """Whether ``row`` runs in a child check process (``isolated``): its cases run
    without torch.distributed, and this is not that child already."""
    if row.initialized or options.in_flight is not None:
        return False
    return not (row.id == "uninitialized" and options.requires_init)


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
    for _attempt in range(2):  # once more on a fresh world: the rows must not depend on luck
        try:
            found = factory(min(multi)).run(backend_refusals, tuple(DTYPE_NAMES))
        except (PoolFailure, RankError):
            continue
        return tuple(str(d) for d in found[0]) if found else ()
    return ()


def run_check(
    options: CheckOptions,
    *,
    progress: ProgressCallback | None = None,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> Report:
    """Run the check ``options`` describe (a built-in ``--target`` fills them first) and
    return its ``Report``.

    ``progress(event)`` is told what runs (``ProgressEvent``); ``pool_factory(world_size)``
    gives the rank pool for a world size (default: ``vargather.testing.get_pool`` with
    ``call_timeout=options.timeout``). Raises ``CheckUsageError`` (``OptionError``
    naming the option) for a usage or import error.
    """
    options = apply_target(options)  # OptionError for an unknown or unavailable target
    preload_target(options)
    with hypothesis_storage(options.db):
        report = _run_check(options, progress, pool_factory)
    if options.target is not None:
        report.scope = {"--target": options.target, **report.scope}
    return report


def _run_check(
    options: CheckOptions,
    progress_callback: ProgressCallback | None,
    pool_factory: Callable[[int], RankPool] | None,
) -> Report:
    started = time.monotonic()
    _check_json_path(options.json_path)
    cwd = ensure_import_path()
    # forkserver: a world rebuilt after a crash forks from a server that imported
    # torch once, instead of spawning fresh interpreters.
    factory = pool_factory or functools.partial(
        get_pool, call_timeout=options.timeout, start_method="forkserver"
    )
    program = program_runner(options.target)
    if program is not None:  # a target with programs and an oracle of its own
        report: Report = program(options, Progress(progress_callback, 0), factory, _versions())
        return report
    collective = catalogue_of(options.op)
    info = collective.resolve(options, cwd)
    impl = collective.implementation(info, options, cwd)
    world_sizes = tuple(sorted(options.world_sizes))
    selected = _rows_in_scope(collective.rows(impl), options)
    applies = [r for r in selected if r.not_applicable(world_sizes) is None]
    on_worlds = [r for r in applies if r.initialized]
    needed = sorted({w for r in on_worlds for w in r.worlds(world_sizes)})
    progress = Progress(progress_callback, len(selected))
    if any(r.compiled for r in on_worlds):
        # The ranks' compiled steps import dynamo and inductor on first use, seconds of
        # CPU in every rank: the forkserver the worlds fork from imports them once.
        preload(COMPILED_PRELOAD)
    early: dict[str, IsolatedRun] = {}
    for r in applies:
        if _isolated(r, options):
            # Started now, so that the child's interpreter start and cases overlap
            # with the worlds' start and the rows run on them (waited for in turn).
            early[r.id] = IsolatedRun(r, options, info)
    try:
        if needed:
            progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
        for w in needed:
            factory(w)  # start every world now: they come up in parallel
        _preflight(info, cwd, needed, factory, options.emulate)
        returns = {"tensor": "none", "tuple": "sizes"}.get(options.returns, "unknown")
        if returns == "unknown" and needed and any(r.id == "returned-sizes" for r in selected):
            returns = collective.probe_returns(impl, needed, factory)
        refused = _backend_refusals(factory, needed, options.emulate) if needed else ()
        refused = (*refused, *(d for d in target_refusals(options) if d not in refused))
        rows = _rows_in_scope(collective.rows(impl, returns), options)
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
            transports=info.transports,
            refused_transports=dict(info.refused_transports),
            scope=_scope_text(options, info),
            strict=options.strict,
            call=info.call if info.call is not None else collective.default_call,
            op=options.op,
            batch=max((r.batch or BATCH for r in rows), default=BATCH),
        )
        split = list(split_rows(rows, refused, options.xfails))
        progress.retotal(len(split))  # a refused dtype is a row of its own
        for row_id, row in split:
            progress.phase(f"checking {row_id}")
            reason = _call_reason(row.id, row.not_applicable(world_sizes, returns), info)
            if reason is None and row.id == "uninitialized" and options.requires_init:
                reason = "--requires-init: needs an initialized torch.distributed"
            if reason is None and row.id == "non-contiguous" and options.contiguous_only:
                reason = "--contiguous-only: takes contiguous tensors only"
            status = "n/a"
            if options.exitfirst and any(r.failed for r in report.results):
                status, reason = "skipped", "--exitfirst: an earlier property failed"
            dtype = row_id.partition(":")[2]
            if reason is not None:
                result = PropertyResult(row_id, row.title, status, reason=reason)
            elif _isolated(row, options):
                child = early.pop(row.id) if row.id in early else IsolatedRun(row, options, info)
                result = child.result()
            else:
                small = dtype in refused
                examples = min(options.max_examples, UNSUPPORTED_EXAMPLES) if small else None
                result = evaluate_row(
                    row,
                    options,
                    world_sizes,
                    factory,
                    progress,
                    row_id=row_id,
                    max_examples=examples,
                )
                result = prefer_nonempty(result, row, options, world_sizes, factory, progress)
            if dtype in refused:
                result = with_unsupported(result, dtype)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
        for child in early.values():  # n/a or skipped after all
            child.cancel()
    report.results = scope_hints(report.results)
    report.seconds = time.monotonic() - started
    return report


def _versions() -> dict[str, str]:
    import hypothesis  # the kit's requirement (vargather.testing says so on import)

    return {
        "vargather": vargather.__version__,
        "torch": str(torch.__version__),
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }


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

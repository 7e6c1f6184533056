"""The pytest plugin's machinery: the conformance properties as test items, the world fixture.

Where it sits: at the top of the testing kit, beside the command line: both run the
gate's engine (``engine.run_check``) and neither imports the other. The plugin itself,
``_vargather_pytestplugin``, imports this module only when a session asks for
vargather. A property is an item ``vargather::ID``: its failure the check's report, n/a
a skip, an xfails entry an xfail.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest

from vargather import VarGatherError

from . import schema
from .cases import VARGATHER
from .catalogues import catalogue
from .engine import run_check
from .options import CheckOptions, CheckUsageError, surface_options
from .pool import RankPool, get_pool
from .pool_types import PoolFailure, RankError
from .rank_side import RankContext
from .resolve import resolve_options_impl
from .results import PropertyResult, Report
from .targets import apply_target, program_rows

P = TypeVar("P")
R = TypeVar("R")


def configure(values: Mapping[str, object]) -> CheckOptions:
    """The check's options from the plugin's values (option name -> the text given,
    ``True`` for a flag; ``config``/``no-config`` say where the config table is),
    validated by the options model, with the implementation imported once here;
    ``pytest.UsageError`` naming the plugin's option otherwise."""
    try:
        config = None if values.get("config") is None else str(values["config"])
        no_config = bool(values.get("no-config"))
        options = surface_options(schema.PLUGIN, values, config, no_config, progress=False)
        options = apply_target(options)
        if program_rows(options.target) is not None:
            # rows of its own, nothing to import or resolve
            return options
        info = resolve_options_impl(options, None)
    except schema.AnyOptionError as err:  # the schema's and the options model's
        message = _plugin_spelling(err.spelled("--vargather-" + err.option))
        raise pytest.UsageError(f"vargather: {message}") from None
    except CheckUsageError as err:
        raise pytest.UsageError(f"vargather: {_plugin_spelling(str(err))}") from None
    # Resolved once: every item (and every xdist worker) calls ATTR the same way.
    if info.call is not None:
        return options
    return dataclasses.replace(options, convention=info.convention)


def _plugin_spelling(message: str) -> str:
    """The check's options a message names (``pass --sizes never``) as the plugin's
    (``--grad`` is ``--vargather-grad``); another tool's (pip's ``--no-build-isolation``)
    stays as it is."""
    names = {option.name for option in schema.on(schema.PLUGIN)}

    def spell(m: re.Match[str]) -> str:
        return f"--vargather-{m[1]}" if m[1] in names else m[0]

    return re.sub(r"(?<![\w-])--([a-z][a-z-]*)", spell, message)


def header_lines(options: CheckOptions) -> list[str]:
    """The lines the plugin adds to pytest's header: what is checked, and how."""
    sizes = ",".join(str(w) for w in options.world_sizes)
    how = f"called as ATTR{options.call}" if options.call else f"{options.convention} convention"
    if options.op != "all_gather_v":
        how = f"--op {options.op}, " + (how if options.call else "vargather's signature")
    return [
        f"vargather properties: {options.impl or 'vargather.' + options.op} "
        f"({how}), claimed gradient contract: {options.grad}",
        f"vargather properties: world sizes {sizes}; up to {options.max_examples} examples "
        f"per property; seed {options.seed}"
        + (f"; xfails from {options.xfails_path}" if options.xfails_path else ""),
    ]


class PropertyFailedError(VarGatherError, AssertionError):
    """A property failed: its text is the check's report of the failure."""


class PropertyItem(pytest.Item):
    """One property of the catalogue, run by the conformance gate on its own."""

    def __init__(self, *, options: CheckOptions, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options
        self.title = title

    def runtest(self) -> None:
        options = dataclasses.replace(self.options, only=(self.name,))
        try:
            report = run_check(options)
        except CheckUsageError as err:
            # Validated and imported at configure time already: what is left is the
            # ranks failing to import MODULE:ATTR (a rank died or hung doing it).
            raise PropertyFailedError(f"vargather: {err}") from None
        # A property is one row, or several (a row per dtype the backend refuses).
        for row in report.results:
            self.user_properties.append(("vargather", row.to_json()))
        failed = [r for r in report.results if r.failed]
        held = [r for r in report.results if r.status == "pass"]
        result = failed[0] if failed else held[0] if held else report.results[0]
        _outcome(report, result)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        if isinstance(excinfo.value, PropertyFailedError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.nodeid


def _outcome(report: Report, result: PropertyResult) -> None:
    """Pass, or the pytest outcome of ``result``: the check's own failure text."""
    if result.status == "pass":
        return
    if result.status == "xfail":
        kind = result.failure.kind if result.failure is not None else "fail"
        pytest.xfail(f"listed in {report.xfails_path}; failed ({kind})")
    if not result.failed:  # n/a: the property does not apply (or is out of scope)
        label = "not applicable" if result.status == "n/a" else result.status
        pytest.skip(f"{label}: {result.reason}")
    lines = report.failure_lines()
    # pytest heads the failure with the item's name already: the check's
    # "=== ID: FAILED (KIND) ===" line becomes the KIND in front of the message.
    heading = next((i for i, line in enumerate(lines) if line.startswith("===")), None)
    if heading is not None and result.failure is not None and heading + 1 < len(lines):
        lines[heading + 1] = f"{result.failure.kind}: {lines[heading + 1]}"
        del lines[: heading + 1]
    text = "\n".join(lines).strip("\n")
    raise PropertyFailedError(text or f"{result.id}: {result.status}")


class PropertyCollector(pytest.Collector):
    """The parent of the property items: ``vargather``."""

    def __init__(self, *, options: CheckOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.options = options

    def collect(self) -> list[pytest.Item]:
        rows = program_rows(self.options.target)  # a target's programs, if it runs its own
        if rows is None:
            impl = dataclasses.replace(VARGATHER, op=self.options.op)
            rows = [(row.id, row.title) for row in catalogue(impl)]
        return [
            PropertyItem.from_parent(self, name=row_id, title=title, options=self.options)
            for row_id, title in rows
        ]


def property_items(session: pytest.Session, options: CheckOptions) -> list[pytest.Item]:
    """The property items of this session, collected as pytest collects any node (so
    they count as collected, and every xdist worker collects the same ids in the same
    order: the catalogue's)."""
    collector = PropertyCollector.from_parent(
        session, name="vargather", nodeid="vargather", path=session.config.rootpath, options=options
    )
    return list(session.genitems(collector))


class World:
    """A persistent gloo world of ``world_size`` ranks for a test (``vargather_world(W)``)."""

    def __init__(self, pool: RankPool) -> None:
        self.pool = pool

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    def __repr__(self) -> str:
        return f"vargather_world({self.world_size})"

    def run(self, fn: Callable[[RankContext, P], R], payload: P) -> list[R]:
        """``fn(ctx, payload)`` on every rank (``fn`` module-level, ``payload`` and the
        results picklable); the results in rank order. A rank's exception, a rank that
        dies or hangs fails the test with a message naming the rank (and quoting its
        traceback); after a crash or a hang the next call gets a fresh world."""
        return self._guarded(fn, lambda: self.pool.run(fn, payload))

    def run_many(self, fn: Callable[[RankContext, P], R], payloads: Sequence[P]) -> list[list[R]]:
        """``run`` for each payload, shipped in one message: ``results[i][rank]``."""
        return self._guarded(fn, lambda: self.pool.run_many(fn, payloads))

    def _guarded(self, fn: object, call: Callable[[], R]) -> R:
        try:
            return call()
        except (RankError, PoolFailure) as err:
            failure = err
        # Outside the except block: the message is the whole story, not a chained one.
        # An ordinary exception, not pytest.fail: Hypothesis shrinks it and prints the
        # falsifying example (it lets pytest's outcome exceptions through untouched).
        name = getattr(fn, "__qualname__", repr(fn))
        raise WorldRunError(f"{self!r}.run({name}): {failure}{_refusal_note(str(failure))}")


class WorldRunError(AssertionError):
    """A rank of ``vargather_world(W).run`` raised, died or hung: the message names the
    rank(s) and quotes each traceback (an ``AssertionError``, so pytest shows it as a
    test failure and Hypothesis shrinks the example that caused it)."""


def _refusal_note(text: str) -> str:
    """What to do when the ranks' error is the backend refusing a dtype."""
    if "Invalid scalar type" not in text:  # gloo's refusal
        return ""
    return (
        "\n(the backend refused the dtype: gloo's own collectives carry the dtypes of "
        "vargather.GLOO_NATIVE_DTYPES, not int16. gather_cases() draws only those by "
        "default; a case with others came from an explicit dtypes=: leave it out, e.g. "
        "gather_cases(dtypes=[d for d in names if d != 'int16']))"
    )


class WorldFactory:
    """``vargather_world(W)``: the session's world of ``W`` ranks (started on first use,
    shared by every test of this process, rebuilt after a crash or a hang).

    ``call_timeout``: seconds a call may take before its ranks count as hung (default:
    the pool's, 60)."""

    def __repr__(self) -> str:
        return "vargather_world"

    def __call__(self, world_size: int, *, call_timeout: float | None = None) -> World:
        if call_timeout is None:
            return World(get_pool(world_size))
        return World(get_pool(world_size, call_timeout=call_timeout))

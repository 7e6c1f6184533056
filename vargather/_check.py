"""``python -m vargather check``: the conformance gate.

Not a stage of the gather pipeline: it runs the property suite's properties
(``vargather._cases`` + ``vargather.strategies``, the exact code the test suite runs)
against an implementation under test on persistent local gloo worlds
(``vargather.testing``) and reports, per property, pass / fail / xfail and how many
examples ran; for each failure the minimal counterexample Hypothesis shrank to and a
runnable reproduction.

The implementation under test is ``--impl MODULE:ATTR`` (imported in the parent first,
so a typo fails at once, then inside every rank process, from the current directory
and ``PYTHONPATH``), or vargather's own ``all_gather_v`` without ``--impl``.

Exit status: 0 every property holds (xfails failed as expected), 1 a property failed
(or an xfail passed: xfails are strict), 2 a usage or import error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TextIO

from ._errors import VarGatherError

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CheckOptions",
    "CheckUsageError",
    "Failure",
    "ImplInfo",
    "PropertyResult",
    "Report",
    "load_xfails",
    "main",
    "parse_args",
    "resolve_impl",
    "run_check",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2

CONTRACT_NAMES: Final = ("sum", "local", "mean")
CONVENTIONS: Final = ("auto", "seed", "vargather")
DEFAULT_WORLD_SIZES: Final = (1, 2, 3, 4)
MAX_WORLD_SIZE: Final = 16
DEFAULT_MAX_EXAMPLES: Final = 60
DEFAULT_SEED: Final = 0
DEFAULT_TIMEOUT: Final = 30.0
DEFAULT_SHRINK_BUDGET: Final = 20.0
"""Seconds a property may spend shrinking its first failure: a crashing implementation
costs a world restart per attempt. A hang is not shrunk (each attempt costs
``--timeout``)."""
BATCH: Final = 6
"""Cases per Hypothesis example: one example is one pool round trip (``run_many``)."""
REPORT_SCHEMA: Final = "vargather-check-report/1"

STATUSES: Final = ("pass", "fail", "xfail", "xpass", "n/a", "skipped")
FAILURE_KINDS: Final = ("mismatch", "error", "crash", "hang", "checker")


class CheckUsageError(VarGatherError, ValueError):
    """The check cannot start: a bad option, an unreadable xfails file, or an
    implementation that does not import. The CLI prints it and exits with status 2."""


# --- options -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    """Everything a check run needs, validated (see ``parse_args``)."""

    impl: str | None = None
    grad: str = "sum"
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
    shrink_budget: float = DEFAULT_SHRINK_BUDGET
    progress: bool = True
    only: tuple[str, ...] = ()
    in_flight: str | None = None
    """Set in the child process that runs the in-process row (``uninitialized``): the
    file where it records the batch in flight, for the parent to name a crash or hang."""

    def __post_init__(self) -> None:
        if self.grad not in CONTRACT_NAMES:
            raise CheckUsageError(
                f"--grad must be one of {', '.join(CONTRACT_NAMES)}, got {self.grad!r}"
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
        if not (self.shrink_budget >= 0):
            raise CheckUsageError(
                f"--shrink-budget must be a number of seconds >= 0, got {self.shrink_budget!r}"
            )
        if not (self.timeout > 0):
            raise CheckUsageError(
                f"--timeout must be a positive number of seconds, got {self.timeout!r}"
            )
        for name, ids in (("--only", self.only), ("xfails", self.xfails)):
            unknown = sorted(set(ids) - set(PROPERTY_IDS))
            if unknown:
                raise CheckUsageError(
                    f"{name}: unknown property id(s) {', '.join(unknown)}; known: "
                    + ", ".join(PROPERTY_IDS)
                )


def _world_sizes(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise CheckUsageError(
            f"--world-sizes: expected comma-separated positive integers like 1,2,3,4, got {text!r}"
        ) from None
    for w in sizes:
        if not 1 <= w <= MAX_WORLD_SIZE:
            raise CheckUsageError(
                f"--world-sizes: each world size must be in [1, {MAX_WORLD_SIZE}], got {w} in {text!r}"
            )
    return tuple(sorted(set(sizes)))


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad option raises ``CheckUsageError`` instead of exiting."""

    def error(self, message: str) -> Any:  # argparse declares NoReturn; we raise
        raise CheckUsageError(f"{message}\n\n{self.format_usage().strip()}")


def _parser() -> _Parser:
    parser = _Parser(
        prog="python -m vargather check",
        description=(
            "Run vargather's property suite (ragged shapes, dims, dtypes, empty shards, "
            "non-contiguous inputs, world sizes, gradients) against a ragged all_gather "
            "on local multi-process gloo worlds, and report which properties hold."
        ),
        epilog=(
            "Exit status: 0 every property holds, 1 a property failed (or an xfail "
            "passed), 2 usage or import error. See docs/conformance.md."
        ),
    )
    parser.add_argument(
        "--impl",
        metavar="MODULE:ATTR",
        default=None,
        help=(
            "the implementation under test, imported in every rank from the current "
            "directory and PYTHONPATH; ATTR(t, dim, sizes) returning (gathered, sizes) or "
            "a tensor (the seed's AllGather.apply convention), or a vargather-style "
            "ATTR(x, dim, *, sizes=None, group=None, grad=...). Default: vargather's own "
            "all_gather_v"
        ),
    )
    parser.add_argument(
        "--grad",
        choices=CONTRACT_NAMES,
        default="sum",
        help="the gradient contract the implementation claims (default: sum)",
    )
    parser.add_argument(
        "--world-sizes",
        metavar="W,W,...",
        default=",".join(str(w) for w in DEFAULT_WORLD_SIZES),
        help="world sizes to run on (default: 1,2,3,4)",
    )
    parser.add_argument(
        "--max-examples",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_EXAMPLES,
        help=(
            f"Hypothesis examples per property, each a batch of up to {BATCH} gathers on "
            f"one world (default: {DEFAULT_MAX_EXAMPLES})"
        ),
    )
    parser.add_argument(
        "--seed",
        metavar="S",
        type=int,
        default=DEFAULT_SEED,
        help=f"Hypothesis seed; a given seed gives the same run (default: {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--xfails",
        metavar="FILE",
        default=None,
        help="file of property ids expected to fail, one per line, '#' comments (strict)",
    )
    parser.add_argument(
        "--json", metavar="PATH", default=None, help="also write the report as JSON to PATH"
    )
    parser.add_argument(
        "--convention",
        choices=CONVENTIONS,
        default="auto",
        help=(
            "how to call ATTR: 'seed' (t, dim, sizes), 'vargather' (x, dim, *, sizes, "
            "group, grad), or 'auto': vargather when ATTR takes a 'grad' or 'group' "
            "parameter, seed otherwise (default: auto)"
        ),
    )
    parser.add_argument(
        "--transports",
        metavar="auto|none|NAME,...",
        default="auto",
        help=(
            "transport= values to call a vargather-style ATTR with; 'auto': each of "
            "vargather's gloo transports when ATTR accepts transport=, else none "
            "(default: auto)"
        ),
    )
    parser.add_argument(
        "-x",
        "--exitfirst",
        action="store_true",
        help="stop at the first property that fails (the rest are reported as not run)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=(
            "longest a batch of examples may take on the ranks before the implementation "
            f"counts as hung (default: {DEFAULT_TIMEOUT:g})"
        ),
    )
    parser.add_argument(
        "--shrink-budget",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_SHRINK_BUDGET,
        help=(
            "time a property may spend shrinking a failure to a minimal counterexample "
            f"(default: {DEFAULT_SHRINK_BUDGET:g})"
        ),
    )
    parser.add_argument(
        "--only",
        metavar="ID,ID,...",
        default="",
        help="run only these properties (default: all)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show progress on stderr")
    parser.add_argument("--list", action="store_true", help="list the property ids and exit")
    # Internal: the child process that runs the in-process row (see _run_isolated).
    parser.add_argument("--in-flight", default=None, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str]) -> CheckOptions:
    """Parse and validate the command line; raises ``CheckUsageError``.

    ``--list`` and ``--help`` are handled by ``main``.
    """
    args = _parser().parse_args(list(argv))
    xfails: frozenset[str] = frozenset()
    if args.xfails is not None:
        xfails = load_xfails(args.xfails)
    only = tuple(p.strip() for p in str(args.only).split(",") if p.strip())
    return CheckOptions(
        impl=args.impl,
        grad=args.grad,
        world_sizes=_world_sizes(args.world_sizes),
        max_examples=args.max_examples,
        seed=args.seed,
        xfails=xfails,
        xfails_path=args.xfails,
        json_path=args.json,
        convention=args.convention,
        transports=args.transports,
        exitfirst=args.exitfirst,
        timeout=args.timeout,
        shrink_budget=args.shrink_budget,
        progress=not args.no_progress,
        only=only,
        in_flight=args.in_flight,
    )


# --- xfails --------------------------------------------------------------------------


def load_xfails(path: str) -> frozenset[str]:
    """Read an xfails file: one property id per line; ``#`` starts a comment.

    Every id must name a property (a typo would otherwise silently expect nothing).
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise CheckUsageError(f"--xfails: cannot read {path!r}: {err.strerror or err}") from None
    known = set(property_ids())
    ids: set[str] = set()
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if len(text.split()) != 1:
            raise CheckUsageError(
                f"--xfails: {path}:{number}: expected one property id per line, got {text!r}"
            )
        if text not in known:
            raise CheckUsageError(
                f"--xfails: {path}:{number}: unknown property id {text!r}; known ids: "
                + ", ".join(property_ids())
            )
        ids.add(text)
    return frozenset(ids)


# --- the implementation under test ---------------------------------------------------


@dataclass(frozen=True)
class ImplInfo:
    """What ``--impl`` names, as resolved in the parent.

    ``ref`` is ``None`` for vargather's own ``all_gather_v``. ``convention`` is
    ``"seed"`` (``ATTR(t, dim, sizes)``) or ``"vargather"``
    (``ATTR(x, dim, *, sizes=None, group=None, grad=...)``). ``transports``: the
    ``transport=`` names it is called with (``None``: it is not passed);
    ``refused_transports``: vargather's names left out, with the reason.
    """

    ref: str | None
    display: str
    convention: str
    takes_group: bool
    transports: tuple[str, ...] | None = None
    refused_transports: tuple[tuple[str, str], ...] = ()


def _split_ref(ref: str) -> tuple[str, str]:
    module, sep, attr = ref.partition(":")
    ok = (
        sep == ":"
        and ":" not in attr
        and all(p.isidentifier() for p in module.split("."))
        and all(p.isidentifier() for p in attr.split("."))
    )
    if not ok:
        raise CheckUsageError(
            f"--impl must be MODULE:ATTR, e.g. mypkg.distributed:all_gather, got {ref!r}"
        )
    return module, attr


def ensure_import_path(cwd: str | None = None) -> str:
    """Put the current directory first on ``sys.path`` (``python -m`` does; an embedding
    caller may not), so ``MODULE`` resolves as the docs say. Returns the directory."""
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
        sys.path.insert(0, here)
    return here


def _where(cwd: str) -> str:
    pythonpath = os.environ.get("PYTHONPATH", "")
    return f"MODULE is imported from the current directory ({cwd})" + (
        f" and PYTHONPATH ({pythonpath})" if pythonpath else " and PYTHONPATH (not set)"
    )


def load_impl(ref: str, cwd: str | None = None) -> Callable[..., Any]:
    """Import ``MODULE`` and return ``ATTR`` (a dotted path within the module allowed,
    ``mod:AllGather.apply``); ``CheckUsageError`` with a clear message otherwise."""
    module_name, attr = _split_ref(ref)
    here = ensure_import_path(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (
            module_name == err.name or module_name.startswith(err.name + ".")
        ):
            raise CheckUsageError(
                f"--impl {ref}: cannot import module {module_name!r}: no module named "
                f"{err.name!r}. {_where(here)}."
            ) from None
        raise CheckUsageError(
            f"--impl {ref}: importing {module_name!r} failed: a module it imports is "
            f"missing: {err}\n" + _short_traceback(err)
        ) from None
    except BaseException as err:  # a module whose import raises anything at all
        if isinstance(err, KeyboardInterrupt):
            raise
        raise CheckUsageError(
            f"--impl {ref}: importing {module_name!r} failed: {type(err).__name__}: {err}\n"
            + _short_traceback(err)
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(module, "__file__", None) or module_name
            raise CheckUsageError(
                f"--impl {ref}: {module_name!r} ({where}) has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise CheckUsageError(
            f"--impl {ref}: {attr!r} is a {type(obj).__name__}, not a callable; expected "
            "ATTR(t, dim, sizes) like the seed's all_gather = AllGather.apply"
        )
    fn: Callable[..., Any] = obj
    return fn


def _short_traceback(err: BaseException, limit: int = 6) -> str:
    """The last ``limit`` frames of ``err``'s traceback, without importlib's own."""
    noise = (os.path.abspath(__file__), os.path.abspath(importlib.__file__ or ""))
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith("<frozen") and os.path.abspath(f.filename) not in noise
    ][-limit:]
    text = "".join(traceback.format_list(frames))
    return ("Traceback (most recent call last):\n" + text if text else "") + "".join(
        traceback.format_exception_only(type(err), err)
    ).rstrip()


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _is_function_apply(fn: Callable[..., Any]) -> bool:
    """``SomeFunction.apply`` of a ``torch.autograd.Function`` (the seed's
    ``all_gather = AllGather.apply``), whose signature is ``(*args, **kwargs)``."""
    import torch

    owner = getattr(fn, "__self__", None)
    return (
        getattr(fn, "__name__", None) == "apply"
        and isinstance(owner, type)
        and issubclass(owner, torch.autograd.Function)
    )


def resolve_impl(
    ref: str | None,
    convention: str = "auto",
    cwd: str | None = None,
    transports: str = "auto",
) -> ImplInfo:
    """Check ``--impl`` in the parent (import, attribute, callable) and pick how to call
    it.

    ``convention="auto"``: the seed's ``(t, dim, sizes)`` for a
    ``torch.autograd.Function``'s ``apply``; vargather's when ATTR accepts ``grad=`` or
    ``group=`` (by name or through ``**kwargs``); the seed's otherwise.
    ``transports="auto"``: a vargather-style ATTR that accepts ``transport=`` is called
    with each of vargather's transports that run on gloo; ``"none"``: never passed;
    else a comma-separated list of names.
    """
    usable, refused = _gloo_transports()
    if ref is None:
        if convention == "seed":
            raise CheckUsageError(
                "--convention seed needs --impl (vargather's own API is vargather-style)"
            )
        chosen = usable if transports == "auto" else _transport_list(transports, "vargather")
        if chosen is None:
            raise CheckUsageError("--transports none needs --impl (vargather takes transport=)")
        return ImplInfo(
            None, "vargather.all_gather_v", "vargather", True, chosen, tuple(refused.items())
        )
    fn = load_impl(ref, cwd)
    if convention == "auto":
        vargather_style = not _is_function_apply(fn) and (_takes(fn, "grad") or _takes(fn, "group"))
        convention = "vargather" if vargather_style else "seed"
    takes_group = convention == "vargather" and _takes(fn, "group")
    if transports == "auto":
        takes = convention == "vargather" and _takes(fn, "transport")
        chosen = usable if takes else None
        left_out = tuple(refused.items()) if takes else ()
    else:
        chosen, left_out = _transport_list(transports, convention), ()
    return ImplInfo(ref, ref, convention, takes_group, chosen, left_out)


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


def rank_preflight(ctx: Any, payload: tuple[str, str]) -> str:
    """Rank side: make ``cwd`` importable and import ``MODULE:ATTR`` in this rank.

    Rank processes inherit the parent's ``sys.path`` when spawned; a pool that was
    started before the parent fixed its path gets the fix here (it persists for the
    life of the rank process).
    """
    ref, cwd = payload
    del ctx
    fn = load_impl(ref, cwd)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


# --- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """Why a property failed, on its minimal counterexample.

    ``kind``: ``mismatch`` (a wrong output, sizes or gradient), ``error`` (the
    implementation raised), ``crash`` (a rank process died: a gloo abort, a segfault),
    ``hang`` (no reply within ``--timeout``), ``checker`` (the check itself could not
    run the property; never the implementation's fault, never a pass).
    ``case`` is the counterexample as plain data (world size, per-rank shapes, dim,
    dtype, contract, ...); ``reproduction`` a runnable snippet.
    """

    kind: str
    message: str
    case: dict[str, Any] | None = None
    reproduction: str | None = None
    shrunk: bool = True

    @property
    def command(self) -> str | None:
        """The shell command in ``reproduction`` that re-runs the case, if there is one."""
        for line in (self.reproduction or "").splitlines():
            head, sep, command = line.partition("reproduce: ")
            if sep and not head.strip():
                return command.strip()
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "case": self.case,
            "reproduction": self.reproduction,
            "command": self.command,
            "shrunk": self.shrunk,
        }


@dataclass(frozen=True)
class PropertyResult:
    """One row of the table.

    ``examples`` counts the Hypothesis examples run before the verdict (for a failure:
    up to and including the first failing one), ``cases`` the gathers they held (an
    example is a batch of up to ``BATCH`` cases on one world, one pool round trip);
    ``shrink_runs`` the further examples Hypothesis ran shrinking a failure. ``status``: pass, fail, xfail (failed and listed in
    the xfails file), xpass (listed but held: a failure, xfails are strict), ``n/a``
    (does not apply to this implementation or these world sizes; ``reason`` says why).
    """

    id: str
    title: str
    status: str
    examples: int = 0
    cases: int = 0
    shrink_runs: int = 0
    seconds: float = 0.0
    reason: str | None = None
    failure: Failure | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "xpass")

    @staticmethod
    def from_json(data: dict[str, Any]) -> PropertyResult:
        """The inverse of ``to_json``."""
        failure = data["failure"]
        return PropertyResult(
            data["id"],
            data["title"],
            data["status"],
            examples=data["examples"],
            cases=data["cases"],
            shrink_runs=data["shrink_runs"],
            seconds=data["seconds"],
            reason=data["reason"],
            failure=None
            if failure is None
            else Failure(
                failure["kind"],
                failure["message"],
                failure["case"],
                failure["reproduction"],
                failure["shrunk"],
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "examples": self.examples,
            "cases": self.cases,
            "shrink_runs": self.shrink_runs,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "failure": None if self.failure is None else self.failure.to_json(),
        }


@dataclass
class Report:
    """The outcome of one check run: a header and one ``PropertyResult`` per property."""

    impl: str | None
    impl_display: str
    convention: str
    grad: str
    world_sizes: tuple[int, ...]
    max_examples: int
    seed: int
    xfails_path: str | None
    results: list[PropertyResult] = field(default_factory=list)
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    transports: tuple[str, ...] | None = None
    refused_transports: dict[str, str] = field(default_factory=dict)

    @property
    def exit_status(self) -> int:
        return EXIT_FAILED if any(r.failed for r in self.results) else EXIT_OK

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            out[r.status] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "impl": self.impl,
            "impl_display": self.impl_display,
            "convention": self.convention,
            "grad": self.grad,
            "world_sizes": list(self.world_sizes),
            "max_examples": self.max_examples,
            "seed": self.seed,
            "xfails_file": self.xfails_path,
            "versions": dict(self.versions),
            "transports": None if self.transports is None else list(self.transports),
            "refused_transports": dict(self.refused_transports),
            "properties": [r.to_json() for r in self.results],
            "summary": self.counts(),
            "exit_status": self.exit_status,
            "seconds": round(self.seconds, 3),
        }

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")

    # -- text

    def header_lines(self) -> list[str]:
        convention = (
            "the seed's convention ATTR(t, dim, sizes)"
            if self.convention == "seed"
            else "vargather's convention ATTR(x, dim, *, sizes, group, grad)"
        )
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        extra: list[str] = []
        if self.transports is not None:
            extra.append("transports: " + ", ".join(self.transports))
            extra.extend(
                f"transport {name!r} not run: {why}"
                for name, why in self.refused_transports.items()
            )
        return [
            f"vargather check: {self.impl_display} ({convention})",
            f"claimed gradient contract: {self.grad}; world sizes "
            f"{','.join(str(w) for w in self.world_sizes)}; up to {self.max_examples} "
            f"examples per property (each a batch of up to {BATCH} gathers); seed {self.seed}"
            + (f"; xfails from {self.xfails_path}" if self.xfails_path else ""),
            *extra,
            versions,
        ]

    def table_lines(self) -> list[str]:
        rows = [("property", "status", "examples", "cases", "what it checks")]
        for r in self.results:
            examples = str(r.examples)
            if r.shrink_runs:
                examples += f" (+{r.shrink_runs} shrinking)"
            what = r.title if r.reason is None else f"{r.title} [{r.reason}]"
            rows.append((r.id, _STATUS_TEXT[r.status], examples, str(r.cases), what))
        n = len(rows[0]) - 1
        widths = [max(len(row[i]) for row in rows) for i in range(n)]
        lines = []
        for i, row in enumerate(rows):
            cells = [row[j].ljust(widths[j]) for j in range(n)]
            lines.append("  ".join([*cells, row[n]]).rstrip())
            if i == 0:
                lines.append("  ".join(["-" * w for w in widths] + ["-" * 14]))
        return lines

    def failure_lines(self) -> list[str]:
        lines: list[str] = []
        for r in self.results:
            if r.failure is None:
                continue
            label = {"fail": "FAILED", "xfail": "failed as expected (xfail)"}.get(
                r.status, r.status
            )
            lines.append("")
            lines.append(f"=== {r.id}: {label} ({r.failure.kind}) ===")
            lines.extend(r.failure.message.rstrip().splitlines())
            if r.failure.reproduction:
                lines.append(
                    "minimal counterexample (Hypothesis shrank it):"
                    if r.failure.shrunk
                    else "counterexample (not shrunk):"
                )
                lines.extend("  " + line for line in r.failure.reproduction.rstrip().splitlines())
            elif r.failure.case is not None:
                lines.append("counterexample: " + describe_case_dict(r.failure.case))
        for r in self.results:
            if r.status == "xpass":
                lines.append("")
                lines.append(
                    f"=== {r.id}: XPASS ===\nlisted in {self.xfails_path} as expected to fail, "
                    f"but it held on {r.cases} cases: remove it from the xfails file"
                )
        return lines

    def summary_line(self) -> str:
        c = self.counts()
        failed = c["fail"] + c["xpass"]
        verdict = "FAILED" if failed else "PASSED"
        parts = [f"{c['pass']} passed", f"{c['fail']} failed"]
        if c["xfail"]:
            parts.append(f"{c['xfail']} xfailed")
        if c["xpass"]:
            parts.append(f"{c['xpass']} xpassed (strict: a failure)")
        if c["n/a"]:
            parts.append(f"{c['n/a']} not applicable")
        if c["skipped"]:
            parts.append(f"{c['skipped']} skipped")
        return f"{verdict}: {', '.join(parts)} of {len(self.results)} properties in {self.seconds:.1f} s"

    def render(self) -> str:
        lines = [*self.header_lines(), "", *self.table_lines(), *self.failure_lines(), ""]
        lines.append(self.summary_line())
        return "\n".join(lines) + "\n"


_STATUS_TEXT: Final = {
    "skipped": "skipped",
    "pass": "pass",
    "fail": "FAIL",
    "xfail": "xfail",
    "xpass": "XPASS",
    "n/a": "n/a",
}


def describe_case_dict(case: dict[str, Any]) -> str:
    """One line for a counterexample given as plain data."""
    keys = ("world_size", "shapes", "dim", "dtype", "contract")
    head = [f"{k.replace('_', ' ')} {case[k]}" for k in keys if k in case]
    rest = [f"{k.replace('_', ' ')} {v}" for k, v in case.items() if k not in keys]
    return ", ".join(head + rest)


# --- progress ------------------------------------------------------------------------


class Progress:
    """Progress on a stream (stderr): one line per property as it finishes, or a live
    bar when the stream is a terminal and ``rich`` is installed."""

    def __init__(self, stream: TextIO | None, total: int) -> None:
        self.stream = stream
        self.total = total
        self.done = 0
        self._live: Any = None
        self._task: Any = None
        if stream is not None and stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, TextColumn
                from rich.progress import Progress as RichProgress
            except ImportError:
                pass
            else:
                self._live = RichProgress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    TextColumn("{task.completed}/{task.total} properties"),
                    TextColumn("{task.fields[note]}"),
                    console=Console(file=stream),
                    transient=True,
                )
                self._live.start()
                self._task = self._live.add_task("vargather check", total=total, note="")

    def phase(self, text: str) -> None:
        """Say what the check is doing before the properties start."""
        if self._live is not None:
            self._live.update(self._task, description=text)
        elif self.stream is not None:
            print(text, file=self.stream, flush=True)

    def start(self, prop_id: str) -> None:
        if self._live is not None:
            self._live.update(self._task, description=f"checking {prop_id}", note="")

    def examples(self, prop_id: str, cases: int) -> None:
        if self._live is not None:
            self._live.update(self._task, note=f"{prop_id}: {cases} cases")

    def finish(self, result: PropertyResult) -> None:
        self.done += 1
        if self._live is not None:
            self._live.update(self._task, completed=self.done)
            if result.failed:
                self._live.console.print(f"[red]{result.id}: {_STATUS_TEXT[result.status]}")
            return
        if self.stream is None:
            return
        width = len(str(self.total))
        print(
            f"[{self.done:>{width}}/{self.total}] {result.id:<18} {_STATUS_TEXT[result.status]:<5} "
            f"{result.cases:>5} cases  {result.seconds:6.1f} s",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# --- the properties ------------------------------------------------------------------


_FLOAT: Final = ("float32", "float64")
_HALF: Final = ("float16", "bfloat16")
_COMPLEX: Final = ("complex64", "complex128")
_INTEGER: Final = ("int64", "int32", "int16", "int8", "uint8")
_COMMON: Final = ("float32", "float64", "int64")
"""The dtypes of the rows that are not about dtypes (each dtype family has its row)."""
_DIFFERENTIABLE: Final = (*_FLOAT, *_HALF, *_COMPLEX)


@dataclass(frozen=True)
class _Row:
    """One property of the table: the suite's checks on a restricted class of cases.

    ``kwargs`` go to ``vargather.strategies.case_batches``. ``aspects``: which of the
    judge's checks count for this row (a forward row does not fail on returned sizes,
    which have their own row); an exception, a crash or a hang counts for every row.
    ``keep`` narrows each drawn batch where no strategy argument does.
    """

    id: str
    title: str
    aspects: frozenset[str]
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    min_world: int = 1
    max_world: int = MAX_WORLD_SIZE
    keep: Callable[[Any], bool] | None = None
    initialized: bool = True
    subgroups: bool = False


_OUTPUT: Final = frozenset({"output"})
_SIZES: Final = frozenset({"output", "sizes"})
_ALL: Final = frozenset({"output", "sizes", "gradient", "adjoint"})


def _dtypes(names: Sequence[str]) -> tuple[str, ...]:
    from ._cases import DTYPE_NAMES

    return tuple(n for n in names if n in DTYPE_NAMES)


def _some_empty(case: Any) -> bool:
    empty = sum(1 for n in case.sizes if n == 0)
    return bool(0 < empty < case.world_size)


def _nonzero_dim(case: Any) -> bool:
    return bool(case.dim != 0)


def _catalogue(grad: str, returns: str, transports: tuple[str, ...] | None = None) -> list[_Row]:
    """Every row, in table order, for an implementation claiming ``grad`` whose
    non-tensor return value is ``returns`` (``sizes``, ``layout`` or ``none``) and which
    takes the ``transports`` named (``None``: it takes no ``transport=``).

    Each row varies one thing: the forward rows run contiguous shards without
    ``sizes`` and without backward, every dim and ragged shape (empty shards too);
    the structural rows use the common dtypes; the world rows (one rank,
    uninitialized, subgroup) use float32/float64/complex64 and mostly run backward.
    """
    c: dict[str, Any] = {"contracts": (grad,)}
    if transports is not None:
        c["transports"] = transports
    fwd = {"sizes_forms": ("none",), "memory": ("contiguous",), "requires_grad": False, **c}
    common = {**fwd, "dtypes": _dtypes(_COMMON)}
    world = {"sizes_forms": ("none",), "dtypes": _dtypes((*_FLOAT, _COMPLEX[0])), **c}
    grads = {"sizes_forms": ("none",), "requires_grad": True, "dtypes": _dtypes(_DIFFERENTIABLE)}
    what = "layout" if returns == "layout" else "sizes"
    dtype_row = "forward equals torch.cat(x, dim) bit for bit on every rank, "
    return [
        _Row(
            "forward-float",
            dtype_row + "float32/float64",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes(_FLOAT)},
        ),
        _Row(
            "forward-half",
            dtype_row + "float16/bfloat16",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes(_HALF)},
        ),
        _Row(
            "forward-complex",
            dtype_row + "complex64/complex128",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes(_COMPLEX)},
        ),
        _Row(
            "forward-int",
            dtype_row + "int8/16/32/64, uint8",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes(_INTEGER)},
        ),
        _Row("forward-bool", dtype_row + "bool", _OUTPUT, {**fwd, "dtypes": ("bool",)}),
        _Row(
            "dims",
            "forward along dims other than 0, negative ones included",
            _OUTPUT,
            {**common, "min_ndim": 2},
            keep=_nonzero_dim,
        ),
        _Row(
            "empty-some",
            "forward with some ranks' shards empty",
            _OUTPUT,
            common,
            min_world=2,
            keep=_some_empty,
        ),
        _Row(
            "empty-all", "forward with every rank's shard empty", _OUTPUT, {**common, "max_size": 0}
        ),
        _Row(
            "non-contiguous",
            "forward from transposed and strided (sliced) views",
            _OUTPUT,
            {**common, "memory": ("transposed", "sliced")},
        ),
        _Row(
            "sizes-list",
            f"sizes passed as a list of ints: forward and returned {what}",
            _SIZES,
            {**common, "sizes_forms": ("list",)},
        ),
        _Row(
            "sizes-tensor",
            f"sizes passed as a 1-d int64 tensor: forward and returned {what}",
            _SIZES,
            {**common, "sizes_forms": ("tensor",)},
        ),
        _Row(
            "returned-sizes",
            f"the returned {what} equal the true ones",
            frozenset({"sizes"}),
            common,
        ),
        _Row(
            "one-rank",
            "a world of one rank: the identity, gradients flowing",
            _ALL,
            world,
            max_world=1,
        ),
        _Row(
            "uninitialized",
            "torch.distributed not initialized: the identity, gradients flowing",
            _ALL,
            world,
            initialized=False,
        ),
        _Row(
            "subgroup",
            "group= a subgroup: gathers its members only, gradients too",
            _ALL,
            world,
            min_world=2,
            subgroups=True,
        ),
        _Row(
            "gradient",
            f"input gradients under grad={grad!r}, upstream gradients differing per rank",
            frozenset({"gradient"}),
            {**grads, **c},
        ),
        _Row(
            "adjoint",
            "sum_r <dx_r, x_r> == sum_j <g_j, out_j> exactly (grad='sum', integer values)",
            frozenset({"gradient", "adjoint"}),
            {
                **grads,
                **c,
                "contracts": ("sum",),
                "values": ("integers",),
                "upstream": ("integers",),
            },
            min_world=2,
        ),
    ]


PROPERTY_IDS: Final = (
    "forward-float",
    "forward-half",
    "forward-complex",
    "forward-int",
    "forward-bool",
    "dims",
    "empty-some",
    "empty-all",
    "non-contiguous",
    "sizes-list",
    "sizes-tensor",
    "returned-sizes",
    "one-rank",
    "uninitialized",
    "subgroup",
    "gradient",
    "adjoint",
)
"""The rows' ids, in table order (a literal, so ``--help`` and ``--list`` stay fast;
a test checks it against ``_catalogue``)."""


def property_ids() -> tuple[str, ...]:
    """The ids of the table's rows, in order (what an xfails file may list)."""
    return PROPERTY_IDS


def _aspect(message: str) -> str | None:
    """Which check a judge message reports; ``None`` (counts everywhere) for an
    exception, a crash, a hang, or a message this module does not recognize."""
    if message.startswith(("adjoint identity",)):
        return "adjoint"
    if message.startswith(("x.grad", "out.requires_grad=", "backward not run")):
        return "gradient"
    if message.startswith(("sizes=", "sizes has ", "layout.", "returned (tensor, ")):
        return "sizes"
    if message.startswith(
        ("out.dtype=", "out.shape=", "out.device=", "out differs", "returned a ", "the input x ")
    ):
        return "output"
    return None


_WHERE: Final = re.compile(r" \[(?P<call>[^\[\]]*) on rank (?P<rank>\d+) of (?P<world>\d+)\]$")


def _condense(messages: Sequence[str], limit: int = 4) -> str:
    """The judge's messages, one per distinct failure: ranks that failed the same way
    are named once (``(the same on rank(s) 1, 2)``) instead of repeated."""
    groups: dict[str, list[tuple[int | None, str]]] = {}
    for message in messages:
        first = message.partition("\n")[0]
        match = _WHERE.search(first)
        key = _WHERE.sub("", first) if match else first
        groups.setdefault(key, []).append((int(match["rank"]) if match else None, message))
    lines: list[str] = []
    for items in list(groups.values())[:limit]:
        lines.append(items[0][1])
        others = [str(rank) for rank, _ in items[1:] if rank is not None]
        if others:
            lines.append(f"  (the same on rank(s) {', '.join(others)})")
    if len(groups) > limit:
        lines.append(f"... and {len(groups) - limit} more distinct failure(s)")
    return "\n".join(lines)


def _kind(messages: Sequence[str]) -> str:
    text = "\n".join(messages)
    if "RankCrashed" in text:
        return "crash"
    if "RankHung" in text:
        return "hang"
    if any(_aspect(m) is None for m in messages):
        return "error"
    return "mismatch"


def _case_data(case: Any) -> dict[str, Any]:
    """A ``GatherCase`` as plain JSON data (the counterexample in the report)."""
    return {
        "world_size": case.world_size,
        "shapes": [list(s) for s in case.shapes],
        "sizes": list(case.sizes),
        "dim": case.dim,
        "dtype": case.dtype,
        "contract": case.contract,
        "transport": case.transport,
        "sizes_passed": case.sizes_form,
        "memory": [case.memory_of(r) for r in range(case.world_size)],
        "values": case.values,
        "upstream": case.upstream,
        "requires_grad": case.requires_grad,
        "seed": case.seed,
        "subgroup": None if case.members is None else list(case.members),
        "world": case.world,
        "initialized": case.initialized,
        "repr": repr(case),
    }


class _FailingBatchError(AssertionError):
    """Raised inside the Hypothesis test body: the batch has a failing case."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class _RowState:
    examples: int = 0
    cases: int = 0
    shrink_runs: int = 0
    failed_at: float | None = None
    last: Failure | None = None
    memo: dict[tuple[Any, ...], Failure] = field(default_factory=dict)


def _row_strategy(
    row: _Row, impl: Any, world_sizes: Sequence[int], batch: int
) -> SearchStrategy[list[Any]]:
    from hypothesis import strategies as st

    from . import strategies as vst

    def for_world(w: int) -> SearchStrategy[list[Any]]:
        drawn = vst.case_batches(
            min_world_size=w,
            max_world_size=w,
            max_batch=batch,
            subgroups=row.subgroups,
            initialized=row.initialized,
            implementation=impl,
            **row.kwargs,
        )
        keep = row.keep
        if keep is None:
            return drawn
        return drawn.map(lambda cases: [c for c in cases if keep(c)]).filter(bool)

    if not row.initialized:
        return for_world(1)
    return st.sampled_from(sorted(world_sizes)).flatmap(for_world)


def _evaluate(
    row: _Row,
    impl: Any,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], Any],
    progress: Progress,
) -> PropertyResult:
    """Run one row as a Hypothesis test; shrink its first failure to a minimal case."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed, settings

    from ._cases import describe, run_cases

    started = time.monotonic()
    state = _RowState()
    strategy = _row_strategy(row, impl, world_sizes, BATCH)

    def run(batch: list[Any]) -> Failure | None:
        if state.failed_at is not None:
            spent = time.monotonic() - state.failed_at
            hung = state.last is not None and state.last.kind == "hang"
            if hung or spent > options.shrink_budget:
                reject()  # out of shrinking time: keep the smallest failure found so far
            state.shrink_runs += 1
        with _in_flight(options.in_flight, batch, impl):
            verdicts = run_cases(batch, impl, pool_factory=factory)
        if state.failed_at is None:
            state.examples += 1
            state.cases += sum(1 for v in verdicts if not v.not_run)
            progress.examples(row.id, state.cases)
        for verdict in verdicts:
            messages = [m for m in verdict.failures if _counts(m, row.aspects)]
            if messages:
                if state.failed_at is None:
                    state.failed_at = time.monotonic()
                return Failure(
                    _kind(messages),
                    _condense(messages),
                    _case_data(verdict.case),
                    describe(verdict.case, impl),
                )
        return None

    def body(batch: list[Any]) -> None:
        key = tuple(batch)
        failure = state.memo[key] if key in state.memo else run(batch)
        if failure is not None:
            state.memo[key] = state.last = failure
            # One raise site: Hypothesis tells failures apart by where they are raised.
            raise _FailingBatchError(failure)

    test = settings(
        max_examples=options.max_examples,
        derandomize=False,  # the seed below makes a run reproducible
        database=None,  # nothing written into the caller's repository
        deadline=None,  # no timed verdicts: a slow machine is not a failure
        verbosity=Verbosity.quiet,  # the report prints the counterexample, not Hypothesis
        print_blob=False,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        # Health checks judge the strategies (the property suite's own tests run them);
        # here they would blame the implementation under test for how cases are drawn.
        suppress_health_check=list(HealthCheck),
    )(seed(options.seed)(given(strategy)(body)))
    failure: Failure | None = None
    try:
        test()
    except _FailingBatchError as err:
        failure = err.failure
    except Exception as err:  # Hypothesis's Flaky, or the check itself broke
        if state.last is not None:
            note = (
                f"\n(the failure did not reproduce on a re-run: {type(err).__name__}; "
                "the implementation may be nondeterministic)"
            )
            failure = Failure(
                state.last.kind, state.last.message + note, state.last.case, state.last.reproduction
            )
        else:
            failure = Failure(
                "checker",
                f"the check could not run this property: {type(err).__name__}: {err}\n"
                + _short_traceback(err, 12),
            )
    seconds = time.monotonic() - started
    if failure is None and state.cases == 0:
        failure = Failure("checker", "no case ran (every drawn case was filtered out)")
    return PropertyResult(
        row.id,
        row.title,
        "pass" if failure is None else "fail",
        examples=state.examples,
        cases=state.cases,
        shrink_runs=state.shrink_runs,
        seconds=seconds,
        failure=failure,
    )


_HUNG_EXIT: Final = 75  # the child's exit status when its watchdog fired


@contextlib.contextmanager
def _in_flight(path: str | None, batch: Sequence[Any], impl: Any) -> Iterator[None]:
    """In the child that runs the in-process row: record ``batch`` in ``path`` while it
    runs (so the parent can name the case if this process dies) and exit with
    ``_HUNG_EXIT`` if it does not finish within the timeout the parent set."""
    if path is None:
        yield
        return
    from ._cases import describe

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
    row: _Row, options: CheckOptions, info: ImplInfo, report: str, in_flight: str
) -> list[str]:
    command = [sys.executable, "-m", "vargather", "check", "--only", row.id]
    if info.ref is not None:
        command += ["--impl", info.ref, "--convention", info.convention]
    if info.transports is not None:
        command += ["--transports", ",".join(info.transports)]
    elif info.ref is not None:
        command += ["--transports", "none"]
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
        "--json",
        report,
        "--no-progress",
        "--in-flight",
        in_flight,
    ]
    return command


def _run_isolated(row: _Row, options: CheckOptions, info: ImplInfo) -> PropertyResult:
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
    row: _Row, kind: str, what: str, stderr: str, in_flight: str, started: float
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
        failure=Failure(kind, message, case, reproduction, shrunk=False),
    )


def _counts(message: str, aspects: frozenset[str]) -> bool:
    aspect = _aspect(message)
    return aspect is None or aspect in aspects


# --- running a check -----------------------------------------------------------------


def _implementation(info: ImplInfo, grad: str, cwd: str) -> Any:
    """The ``vargather._cases.Implementation`` the suite's runner calls."""
    from ._cases import VARGATHER, Implementation

    if info.ref is None:
        return VARGATHER  # every row restricts its cases to the claimed contract
    return Implementation(
        info.ref,
        convention=info.convention,
        contracts=(grad,),
        transports=info.transports,
        search_path=(cwd,),
        name=info.ref,
    )


_PROBE_TOKENS = iter(range(-1, -(1 << 62), -1))


def _gloo_transports() -> tuple[tuple[str, ...], dict[str, str]]:
    """vargather's transports that run on gloo, and why the others do not (asked of
    vargather itself, so a transport added later is checked without editing this)."""
    from . import _transport

    reason_of: Callable[[str, str], str | None] = getattr(
        _transport, "unsupported_reason", lambda name, backend: None
    )
    usable: list[str] = []
    refused: dict[str, str] = {}
    for name in _transport.TRANSPORT_NAMES:
        reason = reason_of(name, "gloo")
        if reason is None:
            usable.append(name)
        else:
            refused[name] = reason
    return tuple(usable), refused


def _probe_returns(
    impl: Any, grad: str, world_sizes: Sequence[int], factory: Callable[[int], Any]
) -> str:
    """What the implementation returns beside the tensor on a small 2-rank (or 1-rank)
    gather: ``sizes``, ``layout``, ``none`` (a bare tensor), or ``unknown``."""
    from ._cases import GatherCase, RankReport, run_on_rank
    from ._pool import PoolFailure, RankError

    multi = [w for w in world_sizes if w >= 2]
    w = min(multi) if multi else 1
    case = GatherCase(
        shapes=tuple((1 + r % 2, 2) for r in range(w)),
        dim=0,
        dtype="float32",
        contract=grad,
        values="integers",
        requires_grad=False,
    )
    try:
        reports = factory(w).run(run_on_rank, (impl, case, next(_PROBE_TOKENS)))
    except (PoolFailure, RankError):  # the rows will report what went wrong
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


def _applies(
    row: _Row, info: ImplInfo, grad: str, returns: str, world_sizes: Sequence[int]
) -> str | None:
    """Why ``row`` does not apply (``None``: it does)."""
    if row.id == "adjoint" and grad != "sum":
        return f"an identity of grad='sum'; the claimed contract is {grad!r}"
    if row.subgroups:
        if info.convention == "seed":
            return "the seed's convention ATTR(t, dim, sizes) takes no process group"
        if not info.takes_group:
            return "ATTR takes no group= parameter"
    if row.id == "returned-sizes" and returns == "none":
        return "ATTR returns a bare tensor: no sizes to check"
    if row.initialized and not _worlds(row, world_sizes):
        if row.max_world == 1:
            return "needs world size 1 in --world-sizes"
        return f"needs a world size >= {row.min_world} in --world-sizes"
    return None


def _worlds(row: _Row, world_sizes: Sequence[int]) -> list[int]:
    return [w for w in world_sizes if row.min_world <= w <= row.max_world]


def _require_hypothesis() -> None:
    try:
        import hypothesis  # noqa: F401  # only checking that it is installed
    except ImportError:
        raise CheckUsageError("the check needs Hypothesis: pip install 'vargather[test]'") from None


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
    info: ImplInfo, cwd: str, world_sizes: Sequence[int], factory: Callable[[int], Any]
) -> None:
    """Import ``MODULE:ATTR`` in every rank of every world before any property runs."""
    from ._pool import PoolFailure, RankError

    if info.ref is None:
        return
    for w in world_sizes:
        try:
            factory(w).run(rank_preflight, (info.ref, cwd))
        except RankError as err:
            first = err.failures[0]
            message = str(first.exception) if first.exception is not None else first.exc_type_name
            raise CheckUsageError(
                f"{message}\n(imported in the parent, but failed in rank {first.rank} of a "
                f"{w}-rank world)"
            ) from None
        except PoolFailure as err:
            raise CheckUsageError(
                f"--impl {info.ref}: a rank of a {w}-rank world died or hung while importing "
                f"it: {type(err).__name__}: {err}"
            ) from None


def _with_xfail(result: PropertyResult, xfails: frozenset[str]) -> PropertyResult:
    if result.id not in xfails or result.status not in ("pass", "fail"):
        return result
    if result.status == "fail":
        return dataclasses.replace(result, status="xfail")
    return dataclasses.replace(
        result, status="xpass", reason="listed in the xfails file, but it held"
    )


def _selected(row: _Row, options: CheckOptions) -> bool:
    return not options.only or row.id in options.only


def run_check(
    options: CheckOptions,
    *,
    progress_stream: TextIO | None = None,
    pool_factory: Callable[[int], Any] | None = None,
) -> Report:
    """Run the check ``options`` describe and return its ``Report`` (the CLI's code path;
    ``main`` only adds argument parsing and printing).

    ``pool_factory(world_size)`` gives the rank pool for a world size (default:
    ``vargather.testing.get_pool`` with ``call_timeout=options.timeout``).
    Raises ``CheckUsageError`` for a usage or import error.
    """
    started = time.monotonic()
    _require_hypothesis()
    _check_json_path(options.json_path)
    cwd = ensure_import_path()
    info = resolve_impl(options.impl, options.convention, cwd, options.transports)
    impl = _implementation(info, options.grad, cwd)
    transports = info.transports
    world_sizes = tuple(sorted(options.world_sizes))
    if pool_factory is None:
        from ._pool import get_pool

        timeout = options.timeout

        def pool_factory(w: int) -> Any:
            return get_pool(w, call_timeout=timeout)

    factory = pool_factory
    selected = [r for r in _catalogue(options.grad, "unknown", transports) if _selected(r, options)]
    needed = sorted(
        {
            w
            for r in selected
            if r.initialized and _applies(r, info, options.grad, "unknown", world_sizes) is None
            for w in _worlds(r, world_sizes)
        }
    )
    progress = Progress(progress_stream, len(selected))
    try:
        if needed:
            progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
        for w in needed:
            factory(w)  # start every world now: they come up in parallel
        _preflight(info, cwd, needed, factory)
        returns = "unknown"
        if needed and any(r.id == "returned-sizes" for r in selected):
            returns = _probe_returns(impl, options.grad, needed, factory)
    except BaseException:
        progress.close()
        raise
    rows = [r for r in _catalogue(options.grad, returns, transports) if _selected(r, options)]
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
    )
    try:
        for row in rows:
            progress.start(row.id)
            reason = _applies(row, info, options.grad, returns, world_sizes)
            stopped = options.exitfirst and any(r.failed for r in report.results)
            if stopped:
                result = PropertyResult(
                    row.id, row.title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif reason is not None:
                result = PropertyResult(row.id, row.title, "n/a", reason=reason)
            elif not row.initialized and options.in_flight is None:
                result = _run_isolated(row, options, info)
            else:
                worlds = _worlds(row, world_sizes)
                result = _evaluate(row, impl, options, worlds, factory, progress)
            result = _with_xfail(result, options.xfails)
            report.results.append(result)
            progress.finish(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report


# --- entry point ---------------------------------------------------------------------


def _versions() -> dict[str, str]:
    import torch

    from . import __version__

    versions = {"vargather": __version__, "torch": str(torch.__version__)}
    try:
        import hypothesis

        versions["hypothesis"] = hypothesis.__version__
    except ImportError:
        pass
    versions["python"] = platform.python_version()
    return versions


def main(argv: Sequence[str]) -> int:
    """``python -m vargather check ...``; returns the exit status."""
    args = list(argv)
    if "-h" in args or "--help" in args:
        _parser().print_help()
        return EXIT_OK
    if "--list" in args:
        for prop_id in property_ids():
            print(prop_id)
        return EXIT_OK
    try:
        options = parse_args(args)
        report = run_check(options, progress_stream=sys.stderr if options.progress else None)
    except CheckUsageError as err:
        print(f"vargather check: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(report.render())
    sys.stdout.flush()
    if options.json_path is not None:
        report.write_json(options.json_path)
    return report.exit_status

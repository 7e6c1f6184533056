"""``python -m vargather check``: the conformance gate's command.

Where it sits: the command-line layer (``vargather._cli``), on top of the gate's
engine in the testing kit. It maps its flags to options (every flag derived from the
kit's one option schema, ``vargather.testing.schema``; the ``[tool.vargather.check]``
table of the config file gives defaults), runs ``vargather.testing.engine.run_check``
with a progress display of its own (``display.StreamProgress``), and prints the report
(``vargather.testing.results``): per property pass / fail / xfail and how many
examples ran; for each failure the minimal counterexample Hypothesis shrank to and
the ``python -m vargather repro`` command that re-runs it.

The implementation under test is ``--impl MODULE:ATTR`` (imported in the parent first,
so a typo fails at once, then inside every rank process, from the current directory
and ``PYTHONPATH``), or vargather's own ``all_gather_v`` without ``--impl``.

Exit status: 0 every property holds (xfails failed as expected), 1 a property failed
(or an xfail passed: xfails are strict), 2 a usage or import error.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Any

from vargather.testing import options as _options
from vargather.testing import schema
from vargather.testing.collectives import DEFAULT, NAMES
from vargather.testing.engine import run_check
from vargather.testing.options import CheckOptions, OptionError
from vargather.testing.progress import ProgressEvent
from vargather.testing.results import EXIT_OK, EXIT_USAGE

from . import ArgumentParser, UsageError
from .display import StreamProgress


class FlagUsageError(UsageError, _options.CheckUsageError):
    """A usage error of the command line: the kit's ``CheckUsageError`` with the
    option spelled as a flag (``--grad``)."""


def _spelled(err: _options.CheckUsageError) -> _options.CheckUsageError:
    """The engine's error with its option spelled as this command's flag."""
    if isinstance(err, OptionError):
        return FlagUsageError(err.spelled("--" + err.option))
    return err


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        error_type=FlagUsageError,
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
    for option in schema.on(schema.CLI):
        flags = ["-x", "--exitfirst"] if option.name == "exitfirst" else ["--" + option.name]
        how: dict[str, Any] = {"dest": option.field, "default": None, "help": option.help}
        if option.is_flag:
            how["action"] = "store_true"
        else:
            how["metavar"] = option.metavar
            if option.kind == "choice":
                how["choices"] = option.choices
                del how["metavar"]
        parser.add_argument(*flags, **how)
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help=(
            "read the [tool.vargather.check] table of this TOML file (default: "
            "./pyproject.toml when it exists); options on the command line override it"
        ),
    )
    parser.add_argument("--no-config", action="store_true", help="read no config file")
    parser.add_argument("--no-progress", action="store_true", help="do not show progress on stderr")
    parser.add_argument("--list", action="store_true", help="list the property ids and exit")
    return parser


def read_config(path: str) -> dict[str, object]:
    """The ``[tool.vargather.check]`` table of ``path`` (``options.read_config``), its
    errors spelled for the command line."""
    try:
        return _options.read_config(path)
    except _options.CheckUsageError as err:
        raise _spelled(err) from None


def load_xfails(path: str) -> frozenset[str]:
    """An xfails file's ids (``options.load_xfails``), its errors spelled for the
    command line."""
    try:
        return _options.load_xfails(path)
    except _options.CheckUsageError as err:
        raise _spelled(err) from None


def parse_args(argv: Sequence[str]) -> CheckOptions:
    """Parse and validate the command line into ``CheckOptions``; raises
    ``FlagUsageError`` naming the flag.

    ``--list`` and ``--help`` are handled by ``main``. Defaults come from the
    ``[tool.vargather.check]`` table of the config file; flags given override them.
    """
    args = _parser().parse_args(list(argv))
    try:
        given = {o.name: getattr(args, o.field) for o in schema.on(schema.CLI)}
        return _options.surface_options(
            schema.CLI, given, args.config, bool(args.no_config), progress=not args.no_progress
        )
    except schema.OptionValueError as err:
        raise FlagUsageError(err.spelled("--" + err.option)) from None
    except _options.CheckUsageError as err:
        raise _spelled(err) from None


# --- progress ------------------------------------------------------------------------


class _ProgressDisplay:
    """The engine's progress events shown on a stream (``display.StreamProgress``)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.display: StreamProgress | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "total":
            if self.display is None:
                self.display = StreamProgress(
                    self.stream, event.total, title="vargather check", unit="properties"
                )
            else:
                self.display.retotal(event.total)
            return
        if self.display is None:
            return
        if event.kind == "phase":
            self.display.phase(event.text)
        elif event.kind == "note":
            self.display.note(event.text)
        elif event.kind == "row":
            failed = event.result is not None and event.result.failed
            self.display.advance(event.text, alert=failed)
        elif event.kind == "close":
            self.display.close()


# --- entry point ---------------------------------------------------------------------


def _target_list(args: Sequence[str]) -> bool:
    """Whether the command line asks ``--target list`` (list the built-in targets)."""
    if "--target=list" in args:
        return True
    return any(a == "--target" and b == "list" for a, b in itertools.pairwise(args))


def main(argv: Sequence[str]) -> int:
    """``python -m vargather check ...``; returns the exit status."""
    args = list(argv)
    if "-h" in args or "--help" in args:
        _parser().print_help()
        return EXIT_OK
    if _target_list(args):
        from vargather.testing.targets import listing

        sys.stdout.write(listing())
        return EXIT_OK
    if "--list" in args:
        op = args[args.index("--op") + 1] if "--op" in args[:-1] else DEFAULT
        if op not in NAMES:
            print(f"vargather check: error: --op: invalid choice: {op!r}", file=sys.stderr)
            return EXIT_USAGE
        ids = _options.ids_of(op)
        if "--target" in args[:-1]:  # a built-in target's rows (the dtensor target's own)
            from vargather.testing import targets

            name = args[args.index("--target") + 1]
            if name not in {t.name for t in targets.TARGETS}:
                print(f"vargather check: error: --target: unknown {name!r}", file=sys.stderr)
                return EXIT_USAGE
            ids = targets.target_ids(targets.by_name(name))
        for prop_id in ids:
            print(prop_id)
        return EXIT_OK
    try:
        options = parse_args(args)
        display = _ProgressDisplay(sys.stderr) if options.progress else None
        report = run_check(options, progress=display)
    except _options.CheckUsageError as err:
        print(f"vargather check: error: {_spelled(err)}", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(report.render())
    sys.stdout.flush()
    if options.json_path is not None:
        report.timings = options.timings
        report.write_json(options.json_path)
    return report.exit_status

"""``python -m vargather check``: the conformance gate's command.

Where it sits: the command-line layer (``vargather._cli``). It parses the options and
the xfails file into ``CheckOptions``, runs the gate (``gate.run_check``: the testing
kit's one property catalogue against the implementation under test) and prints the
report (``report``): per property pass / fail / xfail and how many examples ran; for
each failure the minimal counterexample Hypothesis shrank to and the
``python -m vargather repro`` command that re-runs it.

The implementation under test is ``--impl MODULE:ATTR`` (imported in the parent first,
so a typo fails at once, then inside every rank process, from the current directory
and ``PYTHONPATH``), or vargather's own ``all_gather_v`` without ``--impl``.

Exit status: 0 every property holds (xfails failed as expected), 1 a property failed
(or an xfail passed: xfails are strict), 2 a usage or import error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vargather import CONTRACTS
from vargather.testing.properties import BATCH, property_ids
from vargather.testing.scale import DEFAULT_MAX_PAYLOAD, format_bytes

from . import ArgumentParser
from .gate import (
    CONVENTIONS,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_SEED,
    DEFAULT_SHRINK_BUDGET,
    DEFAULT_TIMEOUT,
    DEFAULT_WORLD_SIZES,
    MAX_WORLD_SIZE,
    CheckOptions,
    CheckUsageError,
    run_check,
)
from .report import EXIT_OK, EXIT_USAGE

__all__ = ["load_xfails", "main", "parse_args"]


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


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "kb": 1000, "mib": 1 << 20, "mb": 1000**2}


def _bytes(text: str) -> int:
    """``4194304``, ``4MiB``, ``512KiB``, ``2MB``: a number of bytes >= 0."""
    raw = text.strip().lower().replace(" ", "")
    digits = raw.rstrip("kimbg")
    unit = raw[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise CheckUsageError(
            f"--max-payload: expected a number of bytes like 4194304, 4MiB or 512KiB, got {text!r}"
        )
    return int(digits) * _UNITS[unit]


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        error_type=CheckUsageError,
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
        choices=CONTRACTS,
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
        "--max-payload",
        metavar="BYTES",
        type=_bytes,
        default=DEFAULT_MAX_PAYLOAD,
        help=(
            "largest shard a rank gathers in the large cases (about one case in six is "
            "sized around a payload threshold: powers of two and vargather's own "
            "transport thresholds); accepts 4194304, 4MiB, 512KiB; 0 draws small cases "
            f"only (default: {format_bytes(DEFAULT_MAX_PAYLOAD)})"
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
        max_payload=args.max_payload,
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


# --- entry point ---------------------------------------------------------------------


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

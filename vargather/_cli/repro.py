"""``python -m vargather repro 'GatherCase(...)' [--impl REF ...]``: re-run one case.

Where it sits: the command-line layer, on top of the testing kit. It is the command
that every failure report prints (``vargather.testing.runner.describe``): it parses the
case (literals only, no ``eval``), rebuilds the implementation under test from the
options the report carried (reference, call convention, contracts, transports, import
path), runs the case on a local gloo world (or in this process for
``initialized=False``) and judges it.

Exit status: 0 the case passes, 1 it fails, 2 a usage or import error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from vargather import CONTRACTS
from vargather.testing.calls import parse_call
from vargather.testing.cases import (
    COMPAT,
    CONVENTIONS,
    RETURN_KINDS,
    VARGATHER,
    Implementation,
    parse_case,
)
from vargather.testing.results import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from vargather.testing.runner import (
    ImplementationError,
    describe,
    load_callable,
    parse_impl_ref,
    run_cases,
)

from . import ArgumentParser, UsageError

__all__ = ["main"]


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m vargather repro",
        description="Re-run one property-suite case, as a failure report printed it.",
        epilog="Exit status: 0 the case passes, 1 it fails, 2 usage or import error.",
    )
    parser.add_argument(
        "case",
        nargs="+",
        help=(
            "the case as printed: GatherCase(shapes=..., ...); several: a call sequence, "
            "run in order on one world (the last is the one that failed)"
        ),
    )
    parser.add_argument(
        "--impl",
        metavar="MODULE:ATTR",
        default=None,
        help="the implementation under test, 'compat', or omit (vargather)",
    )
    parser.add_argument("--convention", default="vargather", choices=CONVENTIONS)
    parser.add_argument(
        "--contracts", default=None, help="the contracts it claims, comma-separated (default: all)"
    )
    parser.add_argument("--transports", default=None, help="transport= names it takes, or 'none'")
    parser.add_argument("--no-group", action="store_true", help="ATTR takes no group=")
    parser.add_argument(
        "--no-grad-kw", action="store_true", help="a vargather-style ATTR is called without grad="
    )
    parser.add_argument(
        "--returns", default="auto", choices=RETURN_KINDS, help="what ATTR returns (default: auto)"
    )
    parser.add_argument(
        "--ctor-dim",
        action="store_true",
        help="MODULE:ATTR(key=literal, ...) is constructed with dim= too",
    )
    parser.add_argument(
        "--call",
        metavar="(ARGS)",
        default=None,
        help="the call template ATTR is called with, e.g. '(x, group=group)'",
    )
    parser.add_argument("--emulate", default=None, choices=("nccl",), help="emulate a backend")
    parser.add_argument(
        "--path", action="append", default=[], help="prepend to sys.path (repeatable)"
    )
    return parser


def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None or text.strip() == "none":
        return None
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _implementation(args: argparse.Namespace) -> Implementation:
    contracts = _names(args.contracts) or CONTRACTS
    transports = _names(args.transports)
    if args.impl is None:
        if args.transports is None:
            transports = VARGATHER.transports
        return Implementation(
            None,
            contracts=contracts,
            transports=transports,
            name="vargather",
            emulate=args.emulate,
        )
    if args.impl == "compat":
        return COMPAT
    paths = tuple(os.path.abspath(p) for p in args.path) or (os.getcwd(),)
    load_callable(args.impl, paths)  # fail here, with a clear message, not in every rank
    if args.call is not None:
        parse_call(args.call)  # a ValueError: a usage error
    _, ctor = parse_impl_ref(args.impl)
    return Implementation(
        args.impl,
        convention=args.convention,
        contracts=contracts,
        transports=transports,
        search_path=paths,
        name=args.impl,
        takes_group=not args.no_group,
        takes_grad=not args.no_grad_kw,
        returns=args.returns,
        ctor_kwargs=ctor,
        ctor_takes_dim=args.ctor_dim,
        emulate=args.emulate,
        call=args.call,
    )


def main(argv: Sequence[str]) -> int:
    """``python -m vargather repro ...``; returns the exit status."""
    args_list = list(argv)
    if "-h" in args_list or "--help" in args_list:
        _parser().print_help()
        return EXIT_OK
    try:
        args = _parser().parse_args(args_list)
        cases = [parse_case(text) for text in args.case]
        impl = _implementation(args)
    except (UsageError, ValueError, SyntaxError) as err:
        # ImplementationError is a ValueError: a bad --impl is a usage error too.
        prefix = "--impl " if isinstance(err, ImplementationError) else ""
        print(f"vargather repro: error: {prefix}{err}", file=sys.stderr)
        return EXIT_USAGE
    print(describe(cases[-1], impl, before=cases[:-1]))
    verdicts = run_cases(cases, impl)
    if all(v.ok for v in verdicts):
        print("PASSED")
        return EXIT_OK
    print("FAILED")
    for i, verdict in enumerate(verdicts):
        if verdict.ok:
            continue
        if len(verdicts) > 1:
            print(f"  call {i + 1}:")
        if verdict.not_run:
            print(f"  - {verdict.not_run}")
        for failure in verdict.failures:
            print("  - " + failure.render().replace("\n", "\n    "))
    return EXIT_FAILED

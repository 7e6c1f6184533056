"""``python -m vargather repro [--op NAME] 'CASE(...)' ... [--impl REF ...]``: re-run a case.

Where it sits: the command-line layer, on top of the testing kit. It is the one
command every failing row of every collective prints (``reproduce:``): it parses the
cases (literals only, no ``eval``: ``GatherCase``/``GatherMisuseCase`` for
``all_gather_v``, the ``--op`` catalogue's case class or ``MisuseCase`` otherwise),
runs them in order on a local gloo world (or in this process when uninitialized) and
judges them. A gather case carries the implementation under test in the options the
report printed (reference, call convention, contracts, transports, import path); a
family case names it itself (``impl=``, ``call=``, ``emulate=``).

Exit status: 0 the case passes, 1 it fails, 2 a usage or import error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from vargather import CONTRACTS
from vargather.testing.calls import parse_call
from vargather.testing.cases import (
    COMPAT,
    CONVENTIONS,
    RETURN_KINDS,
    VARGATHER,
    Implementation,
    parse_case,
    parse_literal,
)
from vargather.testing.catalogues import catalogue_of
from vargather.testing.collectives import DEFAULT, NAMES
from vargather.testing.importer import ImplementationError, load_callable, parse_impl_ref
from vargather.testing.judge import Failure
from vargather.testing.results import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from vargather.testing.runner import Verdict, describe, describe_coalesced, run_cases, run_coalesced

from . import ArgumentParser, UsageError


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
            "the case as printed: GatherCase(shapes=..., ...), or the --op collective's; "
            "several: a call sequence, run in order on one world (the last is the one "
            "that failed)"
        ),
    )
    parser.add_argument(
        "--coalesced",
        action="store_true",
        help="the gather cases are the tensors of ONE all_gather_v_coalesced call",
    )
    parser.add_argument(
        "--op", default=DEFAULT, choices=NAMES, help=f"the collective (default: {DEFAULT})"
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
        if args.op != DEFAULT or args.case[0].lstrip().startswith("GatherMisuseCase("):
            return _rerun(args)
        cases = [parse_case(text) for text in args.case]
        impl = _implementation(args)
    except (UsageError, ValueError, SyntaxError) as err:
        # ImplementationError is a ValueError: a bad --impl is a usage error too.
        prefix = "--impl " if isinstance(err, ImplementationError) else ""
        print(f"vargather repro: error: {prefix}{err}", file=sys.stderr)
        return EXIT_USAGE
    if args.coalesced:
        print(describe_coalesced(cases, len(cases) - 1, impl))
        return _verdicts(run_coalesced(cases, impl))
    print(describe(cases[-1], impl, before=cases[:-1]))
    return _verdicts(run_cases(cases, impl))


_GATHER_ONLY = ("impl", "convention", "contracts", "transports", "call", "emulate", "path")


def _rerun(args: argparse.Namespace) -> int:
    """A case of another collective than the gather's, or a gather misuse: the case
    names everything (its implementation too), the catalogue parses and runs it."""
    from vargather.testing.pool import get_pool
    from vargather.testing.resolve import ensure_import_path

    given = [f"--{n}" for n in _GATHER_ONLY if getattr(args, n) not in (None, [], "vargather")]
    if given:
        raise UsageError(f"{', '.join(given)}: the case names its implementation itself")
    if args.op == DEFAULT:  # a misuse of the gather
        from vargather.testing.misuse import GatherMisuseCase, check_misuse

        ensure_import_path()
        cases = [parse_literal(text, [GatherMisuseCase]) for text in args.case]
        print("\n".join(f"misuse: {c!r}" for c in cases))
        failures = [check_misuse(get_pool(c.world_size), c) for c in cases]
        return _verdicts([_Judged(tuple(f)) for f in failures])
    from vargather.testing.family_catalogue import FamilyCatalogue

    catalogue = catalogue_of(args.op)
    assert isinstance(catalogue, FamilyCatalogue)  # every catalogue but the gather's
    cases = [catalogue.parse(text) for text in args.case]
    ensure_import_path()
    print("\n".join(f"call {i + 1}: {c!r}" for i, c in enumerate(cases)))
    return _verdicts(catalogue.rerun(cases, get_pool))


class _Judged(NamedTuple):
    failures: tuple[Failure, ...]
    not_run: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


def _verdicts(verdicts: Sequence[Verdict | _Judged]) -> int:
    """Print the verdicts; the exit status."""
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

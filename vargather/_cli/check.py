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
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

from vargather.testing.cases import DTYPE_NAMES, RETURN_KINDS, SIZES_SCOPES
from vargather.testing.properties import BATCH, property_ids

from . import ArgumentParser
from .gate import (
    CONVENTIONS,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_SEED,
    DEFAULT_SHRINK_BUDGET,
    DEFAULT_TIMEOUT,
    DEFAULT_WORLD_SIZES,
    EMULATIONS,
    GRADS,
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
        choices=GRADS,
        default="sum",
        help=(
            "the gradient contract the implementation claims, or 'none' (not "
            "differentiable: the gradient rows do not apply) (default: sum)"
        ),
    )
    parser.add_argument(
        "--dims",
        metavar="D,D,...",
        default=None,
        help="the literal dim values it supports, e.g. 0 or 0,-1 (default: every dim)",
    )
    parser.add_argument(
        "--requires-init",
        action="store_true",
        default=False,
        help="it needs an initialized torch.distributed (the uninitialized row does not apply)",
    )
    parser.add_argument(
        "--sizes",
        choices=SIZES_SCOPES,
        default="any",
        help=(
            "how it takes sizes: 'any' none, a list or a tensor; 'tensor' none or a 1-d int64 "
            "tensor; 'required' always the true sizes; 'never' called without (default: any)"
        ),
    )
    parser.add_argument(
        "--returns",
        choices=RETURN_KINDS,
        default="auto",
        help=(
            "what it returns: 'auto' a tensor or (tensor, sizes|layout); 'tensor'; 'tuple' "
            "(tensor, sizes|layout); 'list' per-rank tensors, concatenated along dim by "
            "the gate (default: auto)"
        ),
    )
    parser.add_argument(
        "--emulate",
        choices=EMULATIONS,
        default=None,
        help=(
            "run the ranks with torch.distributed's collectives intercepted to behave as "
            "this backend does where gloo differs (see docs/conformance.md)"
        ),
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        default=False,
        help="an 'unsupported' row (the backend refuses a dtype) fails the check too",
    )
    parser.add_argument(
        "--db",
        metavar="DIR",
        default=None,
        help="keep Hypothesis's example database in DIR (default: nothing is written)",
    )
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
        metavar="N",
        type=int,
        default=DEFAULT_SHRINK_BUDGET,
        help=(
            "examples a property may run shrinking a failure to a minimal counterexample "
            f"(a count, so every run shrinks alike) (default: {DEFAULT_SHRINK_BUDGET})"
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


CONFIG_TABLE: Final = ("tool", "vargather", "check")
_CONFIG_KEYS: Final = {
    # key in [tool.vargather.check] -> (argparse dest, kind)
    "impl": ("impl", str),
    "grad": ("grad", str),
    "dims": ("dims", "ints"),
    "world-sizes": ("world_sizes", "ints"),
    "requires-init": ("requires_init", bool),
    "sizes": ("sizes", str),
    "returns": ("returns", str),
    "convention": ("convention", str),
    "transports": ("transports", "names"),
    "emulate": ("emulate", str),
    "strict": ("strict", bool),
    "xfails": ("xfails", str),
    "max-examples": ("max_examples", int),
    "seed": ("seed", int),
    "timeout": ("timeout", float),
    "shrink-budget": ("shrink_budget", int),
}


def _load_toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the backport on 3.10
        import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]  # the backport, absent on 3.11+
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
    except OSError as err:
        raise CheckUsageError(f"--config: cannot read {path!r}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise CheckUsageError(f"--config: {path} is not valid TOML: {err}") from None
    return data


def read_config(path: str) -> dict[str, object]:
    """The ``[tool.vargather.check]`` table of ``path`` as argparse defaults (dest ->
    value, in the command line's text form); unknown keys and wrong types are usage
    errors. A file without the table gives ``{}``."""
    table: object = _load_toml(path)
    for key in CONFIG_TABLE:
        table = table.get(key, {}) if isinstance(table, dict) else None
    where = f"{path} [{'.'.join(CONFIG_TABLE)}]"
    if not isinstance(table, dict):
        raise CheckUsageError(f"--config: {where} must be a table")
    defaults: dict[str, object] = {}
    for key, value in table.items():
        if key not in _CONFIG_KEYS:
            raise CheckUsageError(
                f"--config: {where}: unknown key {key!r}; known keys: "
                + ", ".join(sorted(_CONFIG_KEYS))
            )
        dest, kind = _CONFIG_KEYS[key]
        ok: bool
        if kind in ("ints", "names"):
            item = int if kind == "ints" else str
            if isinstance(value, list) and all(
                isinstance(v, item) and not isinstance(v, bool) for v in value
            ):
                value = ",".join(str(v) for v in value)
                ok = True
            else:
                ok = isinstance(value, str) or (kind == "ints" and type(value) is int)
                value = str(value)
        elif kind is bool:
            ok = isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = type(value) is int
        else:
            ok = isinstance(value, str)
        if not ok:
            raise CheckUsageError(f"--config: {where}: {key} = {value!r} has the wrong type")
        if dest == "xfails" and isinstance(value, str) and not os.path.isabs(value):
            value = os.path.join(os.path.dirname(os.path.abspath(path)), value)
        defaults[dest] = value
    return defaults


def _config_defaults(argv: Sequence[str]) -> tuple[dict[str, object], str | None]:
    """The config file's defaults: ``--config FILE``, else ``./pyproject.toml`` if it
    exists, none with ``--no-config``."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    pre.add_argument("--no-config", action="store_true")
    known, _ = pre.parse_known_args(list(argv))
    if known.no_config:
        return {}, None
    path = known.config
    if path is None:
        if not os.path.isfile("pyproject.toml"):
            return {}, None
        path = "pyproject.toml"
    defaults = read_config(path)
    return defaults, (os.path.abspath(path) if defaults else None)


def _dims(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        dims = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    except ValueError:
        raise CheckUsageError(
            f"--dims: expected comma-separated integers like 0,-1, got {text!r}"
        ) from None
    if not dims:
        raise CheckUsageError(f"--dims: expected at least one dim, got {text!r}")
    return dims


def parse_args(argv: Sequence[str]) -> CheckOptions:
    """Parse and validate the command line; raises ``CheckUsageError``.

    ``--list`` and ``--help`` are handled by ``main``. Defaults come from the
    ``[tool.vargather.check]`` table of the config file (see ``_config_defaults``);
    options given on the command line override them.
    """
    defaults, config_path = _config_defaults(argv)
    parser = _parser()
    parser.set_defaults(**defaults)
    args = parser.parse_args(list(argv))
    xfails: frozenset[str] = frozenset()
    if args.xfails is not None:
        xfails = load_xfails(args.xfails)
    only = tuple(p.strip() for p in str(args.only).split(",") if p.strip())
    return CheckOptions(
        impl=args.impl,
        grad=args.grad,
        dims=_dims(args.dims),
        requires_init=bool(args.requires_init),
        sizes=args.sizes,
        returns=args.returns,
        emulate=args.emulate,
        strict=bool(args.strict),
        db=args.db,
        config_path=config_path,
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
        prop, colon, dtype = text.partition(":")
        if colon and prop in known and dtype in DTYPE_NAMES:
            ids.add(text)
            continue
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

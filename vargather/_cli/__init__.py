"""``python -m vargather {demo,check,repro,bench}``: the command line.

Where it sits: the outermost layer, on top of the gather library (``vargather``) and
the testing kit (``vargather.testing``). Each command is a module of this package that
parses its options and calls the library or the kit; it is imported only when chosen,
so ``--help`` stays fast and a missing optional dependency (the ``test`` extra for
``check`` and ``repro``) only affects its own command, which then exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

from vargather import VarGatherError, __version__


class UsageError(VarGatherError, ValueError):
    """A command cannot start: a bad option or argument. Printed, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad option raises ``error_type`` (a ``UsageError``) instead of
    exiting, so a command reports it its own way (and tests can catch it)."""

    def __init__(
        self, *args: Any, error_type: type[UsageError] = UsageError, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.error_type = error_type

    def error(self, message: str) -> NoReturn:
        raise self.error_type(f"{message}\n\n{self.format_usage().strip()}")


COMMANDS: Final = {
    "demo": "gather ragged tensors on a local multi-process gloo world and print them",
    "check": "run vargather's property suite against an implementation (yours or ours)",
    "repro": "re-run one counterexample that `check` or the test suite printed",
    "bench": "time vargather against the seed and torch's collectives on a local world",
}

_USAGE: Final = (
    "usage: python -m vargather {"
    + ",".join(COMMANDS)
    + "} [options]\n\n"
    + "\n".join(f"  {name:<7} {what}" for name, what in COMMANDS.items())
    + "\n\nRun `python -m vargather COMMAND --help` for a command's options;"
    + " `python -m vargather --version` for the version."
)


def torch_version() -> str:
    """The installed torch's version, from its package metadata."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _command(name: str) -> Callable[[Sequence[str]], int]:
    module = importlib.import_module(f"{__name__}.{name}")
    entry: Callable[[Sequence[str]], int] = module.main
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a command; returns its exit status (2: usage error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        print(f"vargather {__version__} (torch {torch_version()})")
        return 0
    if args[0] not in COMMANDS:
        print(f"vargather: unknown command {args[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    try:
        command = _command(args[0])
    except ImportError as err:
        if "vargather[" not in str(err) and err.name != "hypothesis":
            raise  # not a missing optional dependency: a bug, shown as such
        print(f"vargather {args[0]}: error: {err}", file=sys.stderr)
        return 2
    return command(args[1:])

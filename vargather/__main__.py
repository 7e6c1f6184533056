"""``python -m vargather {demo,check,bench}``: the command-line entry point.

Each subcommand lives in its own private module and is imported only when chosen, so
``--help`` stays fast and a missing optional dependency only affects its command.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

_USAGE = """usage: python -m vargather {demo,check,bench} [options]

  demo    gather ragged tensors on a local multi-process gloo world and print them
  check   run vargather's property suite against an implementation (yours or ours)
  bench   time vargather against the seed and torch's collectives on a local world

Run `python -m vargather COMMAND --help` for a command's options."""


def _command(name: str) -> Callable[[Sequence[str]], int] | None:
    if name == "demo":
        from ._demo import main as demo_main

        return demo_main
    if name == "check":
        from ._check import main as check_main

        return check_main
    if name == "bench":
        from ._bench import main as bench_main

        return bench_main
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if args else 2
    command = _command(args[0])
    if command is None:
        print(f"vargather: unknown command {args[0]!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())

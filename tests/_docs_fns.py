"""Rank-side half of tests/test_docs.py: run one ```pycon block of the docs as a doctest.

Module-level, so it pickles into the rank processes of ``vargather.testing``'s pools;
the same function runs a block without a world (``ctx=None``) in the test process.
"""

from __future__ import annotations

import doctest
from typing import NamedTuple

from vargather.testing import RankContext

#: doctest flags for every block: ``...`` matches anything (a traceback's middle, a path).
OPTIONFLAGS = doctest.ELLIPSIS


class PyconBlock(NamedTuple):
    source: str  # the block's lines, fence and common indentation removed
    filename: str  # relative to the repository root, for the report
    lineno: int  # 1-based line of the block's first source line in that file
    compare_ranks: tuple[int, ...] | None  # ranks whose output is compared; None: every rank


class DoctestResult(NamedTuple):
    attempted: int
    failed: int
    report: str  # doctest's own failure report ("File README.md, line N ... Expected/Got")


class _AcceptAnything(doctest.OutputChecker):
    """The checker of a rank whose output the block's marker does not compare."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return True


def run_pycon(ctx: RankContext | None, block: PyconBlock) -> DoctestResult:
    """Run ``block`` as a doctest in a fresh namespace; on a rank when ``ctx`` is given."""
    compared = ctx is None or block.compare_ranks is None or ctx.rank in block.compare_ranks
    test = doctest.DocTestParser().get_doctest(
        block.source,
        {"__name__": "__docs__"},
        f"{block.filename}:{block.lineno}",
        block.filename,
        block.lineno - 1,  # doctest adds the example's 0-based line within the block
    )
    runner = doctest.DocTestRunner(
        checker=None if compared else _AcceptAnything(),
        verbose=False,
        optionflags=OPTIONFLAGS,
    )
    out: list[str] = []
    result = runner.run(test, out=out.append, clear_globs=True)
    return DoctestResult(result.attempted, result.failed, "".join(out))

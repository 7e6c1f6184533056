"""The conformance gate's engine under the command line's old names.

Where it sits: the command-line layer (``vargather._cli``). The engine lives in the
testing kit: the options model (``vargather.testing.options``), implementation
resolution (``vargather.testing.resolve``), the property evaluation
(``vargather.testing.evaluate``), ``run_check`` (``vargather.testing.engine``), the
verdict rules (``vargather.testing.verdict``) and
the results (``vargather.testing.results``). This module re-exports them for callers
of the old ``vargather._cli.gate`` names, with errors spelled as the command line's
flags (``--grad``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vargather.testing import resolve as _resolve
from vargather.testing.cases import Implementation
from vargather.testing.engine import run_check
from vargather.testing.evaluate import CRASH_SHRINK_BUDGET, evaluate, render_failures
from vargather.testing.options import (
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
)
from vargather.testing.pool import RankPool
from vargather.testing.properties import Property
from vargather.testing.resolve import ImplInfo, load_impl, resolve_options_impl
from vargather.testing.results import PropertyResult

from .check import _spelled
from .report import Progress

__all__ = [
    "CONVENTIONS",
    "CRASH_SHRINK_BUDGET",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_SEED",
    "DEFAULT_SHRINK_BUDGET",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORLD_SIZES",
    "EMULATIONS",
    "GRADS",
    "MAX_WORLD_SIZE",
    "CheckOptions",
    "CheckUsageError",
    "ImplInfo",
    "Implementation",
    "load_impl",
    "render_failures",
    "resolve_impl",
    "resolve_options_impl",
    "run_check",
]


def resolve_impl(
    ref: str | None,
    convention: str = "auto",
    cwd: str | None = None,
    transports: str = "auto",
    *,
    sizes: str = "any",
    grad: str = "sum",
    call: str | None = None,
) -> ImplInfo:
    """``vargather.testing.resolve.resolve_impl``, its errors spelled as flags."""
    try:
        return _resolve.resolve_impl(
            ref, convention, cwd, transports, sizes=sizes, grad=grad, call=call
        )
    except CheckUsageError as err:
        raise _spelled(err) from None


def _evaluate(
    prop: Property,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    """One property's Hypothesis run (``evaluate.evaluate``), shown on ``progress``."""
    del progress  # the engine reports through callbacks; this display shows nothing
    return evaluate(prop, options, world_sizes, factory)

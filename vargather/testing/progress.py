"""The gate's progress events: what the engine tells a surface while a check runs.

Where it sits: in the gate's engine, beneath ``evaluate`` and ``engine`` (which emit
the events). Each surface passes its own callback to ``engine.run_check``: the command
line shows the events on stderr, the pytest plugin passes none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .results import PropertyResult


@dataclass(frozen=True)
class ProgressEvent:
    """What the engine is doing, for a surface to show: ``kind`` is ``phase`` (``text``
    says what starts), ``note`` (a detail of the current row), ``total`` (the number
    of rows is now ``total``), ``row`` (``result`` is done; ``text`` its line) or
    ``close`` (the run is over)."""

    kind: str
    text: str = ""
    total: int = 0
    result: PropertyResult | None = None


ProgressCallback = Callable[[ProgressEvent], None]


class Progress:
    """The engine's side of the progress callback (nothing when there is none)."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        self.retotal(total)

    def _emit(self, event: ProgressEvent) -> None:
        if self.callback is not None:
            self.callback(event)

    def phase(self, text: str) -> None:
        self._emit(ProgressEvent("phase", text))

    def note(self, text: str) -> None:
        self._emit(ProgressEvent("note", text))

    def retotal(self, total: int) -> None:
        self._emit(ProgressEvent("total", total=total))

    def row(self, result: PropertyResult) -> None:
        self._emit(ProgressEvent("row", result.progress_line(), result=result))

    def close(self) -> None:
        self._emit(ProgressEvent("close"))

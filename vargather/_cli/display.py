"""The command line's progress display on a stream, for ``check`` and ``bench``.

Where it sits: in the command-line layer (``vargather._cli``), below the commands.
``check`` shows the engine's progress events (``vargather.testing.progress``) here;
``bench`` shows its runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


# --- progress---------------------------------------------------------------------


class StreamProgress:
    """Progress on a stream (stderr) for ``check`` and ``bench``: a live ``rich`` bar when
    the stream is a terminal and rich is installed, plain lines otherwise, nothing when
    ``stream`` is None.

    ``phase`` says what is going on (plain: a line, at most one per ``throttle``
    seconds); ``note`` adds a detail to the live bar only; ``advance`` counts one unit
    done (plain: ``[done/total] line``; live: the line printed only when ``alert``).
    """

    def __init__(
        self, stream: TextIO | None, total: int, *, title: str, unit: str, throttle: float = 0.0
    ) -> None:
        self.stream = stream
        self.total = total
        self.done = 0
        self.throttle = throttle
        self._last_plain = float("-inf")
        self._live: RichProgress | None = None
        self._task: TaskID | None = None
        if stream is not None and stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as Rich
            except ImportError:
                pass
            else:
                self._live = Rich(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    TextColumn(f"{{task.completed}}/{{task.total}} {unit}"),
                    TimeElapsedColumn(),
                    TextColumn("{task.fields[note]}"),
                    console=Console(file=stream),
                    transient=True,
                )
                self._live.start()
                self._task = self._live.add_task(title, total=total, note="")

    def retotal(self, total: int) -> None:
        """The number of steps turned out different (a property split into rows)."""
        self.total = total
        if self._live is not None and self._task is not None:
            self._live.update(self._task, total=total)

    def phase(self, text: str) -> None:
        if self._live is not None and self._task is not None:
            self._live.update(self._task, description=text, note="")
        elif self.stream is not None and time.monotonic() - self._last_plain >= self.throttle:
            self._last_plain = time.monotonic()
            print(text, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self._live is not None and self._task is not None:
            self._live.update(self._task, note=text)

    def advance(self, line: str, *, alert: bool = False) -> None:
        self.done += 1
        if self._live is not None and self._task is not None:
            self._live.update(self._task, completed=self.done)
            if alert:
                self._live.console.print(f"[red]{line}")
            return
        if self.stream is None:
            return
        self._last_plain = time.monotonic()
        width = len(str(self.total))
        print(f"[{self.done:>{width}}/{self.total}] {line}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

"""The isolated row: a property whose cases run in the checking process itself.

Where it sits: in the gate's engine, beneath ``evaluate`` and ``engine``. The
``uninitialized`` row runs its cases without torch.distributed, in the process that
runs them; so that a crash or a hang of the implementation is that row's failure and
not the checker's, ``engine`` runs it in a child process, ``python -m
vargather.testing.engine OPTIONS.json``, whose options are the parent's serialized as
JSON (``CheckOptions.to_json``: no flag spelled again), or the same forked from this
process's running forkserver (``_ForkedChild``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

from .options import DEFAULT_TIMEOUT, CheckOptions
from .pool import _describe_exit
from .properties import Property
from .resolve import ImplInfo
from .results import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PropertyFailure, PropertyResult

CHILD_MODULE: Final = "vargather.testing.engine"
"""The module the child runs (``python -m``): the engine's ``child_main``."""


HUNG_EXIT: Final = 75  # the child's exit status when its watchdog fired


@contextlib.contextmanager
def in_flight(path: str | None, batch: Sequence[Any], row: Property) -> Iterator[None]:
    """In the child that runs the in-process row: record ``batch`` in ``path`` while it
    runs (so the parent can name the case if this process dies) and exit with
    ``HUNG_EXIT`` if it does not finish within the timeout the parent set."""
    if path is None:
        yield
        return
    record = {
        "cases": [row.case_data(c) for c in batch],
        "reproduction": row.describe(batch, 0) if batch else None,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)
    timeout = float(os.environ.get(_CHILD_TIMEOUT_ENV, DEFAULT_TIMEOUT))
    watchdog = threading.Timer(timeout, os._exit, args=(HUNG_EXIT,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()


_CHILD_TIMEOUT_ENV: Final = "VARGATHER_CHECK_BATCH_TIMEOUT"


class IsolatedRun:
    """A row's child check process, started and not yet waited for: the engine starts
    it before the rows that run on gloo worlds, so that the child's interpreter start
    and its cases overlap with theirs instead of adding to them; ``result()`` waits for
    it, ``cancel()`` kills it."""

    def __init__(self, row: Property, options: CheckOptions, info: ImplInfo) -> None:
        self.row = row
        self.options = options
        self.started = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="vargather-check-")
        tmp = self._tmp.name
        self.report_path = os.path.join(tmp, "report.json")
        self.in_flight = os.path.join(tmp, "in-flight.json")
        options_path = os.path.join(tmp, "options.json")
        # The child's options: the parent's, resolved (the convention and transports it
        # picked), for this row alone; xfails stay with the parent.
        transports = "none" if info.transports is None else ",".join(info.transports)
        child = dataclasses.replace(
            options,
            only=(row.id,),
            convention="auto" if info.call is not None else info.convention,
            transports=("auto" if info.call is not None else transports)
            if info.ref is not None
            else options.transports,
            json_path=self.report_path,
            progress=False,
            in_flight=self.in_flight,
            xfails=frozenset(),
            xfails_path=None,
            exitfirst=False,
            config_path=None,
        )
        with open(options_path, "w", encoding="utf-8") as f:
            json.dump(child.to_json(), f)
        command = [sys.executable, "-m", CHILD_MODULE, options_path]
        env = {**os.environ, _CHILD_TIMEOUT_ENV: str(options.timeout)}
        self._stderr_path = os.path.join(tmp, "stderr.txt")
        with open(self._stderr_path, "w", encoding="utf-8") as stderr:
            self.proc: subprocess.Popen[bytes] | _ForkedChild
            if _forkserver_running():
                self.proc = _ForkedChild(command, env, self._stderr_path)
            else:  # (the child keeps its own copy of the file descriptor)
                self.proc = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )

    def cancel(self) -> None:
        """Kill the child (its row will not be reported) and remove its files."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._tmp.cleanup()

    def result(self) -> PropertyResult:
        """Wait for the child and read its row's result (a failure of the row if the
        child hung, crashed or could not run)."""
        try:
            options, started = self.options, self.started
            # Backstop only: the child's own watchdog reports a hung batch after --timeout.
            backstop = 120.0 + 2 * options.timeout + options.shrink_budget + options.max_examples
            try:
                status = self.proc.wait(timeout=max(1.0, backstop - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                what = f"the child check process did not finish within {backstop:g} s"
                return self._failure("hang", what)
            with open(self._stderr_path, encoding="utf-8", errors="replace") as f:
                tail = "\n".join(f.read().strip().splitlines()[-20:])
            if status in (EXIT_OK, EXIT_FAILED) and os.path.exists(self.report_path):
                with open(self.report_path, encoding="utf-8") as f:
                    data = json.load(f)
                (result,) = [PropertyResult.from_json(p) for p in data["properties"]]
                return dataclasses.replace(result, seconds=time.monotonic() - started)
            if status == HUNG_EXIT:
                what = f"a batch did not finish within --timeout={options.timeout:g} s"
                return self._failure("hang", what)
            if status < 0:
                what = f"the process running it was {_describe_exit(status)}"
                return self._failure("crash", what, tail)
            what = f"the child check process exited with status {status}"
            return self._failure("checker" if status == EXIT_USAGE else "crash", what, tail)
        finally:
            self._tmp.cleanup()

    def _failure(self, kind: str, what: str, stderr: str = "") -> PropertyResult:
        case: dict[str, Any] | None = None
        reproduction: str | None = None
        cases = 0
        try:
            with open(self.in_flight, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = None
        if record is not None and record["cases"]:
            cases = len(record["cases"])
            case = record["cases"][0]
            reproduction = record["reproduction"]
            what += f", running a batch of {cases} case(s) (the first is shown)"
        message = f"torch.distributed not initialized, in a child process: {what}"
        if stderr:
            message += f"\nits stderr:\n{stderr}"
        return PropertyResult(
            self.row.id,
            self.row.title,
            "fail",
            cases=cases,
            seconds=time.monotonic() - self.started,
            failure=PropertyFailure(kind, message, case, reproduction, shrunk=False, aspect="call"),
        )


def _forkserver_running() -> bool:
    """Whether this process's forkserver (the one its gloo worlds fork from, torch
    already imported) is running: the child is then forked from it instead of started
    as a fresh interpreter that imports torch (seconds of CPU). Read from
    multiprocessing's private state: guarded."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    return (
        "forkserver" in multiprocessing.get_all_start_methods()
        and getattr(server, "_forkserver_pid", None) is not None
    )


class _ForkedChild:
    """The row's child forked from the running forkserver, with the part of
    ``subprocess.Popen``'s interface ``IsolatedRun`` uses. It runs ``child_main`` as
    ``python -m vargather.testing.engine`` would: this process's environment (``env``;
    multiprocessing itself gives it this process's working directory and ``sys.path``),
    its stdout discarded and its stderr in ``stderr_path``, and its exit status that of
    the check (a signal's, negated, when one killed it)."""

    def __init__(self, args: list[str], env: dict[str, str], stderr_path: str) -> None:
        self.args = args
        context = multiprocessing.get_context("forkserver")
        self._process = context.Process(
            target=_forked_main,
            args=(args[-1], stderr_path, env),
            name="vargather-check-isolated-row",
        )
        self._process.start()

    def poll(self) -> int | None:
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


def _forked_main(options_path: str, stderr_path: str, env: dict[str, str]) -> None:
    """In the forked child: take on the parent's environment (the server's is the one it
    started with), send stdout nowhere and stderr to ``stderr_path``, run the check,
    exit with its status."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_APPEND), 2)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [CHILD_MODULE, options_path]
    try:  # as python -m CHILD_MODULE (the engine sits above this module: not imported)
        runpy.run_module(CHILD_MODULE, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as done:
        code = done.code
        status = 0 if code is None else code if isinstance(code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

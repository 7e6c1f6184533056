"""The arrival census's writer thread (``vargather._census``), in one process with
stand-in stores: it coalesces (only a group's latest pending arrival is written), the
failure path writes this rank's own arrival at once, a forked child starts its own
writer, and a store that raises is not asked again (the caller never sees it). The
census's verdicts on real gloo worlds are tests/test_faults.py's and test_pool.py's."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from vargather import _census


class RecordingStore:
    """A store that records every ``set``; ``gate``, when given, holds each ``set``
    until it is set (so a test can pile arrivals up behind a write in flight)."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.sets: list[tuple[str, str]] = []
        self.gate = gate
        self.fail = fail
        self.entered = threading.Event()

    def set(self, key: str, value: str) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise RuntimeError("store down")
        self.sets.append((key, value))


def _arrive(writer: _census._Writer, state: _census._GroupArrivals, what: str) -> None:
    """What ``_Arrivals.arrive`` does once it has the group's state."""
    state.count += 1
    state.latest = value = f"{state.count} {what}"
    writer.submit(state, state.count, value)


def _wait_for(cond: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.001)
    return False


def _write_in_flight(
    key: str,
) -> tuple[threading.Event, RecordingStore, _census._GroupArrivals, _census._Writer]:
    """A writer whose first write (arrival 1, ``"a"``) is in flight, held by the gate
    until it is set: (gate, store, the group's state, writer)."""
    gate = threading.Event()
    store = RecordingStore(gate)
    state = _census._GroupArrivals(store, key)
    writer = _census._Writer()
    _arrive(writer, state, "a")
    assert store.entered.wait(10)
    return gate, store, state, writer


def test_the_writer_writes_off_the_calling_thread_and_coalesces() -> None:
    gate, store, state, writer = _write_in_flight("vargather/arrival/0")
    caller = threading.current_thread()
    for what in ("b", "c", "d"):  # piled up behind it: only the last is written
        _arrive(writer, state, what)
    assert writer._thread is not None
    assert writer._thread is not caller
    gate.set()
    assert _wait_for(lambda: state.written == 4)
    assert store.sets == [("vargather/arrival/0", "1 a"), ("vargather/arrival/0", "4 d")]


def test_at_exit_the_writer_ends_after_its_write_in_flight_and_later_writes_are_direct() -> None:
    gate, store, state, writer = _write_in_flight("k")
    thread = writer._thread
    assert thread is not None
    _arrive(writer, state, "b")  # pending: dropped at exit
    stopping = threading.Thread(target=writer.stop)
    stopping.start()
    gate.set()
    stopping.join(10)
    assert not thread.is_alive()  # stop() returned after the thread ended
    assert store.sets == [("k", "1 a")]
    _arrive(writer, state, "c")  # after stop: on the calling thread, at once
    assert writer._thread is None
    assert store.sets == [("k", "1 a"), ("k", "3 c")]


def test_the_census_writer_is_stopped_at_exit() -> None:
    # Registered before vargather is imported, so it runs after vargather's own handler.
    script = (
        "import atexit\n"
        "def check():\n"
        "    from vargather import _census\n"
        "    print('closing', _census.ARRIVALS.writer._closing)\n"
        "atexit.register(check)\n"
        "from vargather import _census\n"
        "print('closing', _census.ARRIVALS.writer._closing)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["closing", "False", "closing", "True"], proc.stdout


def test_the_failure_path_writes_its_own_arrival_at_once() -> None:
    gate, store, state, writer = _write_in_flight("k")
    _arrive(writer, state, "b")  # pending behind the held write
    flushed = threading.Thread(target=state.flush)
    flushed.start()
    gate.set()
    flushed.join(10)
    # flush returned with the latest value written (after the one in flight), and the
    # writer's own copy of it, now stale, is skipped: the key never goes back
    assert store.sets[-1] == ("k", "2 b")
    assert state.written == 2
    assert writer.idle(10)
    time.sleep(0.05)
    assert store.sets == [("k", "1 a"), ("k", "2 b")]


def test_a_store_that_raises_is_not_asked_again_and_others_still_are() -> None:
    bad = RecordingStore(fail=True)
    good = RecordingStore()
    broken = _census._GroupArrivals(bad, "k")
    fine = _census._GroupArrivals(good, "k")
    writer = _census._Writer()
    _arrive(writer, broken, "a")  # the caller never sees the store's error
    assert _wait_for(lambda: broken.store is None)
    _arrive(writer, broken, "b")
    _arrive(writer, fine, "a")
    assert _wait_for(lambda: fine.written == 1)
    assert writer._thread is not None
    assert writer._thread.is_alive()
    broken.flush()  # nothing: the store is off
    assert bad.sets == []
    assert good.sets == [("k", "1 a")]


def _child(conn: Any) -> None:
    """In a forked child: an arrival must be written by the child's own writer."""
    store = RecordingStore()
    state = _census._GroupArrivals(store, "k")
    parent_thread = _census.ARRIVALS.writer._thread
    _arrive(_census.ARRIVALS.writer, state, "child")
    ok = _wait_for(lambda: state.written == 1, 10)
    thread = _census.ARRIVALS.writer._thread
    conn.send((ok, parent_thread is None, thread is not None and thread.is_alive()))


def test_a_forked_child_starts_its_own_writer() -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    # the parent's writer is running (and holding its lock in a write) at the fork
    gate = threading.Event()
    store = RecordingStore(gate)
    state = _census._GroupArrivals(store, "k")
    _arrive(_census.ARRIVALS.writer, state, "parent")
    assert store.entered.wait(10)
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(theirs,))
    child.start()
    try:
        assert ours.poll(20), "the child's arrival was never written"
        assert ours.recv() == (True, True, True)
    finally:
        gate.set()
        child.join(20)
    assert child.exitcode == 0
    assert _wait_for(lambda: state.written == 1)

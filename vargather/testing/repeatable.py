"""What makes a case's run on a rank read the same every run: the two races the rank
settles, one way every time, while the code under test runs.

Where it sits: at the bottom of the testing kit, beneath the rank runners
(``rank_runner`` for the gather, ``family`` for the other collectives), which run each
case inside ``repeatable()``; it imports torch only. Two things code under test can
race, and how each is settled:

* **Memory nothing wrote.** An output read before anything wrote it (an unwaited
  async collective's buffer) holds what the allocator last held, different on every
  try and run. While a case runs, glibc's ``mallopt(M_PERTURB)`` fills every block
  ``malloc`` hands out with ``0x5a`` (``fresh_memory_filled``), so it reads the same
  bytes every time (an int16 reads 23130); reset after the case, so the bench's ranks
  run untouched. glibc only.
* **A refusal against the next collective.** gloo refuses a dtype (int16 and the
  unsigned types wider than 8 bits: ``Invalid scalar type``) in its worker thread, not
  when the collective is called. Code that starts such a collective with
  ``async_op=True`` and never waits for it has its next ``barrier`` raise the refusal
  when the barrier starts before the worker refused, and pass when it starts after:
  the same code, one run an error, the next a wrong value. While a case runs,
  ``torch.distributed``'s collectives (``SETTLED``) let such a collective finish
  refusing before they return its handle (``refusals_settled``), so the refusal never
  races what the code does next: the code gets it where it waits for the handle
  (``Work.wait`` raises it, every time it is called), and code that never waits reads
  buffers nothing wrote. Of the two orders gloo allows, this is the one in which code
  that drops a refusal is wrong, and a peer left waiting for a rank that raised is
  seen waiting. Only refused dtypes are settled: any other collective stays as
  asynchronous as the code made it, so an output read before its collective
  completed is still read early. A name bound with ``from torch.distributed import
  broadcast`` before the case keeps gloo's order.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch

__all__ = [
    "GLOO_REFUSED_DTYPES",
    "SETTLED",
    "fresh_memory_filled",
    "refusals_settled",
    "repeatable",
]

GLOO_REFUSED_DTYPES: Final = frozenset({torch.int16, torch.uint16, torch.uint32, torch.uint64})
"""The dtypes gloo's collectives refuse (``RuntimeError: Invalid scalar type``)."""

SETTLED: Final = (
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)
"""The ``torch.distributed`` collectives whose refusals ``refusals_settled`` settles."""

REFUSAL_WAIT_S: Final = 5.0
"""How long a refused collective is given to finish refusing (gloo refuses before it
moves a byte; it waits only for the collectives queued ahead of it on the group)."""

_M_PERTURB: Final = -6
"""glibc's ``mallopt`` parameter: fill each block ``malloc`` hands out with the
complement of this byte (and each freed one with it)."""


@contextlib.contextmanager
def fresh_memory_filled(byte: int = 0xA5) -> Iterator[None]:
    """While it is entered, memory ``malloc`` hands out holds ``~byte`` (0x5a)."""
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not mallopt(_M_PERTURB, byte):
        yield
        return
    try:
        yield
    finally:
        mallopt(_M_PERTURB, 0)


def _refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor among a collective's arguments (or in a list of them) has a
    dtype gloo refuses."""
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(t, torch.Tensor) and t.dtype in GLOO_REFUSED_DTYPES for t in items):
            return True
    return False


def _settling(collective: Callable[..., Any]) -> Callable[..., Any]:
    """``collective``, whose handle of a refused dtype comes back once it has refused."""

    def settling(*args: Any, **kwargs: Any) -> Any:
        handle = collective(*args, **kwargs)
        completed = getattr(handle, "is_completed", None)
        if completed is not None and _refused(args, kwargs):
            deadline = time.monotonic() + REFUSAL_WAIT_S
            while not completed() and time.monotonic() < deadline:
                time.sleep(0.0002)
        return handle

    settling.__name__ = getattr(collective, "__name__", "collective")
    settling.__wrapped__ = collective  # type: ignore[attr-defined]  # functools.wraps' attribute
    return settling


@contextlib.contextmanager
def refusals_settled() -> Iterator[None]:
    """While it is entered, ``SETTLED``'s async collectives of a refused dtype return
    their handle once the backend has refused (the module docstring says why)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    modules = (dist, c10d)
    kept = {(m, name): getattr(m, name) for m in modules for name in SETTLED if hasattr(m, name)}
    for (module, name), fn in kept.items():
        setattr(module, name, _settling(fn))
    try:
        yield
    finally:
        for (module, name), fn in kept.items():
            setattr(module, name, fn)


@contextlib.contextmanager
def repeatable() -> Iterator[None]:
    """Both settlements, while a case runs on this rank."""
    with fresh_memory_filled(), refusals_settled():
        yield

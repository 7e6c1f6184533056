"""What makes a case's run on a rank read the same every run: the two races the rank
settles, one way every time, while the code under test runs (docs/targets.md tells
how each showed up in a fork's runs).

Where it sits: at the bottom of the testing kit, beneath the rank runners, which run
each case inside ``repeatable()``; it imports torch only.

* **Memory nothing wrote** (an unwaited async collective's buffer). While a case runs
  (``fresh_memory_filled``), torch's deterministic mode fills every tensor
  ``torch.empty`` and its kin hand out: NaN for a floating dtype, the largest value for
  an integer one (an int16 reads 32767), ``True`` for bool. The mode is on warn-only
  (an operation torch cannot run deterministically warns instead of raising) and put
  back after the case, so the bench's ranks run untouched.
* **A refusal against the next collective.** gloo refuses a dtype
  (``GLOO_REFUSED_DTYPES``) in its worker thread, not when the collective is called,
  so an unwaited one made the next ``barrier`` raise or pass by timing. While a case
  runs, ``SETTLED``'s collectives of such a dtype hand back their handle once it has
  refused (``refusals_settled``): the code gets the refusal where it waits for the
  handle (``Work.wait``), and code that never waits reads buffers nothing wrote. Any
  other collective stays as asynchronous as the code made it. The settling functions
  are put in once per process and switched on and off per case (as ``emulate``'s
  interception is, which may be put in above or beneath them); a name bound with
  ``from torch.distributed import broadcast`` before that keeps gloo's order.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch

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

_SETTLING: list[bool] = [False]  # whether the settling functions settle now
_INSTALLED: list[bool] = []  # non-empty once they are put in, in this process


@contextlib.contextmanager
def fresh_memory_filled() -> Iterator[None]:
    """While it is entered, a tensor ``torch.empty`` hands out is filled."""
    import torch.utils.deterministic as deterministic

    kept = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]  # a module property torch's stubs do not declare
    )
    # torch._C's setter, not torch.use_deterministic_algorithms: that one also sets
    # inductor's config, which costs 9 ms a case and changes no tensor ``empty`` makes.
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]  # as above
    try:
        yield
    finally:
        torch._C._set_deterministic_algorithms(kept[0], warn_only=kept[1])
        deterministic.fill_uninitialized_memory = kept[2]  # type: ignore[attr-defined]  # as above


def _refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor among the arguments (or in a list of them) is of a refused dtype."""
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(t, torch.Tensor) and t.dtype in GLOO_REFUSED_DTYPES for t in items):
            return True
    return False


def _settling(collective: Callable[..., Any]) -> Callable[..., Any]:
    """``collective``, whose handle of a refused dtype comes back once it has refused
    (while ``_SETTLING`` is on)."""

    def settling(*args: Any, **kwargs: Any) -> Any:
        handle = collective(*args, **kwargs)
        completed = getattr(handle, "is_completed", None)
        if _SETTLING[0] and completed is not None and _refused(args, kwargs):
            deadline = time.monotonic() + REFUSAL_WAIT_S
            while not completed() and time.monotonic() < deadline:
                time.sleep(0.0002)
        return handle

    settling.__name__ = getattr(collective, "__name__", "collective")
    settling.__wrapped__ = collective  # type: ignore[attr-defined]  # functools.wraps' attribute
    return settling


def _install() -> None:
    if _INSTALLED:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in SETTLED:
        for module in (dist, c10d):
            if hasattr(module, name):
                setattr(module, name, _settling(getattr(module, name)))
    _INSTALLED.append(True)


@contextlib.contextmanager
def refusals_settled() -> Iterator[None]:
    """While it is entered, ``SETTLED``'s async collectives of a refused dtype return
    their handle once the backend has refused."""
    _install()
    kept = _SETTLING[0]
    _SETTLING[0] = True
    try:
        yield
    finally:
        _SETTLING[0] = kept


@contextlib.contextmanager
def repeatable() -> Iterator[None]:
    """Both settlements, while a case runs on this rank."""
    with fresh_memory_filled(), refusals_settled():
        yield

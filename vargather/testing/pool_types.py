"""The rank pool's vocabulary: its errors, what one rank produced, and its settings.

Where it sits: the bottom of the testing kit, beneath the rest of the pool (``pool``
re-exports these names). Nothing here starts a process.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


#: Environment variable overriding the default ``collective_timeout`` (seconds).
COLLECTIVE_TIMEOUT_ENV = "VARGATHER_POOL_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT = 10.0
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_SHARED_START_METHOD = (
    "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
)
"""How ``get_pool``'s shared worlds start their ranks (``RankPool`` itself: spawn)."""


class RemoteException(Exception):  # noqa: N818  # the project's chosen public name
    """Stands in for a rank's exception that could not be pickled back.

    ``type_name`` is the qualified name of the original type (``vargather.DTypeMismatchError``;
    builtins are unqualified, ``ValueError``) and ``message`` its ``str()``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


class RankError(Exception):
    """A Python exception was raised on one or more ranks.

    The message names each failing rank and quotes its full traceback. ``outcomes`` has
    one :class:`RankOutcome` per rank (for ``run_many``: for payload ``payload_index``).
    The world is intact unless the message says it will be rebuilt.
    """

    def __init__(
        self,
        message: str,
        outcomes: Sequence[RankOutcome[Any]] = (),
        payload_index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.outcomes: tuple[RankOutcome[Any], ...] = tuple(outcomes)
        self.payload_index = payload_index

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.outcomes, self.payload_index))

    @property
    def failures(self) -> tuple[RankOutcome[Any], ...]:
        """The outcomes of the ranks that raised."""
        return tuple(o for o in self.outcomes if not o.ok)


class PoolFailure(Exception):  # noqa: N818  # the project's chosen public name
    """The world itself failed: a rank died, hung, or could not start.

    Every rank process has been killed; the next call starts a fresh world.
    """


class PoolStartError(PoolFailure):
    """A rank could not start or initialize its process group."""


class RankCrashed(PoolFailure):
    """One or more rank processes died during a call.

    ``ranks`` are the dead ranks; ``exitcodes`` maps each to its exit code (negative:
    killed by that signal; ``None``: unknown). ``in_flight`` maps each rank that was
    inside ``fn`` when the world failed to the index of the payload it was running
    (always 0 for ``run``; for ``run_many``, the payload that killed it, on a dead
    rank); a rank between payloads or done with the batch is absent.
    """

    def __init__(
        self,
        message: str,
        ranks: Sequence[int] = (),
        exitcodes: dict[int, int | None] | None = None,
        in_flight: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.exitcodes: dict[int, int | None] = dict(exitcodes or {})
        self.in_flight: dict[int, int] = dict(in_flight or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.ranks, self.exitcodes, self.in_flight))


class RankHung(PoolFailure):
    """One or more ranks did not reply within ``call_timeout`` seconds. ``in_flight``
    as for :class:`RankCrashed`: the payload each rank was stuck in."""

    def __init__(
        self,
        message: str,
        ranks: Sequence[int] = (),
        timeout: float = 0.0,
        in_flight: dict[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.ranks: tuple[int, ...] = tuple(ranks)
        self.timeout = timeout
        self.in_flight: dict[int, int] = dict(in_flight or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.ranks, self.timeout, self.in_flight))


@dataclass(frozen=True)
class RankOutcome(Generic[R]):
    """What one rank produced for one payload.

    ``exception`` is the rank's exception object, re-created in the parent when it
    pickles, else a :class:`RemoteException`; it carries no ``__traceback__`` (the rank's
    traceback text is in ``traceback``). ``exc_type_name``: as ``RemoteException.type_name``.
    """

    rank: int
    value: R | None = None
    exception: BaseException | None = None
    exc_type_name: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        """True when the rank returned normally."""
        return self.exception is None


@dataclass(frozen=True)
class PoolConfig:
    """The settings a pool was built with (resolved: no ``None``)."""

    world_size: int
    collective_timeout: float
    call_timeout: float
    backend: str
    start_timeout: float
    start_method: str = "spawn"
    environment: tuple[tuple[str, str], ...] = ()
    """Environment variables set for the rank processes when they start."""

    @classmethod
    def resolve(
        cls,
        world_size: int,
        *,
        collective_timeout: float | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        backend: str = "gloo",
        start_timeout: float = DEFAULT_START_TIMEOUT,
        start_method: str = "spawn",
        environment: Mapping[str, str] | None = None,
    ) -> PoolConfig:
        """Validate ``RankPool``'s arguments; ``collective_timeout=None`` reads
        ``$VARGATHER_POOL_COLLECTIVE_TIMEOUT`` (a positive number of seconds) or uses 10 s.
        Raises ``ValueError`` naming the bad value."""
        raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
        if collective_timeout is not None:
            coll = _positive_seconds("collective_timeout", collective_timeout)
        else:
            env = f"${COLLECTIVE_TIMEOUT_ENV}"
            coll = _positive_seconds(env, raw) if raw else DEFAULT_COLLECTIVE_TIMEOUT
        if environment and start_method == "forkserver":
            raise ValueError(
                "environment= needs start_method='spawn': forkserver ranks are forked "
                "from a server started earlier, whose environment they keep"
            )
        size: object = world_size  # checked as any object: callers are not all typed
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"world_size must be a positive int, got {size!r}")
        call = _positive_seconds("call_timeout", call_timeout)
        start = _positive_seconds("start_timeout", start_timeout)
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(
                f"start_method must be 'spawn' or 'forkserver', got {start_method!r} ('fork' is "
                "refused: forking a process that may run torch's threads can deadlock)"
            )
        if start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start_method {start_method!r} is not available on this platform")
        pairs = tuple(sorted((str(k), str(v)) for k, v in (environment or {}).items()))
        return cls(size, coll, call, str(backend), start, start_method, pairs)


def _positive_seconds(name: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]  # validated right here: float() raises on anything unusable
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return seconds

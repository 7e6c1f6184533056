"""The arrival census: which ranks never arrived at a collective that failed.

Below every stage, under ``_comm``: before each collective a rank writes one key on
the group's store, ``vargather/arrival/<rank> = "<n> <what>"``, where ``n`` counts this
process's vargather collectives on the group. Ranks in step are at the same ``n``.
When a collective fails, the rank reads every peer's key: a peer at a lower ``n`` (or
with no key) never arrived at this collective; a peer at the same ``n`` in a
different collective (``what``) is out of step. Gloo's own messages name no rank
(``Timed out waiting 3000ms for recv operation to complete``; ``Connection closed by
peer [127.0.0.1]:31657``), so this is the only way to say who is missing.

The census costs one store write per collective, small against the smallest gloo
collective (``docs/misuse.md`` has the figures), and reads only after a failure.
``VARGATHER_ARRIVAL_CENSUS=0`` turns it off. It needs the group's store
(``ProcessGroup.get_group_store()``, else torch's private group map, each guarded);
without one, errors just name no rank. The counters live in the store for the
store's lifetime: re-creating a process group on the same store and prefix after a
failure can make a census misattribute, so its verdict is a diagnosis, not a proof.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Final

import torch.distributed as dist

from ._group import GroupInfo, process_group

__all__ = ["ARRIVALS", "CENSUS_ENV", "arrival_census_enabled"]

CENSUS_ENV: Final = "VARGATHER_ARRIVAL_CENSUS"
_CENSUS_VALUES: Final = {"1": True, "0": False, "": True}


def _census_from_env() -> bool:
    raw = os.environ.get(CENSUS_ENV, "").strip()
    if raw not in _CENSUS_VALUES:
        raise ValueError(
            f"${CENSUS_ENV}={raw!r} is not understood: expected '1' (on, the default) or '0'"
        )
    return _CENSUS_VALUES[raw]


_CENSUS_ON: Final = _census_from_env()


def arrival_census_enabled() -> bool:
    """Whether collectives record arrivals (``$VARGATHER_ARRIVAL_CENSUS``, read at import)."""
    return _CENSUS_ON


_KEY: Final = "vargather/arrival/"


@dataclass
class _GroupArrivals:
    store: Any  # a torch.distributed.Store, or None when unavailable
    count: int = 0


class _Arrivals:
    """Per-process arrival counters, one per process group (weakly keyed)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakKeyDictionary[Any, _GroupArrivals] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @staticmethod
    def _store_of(pg: dist.ProcessGroup) -> Any:
        get = getattr(pg, "get_group_store", None)
        if get is not None:
            with contextlib.suppress(Exception):
                return get()
        with contextlib.suppress(Exception):  # torch's private group map (older torch)
            from torch.distributed import distributed_c10d as c10d

            return c10d._world.pg_map[pg][1]
        return None

    def _state(self, info: GroupInfo) -> _GroupArrivals | None:
        pg = process_group(info)
        if pg is None:
            return None
        with self._lock:
            state = self._groups.get(pg)
            if state is None:
                state = _GroupArrivals(self._store_of(pg))
                self._groups[pg] = state
            return state

    def arrive(self, info: GroupInfo, what: str) -> int:
        """Record that this rank enters collective ``what``; its number (0: no census)."""
        if not _CENSUS_ON or not info.communicates:
            return 0
        state = self._state(info)
        if state is None or state.store is None:
            return 0
        state.count += 1
        try:
            state.store.set(f"{_KEY}{info.rank}", f"{state.count} {what}")
        except Exception:
            state.store = None  # a store that fails once is not asked again
            return 0
        return state.count

    def census(
        self, info: GroupInfo, count: int, what: str, *, timed_out: bool
    ) -> tuple[list[int], str]:
        """(ranks that had not arrived, a sentence for the error message).

        After a timeout the peers had the whole timeout to arrive: "never arrived".
        After a lost peer the census is read at once: "had not arrived".
        """
        state = self._state(info)
        if count == 0 or state is None or state.store is None:
            return [], ""
        store = state.store
        behind: list[tuple[int, int, str]] = []
        elsewhere: list[tuple[int, int, str]] = []
        try:
            for r in range(info.world_size):
                if r == info.rank:
                    continue
                key = f"{_KEY}{r}"
                if not store.check([key]):
                    behind.append((r, 0, ""))
                    continue
                n_text, _, their_what = store.get(key).decode("utf-8", "replace").partition(" ")
                n = int(n_text)
                if n < count:
                    behind.append((r, n, their_what))
                elif n == count and their_what != what:
                    elsewhere.append((r, n, their_what))
        except Exception as err:
            return [], f" (the arrival census could not read the group's store: {err})"
        parts: list[str] = []
        if behind:
            seen = "; ".join(
                f"rank {r} {'has entered none' if n == 0 else f'is at #{n}, {w}'}"
                for r, n, w in behind
            )
            verb = "never arrived" if timed_out else "had not arrived"
            parts.append(
                f"rank(s) {[r for r, _, _ in behind]} {verb} at this collective "
                f"(vargather collective #{count} on this group for rank {info.rank}; {seen})"
            )
        if elsewhere:
            seen = "; ".join(f"rank {r} is in {w}" for r, _, w in elsewhere)
            parts.append(f"ranks are out of step at collective #{count}: {seen}")
        if not parts:
            parts.append(f"every rank arrived at this collective (#{count})")
        return [r for r, _, _ in behind], " " + "; ".join(parts) + "."


ARRIVALS: Final = _Arrivals()
"""This process's arrival counters, one per process group."""

"""The collectives the testing kit checks, each by its catalogue's name.

Where it sits: at the bottom of the testing kit, read by ``catalogues``, ``options``
and the family's case models; the names are those of ``vargather.COLLECTIVES`` with a
catalogue of their own (``all_gather_v_coalesced`` is checked by ``all_gather_v``'s
``coalesced`` row), in the table's order.
"""

from __future__ import annotations

from typing import Final

from vargather import COLLECTIVES

NAMES: Final[tuple[str, ...]] = tuple(
    c.catalogue for c in COLLECTIVES.values() if c.catalogue is not None
)
"""Every collective with a catalogue, ``--op``'s choices."""

DEFAULT: Final = NAMES[0]
"""The collective ``check`` checks when no ``--op`` is given: ``all_gather_v``."""

FAMILY: Final[tuple[str, ...]] = NAMES[1:]
"""The collectives built beside the gather (``family``, ``family_catalogue``)."""

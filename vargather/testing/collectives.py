"""The collectives the testing kit checks, each by its catalogue's name.

Where it sits: at the bottom of the testing kit, read by ``catalogues`` (which imports
``catalogues.<name>`` for ``--op name``), ``options`` and the family's case models.
The names come from the library's one table of collectives (``vargather.COLLECTIVES``):
those with a catalogue of their own (``all_gather_v_coalesced`` is checked within
``all_gather_v``'s, by its ``coalesced`` row), in the table's order.
"""

from __future__ import annotations

from typing import Final

from vargather import COLLECTIVES

__all__ = ["DEFAULT", "FAMILY", "NAMES"]

NAMES: Final[tuple[str, ...]] = tuple(
    c.catalogue for c in COLLECTIVES.values() if c.catalogue is not None
)
"""Every collective with a catalogue, ``--op``'s choices."""

DEFAULT: Final = NAMES[0]
"""The collective ``check`` checks when no ``--op`` is given: the table's first
(wire code 0), ``all_gather_v``."""

FAMILY: Final[tuple[str, ...]] = NAMES[1:]
"""The collectives built beside the gather (``family``, ``family_catalogue``)."""

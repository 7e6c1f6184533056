"""The collectives the testing kit checks, each by its catalogue's name.

Where it sits: at the bottom of the testing kit, read by ``catalogues`` (which imports
``catalogues.<name>`` for ``--op name``), ``options`` and the family's case models.
The names come from the library's one table of collectives; this module only keeps
those that have a catalogue of their own (``all_gather_v_coalesced`` is checked
within ``all_gather_v``'s, by its ``coalesced`` row).
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT", "NAMES"]

NAMES: Final[tuple[str, ...]] = (
    "all_gather_v",
    "reduce_scatter_v",
    "all_to_all_v",
    "all_gather_list",
)
"""Every collective with a catalogue, ``--op``'s choices."""

DEFAULT: Final = "all_gather_v"
"""The collective ``check`` checks when no ``--op`` is given."""

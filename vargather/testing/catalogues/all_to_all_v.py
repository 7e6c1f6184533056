"""``all_to_all_v``'s catalogue: the family's rows (``vargather.testing.family_catalogue``) for it.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), beneath
the engine, which runs its rows as it runs any collective's.
"""

from __future__ import annotations

from typing import Final

from ..family_catalogue import FamilyCatalogue

__all__ = ["CATALOGUE"]

CATALOGUE: Final = FamilyCatalogue("all_to_all_v")

"""Where each collective's property catalogue plugs into the kit: one module per collective.

Where it sits: in the testing kit, between the engine (which runs the rows of
whichever catalogue ``--op`` names, with no branch on the collective) and the rows' own
code. A collective's catalogue is the module ``vargather.testing.catalogues.<name>``
(``name`` as the collectives' table spells it) with a ``CATALOGUE`` that satisfies
``Catalogue``. A collective shaped like the family builds it as a
``family_catalogue.FamilyCatalogue`` of its case class and strategy, and gets every
generic row (``docs/api-testing.md``, "Adding a collective to the gate").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from hypothesis import strategies as st

from ..cases import VARGATHER
from ..collectives import DEFAULT, FAMILY, NAMES
from ..properties import RETURNS

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..cases import Implementation
    from ..family_catalogue import FamilyCatalogue
    from ..options import CheckOptions
    from ..pool import RankPool
    from ..properties import Property
    from ..resolve import ImplInfo
    from ..runner import Verdict


class Catalogue(Protocol):
    """What the engine and ``Property`` ask of one collective's catalogue."""

    @property
    def op(self) -> str:
        """The collective's name (``--op``)."""

    @property
    def default_call(self) -> str | None:
        """The call the report names when no ``--call`` is given (``None``: the
        convention's)."""

    def resolve(self, options: CheckOptions, cwd: str) -> ImplInfo:
        """What ``--impl``/``--call`` name (``OptionError`` for one that cannot apply)."""

    def implementation(self, info: ImplInfo, options: CheckOptions, cwd: str) -> Implementation:
        """The implementation the rows run: the resolved one with its declared scope."""

    def rows(self, implementation: Implementation, returns: str = "unknown") -> list[Property]:
        """Every row, in a fixed order, for ``implementation``."""

    def draw(
        self,
        prop: Property,
        world: int,
        batch: int,
        transports: Sequence[str] | None,
        max_payload: int,
    ) -> SearchStrategy[list[Any]]:
        """One example of ``prop``: a batch of cases on a world of ``world`` ranks."""

    def run(
        self, prop: Property, batch: Sequence[Any], pool_factory: Callable[[int], RankPool]
    ) -> list[Verdict]:
        """The batch's verdicts, in order (a world that died is a failure, not a raise)."""

    def describe(self, prop: Property, batch: Sequence[Any], index: int) -> str:
        """Case ``index`` of ``batch`` (it failed) in words, with a ``reproduce:`` line."""

    def case_data(self, case: Any) -> dict[str, Any]:
        """A case as plain JSON data (the counterexample in the report)."""

    def probe_returns(
        self,
        implementation: Implementation,
        world_sizes: Sequence[int],
        factory: Callable[[int], RankPool],
    ) -> str:
        """What the implementation returns beside its result: ``sizes``, ``layout``,
        ``none`` or ``unknown``."""


def catalogue_of(op: str) -> Catalogue:
    """The catalogue of collective ``op`` (``ValueError`` for a name with none)."""
    if op not in NAMES:
        raise ValueError(f"op={op!r} is not one of {', '.join(NAMES)}")
    module = importlib.import_module(f"{__name__}.{op}")
    found: Catalogue = module.CATALOGUE
    return found


def catalogue(
    implementation: Implementation = VARGATHER, *, returns: str = "unknown"
) -> list[Property]:
    """Every row of ``implementation``'s collective, in a fixed order; ``returns`` (one
    of ``RETURNS``, else ``ValueError``) only words the titles of the rows about what
    it returns beside its result."""
    if returns not in RETURNS:
        raise ValueError(f"returns={returns!r} is not one of {RETURNS}")
    return catalogue_of(implementation.op).rows(implementation, returns)


def property_ids(op: str = DEFAULT) -> tuple[str, ...]:
    """The ids of ``op``'s catalogue, in order."""
    return tuple(p.id for p in catalogue(replace(VARGATHER, op=op)))


def call_sequences(
    world_size: int = 3, max_calls: int = 6, most: int = 4
) -> SearchStrategy[list[Any]]:
    """Mixed sequences of every family collective's calls on one world."""
    drawn = [c.cases(world_sizes=(world_size,), most=most) for c in family_catalogues()]
    return st.lists(st.one_of(*drawn), min_size=2, max_size=max_calls)


def family_catalogues() -> list[FamilyCatalogue]:
    """The catalogues of ``collectives.FAMILY``."""
    from ..family_catalogue import FamilyCatalogue

    found = [catalogue_of(op) for op in FAMILY]
    return [c for c in found if isinstance(c, FamilyCatalogue)]

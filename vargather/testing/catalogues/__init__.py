"""Where each collective's property catalogue plugs into the kit: one module per collective.

Where it sits: in the testing kit, between the engine (``vargather.testing.engine``,
which runs the rows of whichever catalogue ``--op`` names, with no branch on the
collective) and the rows' own code. A collective's catalogue is the module
``vargather.testing.catalogues.<name>`` (``name`` as the collectives' table spells it)
with a ``CATALOGUE`` object that satisfies ``Catalogue``: how ``--impl``/``--call``
resolve for it, its rows (``vargather.testing.properties.Property``), how a row draws
and runs a batch, and how a failing batch is told. A new collective is one module here.
The model is pytest's plugins: the engine asks the hook, never the collective's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..cases import Implementation
    from ..options import CheckOptions
    from ..pool import RankPool
    from ..properties import Property
    from ..resolve import ImplInfo
    from ..runner import Verdict

__all__ = ["Catalogue", "catalogue_of"]


class Catalogue(Protocol):
    """What the engine and ``Property`` ask of one collective's catalogue."""

    op: str
    """The collective's name (``--op``)."""
    default_call: str | None
    """The call the report names when no ``--call`` is given (``None``: the
    convention's, which the report names itself)."""

    def resolve(self, options: CheckOptions, cwd: str) -> ImplInfo:
        """What ``--impl``/``--call`` name for this collective (``OptionError`` for an
        option that cannot apply to it, saying why)."""

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
    from .. import collectives

    if op not in collectives.NAMES:
        raise ValueError(f"op={op!r} is not one of {', '.join(collectives.NAMES)}")
    module = importlib.import_module(f"{__name__}.{op}")
    found: Catalogue = module.CATALOGUE
    return found

"""The one table of vargather's collectives: name, wire code, round, checks, oracle, catalogue.

Beneath every stage, beside the other vocabularies (``_choices``): every place that
names the collectives reads them here. The kit reads ``catalogue`` and ``oracle`` (by
name: the oracle and the kit sit above the library), the option schema and the bench
read the names. The table is public as ``vargather.COLLECTIVES``.

This module imports the standard library only, so a tool that must not import torch
(the pytest plugin's option schema) can load it by path.

Append only: a collective's ``code`` is its position in ``COLLECTIVE_NAMES``, and a
peer of another vargather version must read the codes it knows the same way.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

CollectiveName: TypeAlias = Literal[
    "all_gather_v",
    "all_gather_v_coalesced",
    "all_gather_list",
    "reduce_scatter_v",
    "all_to_all_v",
    "gather_v",
    "scatter_v",
]
"""Every collective vargather offers, in the order of their wire codes."""

COLLECTIVE_NAMES: Final[tuple[CollectiveName, ...]] = typing.get_args(CollectiveName)
"""The collectives' names; position is the wire code (append only)."""

RoundShape: TypeAlias = Literal["all_gather", "all_to_all"]
"""Which exchange carries a collective's one round: every rank's compact headers and
payload to every rank (``_fused``), or every rank's row and its block for each rank
(``_family``)."""


@dataclass(frozen=True)
class Collective:
    """One collective, as every layer of vargather names it.

    ``code``: what its calls send on the wire so that a peer calling another
    collective is named in the error (position in ``COLLECTIVE_NAMES``). ``round``:
    which exchange carries its validated one round (what every rank checks across
    ranks is its face's docstring, in ``_api``). ``oracle`` and
    ``oracle_grads``: the names of its functions in ``vargather.oracle`` (the forward
    result, and every rank's input gradient). ``catalogue``: the name of its property
    catalogue in the testing kit (``None``: checked within another's catalogue, named
    in ``checked_by``).
    """

    name: CollectiveName
    code: int
    round: RoundShape
    oracle: str
    oracle_grads: str
    catalogue: str | None
    checked_by: CollectiveName


def _table() -> Mapping[CollectiveName, Collective]:
    rows = (
        Collective(
            name="all_gather_v",
            code=0,
            round="all_gather",
            oracle="expected_output",
            oracle_grads="expected_input_grads",
            catalogue="all_gather_v",
            checked_by="all_gather_v",
        ),
        Collective(
            name="all_gather_v_coalesced",
            code=1,
            round="all_gather",
            oracle="expected_output",
            oracle_grads="expected_input_grads",
            catalogue=None,
            checked_by="all_gather_v",
        ),
        Collective(
            name="all_gather_list",
            code=2,
            round="all_gather",
            oracle="expected_gather_list",
            oracle_grads="expected_gather_list_grads",
            catalogue="all_gather_list",
            checked_by="all_gather_list",
        ),
        Collective(
            name="reduce_scatter_v",
            code=3,
            round="all_to_all",
            oracle="expected_reduce_scatter",
            oracle_grads="expected_reduce_scatter_grads",
            catalogue="reduce_scatter_v",
            checked_by="reduce_scatter_v",
        ),
        Collective(
            name="all_to_all_v",
            code=4,
            round="all_to_all",
            oracle="expected_all_to_all",
            oracle_grads="expected_all_to_all_grads",
            catalogue="all_to_all_v",
            checked_by="all_to_all_v",
        ),
        Collective(
            name="gather_v",
            code=5,
            round="all_to_all",
            oracle="expected_gather_v",
            oracle_grads="expected_gather_v_grads",
            catalogue="gather_v",
            checked_by="gather_v",
        ),
        Collective(
            name="scatter_v",
            code=6,
            round="all_to_all",
            oracle="expected_scatter_v",
            oracle_grads="expected_scatter_v_grads",
            catalogue="scatter_v",
            checked_by="scatter_v",
        ),
    )
    assert tuple(c.name for c in rows) == COLLECTIVE_NAMES
    assert all(c.code == i for i, c in enumerate(rows))
    return MappingProxyType({c.name: c for c in rows})


COLLECTIVES: Final[Mapping[CollectiveName, Collective]] = _table()
"""Every collective by name, in the order of their wire codes."""


def by_code(code: int) -> Collective | None:
    """The collective whose wire code is ``code`` (``None``: no collective of this
    version, e.g. a peer's newer one or bytes that are no vargather call)."""
    if 0 <= code < len(COLLECTIVE_NAMES):
        return COLLECTIVES[COLLECTIVE_NAMES[code]]
    return None


def name_of_code(code: int) -> str:
    """The name of the collective with wire code ``code``, ``"?"`` for an unknown code."""
    found = by_code(code)
    return "?" if found is None else found.name

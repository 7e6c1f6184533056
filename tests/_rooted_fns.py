"""Rank-side function of the gather_v / scatter_v tests (module-level, so it pickles):
the collectives one call issues, on the cases of their catalogues
(``vargather.testing.catalogues.gather_v`` and ``scatter_v``)."""

from __future__ import annotations

from dataclasses import replace

from vargather import _round_state
from vargather._comm import collectives_issued
from vargather.testing import RankContext
from vargather.testing.family import FamilyCase, run_case


def counts(ctx: RankContext, case: FamilyCase) -> tuple[int, int, int]:
    """Collectives issued by a call on a fresh round state, by the steady call after it
    (the payload in the round), and by a trusted call (``validate=False`` with the sizes
    passed: no round, the payload alone)."""
    _round_state.reset_state(None, case.collective)  # the all_to_all-shaped round's state
    case = replace(case, requires_grad=False)  # type: ignore[type-var]  # a dataclass case
    trusted = replace(case, validate=False)  # type: ignore[type-var]  # a dataclass case
    if hasattr(case, "pass_sizes"):
        trusted = replace(trusted, pass_sizes=True)
    found = []
    for c in (case, case, trusted):
        c0 = collectives_issued()
        report = run_case(ctx, c)
        assert report is not None
        assert report.error is None, report
        found.append(collectives_issued() - c0)
    return found[0], found[1], found[2]

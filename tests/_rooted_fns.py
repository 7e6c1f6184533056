"""Rank-side function of the gather_v / scatter_v tests (module-level, so it pickles):
the collectives one call issues, on the cases of their catalogues
(``vargather.testing.catalogues.gather_v`` and ``scatter_v``)."""

from __future__ import annotations

import torch

import vargather
from vargather import _round_state
from vargather._comm import collectives_issued
from vargather.testing import RankContext
from vargather.testing.family import FamilyCase, run_case


def counts(ctx: RankContext, calls: tuple[FamilyCase, FamilyCase]) -> tuple[int, int, int]:
    """Collectives issued by the first call on a fresh round state, by the same call
    again (steady: the payload in the round), and by the second, trusted call
    (``validate=False`` with the sizes passed: no round, the payload alone)."""
    validated, trusted = calls
    _round_state.reset_state(None, validated.collective)  # the all_to_all-shaped round's state
    found = []
    for c in (validated, validated, trusted):
        c0 = collectives_issued()
        report = run_case(ctx, c)
        assert report is not None
        assert report.error is None, report
        found.append(collectives_issued() - c0)
    return found[0], found[1], found[2]


def compiled_lie(ctx: RankContext, op: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The last rank passes sizes ``[2, 1, 2]`` where the others pass ``[2, 0, 3]``
    (``validate=True``, root 1), eager then compiled (aot_eager, ``fullgraph=True``):
    what each raised (type, message, blamed ranks)."""
    torch._dynamo.reset()
    sizes = [2, 1, 2] if ctx.rank == ctx.world_size - 1 else [2, 0, 3]
    rows = [2, 0, 3][ctx.rank] if op == "gather_v" else (5 if ctx.rank == 1 else 0)
    x = torch.ones(rows, 2)

    def call(t: torch.Tensor) -> torch.Tensor:
        if op == "gather_v":
            return vargather.gather_v(t, 1, 0, sizes=sizes, timeout=30.0)
        return vargather.scatter_v(t, sizes, 1, 0, timeout=30.0)

    raised = []
    for step in (call, torch.compile(call, backend="aot_eager", fullgraph=True)):
        try:
            step(x)
        except vargather.VarGatherError as err:
            raised.append((type(err).__name__, str(err), tuple(err.ranks)))
        else:
            raised.append(("nothing", "", ()))
    torch._dynamo.reset()
    return raised

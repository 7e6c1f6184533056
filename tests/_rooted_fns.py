"""Rank-side functions of the gather_v / scatter_v tests (module-level, so they pickle),
on the cases of their catalogues (``vargather.testing.catalogues.gather_v`` and
``scatter_v``), and the judge the parent runs on what the ranks return."""

from __future__ import annotations

from typing import Any, TypeAlias

import torch

import vargather
from vargather._comm import collectives_issued
from vargather.testing import RankContext, assert_bitwise_equal
from vargather.testing.catalogues import gather_v, scatter_v
from vargather.testing.catalogues.gather_v import GatherVCase
from vargather.testing.catalogues.scatter_v import ScatterVCase

Case: TypeAlias = GatherVCase | ScatterVCase
CATALOGUES = {"gather_v": gather_v, "scatter_v": scatter_v}


def _group(ctx: RankContext, case: Case) -> tuple[Any, int | None]:
    """The group and this process's rank in it (``None``: not a member)."""
    if case.group is None:
        return None, ctx.rank
    group = ctx.subgroup(case.group)
    return group, case.group.index(ctx.rank) if ctx.rank in case.group else None


def run_case(ctx: RankContext, case: Case) -> list[tuple[torch.Tensor, Any]] | None:
    """Every call's result and input gradient on this rank (``None`` off the group)."""
    group, r = _group(ctx, case)
    if r is None:
        return None
    x0, ups = case.inputs()[r], case.upstream()
    found = []
    for _ in range(case.calls):
        x = x0.clone().requires_grad_(ups is not None)
        y = case.call(getattr(vargather, case.op), x, group)
        if ups is not None:
            y.backward(ups[r])
        found.append((y.detach(), x.grad))
    return found


def judge(case: Case, results: list[Any]) -> None:
    """Every member's every call against the oracle, bit for bit (in the parent)."""
    members = list(range(len(results))) if case.group is None else list(case.group)
    want, grads = case.expected()
    for g, process in enumerate(members):
        calls = results[process]
        assert calls is not None, f"process {process} is a member"
        for k, (y, grad) in enumerate(calls):
            assert_bitwise_equal(y, want[g], f"{case}: group rank {g}, call {k}")
            if grads is not None:
                assert grad is not None
                assert_bitwise_equal(grad, grads[g], f"{case}: group rank {g}, call {k}, grad")
    assert all(results[p] is None for p in range(len(results)) if p not in members)


def misuse(ctx: RankContext, spec: tuple[str, str]) -> tuple[Any, torch.Tensor]:
    """The catalogue's misuse entry ``kind`` spoiling its ``MISUSE_CASE``, then the good
    call: the error this rank raised (class name, message, ranks) and the good result."""
    op, kind = spec
    catalogue = CATALOGUES[op]
    case: Case = catalogue.MISUSE_CASE
    (entry,) = [m for m in catalogue.MISUSE if m.kind == kind]
    fn = getattr(vargather, op)
    x, changes = case.inputs()[ctx.rank], {}
    if entry.every_rank or ctx.rank == ctx.world_size - 1:
        x, changes = entry.wrong(x, ctx.world_size)
    err = None
    try:
        case.call(fn, x, None, **changes)
    except vargather.VarGatherError as e:
        err = type(e).__name__, str(e), tuple(e.ranks)
    return err, case.call(fn, case.inputs()[ctx.rank], None)


def counts(ctx: RankContext, case: Case) -> tuple[int, int, int]:
    """Collectives issued by a call on a fresh round state, by the steady call after it
    (the payload in the round), and by a trusted call (no round: the payload alone)."""
    from dataclasses import replace

    from vargather import _round_state

    _round_state.reset_state(None, case.op)  # the all_to_all-shaped round's one state
    fn, x = getattr(vargather, case.op), case.inputs()[ctx.rank]
    found = []
    for c in (case, case, replace(case, trusted=True)):
        c0 = collectives_issued()
        c.call(fn, x, None)
        found.append(collectives_issued() - c0)
    return found[0], found[1], found[2]


def compiled(ctx: RankContext, case: Case) -> tuple[torch.Tensor, Any]:
    """The call inside ``torch.compile`` (one graph break): its result and gradient."""
    x = case.inputs()[ctx.rank].requires_grad_(True)
    ups = case.upstream()
    assert ups is not None
    fn = getattr(vargather, case.op)

    def step(t: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = case.call(fn, t * 1, None) * 1
        return out

    torch._dynamo.reset()
    y = torch.compile(step, backend="eager", fullgraph=False)(x)
    y.backward(ups[ctx.rank])
    return y.detach(), x.grad

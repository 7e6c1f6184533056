"""Rank-side functions of the gather_v / scatter_v tests (module-level, so they pickle),
on the cases of their catalogues (``vargather.testing.catalogues.gather_v`` and
``scatter_v``), and the judge the parent runs on what the ranks return."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

import vargather
from vargather import CollectiveName, oracle
from vargather._comm import collectives_issued
from vargather.testing import RankContext, assert_bitwise_equal
from vargather.testing.asserts import bitwise_difference
from vargather.testing.catalogues import gather_v, scatter_v
from vargather.testing.catalogues.gather_v import GatherVCase
from vargather.testing.catalogues.scatter_v import ScatterVCase
from vargather.testing.compiled import call_compiled

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


# --- under torch.compile(fullgraph=True): the operators ----------------------------------


@dataclass(frozen=True)
class FullgraphCase:
    """One compiled ``op`` call (``gather_v`` or ``scatter_v``) with ``sizes`` passed as
    ints: group rank ``r``'s block ``sizes[r]`` long along ``dim``, ``other`` the shape
    without ``dim``, ``root`` its dst or src, ``placeholder`` a non-src scatter input's
    length. Integer values (exact under any backend's arithmetic), upstream gradients
    that differ per rank. ``kit``: through the kit's compiled path
    (``vargather.testing.compiled.call_compiled``) instead of a step of its own."""

    op: CollectiveName
    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int
    root: int
    compile_backend: str
    placeholder: int = 2
    kit: bool = False

    def shape(self, n: int) -> tuple[int, ...]:
        d = self.dim % (len(self.other) + 1)
        return (*self.other[:d], n, *self.other[d:])

    def _values(self, n: int, base: int) -> torch.Tensor:
        shape = self.shape(n)
        return (torch.arange(math.prod(shape), dtype=torch.float32) + base).view(shape)

    def inputs(self) -> list[torch.Tensor]:
        total = sum(self.sizes)
        if self.op == "gather_v":
            return [self._values(n, 100 * r) for r, n in enumerate(self.sizes)]
        lengths = [total if r == self.root else self.placeholder for r in range(len(self.sizes))]
        return [self._values(n, 100 * r) for r, n in enumerate(lengths)]

    def upstream(self) -> list[torch.Tensor]:
        """Rank ``r``'s upstream gradient: ``-(7 r + 1) * (1 + index)``."""
        total = sum(self.sizes)
        if self.op == "gather_v":
            lengths = [total if r == self.root else 0 for r in range(len(self.sizes))]
        else:
            lengths = list(self.sizes)
        return [self._values(n, 1) * -(7 * r + 1) for r, n in enumerate(lengths)]

    def expected(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        xs, ups = self.inputs(), self.upstream()
        if self.op == "gather_v":
            return (
                oracle.expected_gather_v(xs, self.root, self.dim),
                oracle.expected_gather_v_grads(xs, self.root, ups, self.dim),
            )
        return (
            oracle.expected_scatter_v(xs, self.sizes, self.root, self.dim),
            oracle.expected_scatter_v_grads(xs, self.sizes, self.root, ups, self.dim),
        )

    def args(self, x: torch.Tensor) -> tuple[tuple[object, ...], dict[str, object]]:
        """The call's arguments as a user writes them (``x`` this rank's block)."""
        if self.op == "gather_v":
            args: tuple[object, ...] = (x, self.root, self.dim)
            return args, {"sizes": list(self.sizes), "group": None, "validate": True}
        return (x, list(self.sizes), self.root, self.dim), {"group": None, "validate": True}


def fullgraph(ctx: RankContext, case: FullgraphCase) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two calls of the compiled step (``fullgraph=True``, no graph break allowed), each
    with its backward: this rank's outputs and input gradients."""
    x0, up = case.inputs()[ctx.rank], case.upstream()[ctx.rank]
    fn = getattr(vargather, case.op)
    if not case.kit:
        torch._dynamo.reset()

    def step(
        x: torch.Tensor, w: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        args, kwargs = case.args(x * w)
        y = fn(*args, **kwargs, timeout=60.0)
        return y, (y * g).sum()

    compiled = torch.compile(step, backend=case.compile_backend, fullgraph=True)
    found = []
    for _ in range(2):
        x = x0.clone().requires_grad_(True)
        if case.kit:
            args, kwargs = case.args(x)
            y = call_compiled(fn, case, x, args, {**kwargs, "timeout": 15.0})
            assert isinstance(y, torch.Tensor)
            y.backward(up)
        else:
            y, loss = compiled(x, torch.ones((), requires_grad=True), up)
            loss.backward()
        assert x.grad is not None
        found.append((y.detach(), x.grad))
    return found


def judge_fullgraph(
    case: FullgraphCase, results: list[list[tuple[torch.Tensor, torch.Tensor]]]
) -> None:
    """Every rank's every compiled call against the oracle, bit for bit."""
    want, grads = case.expected()
    for r, calls in enumerate(results):
        for k, (y, grad) in enumerate(calls):
            where = f"{case}: rank {r}, call {k}"
            assert bitwise_difference(y, want[r]) is None, (where, bitwise_difference(y, want[r]))
            assert bitwise_difference(grad, grads[r]) is None, (
                f"{where}, grad",
                bitwise_difference(grad, grads[r]),
            )


def compiled_lie(ctx: RankContext, op: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The last rank passes sizes ``[2, 1, 2]`` where the others pass ``[2, 0, 3]``
    (``validate=True``), eager then compiled (aot_eager, fullgraph): what each raised
    (type, message, blamed ranks), then what the good call after it returned."""
    torch._dynamo.reset()
    case = FullgraphCase(
        "gather_v" if op == "gather_v" else "scatter_v", (2, 0, 3), (2,), 0, 1, "aot_eager"
    )
    x = case.inputs()[ctx.rank]
    lie = [2, 1, 2] if ctx.rank == ctx.world_size - 1 else list(case.sizes)
    fn = getattr(vargather, op)

    def call(t: torch.Tensor) -> torch.Tensor:
        args, kwargs = case.args(t)
        if op == "gather_v":
            kwargs["sizes"] = lie
        else:
            args = (t, lie, *args[2:])
        out: torch.Tensor = fn(*args, **kwargs, timeout=30.0)
        return out

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

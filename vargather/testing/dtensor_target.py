"""The ``dtensor`` target: DTensor programs as trainers run them, against an oracle.

Where it sits: in the gate's engine in the testing kit, beside ``ulysses_target`` and
``ep_dispatch_target``, above ``program_rows`` (which runs its rows: the search, the
shrinking, the report) and beneath ``targets`` (the registry that names it). Beneath
it: ``dtensor_programs`` (the strategies and the last shrinking passes) and
``dtensor_program`` (a program and its oracle, where the math is stated). Here: the
rank side, the judge and the rows.

A case is a program: a mesh set up as trainers set it up, a tensor of uneven sizes, a
start through ``distribute_tensor`` or ``DTensor.from_local(..., shape=, stride=)``,
and up to 4 ``redistribute`` steps. Every state is judged bit for bit on every rank:
its local against its ``torch.chunk`` piece, ``full_tensor()`` against the global
tensor, and the gradient of one backward through every step against its piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from .asserts import bitwise_difference
from .dtensor_program import (
    DTensorProgram,
    expected_gradient,
    expected_local,
    global_tensor,
    parse,
    start_local,
    upstream_local,
)
from .dtensor_programs import dtensor_programs, smaller_programs, worlds_for
from .program_rows import ProgramRow, ProgramTarget

__all__ = ["ROWS", "TARGET", "ProgramReport", "judge_program", "run_program", "torch_placements"]

# --- the rank side ---------------------------------------------------------------------
# A world mesh is built once per rank process for each (shape, dim names), and each
# flattened view once (``mesh[dims]._flatten(name)``); before a program runs, the world
# mesh's ``_flatten_mapping`` (the registry ``redistribute`` consults) is set to exactly
# its views, in its order. A fresh mesh per setup would create thousands of gloo groups.

_ROOTS: dict[tuple[Any, ...], Any] = {}
"""The world meshes built in this rank process, by (shape, dim names)."""
_VIEWS: dict[tuple[Any, ...], dict[str, Any]] = {}
"""Every flattened view each world mesh has had, by name (each created once)."""


def _setup(program: DTensorProgram) -> Any:
    """The mesh the program's tensor lives on, its world mesh holding exactly the
    program's flattened views, in the program's order."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (program.mesh, program.names)
    root = _ROOTS.get(key)
    if root is None:
        root = _ROOTS[key] = init_device_mesh("cpu", program.mesh, mesh_dim_names=program.names)
        for name in program.names:  # the named submeshes, as trainers slice them
            root[name]
    made = _VIEWS.setdefault(key, {})
    views = root._flatten_mapping  # torch's registry of this mesh's flattened views
    views.clear()
    for a, b in program.views:  # in the order trainers create them
        name = program.view_name((a, b))
        if name in made:
            views[name] = made[name]
        else:
            made[name] = root[program.names[a : b + 1]]._flatten(name)
    kind, a, b = program.on
    if kind == "world":
        return root
    if kind == "flat":
        return made[program.view_name((a, b))]
    return root[program.names[a : b + 1]]


def torch_placements(codes: tuple[str, ...]) -> list[Any]:
    """The DTensor placements of placement codes (``dtensor_program``'s)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out: list[Any] = []
    for code in codes:
        kind, dim, split = parse(code)
        if kind == "R":
            out.append(Replicate())
        elif kind == "SS":
            out.append(_StridedShard(dim, split_factor=split))
        elif kind == "S":
            out.append(Shard(dim))
        else:
            out.append(Partial(code[2:]))
    return out


@dataclass(frozen=True)
class ProgramReport:
    """One rank's view of one program: per stage (0: the start, k: after step k) its
    local tensor (``None`` when the stage's placements hold a Partial) and
    ``full_tensor()``; the gradient of its start local; or the error it raised, with
    the stage it raised in."""

    locals: tuple[torch.Tensor | None, ...] = ()
    fulls: tuple[torch.Tensor, ...] = ()
    grad: torch.Tensor | None = None
    error: tuple[int, str, str] | None = None


def run_program(ctx: Any, program: DTensorProgram) -> ProgramReport:
    """Rank side: the start through its entry point, every step's ``redistribute``,
    each state's ``to_local()`` and ``full_tensor()``, then one backward of
    ``sum_k <y_k, U_k>`` with this rank's own upstream pieces ``U_k``."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    locals_: list[torch.Tensor | None] = []
    fulls: list[torch.Tensor] = []
    stage = 0
    try:
        mesh = _setup(program)
        start = torch_placements(program.start)
        whole = global_tensor(program)
        if program.entry == "distribute":
            local = distribute_tensor(whole, mesh, start).to_local().detach().clone()
        else:
            local = start_local(program, ctx.rank)
        leaf = local.clone().requires_grad_(program.requires_grad)
        x = DTensor.from_local(
            leaf, mesh, start, run_check=False, shape=whole.shape, stride=whole.stride()
        )
        partial = any(p.startswith("P") for p in program.start)
        locals_.append(None if partial else local)
        fulls.append(x.full_tensor().detach().clone())
        outputs = []
        for k, step in enumerate(program.steps, start=1):
            stage = k
            x = x.redistribute(mesh, torch_placements(step))
            outputs.append(x.to_local())
            locals_.append(outputs[-1].detach().clone())
            fulls.append(x.full_tensor().detach().clone())
        grad = None
        if program.requires_grad and outputs:
            stage = len(program.steps) + 1
            terms = [
                (y * upstream_local(program, k, ctx.rank)).sum() for k, y in enumerate(outputs)
            ]
            torch.stack(terms).sum().backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs
            grad = leaf.grad
        return ProgramReport(tuple(locals_), tuple(fulls), grad)
    except Exception as err:
        return ProgramReport(
            tuple(locals_), tuple(fulls), error=(stage, type(err).__name__, str(err))
        )


# --- the judge -------------------------------------------------------------------------


def _both(got: torch.Tensor | None, want: torch.Tensor) -> str:
    """Both tensors in full, when small enough to read."""
    if got is None or max(got.numel(), want.numel()) > 16:
        return ""
    return f"; expected {want.tolist()}, got {got.tolist()}"


def judge_program(
    program: DTensorProgram, reports: Sequence[ProgramReport]
) -> list[tuple[str, str]]:
    """The failures of one program, as (aspect, message), earliest stage first:
    ``raised``, ``local`` (a rank's local is not its ``torch.chunk`` piece), ``output``
    (``full_tensor()`` is not the global tensor), ``gradient``."""
    errors = {r: rep.error for r, rep in enumerate(reports) if rep.error is not None}
    if errors:
        stage, name, message = errors[min(errors)]
        where = "the backward" if stage > len(program.steps) else f"stage {stage}"
        first = (message.splitlines() or [""])[0][:300]
        return [("raised", f"{where}, ranks {sorted(errors)}: {name}: {first}")]
    whole = global_tensor(program)
    failures: list[tuple[str, str]] = []
    for stage, placements in enumerate((program.start, *program.steps)):
        what = "the start" if stage == 0 else f"step {stage}"
        for r, rep in enumerate(reports):
            local = rep.locals[stage]
            if local is not None and (stage > 0 or program.entry == "distribute"):
                want = expected_local(program, placements, r)
                diff = bitwise_difference(local, want)
                if diff is not None:
                    message = f"{what}, rank {r}: local is not its torch.chunk piece: {diff}"
                    failures.append(("local", message + _both(local, want)))
            diff = bitwise_difference(rep.fulls[stage], whole)
            if diff is not None:
                message = f"{what}, rank {r}: full_tensor() is not the global tensor: {diff}"
                failures.append(("output", message + _both(rep.fulls[stage], whole)))
        if failures:
            return failures
    if program.requires_grad and program.steps:
        for r, rep in enumerate(reports):
            diff = bitwise_difference(rep.grad, expected_gradient(program, r))
            if diff is not None:
                failures.append(("gradient", f"rank {r}: start gradient differs: {diff}"))
    return failures


# --- the rows --------------------------------------------------------------------------


def _row(row: str, kind: str, title: str) -> ProgramRow:
    return ProgramRow(
        row, title, lambda ws: dtensor_programs(ws, kind), lambda ws: worlds_for(kind, ws)
    )


ROWS: Final = (
    _row("programs", "programs", "mesh setups as trainers build them (1-D, 2-D, 3-D, named "
         "dims, flattened views and submeshes alive), 1 to 4 redistribute steps between "
         "Shard, nested Shard, _StridedShard and Replicate from any start (Partial too): "
         "every local is torch.chunk's piece, every full_tensor the global tensor"),
    _row("flattened-views", "flattened", "the same with at least one flattened view "
         '(mesh["a", "b"]._flatten()) alive, as torchtitan keeps dp, dp_shard_cp, dp_cp'),
    _row("entry-points", "entry", "distribute_tensor, DTensor.from_local(..., shape=, "
         "stride=) of uneven locals (Partial sum and avg too) and full_tensor, no steps"),
    _row("gradient", "gradient", "one backward through every step with an upstream gradient "
         "that differs per rank: each rank's piece of the summed upstream gradients"),
)  # fmt: skip

TARGET: Final = ProgramTarget(
    name="dtensor",
    display="torch.distributed.tensor: DTensor programs (distribute_tensor, from_local, "
    "redistribute, full_tensor, backward)",
    call="x = distribute_tensor(G, mesh, start) or DTensor.from_local(local, mesh, start, "
    "shape=, stride=); x = x.redistribute(mesh, step) for each step; to_local(), "
    "full_tensor(), backward",
    grad="local",
    rows=ROWS,
    run=run_program,
    judge=judge_program,
    describe=DTensorProgram.describe,
    scope={"--grad": "local"},
    batch=12,  # about half that on average: programs are cheap, a world's round trip is not
    smaller=smaller_programs,
)

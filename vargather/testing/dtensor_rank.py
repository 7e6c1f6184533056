"""The rank side of the ``dtensor`` target: build a program's mesh setup, run it.

Where it sits: beneath ``dtensor_target`` (whose programs ``program_rows`` ships to a
pool of gloo ranks), above ``dtensor_program`` (the program, and each rank's local and
upstream pieces); module level functions, for the pool to pickle.

A world mesh is built once per rank process for each (shape, dim names), and each
flattened view once (``mesh[dims]._flatten(name)``); before a program runs, the world
mesh's ``_flatten_mapping`` (the registry ``redistribute`` consults) is set to exactly
its views, in its order. A fresh mesh per setup would create thousands of gloo groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .dtensor_program import (
    DTensorProgram,
    global_tensor,
    start_local,
    upstream_local,
)

__all__ = ["ProgramReport", "run_program", "torch_placements"]

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
        if code == "R":
            out.append(Replicate())
        elif code.startswith("SS"):
            dim, split = map(int, code[2:].split("/"))
            out.append(_StridedShard(dim, split_factor=split))
        elif code.startswith("S"):
            out.append(Shard(int(code[1:])))
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

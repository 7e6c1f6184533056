"""The ``dtensor`` target: DTensor programs as trainers run them, against an oracle.

Where it sits: in the gate's engine in the testing kit, beside ``ulysses_target`` and
``ep_dispatch_target``, above ``program_rows`` (which runs its rows: the search, the
shrinking, the report) and beneath ``targets`` (the registry that names it). Beneath
it: ``dtensor_programs`` (the strategies and the last shrinking passes),
``dtensor_rank`` (the rank side) and ``dtensor_program`` (a program and its oracle,
where the math is stated).

A case is a program: a mesh set up as trainers set it up, a tensor of uneven sizes, a
start through ``distribute_tensor`` or ``DTensor.from_local(..., shape=, stride=)``,
and up to 4 ``redistribute`` steps. Every state is judged bit for bit on every rank:
its local against its ``torch.chunk`` piece, ``full_tensor()`` against the global
tensor, and the gradient of one backward through every step against its piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch

from .asserts import bitwise_difference
from .dtensor_program import DTensorProgram, expected_gradient, expected_local, global_tensor
from .dtensor_programs import dtensor_programs, smaller_programs, worlds_for
from .dtensor_rank import ProgramReport, run_program
from .program_rows import ProgramRow, ProgramTarget

__all__ = ["ROWS", "ROW_IDS", "TARGET", "judge_program"]

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
ROW_IDS: Final = tuple(row.id for row in ROWS)

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

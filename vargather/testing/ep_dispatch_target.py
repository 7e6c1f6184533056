"""The ``torchtitan-ep-dispatch`` target: torchtitan's expert-parallel token dispatch.

Where it sits: in the gate's engine, above ``program_rows``, beneath ``targets``.
torchtitan is an optional extra (``vargather[torchtitan]``, then torchtitan itself
with ``--no-deps``), imported inside functions only and typed ``Any``. Programs drive
``AllToAllTokenDispatcher`` (0.3.0) as MoE layers drive it; the oracle regroups the
tokens by expert on one process (``expected_layer``). docs/targets.md describes it, the
rows and the backends drawn.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from hypothesis import strategies as st

from . import emulate
from .family import values
from .program_rows import (
    FLOAT_DTYPES,
    ProgramRow,
    ProgramTarget,
    StepsReport,
    all_worlds,
    differences,
    in_turn,
    multi_worlds,
    raised_message,
)
from .progress import Progress

BACKENDS: Final = ("spmd_types", "partial_dtensor")


@dataclass(frozen=True)
class Layer:
    """One MoE layer: ``experts`` per rank, ``top_k`` distinct experts per token,
    ``tokens`` per rank (the padded sequence, the same on every rank), ``dim``;
    ``plus_id``: expert ``j`` adds ``j`` (else the identity); ``unit``: each token's
    scores sum to one; ``grad``: backward through combine and dispatch."""

    experts: int
    top_k: int
    tokens: int
    dim: int
    plus_id: bool
    unit: bool
    grad: bool
    seed: int


@dataclass(frozen=True)
class DispatchProgram:
    """MoE layers built in order, then run in turn, on ``world_size`` ranks."""

    world_size: int
    layers: tuple[Layer, ...]
    dtype: str = "float32"
    backend: str = "spmd_types"


def describe(program: DispatchProgram) -> str:
    layers = "; ".join(
        f"layer {i}: {ly.experts * program.world_size} experts ({ly.experts}/rank), "
        f"top-{ly.top_k}, {ly.tokens} tokens/rank, D={ly.dim}, "
        f"{'expert adds its id' if ly.plus_id else 'identity experts'}, "
        f"{'unit' if ly.unit else 'halves'} scores{', backward' if ly.grad else ''}"
        for i, ly in enumerate(program.layers)
    )
    return f"{program.world_size} ranks, {program.dtype}, {program.backend} backend: {layers}"


# --- the inputs and the oracle ---------------------------------------------------------


def routing(program: DispatchProgram, index: int, rank: int) -> tuple[torch.Tensor, ...]:
    """Rank ``rank``'s tokens ``(T, D)``, expert ids ``(T, K)`` (distinct per token),
    scores ``(T, K)`` float32 and upstream gradient ``(T, D)`` for layer ``index``."""
    layer = program.layers[index]
    experts = layer.experts * program.world_size
    gen = torch.Generator().manual_seed(layer.seed * 131 + rank)
    ids = [torch.randperm(experts, generator=gen)[: layer.top_k] for _ in range(layer.tokens)]
    ids_tk = torch.stack(ids) if ids else torch.zeros((0, layer.top_k), dtype=torch.long)
    if layer.unit:
        scores = torch.full((layer.tokens, layer.top_k), 1.0 / layer.top_k)
    else:
        scores = torch.randint(1, 3, (layer.tokens, layer.top_k), generator=gen) / 2.0
    x = values((layer.tokens, layer.dim), program.dtype, layer.seed * 131 + 17 * rank, False)
    up = values((layer.tokens, layer.dim), program.dtype, layer.seed * 131 + 17 * rank + 9, False)
    return x, ids_tk, scores.to(torch.float32), up


def _expert(rows: torch.Tensor, expert_ids: torch.Tensor, plus_id: bool) -> torch.Tensor:
    if not plus_id:
        return rows * 1
    return rows + expert_ids.to(rows.dtype).reshape(-1, 1)


def expected_layer(program: DispatchProgram, index: int, rank: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` should hold after layer ``index``: ``routed`` (its experts'
    tokens, expert-major, sources in rank order), ``counts`` (tokens per local expert),
    ``output`` (combine's result), and with ``grad`` ``grad_x``, ``grad_scores``."""
    layer = program.layers[index]
    world = program.world_size
    inputs = [routing(program, index, r) for r in range(world)]
    rows, counts = [], []
    for j in range(rank * layer.experts, (rank + 1) * layer.experts):
        count = 0
        for x, ids, _, _ in inputs:
            hit = (ids == j).any(dim=1)
            rows.append(x[hit])
            count += int(hit.sum())
        counts.append(count)
    x, ids, scores, up = inputs[rank]
    xg = x.clone().requires_grad_(layer.grad)
    sg = scores.clone().requires_grad_(layer.grad)
    out = torch.zeros_like(x)
    for k in range(layer.top_k):
        expert_out = _expert(xg, ids[:, k], layer.plus_id)
        out = out + (expert_out.to(torch.float32) * sg[:, k : k + 1]).to(x.dtype)
    result = {
        "routed": torch.cat(rows) if rows else torch.zeros((0, layer.dim), dtype=x.dtype),
        "counts": torch.tensor(counts, dtype=torch.long),
        "output": out.detach(),
    }
    if layer.grad:
        (out * up).sum().backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs
        assert xg.grad is not None
        assert sg.grad is not None
        result["grad_x"] = xg.grad
        result["grad_scores"] = sg.grad
    return result


# --- the strategy ----------------------------------------------------------------------


@st.composite
def _layer(draw: Any, world: int, grad: bool | None, empty: bool) -> Layer:
    experts = draw(st.integers(1, 2))
    top_k = draw(st.integers(1, min(2, experts * world)))
    tokens = draw(st.integers(0, 1)) if empty else draw(st.integers(0, 4))
    return Layer(
        experts=experts,
        top_k=top_k,
        tokens=tokens,
        dim=draw(st.integers(1, 3)),
        plus_id=draw(st.booleans()),
        unit=draw(st.booleans()),
        grad=draw(st.booleans()) if grad is None else grad,
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def dispatch_programs(
    draw: Any,
    world_sizes: Sequence[int],
    layers: int = 1,
    grad: bool | None = None,
    empty: bool = False,
    identity: bool = False,
) -> DispatchProgram:
    """A program of up to ``layers`` MoE layers on one of ``world_sizes`` (``grad``:
    backward always, never or drawn; ``empty``: at most one token per rank, so some
    rank sends some rank nothing; ``identity``: identity experts, unit scores)."""
    world = draw(st.sampled_from(list(world_sizes)))
    count = draw(st.integers(1, layers))
    drawn = [draw(_layer(world, grad, empty)) for _ in range(count)]
    if identity:
        drawn = [replace(ly, plus_id=False, unit=True) for ly in drawn]
    return DispatchProgram(
        world, tuple(drawn), draw(st.sampled_from(FLOAT_DTYPES)), draw(st.sampled_from(BACKENDS))
    )


# --- the rank side ---------------------------------------------------------------------


@functools.cache
def _mesh(world: int) -> Any:
    """This rank process's expert-parallel mesh (building one is collective: once)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))


def run_dispatch_program(ctx: Any, program: DispatchProgram) -> StepsReport:
    """Rank side: the backend and meshes as torchtitan's trainer sets them (one rank:
    EP off, no mesh), the dispatchers built in order, then each layer run in turn."""
    from torchtitan.distributed import spmd_types as titan_spmd  # untyped: Any
    from torchtitan.distributed import utils as titan_utils
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    titan_utils.set_spmd_backend(program.backend)
    mesh = _mesh(program.world_size) if program.world_size > 1 else None
    nccl = program.backend == "spmd_types" and mesh is not None
    if nccl:
        titan_spmd.set_spmd_meshes(dense_mesh=mesh, sparse_mesh=mesh)
    dispatchers = []
    for layer in program.layers:
        config = AllToAllTokenDispatcher.Config(
            num_experts=layer.experts * program.world_size, top_k=layer.top_k
        )
        dispatcher = AllToAllTokenDispatcher(config)
        dispatcher.wire_meshes(ep_mesh=mesh)
        dispatchers.append(dispatcher)
    if nccl:  # its list all_to_all of unequal tensors: NCCL takes it, gloo refuses it
        emulate.activate("nccl")
    try:
        return in_turn(
            len(program.layers), lambda i: _run_layer(dispatchers[i], program, i, ctx.rank)
        )
    finally:
        if nccl:
            emulate.activate(None)


def _run_layer(
    dispatcher: Any, program: DispatchProgram, index: int, rank: int
) -> dict[str, torch.Tensor]:
    layer = program.layers[index]
    x, ids, scores, up = routing(program, index, rank)
    xg = x.clone().requires_grad_(layer.grad)
    sg = scores.clone().requires_grad_(layer.grad)
    counts = torch.bincount(ids.reshape(-1), minlength=layer.experts * program.world_size)
    routed, per_local, metadata = dispatcher.dispatch(xg, sg, ids, counts)
    per_local = torch.as_tensor(per_local).to(torch.long)
    local_ids = torch.arange(layer.experts) + rank * layer.experts
    expert_of_row = local_ids.repeat_interleave(per_local, output_size=routed.shape[0])
    out = dispatcher.combine(_expert(routed, expert_of_row, layer.plus_id), metadata, xg)
    result = {
        "routed": routed.detach().clone(),
        "counts": per_local.clone(),
        "output": out.detach().clone(),
    }
    if layer.grad:
        (out * up).sum().backward()
        for name, t in (("grad_x", xg), ("grad_scores", sg)):
            result[name] = t.grad.clone() if t.grad is not None else torch.zeros(0)
    return result


def judge_dispatch(
    program: DispatchProgram, reports: Sequence[StepsReport]
) -> list[tuple[str, str]]:
    """The failures of one program, as (aspect, message): ``raised``, ``routed``
    (a rank's tokens are not its experts' tokens in order), ``sizes`` (per-expert
    counts), ``output`` (combine's result), ``gradient``."""
    errors = {r: rep.error for r, rep in enumerate(reports) if rep.error is not None}
    if errors:
        return [("raised", raised_message(errors, "layer"))]
    aspects = {"routed": "routed", "counts": "sizes", "output": "output"}
    for index in range(len(program.layers)):
        failures: list[tuple[str, str]] = []
        for rank, rep in enumerate(reports):
            got, want = dict(rep.steps[index]), expected_layer(program, index, rank)
            for name in ("grad_x", "grad_scores"):
                if name in got and name in want and got[name].is_floating_point():
                    # a gradient summing to zero: its zero's sign follows the order of
                    # the sum (IEEE 754), not the routing; +0.0 for both
                    got[name], want[name] = got[name] + 0.0, want[name] + 0.0
            failures += differences(f"layer {index}, rank {rank}", got, want, aspects)
        if failures:
            return failures
    return []


ROWS: Final = (
    ProgramRow(
        "dispatch",
        "dispatch: each rank receives its experts' tokens from every rank, expert-major, "
        "sources in rank order, with the per-expert counts",
        lambda w: dispatch_programs(w, grad=False),
        all_worlds,
    ),
    ProgramRow(
        "round-trip",
        "dispatch then combine with identity experts and unit scores is the identity",
        lambda w: dispatch_programs(w, identity=True),
        all_worlds,
    ),
    ProgramRow(
        "gradient",
        "backward through combine and dispatch: x's and the scores' gradients, each "
        "rank's upstream differing",
        lambda w: dispatch_programs(w, grad=True),
        all_worlds,
    ),
    ProgramRow(
        "empty",
        "at most one token per rank: ranks that send some rank nothing, experts with none",
        lambda w: dispatch_programs(w, empty=True),
        multi_worlds,
    ),
    ProgramRow(
        "layers",
        "several MoE layers (their own expert and top-k counts) built in one process, "
        "then run in turn",
        lambda w: dispatch_programs(w, layers=3),
        multi_worlds,
    ),
)


def _prepare(progress: Progress) -> tuple[str, dict[str, str]]:
    from importlib.metadata import version

    release = version("torchtitan")
    return f"torchtitan {release}: {TARGET.display}", {"torchtitan": release}


TARGET: Final = ProgramTarget(
    display="AllToAllTokenDispatcher dispatch / combine",
    call="dispatch(x_TD, topk_scores_TK, topk_expert_ids_TK, num_local_tokens_per_expert_E); "
    "combine(routed_output_RD, metadata, x_TD)",
    rows=ROWS,
    run=run_dispatch_program,
    judge=judge_dispatch,
    describe=describe,
    scope={
        "--tokens": "the same count on every rank (MoE pads the sequence before routing)",
        "--emulate": "nccl for the spmd_types backend (its list all_to_all is uneven)",
    },
    prepare=_prepare,
)

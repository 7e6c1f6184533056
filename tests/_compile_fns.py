"""Rank-side functions of tests/test_compile.py (module-level, so they pickle).

Every value in the training step is a small integer (inputs, weights, the per-rank loss
weights), so every float sum is exact whatever order a backend adds in: the compiled
step must then give the eager step's bytes, and a difference is a real one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather.testing import RankContext

# Every collective of a compiled step waits this long for its peers: the ranks compile
# concurrently on a shared machine and may reach the first collective far apart.
STEP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class StepCase:
    backend: str
    grad: str
    sizes: tuple[int, ...]
    pass_sizes: bool = True
    fullgraph: bool = True
    transport: str = "auto"
    validate: bool = True
    dim: int = 0
    mesh: tuple[int, ...] | None = None  # gather over init_device_mesh("cpu", mesh) ...
    mesh_dim: int | str | None = None  # ... along this mesh dimension


@dataclass(frozen=True)
class StepResult:
    """One rank's eager and compiled results, and what dynamo counted."""

    eager_out: torch.Tensor
    compiled_out: list[torch.Tensor]  # one per compiled call
    eager_grads: dict[str, torch.Tensor]
    compiled_grads: list[dict[str, torch.Tensor]]
    graph_breaks: int  # counters["graph_break"] over all compiled calls
    break_reasons: tuple[str, ...]  # the distinct reasons counted there (first lines)
    unique_graphs: int  # counters["stats"]["unique_graphs"]
    explain_breaks: int  # torch._dynamo.explain's graph_break_count, one call
    explain_graphs: int


_MESHES: dict[tuple[tuple[int, ...], tuple[str, ...] | None], Any] = {}


def mesh_of(shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
    """``init_device_mesh("cpu", shape)``, created once per world (creation is collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (shape, names)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return _MESHES[key]


def _model(seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.weight.copy_(torch.randint(-3, 4, lin.weight.shape, generator=g).float())
        lin.bias.copy_(torch.randint(-3, 4, lin.bias.shape, generator=g).float())
    return lin


def _input(case: StepCase, rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    shape = (n, 3) if case.dim == 0 else (2, n, 3)
    return torch.randint(-4, 5, shape, generator=g).float().requires_grad_(True)


def _group_kwargs(case: StepCase) -> dict[str, Any]:
    if case.mesh is None:
        return {}
    kwargs: dict[str, Any] = {"group": mesh_of(case.mesh)}
    if case.mesh_dim is not None:
        kwargs["mesh_dim"] = case.mesh_dim
    return kwargs


def _gather_sizes(case: StepCase, rank: int) -> tuple[int, ...]:
    """The sizes of the group this rank gathers in (the mesh dim's group, if any)."""
    if case.mesh is None:
        return case.sizes
    group = mesh_of(case.mesh).get_group(case.mesh_dim)
    return tuple(case.sizes[r] for r in dist.get_process_group_ranks(group))


def _step_fn(case: StepCase, rank: int, lin: torch.nn.Linear) -> Any:
    sizes = list(_gather_sizes(case, rank)) if case.pass_sizes else None
    kwargs = _group_kwargs(case)
    # The loss differs on every rank: under "sum" each rank's gradient then needs the
    # others' upstream gradients, so a wrong backward cannot hide.
    scale = float(rank + 1)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = lin(x)
        out = vargather.all_gather_v(
            h,
            case.dim,
            sizes=sizes,
            grad=case.grad,  # type: ignore[arg-type]  # the case's string
            transport=case.transport,  # type: ignore[arg-type]  # the case's string
            validate=case.validate,
            timeout=STEP_TIMEOUT_S,
            **kwargs,
        )
        rows = torch.arange(out.shape[case.dim], dtype=out.dtype) - 2.0
        rows = rows.reshape([-1] + [1] * (out.dim() - 1 - case.dim))
        loss = (out * rows * scale).sum() + (out * out).sum()
        return out, loss

    return step


def _run(step: Any, x: torch.Tensor, lin: torch.nn.Linear) -> tuple[torch.Tensor, dict[str, Any]]:
    lin.zero_grad(set_to_none=True)
    x.grad = None
    out, loss = step(x)
    loss.backward()
    grads = {
        "weight": lin.weight.grad,
        "bias": lin.bias.grad,
        "x": x.grad,
        "loss": loss.detach(),
    }
    return out.detach(), {k: v.detach().clone() for k, v in grads.items() if v is not None}


def warm_backend(ctx: RankContext, backend: str) -> float:
    """Compile and run a gather-free step with ``backend``: a backend's one-time cost
    in a process (inductor's, tens of seconds on a loaded machine) is paid here, in a
    pool call of its own, not in the timed-out call of the test that follows."""
    torch._dynamo.reset()
    lin = _model(1)
    out = torch.compile(lambda t: lin(t).sum(), backend=backend, fullgraph=True)(torch.ones(2, 3))
    torch._dynamo.reset()
    return float(out)


def compiled_step(ctx: RankContext, case: StepCase) -> StepResult:
    """Eager step, then the same step compiled (called twice), on this rank."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    n = case.sizes[ctx.rank]
    lin = _model(7)
    x = _input(case, ctx.rank, n)
    step = _step_fn(case, ctx.rank, lin)
    eager_out, eager_grads = _run(step, x, lin)

    explained = torch._dynamo.explain(step)(x)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend=case.backend, fullgraph=case.fullgraph)
    outs, grads = [], []
    for _ in range(2):
        out, g = _run(compiled, x, lin)
        outs.append(out)
        grads.append(g)
    breaks = sum(counters["graph_break"].values())
    reasons = tuple(sorted(r.splitlines()[0] for r in counters["graph_break"]))
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return StepResult(
        eager_out,
        outs,
        eager_grads,
        grads,
        breaks,
        reasons,
        graphs,
        explained.graph_break_count,
        explained.graph_count,
    )


def changing_sizes(ctx: RankContext, sizes_per_call: tuple[tuple[int, ...], ...]) -> list[bool]:
    """One compiled step (aot_eager, fullgraph) called with different ragged sizes:
    whether each call's output and gradients equal eager's."""
    torch._dynamo.reset()
    lin = _model(3)
    same = []
    compiled_steps: dict[str, Any] = {}

    def step(x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        out = vargather.all_gather_v(lin(x), 0, sizes=sizes, timeout=STEP_TIMEOUT_S)
        return out, (out * (ctx.rank + 1)).sum()

    compiled_steps["c"] = torch.compile(step, backend="aot_eager", fullgraph=True)
    for sizes in sizes_per_call:
        case = StepCase("aot_eager", "sum", sizes)
        x = _input(case, ctx.rank, sizes[ctx.rank])
        want = _run(lambda t, s=list(sizes): step(t, s), x, lin)  # bound now
        got = _run(lambda t, s=list(sizes): compiled_steps["c"](t, s), x, lin)
        same.append(
            torch.equal(want[0], got[0])
            and want[1].keys() == got[1].keys()
            and all(torch.equal(want[1][k], got[1][k]) for k in want[1])
        )
    torch._dynamo.reset()
    return same


def with_layout_unsized(ctx: RankContext, _payload: object = None) -> tuple[int, int, str]:
    """``all_gather_v_with_layout`` without sizes, compiled: dynamo's break and graph
    counts with ``fullgraph=False``, and what ``fullgraph=True`` raised."""
    from torch._dynamo.utils import counters

    def gather(t: torch.Tensor) -> torch.Tensor:
        out, layout = vargather.all_gather_v_with_layout(t * 2, 0, timeout=STEP_TIMEOUT_S)
        return out * layout.total

    x = torch.full((ctx.rank + 1, 2), float(ctx.rank))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(gather)(x)
    torch._dynamo.reset()
    refused = ""
    try:
        torch.compile(gather, backend="eager", fullgraph=True)(x)
    except Exception as err:
        refused = str(err)
    torch._dynamo.reset()
    counters.clear()
    return explained.graph_break_count, explained.graph_count, refused


def compiled_lie(ctx: RankContext, world: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """A gather where the last rank passes sizes that lie about its own shard, eager and
    compiled (fullgraph): what each raised (type, message, blamed ranks)."""
    torch._dynamo.reset()
    sizes = [2] * world
    x = torch.ones(3 if ctx.rank == world - 1 else 2, 2)

    def gather(t: torch.Tensor) -> torch.Tensor:
        return vargather.all_gather_v(t, 0, sizes=sizes, timeout=STEP_TIMEOUT_S)

    raised = []
    for fn in (gather, torch.compile(gather, backend="aot_eager", fullgraph=True)):
        try:
            fn(x)
        except vargather.VarGatherError as err:
            raised.append((type(err).__name__, str(err), err.ranks))
        else:
            raised.append(("nothing", "", ()))
    torch._dynamo.reset()
    return raised


def compiled_with_layout(ctx: RankContext, world: int) -> list[tuple[Any, ...]]:
    """``all_gather_v_with_layout`` compiled with fullgraph, called with three different
    sizes (dynamo makes them dynamic at the second): per call, the compiled tensor,
    sizes and offsets next to eager's; then dynamo's graph-break and graph counts."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()

    def gather(
        t: torch.Tensor, sizes: list[int]
    ) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...], int]:
        out, layout = vargather.all_gather_v_with_layout(t, 0, sizes=sizes, timeout=STEP_TIMEOUT_S)
        return out * 1, layout.sizes, layout.offsets, layout.max_size

    compiled = torch.compile(gather, backend="aot_eager", fullgraph=True)
    rows: list[tuple[Any, ...]] = []
    for k in range(3):
        sizes = [(r + k) % 3 + k for r in range(world)]
        x = torch.full((sizes[ctx.rank], 2), float(ctx.rank))
        got = compiled(x, sizes)
        eager = vargather.all_gather_v_with_layout(x, 0, sizes=sizes)
        want = (eager.tensor, eager.layout.sizes, eager.layout.offsets, eager.layout.max_size)
        rows.append((got, want))
    rows.append((sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]))
    torch._dynamo.reset()
    return rows


def mesh_gather(ctx: RankContext, spec: tuple[tuple[int, ...], object, bool]) -> Any:
    """Eager gather over a device mesh of ``shape`` along ``mesh_dim`` (``names``: name
    the dims ``("a", "b", ...)``), next to the same gather over the mesh dim's group."""
    shape, mesh_dim, names = spec
    dim_names = tuple("abcd"[: len(shape)]) if names else None
    mesh = mesh_of(shape, dim_names)
    x = torch.full((ctx.rank + 1, 2), float(ctx.rank))
    kwargs: dict[str, Any] = {} if mesh_dim is None else {"mesh_dim": mesh_dim}
    out = vargather.all_gather_v(x, group=mesh, **kwargs)
    layout = vargather.gather_layout(x, group=mesh, **kwargs)
    group = mesh.get_group(mesh_dim)
    ref = vargather.all_gather_v(x, group=group)
    return out, ref, layout.sizes, dist.get_process_group_ranks(group)


def mesh_misuse(ctx: RankContext, spec: tuple[tuple[int, ...], str]) -> None:
    """A misuse of ``group=``/``mesh_dim=`` that must raise on this rank."""
    shape, what = spec
    mesh = mesh_of(shape)
    x = torch.ones(2, 2)
    if what == "no mesh_dim":
        vargather.all_gather_v(x, group=mesh)
    elif what == "mesh_dim out of range":
        vargather.all_gather_v(x, group=mesh, mesh_dim=len(shape))
    elif what == "mesh_dim name unknown":
        vargather.all_gather_v(x, group=mesh, mesh_dim="nope")
    elif what == "mesh_dim without a mesh":
        vargather.all_gather_v(x, group=None, mesh_dim=0)
    elif what == "compiled, no mesh_dim":
        torch._dynamo.reset()
        try:
            torch.compile(
                lambda t: vargather.all_gather_v(t, sizes=[2] * ctx.world_size, group=mesh),
                backend="eager",
            )(x)
        finally:
            torch._dynamo.reset()
    else:
        raise AssertionError(what)


# --- no compiler decision may change which collectives a rank issues --------------------


@dataclass(frozen=True)
class Scenario:
    """A compiled training step on every rank: ``x * w`` (``w`` a parameter, so every rank
    has a gradient even with an empty shard), gathered, a loss that differs per rank,
    backward; called once per entry of ``size_sets`` (a recompile, or dynamic sizes).

    ``shape``: ``"unused"`` gathers and ignores the output, ``"twice"`` gathers the same
    tensor twice, ``"crossed"`` gathers a second, independent tensor whose sizes are the
    first's reversed (a rank with a large first block has a small second one: a
    compiler ordering by buffer sizes orders them differently per rank),
    ``"zero-trailing"`` gathers ``(n, 0)`` shards (every upstream gradient has zero
    elements), ``"plain"`` is the step itself.
    """

    backend: str
    grads: tuple[str, ...]
    size_sets: tuple[tuple[int, ...], ...]
    pass_sizes: bool = True
    shape: str = "plain"
    dynamic: bool | None = None


@dataclass(frozen=True)
class ScenarioCall:
    """One call of one contract's step on this rank: eager next to compiled."""

    grad: str
    sizes: tuple[int, ...]
    eager_issued: tuple[int, int]  # collectives in the forward, in the backward
    compiled_issued: tuple[int, int]
    eager: tuple[torch.Tensor, ...]  # output, loss, w.grad, x.grad
    compiled: tuple[torch.Tensor, ...]


def _scenario_step(sc: Scenario, grad: str, rank: int, w: torch.Tensor) -> Any:
    # The loss weighs each rank differently (a wrong backward cannot hide behind equal
    # upstream gradients), through 0-d tensors rather than Python numbers: a number is
    # baked into inductor's kernels, a tensor is an input, so the kernels that do not
    # depend on this rank's shard shape are the same source on every rank, and a cold
    # cache compiles each of them once (inductor's file lock) instead of once per rank.
    k1, k2, k3, k5 = (torch.tensor(float(rank + i)) for i in (1, 2, 3, 5))

    def gather(h: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
        return vargather.all_gather_v(
            h,
            0,
            sizes=sizes,
            grad=grad,  # type: ignore[arg-type]  # the scenario's string
            timeout=STEP_TIMEOUT_S,
        )

    def step(x: torch.Tensor, sizes: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * w
        out = gather(h, sizes)
        if sc.shape == "unused":
            return h.detach(), (h * k1).sum()
        rows = torch.arange(out.shape[0], dtype=out.dtype).reshape(-1, 1) - 2.0
        loss = (out * rows * k1).sum() + (out * out).sum()
        if sc.shape == "twice":
            again = gather(h, sizes)
            loss = loss + (again * k3).sum()
        if sc.shape == "crossed":
            mirrored = None if sizes is None else sizes[::-1]
            n = x.shape[0] if sizes is None else mirrored[rank]  # type: ignore[index]  # a list
            other = x.new_ones((n, x.shape[1])) * k2 * w
            loss = loss + (gather(other, mirrored) * k5).sum()
        return out.detach(), loss

    return step


def _scenario_input(sc: Scenario, rank: int, n: int, call: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + rank)
    cols = 0 if sc.shape == "zero-trailing" else 4
    return torch.randint(-4, 5, (n, cols), generator=g).float().requires_grad_(True)


def _issued_by(fn: Any, x: torch.Tensor, w: torch.Tensor, sizes: list[int] | None) -> Any:
    from vargather import _comm

    w.grad = None
    x.grad = None
    before = _comm.collectives_issued()
    out, loss = fn(x, sizes)
    middle = _comm.collectives_issued()
    loss.backward()
    after = _comm.collectives_issued()
    assert w.grad is not None
    x_grad = x.grad if x.grad is not None else torch.zeros_like(x)
    tensors = (out, loss.detach(), w.grad.detach().clone(), x_grad.detach().clone())
    return (middle - before, after - middle), tensors


def compiled_scenario(ctx: RankContext, sc: Scenario) -> list[ScenarioCall]:
    """Every contract of ``sc``, eager then compiled (``fullgraph=True``), for each size
    set: the collectives each issued on this rank and what each computed."""
    calls: list[ScenarioCall] = []
    for grad in sc.grads:
        torch._dynamo.reset()
        cols = 0 if sc.shape == "zero-trailing" else 4
        w = torch.arange(1.0, cols + 1.0).requires_grad_(True)
        step = _scenario_step(sc, grad, ctx.rank, w)
        compiled = torch.compile(step, backend=sc.backend, fullgraph=True, dynamic=sc.dynamic)
        for k, sizes in enumerate(sc.size_sets):
            x = _scenario_input(sc, ctx.rank, sizes[ctx.rank], k)
            passed = list(sizes) if sc.pass_sizes else None
            eager_issued, eager = _issued_by(step, x, w, passed)
            compiled_issued, got = _issued_by(compiled, x, w, passed)
            calls.append(ScenarioCall(grad, sizes, eager_issued, compiled_issued, eager, got))
    torch._dynamo.reset()
    return calls

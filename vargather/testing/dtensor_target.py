"""The ``dtensor`` target: DTensor programs as trainers run them, against an oracle.

Where it sits: in the gate's engine, above ``program_rows`` and ``dtensor_program``
(a program and its oracle, where the math is stated), beneath ``targets``. Here: the
strategies and the last shrinking passes, the rank side, the judge and the rows.

Every choice is drawn so that Hypothesis shrinks toward the smallest program: the
world (ascending), the mesh (1-D before 2-D before 3-D), no flattened views, the world
mesh before its views and submeshes, fewer tensor dims and rows, ``float32``, fewer
steps, ``Replicate`` before ``Shard``. docs/targets.md lists what is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from hypothesis import strategies as st

from .asserts import bitwise_difference
from .dtensor_program import (
    FLOATS,
    DTensorProgram,
    expected_gradient,
    expected_local,
    global_tensor,
    on_sizes,
    parse,
    start_local,
    upstream_local,
)
from .program_rows import ProgramRow, ProgramTarget, all_worlds

# --- the strategies ------------------------------------------------------------------

DTYPES: Final = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "bool", "uint8")
KINDS: Final = ("programs", "flattened", "entry", "gradient")
"""``programs``: any mesh setup, 1 to 4 steps; ``flattened``: at least one flattened
view alive; ``entry``: no steps (``distribute_tensor``, ``from_local``, ``full_tensor``
alone); ``gradient``: a floating dtype, through backward."""
MAX_STEPS: Final = 4
MAX_ROWS: Final = 7
_NAMES: Final = {
    1: (("dp",),),
    2: (("dp_shard", "tp"), ("dp_replicate", "dp_shard")),
    3: (("dp_replicate", "dp_shard", "tp"),),
}
"""Dim names from trainers' vocabularies (torchtitan's). Names change nothing DTensor
computes, and every (mesh, names) is one more world mesh of gloo groups per rank."""


def mesh_shapes(world: int) -> list[tuple[int, ...]]:
    """Every world mesh of ``world`` ranks with 1 to 3 dims, 1-D first."""
    out: list[tuple[int, ...]] = [(world,)]
    twos = [(a, world // a) for a in range(1, world + 1) if world % a == 0]
    out += twos
    out += [(a, b, rest // b) for a, rest in twos for b in range(1, rest + 1) if rest % b == 0]
    return out


def _merging(mesh: Sequence[int]) -> bool:
    return sum(size > 1 for size in mesh) >= 2


def worlds_for(kind: str, world_sizes: Sequence[int]) -> list[int]:
    """The worlds a row of ``kind`` draws, ascending: for ``flattened``, those with a
    mesh of two dims of size > 1 (where a flattened view merges collectives: 4 of 1-4
    ranks), or all of them when none has one."""
    worlds = sorted(all_worlds(world_sizes))
    if kind == "flattened":
        return [w for w in worlds if any(_merging(m) for m in mesh_shapes(w))] or worlds
    return worlds


def _adjacent(ndim: int, lengths: range) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of ``lengths`` adjacent dims of ``ndim``, shortest first."""
    return [(a, a + n - 1) for n in lengths for a in range(ndim - n + 1)]


@st.composite
def placements(
    draw: Any, sizes: Sequence[int], ndim: int, partial: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """One placement code per mesh dim of ``sizes`` for a tensor of ``ndim`` dims;
    ``partial``: the Partial reductions a ``Replicate`` dim may become (the start's)."""
    codes: list[str] = []
    for _ in sizes:
        # 0: Replicate; 1..ndim: Shard(c - 1); ndim + 1: the tensor dim the last Shard
        # cut, once more (nested sharding, as FSDP2 over TP makes it)
        c = draw(st.integers(0, ndim + 1))
        shards = [code for code in codes if code.startswith("S")]
        if c == ndim + 1:
            codes.append(shards[-1] if shards else "S0")
        else:
            codes.append("R" if c == 0 else f"S{c - 1}")
    seen: set[str] = set()
    for i, code in enumerate(codes):  # FSDP2 + TP: the first mesh dim sharding a dim
        if not code.startswith("S") or code in seen:
            continue
        seen.add(code)
        split = split_after(codes, i, sizes)
        if split is not None and draw(st.booleans()):
            codes[i] = f"SS{code[1:]}/{split}"
    if partial:  # one reduction: torch refuses mixed Partial types in one placement
        reduction = draw(st.sampled_from(partial))
        for i, code in enumerate(codes):
            if code == "R" and draw(st.booleans()):
                codes[i] = f"P:{reduction}"
    return tuple(codes)


def _evenly_strided(start: Sequence[str], sizes: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether every ``_StridedShard`` dim divides evenly (``distribute_tensor`` refuses
    an uneven one, as its docstring says)."""
    cuts = enumerate(map(parse, start))
    return all(shape[dim] % (sizes[i] * k) == 0 for i, (kind, dim, k) in cuts if kind == "SS")


@st.composite
def program_on(draw: Any, world: int, kind: str) -> DTensorProgram:
    """A ``DTensorProgram`` of ``kind`` (one of ``KINDS``) on a world of ``world`` ranks."""
    shapes = mesh_shapes(world)
    if kind == "flattened":  # where a view can merge collectives: two dims of size > 1
        shapes = [m for m in shapes if _merging(m)] or [m for m in shapes if len(m) > 1]
    mesh = draw(st.sampled_from(shapes))
    names = draw(st.sampled_from(_NAMES[len(mesh)]))
    runs = _adjacent(len(mesh), range(2, len(mesh) + 1))  # what a view can flatten
    views = tuple(
        dict.fromkeys(  # unique, in the order drawn
            draw(st.lists(st.sampled_from(runs), unique=True, min_size=int(kind == "flattened")))
            if runs
            else ()
        )
    )
    subs = _adjacent(len(mesh), range(1, len(mesh)))  # proper submeshes
    # the kind of mesh first (the world mesh as likely as all views, as all submeshes)
    ons: dict[str, list[tuple[str, int, int]]] = {"world": [("world", 0, len(mesh) - 1)]}
    ons["flat"] = [("flat", a, b) for a, b in views]
    ons["sub"] = [("sub", a, b) for a, b in subs]
    kinds = [k for k in ("world", "flat", "sub") if ons[k]]
    on = draw(st.sampled_from(ons[draw(st.sampled_from(kinds))]))
    kind_, a, b = on
    sizes = (math.prod(mesh[a : b + 1]),) if kind_ == "flat" else mesh[a : b + 1]
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, MAX_ROWS), min_size=ndim, max_size=ndim)))
    pool = [d for d in DTYPES if d in FLOATS] if kind == "gradient" else list(DTYPES)
    dtype = draw(st.sampled_from(pool))
    reductions: tuple[str, ...] = ()
    if dtype in FLOATS:
        reductions = ("sum", "avg")
    elif dtype not in ("bool", "uint8"):
        reductions = ("sum",)
    start = draw(placements(sizes, ndim, reductions))
    entry = draw(st.sampled_from(("distribute", "from_local")))
    if any(p.startswith("P") for p in start) or not _evenly_strided(start, sizes, shape):
        entry = "from_local"
    if kind == "entry":
        steps: list[tuple[str, ...]] = []
    else:
        steps = draw(st.lists(placements(sizes, ndim), min_size=1, max_size=MAX_STEPS))
    grad = dtype in FLOATS and bool(steps) and (kind == "gradient" or draw(st.booleans()))
    values = draw(st.sampled_from(("arange", "bits")))
    return DTensorProgram(
        world_size=world,
        mesh=mesh,
        names=names,
        views=views,
        on=on,
        shape=shape,
        entry=entry,
        start=start,
        steps=tuple(steps),
        dtype=dtype,
        values=values,
        requires_grad=grad,
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def dtensor_programs(
    draw: Any, world_sizes: Sequence[int], kind: str = "programs"
) -> DTensorProgram:
    """A ``DTensorProgram`` of ``kind`` (one of ``KINDS``) on a world of
    ``world_sizes`` (1 to 4 ranks), smaller worlds first."""
    world = draw(st.sampled_from(worlds_for(kind, world_sizes)))
    program: DTensorProgram = draw(program_on(world, kind))
    return program


# --- the last shrinking passes --------------------------------------------------------


def _without_mesh_dim(program: DTensorProgram, d: int) -> DTensorProgram | None:
    """``program`` with mesh dim ``d`` (of size 1) removed, or ``None`` when that is no
    smaller program (a 1-D mesh, a dim of size > 1, the only dim the tensor lives on)."""
    if len(program.mesh) == 1 or program.mesh[d] != 1:
        return None

    def remap(run: tuple[int, int]) -> tuple[int, int]:
        a, b = run
        if d < a:
            return (a - 1, b - 1)
        return (a, b - 1) if d <= b else (a, b)

    kind, a, b = program.on
    inside = a <= d <= b
    if inside and a == b:
        return None
    # Two views that become one layout keep one name: torch's _flatten of a name it
    # already holds with the same layout is a no-op, so dropping the copy is faithful.
    views = tuple(dict.fromkeys(remap(v) for v in program.views if remap(v)[1] > remap(v)[0]))
    first, last = remap((a, b))
    if kind == "flat" and (first, last) not in views:
        return None
    if kind == "sub" and (first, last) == (0, len(program.mesh) - 2):
        kind = "world"  # a submesh of every dim left is the world mesh

    def cut(codes: tuple[str, ...]) -> tuple[str, ...]:
        if kind == "flat" or not inside:
            return codes
        return codes[: d - a] + codes[d - a + 1 :]

    return replace(
        program,
        mesh=program.mesh[:d] + program.mesh[d + 1 :],
        names=program.names[:d] + program.names[d + 1 :],
        views=views,
        on=(kind, first, last),
        start=cut(program.start),
        steps=tuple(cut(step) for step in program.steps),
    )


def _without_tensor_dim(program: DTensorProgram, i: int) -> DTensorProgram | None:
    """``program`` with tensor dim ``i`` removed (the dims after it renumbered), or
    ``None`` when a placement shards it or it is the only dim."""
    if len(program.shape) == 1:
        return None

    def renumber(code: str) -> str | None:
        kind, dim, split = parse(code)
        if dim < 0:
            return code
        new = dim - (dim > i)
        return None if dim == i else f"SS{new}/{split}" if kind == "SS" else f"S{new}"

    placements = []
    for codes in (program.start, *program.steps):
        renumbered = [renumber(c) for c in codes]
        if any(c is None for c in renumbered):
            return None
        placements.append(tuple(c for c in renumbered if c is not None))
    return replace(
        program,
        shape=program.shape[:i] + program.shape[i + 1 :],
        start=placements[0],
        steps=tuple(placements[1:]),
    )


def _with_mesh_dim_of_one(program: DTensorProgram, d: int) -> DTensorProgram:
    """``program`` with mesh dim ``d`` of size 1 (a smaller world), its
    ``_StridedShard`` split factors recomputed for the new sizes."""
    mesh = (*program.mesh[:d], 1, *program.mesh[d + 1 :])
    smaller = replace(program, world_size=math.prod(mesh), mesh=mesh)
    sizes = on_sizes(smaller)

    def resplit(codes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(
            f"SS{parse(c)[1]}/{split_after(codes, i, sizes) or 1}" if c.startswith("SS") else c
            for i, c in enumerate(codes)
        )

    return replace(
        smaller, start=resplit(program.start), steps=tuple(resplit(s) for s in program.steps)
    )


def smaller_programs(
    program: DTensorProgram, worlds: Sequence[int] = (1, 2, 3, 4)
) -> list[DTensorProgram]:
    """The ``_valid`` programs one edit smaller than ``program``, in a fixed order (the
    passes run after Hypothesis's shrinking, which does not see across a mesh's dims):
    fewer steps (or the start moved to where the first step arrives), a mesh dim made
    size 1 (a smaller world among ``worlds``), a size-1 mesh dim gone, a view the
    tensor does not live on gone, a tensor dim no placement shards gone, fewer rows
    (half, or one fewer), a placement made ``Replicate``, then plainer values."""
    out: list[DTensorProgram | None] = []
    if len(program.steps) > (1 if program.requires_grad else 0):
        steps = program.steps
        out += [replace(program, steps=steps[:k] + steps[k + 1 :]) for k in range(len(steps))]
        # the start where the first step arrives
        begun = replace(program, start=program.steps[0], steps=program.steps[1:])
        if not _valid(begun):
            begun = replace(begun, entry="from_local")
        out.append(begun)
    for d in range(len(program.mesh)):
        if program.mesh[d] > 1 and program.world_size // program.mesh[d] in worlds:
            out.append(_with_mesh_dim_of_one(program, d))
    out += [_without_mesh_dim(program, d) for d in range(len(program.mesh))]
    for v in program.views:
        if ("flat", *v) != program.on:
            out.append(replace(program, views=tuple(w for w in program.views if w != v)))
    out += [_without_tensor_dim(program, i) for i in range(len(program.shape))]
    for i, n in enumerate(program.shape):
        for smaller_n in sorted({n // 2, n - 1} - {n, -1}):
            shape = (*program.shape[:i], smaller_n, *program.shape[i + 1 :])
            entry = program.entry
            if not _evenly_strided(program.start, on_sizes(program), shape):
                entry = "from_local"
            out.append(replace(program, shape=shape, entry=entry))
    stages = (program.start, *program.steps)
    for k, codes in enumerate(stages):
        for i, code in enumerate(codes):
            if code != "R":
                plain = (*stages[:k], (*codes[:i], "R", *codes[i + 1 :]), *stages[k + 1 :])
                out.append(replace(program, start=plain[0], steps=plain[1:]))
    plainer = (
        replace(program, dtype="float32"),
        replace(program, requires_grad=False),
        replace(program, values="arange"),
        replace(program, seed=0),
        replace(program, entry="distribute"),
    )
    out += [p for p in plainer if p != program]
    return [p for p in out if p is not None and _valid(p)]


def split_after(codes: Sequence[str], i: int, sizes: Sequence[int]) -> int | None:
    """The split factor FSDP2 with TP gives mesh dim ``i``'s shard of tensor dim ``d``:
    the product of the sizes of the later mesh dims that ``Shard(d)`` (``None``: none
    does)."""
    dim = parse(codes[i])[1]
    later = [sizes[j] for j in range(i + 1, len(codes)) if codes[j] == f"S{dim}"]
    return math.prod(later) if later else None


def strided_consistent(codes: Sequence[str], sizes: Sequence[int]) -> bool:
    """Whether every ``_StridedShard(d, split_factor=k)`` in ``codes`` is as FSDP2 with
    TP makes it: later mesh dims ``Shard(d)`` too, and ``k`` is their sizes' product
    (the oracle's right-to-left reading holds only then)."""
    return all(
        split_after(codes, i, sizes) == parse(c)[2] for i, c in enumerate(codes) if c[:2] == "SS"
    )


def _valid(program: DTensorProgram) -> bool:
    sizes = on_sizes(program)
    if not all(strided_consistent(c, sizes) for c in (program.start, *program.steps)):
        return False
    return program.entry != "distribute" or (
        not any(p.startswith("P") for p in program.start)
        and _evenly_strided(program.start, sizes, program.shape)
    )


# --- the rank side ---------------------------------------------------------------------
# Meshes and views are cached per rank process (``_setup``): a fresh mesh per setup
# would create thousands of gloo groups.

_ROOTS: dict[tuple[Any, ...], Any] = {}
"""The world meshes built in this rank process, by (shape, dim names)."""
_VIEWS: dict[tuple[Any, ...], dict[str, Any]] = {}
"""Every flattened view each world mesh has had, by name (each created once)."""


def _setup(program: DTensorProgram) -> Any:
    """The mesh the program's tensor lives on, its world mesh holding exactly the
    program's flattened views, in the program's order (its ``_flatten_mapping``, the
    registry ``redistribute`` consults, reset to them; each view created once)."""
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
    each state's ``to_local()`` and ``full_tensor()``, then one backward of the loss
    ``dtensor_program`` states, with this rank's own upstream pieces."""
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
    display="torch.distributed.tensor: DTensor programs (distribute_tensor, from_local, "
    "redistribute, full_tensor, backward)",
    call="x = distribute_tensor(G, mesh, start) or DTensor.from_local(local, mesh, start, "
    "shape=, stride=); x = x.redistribute(mesh, step) for each step; to_local(), "
    "full_tensor(), backward",
    rows=ROWS,
    run=run_program,
    judge=judge_program,
    describe=DTensorProgram.describe,
    scope={"--grad": "local"},
    batch=12,  # about half that on average: programs are cheap, a world's round trip is not
    smaller=smaller_programs,
)

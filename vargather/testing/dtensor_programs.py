"""The Hypothesis strategies that draw DTensor programs (``dtensor_program``), and the
last shrinking passes (``smaller_programs``).

Where it sits: beneath the ``dtensor`` target (``dtensor_target``, whose rows
``program_rows`` runs as seeded Hypothesis tests in the parent process), above
``dtensor_program`` (the program and its oracle). The ranks get finished programs.

Every choice is drawn so that Hypothesis shrinks toward the smallest program: the
world (ascending), the mesh (1-D before 2-D before 3-D), no flattened views, the world
mesh before its views and submeshes, fewer tensor dims and rows, ``float32``, fewer
steps, ``Replicate`` before ``Shard``. docs/targets.md lists what is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from hypothesis import strategies as st

from .dtensor_program import FLOATS, DTensorProgram, on_sizes, parse

__all__ = [
    "DTYPES",
    "KINDS",
    "dtensor_programs",
    "mesh_shapes",
    "placements",
    "program_on",
    "smaller_programs",
    "split_after",
    "strided_consistent",
    "view_runs",
    "worlds_for",
]

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
    worlds = sorted(w for w in world_sizes if 1 <= w <= 4)
    if kind == "flattened":
        return [w for w in worlds if any(_merging(m) for m in mesh_shapes(w))] or worlds
    return worlds


def view_runs(ndim: int) -> list[tuple[int, int]]:
    """The runs of two or more adjacent mesh dims a view can flatten, shortest first."""
    return [(a, a + n - 1) for n in range(2, ndim + 1) for a in range(ndim - n + 1)]


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
def program_on(
    draw: Any, world: int, kind: str = "programs", dtypes: Sequence[str] = DTYPES
) -> DTensorProgram:
    """A ``DTensorProgram`` of ``kind`` (one of ``KINDS``) on a world of ``world`` ranks."""
    shapes = mesh_shapes(world)
    if kind == "flattened":  # where a view can merge collectives: two dims of size > 1
        shapes = [m for m in shapes if _merging(m)] or [m for m in shapes if len(m) > 1]
    mesh = draw(st.sampled_from(shapes))
    names = draw(st.sampled_from(_NAMES[len(mesh)]))
    runs = view_runs(len(mesh))
    views = tuple(
        dict.fromkeys(  # unique, in the order drawn
            draw(st.lists(st.sampled_from(runs), unique=True, min_size=int(kind == "flattened")))
            if runs
            else ()
        )
    )
    subs = [
        (a, a + n - 1) for n in range(1, len(mesh)) for a in range(len(mesh) - n + 1)
    ]  # proper submeshes of adjacent dims
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
    pool = [d for d in dtypes if d in FLOATS] if kind == "gradient" else list(dtypes)
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
    draw: Any, world_sizes: Sequence[int], kind: str = "programs", dtypes: Sequence[str] = DTYPES
) -> DTensorProgram:
    """A ``DTensorProgram`` of ``kind`` (one of ``KINDS``) on a world of
    ``world_sizes`` (1 to 4 ranks), smaller worlds first."""
    world = draw(st.sampled_from(worlds_for(kind, world_sizes)))
    program: DTensorProgram = draw(program_on(world, kind, dtypes))
    return program


# --- the last shrinking passes ------------------------------------------------------------


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
    """Programs one edit smaller than ``program``, in a fixed order (the passes run
    after Hypothesis's shrinking, which does not see across a mesh's dims): fewer
    steps (or the start moved to where the first step arrives), a mesh dim made size 1 (a smaller world among ``worlds``), a size-1 mesh
    dim gone, a view the tensor does not live on gone, a tensor
    dim no placement shards gone, fewer rows (half, or one fewer), a placement made
    ``Replicate``, then plainer values."""
    out: list[DTensorProgram] = []
    least = 1 if program.requires_grad else 0
    for k in range(len(program.steps)):
        if len(program.steps) > least:
            out.append(replace(program, steps=program.steps[:k] + program.steps[k + 1 :]))
    if len(program.steps) > least:  # start where the first step arrives
        begun = replace(program, start=program.steps[0], steps=program.steps[1:])
        if not _valid(begun):
            begun = replace(begun, entry="from_local")
        out.append(begun)
    for d in range(len(program.mesh)):
        if program.mesh[d] > 1 and program.world_size // program.mesh[d] in worlds:
            one = _with_mesh_dim_of_one(program, d)
            if _valid(one):
                out.append(one)
    for d in range(len(program.mesh)):
        smaller = _without_mesh_dim(program, d)
        if smaller is not None and _valid(smaller):
            out.append(smaller)
    for v in program.views:
        if ("flat", *v) != program.on:
            out.append(replace(program, views=tuple(w for w in program.views if w != v)))
    for i in range(len(program.shape)):
        fewer = _without_tensor_dim(program, i)
        if fewer is not None:
            out.append(fewer)
    for i, n in enumerate(program.shape):
        for smaller_n in sorted({n // 2, n - 1} - {n, -1}):
            shape = (*program.shape[:i], smaller_n, *program.shape[i + 1 :])
            entry = program.entry
            if not _evenly_strided(program.start, on_sizes(program), shape):
                entry = "from_local"
            out.append(replace(program, shape=shape, entry=entry))
    for k, codes in enumerate((program.start, *program.steps)):
        for i, code in enumerate(codes):
            if code != "R":
                plain = (*codes[:i], "R", *codes[i + 1 :])
                if k == 0:
                    candidate = replace(program, start=plain)
                else:
                    steps = (*program.steps[: k - 1], plain, *program.steps[k:])
                    candidate = replace(program, steps=steps)
                if _valid(candidate):
                    out.append(candidate)
    plainer = (
        replace(program, dtype="float32", requires_grad=program.requires_grad),
        replace(program, requires_grad=False),
        replace(program, values="arange"),
        replace(program, seed=0),
        replace(program, entry="distribute"),
    )
    out += [p for p in plainer if p != program]
    return [p for p in out if _valid(p)]


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
    if program.entry == "distribute":
        partial = any(p.startswith("P") for p in program.start)
        return not partial and _evenly_strided(program.start, on_sizes(program), program.shape)
    return True

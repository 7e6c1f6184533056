"""One DTensor program and its single-process oracle: what every rank should hold.

Where it sits: beneath the ``dtensor`` target (``dtensor_target``); it imports torch
and the kit's value generator only, no engine module and no Hypothesis.

A program is a small training program's state plus a path through placements
(``DTensorProgram``; docs/targets.md lists what is drawn): a mesh as trainers build it,
a global tensor ``G`` of uneven sizes, a start placement reached through an entry point,
then ``redistribute`` steps, each state read back with ``to_local()`` and
``full_tensor()``.

Placement codes: ``R`` (``Replicate()``), ``S<d>`` (``Shard(d)``), ``SS<d>/<k>``
(``_StridedShard(d, split_factor=k)``, drawn only as FSDP2 with TP makes it: its tensor
dim is sharded again by later mesh dims whose sizes multiply to ``k``), ``P:sum`` and
``P:avg`` (``Partial``: in the start only; torch refuses ``redistribute`` to Partial).

The math, stated once. Mesh coordinates are row-major (``arange(W).view(mesh)``). A
rank's piece of ``G`` applies each mesh dim's ``Shard(d)`` with ``torch.chunk``'s
pieces (``ceil(n / k)`` rows each, the last shorter, empty ones after), left to right
over the mesh dims; ``_StridedShard`` dims are applied after every plain ``Shard`` of
the same tensor dim (right-to-left sharding, as torch documents it); ``Replicate`` and
``Partial`` dims cut nothing. A ``Partial`` start holds one contribution ``X_p`` per
coordinate ``p`` on its Partial dims, and ``G`` is their sum (``P:avg``: their mean);
contributions are multiples of 12 in [-96, 96], so every sum and every mean over at
most 4 ranks is exact in every float format, in any order. Redistribution never
changes ``G``: after every step ``full_tensor()`` is ``G`` and each rank's local is
its piece of ``G``, bit for bit. Gradients: the loss is ``sum_k <y_k, H_k>`` over the
steps' outputs ``y_k`` with a global upstream gradient ``H_k`` (each rank gets its own
piece of it), so ``dL/dG = sum_k H_k`` and each rank's gradient is its piece of that
under the start placements, ``Partial`` read as ``Replicate`` (DTensor's contract:
the gradient of a Partial tensor is replicated).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch

from .values import make_values, torch_dtype

FLOATS: Final = frozenset({"float32", "float64", "bfloat16", "float16"})


@dataclass(frozen=True)
class DTensorProgram:
    """One drawn program. ``mesh``/``names``: the world mesh and its dims' names;
    ``views``: its flattened views in the order created (each a run ``(first, last)`` of
    adjacent mesh dims, ``mesh["a", "b"]._flatten()``), every one kept alive; ``on``:
    the mesh the tensor lives on, ``("world", 0, n-1)``, ``("flat", first, last)`` (a
    view in ``views``) or ``("sub", first, last)``; ``start``: one code per dim of
    ``on``, reached through ``entry`` (``distribute`` or ``from_local`` with ``shape=``
    and ``stride=``); ``steps``: each a ``redistribute`` to the next placement."""

    world_size: int
    mesh: tuple[int, ...]
    names: tuple[str, ...]
    views: tuple[tuple[int, int], ...]
    on: tuple[str, int, int]
    shape: tuple[int, ...]
    entry: str
    start: tuple[str, ...]
    steps: tuple[tuple[str, ...], ...]
    dtype: str = "float32"
    values: str = "arange"
    requires_grad: bool = False
    seed: int = 0

    def view_name(self, run: tuple[int, int]) -> str:
        """A flattened view's name, as torchtitan names them (``dp_shard_cp``)."""
        return "_".join(self.names[run[0] : run[1] + 1])

    def describe(self) -> str:
        """The program in words: the mesh setup, the tensor and the path."""
        mesh = "x".join(map(str, self.mesh)) + f" mesh {list(self.names)}"
        views = ", ".join(
            f"mesh[{', '.join(repr(n) for n in self.names[a : b + 1])}]._flatten()"
            for a, b in self.views
        )
        if views:
            mesh += f", views {views} alive"
        kind, a, b = self.on
        where = {
            "world": "the world mesh",
            "flat": f"the flattened view {self.view_name((a, b))!r}",
            "sub": f"the submesh {list(self.names[a : b + 1])}",
        }[kind]
        path = " -> ".join(_words(p) for p in (self.start, *self.steps))
        entry = "distribute_tensor" if self.entry == "distribute" else "DTensor.from_local"
        return (
            f"world of {self.world_size}: {mesh}; tensor {self.dtype}{list(self.shape)} on "
            f"{where} via {entry}: {path}; values {self.values}, "
            f"requires_grad={self.requires_grad}, seed={self.seed}"
        )


def parse(code: str) -> tuple[str, int, int]:
    """A placement code's (kind, tensor dim, split factor): ``("R", -1, 1)``, ``("P",
    -1, 1)``, ``("S", d, 1)``, ``("SS", d, k)``."""
    if code.startswith("SS"):
        dim, split = code[2:].split("/")
        return "SS", int(dim), int(split)
    return ("S", int(code[1:]), 1) if code.startswith("S") else (code[0], -1, 1)


def _words(placements: Sequence[str]) -> str:
    out = []
    for code in placements:
        kind, dim, split = parse(code)
        if kind == "R":
            out.append("Replicate()")
        elif kind == "SS":
            out.append(f"_StridedShard({dim}, split_factor={split})")
        elif kind == "S":
            out.append(f"Shard({dim})")
        else:
            out.append(f'Partial("{code[2:]}")')
    return "[" + ", ".join(out) + "]"


def on_sizes(program: DTensorProgram) -> tuple[int, ...]:
    """The sizes of the mesh the tensor lives on."""
    kind, a, b = program.on
    if kind == "flat":
        return (math.prod(program.mesh[a : b + 1]),)
    return program.mesh[a : b + 1]


def coords(program: DTensorProgram, rank: int) -> tuple[int, ...]:
    """``rank``'s coordinates on the mesh the tensor lives on (row-major world mesh;
    a flattened view's coordinate is the row-major index within its run)."""
    world: list[int] = []
    r = rank
    for size in reversed(program.mesh):
        world.append(r % size)
        r //= size
    world.reverse()
    kind, a, b = program.on
    if kind != "flat":
        return tuple(world[a : b + 1])
    index = 0
    for i in range(a, b + 1):
        index = index * program.mesh[i] + world[i]
    return (index,)


def _chunk(t: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    """Piece ``index`` of ``parts`` along ``dim`` as ``torch.chunk`` cuts it."""
    n = t.shape[dim]
    size = -(-n // parts) if n else 0
    start = min(index * size, n)
    return t.narrow(dim, start, max(0, min(size, n - start)))


def local_piece(
    t: torch.Tensor, placements: Sequence[str], sizes: Sequence[int], where: Sequence[int]
) -> torch.Tensor:
    """The piece of ``t`` at mesh coordinates ``where`` of a mesh of ``sizes``."""
    cuts = [parse(code) for code in placements]
    for i in sorted((i for i, c in enumerate(cuts) if c[1] >= 0), key=lambda i: cuts[i][0] == "SS"):
        t = _chunk(t, cuts[i][1], sizes[i], where[i])
    return t.contiguous()


def _partial_dims(program: DTensorProgram) -> list[int]:
    return [i for i, p in enumerate(program.start) if p.startswith("P")]


def contributions(program: DTensorProgram) -> dict[tuple[int, ...], torch.Tensor]:
    """A ``Partial`` start's contribution ``X_p`` for each coordinate ``p`` on its
    Partial dims (one entry, ``()``: ``G`` itself, when the start has none)."""
    dims = _partial_dims(program)
    dtype = torch_dtype(program.dtype)
    if not dims:
        if program.values == "bits":
            return {(): make_values(program.shape, dtype, program.seed * 131 + 5, "full")}
        numel = math.prod(program.shape)
        order = torch.arange(numel)
        if program.seed:
            order = torch.randperm(numel, generator=torch.Generator().manual_seed(program.seed))
        if dtype == torch.bool:
            order = order % 2
        elif dtype == torch.uint8:
            order = order % 256
        return {(): order.to(dtype).view(program.shape)}
    sizes = on_sizes(program)
    out: dict[tuple[int, ...], torch.Tensor] = {}
    for flat in range(math.prod(sizes[i] for i in dims)):
        p: list[int] = []
        for i in reversed(dims):
            p.append(flat % sizes[i])
            flat //= sizes[i]
        key = tuple(reversed(p))
        seed = program.seed * 131 + 11 + 17 * len(out)
        out[key] = make_values(program.shape, dtype, seed, "integers") * 12
    return out


def global_tensor(program: DTensorProgram) -> torch.Tensor:
    """``G``: the contributions' sum (``P:avg`` dims: their mean), or the drawn tensor
    (a copy of the cached one)."""
    return _global(program).clone()


@functools.lru_cache(maxsize=64)
def _global(program: DTensorProgram) -> torch.Tensor:
    parts = contributions(program)
    if len(parts) == 1 and () in parts:
        return parts[()]
    dims = _partial_dims(program)
    sizes = on_sizes(program)
    total = torch.zeros(program.shape, dtype=torch.float64)
    for part in parts.values():
        total += part.to(torch.float64)
    divisor = math.prod(sizes[i] for i in dims if program.start[i] == "P:avg")
    return (total / divisor).to(torch_dtype(program.dtype))


def expected_local(program: DTensorProgram, placements: Sequence[str], rank: int) -> torch.Tensor:
    """Rank ``rank``'s local tensor under ``placements`` (no Partial)."""
    return local_piece(global_tensor(program), placements, on_sizes(program), coords(program, rank))


def start_local(program: DTensorProgram, rank: int) -> torch.Tensor:
    """Rank ``rank``'s local tensor in the start: its piece of its own contribution."""
    where = coords(program, rank)
    key = tuple(where[i] for i in _partial_dims(program))
    part = contributions(program)[key]
    return local_piece(part, program.start, on_sizes(program), where)


def upstream(program: DTensorProgram, step: int) -> torch.Tensor:
    """``H_k``: the global upstream gradient of step ``step``'s output (small integers:
    their sums are exact)."""
    dtype = torch_dtype(program.dtype)
    return make_values(program.shape, dtype, program.seed * 131 + 7000 + 97 * step, "integers")


def upstream_local(program: DTensorProgram, step: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient of step ``step``'s local output."""
    return local_piece(
        upstream(program, step), program.steps[step], on_sizes(program), coords(program, rank)
    )


def expected_gradient(program: DTensorProgram, rank: int) -> torch.Tensor:
    """Rank ``rank``'s gradient of its start local."""
    total = torch.zeros(program.shape, dtype=torch.float64)
    for k in range(len(program.steps)):
        total += upstream(program, k).to(torch.float64)
    grad = total.to(torch_dtype(program.dtype))
    placements = ["R" if p.startswith("P") else p for p in program.start]
    return local_piece(grad, placements, on_sizes(program), coords(program, rank))

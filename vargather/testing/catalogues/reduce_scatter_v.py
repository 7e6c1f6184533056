"""``reduce_scatter_v``'s catalogue: its case, strategy and call; the rows are the family's.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), above the
family's engine (``family``: the case base, rank runner and judge) and its generic rows
(``family_catalogue``); beneath the engine, which runs its rows as any collective's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from hypothesis import strategies as st

from ..cases import DTYPE_NAMES
from ..family import SplitCase, draw_dims, draw_group
from ..family_catalogue import LARGE_ROW, LARGE_ROWS, FamilyCatalogue, shape_with

__all__ = ["CATALOGUE", "ReduceScatterCase", "reduce_scatter_cases"]


@dataclass(frozen=True)
class ReduceScatterCase(SplitCase):
    """``reduce_scatter_v(x, sizes, dim)``; ``other`` is the shape without ``dim``."""

    collective = "reduce_scatter_v"
    NAMES = ("x", "sizes", "dim", "group", "out")
    reduced_forward = True

    world_size: int
    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int
    dtype: str = "float32"
    requires_grad: bool = True
    special: bool = False
    seed: int = 0
    group: tuple[int, ...] | None = None
    validate: bool = True
    impl: str = "vargather"
    call: str | None = None
    emulate: str | None = None
    memory: str = "contiguous"
    initialized: bool = True
    compile_backend: str | None = None

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [shape_with(self.other, self.dim, sum(self.sizes))] * len(self.members)

    def output_shapes(self) -> list[Any]:
        return [shape_with(self.other, self.dim, n) for n in self.sizes]

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (list(self.sizes), self.dim), {}

    def template_values(self, r: int) -> dict[str, object]:
        return {"sizes": list(self.sizes), "dim": self.dim}

    def oracle_args(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "dim": self.dim}

    def emptied(self) -> ReduceScatterCase:
        """No block for one rank."""
        sizes = list(self.sizes)
        sizes[self.seed % len(sizes)] = 0
        return replace(self, sizes=tuple(sizes))


@st.composite
def reduce_scatter_cases(
    draw: Any,
    world_sizes: tuple[int, ...] = (2, 3),
    dtypes: tuple[str, ...] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
) -> ReduceScatterCase:
    """``ReduceScatterCase``s: empty blocks, negative dims, every dtype, subgroups;
    ``most``: the largest block and dimension (payload scale)."""
    world = draw(st.sampled_from(list(world_sizes)))
    group = draw_group(draw, world, subgroups)
    w = len(group) if group is not None else world
    other = draw_dims(draw, most)
    return ReduceScatterCase(
        world_size=world,
        sizes=tuple(draw(st.lists(st.integers(0, most), min_size=w, max_size=w))),
        other=other,
        dim=draw(st.integers(-(len(other) + 1), len(other))),
        dtype=draw(st.sampled_from(list(dtypes))),
        requires_grad=draw(st.booleans()),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        group=group,
        validate=draw(st.booleans()),
    )


@st.composite
def _large(draw: Any, world: int) -> ReduceScatterCase:
    sizes = tuple(draw(st.lists(st.integers(0, LARGE_ROWS), min_size=world, max_size=world)))
    grad, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
    return ReduceScatterCase(world, sizes, (LARGE_ROW,), 0, requires_grad=grad, seed=seed)


CATALOGUE: Final = FamilyCatalogue(
    ReduceScatterCase,
    cases=reduce_scatter_cases,
    large=_large,
    signature="(x, sizes, dim, *, group, validate, timeout)",
    sizes_name="sizes",
    sizes_required=True,
)

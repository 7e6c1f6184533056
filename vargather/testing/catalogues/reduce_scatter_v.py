"""``reduce_scatter_v``'s family catalogue (the family's rows): its case, strategy and call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from ..family import BlockCase, block_cases, shape_with
from ..family_catalogue import FamilyCatalogue, large_blocks


@dataclass(frozen=True, repr=False)
class ReduceScatterCase(BlockCase):
    """``reduce_scatter_v(x, sizes, dim)``; ``other`` is the shape without ``dim``."""

    collective = "reduce_scatter_v"
    NAMES = ("x", "sizes", "dim", "group", "out")
    POSITIONAL = ("sizes", "dim")
    reduced_forward = True

    dtype: str = "float32"

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [shape_with(self.other, self.dim, sum(self.sizes))] * len(self.members)

    def output_shapes(self) -> list[Any]:
        return self.blocks()

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (list(self.sizes), self.dim), {}

    def oracle_args(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "dim": self.dim}


reduce_scatter_cases: Final = block_cases(ReduceScatterCase)
"""``ReduceScatterCase``s: empty blocks, negative dims, every dtype, subgroups;
``most``: the largest block and dimension (payload scale)."""


CATALOGUE: Final = FamilyCatalogue(
    ReduceScatterCase,
    cases=reduce_scatter_cases,
    large=large_blocks(ReduceScatterCase),
    signature="(x, sizes, dim, *, group, validate, timeout)",
    sizes_name="sizes",
    sizes_required=True,
)


# --- misuse ---
# reduce_scatter_v(x, sizes, dim): the same sizes, shape and dtype on every rank.

import vargather  # noqa: E402

from ..misuse import Call, Misuse, SizesTensor, TensorSpec, blocks, call, misuses, spec_call, tie  # noqa: E402


def _rs(r: int, w: int, *, rows: int | None = None, **kw: Any) -> Call:
    n = sum(blocks(w)) if rows is None else rows
    return spec_call("reduce_scatter_v", n, kw.pop("sizes", blocks(w)), **kw)


def _reversed(w: int) -> list[int]:
    return list(reversed(blocks(w)))


# fmt: off
MISUSES: Final = misuses(
    _rs,
    Misuse("rs-sizes-differ", "sizes differ across ranks (each adds up to the rows of its tensor)", vargather.SizesMismatchError,
        lambda r, w: _rs(r, w, sizes=_reversed(w)), lambda w, o: ("sizes differs across ranks", f"sizes={blocks(w)}", f"sizes={_reversed(w)}", f"[{o}]"), blamed=tie),
    Misuse("rs-sum-mismatch", "sum(sizes) does not match x.shape[dim] on one rank (one more row)", vargather.SizesError,
        lambda r, w: _rs(r, w, rows=sum(blocks(w)) + 1), lambda w, o: (f"rank(s) [{o}]", f"rank {o}: expected sum(sizes) == {sum(blocks(w)) + 1}", f"got sum(sizes) = {sum(blocks(w))}")),
    Misuse("rs-sizes-wrong-length", "sizes has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _rs(r, w, sizes=[*blocks(w), 0]), lambda w, o: (f"rank {o}: expected len(sizes) == world size {w}, got {w + 1}",)),
    Misuse("rs-sizes-missing", "one rank passes sizes=None", vargather.SizesError,
        lambda r, w: _rs(r, w, sizes=None), lambda w, o: (f"rank {o}: sizes is required", "expected one block size per rank")),
    Misuse("rs-sizes-negative", "sizes holds a negative entry on one rank", vargather.SizesError,
        lambda r, w: _rs(r, w, sizes=[-1, *blocks(w)[1:-1], blocks(w)[-1] + blocks(w)[0] + 1]), lambda w, o: (f"rank {o}: sizes must be >= 0", "= -1")),
    Misuse("rs-sizes-float-tensor", "sizes is a float tensor on one rank", vargather.SizesTypeError,
        lambda r, w: _rs(r, w, sizes=SizesTensor(tuple(blocks(w)), "float32")), lambda w, o: (f"rank {o}: sizes must hold integers", "float32")),
    Misuse("rs-dtype-differs", "one rank passes int32 where the others pass float32", vargather.DTypeMismatchError,
        lambda r, w: _rs(r, w, dtype="int32"), lambda w, o: ("dtype differs", "torch.float32", "torch.int32", f"[{o}]")),
    Misuse("rs-ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _rs(r, w, trail=(2, 1)), lambda w, o: ("ndim differs", "2", "3", f"[{o}]")),
    Misuse("rs-trailing-dim-differs", "a dimension other than dim differs on one rank", vargather.ShapeMismatchError,
        lambda r, w: _rs(r, w, trail=(3,)), lambda w, o: ("shape differs", f"({sum(blocks(w))}, 2)", f"({sum(blocks(w))}, 3)", f"[{o}]")),
    Misuse("rs-dim-differs", "one rank scatters along dim 1 of its transposed tensor (valid locally)", vargather.ArgumentMismatchError,
        lambda r, w: call("reduce_scatter_v", TensorSpec((2, sum(blocks(w)))), blocks(w), 1), lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]")),
    Misuse("rs-dim-out-of-range", "dim is out of range on one rank", vargather.DimError,
        lambda r, w: _rs(r, w, dim=2), lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=2", "expected -2 <= dim < 2")),
    Misuse("rs-requires-grad-differs", "one rank needs a gradient and its peers do not", vargather.RequiresGradMismatchError,
        lambda r, w: _rs(r, w, dtype="float64", requires_grad=True), lambda w, o: ("requires_grad", "True", "False", f"[{o}]"), good=lambda r, w: _rs(r, w, dtype="float64")),
    Misuse("rs-zero-dim-input", "one rank passes a 0-d tensor (nothing to split)", vargather.SizesError,
        lambda r, w: call("reduce_scatter_v", TensorSpec(()), blocks(w)), lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d")),
    Misuse("mixed-a2a-beside-rs", "one rank calls all_to_all_v while its peers call reduce_scatter_v", vargather.ProtocolMismatchError,
        lambda r, w: replace(_rs(r, w), collective="all_to_all_v"), lambda w, o: ("reduce_scatter_v / all_to_all_v: collective differs across ranks", f"'all_to_all_v' on rank(s) [{o}]", "'reduce_scatter_v'", "call the same collective on every rank"), blamed=tie),
)
# fmt: on
"""Every misuse of reduce_scatter_v, each raised as the same error on every rank."""

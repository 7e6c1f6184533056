"""``gather_v``'s family catalogue (the family's rows): case, strategy, call, misuse entries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, Final

from hypothesis import strategies as st

from ..cases import Implementation
from ..family import BlockCase, block_cases, fit_passed, shape_with
from ..family_catalogue import FamilyCatalogue, large_blocks


@dataclass(frozen=True, repr=False)
class GatherVCase(BlockCase):
    """``gather_v(x_r, dst, dim)`` on group rank ``r``, whose block is ``sizes[r]`` long
    along ``dim`` (``other``: the shape without it); ``pass_sizes``: ``sizes=`` passed
    too (with ``validate=False``: trusted, no metadata round)."""

    collective = "gather_v"
    NAMES = ("x", "dst", "dim", "sizes", "group")
    POSITIONAL = ("dst", "dim")

    dst: int = 0
    dtype: str = "float32"
    _: KW_ONLY
    pass_sizes: bool = False

    def input_shapes(self) -> list[tuple[int, ...]]:
        return self.blocks()

    def output_shapes(self) -> list[Any]:
        total = sum(self.sizes)
        return [
            shape_with(self.other, self.dim, total if r == self.dst else 0)
            for r in range(len(self.sizes))
        ]

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (self.dst, self.dim), ({"sizes": list(self.sizes)} if self.pass_sizes else {})

    def oracle_args(self) -> dict[str, Any]:
        return {"dst": self.dst, "dim": self.dim}

    def compilable(self) -> GatherVCase:
        return replace(self, special=False, pass_sizes=True)

    def fitted(self, target: Implementation, passes: Callable[[str], bool]) -> GatherVCase:
        return fit_passed(self, target, passes, "sizes", "pass_sizes")


gather_v_cases: Final = block_cases(
    GatherVCase,
    lambda draw, w: {"dst": draw(st.integers(0, w - 1))},
    lambda draw: {"pass_sizes": draw(st.booleans())},
)
"""``GatherVCase``s: empty blocks, any ``dst``, negative dims, every dtype, subgroups,
sizes passed or not; ``most``: the largest block and dimension (payload scale)."""


CATALOGUE: Final = FamilyCatalogue(
    GatherVCase,
    cases=gather_v_cases,
    large=large_blocks(GatherVCase, rooted=True),
    signature="(x, dst, dim, *, sizes, group, validate, timeout)",
    sizes_name="sizes",
)


# --- misuse ---
# gather_v(x, dst, dim): the same dst, dim, dtype and shape off dim on every rank.

import vargather  # noqa: E402

from ..misuse import Call, Misuse, SizesTensor, TensorSpec, blocks, call, misuses, spec_call, tie  # noqa: E402

DST: Final = 1
"""The base call's root (a group rank)."""


def _gv(r: int, w: int, *, dst: object = DST, **kw: Any) -> Call:
    return spec_call("gather_v", blocks(w)[r], dst, 0, **kw)


def _other_sizes(w: int, r: int) -> list[int]:
    """The base sizes with the next rank's block a row longer: rank ``r``'s own entry
    still fits its tensor, so only the comparison across ranks can catch it."""
    sizes = blocks(w)
    sizes[(r + 1) % w] += 1
    return sizes


# fmt: off
MISUSES: Final = misuses(
    _gv,
    Misuse("gv-dst-differs", "one rank names another root", vargather.ArgumentMismatchError,
        lambda r, w: _gv(r, w, dst=0), lambda w, o: ("dst (a group rank) differs across ranks", f"{DST}", f"0 on rank(s) [{o}]"), blamed=tie),
    Misuse("gv-dst-out-of-range", "dst is not a rank of the group on one rank", vargather.ArgumentError,
        lambda r, w: _gv(r, w, dst=w), lambda w, o: (f"rank {o}: expected dst to be a rank in the group", f"an int in [0, {w}), got {w}")),
    Misuse("gv-dst-not-int", "dst is a float on one rank", vargather.ArgumentError,
        lambda r, w: _gv(r, w, dst=1.0), lambda w, o: (f"rank {o}: expected dst to be a rank in the group", "got 1.0")),
    Misuse("gv-sizes-differ", "sizes= differ across ranks", vargather.SizesMismatchError,
        lambda r, w: _gv(r, w, sizes=_other_sizes(w, r)), lambda w, o: ("sizes differs across ranks", f"sizes={blocks(w)}", f"sizes={_other_sizes(w, o)}"),
        good=lambda r, w: _gv(r, w, sizes=blocks(w)), blamed=tie),
    Misuse("gv-sizes-wrong-length", "sizes= has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _gv(r, w, sizes=[*blocks(w), 0]), lambda w, o: (f"rank {o}", f"expected len(sizes) == world size {w}, got {w + 1}"),
        good=lambda r, w: _gv(r, w, sizes=blocks(w))),
    Misuse("gv-sizes-contradict-tensors", "sizes= on every rank says one rank's block is a row longer", vargather.SizesError,
        lambda r, w: _gv(r, w, sizes=[*blocks(w)[:-1], blocks(w)[-1] + 1]), lambda w, o: (f"rank {w - 1}: expected sizes[{w - 1}] == {blocks(w)[-1]}", f"got {blocks(w)[-1] + 1}"), all_ranks=True,
        blamed=lambda w, o: (w - 1,)),
    Misuse("gv-sizes-float-tensor", "sizes= is a float tensor on one rank", vargather.SizesTypeError,
        lambda r, w: _gv(r, w, sizes=SizesTensor(tuple(blocks(w)), "float32")), lambda w, o: (f"rank {o}: sizes must hold integers", "float32"),
        good=lambda r, w: _gv(r, w, sizes=blocks(w))),
    Misuse("gv-dtype-differs", "one rank passes int32 where the others pass float32", vargather.DTypeMismatchError,
        lambda r, w: _gv(r, w, dtype="int32"), lambda w, o: ("dtype differs", "torch.float32", "torch.int32", f"[{o}]")),
    Misuse("gv-ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _gv(r, w, trail=(2, 1)), lambda w, o: ("ndim differs", "2", "3", f"[{o}]")),
    Misuse("gv-trailing-dim-differs", "a dimension other than dim differs on one rank", vargather.ShapeMismatchError,
        lambda r, w: _gv(r, w, trail=(3,)), lambda w, o: ("shape outside the split dimension differs", "(2,)", "(3,)", f"[{o}]")),
    Misuse("gv-dim-differs", "one rank joins along dim 1 of its transposed tensor (valid locally)", vargather.ArgumentMismatchError,
        lambda r, w: call("gather_v", TensorSpec((2, blocks(w)[r])), DST, 1), lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]")),
    Misuse("gv-requires-grad-differs", "one rank needs a gradient and its peers do not", vargather.RequiresGradMismatchError,
        lambda r, w: _gv(r, w, dtype="float64", requires_grad=True), lambda w, o: ("requires_grad", "True", "False", f"[{o}]"), good=lambda r, w: _gv(r, w, dtype="float64")),
    Misuse("gv-zero-dim-input", "one rank passes a 0-d tensor (nothing to join)", vargather.SizesError,
        lambda r, w: call("gather_v", TensorSpec(()), DST, 0), lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d")),
)
# fmt: on
"""Every misuse of gather_v, each raised as the same error on every rank."""

"""``scatter_v``'s family catalogue (the family's rows): case, strategy, call, misuse entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st

from ..family import BlockCase, block_cases, shape_with
from ..family_catalogue import FamilyCatalogue, large_blocks


@dataclass(frozen=True, repr=False)
class ScatterVCase(BlockCase):
    """``scatter_v(x_r, sizes, src, dim)`` on group rank ``r``: rank ``r`` gets block
    ``r`` (``sizes[r]`` long along ``dim``; ``other``: the shape without it) of ``src``'s
    input; every other rank's input is ``placeholder`` long along ``dim``."""

    collective = "scatter_v"
    NAMES = ("x", "sizes", "src", "dim", "group")
    POSITIONAL = ("sizes", "src", "dim")

    src: int = 0
    placeholder: int = 0
    dtype: str = "float32"

    def input_shapes(self) -> list[tuple[int, ...]]:
        total = sum(self.sizes)
        return [
            shape_with(self.other, self.dim, total if r == self.src else self.placeholder)
            for r in range(len(self.sizes))
        ]

    def output_shapes(self) -> list[Any]:
        return self.blocks()

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (list(self.sizes), self.src, self.dim), {}

    def oracle_args(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "src": self.src, "dim": self.dim}


scatter_v_cases: Final = block_cases(
    ScatterVCase,
    lambda draw, w: {"src": draw(st.integers(0, w - 1)), "placeholder": draw(st.integers(0, 2))},
)
"""``ScatterVCase``s: empty blocks, any ``src`` and placeholder length, negative dims,
every dtype, subgroups; ``most``: the largest block and dimension."""


CATALOGUE: Final = FamilyCatalogue(
    ScatterVCase,
    cases=scatter_v_cases,
    large=large_blocks(ScatterVCase, rooted=True),
    signature="(x, sizes, src, dim, *, group, validate, timeout)",
    sizes_name="sizes",
    sizes_required=True,
)


# --- misuse ---
# scatter_v(x, sizes, src, dim): the same sizes, src, dim, dtype and shape off dim on
# every rank; src's x is sum(sizes) long along dim.

import vargather  # noqa: E402

from ..misuse import Call, Misuse, SizesTensor, TensorSpec, blocks, call, misuses, spec_call, tie  # noqa: E402

SRC: Final = 1
"""The base call's root (a group rank)."""


def _sv(r: int, w: int, *, rows: int | None = None, src: object = SRC, **kw: Any) -> Call:
    n = (sum(blocks(w)) if r == SRC else 0) if rows is None else rows
    return spec_call("scatter_v", n, kw.pop("sizes", blocks(w)), src, 0, **kw)


def _alt(w: int) -> int:
    """Another root than ``SRC``."""
    return (SRC + 1) % w


def _rows_as_src(r: int, w: int) -> int:
    """Rank ``r``'s rows when it names ``_alt`` the root: a full tensor where it is
    either root in its own eyes (so only the comparison across ranks can catch it)."""
    return sum(blocks(w)) if r in (SRC, _alt(w)) else 0


def _other_sizes(w: int) -> list[int]:
    """The base sizes with a row moved from the first block to the last (the same sum)."""
    sizes = blocks(w)
    sizes[0] -= 1
    sizes[-1] += 1
    return sizes


# fmt: off
MISUSES: Final = misuses(
    _sv,
    Misuse("sv-src-differs", "one rank names another root", vargather.ArgumentMismatchError,
        lambda r, w: _sv(r, w, src=_alt(w), rows=_rows_as_src(r, w)), lambda w, o: ("src (a group rank) differs across ranks", f"{SRC}", f"{_alt(w)} on rank(s) [{o}]"), blamed=tie),
    Misuse("sv-src-out-of-range", "src is not a rank of the group on one rank", vargather.ArgumentError,
        lambda r, w: _sv(r, w, src=w), lambda w, o: (f"rank {o}: expected src to be a rank in the group", f"an int in [0, {w}), got {w}")),
    Misuse("sv-src-not-int", "src is a float on one rank", vargather.ArgumentError,
        lambda r, w: _sv(r, w, src=1.0), lambda w, o: (f"rank {o}: expected src to be a rank in the group", "got 1.0")),
    Misuse("sv-sizes-differ", "sizes differ across ranks (the same sum)", vargather.SizesMismatchError,
        lambda r, w: _sv(r, w, sizes=_other_sizes(w)), lambda w, o: ("sizes differs across ranks", f"sizes={blocks(w)}", f"sizes={_other_sizes(w)}"), blamed=tie),
    Misuse("sv-sizes-wrong-length", "sizes has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _sv(r, w, sizes=[*blocks(w), 0]), lambda w, o: (f"rank {o}", f"expected len(sizes) == world size {w}, got {w + 1}")),
    Misuse("sv-sum-mismatch", "sizes on every rank add up to one row more than src's tensor", vargather.SizesError,
        lambda r, w: _sv(r, w, sizes=[*blocks(w)[:-1], blocks(w)[-1] + 1]), lambda w, o: (f"rank {SRC}: expected sum(sizes) == {sum(blocks(w))}", f"got sum(sizes) = {sum(blocks(w)) + 1}"), all_ranks=True,
        blamed=lambda w, o: (SRC,)),
    Misuse("sv-sizes-float-tensor", "sizes is a float tensor on one rank", vargather.SizesTypeError,
        lambda r, w: _sv(r, w, sizes=SizesTensor(tuple(blocks(w)), "float32")), lambda w, o: (f"rank {o}: sizes must hold integers", "float32")),
    Misuse("sv-dtype-differs", "one rank passes int32 where the others pass float32", vargather.DTypeMismatchError,
        lambda r, w: _sv(r, w, dtype="int32"), lambda w, o: ("dtype differs", "torch.float32", "torch.int32", f"[{o}]")),
    Misuse("sv-ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _sv(r, w, trail=(2, 1)), lambda w, o: ("ndim differs", "2", "3", f"[{o}]")),
    Misuse("sv-trailing-dim-differs", "a dimension other than dim differs on one rank", vargather.ShapeMismatchError,
        lambda r, w: _sv(r, w, trail=(3,)), lambda w, o: ("shape outside the split dimension differs", "(2,)", "(3,)", f"[{o}]")),
    Misuse("sv-dim-differs", "one rank cuts along dim 1 of its transposed tensor (valid locally)", vargather.ArgumentMismatchError,
        lambda r, w: call("scatter_v", TensorSpec((2, sum(blocks(w)) if r == SRC else 0)), blocks(w), SRC, 1), lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]")),
    Misuse("sv-requires-grad-differs", "one rank needs a gradient and its peers do not", vargather.RequiresGradMismatchError,
        lambda r, w: _sv(r, w, dtype="float64", requires_grad=True), lambda w, o: ("requires_grad", "True", "False", f"[{o}]"), good=lambda r, w: _sv(r, w, dtype="float64")),
    Misuse("sv-zero-dim-input", "one rank passes a 0-d tensor (nothing to cut)", vargather.SizesError,
        lambda r, w: call("scatter_v", TensorSpec(()), blocks(w), SRC, 0), lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d")),
)
# fmt: on
"""Every misuse of scatter_v, each raised as the same error on every rank."""

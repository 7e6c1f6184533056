"""``all_gather_list``'s family catalogue (the family's rows): its case, strategy and call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, Final

from hypothesis import strategies as st

from ..cases import Implementation
from ..family import FamilyCase, draw_world, fit_passed
from ..family_catalogue import LARGE_ROW, LARGE_ROWS, FamilyCatalogue
from ..values import DTYPE_NAMES


@dataclass(frozen=True, repr=False)
class GatherListCase(FamilyCase):
    """``all_gather_list(x_r, grad=grad)`` with ``x_r`` of shape ``shapes[r]``."""

    collective = "all_gather_list"
    NAMES = ("x", "shapes", "group", "grad")
    shared_output = True

    shapes: tuple[tuple[int, ...], ...]
    dtype: str = "float32"
    _: KW_ONLY
    grad: str = "sum"
    pass_shapes: bool = False

    @property
    def reduced_gradient(self) -> bool:
        return self.grad != "local"

    @property
    def adjoint_applies(self) -> bool:
        return self.grad == "sum"

    def input_shapes(self) -> list[tuple[int, ...]]:
        return list(self.shapes)

    def output_shapes(self) -> list[Any]:
        return [list(self.shapes) for _ in self.shapes]

    def _passed(self) -> list[list[int]] | None:
        return [list(s) for s in self.shapes] if self.pass_shapes else None

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {"shapes": self._passed(), "grad": self.grad}

    def oracle_args(self) -> dict[str, Any]:
        return {}

    def grad_args(self) -> dict[str, Any]:
        return {"contract": self.grad}

    def emptied(self) -> GatherListCase:
        """No elements in one rank's tensor."""
        k = self.seed % len(self.shapes)
        shapes = list(self.shapes)
        shapes[k] = (0, *shapes[k][1:])
        return replace(self, shapes=tuple(shapes))

    def compilable(self) -> GatherListCase:
        return replace(self, special=False, pass_shapes=True)

    def fitted(self, target: Implementation, passes: Callable[[str], bool]) -> GatherListCase:
        grad = self.grad if self.grad in target.contracts else target.contracts[0]
        case = replace(self, grad=grad)  # unpassed shapes: validated
        return fit_passed(case, target, passes, "shapes", "pass_shapes", validate=True)


@st.composite
def gather_list_cases(
    draw: Any,
    world_sizes: tuple[int, ...] = (2, 3),
    dtypes: tuple[str, ...] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
) -> GatherListCase:
    """``GatherListCase``s: shapes differing in every dim (empties too), contracts."""
    world, group, w = draw_world(draw, world_sizes, subgroups)
    ndim = draw(st.integers(1, 3))
    shape = st.lists(st.integers(0, most), min_size=ndim, max_size=ndim).map(tuple)
    pass_shapes = draw(st.booleans())
    return GatherListCase(
        world_size=world,
        shapes=tuple(draw(st.lists(shape, min_size=w, max_size=w))),
        dtype=draw(st.sampled_from(list(dtypes))),
        grad=draw(st.sampled_from(["sum", "local", "mean"])),
        requires_grad=draw(st.booleans()),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        group=group,
        pass_shapes=pass_shapes,
        validate=draw(st.booleans()) if pass_shapes else True,
    )


@st.composite
def _large(draw: Any, world: int) -> GatherListCase:
    rows = draw(st.lists(st.integers(0, LARGE_ROWS), min_size=world, max_size=world))
    grad, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
    return GatherListCase(world, tuple((n, LARGE_ROW) for n in rows), requires_grad=grad, seed=seed)


CATALOGUE: Final = FamilyCatalogue(
    GatherListCase,
    cases=gather_list_cases,
    large=_large,
    signature="(x, *, shapes, group, grad, validate, timeout)",
    sizes_name="shapes",
    returns="list",
    contracts=("sum", "local", "mean"),
    declined={"dims": "all_gather_list takes no dim (every dim may differ)"},
)


# --- misuse ---
# all_gather_list(x, shapes=, grad=): the same ndim, dtype and contract everywhere.

import vargather  # noqa: E402

from ..misuse import Call, Misuse, call, misuses, spec_call  # noqa: E402


def list_shape(r: int) -> tuple[int, int]:
    """Rank ``r``'s base shape: every dimension differs, one empty."""
    return ((2, 3), (0, 1), (4, 2), (1, 1))[r]


def list_shapes(w: int) -> list[list[int]]:
    return [list(list_shape(r)) for r in range(w)]


def _list(r: int, w: int, *, extra: tuple[int, ...] = (), **kw: Any) -> Call:
    rows, cols = list_shape(r)
    return spec_call("all_gather_list", rows, trail=(cols, *extra), **kw)


def _lie(w: int, o: int, extra_dim: bool = False) -> list[list[int]]:
    lie = list_shapes(w)
    lie[(o + 1) % w] = [*lie[(o + 1) % w], 7] if extra_dim else [5, 5]
    return lie


# fmt: off
MISUSES: Final = misuses(
    _list,
    Misuse("list-dtype-differs", "one rank passes bfloat16 where the others pass float32", vargather.DTypeMismatchError,
        lambda r, w: _list(r, w, dtype="bfloat16"), lambda w, o: ("dtype differs", "torch.float32", "torch.bfloat16", f"[{o}]")),
    Misuse("list-ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _list(r, w, extra=(1,)), lambda w, o: ("ndim differs", "2", "3", f"[{o}]")),
    Misuse("list-shapes-lie", "shapes (passed on every rank) is wrong about a peer on one rank", vargather.SizesMismatchError,
        lambda r, w: _list(r, w, shapes=_lie(w, r)), lambda w, o: (f"shapes passed on rank(s) [{o}] contradict the tensors", f"expected shapes={list_shapes(w)}", f"got rank {o} passed shapes={_lie(w, o)}"), good=lambda r, w: _list(r, w, shapes=list_shapes(w))),
    Misuse("list-shapes-lie-about-ndim", "shapes gives a peer one more dimension than its tensor has, on one rank", vargather.SizesMismatchError,
        lambda r, w: _list(r, w, shapes=_lie(w, r, extra_dim=True)), lambda w, o: (f"shapes passed on rank(s) [{o}] contradict the tensors", f"expected shapes={list_shapes(w)}", f"got rank {o} passed shapes=[", f"{list_shapes(w)[(o + 1) % w]} + 1 more dims")),
    Misuse("list-shapes-wrong-own-entry", "shapes is wrong about the rank's own tensor", vargather.SizesError,
        lambda r, w: _list(r, w, shapes=[[9, 9]] * w), lambda w, o: (f"rank {o}: expected shapes[{o}] == {list_shape(o)}", "got (9, 9)")),
    Misuse("list-shapes-wrong-length", "shapes has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _list(r, w, shapes=[*list_shapes(w), [1, 1]]), lambda w, o: (f"rank {o}: expected len(shapes) == world size {w}, got {w + 1}",)),
    Misuse("list-shapes-not-shapes", "shapes is a flat list of ints on one rank", vargather.SizesTypeError,
        lambda r, w: _list(r, w, shapes=[2, 3]), lambda w, o: (f"rank {o}: shapes[0] must be a sequence of ints, got int",)),
    Misuse("list-grad-contract-differs", "one rank asks for grad='mean', its peers for grad='sum'", vargather.ArgumentMismatchError,
        lambda r, w: _list(r, w, grad="mean"), lambda w, o: ("gradient contract", "'sum'", "'mean'", f"[{o}]")),
    Misuse("list-grad-contract-unknown", "one rank passes an unknown gradient contract", vargather.ArgumentError,
        lambda r, w: _list(r, w, grad="avg"), lambda w, o: (f"rank {o}: grad must be one of 'sum', 'local', 'mean'", "'avg'")),
    Misuse("list-requires-grad-differs", "under grad='sum' one rank needs a gradient and its peers do not", vargather.RequiresGradMismatchError,
        lambda r, w: _list(r, w, dtype="float64", requires_grad=True), lambda w, o: ("requires_grad", "True", "False", f"[{o}]"), good=lambda r, w: _list(r, w, dtype="float64")),
    Misuse("list-float-input", "one rank passes a float", vargather.InputTypeError,
        lambda r, w: call("all_gather_list", 1.5), lambda w, o: (f"rank {o}: expected a torch.Tensor, got float",)),
)
# fmt: on
"""Every misuse of all_gather_list, each raised as the same error on every rank."""

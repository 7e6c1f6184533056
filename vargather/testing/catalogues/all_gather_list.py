"""``all_gather_list``'s catalogue: the family's rows (``vargather.testing.family_catalogue``) for it.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), beneath
the engine, which runs its rows as it runs any collective's.
"""

from __future__ import annotations

from typing import Final

from ..family_catalogue import FamilyCatalogue

__all__ = ["CATALOGUE"]

CATALOGUE: Final = FamilyCatalogue("all_gather_list")


# --- misuse ---
# all_gather_list(x, shapes=, grad=): the same ndim, dtype and contract everywhere.
from typing import Any  # noqa: E402  # the misuse tail's, below the catalogue above

import vargather  # noqa: E402

from ..misuse import Call, Misuse, TensorSpec, call, misuses  # noqa: E402


def list_shape(r: int) -> tuple[int, int]:
    """Rank ``r``'s base shape: every dimension differs, one empty."""
    return ((2, 3), (0, 1), (4, 2), (1, 1))[r]


def list_shapes(w: int) -> list[list[int]]:
    return [list(list_shape(r)) for r in range(w)]


def _list(
    r: int,
    w: int,
    *,
    extra: tuple[int, ...] = (),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kw: Any,
) -> Call:
    return call("all_gather_list", TensorSpec((*list_shape(r), *extra), dtype, requires_grad), **kw)


def _lie(w: int, o: int, extra_dim: bool = False) -> list[list[int]]:
    lie = list_shapes(w)
    lie[(o + 1) % w] = [*lie[(o + 1) % w], 7] if extra_dim else [5, 5]
    return lie


# A table, two lines an entry: name, summary, error; bad call, fragments, options.
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

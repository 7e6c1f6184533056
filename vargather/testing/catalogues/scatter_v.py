"""``scatter_v``'s catalogue: what is particular to the rooted ragged scatter, as data.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), beside
``gather_v``'s (whose ``Misuse`` and ``Particulars`` it shares) and above ``values`` and
the library's ``oracle``. Its case, strategy, call and misuse entries are what
``tests/test_scatter_v.py`` runs on its rank pools today; the note for the integrator
in ``catalogues.gather_v`` holds for it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import torch
from hypothesis import strategies as st

from vargather import (
    ArgumentError,
    ArgumentMismatchError,
    CollectiveName,
    DTypeMismatchError,
    RequiresGradMismatchError,
    ShapeMismatchError,
    SizesError,
    SizesMismatchError,
    oracle,
)

from ..values import is_differentiable, make_upstream, make_values, torch_dtype
from .gather_v import Misuse, Particulars

__all__ = ["CATALOGUE", "MISUSE", "ScatterVCase", "cases"]


@dataclass(frozen=True)
class ScatterVCase:
    """One ``scatter_v`` call: group rank ``r`` gets ``sizes[r]`` along ``dim`` of
    ``src``'s input, ``other`` the shape without ``dim``; a non-src input is
    ``placeholder`` long along ``dim``. ``group``, ``calls``, ``trusted``: as
    ``GatherVCase``'s."""

    op: ClassVar[CollectiveName] = "scatter_v"
    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int
    src: int
    dtype: str = "float32"
    group: tuple[int, ...] | None = None
    seed: int = 0
    calls: int = 2
    trusted: bool = False
    placeholder: int = 0

    def shape(self, n: int) -> tuple[int, ...]:
        d = self.dim % (len(self.other) + 1)
        return (*self.other[:d], n, *self.other[d:])

    def inputs(self) -> list[torch.Tensor]:
        """Every group rank's input: every bit pattern of the dtype."""
        dtype = torch_dtype(self.dtype)
        lengths = [
            sum(self.sizes) if r == self.src else self.placeholder for r in range(len(self.sizes))
        ]
        return [
            make_values(self.shape(n), dtype, self.seed * 131 + r, "full")
            for r, n in enumerate(lengths)
        ]

    def upstream(self) -> list[torch.Tensor] | None:
        """Every group rank's upstream gradient, different on every rank."""
        dtype = torch_dtype(self.dtype)
        if not is_differentiable(dtype):
            return None
        return [
            make_upstream(self.shape(n), dtype, self.seed + r, r, "real")
            for r, n in enumerate(self.sizes)
        ]

    def expected(self) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The oracle's results and input gradients, per group rank."""
        xs, ups = self.inputs(), self.upstream()
        grads = (
            None
            if ups is None
            else oracle.expected_scatter_v_grads(xs, self.sizes, self.src, ups, self.dim)
        )
        return oracle.expected_scatter_v(xs, self.sizes, self.src, self.dim), grads

    def call(self, fn: Callable[..., Any], x: torch.Tensor, group: Any, **changes: Any) -> Any:
        """The call (``fn``: ``scatter_v`` or a fork's), ``changes`` overriding arguments."""
        kwargs: dict[str, Any] = {"group": group, "timeout": 30.0}
        if self.trusted:
            kwargs.update(validate=False)
        kwargs.update(changes)
        sizes = kwargs.pop("sizes", list(self.sizes))
        return fn(x, sizes, kwargs.pop("src", self.src), kwargs.pop("dim", self.dim), **kwargs)


@st.composite
def cases(
    draw: Any,
    world_sizes: tuple[int, ...] = (2, 3),
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "bool", "float16", "complex64"),
) -> ScatterVCase:
    """Ragged blocks (empty ones too), 0-2 other dims, any ``dim``, ``src`` and
    non-src length along ``dim``."""
    w = draw(st.sampled_from(world_sizes))
    other = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    return ScatterVCase(
        sizes=tuple(draw(st.lists(st.integers(0, 5), min_size=w, max_size=w))),
        other=other,
        dim=draw(st.integers(-(len(other) + 1), len(other))),
        src=draw(st.integers(0, w - 1)),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**16)),
        placeholder=draw(st.integers(0, 2)),
    )


MISUSE_CASE: Final = ScatterVCase((2, 0, 3), (2,), 0, 1, calls=1)
"""The call the misuse entries spoil (3 ranks, src 1); the last rank is blamed, but for
``sum_mismatch`` (src's own sizes)."""

MISUSE: Final[tuple[Misuse, ...]] = (
    Misuse("root_differs", ArgumentMismatchError, lambda x, w: (x, {"src": 0})),
    Misuse("root_range", ArgumentError, lambda x, w: (x, {"src": w})),
    Misuse("root_not_int", ArgumentError, lambda x, w: (x, {"src": 1.0})),
    Misuse("dtype", DTypeMismatchError, lambda x, w: (x.double(), {})),
    Misuse("ndim", ShapeMismatchError, lambda x, w: (x.unsqueeze(-1), {})),
    Misuse("trailing", ShapeMismatchError, lambda x, w: (torch.cat([x, x], 1), {})),
    Misuse("dim_differs", ArgumentMismatchError, lambda x, w: (x, {"dim": -1})),
    Misuse("sizes_differ", SizesMismatchError, lambda x, w: (x, {"sizes": [2, 1, 2]})),
    Misuse("sizes_length", SizesError, lambda x, w: (x, {"sizes": [2, 0, 3, 0]})),
    Misuse("sum_mismatch", SizesError, lambda x, w: (x, {"sizes": [2, 0, 4]}), True, 1),
    Misuse("requires_grad", RequiresGradMismatchError, lambda x, w: (x.requires_grad_(True), {})),
)

CATALOGUE: Final = Particulars(
    "scatter_v", "scatter_v(x, sizes, src, dim, group=group)", ("x", "sizes", "src", "dim", "group")
)

"""``gather_v``'s catalogue: what is particular to the rooted ragged gather, as data.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), above
``values`` and the library's ``oracle``. Its case, strategy, call and misuse entries
are what ``tests/test_gather_v.py`` runs on its rank pools today.

Note for the integrator: today's engine runs the family's catalogues through
``family`` / ``family_catalogue``, which name their collectives; this file does not plug
into them (they are not edited). ``CATALOGUE`` names the op and its call; the engine
that takes one catalogue file per collective runs its generic rows from ``GatherVCase``
(``inputs``, ``upstream``, ``expected``, ``call``), ``cases`` and ``MISUSE``.
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
    VarGatherError,
    oracle,
)

from ..values import is_differentiable, make_upstream, make_values, torch_dtype

__all__ = ["CATALOGUE", "MISUSE", "GatherVCase", "Misuse", "Particulars", "cases"]


@dataclass(frozen=True)
class GatherVCase:
    """One ``gather_v`` call: group rank ``r``'s block is ``sizes[r]`` long along
    ``dim``, ``other`` the shape without ``dim``; ``dst`` a group rank; ``group`` the
    world's processes in the group (``None``: the world). ``calls`` in a row (the first
    on a fresh round state, then the payload in the round); ``trusted``:
    ``validate=False`` with the sizes passed."""

    op: ClassVar[CollectiveName] = "gather_v"
    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int
    dst: int
    dtype: str = "float32"
    group: tuple[int, ...] | None = None
    seed: int = 0
    calls: int = 2
    trusted: bool = False

    def shape(self, n: int) -> tuple[int, ...]:
        d = self.dim % (len(self.other) + 1)
        return (*self.other[:d], n, *self.other[d:])

    def inputs(self) -> list[torch.Tensor]:
        """Every group rank's input: every bit pattern of the dtype (NaN payloads,
        -0.0, infinities)."""
        dtype = torch_dtype(self.dtype)
        return [
            make_values(self.shape(n), dtype, self.seed * 131 + r, "full")
            for r, n in enumerate(self.sizes)
        ]

    def upstream(self) -> list[torch.Tensor] | None:
        """Every group rank's upstream gradient, different on every rank (``None``: the
        dtype has none); empty off ``dst``."""
        dtype = torch_dtype(self.dtype)
        if not is_differentiable(dtype):
            return None
        total = sum(self.sizes)
        return [
            make_upstream(
                self.shape(total if r == self.dst else 0), dtype, self.seed + r, r, "real"
            )
            for r in range(len(self.sizes))
        ]

    def expected(self) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The oracle's results and input gradients, per group rank."""
        xs, ups = self.inputs(), self.upstream()
        grads = None if ups is None else oracle.expected_gather_v_grads(xs, self.dst, ups, self.dim)
        return oracle.expected_gather_v(xs, self.dst, self.dim), grads

    def call(self, fn: Callable[..., Any], x: torch.Tensor, group: Any, **changes: Any) -> Any:
        """The call (``fn``: ``gather_v`` or a fork's), ``changes`` overriding arguments."""
        kwargs: dict[str, Any] = {"group": group, "timeout": 30.0}
        if self.trusted:
            kwargs.update(validate=False, sizes=list(self.sizes))
        kwargs.update(changes)
        return fn(x, kwargs.pop("dst", self.dst), kwargs.pop("dim", self.dim), **kwargs)


@st.composite
def cases(
    draw: Any,
    world_sizes: tuple[int, ...] = (2, 3),
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "bool", "float16", "complex64"),
) -> GatherVCase:
    """Ragged blocks (empty ones too), 0-2 other dims, any ``dim`` and ``dst``."""
    w = draw(st.sampled_from(world_sizes))
    other = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    return GatherVCase(
        sizes=tuple(draw(st.lists(st.integers(0, 5), min_size=w, max_size=w))),
        other=other,
        dim=draw(st.integers(-(len(other) + 1), len(other))),
        dst=draw(st.integers(0, w - 1)),
        dtype=draw(st.sampled_from(dtypes)),
        seed=draw(st.integers(0, 2**16)),
    )


@dataclass(frozen=True)
class Misuse:
    """One rank's wrong call: ``wrong(x, world_size)`` gives its input and the arguments
    it changes; every rank raises ``error`` naming group rank ``blamed`` (-1: the last).
    ``every_rank``: every rank calls so (else the last rank alone)."""

    kind: str
    error: type[VarGatherError]
    wrong: Callable[[torch.Tensor, int], tuple[torch.Tensor, dict[str, Any]]]
    every_rank: bool = False
    blamed: int = -1


MISUSE_CASE: Final = GatherVCase((2, 0, 3), (2,), 0, 1, calls=1)
"""The call the misuse entries spoil (3 ranks, dst 1); the last rank is blamed."""

MISUSE: Final[tuple[Misuse, ...]] = (
    Misuse("root_differs", ArgumentMismatchError, lambda x, w: (x, {"dst": 0})),
    Misuse("root_range", ArgumentError, lambda x, w: (x, {"dst": w})),
    Misuse("root_not_int", ArgumentError, lambda x, w: (x, {"dst": 1.0})),
    Misuse("dtype", DTypeMismatchError, lambda x, w: (x.double(), {})),
    Misuse("ndim", ShapeMismatchError, lambda x, w: (x.unsqueeze(-1), {})),
    Misuse("trailing", ShapeMismatchError, lambda x, w: (torch.cat([x, x], 1), {})),
    Misuse("dim_differs", ArgumentMismatchError, lambda x, w: (x, {"dim": -1})),
    Misuse("sizes_differ", SizesError, lambda x, w: (x, {"sizes": [2, 1, 2]})),
    Misuse("sizes_length", SizesError, lambda x, w: (x, {"sizes": [2, 0, 3, 0]})),
    Misuse("sizes_wrong", SizesError, lambda x, w: (x, {"sizes": [2, 0, 4]}), every_rank=True),
    Misuse("requires_grad", RequiresGradMismatchError, lambda x, w: (x.requires_grad_(True), {})),
)


@dataclass(frozen=True)
class Particulars:
    """What the engine asks of this collective by name (module doc)."""

    op: str
    default_call: str
    names: tuple[str, ...]


CATALOGUE: Final = Particulars(
    "gather_v", "gather_v(x, dst, dim, group=group)", ("x", "dst", "dim", "sizes", "group")
)

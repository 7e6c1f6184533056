"""Hypothesis strategies for ragged all_gather cases (public).

Where it sits: in the testing kit, right above the case model (``cases``), below the
gather's catalogue (``catalogues.all_gather_v``) that draws its batches here. A drawn
``GatherCase`` carries its expected result (``case.expected()``, the oracle's output
and input gradients), like ``BroadcastableShapes`` carries ``result_shape``; its
tensors are rebuilt from ``case.seed`` wherever they are needed.

Every strategy takes keyword-only arguments and validates them when called, with
messages that name the argument (``min_world_size=3 is larger than
max_world_size=2``)::

    from hypothesis import given
    from vargather.testing import strategies as vst
    from vargather.testing import get_pool

    @given(vst.gather_cases(world_size=3, dtypes=["float32", "bfloat16"]))
    def test_mine(case): ...
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from .cases import VARGATHER, GatherCase, Implementation
from .scale import DEFAULT_MAX_PAYLOAD, MIN_LARGE_BYTES, Target, per_rank_targets
from .values import (
    DTYPE_NAMES,
    MEMORY_LAYOUTS,
    PLAIN_DTYPE_NAMES,
    SIZES_FORMS,
    UPSTREAM_KINDS,
    VALUE_KINDS,
    is_differentiable,
    make_upstream,
    torch_dtype,
)

__all__ = [
    "DTYPE_NAMES",
    "SEQUENCE_STEPS",
    "GatherCase",
    "call_sequences",
    "case_batches",
    "dtypes",
    "gather_cases",
    "ragged_sizes",
    "upstream_grads",
]

_MAX_NDIM: Final = 8  # more dims only slow the suite; vargather itself takes up to 32

LARGE_ONE_IN: Final = 6
"""About one case in ``LARGE_ONE_IN`` is large (when ``max_payload`` allows): its
shards sized around a payload threshold (``vargather.testing.scale``)."""

_LARGE_MAX_NDIM: Final = 2
"""Large cases have at most 2 dimensions (unless ``min_ndim`` asks more): a sliced
layout's buffer is ``2 * 3^(ndim-1)`` times its shard."""

_DELTA: Final = 2
"""A large case's shards are ``target ± d`` rows, ``|d| <= _DELTA`` (shrinks to 0)."""


# --- argument checking ---------------------------------------------------------------


def _int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _not_above(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ValueError(f"{low_name}={low} is larger than {high_name}={high}")


def _choices(
    name: str, value: object, allowed: Sequence[str], default: Sequence[str]
) -> tuple[str, ...]:
    if value is None:
        return tuple(default)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name}={value!r} must be a sequence of names, e.g. {list(allowed)[:2]}")
    items: list[str] = []
    for v in value:
        item = str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
        if item not in allowed:
            raise ValueError(f"{name}={list(value)!r} contains {v!r}, not one of {list(allowed)}")
        items.append(item)
    if not items:
        raise ValueError(f"{name}=[] must name at least one value")
    return tuple(dict.fromkeys(items))


# --- small strategies ------------------------------------------------------------------


def dtypes(*, names: Sequence[str | torch.dtype] | None = None) -> SearchStrategy[str]:
    """Dtype names vargather gathers on gloo (``"float32"``, ...), simplest first."""
    return st.sampled_from(_choices("names", names, DTYPE_NAMES, DTYPE_NAMES))


def ragged_sizes(
    *, world_size: int, min_size: int = 0, max_size: int = 5
) -> SearchStrategy[tuple[int, ...]]:
    """Every rank's size along the gather dimension: independent sizes (0 included),
    all equal (the even fast paths), or all zero (an empty gather)."""
    w = _int("world_size", world_size, minimum=1)
    lo = _int("min_size", min_size, minimum=0)
    hi = _int("max_size", max_size, minimum=0)
    _not_above("min_size", lo, "max_size", hi)

    @st.composite
    def draw_sizes(draw: st.DrawFn) -> tuple[int, ...]:
        kind = draw(st.integers(0, 9))
        if kind <= 6:
            return tuple(draw(st.integers(lo, hi)) for _ in range(w))
        if kind <= 8 or lo > 0:
            n = draw(st.integers(lo, hi))
            return (n,) * w
        return (0,) * w

    return draw_sizes()


def upstream_grads(
    *,
    shape: Sequence[int],
    dtype: str | torch.dtype,
    world_size: int,
    kind: str | None = None,
) -> SearchStrategy[list[torch.Tensor]]:
    """One upstream gradient per rank, each of ``shape`` and ``dtype``, no two ranks'
    equal (when the shape is not empty): ``kind="integers"`` (exact sums) or ``"real"``.

    Raises:
        TypeError: a ``world_size`` or ``shape`` entry that is not an int.
        ValueError: an unknown ``dtype`` or ``kind``, a size out of range, or a dtype
            without gradients (neither floating nor complex).
    """
    w = _int("world_size", world_size, minimum=1)
    shape_t = tuple(_int(f"shape[{i}]", s, minimum=0) for i, s in enumerate(shape))
    name = _choices("dtype", [dtype], DTYPE_NAMES, DTYPE_NAMES)[0]
    dtype_t = torch_dtype(name)
    if not is_differentiable(dtype_t):
        raise ValueError(f"dtype={name!r} has no gradients: expected a float or complex dtype")
    kinds = _choices("kind", None if kind is None else [kind], UPSTREAM_KINDS, UPSTREAM_KINDS)
    return st.tuples(st.sampled_from(kinds), st.integers(0, 2**32 - 1)).map(
        lambda ks: [make_upstream(shape_t, dtype_t, ks[1] + r, r, ks[0]) for r in range(w)]
    )


# --- cases --------------------------------------------------------------------------------


def _side(max_side: int) -> SearchStrategy[int]:
    top = 8 * max_side
    return st.integers(0, top).map(lambda k: 0 if k == top else 1 + k % max_side)


class _Config:
    """``gather_cases``' arguments (by name; others ignored), validated: what its cases
    and ``call_sequences``' draw."""

    def __init__(self, **kw: Any) -> None:
        impl = VARGATHER if kw["implementation"] is None else kw["implementation"]
        if not isinstance(impl, Implementation):
            raise TypeError(
                f"implementation={impl!r} must be a vargather.testing.Implementation or None"
            )
        self.implementation = impl
        # By default, what the implementation can be expected to carry: vargather's own
        # gathers every dtype (int16 as bytes); a plain gloo collective refuses int16.
        own = kw["implementation"] is not None and impl.ref is None
        default_dtypes = DTYPE_NAMES if own else PLAIN_DTYPE_NAMES
        self.min_ndim = _int("min_ndim", kw["min_ndim"], minimum=1)
        self.max_ndim = _int("max_ndim", kw["max_ndim"], minimum=1)
        _not_above("min_ndim", self.min_ndim, "max_ndim", self.max_ndim)
        _not_above("max_ndim", self.max_ndim, "the supported maximum", _MAX_NDIM)
        self.max_side = _int("max_side", kw["max_side"], minimum=1)
        self.max_size = _int("max_size", kw["max_size"], minimum=0)
        self.max_payload = _int("max_payload", kw["max_payload"], minimum=0)
        self.dtypes = _choices("dtypes", kw["dtypes"], DTYPE_NAMES, default_dtypes)
        self.contracts = _choices("contracts", kw["contracts"], impl.contracts, impl.contracts)
        taken = impl.transports if impl.transports is not None else ("auto",)
        self.transports = _choices("transports", kw["transports"], taken, taken)
        self.sizes_forms = _choices("sizes_forms", kw["sizes_forms"], SIZES_FORMS, SIZES_FORMS)
        self.memory = _choices("memory", kw["memory"], MEMORY_LAYOUTS, MEMORY_LAYOUTS)
        self.values = _choices("values", kw["values"], VALUE_KINDS, VALUE_KINDS)
        self.upstream = _choices("upstream", kw["upstream"], UPSTREAM_KINDS, UPSTREAM_KINDS)
        requires_grad: object = kw["requires_grad"]
        if requires_grad is not None and not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad={requires_grad!r} must be True, False or None")
        self.requires_grad = requires_grad
        dims = kw.get("dims")
        self.dims: tuple[int, ...] | None = None
        if dims is not None:
            if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims) or not dims:
                raise ValueError(f"dims={dims!r} must be a non-empty sequence of ints or None")
            self.dims = tuple(dict.fromkeys(dims))
            if not self.ndims():
                raise ValueError(
                    f"dims={list(self.dims)} fits no ndim in [{self.min_ndim}, {self.max_ndim}]"
                )
        if not isinstance(kw["initialized"], bool):
            raise TypeError(f"initialized={kw['initialized']!r} must be a bool")
        self.initialized: bool = kw["initialized"]
        if self.requires_grad and not any(is_differentiable(torch_dtype(d)) for d in self.dtypes):
            raise ValueError(
                f"requires_grad=True needs a float or complex dtype, but dtypes={list(self.dtypes)}"
            )
        if self.memory == ("transposed",) and self.min_ndim < 2:
            raise ValueError(
                f"memory=['transposed'] needs min_ndim >= 2, got min_ndim={self.min_ndim}"
            )

    def dims_for(self, ndim: int) -> list[int]:
        """Those of ``dims`` that fit ``ndim``-d shapes."""
        return [d for d in self.dims or () if -ndim <= d < ndim]

    def ndims(self) -> list[int]:
        """The ndims drawn: those some dim of ``dims`` fits."""
        return [n for n in range(self.min_ndim, self.max_ndim + 1) if self.dims_for(n)]


class _Draws:
    """Strategies built once per configuration and reused for every draw (building a
    strategy per draw costs Hypothesis a source inspection each time)."""

    def __init__(self, cfg: _Config) -> None:
        self.cfg = cfg
        self.side = _side(cfg.max_side)
        self.ndim = (
            st.integers(cfg.min_ndim, cfg.max_ndim)
            if cfg.dims is None
            else st.sampled_from(cfg.ndims())
        )
        self.dtype = st.sampled_from(cfg.dtypes)
        self.contract = st.sampled_from(cfg.contracts)
        self.transport = st.sampled_from(cfg.transports)
        self.sizes_form = st.sampled_from(cfg.sizes_forms)
        self.values = st.sampled_from(cfg.values)
        self.upstream = st.sampled_from(cfg.upstream)
        self.grad_flag = st.integers(0, 3)
        self.seed = st.integers(0, 2**32 - 1)
        flat = [m for m in cfg.memory if m != "transposed"] or ["contiguous"]
        self.memory_1d = st.sampled_from(flat)
        self.memory_nd = st.sampled_from(cfg.memory)
        self.dims = {  # every ndim drawn, large cases' too
            n: st.integers(-n, n - 1) if cfg.dims is None else st.sampled_from(cfg.dims_for(n))
            for n in range(cfg.min_ndim, cfg.max_ndim + 1)
        }
        self._sizes: dict[int, SearchStrategy[tuple[int, ...]]] = {}
        # Large cases: none when every shard must be empty (max_size=0).
        self.large_on = cfg.max_payload > 0 and cfg.max_size > 0
        self.scale = st.sampled_from(range(LARGE_ONE_IN))
        top = max(cfg.min_ndim, min(cfg.max_ndim, _LARGE_MAX_NDIM))
        if cfg.dims is None:
            self.large_ndim = st.integers(cfg.min_ndim, top)
        else:  # the ndims an asked dim fits; past the cap only when none below it does
            fitting = cfg.ndims()
            self.large_ndim = st.sampled_from([n for n in fitting if n <= top] or fitting[:1])
        self.large_side = st.integers(1, cfg.max_side)
        self.rank_kind = st.integers(0, 7)
        self.delta = st.integers(-_DELTA, _DELTA)
        self.small_size = st.integers(0, cfg.max_size)
        self._targets: dict[int, tuple[tuple[Target, ...], SearchStrategy[int]]] = {}
        self._members: dict[tuple[int, int], SearchStrategy[list[int]]] = {}

    def sizes(self, world_size: int) -> SearchStrategy[tuple[int, ...]]:
        if world_size not in self._sizes:
            self._sizes[world_size] = ragged_sizes(
                world_size=world_size, max_size=self.cfg.max_size
            )
        return self._sizes[world_size]

    def members(self, world_size: int, pool_size: int) -> SearchStrategy[list[int]]:
        key = (world_size, pool_size)
        if key not in self._members:
            self._members[key] = st.lists(
                st.integers(0, pool_size - 1), min_size=world_size, max_size=world_size, unique=True
            )
        return self._members[key]

    def targets(self, world_size: int) -> tuple[tuple[Target, ...], SearchStrategy[int]]:
        """The payload targets of a ``world_size``-rank case, and an index into them."""
        if world_size not in self._targets:
            found = per_rank_targets(world_size, self.cfg.max_payload)
            self._targets[world_size] = (found, st.integers(0, max(len(found) - 1, 0)))
        return self._targets[world_size]

    def large_shapes(
        self, draw: st.DrawFn, world_size: int, dtype: str
    ) -> tuple[int, tuple[tuple[int, ...], ...]] | None:
        """``(dim, shapes)`` of a large case, or None when no target fits."""
        targets, index = self.targets(world_size)
        if not targets:
            return None
        # The smaller of two draws: cheap targets are drawn more often than MiB ones,
        # and the index shrinks toward the smallest threshold that still fails.
        target = targets[min(draw(index), draw(index))].bytes
        ndim = draw(self.large_ndim)
        dim = draw(self.dims[ndim])
        d = dim % ndim
        common = [draw(self.large_side) for _ in range(ndim)]
        row_bytes = torch_dtype(dtype).itemsize * math.prod(common[:d] + common[d + 1 :])
        rows = max(target // row_bytes, 1)
        cap = self.cfg.max_payload // row_bytes
        sizes = []
        for _ in range(world_size):
            kind = draw(self.rank_kind)
            if kind <= 5:  # around the target
                n = min(max(rows + draw(self.delta), 0), cap)
            elif kind == 6:
                n = 0
            else:
                n = draw(self.small_size)
            sizes.append(n)
        return dim, tuple((*common[:d], n, *common[d + 1 :]) for n in sizes)

    def case(
        self, draw: st.DrawFn, world_size: int, pool_size: int, subgroup: bool, mode: str = "mixed"
    ) -> GatherCase:
        """A case; ``mode``: ``"mixed"`` (about one in ``LARGE_ONE_IN`` large), ``"small"``
        or ``"large"``."""
        cfg = self.cfg
        members = tuple(sorted(draw(self.members(world_size, pool_size)))) if subgroup else None
        large = None
        if self.large_on and (
            mode == "large" or (mode == "mixed" and draw(self.scale) == LARGE_ONE_IN - 1)
        ):
            dtype = draw(self.dtype)
            large = self.large_shapes(draw, world_size, dtype)
        if large is not None:
            dim, shapes = large
            ndim = len(shapes[0])
        else:
            ndim = draw(self.ndim)
            dim = draw(self.dims[ndim])
            d = dim % ndim
            common = [draw(self.side) for _ in range(ndim)]
            sizes = draw(self.sizes(world_size))
            shapes = tuple((*common[:d], n, *common[d + 1 :]) for n in sizes)
            dtype = draw(self.dtype)
        requires_grad = is_differentiable(torch_dtype(dtype)) and (
            draw(self.grad_flag) != 3 if cfg.requires_grad is None else cfg.requires_grad
        )
        memory_of = self.memory_nd if ndim >= 2 else self.memory_1d
        memory = tuple(draw(memory_of) for _ in range(world_size))
        return GatherCase(
            shapes=shapes,
            dim=dim,
            dtype=dtype,
            contract=draw(self.contract),
            transport=draw(self.transport),
            sizes_form=draw(self.sizes_form),
            memory=memory if any(m != "contiguous" for m in memory) else (),
            values=draw(self.values),
            upstream=draw(self.upstream),
            requires_grad=requires_grad,
            seed=draw(self.seed),
            members=members,
            pool_size=pool_size if subgroup else None,
            initialized=cfg.initialized,
        )


def _group_sizes(lo: int, hi: int) -> SearchStrategy[int]:
    """Group sizes in [lo, hi], proper groups of 2 or more three times as likely as a
    group of one (which is the identity and exercises little)."""
    sizes = [n for n in range(max(lo, 2), hi + 1) for _ in range(3)]
    if lo <= 1 <= hi:
        sizes.append(1)
    return st.sampled_from(sizes)


def _world_bounds(
    world_size: int | None, min_world_size: int, max_world_size: int
) -> tuple[int, int]:
    lo = _int("min_world_size", min_world_size, minimum=1)
    hi = _int("max_world_size", max_world_size, minimum=1)
    _not_above("min_world_size", lo, "max_world_size", hi)
    if world_size is not None:
        w = _int("world_size", world_size, minimum=1)
        return w, w
    return lo, hi


def gather_cases(
    *,
    world_size: int | None = None,
    min_world_size: int = 1,
    max_world_size: int = 4,
    subgroups: bool = False,
    pool_size: int | None = None,
    min_ndim: int = 1,
    max_ndim: int = 4,
    max_side: int = 3,
    max_size: int = 5,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    dtypes: Sequence[str | torch.dtype] | None = None,
    contracts: Sequence[str] | None = None,
    transports: Sequence[str] | None = None,
    sizes_forms: Sequence[str] | None = None,
    memory: Sequence[str] | None = None,
    values: Sequence[str] | None = None,
    upstream: Sequence[str] | None = None,
    requires_grad: bool | None = None,
    initialized: bool = True,
    implementation: Implementation | None = None,
    dims: Sequence[int] | None = None,
) -> SearchStrategy[GatherCase]:
    """Ragged gather cases.

    World: ``world_size`` ranks, or between ``min_world_size`` and ``max_world_size``.
    With ``subgroups=True`` each case gathers over a subgroup of ``world_size`` ranks
    (drawn from 1 to the world's size) of a world of ``pool_size`` ranks (drawn up to
    ``max_world_size`` when None). ``initialized=False``: one rank, in-process, without
    torch.distributed.

    Shapes: ndim in ``[min_ndim, max_ndim]``; ``dim`` anywhere in ``[-ndim, ndim)``;
    sizes along ``dim`` in ``[0, max_size]`` (sometimes all equal, sometimes all zero);
    the other dims shared, in ``[1, max_side]`` and occasionally 0.

    Payload scale: about one case in ``LARGE_ONE_IN`` is large (at most 2 dims unless
    ``min_ndim`` asks more): each rank's shard is ``target ± d`` rows (``|d| <= 2``),
    empty, or small, the target one of ``vargather.testing.scale.per_rank_targets`` up
    to ``max_payload`` bytes per rank (0: no large case).

    The rest is drawn from the given choices (default: all): ``dtypes`` (names or
    torch dtypes; default ``PLAIN_DTYPE_NAMES``, what a plain gloo collective carries;
    with ``implementation`` vargather's own, ``DTYPE_NAMES``), ``contracts`` and
    ``transports`` (default those ``implementation``, default vargather, claims),
    ``sizes_forms`` (``none``, ``list``, ``tensor``), ``memory`` (per rank:
    ``contiguous``, ``transposed``, ``sliced``), ``values`` (``full``, ``integers``),
    ``upstream`` (``integers``, ``real``); ``requires_grad`` (None: mostly True where
    the dtype allows). ``dims``: the literal ``dim`` values drawn (default: every dim
    of the drawn ndim; ndims no given dim fits are not drawn).

    Raises:
        TypeError: a keyword argument of the wrong type (named), when called.
        ValueError: a keyword argument out of range or contradicting another (named,
            ``min_world_size=3 is larger than max_world_size=2``), when called.
    """
    cfg = _Config(**locals())  # every argument, as given
    lo, hi = _world_bounds(world_size, min_world_size, max_world_size)
    if not isinstance(subgroups, bool):
        raise TypeError(f"subgroups={subgroups!r} must be a bool")
    if not initialized and hi != 1:
        raise ValueError(f"initialized=False runs one process: it needs max_world_size=1, got {hi}")
    if subgroups:
        if cfg.implementation.convention != "vargather":
            raise ValueError(
                "subgroups=True needs an implementation taking group= (the vargather "
                f"convention), not convention={cfg.implementation.convention!r}"
            )
        if not initialized:
            raise ValueError("subgroups=True needs initialized=True")
    if pool_size is not None:
        p = _int("pool_size", pool_size, minimum=1)
        if not subgroups:
            raise ValueError(f"pool_size={p} needs subgroups=True")
        _not_above("min_world_size" if world_size is None else "world_size", lo, "pool_size", p)
    elif subgroups and hi < 2:
        raise ValueError(f"subgroups=True needs max_world_size >= 2, got {hi}")

    draws = _Draws(cfg)
    if not subgroups:
        worlds = st.integers(lo, hi)

        @st.composite
        def draw_case(draw: st.DrawFn) -> GatherCase:
            w = draw(worlds)
            return draws.case(draw, w, w, False)

        return draw_case()

    pools = st.just(pool_size) if pool_size is not None else st.integers(max(lo, 2), hi)
    smallest = lo if world_size is not None else 1
    group_sizes = {
        p: _group_sizes(smallest, min(hi, p)) for p in {*range(1, hi + 1), pool_size or 1}
    }

    @st.composite
    def draw_subgroup_case(draw: st.DrawFn) -> GatherCase:
        p = draw(pools)
        w = draw(group_sizes[p])
        return draws.case(draw, w, p, True)

    return draw_subgroup_case()


def case_batches(
    *,
    min_world_size: int = 1,
    max_world_size: int = 4,
    max_batch: int = 8,
    subgroups: bool = False,
    **kwargs: Any,
) -> SearchStrategy[list[GatherCase]]:
    """Lists of 1 to ``max_batch`` cases that all run on one world, drawn first.

    One batch is one pool round trip (``run_many``), which is what makes the suite
    fast; Hypothesis shrinks a failing batch to the failing case. With
    ``subgroups=True`` every case gathers over a subgroup of the world. ``kwargs``
    are those of ``gather_cases`` (not ``world_size``/``pool_size``).

    Raises:
        TypeError: see ``gather_cases``.
        ValueError: see ``gather_cases``.
    """
    lo, hi = _world_bounds(None, min_world_size, max_world_size)
    n = _int("max_batch", max_batch, minimum=1)
    for forbidden in ("world_size", "pool_size"):
        if forbidden in kwargs:
            raise TypeError(f"case_batches() takes no {forbidden}= (the batch draws its world)")
    if subgroups:
        lo = max(lo, 2)
        _not_above("max(min_world_size, 2) (subgroups=True)", lo, "max_world_size", hi)
    # Validate everything now, not at the first draw.
    gather_cases(min_world_size=lo, max_world_size=hi, subgroups=subgroups, **kwargs)

    per_world: dict[int, SearchStrategy[list[GatherCase]]] = {}
    for world in range(lo, hi + 1):
        if subgroups:
            cases = gather_cases(
                min_world_size=1, max_world_size=world, subgroups=True, pool_size=world, **kwargs
            )
        else:
            cases = gather_cases(world_size=world, **kwargs)
        # min_size=0 then a filter, not min_size=1: with a forced first element the
        # shrinker often cannot delete the passing cases around a failing one.
        per_world[world] = st.lists(cases, max_size=n).filter(bool)
    worlds = st.integers(lo, hi)

    @st.composite
    def draw_batch(draw: st.DrawFn) -> list[GatherCase]:
        return draw(per_world[draw(worlds)])

    return draw_batch()


# --- call sequences ---------------------------------------------------------------------

SEQUENCE_STEPS: Final = ("resize-one", "repeat", "dtype", "reshape", "rescale")
"""How a call of a sequence follows the one before, simplest first:

* ``resize-one``: one rank's size along ``dim`` changes, every other rank's shard keeps
  its shape (a cache keyed on the local shape goes stale here);
* ``repeat``: the same shapes, dtype and dim with new values;
* ``dtype``: the same shapes in another dtype;
* ``reshape``: the dims outside ``dim`` change, the sizes along it stay;
* ``rescale``: a fresh case of the other payload scale (small after large, large after
  small), so per-call capacities grow and shrink across the thresholds."""


def _resize_one(draw: st.DrawFn, case: GatherCase, max_size: int) -> GatherCase:
    w = case.group_size
    r = draw(st.integers(0, w - 1))
    d = case.normalized_dim
    old = case.sizes[r]
    new = old + 1 + draw(st.integers(0, max(max_size, 1)))
    if old > 0 and draw(st.integers(0, 3)) == 3:
        new = draw(st.integers(0, old - 1))  # shrink (to empty, most simply)
    shapes = list(case.shapes)
    shapes[r] = (*shapes[r][:d], new, *shapes[r][d + 1 :])
    return replace(case, shapes=tuple(shapes))


def _reshape(draw: st.DrawFn, case: GatherCase, max_side: int) -> GatherCase:
    d = case.normalized_dim
    others = [i for i in range(case.ndim) if i != d]
    if not others:
        return case
    i = draw(st.sampled_from(others))
    old = case.shapes[0][i]
    side = 1 + (old + draw(st.integers(0, max_side - 1))) % max_side
    if side == old:
        side = old + 1
    return replace(case, shapes=tuple((*s[:i], side, *s[i + 1 :]) for s in case.shapes))


def call_sequences(
    *,
    min_world_size: int = 1,
    max_world_size: int = 4,
    max_length: int = 6,
    **kwargs: Any,
) -> SearchStrategy[list[GatherCase]]:
    """Call sequences: 2 to ``max_length`` gathers run back to back on one world (one
    pool round trip, no re-initialisation between them), each following the one before
    by a step of ``SEQUENCE_STEPS``, so that state an implementation carries from call
    to call (caches, per-group capacities, fused buffers) meets shapes, sizes, dtypes
    and payload scales that change under it.

    ``kwargs`` are those of ``gather_cases`` (not ``world_size``/``subgroups``); the
    first call is drawn from them, the others keep its world and the choices
    ``dtypes``, ``max_size``, ``max_side`` allow. Hypothesis shrinks a failing
    sequence by dropping calls and simplifying steps.

    Raises:
        TypeError: see ``gather_cases``.
        ValueError: see ``gather_cases``.
    """
    lo, hi = _world_bounds(None, min_world_size, max_world_size)
    n = _int("max_length", max_length, minimum=2)
    for forbidden in ("world_size", "pool_size", "subgroups"):
        if forbidden in kwargs:
            raise TypeError(f"call_sequences() takes no {forbidden}=")
    gather_cases(min_world_size=lo, max_world_size=hi, **kwargs)  # validates the arguments
    given = inspect.signature(gather_cases).bind(**kwargs)
    given.apply_defaults()  # gather_cases' defaults for what kwargs leaves out
    cfg = _Config(**given.arguments)
    draws = _Draws(cfg)
    worlds = st.integers(lo, hi)
    steps = st.sampled_from(SEQUENCE_STEPS)
    lengths = st.integers(2, n)
    seeds = st.integers(0, 2**32 - 1)

    @st.composite
    def draw_sequence(draw: st.DrawFn) -> list[GatherCase]:
        w = draw(worlds)
        case = draws.case(draw, w, w, False)
        sequence = [case]
        for _ in range(draw(lengths) - 1):
            step = draw(steps)
            if step == "resize-one":
                case = _resize_one(draw, case, cfg.max_size)
            elif step == "dtype":
                dtype = draw(draws.dtype)
                grad = case.requires_grad and is_differentiable(torch_dtype(dtype))
                case = replace(case, dtype=dtype, requires_grad=grad)
            elif step == "reshape":
                case = _reshape(draw, case, cfg.max_side)
            elif step == "rescale":
                other = "small" if max(case.shard_bytes) >= MIN_LARGE_BYTES else "large"
                case = draws.case(draw, w, w, False, other)
            case = replace(case, seed=draw(seeds))
            sequence.append(case)
        return sequence

    return draw_sequence()

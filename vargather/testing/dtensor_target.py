"""The ``dtensor`` target: DTensor's ragged all_gather, ``redistribute`` to Replicate.

Where it sits: in the gate's engine in the testing kit, beside ``targets`` (the
registry that names it) and beneath ``engine`` (which hands ``--target dtensor`` to
``run_dtensor_check``). It has its own rows, because DTensor decides the per-rank
sizes itself: a global tensor is sharded by ``distribute_tensor`` (each shard
``torch.chunk``'s piece, so ``(7, 3)`` with ``Shard(0)`` over 4 ranks has 2/2/2/1
rows, and ``(5,)`` over 4 ranks 2/2/1/0), and ``redistribute`` to all-``Replicate``
(what ``full_tensor()`` does) is a ragged all_gather of those shards.

Bottom up:

* ``DTensorCase``: one drawn case, everything a rank needs to rebuild it: the mesh
  (1-D or 2-D, named dims, optionally flattened: ``mesh["a", "b"]._flatten()`` as
  torchtitan builds its data-parallel mesh), the global shape, the placement on each
  mesh dim (``Shard(d)`` or ``Replicate``), the dtype;
* ``dtensor_cases``: the Hypothesis strategy; placements drawn as training code uses
  them: ``Shard(d)`` on one mesh dim, the same tensor dim over both mesh dims, two
  tensor dims, ``Replicate`` mixed in;
* ``run_dtensor_case``: the rank side (module level, for the pool): builds the mesh
  (cached per world), shards the global tensor with ``distribute_tensor``, runs
  ``redistribute`` to all-Replicate and ``to_local``, and a backward with this rank's
  own upstream gradient;
* ``expected_shard`` / ``judge_dtensor``: the oracle (``torch.chunk`` on one process,
  mesh dims left to right) and the judge: every shard, the replicated tensor (bit for
  bit against the global tensor) and the gradient (this rank's chunk of its own
  upstream gradient: redistribute's backward from Replicate is local);
* ``run_dtensor_check``: the rows as seeded Hypothesis tests, into the gate's
  ``Report``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import torch
from hypothesis import strategies as st

from .asserts import bitwise_difference
from .evaluate import FailingBatchError, ShrinkBudgetSpent, seeded_search
from .family import values
from .options import CheckOptions
from .pool import PoolFailure, RankCrashed, RankError, RankPool
from .progress import Progress
from .results import PropertyFailure, PropertyResult, Report
from .verdict import with_xfail

__all__ = [
    "DTENSOR_IDS",
    "DTensorCase",
    "dtensor_cases",
    "expected_shard",
    "judge_dtensor",
    "run_dtensor_case",
    "run_dtensor_check",
]

DTYPES: Final = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "uint8", "bool")
_FLOATS: Final = frozenset({"float32", "float64", "bfloat16", "float16"})
_NAMES: Final = (("dp", "tp"), ("dp_replicate", "dp_shard"), ("a", "b"))
BATCH: Final = 4
"""Cases per example (one pool round trip on one world)."""


@dataclass(frozen=True)
class DTensorCase:
    """One redistribute to Replicate. ``mesh``: the mesh shape, ``names`` its dim
    names; ``flatten``: shard over the 2-D mesh flattened to one dim; ``placements``:
    per mesh dim (one entry when flattened) the tensor dim sharded, ``None`` for
    Replicate; ``shape``: the global shape."""

    world_size: int
    mesh: tuple[int, ...]
    names: tuple[str, ...]
    flatten: bool
    shape: tuple[int, ...]
    placements: tuple[int | None, ...]
    dtype: str = "float32"
    requires_grad: bool = False
    seed: int = 0

    @property
    def layout(self) -> tuple[int, ...]:
        """The mesh the placements apply to (the flattened one when ``flatten``)."""
        return (math.prod(self.mesh),) if self.flatten else self.mesh

    def describe(self) -> str:
        where = "x".join(map(str, self.mesh)) + f" mesh {list(self.names)}"
        if self.flatten:
            where += f" flattened to ({math.prod(self.mesh)},)"
        places = ", ".join("Replicate()" if p is None else f"Shard({p})" for p in self.placements)
        return (
            f"global shape {self.shape} {self.dtype} on a {where}, placements [{places}] "
            f"-> all Replicate, requires_grad={self.requires_grad}, seed={self.seed}"
        )


# --- the oracle ------------------------------------------------------------------------


def _coords(case: DTensorCase, rank: int) -> tuple[int, ...]:
    """``rank``'s coordinates in ``case.layout`` (row-major, as DeviceMesh lays out
    ``arange(W).view(mesh)``; a flattened mesh's coordinate is the rank itself)."""
    out = []
    for size in reversed(case.layout):
        out.append(rank % size)
        rank //= size
    return tuple(reversed(out))


def _chunk(t: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    """Piece ``index`` of ``parts`` along ``dim`` as DTensor cuts it: ``torch.chunk``'s
    pieces (``ceil(n / parts)`` each, the last shorter), empty ones after them."""
    n = t.shape[dim]
    size = -(-n // parts) if n else 0
    start = min(index * size, n)
    return t.narrow(dim, start, max(0, min(size, n - start)))


def expected_shard(case: DTensorCase, t: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the global ``t``: each mesh dim's placement applied in
    mesh-dim order, on what the previous ones left."""
    coords = _coords(case, rank)
    for mesh_dim, tensor_dim in enumerate(case.placements):
        if tensor_dim is not None:
            t = _chunk(t, tensor_dim, case.layout[mesh_dim], coords[mesh_dim])
    return t.contiguous()


def global_tensor(case: DTensorCase) -> torch.Tensor:
    """The global tensor (the same on every process)."""
    return values(case.shape, case.dtype, case.seed * 131 + 5, False)


def upstream(case: DTensorCase, rank: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient for the replicated tensor (different per rank)."""
    return values(case.shape, case.dtype, 7000 + 97 * rank + case.seed, False)


# --- the strategy ----------------------------------------------------------------------


def _meshes(world: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [(world,)]
    if world > 1:
        out.extend((a, world // a) for a in range(1, world + 1) if world % a == 0)
    return out


@st.composite
def dtensor_cases(
    draw: Any,
    world_sizes: Sequence[int],
    kind: str = "any",
    dtypes: Sequence[str] = DTYPES,
) -> DTensorCase:
    """A ``DTensorCase`` of ``kind``: ``1d`` (a 1-D mesh), ``2d`` (a 2-D mesh, named
    dims), ``flat`` (a 2-D mesh flattened), ``empty`` (some shard empty), ``grad`` (a
    floating dtype, through backward), ``any``."""
    worlds = [w for w in world_sizes if 1 <= w <= 4]
    if kind in ("2d", "flat"):
        worlds = [w for w in worlds if w > 1] or worlds
    world = draw(st.sampled_from(worlds))
    if kind == "1d":
        mesh: tuple[int, ...] = (world,)
    elif kind in ("2d", "flat"):
        two_d = [m for m in _meshes(world) if len(m) == 2]
        mesh = draw(st.sampled_from(two_d)) if two_d else (world,)
    else:
        mesh = draw(st.sampled_from(_meshes(world)))
    names = ("dp",) if len(mesh) == 1 else draw(st.sampled_from(_NAMES))
    flatten = len(mesh) == 2 and (kind == "flat" or (kind == "any" and draw(st.booleans())))
    ndim = draw(st.integers(1, 3))
    layout = (math.prod(mesh),) if flatten else mesh
    placements: list[int | None] = []
    if len(layout) == 1:
        placements.append(draw(st.integers(0, ndim - 1)))
    else:
        how = draw(st.sampled_from(("one", "same", "two", "one-replicated")))
        d0 = draw(st.integers(0, ndim - 1))
        if how == "one":
            placements = [d0, None] if draw(st.booleans()) else [None, d0]
        elif how == "one-replicated":
            placements = [None, d0]
        elif how == "same":
            placements = [d0, d0]
        else:
            if ndim == 1:
                ndim = 2
            d1 = draw(st.sampled_from([d for d in range(ndim) if d != d0]))
            placements = [d0, d1]
    dims = draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim))
    if kind == "empty":  # some dim sharded over more ranks than it has rows
        sharded = [(d, layout[i]) for i, d in enumerate(placements) if d is not None]
        d, parts = sharded[0]
        dims[d] = draw(st.integers(0, max(0, parts - 1)))
    pool = [d for d in dtypes if d in _FLOATS] if kind == "grad" else list(dtypes)
    dtype = draw(st.sampled_from(pool))
    return DTensorCase(
        world_size=world,
        mesh=mesh,
        names=names[: len(mesh)],
        flatten=flatten,
        shape=tuple(dims),
        placements=tuple(placements),
        dtype=dtype,
        requires_grad=kind == "grad" or (dtype in _FLOATS and draw(st.booleans())),
        seed=draw(st.integers(0, 2**16)),
    )


# --- the rank side ---------------------------------------------------------------------

_MESHES: dict[tuple[Any, ...], Any] = {}
"""The meshes built in this rank process (building one is collective: new groups)."""


def _mesh(case: DTensorCase) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    key = (case.mesh, case.names)
    mesh = _MESHES.get(key)
    if mesh is None:
        mesh = _MESHES[key] = init_device_mesh("cpu", case.mesh, mesh_dim_names=case.names)
    if not case.flatten:
        return mesh
    flat_key = (*key, "flat")
    flat = _MESHES.get(flat_key)
    if flat is None:
        flat = _MESHES[flat_key] = mesh[case.names]._flatten()
    return flat


@dataclass(frozen=True)
class DTensorReport:
    """One rank's view of one case: its shard, the replicated tensor, its gradient, or
    the error it raised."""

    shard: torch.Tensor | None = None
    full: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    error: tuple[str, str] | None = None


def run_dtensor_case(ctx: Any, case: DTensorCase) -> DTensorReport:
    """Rank side: shard the global tensor with ``distribute_tensor``, redistribute to
    all-Replicate, ``to_local``; backward with this rank's upstream gradient."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    try:
        mesh = _mesh(case)
        placements = [Replicate() if d is None else Shard(d) for d in case.placements]
        sharded = distribute_tensor(global_tensor(case), mesh, placements)
        shard = sharded.to_local().detach().clone()
        local = shard.clone().requires_grad_(case.requires_grad)
        x = DTensor.from_local(
            local, mesh, placements, run_check=False, shape=sharded.shape, stride=sharded.stride()
        )
        full = x.redistribute(mesh, [Replicate()] * len(placements)).to_local()
        grad = None
        if case.requires_grad:
            g = upstream(case, ctx.rank)
            (full * g).sum().backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs
            grad = local.grad
        return DTensorReport(shard, full.detach().clone(), grad)
    except Exception as err:
        return DTensorReport(error=(type(err).__name__, str(err)))


# --- the judge -------------------------------------------------------------------------


def judge_dtensor(case: DTensorCase, reports: Sequence[DTensorReport]) -> list[tuple[str, str]]:
    """The failures of one case, as (aspect, message): ``raised``, ``shard`` (not
    torch.chunk's piece), ``output`` (the replicated tensor is not the global one),
    ``gradient`` (not this rank's chunk of its own upstream gradient)."""
    whole = global_tensor(case)
    failures: list[tuple[str, str]] = []
    errors = {r: rep.error for r, rep in enumerate(reports) if rep.error is not None}
    if errors:
        first = min(errors)
        name, message = errors[first]
        ranks = sorted(errors)
        return [("raised", f"ranks {ranks}: {name}: {message.splitlines()[0][:300]}")]
    for r, rep in enumerate(reports):
        want = expected_shard(case, whole, r)
        diff = bitwise_difference(rep.shard, want)
        if diff is not None:
            failures.append(("shard", f"rank {r}: shard differs from torch.chunk's: {diff}"))
        diff = bitwise_difference(rep.full, whole)
        if diff is not None:
            failures.append(("output", f"rank {r}: replicated tensor differs: {diff}"))
        if case.requires_grad:
            want_grad = expected_shard(case, upstream(case, r), r)
            diff = bitwise_difference(rep.grad, want_grad)
            if diff is not None:
                failures.append(
                    ("gradient", f"rank {r}: gradient differs from its upstream's chunk: {diff}")
                )
    return failures


# --- the rows --------------------------------------------------------------------------

ROWS: Final = (
    ("forward-1d", "1d", "1-D meshes of 1-4 ranks: shards as torch.chunk cuts them, and "
     "redistribute to Replicate equals the global tensor bit for bit"),
    ("mesh-2d", "2d", "2-D meshes with named dims: Shard on one mesh dim, the same tensor "
     "dim over both, two tensor dims, Replicate mixed in"),
    ("flattened", "flat", 'a 2-D mesh flattened (mesh["a", "b"]._flatten()), sharded over '
     "the flattened dim"),
    ("empty-shards", "empty", "a sharded dim shorter than its mesh dim: some shards empty"),
    ("gradient", "grad", "gradients through redistribute: each rank's chunk of its own "
     "upstream gradient (Replicate's backward to Shard is local)"),
)  # fmt: skip
DTENSOR_IDS: Final = tuple(row[0] for row in ROWS)


def _run_batch(factory: Callable[[int], RankPool], batch: list[DTensorCase]) -> list[list[Any]]:
    return factory(batch[0].world_size).run_many(run_dtensor_case, batch)


def _reproduction(row: str, options: CheckOptions, batch: Sequence[DTensorCase]) -> str:
    listed = "\n".join(f"  {c.describe()}\n  {c!r}" for c in batch)
    return (
        f"{len(batch)} case(s) on a gloo world of {batch[0].world_size} rank(s), in order:\n"
        f"{listed}\n  reproduce: python -m vargather check --target dtensor --only {row} "
        f"--seed {options.seed} --max-examples {options.max_examples}"
    )


def _evaluate(
    row: str,
    kind: str,
    title: str,
    options: CheckOptions,
    world_sizes: Sequence[int],
    factory: Callable[[int], RankPool],
    progress: Progress,
) -> PropertyResult:
    started = time.monotonic()
    state: dict[str, Any] = {"examples": 0, "cases": 0, "shrink": 0, "failed": False}
    state["stop"] = False
    memo: dict[str, PropertyFailure | None] = {}
    last: list[PropertyFailure] = []

    @st.composite
    def batches(draw: Any) -> list[DTensorCase]:
        first = draw(dtensor_cases(world_sizes, kind))
        more = draw(st.lists(dtensor_cases((first.world_size,), kind), max_size=BATCH - 1))
        return [first, *more]

    def run(batch: list[DTensorCase]) -> PropertyFailure | None:
        if state["failed"]:
            if state["stop"] or state["shrink"] >= options.shrink_budget:
                raise ShrinkBudgetSpent
            state["shrink"] += 1
        else:
            state["examples"] += 1
            state["cases"] += len(batch)
            progress.note(f"{row}: {state['cases']} redistributes")
        try:
            results = _run_batch(factory, batch)
        except (PoolFailure, RankError) as err:
            state["failed"] = True
            state["stop"] = isinstance(err, PoolFailure)
            kind_ = "error" if isinstance(err, RankError) else "crash"
            if not isinstance(err, (RankError, RankCrashed)):
                kind_ = "hang"
            return PropertyFailure(
                kind_,
                f"{type(err).__name__}: {err}",
                asdict(batch[-1]),
                _reproduction(row, options, batch),
                aspect="call",
            )
        for i, (case, reports) in enumerate(zip(batch, results, strict=True)):
            failures = judge_dtensor(case, reports)
            if failures:
                state["failed"] = True
                aspect = failures[0][0]
                return PropertyFailure(
                    "error" if aspect == "raised" else "mismatch",
                    "\n".join(f"[{a}] {m}" for a, m in failures[:4]),
                    {**asdict(case), "repr": repr(case)},
                    _reproduction(row, options, batch[: i + 1]),
                    aspect=aspect,
                )
        return None

    def body(batch: list[DTensorCase]) -> None:
        key = repr(batch)
        failure = memo[key] if key in memo else run(batch)
        memo[key] = failure
        if failure is not None:
            last[:] = [failure]
            raise FailingBatchError(failure)

    failure = seeded_search(
        batches(), body, options, options.max_examples, lambda: last[0] if last else None
    )
    return PropertyResult(
        row,
        title,
        "pass" if failure is None else "fail",
        examples=state["examples"],
        cases=state["cases"],
        shrink_runs=state["shrink"],
        seconds=time.monotonic() - started,
        failure=failure,
    )


def _needed(kind: str, world_sizes: Sequence[int]) -> tuple[int, ...]:
    worlds = [w for w in world_sizes if 1 <= w <= 4]
    if kind in ("2d", "flat"):
        worlds = [w for w in worlds if w > 1]
    return tuple(worlds)


def run_dtensor_check(
    options: CheckOptions,
    progress: Progress,
    factory: Callable[[int], RankPool],
    versions: dict[str, str],
) -> Report:
    """``check --target dtensor``: every row of ``ROWS`` as a seeded Hypothesis test on
    the gloo worlds of ``options.world_sizes`` (meshes of up to 4 ranks)."""
    started = time.monotonic()
    world_sizes = tuple(sorted(options.world_sizes))
    rows = [r for r in ROWS if not options.only or r[0] in options.only]
    progress.retotal(len(rows))
    needed = sorted({w for _, kind, _ in rows for w in _needed(kind, world_sizes)})
    if needed:
        progress.phase(f"starting gloo worlds of {', '.join(map(str, needed))} rank(s)")
    for w in needed:
        factory(w)
    report = Report(
        impl=None,
        impl_display="torch.distributed.tensor: DTensor.redistribute to all-Replicate",
        convention="dtensor",
        grad=options.grad,
        world_sizes=world_sizes,
        max_examples=options.max_examples,
        seed=options.seed,
        xfails_path=options.xfails_path,
        versions=versions,
        scope={"--grad": options.grad, "--world-sizes": ",".join(map(str, world_sizes))},
        strict=options.strict,
        call="distribute_tensor(t, mesh, placements).redistribute(mesh, [Replicate()] * n)"
        ".to_local()",
    )
    try:
        for row, kind, title in rows:
            progress.phase(f"checking {row}")
            if options.exitfirst and any(r.failed for r in report.results):
                result = PropertyResult(
                    row, title, "skipped", reason="--exitfirst: an earlier property failed"
                )
            elif not _needed(kind, world_sizes):
                result = PropertyResult(
                    row, title, "n/a", reason="needs a world of 2 to 4 ranks (--world-sizes)"
                )
            else:
                result = _evaluate(row, kind, title, options, world_sizes, factory, progress)
            result = with_xfail(result, options.xfails)
            report.results.append(result)
            progress.row(result)
    finally:
        progress.close()
    report.seconds = time.monotonic() - started
    return report

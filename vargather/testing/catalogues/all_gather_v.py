"""``all_gather_v``'s catalogue: the claims a ragged gather must hold.

Where it sits: one of the kit's catalogues, above the gather's own stack (``cases``,
``strategies``, ``judge``, ``runner``), ``properties`` and ``family_catalogue``;
beneath the engine. Each property varies one thing (``docs/property-suite.md`` has
the table); every property draws some large cases (``vargather.testing.scale``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import count
from typing import TYPE_CHECKING, Any, Final

from hypothesis import strategies as st

from .. import strategies as vst
from ..cases import GatherCase, Implementation, RankReport, sizes_forms_for
from ..compiled import warm_backends
from ..family_catalogue import (
    COMMON_DTYPES,
    COMPILED_EXAMPLES,
    SEQUENCE_DTYPES,
    VALUES,
    forward_rows,
    row_builder,
    scoped,
)
from ..misuse import GatherMisuseCase, misuse_by_name
from ..misuse import judge_misuse as judge_gather_misuse
from ..misuse import run_misuse as run_gather_misuse
from ..options import CheckOptions
from ..pool import RankPool
from ..pool_types import PoolFailure, RankError
from ..properties import Property
from ..rank_runner import run_on_rank
from ..resolve import ImplInfo, resolve_options_impl
from ..results import case_data
from ..runner import (
    Verdict,
    describe,
    describe_coalesced,
    judged,
    on_world,
    reproduction,
    run_cases,
    run_coalesced,
)
from ..scale import sequence_length
from ..values import COMPILE_BACKENDS, DTYPE_NAMES, is_differentiable, torch_dtype

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def _on_backends(cases: list[GatherCase]) -> SearchStrategy[list[GatherCase]]:
    """``cases``, each on a compile backend drawn for it (shrinking toward ``eager``)."""
    backends = st.lists(st.sampled_from(COMPILE_BACKENDS), min_size=len(cases), max_size=len(cases))
    return backends.map(
        lambda names: [replace(c, compile_backend=b) for c, b in zip(cases, names, strict=True)]
    )


def one_call(cases: Sequence[GatherCase]) -> list[GatherCase]:
    """``cases`` as the tensors of one coalesced call: every case takes the first's
    contract and transport (the call takes them once); everything else stays each
    case's own (dtype, shape, sizes, dim, memory layout, sizes form, requires_grad)."""
    if not cases:
        return []
    first = cases[0]
    return [replace(c, contract=first.contract, transport=first.transport) for c in cases]


# --- the catalogue ----------------------------------------------------------------------


_OUTPUT: Final = frozenset({"output"})
_SIZES: Final = frozenset({"output", "sizes"})
_ALL: Final = frozenset({"output", "sizes", "gradient", "adjoint"})

COMPILED_SLOW_EXAMPLES: Final = 25
COMPILED_BATCH: Final = 3
"""Cases per compiled batch: calls in a row through one compiled step per backend,
sizes and shapes changing between them (dynamo's recompiles, then dynamic sizes)."""

COALESCED_MAX_PAYLOAD: Final = 64 * 1024
"""Bytes per rank's shard a large case of the ``coalesced`` property may reach: enough
for outputs past ``DIGEST_MIN_BYTES`` and the coalesced call's small/large split, small
enough that a batch of tensors costs one quick round trip."""


def _rows(catalogue: _Gather, implementation: Implementation, returns: str) -> list[Property]:
    """Every property, in a fixed order, for ``implementation`` (``returns``: as
    ``catalogue``'s); cases draw the contracts it claims and the transports it takes."""
    impl = implementation
    c: dict[str, object] = {"contracts": impl.contracts}
    if impl.transports is not None:
        c["transports"] = impl.transports
    if impl.dims is not None:
        c["dims"] = impl.dims
    plain = ("none",) if "none" in sizes_forms_for(impl.sizes_scope) else None
    none = plain or sizes_forms_for(impl.sizes_scope)  # --sizes required: always passed
    fwd = {"sizes_forms": none, "memory": ("contiguous",), "requires_grad": False, **c}
    common = {**fwd, "dtypes": tuple(d for d in COMMON_DTYPES if d in DTYPE_NAMES)}
    no_grad = {} if impl.differentiable else {"requires_grad": False}
    world = {"sizes_forms": none, "dtypes": ("float32", "float64", "complex64"), **c, **no_grad}
    grads = {
        "sizes_forms": none,
        "requires_grad": True,
        "dtypes": tuple(n for n in DTYPE_NAMES if is_differentiable(torch_dtype(n))),
        **c,
    }
    # Sequences call without sizes where the scope allows (the state under test is the
    # implementation's own); with --sizes required they pass them.
    seq = {"sizes_forms": plain or none, "dtypes": SEQUENCE_DTYPES, **c}
    coalesced = {
        "sizes_forms": sizes_forms_for(impl.sizes_scope),
        "requires_grad": None if impl.differentiable else False,
        "max_payload": COALESCED_MAX_PAYLOAD,
        **c,
    }
    # Compiled: sizes passed as ints or not at all (a tensor of sizes takes the eager
    # path behind a graph break, which fullgraph refuses), contiguous shards of
    # integer values (``x * 1`` and every sum exact on any backend), empties often.
    compiled = {
        "sizes_forms": tuple(f for f in sizes_forms_for(impl.sizes_scope) if f != "tensor"),
        "memory": ("contiguous",),
        "values": ("integers",),
        "dtypes": tuple(d for d in COMMON_DTYPES if d in DTYPE_NAMES),
        "max_payload": 0,
        **c,
        **no_grad,
    }
    what = "layout" if returns == "layout" else "sizes"
    claimed = ", ".join(map(repr, impl.contracts))
    same = "forward equals torch.cat(x, dim) bit for bit on every rank, "

    row = row_builder(impl, catalogue)
    rows = [
        *forward_rows(lambda i, t, dtypes: row(i, t, _OUTPUT, **fwd, dtypes=dtypes), same),
        row(
            "dims",
            "forward along dims other than 0, negative ones included",
            _OUTPUT,
            **common,
            min_ndim=2,
            keep=lambda c: c.dim != 0,
        ),
        row(
            "empty-some",
            "forward with some ranks' shards empty",
            _OUTPUT,
            **common,
            min_world=2,
            keep=lambda c: 0 < c.sizes.count(0) < c.group_size,
        ),
        row("empty-all", "forward with every rank's shard empty", _OUTPUT, **common, max_size=0),
        row(
            "non-contiguous",
            "forward from transposed and strided (sliced) views",
            _OUTPUT,
            **{**common, "memory": ("transposed", "sliced")},
        ),
        row(
            "sizes-list",
            f"sizes passed as a list of ints: forward and returned {what}",
            _SIZES,
            **{**common, "sizes_forms": ("list",)},
        ),
        row(
            "sizes-tensor",
            f"sizes passed as a 1-d int64 tensor: forward and returned {what}",
            _SIZES,
            **{**common, "sizes_forms": ("tensor",)},
        ),
        row(
            "returned-sizes",
            f"the returned {what} equal the true ones",
            frozenset({"sizes"}),
            **common,
            needs_returned_sizes=True,
        ),
        row(
            "one-rank",
            "a world of one rank: the identity, gradients flowing",
            _ALL,
            **world,
            max_world=1,
        ),
        row(
            "uninitialized",
            "torch.distributed not initialized: the identity, gradients flowing",
            _ALL,
            **world,
            initialized=False,
        ),
        row(
            "subgroup",
            "group= a subgroup: gathers its members only, gradients too",
            _ALL,
            **world,
            min_world=2,
            subgroups=True,
        ),
        row(
            "gradient",
            f"input gradients under grad={claimed}, upstream gradients differing per rank",
            frozenset({"gradient"}),
            **grads,
        ),
        row(
            "adjoint",
            "sum_r <dx_r, x_r> == sum_j <g_j, out_j> exactly (grad='sum', integer values)",
            frozenset({"gradient", "adjoint"}),
            **{**grads, "contracts": ("sum",), "values": ("integers",), "upstream": ("integers",)},
            min_world=2,
            needs_sum=True,
        ),
        row(
            "call-sequence",
            "gathers repeated on one world, sizes, dtypes, shapes and payload scale "
            "changing between calls (state carried across calls)",
            _ALL,
            **{**seq, "requires_grad": None if impl.differentiable else False},
            min_world=2,
            sequences=True,
        ),
        row(
            "compiled",
            "the call inside a training step compiled with torch.compile(fullgraph=True) "
            "on eager, aot_eager or inductor: output and input gradients equal eager's "
            "bit for bit (integer values), empty shards and size changes between calls; "
            "a rank that issues other collectives than its peers hangs the world",
            VALUES,
            **compiled,
            compiled=True,
            examples=COMPILED_EXAMPLES,
            slow_examples=COMPILED_SLOW_EXAMPLES,
            batch=COMPILED_BATCH,
        ),
        row(
            "coalesced",
            "a batch of tensors gathered by one all_gather_v_coalesced call (each its own "
            "dtype, shape, dim, memory layout and sizes form): every output bit for bit, "
            f"gradients under the call's grad={claimed} after one backward over all outputs",
            VALUES,
            **coalesced,
            coalesced=True,
        ),
        row(
            "misuse",
            "one rank's arguments wrong (the kit's misuse catalogue): the same error class "
            "and message on every rank, naming that rank, and the next gather works",
            frozenset({"misuse"}),
            min_world=2,
            misuse=True,
            batch=2,
        ),
    ]
    return [_scoped(row) for row in rows]


def _scoped(row: Property) -> Property:
    """``row`` within its implementation's declared scope: left out (``scoped``) where
    the scope excludes what it is about, else its cases narrowed where a whole-row
    argument needs it (non-zero dims)."""
    impl = row.implementation
    forms = sizes_forms_for(impl.sizes_scope)
    nonzero = tuple(d for d in impl.dims or () if d != 0)
    why = None
    if row.misuse and impl.ref is not None:
        why = (
            "the misuse scenarios call vargather's own all_gather_v_with_layout "
            "(transport=, validate=, timeout= included)"
        )
    elif row.coalesced and impl.coalesced_form is None:
        # vargather's own only: forks and the mutants of tests/mutants rebuild the
        # single-tensor pipeline by hand and leave all_gather_v_coalesced untouched
        why = "ATTR has no coalesced form (vargather.all_gather_v_coalesced only)"
    elif row.id in ("sizes-list", "sizes-tensor") and row.id.removeprefix("sizes-") not in forms:
        said = "never passed" if impl.sizes_scope == "never" else f"passed as {forms}"
        why = f"--sizes {impl.sizes_scope}: sizes is {said}"
    elif row.id == "dims" and impl.dims is not None and not nonzero:
        why = f"--dims {','.join(map(str, impl.dims))}: dim 0 only"
    elif row.id == "dims" and impl.dims is not None:
        deepest = max((d + 1 for d in nonzero if d >= 0), default=1)
        kwargs = {**row.kwargs, "dims": nonzero, "max_ndim": min(8, max(4, deepest))}
        return replace(row, kwargs=kwargs)
    return scoped(row, why)


EQUAL_SHAPES_ONLY: Final = "--equal-shapes: every rank's shard has the same shape"


def equal_shapes_only(row: Property) -> Property:
    """``row`` under ``--equal-shapes``: its cases drawn with every rank's shard of the
    first rank's shape, or the row left out when it is about unequal shapes (some
    shards empty, others not)."""
    if row.out_of_scope is not None or row.misuse:
        return row
    if row.id == "empty-some":
        return replace(row, out_of_scope=EQUAL_SHAPES_ONLY)
    return replace(row, equal_shapes=True)


def _equalized(case: GatherCase) -> GatherCase:
    """``case`` with every rank's shard of the first rank's shape."""
    return replace(case, shapes=(case.shapes[0],) * len(case.shapes))


# --- the catalogue's hooks -------------------------------------------------------------


class _Gather:
    """``all_gather_v``'s ``Catalogue``."""

    op: Final = "all_gather_v"
    default_call: Final = None

    def resolve(self, options: CheckOptions, cwd: str) -> ImplInfo:
        return resolve_options_impl(options, cwd)

    def implementation(self, info: ImplInfo, options: CheckOptions, cwd: str) -> Implementation:
        """The claimed contract and the declared scope only."""
        grad = options.grad
        narrowed = info.scope  # what a call template leaves out
        scope: dict[str, Any] = {
            "contracts": ("sum",) if grad == "none" else (grad,),
            "differentiable": grad != "none",
            "dims": options.dims if narrowed is None else narrowed.dims,
            "sizes_scope": options.sizes if narrowed is None else narrowed.sizes,
            "returns": options.returns,
            "emulate": options.emulate,
            "takes_grad": info.takes_grad,
            "call": info.call,
        }
        if options.compile:
            scope["compiles"] = True  # vargather's own claims it anyway
        if info.ref is None:
            return Implementation(None, transports=info.transports, name="vargather", **scope)
        return Implementation(
            info.ref,
            convention=info.convention,
            transports=info.transports,
            search_path=(cwd,),
            name=info.ref,
            takes_group=info.takes_group,
            ctor_kwargs=info.ctor_kwargs,
            ctor_takes_dim=info.ctor_takes_dim,
            **scope,
        )

    def rows(self, implementation: Implementation, returns: str = "unknown") -> list[Property]:
        return _rows(self, implementation, returns)

    def draw(
        self,
        prop: Property,
        world: int,
        batch: int,
        transports: Sequence[str] | None,
        max_payload: int,
    ) -> SearchStrategy[list[Any]]:
        if prop.misuse:
            one = st.sampled_from(MISUSES).flatmap(
                lambda m: st.builds(
                    GatherMisuseCase,
                    st.just(m.name),
                    st.just(world),
                    st.just(0) if m.all_ranks else st.integers(0, world - 1),
                    st.just(prop.implementation.emulate),
                )
            )
            return st.lists(one, min_size=1, max_size=batch)
        kwargs = {"max_payload": max_payload, **prop.kwargs}
        if transports is not None:
            kwargs["transports"] = tuple(transports)
        keep = prop.keep
        kwargs.update(initialized=prop.initialized, implementation=prop.implementation)
        drawn: SearchStrategy[list[GatherCase]]
        if prop.sequences:  # a call-sequence row: nothing below but --equal-shapes applies
            length = max(batch, sequence_length())
            drawn = vst.call_sequences(
                min_world_size=world, max_world_size=world, max_length=length, **kwargs
            )
        else:
            drawn = vst.case_batches(
                min_world_size=world,
                max_world_size=world,
                max_batch=batch,
                subgroups=prop.subgroups,
                **kwargs,
            )
        if prop.equal_shapes:
            drawn = drawn.map(lambda cases: [_equalized(c) for c in cases])
        if prop.coalesced:
            drawn = drawn.map(one_call)
        if prop.compiled:
            drawn = drawn.flatmap(_on_backends)
        if keep is not None:
            drawn = drawn.map(lambda cases: [c for c in cases if keep(c)]).filter(bool)
        return drawn

    def run(
        self, prop: Property, batch: Sequence[Any], pool_factory: Callable[[int], RankPool]
    ) -> list[Verdict]:
        if prop.misuse:
            return judged(
                batch,
                prop.implementation,
                "all_gather_v",
                lambda: [pool_factory(c.world_size).run(run_gather_misuse, c) for c in batch],
                judge_gather_misuse,
            )
        run = run_coalesced if prop.coalesced else run_cases
        if prop.compiled and batch:  # a backend's setup not charged to the batch's timeout
            backends = sorted({c.compile_backend for c in batch})
            pool_factory(batch[0].world_size).run(warm_backends, backends)
        return run(batch, prop.implementation, pool_factory=pool_factory)

    def describe(self, prop: Property, batch: Sequence[Any], index: int) -> str:
        if prop.misuse:
            cases = batch[: index + 1]
            head = f"{len(cases)} misuse(s) {on_world(True, cases[0].world_size)}:"
            said = [f"{c!r}: {misuse_by_name(c.name).summary}" for c in cases]
            return reproduction(head, said, list(map(repr, cases)))
        if prop.coalesced:  # one call of every case: it lists them all
            return describe_coalesced(batch, index, prop.implementation)
        # The calls that ran before it on the same world (state carried over).
        return describe(batch[index], prop.implementation, before=list(batch[:index]))

    def case_data(self, case: Any) -> dict[str, Any]:
        if isinstance(case, GatherMisuseCase):
            return {**dataclasses.asdict(case), "repr": repr(case)}
        return case_data(case)

    def probe_returns(
        self,
        implementation: Implementation,
        world_sizes: Sequence[int],
        factory: Callable[[int], RankPool],
    ) -> str:
        """What it returns beside the tensor on a small 2-rank (or 1-rank) gather."""
        multi = [w for w in world_sizes if w >= 2]
        w = min(multi) if multi else 1
        case = GatherCase(
            shapes=tuple((1 + r % 2, 2) for r in range(w)),
            dim=0,
            dtype="float32",
            contract=implementation.contracts[0],
            values="integers",
            requires_grad=False,
        )
        try:
            reports = factory(w).run(run_on_rank, (implementation, case, next(_PROBE_TOKENS)))
        except (PoolFailure, RankError):  # the properties will report what went wrong
            return "unknown"
        kinds = {
            r.extra[0]
            for r in reports
            if isinstance(r, RankReport) and r.error is None and r.out is not None
        }
        if len(kinds) != 1:
            return "unknown"
        kind = kinds.pop()
        return str(kind) if kind in ("sizes", "layout", "none") else "unknown"


_PROBE_TOKENS = count(-1, -1)


CATALOGUE: Final = _Gather()


# --- misuse ---
# all_gather_v's own misuses (vargather.testing.misuse's model; the generic ones join).
import vargather  # noqa: E402  # the misuse tail's, below the catalogue above

from ..misuse import Call, Misuse, SizesTensor, TensorSpec, call, misuses, tie  # noqa: E402


def _size(rank: int) -> int:
    return (2, 0, 3, 1)[rank % 4]


def _sizes(w: int) -> list[int]:
    return [_size(r) for r in range(w)]


def _g(r: int, dtype: str = "float32", trail: tuple[int, ...] = (2,), **kw: object) -> Call:
    """Rank ``r``'s ragged shard (sizes 2, 0, 3, 1), passed with ``kw``."""
    return call("all_gather_v", TensorSpec((_size(r), *trail), dtype), **kw)


def _lie(w: int, o: int) -> list[int]:
    lie = _sizes(w)
    lie[(o + 1) % w] += 1
    return lie


def _dtype_pair(a: str, b: str) -> Misuse:
    return Misuse(
        f"dtype-{a}-vs-{b}",
        f"one rank passes {b} where the others pass {a}",
        vargather.DTypeMismatchError,
        lambda r, w: _g(r, b),
        lambda w, o: ("dtype differs", f"torch.{a}", f"torch.{b}", f"rank(s) [{o}]"),
        good=lambda r, w: _g(r, a),
    )


def _arg(
    name: str, summary: str, error: type[vargather.VarGatherError], frag: Any, **kw: Any
) -> Misuse:
    """The offender passes ``kw`` beside its plain shard."""
    return Misuse(name, summary, error, lambda r, w: _g(r, **kw), frag)


def _grad_differs(contract: str, peers: bool) -> Misuse:
    def shard(needs: bool) -> Any:
        return lambda r, w: call(
            "all_gather_v", TensorSpec((_size(r), 2), "float64", requires_grad=needs), grad=contract
        )

    return Misuse(
        f"requires-grad-differs-{contract}",
        f"under grad='{contract}' one rank {'does not need' if peers else 'needs'} a gradient "
        f"and its peers {'do' if peers else 'do not'}",
        vargather.RequiresGradMismatchError,
        shard(not peers),
        lambda w, o: ("requires_grad", f"grad='{contract}'", "True", "False", f"[{o}]"),
        good=shard(peers),
        blamed=tie,
    )


# A table, two lines an entry: name, summary, error; bad call, fragments, options.
# fmt: off
MISUSES: Final = misuses(
    lambda r, w: _g(r),
    _dtype_pair("float32", "int32"),
    _dtype_pair("float16", "bfloat16"),
    _dtype_pair("int64", "float64"),
    _dtype_pair("float32", "float64"),
    Misuse("ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _g(r, trail=(2, 1)), lambda w, o: ("ndim differs", "2", "3", f"rank(s) [{o}]")),
    Misuse("trailing-dim-differs", "a dimension other than the gather dimension differs on one rank", vargather.ShapeMismatchError,
        lambda r, w: _g(r, trail=(3,)), lambda w, o: ("shape outside the gather dimension", "(*, 2)", "(*, 3)", f"[{o}]", "* is the gather dimension, dim=0; full shapes: rank 0 (", f"rank {o} (",)),
    _arg("dim-out-of-range-on-one-rank", "dim is out of range on one rank", vargather.DimError,
        lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=5", "expected -2 <= dim < 2"), dim=5),
    Misuse("dim-out-of-range-on-every-rank", "dim is out of range on every rank", vargather.DimError,
        lambda r, w: _g(r, dim=-3), lambda w, o: (f"rank(s) {list(range(w))}", "dim=-3 is out of range", "expected -2 <= dim < 2"), all_ranks=True),
    _arg("dim-huge", "dim does not even fit in int64 on one rank", vargather.DimError,
        lambda w, o: (f"rank {o}: dim=9223372036854775807 (or more)", "expected -2"), dim=2**70),
    _arg("dim-not-an-int", "dim is a float on one rank", vargather.DimError,
        lambda w, o: (f"rank {o}: expected dim to be an int, got float 0.0",), dim=0.0),
    Misuse("dim-differs", "ranks gather along different dimensions (each valid locally)", vargather.ArgumentMismatchError,
        lambda r, w: call("all_gather_v", TensorSpec((2, _size(r))), dim=1), lambda w, o: ("gather dimension", "0", "1", f"rank(s) [{o}]")),
    Misuse("sizes-wrong-length", "sizes has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _g(r, sizes=[*_sizes(w), 1]), lambda w, o: (f"rank {o}: expected len(sizes) == world size {w}, got {w + 1}",)),
    Misuse("sizes-wrong-own-entry", "sizes is wrong about the rank's own tensor", vargather.SizesError,
        lambda r, w: _g(r, sizes=[n + (i == r) for i, n in enumerate(_sizes(w))], validate=True), lambda w, o: (f"rank {o}: expected sizes[{o}] == {_size(o)}", f"got sizes[{o}] = {_size(o) + 1}")),
    Misuse("sizes-negative", "sizes holds a negative entry on one rank", vargather.SizesError,
        lambda r, w: _g(r, sizes=[-1 if i != r else n for i, n in enumerate(_sizes(w))]), lambda w, o: (f"rank {o}: sizes must be >= 0", "= -1")),
    Misuse("sizes-not-integers", "sizes holds a float on one rank", vargather.SizesTypeError,
        lambda r, w: _g(r, sizes=[float(n) for n in _sizes(w)]), lambda w, o: (f"rank {o}: sizes must hold integers", "sizes[0] = float")),
    Misuse("sizes-float-tensor", "sizes is a float tensor on one rank", vargather.SizesTypeError,
        lambda r, w: _g(r, sizes=SizesTensor(tuple(_sizes(w)), "float32")), lambda w, o: (f"rank {o}: sizes must hold integers", "a tensor of dtype float32")),
    Misuse("sizes-2d-tensor", "sizes is a 2-d integer tensor on one rank", vargather.SizesError,
        lambda r, w: _g(r, sizes=SizesTensor(tuple(_sizes(w)), "int64", (1, w))), lambda w, o: (f"rank {o}: sizes must be a 1-d integer tensor", f"(1, {w})")),
    _arg("sizes-a-string", "sizes is a string on one rank", vargather.SizesTypeError,
        lambda w, o: (f"rank {o}: sizes must hold integers", "str"), sizes="2,0,3"),
    Misuse("sizes-lie-about-a-peer", "sizes is right about the rank itself but wrong about a peer", vargather.SizesMismatchError,
        lambda r, w: _g(r, sizes=_lie(w, r)), lambda w, o: (f"sizes passed on rank(s) [{o}] contradict the tensors", f"expected sizes={_sizes(w)}", f"rank {o} passed sizes={_lie(w, o)}"), good=lambda r, w: _g(r, sizes=_sizes(w))),
    Misuse("sizes-passed-on-one-rank-only-and-wrong", "only one rank passes sizes, and they lie about a peer", vargather.SizesMismatchError,
        lambda r, w: _g(r, sizes=_lie(w, r)), lambda w, o: (f"expected sizes={_sizes(w)}", f"rank {o} passed sizes={_lie(w, o)}")),
    Misuse("zero-dim-input", "one rank passes a 0-d tensor", vargather.InputShapeError,
        lambda r, w: call("all_gather_v", TensorSpec(())), lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d")),
    Misuse("too-many-dims", "one rank passes a 33-d tensor", vargather.InputShapeError,
        lambda r, w: call("all_gather_v", TensorSpec((1,) * 33)), lambda w, o: (f"rank {o}: expected at most 32 dimensions, got 33",)),
    Misuse("dtype-gloo-cannot-carry", "one rank passes a float8 tensor, which gloo cannot carry", vargather.InputTypeError,
        lambda r, w: _g(r, "float8_e4m3fn"), lambda w, o: (f"rank {o}: dtype float8_e4m3fn cannot be gathered", "float32")),
    Misuse("sparse-input", "one rank passes a sparse COO tensor", vargather.InputTypeError,
        lambda r, w: call("all_gather_v", TensorSpec((_size(r), 2), layout="sparse")), lambda w, o: (f"rank {o}: expected a dense (torch.strided)", "sparse_coo")),
    Misuse("meta-device", "one rank passes a tensor on the meta device", vargather.InputTypeError,
        lambda r, w: call("all_gather_v", TensorSpec((_size(r), 2), device="meta")), lambda w, o: (f"rank {o}: expected a tensor on a device", "got a meta tensor")),
    _grad_differs("sum", peers=False),
    _grad_differs("mean", peers=True),
    _arg("grad-contract-differs", "one rank asks for grad='local', its peers for grad='sum'", vargather.ArgumentMismatchError,
        lambda w, o: ("gradient contract", "'sum'", "'local'", f"rank(s) [{o}]"), grad="local"),
    _arg("grad-contract-unknown", "one rank passes an unknown gradient contract", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: grad must be one of 'sum', 'local', 'mean'", "'avg'"), grad="avg"),
    _arg("transport-differs", "one rank forces another transport", vargather.ArgumentMismatchError,
        lambda w, o: ("transport differs", "'auto'", "'padded'", f"rank(s) [{o}]"), transport="padded"),
    _arg("transport-unknown", "one rank passes an unknown transport", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: transport must be one of", "'ring'"), transport="ring"),
    _arg("transport-unavailable-on-gloo", "one rank forces transport='views', which gloo cannot run", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: transport='views'", "gloo"), transport="views"),
    _arg("validate-not-a-bool", "one rank passes validate='yes'", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: validate must be a bool, got str 'yes'",), validate="yes"),
    _arg("timeout-below-a-millisecond", "one rank passes timeout=1e-130 (gloo would round it to 0 ms: expire at once)", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: timeout must be None", "from 0.001 s", "1e-130"), timeout=1e-130),
    _arg("timeout-invalid", "one rank passes a negative timeout", vargather.ArgumentError,
        lambda w, o: (f"rank {o}: timeout must be None, or a number of seconds", "-1.0"), timeout=-1.0),
    Misuse("mixed-coalesced-beside-all-gather-v", "one rank calls all_gather_v_coalesced while its peers call all_gather_v", vargather.ProtocolMismatchError,
        lambda r, w: call("all_gather_v_coalesced", [TensorSpec((_size(r), 2))] * 2), lambda w, o: ("all_gather_v / all_gather_v_coalesced: collective differs across ranks", f"'all_gather_v_coalesced' on rank(s) [{o}]", "'all_gather_v'", "call the same collective on every rank"), blamed=tie),
)
# fmt: on
"""Every misuse of all_gather_v, each raised as the same error on every rank."""

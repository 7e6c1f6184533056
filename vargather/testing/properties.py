"""The testing kit's property catalogue: the one list of claims a ragged gather must hold.

Where it sits: the top of the kit's layers (``cases`` -> ``strategies`` -> ``judge`` ->
``runner`` -> here). ``tests/test_properties.py`` (pytest), ``tests/test_mutants.py``
(the mutant search) and ``python -m vargather check`` (the conformance gate) all run
the properties ``catalogue()`` returns, so the gate and the suite cannot drift.

A ``Property`` is a class of cases (keyword arguments of
``vargather.testing.strategies.case_batches`` plus a world-size range, and a ``keep``
filter where no strategy argument narrows enough) and the aspects of the judge's
checks it is about: a forward property does not fail on returned sizes, which have a
property of their own. A failure of the call itself (an exception, a crash, a hang)
counts against every property.

Each property varies one thing: the forward properties run contiguous shards without
``sizes`` and without backward, every dim and ragged shape (empty shards too); the
structural ones use the common dtypes; the world ones (one rank, uninitialized,
subgroup) use float32/float64/complex64 and mostly run backward. Every property draws
some large cases (payload scale, ``vargather.testing.scale``); ``call-sequence`` draws
call sequences (``strategies.call_sequences``): state carried from call to call;
``coalesced`` runs each batch as one ``all_gather_v_coalesced`` call (every case one
tensor of it, ``runner.run_coalesced``), judged case by case as if each had run alone.
Only vargather's own implementation has a coalesced form
(``Implementation.coalesced_form``): for any other, forks and the mutants of
``tests/mutants`` included (they rebuild the single-tensor pipeline by hand and leave
``all_gather_v_coalesced`` untouched), the row is not applicable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from hypothesis import strategies as st

from . import strategies as vst
from .cases import (
    COMPILE_BACKENDS,
    DTYPE_NAMES,
    VARGATHER,
    GatherCase,
    Implementation,
    dtype_family,
    sizes_forms_for,
    torch_dtype,
)
from .compiled import warm_backends
from .judge import Failure
from .pool import RankPool
from .runner import Verdict, describe, describe_coalesced, run_cases, run_coalesced
from .scale import DEFAULT_MAX_PAYLOAD, sequence_length

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["BATCH", "COALESCED_MAX_PAYLOAD", "Property", "catalogue", "one_call", "property_ids"]

BATCH: Final = 6
"""Cases per example by default: one example is one pool round trip (``run_many``)."""

RETURNS: Final = ("sizes", "layout", "none", "unknown")
"""What an implementation returns beside the tensor (``unknown``: not yet asked)."""


@dataclass(frozen=True)
class Property:
    """One claim, checked on batches of cases drawn by ``strategy``.

    ``kwargs`` go to ``case_batches``; ``aspects`` are the judge's aspects it counts
    (``Failure.aspect``; ``call`` always counts); ``keep`` narrows each drawn batch.
    ``min_world``/``max_world`` bound the world sizes it runs on (``None``: no bound);
    ``initialized=False`` runs one rank in the calling process without
    torch.distributed; ``subgroups`` draws subgroups of the world.
    """

    implementation: Implementation
    id: str
    title: str
    aspects: frozenset[str]
    kwargs: Mapping[str, object] = field(default_factory=dict, hash=False)
    min_world: int = 1
    max_world: int | None = None
    keep: Callable[[GatherCase], bool] | None = None
    initialized: bool = True
    subgroups: bool = False
    needs_sum: bool = False
    needs_returned_sizes: bool = False
    out_of_scope: str | None = None
    """Why the implementation's declared scope excludes the whole property (``None``:
    it does not; out-of-scope cases of an in-scope property are never drawn)."""
    sequences: bool = False
    """Draw call sequences (``strategies.call_sequences``): each batch is one sequence of
    gathers, every call following the one before by a small change."""
    coalesced: bool = False
    """Run each batch as ONE call of the implementation's coalesced form
    (``runner.run_coalesced``), every case one tensor of it; the batch is drawn with
    the contract and transport of its first case (what the call takes once)."""
    compiled: bool = False
    """Run every case inside a step compiled with ``torch.compile(fullgraph=True)``, each
    on a backend drawn from ``COMPILE_BACKENDS`` (``vargather.testing.compiled``)."""
    examples: int | None = None
    """At most this many examples per run, whatever the caller asks (``None``: no cap):
    a property whose every example costs seconds (compiling) stays within the check's
    budget; ``slow_examples`` under the slow schedule."""
    slow_examples: int | None = None
    batch: int | None = None
    """Cases per batch at most (``None``: the caller's)."""

    def max_examples(self, asked: int, *, slow: bool = False) -> int:
        """The examples to draw when ``asked`` are: capped by ``examples`` (or by
        ``slow_examples`` when ``slow``)."""
        cap = self.slow_examples if slow and self.slow_examples is not None else self.examples
        return asked if cap is None else min(asked, cap)

    def worlds(self, world_sizes: Sequence[int]) -> list[int]:
        """The world sizes of ``world_sizes`` it runs on (``[1]`` when uninitialized)."""
        if not self.initialized:
            return [1]
        top = self.max_world
        return sorted(
            w for w in set(world_sizes) if w >= self.min_world and (top is None or w <= top)
        )

    def not_applicable(self, world_sizes: Sequence[int], returns: str = "unknown") -> str | None:
        """Why it does not apply to its implementation on ``world_sizes`` (``None``: it
        does). ``returns``: what the implementation returns beside the tensor."""
        impl = self.implementation
        if self.out_of_scope is not None:
            return self.out_of_scope
        if self.needs_sum and "sum" not in impl.contracts:
            claimed = ", ".join(map(repr, impl.contracts))
            return f"an identity of grad='sum'; the claimed contract is {claimed}"
        if self.subgroups:
            if impl.convention == "seed":
                return "the seed's convention ATTR(t, dim, sizes) takes no process group"
            if not impl.takes_group:
                return "ATTR takes no group= parameter"
        if self.needs_returned_sizes and returns == "none":
            return "ATTR returns a bare tensor: no sizes to check"
        if self.initialized and not self.worlds(world_sizes):
            if self.max_world == 1:
                return "needs world size 1 in --world-sizes"
            return f"needs a world size >= {self.min_world} in --world-sizes"
        return None

    def strategy(
        self,
        world_sizes: Sequence[int],
        *,
        batch: int = BATCH,
        transports: Sequence[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> SearchStrategy[list[GatherCase]]:
        """Batches of up to ``batch`` cases, all on one world size drawn from
        ``world_sizes`` (restricted to the property's range). ``transports`` narrows
        the transports drawn (default: every one the implementation takes);
        ``max_payload`` bounds a large case's bytes per rank (0: small cases only)."""
        kwargs = {"max_payload": max_payload, **self.kwargs}
        if transports is not None:
            kwargs["transports"] = tuple(transports)
        keep = self.keep
        if self.batch is not None:
            batch = min(batch, self.batch)

        def for_world(w: int) -> SearchStrategy[list[GatherCase]]:
            if self.sequences:
                return vst.call_sequences(
                    min_world_size=w,
                    max_world_size=w,
                    max_length=max(batch, sequence_length()),
                    initialized=self.initialized,
                    implementation=self.implementation,
                    **kwargs,
                )
            drawn = vst.case_batches(
                min_world_size=w,
                max_world_size=w,
                max_batch=batch,
                subgroups=self.subgroups,
                initialized=self.initialized,
                implementation=self.implementation,
                **kwargs,
            )
            if self.coalesced:
                drawn = drawn.map(one_call)
            if self.compiled:
                drawn = drawn.flatmap(_on_backends)
            if keep is None:
                return drawn
            return drawn.map(lambda cases: [c for c in cases if keep(c)]).filter(bool)

        worlds = self.worlds(world_sizes)
        if not worlds:
            raise ValueError(f"{self.id}: no world size of {list(world_sizes)} applies")
        if len(worlds) == 1:
            return for_world(worlds[0])
        return st.sampled_from(worlds).flatmap(for_world)

    def counted(self, verdict: Verdict) -> list[Failure]:
        """The verdict's failures this property is about, labelled with its id."""
        return [
            replace(f, property=self.id)
            for f in verdict.failures
            if f.aspect == "call" or f.aspect in self.aspects
        ]

    def run(
        self,
        batch: Sequence[GatherCase],
        *,
        pool_factory: Callable[[int], RankPool] | None = None,
    ) -> list[tuple[Verdict, list[Failure]]]:
        """Run ``batch`` and pair every verdict with the failures that count here (a
        coalesced property runs the batch as one coalesced call)."""
        run = run_coalesced if self.coalesced else run_cases
        if self.compiled:
            warm_backends_for(batch, pool_factory)
        verdicts = run(batch, self.implementation, pool_factory=pool_factory)
        return [(v, self.counted(v)) for v in verdicts]

    def fails(self, batch: Sequence[GatherCase]) -> bool:
        """Whether some case of ``batch`` fails this property."""
        return any(failures for _, failures in self.run(batch))

    def check(self, batch: Sequence[GatherCase]) -> None:
        """Run ``batch``; ``AssertionError`` describing every case that fails here."""
        results = self.run(batch)
        bad = [(v, failures) for v, failures in results if failures]
        if not bad:
            return
        impl = self.implementation
        parts = [f"{self.id}: {len(bad)} of {len(results)} case(s) failed against {impl.label}:"]
        for i, (v, failures) in enumerate(results):
            if not failures:
                continue
            if self.coalesced:
                parts.append(describe_coalesced(batch, i, impl))
            else:
                before = list(batch[:i])  # ran before it on the same world
                parts.append(describe(v.case, impl, before=before))
            parts.extend(f"  - {f.render()}" for f in failures)
        raise AssertionError("\n".join(parts))


def _on_backends(cases: list[GatherCase]) -> SearchStrategy[list[GatherCase]]:
    """``cases``, each on a compile backend drawn for it (shrinking toward ``eager``)."""
    backends = st.lists(st.sampled_from(COMPILE_BACKENDS), min_size=len(cases), max_size=len(cases))
    return backends.map(
        lambda names: [replace(c, compile_backend=b) for c, b in zip(cases, names, strict=True)]
    )


def warm_backends_for(
    batch: Sequence[GatherCase], pool_factory: Callable[[int], RankPool] | None = None
) -> None:
    """Warm, on each world ``batch`` runs on, the compile backends its cases use
    (``compiled.warm_backends``, once per rank process): a backend's one-time setup is
    then not charged to the batch's call timeout."""
    from .pool import get_pool

    factory = pool_factory or get_pool
    worlds: dict[int, set[str]] = {}
    for case in batch:
        if case.compile_backend is not None and case.initialized:
            worlds.setdefault(case.world_size, set()).add(case.compile_backend)
    for world, backends in sorted(worlds.items()):
        factory(world).run(warm_backends, sorted(backends))


def one_call(cases: Sequence[GatherCase]) -> list[GatherCase]:
    """``cases`` as the tensors of one coalesced call: every case takes the first's
    contract and transport (the call takes them once); everything else stays each
    case's own (dtype, shape, sizes, dim, memory layout, sizes form, requires_grad)."""
    if not cases:
        return []
    first = cases[0]
    return [replace(c, contract=first.contract, transport=first.transport) for c in cases]


# --- the catalogue ----------------------------------------------------------------------


def _dtypes(*families: str) -> tuple[str, ...]:
    return tuple(n for n in DTYPE_NAMES if dtype_family(torch_dtype(n)) in families)


_COMMON: Final = ("float32", "float64", "int64")
"""The dtypes of the properties that are not about dtypes (each family has its own)."""

_SEQUENCE_DTYPES: Final = ("float32", "float64", "bfloat16", "int64", "uint8")
"""Dtypes a call sequence switches between: widths of 8, 4, 2 and 1 bytes, so one
shape means different byte counts from call to call."""

_OUTPUT: Final = frozenset({"output"})
_SIZES: Final = frozenset({"output", "sizes"})
_ALL: Final = frozenset({"output", "sizes", "gradient", "adjoint"})
_VALUES: Final = frozenset({"output", "gradient", "adjoint"})

COMPILED_EXAMPLES: Final = 3
"""Examples of the ``compiled`` property per run by default: each costs compiles of a
few seconds per backend and shape (inductor's the most)."""
COMPILED_SLOW_EXAMPLES: Final = 25
COMPILED_BATCH: Final = 3
"""Cases per compiled batch: calls in a row through one compiled step per backend,
sizes and shapes changing between them (dynamo's recompiles, then dynamic sizes)."""

COALESCED_MAX_PAYLOAD: Final = 64 * 1024
"""Bytes per rank's shard a large case of the ``coalesced`` property may reach: enough
for outputs past ``DIGEST_MIN_BYTES`` and the coalesced call's small/large split, small
enough that a batch of tensors costs one quick round trip."""


def _some_empty(case: GatherCase) -> bool:
    empty = sum(1 for n in case.sizes if n == 0)
    return 0 < empty < case.group_size


def _nonzero_dim(case: GatherCase) -> bool:
    return case.dim != 0


def catalogue(
    implementation: Implementation = VARGATHER, *, returns: str = "unknown"
) -> list[Property]:
    """Every property, in a fixed order, for ``implementation``.

    Cases draw the contracts it claims and the transports it takes.
    ``returns`` (``sizes``, ``layout``, ``none`` or ``unknown``) only words the titles
    of the properties about what it returns beside the tensor.
    """
    if returns not in RETURNS:
        raise ValueError(f"returns={returns!r} is not one of {RETURNS}")
    impl = implementation
    c: dict[str, object] = {"contracts": impl.contracts}
    if impl.transports is not None:
        c["transports"] = impl.transports
    if impl.dims is not None:
        c["dims"] = impl.dims
    plain = ("none",) if "none" in sizes_forms_for(impl.sizes_scope) else None
    none = plain or sizes_forms_for(impl.sizes_scope)  # --sizes required: always passed
    fwd = {"sizes_forms": none, "memory": ("contiguous",), "requires_grad": False, **c}
    common = {**fwd, "dtypes": tuple(d for d in _COMMON if d in DTYPE_NAMES)}
    world: dict[str, object] = {
        "sizes_forms": none,
        "dtypes": ("float32", "float64", "complex64"),
        **c,
    }
    if not impl.differentiable:
        world["requires_grad"] = False
    grads = {
        "sizes_forms": none,
        "requires_grad": True,
        "dtypes": _dtypes("float", "half", "complex"),
        **c,
    }
    # Sequences call without sizes where the scope allows (the state under test is the
    # implementation's own); with --sizes required they pass them.
    seq = {"sizes_forms": plain or none, "dtypes": _SEQUENCE_DTYPES, **c}
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
        "dtypes": tuple(d for d in _COMMON if d in DTYPE_NAMES),
        "max_payload": 0,
        **c,
    }
    if not impl.differentiable:
        compiled["requires_grad"] = False
    what = "layout" if returns == "layout" else "sizes"
    claimed = ", ".join(map(repr, impl.contracts))
    same = "forward equals torch.cat(x, dim) bit for bit on every rank, "

    rows = [
        Property(
            impl,
            "forward-float",
            same + "float32/float64",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes("float")},
        ),
        Property(
            impl,
            "forward-half",
            same + "float16/bfloat16",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes("half")},
        ),
        Property(
            impl,
            "forward-complex",
            same + "complex64/complex128",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes("complex")},
        ),
        Property(
            impl,
            "forward-int",
            same + "int8/16/32/64, uint8",
            _OUTPUT,
            {**fwd, "dtypes": _dtypes("int")},
        ),
        Property(impl, "forward-bool", same + "bool", _OUTPUT, {**fwd, "dtypes": _dtypes("bool")}),
        Property(
            impl,
            "dims",
            "forward along dims other than 0, negative ones included",
            _OUTPUT,
            {**common, "min_ndim": 2},
            keep=_nonzero_dim,
        ),
        Property(
            impl,
            "empty-some",
            "forward with some ranks' shards empty",
            _OUTPUT,
            common,
            min_world=2,
            keep=_some_empty,
        ),
        Property(
            impl,
            "empty-all",
            "forward with every rank's shard empty",
            _OUTPUT,
            {**common, "max_size": 0},
        ),
        Property(
            impl,
            "non-contiguous",
            "forward from transposed and strided (sliced) views",
            _OUTPUT,
            {**common, "memory": ("transposed", "sliced")},
        ),
        Property(
            impl,
            "sizes-list",
            f"sizes passed as a list of ints: forward and returned {what}",
            _SIZES,
            {**common, "sizes_forms": ("list",)},
        ),
        Property(
            impl,
            "sizes-tensor",
            f"sizes passed as a 1-d int64 tensor: forward and returned {what}",
            _SIZES,
            {**common, "sizes_forms": ("tensor",)},
        ),
        Property(
            impl,
            "returned-sizes",
            f"the returned {what} equal the true ones",
            frozenset({"sizes"}),
            common,
            needs_returned_sizes=True,
        ),
        Property(
            impl,
            "one-rank",
            "a world of one rank: the identity, gradients flowing",
            _ALL,
            world,
            max_world=1,
        ),
        Property(
            impl,
            "uninitialized",
            "torch.distributed not initialized: the identity, gradients flowing",
            _ALL,
            world,
            initialized=False,
        ),
        Property(
            impl,
            "subgroup",
            "group= a subgroup: gathers its members only, gradients too",
            _ALL,
            world,
            min_world=2,
            subgroups=True,
        ),
        Property(
            impl,
            "gradient",
            f"input gradients under grad={claimed}, upstream gradients differing per rank",
            frozenset({"gradient"}),
            grads,
        ),
        Property(
            impl,
            "adjoint",
            "sum_r <dx_r, x_r> == sum_j <g_j, out_j> exactly (grad='sum', integer values)",
            frozenset({"gradient", "adjoint"}),
            {**grads, "contracts": ("sum",), "values": ("integers",), "upstream": ("integers",)},
            min_world=2,
            needs_sum=True,
        ),
        Property(
            impl,
            "call-sequence",
            "gathers repeated on one world, sizes, dtypes, shapes and payload scale "
            "changing between calls (state carried across calls)",
            _ALL,
            {**seq, "requires_grad": None if impl.differentiable else False},
            min_world=2,
            sequences=True,
        ),
        Property(
            impl,
            "compiled",
            "the call inside a training step compiled with torch.compile(fullgraph=True) "
            "on eager, aot_eager or inductor: output and input gradients equal eager's "
            "bit for bit (integer values), empty shards and size changes between calls; "
            "a rank that issues other collectives than its peers hangs the world",
            _VALUES,
            compiled,
            compiled=True,
            examples=COMPILED_EXAMPLES,
            slow_examples=COMPILED_SLOW_EXAMPLES,
            batch=COMPILED_BATCH,
        ),
        Property(
            impl,
            "coalesced",
            "a batch of tensors gathered by one all_gather_v_coalesced call (each its own "
            "dtype, shape, dim, memory layout and sizes form): every output bit for bit, "
            f"gradients under the call's grad={claimed} after one backward over all outputs",
            _VALUES,
            coalesced,
            coalesced=True,
        ),
    ]
    return [_scoped(row) for row in rows]


def _scoped(row: Property) -> Property:
    """``row`` within its implementation's declared scope: the property left out
    (``out_of_scope``) when the scope excludes what it is about, else its cases
    narrowed where a whole-row argument needs it (non-zero dims)."""
    impl = row.implementation
    if row.compiled and not impl.claims_compile:
        return replace(
            row,
            out_of_scope="not claimed to compile (--compile claims torch.compile support)",
        )
    if row.coalesced and impl.coalesced_form is None:
        return replace(
            row,
            out_of_scope="ATTR has no coalesced form (vargather.all_gather_v_coalesced only)",
        )
    forms = sizes_forms_for(impl.sizes_scope)
    if row.id in ("sizes-list", "sizes-tensor"):
        form = row.id.removeprefix("sizes-")
        if form not in forms:
            why = "never passed" if impl.sizes_scope == "never" else f"passed as {forms}"
            return replace(row, out_of_scope=f"--sizes {impl.sizes_scope}: sizes is {why}")
    if not impl.differentiable and row.id in ("gradient", "adjoint"):
        return replace(row, out_of_scope="--grad none: not differentiable")
    if row.id == "dims" and impl.dims is not None:
        nonzero = tuple(d for d in impl.dims if d != 0)
        if not nonzero:
            return replace(row, out_of_scope=f"--dims {_dims_text(impl.dims)}: dim 0 only")
        deepest = max((d + 1 for d in nonzero if d >= 0), default=1)
        kwargs = {**row.kwargs, "dims": nonzero, "max_ndim": min(8, max(4, deepest))}
        return replace(row, kwargs=kwargs)
    return row


def _dims_text(dims: Sequence[int]) -> str:
    return ",".join(map(str, dims))


def property_ids() -> tuple[str, ...]:
    """The catalogue's ids, in order (what an xfails file or ``--only`` may name)."""
    return tuple(p.id for p in catalogue())

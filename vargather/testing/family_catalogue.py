"""The family's rows, the same for each of its collectives, and ``FamilyCatalogue``, the
``Catalogue`` a collective's module builds from what is its own.

Where it sits: in the testing kit, above ``family`` and ``properties``, beneath the
catalogue modules (``catalogues.<name>``: ``CATALOGUE = FamilyCatalogue(...)``) and the
engine. The property suite, the mutant search and ``python -m vargather check --op ...``
all run these rows, so they cannot drift. What every catalogue's rows share, the
gather's included, is here too: ``row_builder``, ``forward_rows``, ``scoped`` and the
shared constants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from operator import methodcaller
from typing import TYPE_CHECKING, Any, Final

from hypothesis import strategies as st

from .calls import parse_call
from .cases import Implementation, parse_literal
from .compiled import warm_backends
from .family import FamilyCase, SplitCase, judge_case, run_case, run_sequence
from .misuse import MISUSE_KINDS, MisuseCase, judge_misuse, run_misuse
from .pool import RankPool
from .properties import Property
from .rank_runner import Alone
from .resolve import ImplInfo, load_impl
from .runner import Verdict, judged, on_world, reproduction
from .usage_errors import OptionError
from .values import COMPILE_BACKENDS, DTYPE_FAMILIES, DTYPE_NAMES, dtype_family, torch_dtype

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from .catalogues import Catalogue
    from .options import CheckOptions

FAMILY_BATCH: Final = 4
"""Calls per example: one example is one pool round trip, its calls in a row."""
LARGE_ROW: Final = 256
"""Elements of a payload-scale row: 1 KiB of float32."""
LARGE_ROWS: Final = 320
"""Most rows of a payload-scale block: 320 KiB, past the fused round's 128 KiB slot."""
COMPILED_EXAMPLES: Final = 3
"""Examples of the ``compiled`` row per run (every catalogue's): each costs compiles of
a few seconds per backend and shape (inductor's the most)."""

COMMON_DTYPES: Final = ("float32", "float64", "int64")
"""The dtypes of the rows that are not about dtypes (each family has its own)."""
SEQUENCE_DTYPES: Final = ("float32", "float64", "bfloat16", "int64", "uint8")
"""Dtypes a call sequence switches between: widths of 8, 4, 2 and 1 bytes, so one
shape means different byte counts from call to call."""
VALUES: Final = frozenset({"output", "gradient", "adjoint"})
"""The aspects of a row about the values: the output and the input gradients."""
_ALONE: Final = ("float32", "float64", "complex64")
_FORWARD: Final = frozenset({"output"})


def forward_rows(
    row: Callable[[str, str, tuple[str, ...]], Property],
    same: str,
    fewer: Mapping[str, tuple[str, ...]] | None = None,
) -> list[Property]:
    """Every catalogue's forward rows, ``forward-float`` ... ``forward-bool``: one
    ``row(id, same + dtypes, dtypes)`` per dtype family, of every gloo dtype of the
    family (``fewer``: the collective's own, by family)."""
    rows = []
    for family in DTYPE_FAMILIES:
        dtypes = (fewer or {}).get(family) or tuple(
            n for n in DTYPE_NAMES if dtype_family(torch_dtype(n)) == family
        )
        words = "int8/16/32/64, uint8" if family == "int" else "/".join(dtypes)
        rows.append(row(f"forward-{family}", same + words, dtypes))
    return rows


def row_builder(
    target: Implementation, catalogue: Catalogue, **defaults: Any
) -> Callable[..., Property]:
    """How every catalogue writes its rows: ``row(id, title, aspects, dtypes, **kw)``,
    a row of ``target`` whose ``kw`` are its ``Property`` fields (over ``defaults``)
    and the kwargs its catalogue's ``draw`` reads (the rest, ``dtypes`` among them)."""

    def row(
        row_id: str, title: str, aspects: frozenset[str], dtypes: Sequence[str] = (), **kw: Any
    ) -> Property:
        fields = {**defaults, **{k: kw.pop(k) for k in list(kw) if k in _PROPERTY_FIELDS}}
        kwargs = {"dtypes": tuple(dtypes), **kw} if dtypes else kw
        return Property(target, row_id, title, aspects, kwargs, catalogue=catalogue, **fields)

    return row


def scoped(row: Property, why: str | None = None) -> Property:
    """``row`` left out (``out_of_scope``) for its catalogue's own reason ``why``, or
    where the target's scope excludes it alike in every catalogue."""
    target = row.implementation
    if why is None and row.id in ("gradient", "adjoint") and not target.differentiable:
        why = "--grad none: not differentiable"
    if why is None and row.compiled and not target.claims_compile:
        why = "not claimed to compile (--compile claims torch.compile support)"
    return row if why is None else replace(row, out_of_scope=why)


def large_blocks(
    case_type: Callable[..., Any], rooted: bool = False
) -> Callable[[int], SearchStrategy[Any]]:
    """The payload-scale case on a world of a collective of blocks along dim 0 of
    ``LARGE_ROW``-long rows (``case_type(world, sizes, other, dim[, root])``): each
    block up to ``LARGE_ROWS`` rows, its root (``rooted``), grad and seed drawn."""

    @st.composite
    def large(draw: Any, world: int) -> Any:
        sizes = tuple(draw(st.lists(st.integers(0, LARGE_ROWS), min_size=world, max_size=world)))
        root = (draw(st.integers(0, world - 1)),) if rooted else ()
        grad, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
        return case_type(world, sizes, (LARGE_ROW,), 0, *root, requires_grad=grad, seed=seed)

    return large


def _strided(case: Any) -> Any:
    """``case`` with ``x`` a transposed or a sliced view (by its seed)."""
    return replace(case, memory=("transposed", "sliced")[case.seed % 2])


class FamilyCatalogue:
    """The ``Catalogue`` of one collective of the family, from what is its own:
    ``cases`` (its strategy), ``large`` (one payload-scale case on a world),
    ``signature`` (how a fork is called without ``--call``), ``sizes_name`` (the
    argument ``--sizes`` is about; ``sizes_required``: always passed), ``returns``
    (``tensor`` or ``list``), ``contracts`` (the ``--grad`` values it takes) and
    ``declined`` (row id: why that row cannot apply to it, as the report shows)."""

    def __init__(
        self,
        case_type: type[FamilyCase],
        *,
        cases: Callable[..., SearchStrategy[Any]],
        large: Callable[[int], SearchStrategy[Any]],
        signature: str,
        sizes_name: str,
        sizes_required: bool = False,
        returns: str = "tensor",
        contracts: tuple[str, ...] = ("sum",),
        declined: Mapping[str, str] | None = None,
    ) -> None:
        self.case_type = case_type
        self.op = case_type.collective
        self.names = case_type.NAMES
        self.cases = cases
        self.large = large
        self.default_call: str | None = signature
        self.sizes_name = sizes_name
        self.sizes_required = sizes_required
        self.returns = returns
        self.contracts = contracts
        self.declined = dict(declined or {})

    # -- scope

    def passes(self, target: Implementation, name: str) -> bool:
        """Whether ``target``'s call passes ``name`` (vargather's own: every name)."""
        return target.call is None or parse_call(target.call, self.names).uses(name)

    def _fitted(self, target: Implementation, case: Any) -> Any:
        """A drawn case within ``target``'s scope: its implementation and call, the
        names its call does not pass left at their defaults, the dims it supports."""
        case = replace(case, impl=target.ref or "vargather", call=target.call)
        case = replace(case, emulate=target.emulate)
        if target.call is not None:
            case = replace(case, validate=True)  # a template passes no validate=
        if not target.differentiable:
            case = replace(case, requires_grad=False)
        case = case.fitted(target, lambda name: self.passes(target, name))
        if not isinstance(case, SplitCase):
            return case
        if not self.passes(target, "dim"):
            return case.with_dim(0)
        if target.dims is not None and case.dim not in target.dims:
            return case.with_dim(target.dims[case.seed % len(target.dims)])
        return case

    def _scoped(self, row: Property) -> Property:
        """``row`` left out (``scoped``) where the collective declines it or the
        target's scope excludes it."""
        target = row.implementation
        why = self.declined.get(row.id)
        if why is not None:
            pass
        elif row.id == "misuse" and self.op not in MISUSE_KINDS:
            why = "no misuse kinds of it in vargather.testing.misuse (MISUSE_KINDS)"
        elif row.id == "dims":
            if not self.passes(target, "dim"):
                why = f"--call {target.call} passes no dim: dim 0 only"
            elif target.dims is not None and all(d == 0 for d in target.dims):
                why = "--dims 0: dim 0 only"
        elif row.id == "subgroup" and not self.passes(target, "group"):
            why = f"--call {target.call} passes no group: no subgroup"
        elif row.id == "adjoint" and target.differentiable and "sum" not in target.contracts:
            why = "an identity of grad='sum'; the claimed contract is " + ", ".join(
                target.contracts
            )
        elif row.id == "misuse" and target.call is not None:
            why = "--call: the misuse cases call ATTR as vargather's function is (timeout= too)"
        return scoped(row, why)

    # -- the rows

    def rows(self, implementation: Implementation, returns: str = "unknown") -> list[Property]:
        """Every row, in a fixed order, for ``implementation`` (``returns`` is fixed)."""
        del returns
        target = implementation
        row = row_builder(target, self, min_world=2, batch=FAMILY_BATCH)

        same = "forward equals the oracle bit for bit on every rank, "
        grads = ", ".join(target.contracts) if target.differentiable else "none"
        rows = [
            *forward_rows(
                lambda i, title, dtypes: row(i, title, _FORWARD, dtypes, requires_grad=False),
                same,
                {"complex": ("complex64",)},
            ),
            row(
                "dims",
                "forward and gradient along dims other than 0, negative ones included",
                VALUES,
                COMMON_DTYPES,
                shape=methodcaller("nonzero_dim"),
            ),
            row(
                "empty",
                "one rank's part empty (no block, nothing sent, no elements): forward and gradient",
                VALUES,
                COMMON_DTYPES,
                shape=methodcaller("emptied"),
            ),
            row(
                "non-contiguous",
                "x a transposed or strided (sliced) view: forward and gradient",
                VALUES,
                COMMON_DTYPES,
                shape=_strided,
            ),
            row(
                "one-rank",
                "a world of one rank: the identity, gradients flowing",
                VALUES,
                _ALONE,
                min_world=1,
                max_world=1,
            ),
            row(
                "uninitialized",
                "torch.distributed not initialized: the identity, gradients flowing",
                VALUES,
                _ALONE,
                initialized=False,
            ),
            row(
                "subgroup",
                "group= a subgroup of the world: its members only, gradients too",
                VALUES,
                COMMON_DTYPES,
                subgroups=True,
                keep=lambda c: c.group is not None,
                min_world=3,
            ),
            row(
                "gradient",
                f"input gradients (claimed: {grads}), upstream gradients differing per rank",
                frozenset({"gradient"}),
                ("float32", "float64", "float16", "bfloat16", "complex64"),
                requires_grad=True,
            ),
            row(
                "adjoint",
                "sum_r <y_r, g_r> == sum_j <x_j, dx_j> exactly (integer values)",
                frozenset({"gradient", "adjoint"}),
                ("float32", "float64"),
                requires_grad=True,
                special=False,
            ),
            row(
                "payload-scale",
                "blocks of up to 320 KiB per rank (past the one-round payload slot): forward "
                "and gradient",
                VALUES,
                large=True,
                batch=2,
            ),
            row(
                "call-sequence",
                "calls in a row on one world, shapes, dtypes, sizes and validate changing "
                "between calls (state carried across calls)",
                VALUES,
                SEQUENCE_DTYPES,
                sequences=True,
                subgroups=self.passes(target, "group"),
            ),
            row(
                "compiled",
                "the call inside a training step compiled with torch.compile(fullgraph=True) "
                "on eager, aot_eager or inductor (sizes passed as ints): output and input "
                "gradients equal the oracle's bit for bit (integer values)",
                VALUES,
                COMMON_DTYPES,
                special=False,
                compiled=True,
                examples=COMPILED_EXAMPLES,
                batch=3,
            ),
            row(
                "misuse",
                "one rank's arguments wrong: the same error class and message on every rank, "
                "naming that rank, and the next call works",
                frozenset({"misuse"}),
                misuse=True,
                batch=2,
            ),
        ]
        return [self._scoped(r) for r in rows]

    # -- the hooks the engine calls

    def resolve(self, options: CheckOptions, cwd: str) -> ImplInfo:
        """``OptionError`` for an option the collective does not take, a call template
        that does not parse, or an implementation that cannot be imported."""
        op = self.op
        if options.convention not in ("auto", "vargather"):
            raise OptionError(
                "convention",
                f"{options.convention} does not apply to --op {op}: the only convention of "
                "its forks is vargather's signature (or a --call template)",
            )
        if options.transports not in ("auto", "none"):
            raise OptionError(
                "transports", f"does not apply to --op {op}: it takes no transport= argument"
            )
        refused = self._refused(options)
        if refused is not None:
            raise OptionError(*refused)
        if options.impl is None:
            if options.call is not None:
                raise OptionError(
                    "call", "needs --impl (vargather's own API is called as documented)"
                )
            return ImplInfo(None, f"vargather.{op}", "vargather", True)
        ref = options.impl
        if options.call is not None:
            try:
                parse_call(options.call, self.names)
            except ValueError as err:
                raise OptionError("call", f": {err}") from None
        fn = load_impl(ref, cwd)  # CheckUsageError naming the import problem
        if not callable(fn):
            raise OptionError("impl", f"{ref} is not callable")
        module, colon, attr = ref.partition(":")
        impl = f"{module}:{attr}" if colon else f"{module}:{op}"
        return ImplInfo(impl, impl, "vargather", True, call=options.call)

    def _refused(self, options: CheckOptions) -> tuple[str, str] | None:
        """(option, why) for a scope option that cannot apply to the collective."""
        op, name = self.op, self.sizes_name
        if options.grad not in (*self.contracts, "none"):
            # one gradient, the exact adjoint; --grad sum (the default) claims it
            return "grad", (
                f"{options.grad} does not apply to --op {op}: its gradient is the "
                "adjoint (sum, the default) or none"
            )
        if options.sizes == "tensor":
            return "sizes", f"tensor does not apply to --op {op}: its {name} are lists of ints"
        if options.sizes == "never" and self.sizes_required:
            return "sizes", (
                f"never does not apply to --op {op}: its {name} are its required "
                "argument (always passed)"
            )
        if options.sizes in ("required", "list") and options.call is not None:
            try:
                uses = parse_call(options.call, self.names).uses(name)
            except ValueError:
                uses = True  # the --call check names the template's own problem
            if not uses:
                return "sizes", f"required, but --call {options.call} passes no {name}"
        if options.returns not in ("auto", self.returns):
            what = "a list of tensors" if self.returns == "list" else "one tensor"
            return "returns", (
                f"{options.returns} does not apply to --op {op}: it returns {what}, nothing "
                "beside it"
            )
        if options.equal_shapes:
            return "equal-shapes", (
                f"does not apply to --op {op}: only all_gather_v's cases are drawn with "
                "equal shapes (the list form of torch.distributed.all_gather)"
            )
        return None

    def implementation(self, info: ImplInfo, options: CheckOptions, cwd: str) -> Implementation:
        grads = ("sum",) if options.grad == "none" else (options.grad,)
        return Implementation(
            info.ref,
            contracts=grads,
            differentiable=options.grad != "none",
            dims=options.dims,
            sizes_scope=options.sizes,
            returns=options.returns,
            emulate=options.emulate,
            call=info.call,
            name=info.display,
            search_path=(cwd,),
            op=self.op,
            compiles=True if options.compile else None,
        )

    def draw(
        self,
        prop: Property,
        world: int,
        batch: int,
        transports: Sequence[str] | None,
        max_payload: int,
    ) -> SearchStrategy[list[Any]]:
        del transports, max_payload  # the family's transports and scale are its rows'
        target = prop.implementation
        kw = prop.kwargs
        if prop.misuse:
            # not the absent rank, which costs a timeout per case
            kinds = [k for k in MISUSE_KINDS[self.op] if k != "absent"]
            misuse = st.builds(
                MisuseCase,
                st.just(self.op),
                st.sampled_from(kinds),
                st.just(world),
                st.integers(0, world - 1),
                st.just(target.ref or "vargather"),
                st.just(target.emulate),
            )
            return st.lists(misuse, min_size=1, max_size=batch)
        shape = kw.get("shape")
        fields = {k: kw[k] for k in ("requires_grad", "special") if k in kw}
        if not prop.initialized:
            fields["initialized"] = False

        def fitted(case: Any) -> Any:
            case = replace(case, **fields)
            if callable(shape):
                case = shape(case)
            case = self._fitted(target, case)
            return case.compilable() if prop.compiled else case

        if kw.get("large"):
            return st.lists(self.large(world).map(fitted), min_size=1, max_size=batch)
        dtypes = kw["dtypes"]
        assert isinstance(dtypes, tuple)  # what rows and split_rows put there
        drawn = self.cases(world_sizes=(world,), dtypes=dtypes, subgroups=prop.subgroups)
        if prop.sequences:
            return st.lists(drawn.map(fitted), min_size=2, max_size=6)
        one = drawn.map(fitted)
        if prop.compiled:  # each call on a backend of its own
            backends = st.sampled_from(COMPILE_BACKENDS)
            one = st.tuples(one, backends).map(lambda cb: replace(cb[0], compile_backend=cb[1]))
        if prop.keep is not None:
            one = one.filter(prop.keep)
        return st.lists(one, min_size=1, max_size=batch)

    def run(
        self, prop: Property, batch: Sequence[Any], pool_factory: Callable[[int], RankPool]
    ) -> list[Verdict]:
        """Each call judged; a world that failed under the batch fails its first call
        (``call``: an error, a crash or a hang), the rest not run."""
        if not batch:
            return []
        impl = prop.implementation
        if not prop.initialized:  # in this process, torch.distributed not initialized
            return [Verdict(c, impl, tuple(judge_case(c, [run_case(Alone(), c)]))) for c in batch]

        def run() -> list[Any]:
            pool = pool_factory(batch[0].world_size)
            if prop.misuse:
                return [pool.run(run_misuse, case) for case in batch]
            if prop.compiled:
                pool.run(warm_backends, sorted({c.compile_backend for c in batch}))
            per_rank = pool.run(run_sequence, tuple(batch))
            return [[reports[i] for reports in per_rank] for i in range(len(batch))]

        return judged(batch, impl, self.op, run, judge_misuse if prop.misuse else judge_case)

    def describe(self, prop: Property, batch: Sequence[Any], index: int) -> str:
        """The failing call and the calls before it on its world, in words, and the
        ``python -m vargather repro --op`` command that re-runs exactly them."""
        cases = list(batch[: index + 1])
        where = on_world(getattr(cases[0], "initialized", True), cases[0].world_size)
        head = f"{len(cases)} call(s) {where}, in order:"
        return reproduction(head, map(repr, cases), ["--op", self.op, *map(repr, cases)])

    def case_data(self, case: Any) -> dict[str, Any]:
        return {**dataclasses.asdict(case), "collective": case.collective, "repr": repr(case)}

    def probe_returns(
        self,
        implementation: Implementation,
        world_sizes: Sequence[int],
        factory: Callable[[int], RankPool],
    ) -> str:
        del implementation, world_sizes, factory
        return "none"  # a tensor, or a list of them: no sizes beside it

    # -- python -m vargather repro --op

    def parse(self, text: str) -> Any:
        """The case ``repr`` wrote: its own case class, or a ``MisuseCase``."""
        return parse_literal(text, [self.case_type, MisuseCase])

    def rerun(self, cases: Sequence[Any], pool_factory: Callable[[int], RankPool]) -> list[Verdict]:
        """``cases`` (as ``parse`` read them) run as the row that printed them did: in
        a row on one world, or in this process when uninitialized."""
        misuse = isinstance(cases[0], MisuseCase)
        prop = Property(
            Implementation(op=self.op, name=self.op),
            "repro",
            "repro",
            VALUES,
            catalogue=self,
            misuse=misuse,
            initialized=misuse or cases[0].initialized,
            compiled=not misuse and cases[0].compile_backend is not None,
        )
        return self.run(prop, cases, pool_factory)


_PROPERTY_FIELDS: Final = frozenset(
    {f.name for f in dataclasses.fields(Property)} - {"implementation", "id", "title", "kwargs"}
)
"""The ``row(...)`` keywords that are ``Property`` fields (the rest are its kwargs)."""

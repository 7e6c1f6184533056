"""The family's catalogue: the claims ``reduce_scatter_v``, ``all_to_all_v`` and
``all_gather_list`` must hold, one ``Catalogue`` per collective.

Where it sits: in the testing kit, above ``family`` (the family's case models,
strategies, rank runners and judge) and ``properties`` (the one ``Property``), beneath
``catalogues.reduce_scatter_v``, ``catalogues.all_to_all_v`` and
``catalogues.all_gather_list`` (each one line: ``FamilyCatalogue(name)``) and the
engine, which runs these rows as it runs any collective's. The property suite
(``tests/test_family_properties.py``), the mutant search over ``tests/mutants`` and
``python -m vargather check --op ...`` all run these rows, so they cannot drift.

Each row is a class of cases (``Property.kwargs`` for the collective's strategy:
``dtypes``, ``requires_grad``, ``special``, ``shape`` a function fitting a drawn case,
``large``) and the judge's aspects it counts (``call``, an exception on some rank,
counts everywhere):

* ``forward-float`` ... ``forward-bool``: the forward bit for bit against
  ``vargather.oracle`` per dtype family (NaN payloads, -0.0 and infinities among the
  float values), no backward;
* ``dims``: blocks along dims other than 0, negative ones included (all_to_all_v:
  joined along ``cat_dim``, drawn in every row but ``payload-scale``, now and then
  another dim than ``dim``);
* ``empty``: empty blocks (a rank with no block, a rank that sends nothing, a rank
  whose tensor has no elements);
* ``subgroup``: ``group=`` a subgroup of the world (its members only);
* ``gradient``: input gradients with integer upstream gradients that differ per rank,
  bit for bit against the oracle's (``sum_j`` of gathered blocks for reduce_scatter_v,
  the reverse exchange for all_to_all_v, the claimed contract for all_gather_list);
* ``adjoint``: integer values, ``sum_r <y_r, g_r> == sum_j <x_j, dx_j>`` exactly;
* ``payload-scale``: blocks up to hundreds of KiB per rank (past the fused round's
  payload slot, so the second-round transports run);
* ``call-sequence``: calls of the collective in a row on one world, shapes, dtypes,
  sizes and ``validate`` changing between calls (state carried from call to call);
* ``misuse``: one rank's arguments wrong (``misuse.MISUSE_KINDS`` but the absent rank,
  which costs a timeout per case): every rank raises the same error class and message
  naming that rank, and the next call works.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from hypothesis import strategies as st

from .calls import parse_call
from .cases import Implementation
from .family import (
    FAMILY_NAMES,
    AllToAllCase,
    Case,
    GatherListCase,
    ReduceScatterCase,
    all_to_all_cases,
    gather_list_cases,
    joined_along,
    judge_case,
    reduce_scatter_cases,
    run_sequence,
)
from .judge import Failure
from .misuse import MISUSE_KINDS, MisuseCase, judge_misuse, run_misuse
from .options import CheckOptions, OptionError
from .pool import PoolFailure, RankCrashed, RankError, RankPool
from .properties import Property
from .resolve import ImplInfo, load_impl
from .runner import Verdict

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["FAMILY_BATCH", "SIGNATURES", "FamilyCatalogue", "passes", "reproduction"]

FAMILY_BATCH: Final = 4
"""Calls per example: one example is one pool round trip, its calls in a row."""

SIGNATURES: Final = {
    "reduce_scatter_v": "(x, sizes, dim, *, group, validate, timeout)",
    "all_to_all_v": "(x, send_sizes, dim, *, recv_sizes, group, validate, timeout, cat_dim)",
    "all_gather_list": "(x, *, shapes, group, grad, validate, timeout)",
}
"""How a fork is called when no ``--call`` is given: as vargather's function is
(``cat_dim=`` only in the cases that draw one)."""

CONTRACTS: Final = ("sum", "local", "mean")
_FLOAT: Final = ("float32", "float64")
_HALF: Final = ("float16", "bfloat16")
_INT: Final = ("int64", "int32", "int16", "int8", "uint8")
_COMMON: Final = ("float32", "float64", "int64")
_GRAD: Final = ("float32", "float64", "float16", "bfloat16", "complex64")
_SEQUENCE: Final = ("float32", "float64", "bfloat16", "int64", "uint8")
_LARGE_ROW: Final = 256
"""Elements of a payload-scale row: 1 KiB of float32."""
_LARGE_ROWS: Final = 320
"""Most rows of a payload-scale block: 320 KiB, past the fused round's 128 KiB slot."""

_STRATEGIES: Final[dict[str, Callable[..., Any]]] = {
    "reduce_scatter_v": reduce_scatter_cases,
    "all_to_all_v": all_to_all_cases,
    "all_gather_list": gather_list_cases,
}


def passes(target: Implementation, name: str) -> bool:
    """Whether ``target``'s call passes ``name`` (vargather's own call passes every
    name)."""
    return target.call is None or parse_call(target.call, FAMILY_NAMES[target.op]).uses(name)


# --- fitting drawn cases to a target's scope -----------------------------------------


def _with_dim(case: Any, dim: int) -> Any:
    """``case`` along ``dim``, with trailing dims added where it has too few."""
    ndim_needed = dim + 1 if dim >= 0 else -dim
    other = tuple(case.other)
    while len(other) + 1 < ndim_needed:
        other = (*other, 2)
    if isinstance(case, AllToAllCase):  # joined along dim: another dim's cat is void
        case = replace(case, cat_dim=None, cat=None)
    return replace(case, other=other, dim=dim)


def _fitted(target: Implementation, case: Any) -> Any:
    """A drawn case within ``target``'s scope: its implementation and call, the names
    its call does not pass left at their defaults, the dims it supports."""
    case = replace(case, impl=target.ref or "vargather", call=target.call, emulate=target.emulate)
    if target.call is not None:
        case = replace(case, validate=True)  # a template passes no validate=
    if not target.differentiable:
        case = replace(case, requires_grad=False)
    if isinstance(case, GatherListCase):
        grad = case.grad if case.grad in target.contracts else target.contracts[0]
        case = replace(case, grad=grad)
        if not passes(target, "shapes") or target.sizes_scope == "never":
            case = replace(case, pass_shapes=False, validate=True)
        elif target.sizes_scope in ("required", "list"):  # every rank's shape always passed
            case = replace(case, pass_shapes=True)
        return case
    if isinstance(case, AllToAllCase):
        if not passes(target, "cat_dim"):
            case = replace(case, cat_dim=None, cat=None)
        if not passes(target, "recv_sizes") or target.sizes_scope == "never":
            case = replace(case, pass_recv=False)
        elif target.sizes_scope in ("required", "list"):  # the receive sizes always passed
            case = replace(case, pass_recv=True)
    if not passes(target, "dim"):
        return _with_dim(case, 0)
    if target.dims is not None and case.dim not in target.dims:
        return _with_dim(case, target.dims[case.seed % len(target.dims)])
    return case


def _nonzero_dim(case: Any) -> Any:
    """``case`` along a dim other than 0 (the last or the second, by its seed)."""
    if case.dim not in (0, -(len(case.other) + 1)):
        return case
    return _with_dim(case, -1 if case.seed % 2 else 1)


def _emptied(case: Any) -> Any:
    """``case`` with one rank's part empty (chosen by its seed): no block for it
    (reduce_scatter_v), nothing sent by it (all_to_all_v), no elements in its tensor
    (all_gather_list)."""
    if isinstance(case, ReduceScatterCase):
        sizes = list(case.sizes)
        sizes[case.seed % len(sizes)] = 0
        return replace(case, sizes=tuple(sizes))
    if isinstance(case, AllToAllCase) and joined_along(case) is not None:
        assert case.cat is not None  # joined_along checked it
        cat = list(case.cat)  # nothing along cat_dim: every block it sends is empty
        cat[case.seed % len(cat)] = 0
        return replace(case, cat=tuple(cat))
    if isinstance(case, AllToAllCase):
        send = list(case.send)
        send[case.seed % len(send)] = tuple(0 for _ in send)
        return replace(case, send=tuple(send))
    shapes = list(case.shapes)
    k = case.seed % len(shapes)
    shapes[k] = (0, *shapes[k][1:])
    return replace(case, shapes=tuple(shapes))


@st.composite
def _large_case(draw: Any, op: str, world: int) -> Case:
    """One payload-scale call: float32 rows of 1 KiB, blocks up to ``_LARGE_ROWS`` rows."""
    w = world
    block = st.integers(0, _LARGE_ROWS)
    grad = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    if op == "reduce_scatter_v":
        sizes = tuple(draw(st.lists(block, min_size=w, max_size=w)))
        return ReduceScatterCase(w, sizes, (_LARGE_ROW,), 0, requires_grad=grad, seed=seed)
    if op == "all_to_all_v":
        row = st.lists(st.integers(0, _LARGE_ROWS // w), min_size=w, max_size=w).map(tuple)
        send = tuple(draw(st.lists(row, min_size=w, max_size=w)))
        return AllToAllCase(w, send, (_LARGE_ROW,), 0, requires_grad=grad, seed=seed)
    shapes = tuple((n, _LARGE_ROW) for n in draw(st.lists(block, min_size=w, max_size=w)))
    return GatherListCase(w, shapes, requires_grad=grad, seed=seed)


# --- the catalogue -------------------------------------------------------------------


_FORWARD: Final = frozenset({"output"})
_VALUES: Final = frozenset({"output", "gradient", "adjoint"})


def _rows(target: Implementation) -> list[Property]:
    """Every row of ``target.op``'s catalogue, in a fixed order, for ``target``."""

    def row(
        row_id: str,
        title: str,
        aspects: frozenset[str],
        dtypes: Sequence[str] = (),
        **kwargs: object,
    ) -> Property:
        return Property(
            target,
            row_id,
            title,
            aspects,
            {"dtypes": tuple(dtypes), **kwargs},
            min_world=2,
            batch=FAMILY_BATCH,
        )

    same = "forward equals the oracle bit for bit on every rank, "
    grads = ", ".join(target.contracts) if target.differentiable else "none"
    rows = [
        row("forward-float", same + "float32/float64", _FORWARD, _FLOAT, requires_grad=False),
        row("forward-half", same + "float16/bfloat16", _FORWARD, _HALF, requires_grad=False),
        row("forward-complex", same + "complex64", _FORWARD, ("complex64",), requires_grad=False),
        row("forward-int", same + "int8/16/32/64, uint8", _FORWARD, _INT, requires_grad=False),
        row("forward-bool", same + "bool", _FORWARD, ("bool",), requires_grad=False),
        row(
            "dims",
            "forward and gradient along dims other than 0, negative ones included",
            _VALUES,
            _COMMON,
            shape=_nonzero_dim,
        ),
        row(
            "empty",
            "one rank's part empty (no block, nothing sent, no elements): forward and gradient",
            _VALUES,
            _COMMON,
            shape=_emptied,
        ),
        replace(
            row(
                "subgroup",
                "group= a subgroup of the world: its members only, gradients too",
                _VALUES,
                _COMMON,
            ),
            subgroups=True,
            keep=lambda c: c.group is not None,
            min_world=3,
        ),
        row(
            "gradient",
            f"input gradients (claimed: {grads}), upstream gradients differing per rank",
            frozenset({"gradient"}),
            _GRAD,
            requires_grad=True,
        ),
        row(
            "adjoint",
            "sum_r <y_r, g_r> == sum_j <x_j, dx_j> exactly (integer values)",
            frozenset({"gradient", "adjoint"}),
            _FLOAT,
            requires_grad=True,
            special=False,
        ),
        replace(
            row(
                "payload-scale",
                "blocks of up to 320 KiB per rank (past the one-round payload slot): forward "
                "and gradient",
                _VALUES,
                large=True,
            ),
            batch=2,
        ),
        replace(
            row(
                "call-sequence",
                "calls in a row on one world, shapes, dtypes, sizes and validate changing "
                "between calls (state carried across calls)",
                _VALUES,
                _SEQUENCE,
            ),
            sequences=True,
            subgroups=passes(target, "group"),
        ),
        replace(
            row(
                "misuse",
                "one rank's arguments wrong: the same error class and message on every rank, "
                "naming that rank, and the next call works",
                frozenset({"misuse"}),
            ),
            misuse=True,
            batch=2,
        ),
    ]
    return [_scoped(r) for r in rows]


def _scoped(row: Property) -> Property:
    """``row`` left out (``out_of_scope``) where the target's scope excludes it."""
    target = row.implementation
    why: str | None = None
    if row.id == "dims":
        if target.op == "all_gather_list":
            why = "all_gather_list takes no dim (every dim may differ)"
        elif not passes(target, "dim"):
            why = f"--call {target.call} passes no dim: dim 0 only"
        elif target.dims is not None and all(d == 0 for d in target.dims):
            why = "--dims 0: dim 0 only"
    elif row.id == "subgroup" and not passes(target, "group"):
        why = f"--call {target.call} passes no group: no subgroup"
    elif row.id in ("gradient", "adjoint") and not target.differentiable:
        why = "--grad none: not differentiable"
    elif row.id == "adjoint" and target.op == "all_gather_list" and "sum" not in target.contracts:
        why = "an identity of grad='sum'; the claimed contract is " + ", ".join(target.contracts)
    elif row.id == "misuse" and target.call is not None:
        why = "--call: the misuse cases call ATTR as vargather's function is (timeout= too)"
    return row if why is None else replace(row, out_of_scope=why)


# --- the catalogue's hooks -------------------------------------------------------------


class FamilyCatalogue:
    """The ``Catalogue`` of one collective of the family."""

    def __init__(self, op: str) -> None:
        if op not in _STRATEGIES:
            raise ValueError(f"op={op!r} is not one of {', '.join(_STRATEGIES)}")
        self.op = op
        self.default_call: str | None = SIGNATURES[op]

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
                "transports",
                f"does not apply to --op {op}: it takes no transport= argument",
            )
        refused = _refused(op, options)
        if refused is not None:
            raise OptionError(*refused)
        if op != "all_gather_list" and options.grad not in ("sum", "none"):
            # one gradient, the exact adjoint; --grad sum (the default) claims it
            raise OptionError(
                "grad",
                f"{options.grad} does not apply to --op {op}: its gradient is the "
                "adjoint (sum, the default) or none",
            )
        if options.impl is None:
            if options.call is not None:
                raise OptionError(
                    "call", "needs --impl (vargather's own API is called as documented)"
                )
            return ImplInfo(None, f"vargather.{op}", "vargather", True)
        ref = options.impl
        if options.call is not None:
            try:
                parse_call(options.call, FAMILY_NAMES[op])
            except ValueError as err:
                raise OptionError("call", f": {err}") from None
        fn = load_impl(ref, cwd)  # CheckUsageError naming the import problem
        if not callable(fn):
            raise OptionError("impl", f"{ref} is not callable")
        module, colon, attr = ref.partition(":")
        impl = f"{module}:{attr}" if colon else f"{module}:{op}"
        return ImplInfo(impl, impl, "vargather", True, call=options.call)

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
        )

    def rows(self, implementation: Implementation, returns: str = "unknown") -> list[Property]:
        del returns  # what the family returns is fixed: no row asks
        return _rows(implementation)

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
        if kw.get("large"):
            large = _large_case(self.op, world).map(lambda c: _fitted(target, c))
            return st.lists(large, min_size=1, max_size=batch)
        dtypes = kw["dtypes"]
        assert isinstance(dtypes, tuple)  # what _rows and split_rows put there
        drawn: SearchStrategy[Any] = _STRATEGIES[self.op](
            world_sizes=(world,), dtypes=dtypes, subgroups=prop.subgroups
        )
        if prop.sequences:
            return st.lists(drawn.map(lambda c: _fitted(target, c)), min_size=2, max_size=6)
        shape = kw.get("shape")
        fields = {k: kw[k] for k in ("requires_grad", "special") if k in kw}

        def fit(case: Any) -> Any:
            case = replace(case, **fields)
            if callable(shape):
                case = shape(case)
            return _fitted(target, case)

        fitted = drawn.map(fit)
        keep = prop.keep
        if keep is not None:
            fitted = fitted.filter(keep)
        return st.lists(fitted, min_size=1, max_size=batch)

    def run(
        self, prop: Property, batch: Sequence[Any], pool_factory: Callable[[int], RankPool]
    ) -> list[Verdict]:
        """Each call judged; a world that failed under the batch fails its first call
        (``call``: an error, a crash or a hang), the rest not run."""
        if not batch:
            return []
        impl = prop.implementation
        pool = pool_factory(batch[0].world_size)
        results: list[Any]
        try:
            if prop.misuse:
                results = [pool.run(run_misuse, case) for case in batch]
            else:
                per_rank = pool.run(run_sequence, tuple(batch))
                results = [[reports[i] for reports in per_rank] for i in range(len(batch))]
        except (PoolFailure, RankError) as err:
            if isinstance(err, RankError):
                kind = "error"
            else:
                kind = "crash" if isinstance(err, RankCrashed) else "hang"
            failure = Failure(
                "call",
                kind,
                f"{type(err).__name__}: {err}",
                group_size=batch[0].world_size,
                call=self.op,
            )
            first = Verdict(batch[0], impl, (failure,))
            rest = [Verdict(c, impl, not_run="the world failed earlier") for c in batch[1:]]
            return [first, *rest]
        judge: Callable[[Any, Any], list[Failure]] = judge_misuse if prop.misuse else judge_case
        return [
            Verdict(case, impl, tuple(judge(case, reports)))
            for case, reports in zip(batch, results, strict=True)
        ]

    def describe(self, prop: Property, batch: Sequence[Any], index: int) -> str:
        return reproduction(batch[: index + 1], misuse=prop.misuse)

    def case_data(self, case: Any) -> dict[str, Any]:
        data = dataclasses.asdict(case)
        data["collective"] = case.collective
        data["repr"] = repr(case)
        return data

    def probe_returns(
        self,
        implementation: Implementation,
        world_sizes: Sequence[int],
        factory: Callable[[int], RankPool],
    ) -> str:
        del implementation, world_sizes, factory
        return "none"  # a tensor, or a list of them: no sizes beside it


_SIZES_NAME: Final = {
    "reduce_scatter_v": "sizes",
    "all_to_all_v": "recv_sizes",
    "all_gather_list": "shapes",
}
"""The argument ``--sizes`` is about: what the caller may know and pass beside ``x``
(``required``: always passed; ``never``: left to the exchange)."""

_RETURNS: Final = {
    "reduce_scatter_v": ("auto", "tensor"),
    "all_to_all_v": ("auto", "tensor"),
    "all_gather_list": ("auto", "list"),
}


def _refused(op: str, options: CheckOptions) -> tuple[str, str] | None:
    """(option, why) for a scope option that cannot apply to ``op``, or ``None``."""
    name = _SIZES_NAME[op]
    if options.sizes == "tensor":
        return "sizes", f"tensor does not apply to --op {op}: its {name} are lists of ints"
    if options.sizes == "never" and op == "reduce_scatter_v":
        return "sizes", (
            "never does not apply to --op reduce_scatter_v: its sizes are its required "
            "argument (always passed)"
        )
    if options.sizes in ("required", "list") and options.call is not None:
        try:
            uses = parse_call(options.call, FAMILY_NAMES[op]).uses(name)
        except ValueError:
            uses = True  # the --call check names the template's own problem
        if not uses:
            return "sizes", f"required, but --call {options.call} passes no {name}"
    if options.returns not in _RETURNS[op]:
        what = "a list of tensors" if op == "all_gather_list" else "one tensor"
        return "returns", (
            f"{options.returns} does not apply to --op {op}: it returns {what}, nothing beside it"
        )
    if options.equal_shapes:
        return "equal-shapes", (
            f"does not apply to --op {op}: only all_gather_v's cases are drawn with equal "
            "shapes (the list form of torch.distributed.all_gather)"
        )
    if options.compile:
        return "compile", (
            f"does not apply to --op {op} yet: its catalogue has no compiled row (only "
            "all_gather_v's cases run inside torch.compile)"
        )
    return None


def reproduction(cases: Sequence[Any], misuse: bool = False) -> str:
    """The failing calls in words, and a shell command that re-runs exactly them."""
    names = sorted({type(c).__name__ for c in cases})
    listed = ", ".join(repr(c) for c in cases)
    if misuse:
        body = f"[check_misuse(get_pool(c.world_size), c) for c in [{listed}]]"
    else:
        body = f"check_sequence(get_pool({cases[0].world_size}), [{listed}])"
    module = "misuse" if misuse else "family"
    code = (
        "from vargather.testing import get_pool; "
        f"from vargather.testing.{module} import {', '.join(names)}, "
        f"{'check_misuse' if misuse else 'check_sequence'}; print({body})"
    )
    where = f"on a gloo world of {cases[0].world_size} rank(s)"
    lines = [f"{len(cases)} call(s) {where}, in order:"]
    lines += [f"  {c!r}" for c in cases]
    lines.append(f"reproduce: python -c {shlex.quote(code)}")
    return "\n".join(lines)

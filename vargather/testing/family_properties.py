"""The family's property catalogue: the claims ``reduce_scatter_v``, ``all_to_all_v``
and ``all_gather_list`` must hold, for the suite and for ``check --op``.

Where it sits: in the testing kit, above ``family`` (the family's case models,
strategies, rank runners and judge) and beneath ``family_check`` (the gate's run of
these rows). ``family_catalogue(target)`` lists the rows of one collective for one
implementation (``FamilyTarget``: vargather's own, or a fork's ``MODULE:ATTR`` called
as vargather's function is, or through a call template). The property suite
(``tests/test_family_properties.py``), the mutant search over ``tests/mutants`` and
``python -m vargather check --op ...`` all run these rows, so they cannot drift.

Each row is a class of cases (a Hypothesis strategy of batches, every batch on one
world, its calls run one after the other by one pool round trip) and the judge's
aspects it counts (``raised``, an exception on some rank, counts everywhere):

* ``forward-float`` ... ``forward-bool``: the forward bit for bit against
  ``vargather.oracle`` per dtype family (NaN payloads, -0.0 and infinities among the
  float values), no backward;
* ``dims``: blocks along dims other than 0, negative ones included;
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
* ``misuse``: one rank's arguments wrong (``family.MISUSE_KINDS`` but the absent rank,
  which costs a timeout per case): every rank raises the same error class and message
  naming that rank, and the next call works.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from hypothesis import strategies as st

from .calls import parse_call
from .family import (
    COLLECTIVES,
    FAMILY_NAMES,
    MISUSE_KINDS,
    AllToAllCase,
    Case,
    FamilyFailure,
    GatherListCase,
    MisuseCase,
    ReduceScatterCase,
    all_to_all_cases,
    gather_list_cases,
    judge_case,
    judge_misuse,
    reduce_scatter_cases,
    run_misuse,
    run_sequence,
)
from .pool import RankPool

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "FAMILY_BATCH",
    "FamilyProperty",
    "FamilyTarget",
    "family_catalogue",
    "family_property_ids",
    "reproduction",
]

FAMILY_BATCH: Final = 4
"""Calls per example: one example is one pool round trip, its calls in a row."""

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


@dataclass(frozen=True)
class FamilyTarget:
    """The implementation a family catalogue is for.

    ``op``: the collective; ``impl``: ``MODULE`` (its attribute named ``op``) or
    ``MODULE:ATTR``, ``"vargather"`` for vargather's own; ``call``: a call template
    over ``family.FAMILY_NAMES[op]`` (``None``: called as vargather's function is,
    ``validate=`` and ``timeout=`` included); ``grads``: the contracts claimed
    (all_gather_list) or ``()`` for not differentiable; ``dims``: the dims it supports
    (``None``: every one); ``sizes``: ``--sizes`` (for all_to_all_v ``required``: both
    split lists always passed, ``never``: the receive sizes never passed); ``emulate``:
    the backend emulated in the ranks (``vargather.testing.emulate``), or ``None``.
    """

    op: str
    impl: str = "vargather"
    call: str | None = None
    grads: tuple[str, ...] = CONTRACTS
    dims: tuple[int, ...] | None = None
    sizes: str = "any"
    emulate: str | None = None
    refused: tuple[str, ...] = ()
    """Dtypes the backend (or the emulated one) refuses: each forward row runs without
    them, and each such dtype runs as a row of its own, ``PROPERTY:DTYPE``."""

    def __post_init__(self) -> None:
        if self.op not in COLLECTIVES:
            raise ValueError(f"op={self.op!r} is not one of {', '.join(COLLECTIVES)}")
        if self.call is not None:
            parse_call(self.call, FAMILY_NAMES[self.op])  # ValueError naming the problem

    def passes(self, name: str) -> bool:
        """Whether the call passes ``name`` (vargather's own call passes every name)."""
        return self.call is None or parse_call(self.call, FAMILY_NAMES[self.op]).uses(name)

    @property
    def differentiable(self) -> bool:
        return bool(self.grads)

    @property
    def label(self) -> str:
        return "vargather" if self.impl == "vargather" else self.impl


@dataclass(frozen=True)
class FamilyProperty:
    """One row: ``cases(world)`` draws one example's calls on a world of that size;
    ``aspects`` are the judge's aspects it counts (``raised`` always counts);
    ``out_of_scope`` why the target's scope excludes the row (``None``: it applies)."""

    target: FamilyTarget
    id: str
    title: str
    aspects: frozenset[str]
    cases: Callable[[int], SearchStrategy[list[Any]]]
    min_world: int = 2
    out_of_scope: str | None = None
    misuse: bool = False

    def worlds(self, world_sizes: Sequence[int]) -> list[int]:
        return sorted(w for w in set(world_sizes) if w >= self.min_world)

    def not_applicable(self, world_sizes: Sequence[int]) -> str | None:
        if self.out_of_scope is not None:
            return self.out_of_scope
        if not self.worlds(world_sizes):
            return f"needs a world size >= {self.min_world} in --world-sizes"
        return None

    def strategy(self, world_sizes: Sequence[int]) -> SearchStrategy[list[Any]]:
        """Batches, each on one world size drawn from those the row applies to."""
        worlds = self.worlds(world_sizes)
        if not worlds:
            raise ValueError(f"{self.id}: no world size of {list(world_sizes)} applies")
        if len(worlds) == 1:
            return self.cases(worlds[0])
        return st.sampled_from(worlds).flatmap(self.cases)

    def run(self, batch: Sequence[Any], pool_factory: Callable[[int], RankPool]) -> list[Any]:
        """The batch's calls on its world: each call's reports (``run_sequence``), or
        each misuse case's (``run_misuse``, one round trip each)."""
        if not batch:
            return []
        pool = pool_factory(batch[0].world_size)
        if self.misuse:
            return [pool.run(run_misuse, case) for case in batch]
        per_rank = pool.run(run_sequence, tuple(batch))
        return [[reports[i] for reports in per_rank] for i in range(len(batch))]

    def judge(self, case: Any, reports: Any) -> list[FamilyFailure]:
        """The failures of one call that count here."""
        if self.misuse:
            return judge_misuse(case, reports)
        return [
            f for f in judge_case(case, reports) if f.aspect == "raised" or f.aspect in self.aspects
        ]


# --- fitting drawn cases to a target's scope -----------------------------------------


def _with_dim(case: Any, dim: int) -> Any:
    """``case`` along ``dim``, with trailing dims added where it has too few."""
    ndim_needed = dim + 1 if dim >= 0 else -dim
    other = tuple(case.other)
    while len(other) + 1 < ndim_needed:
        other = (*other, 2)
    return replace(case, other=other, dim=dim)


def _fitted(target: FamilyTarget, case: Any) -> Any:
    """A drawn case within ``target``'s scope: its implementation and call, the names
    its call does not pass left at their defaults, the dims it supports."""
    case = replace(case, impl=target.impl, call=target.call, emulate=target.emulate)
    if target.call is not None:
        case = replace(case, validate=True)  # a template passes no validate=
    if not target.differentiable:
        case = replace(case, requires_grad=False)
    if isinstance(case, GatherListCase):
        grad = case.grad if case.grad in target.grads else (target.grads or ("sum",))[0]
        case = replace(case, grad=grad)
        if not target.passes("shapes"):
            case = replace(case, pass_shapes=False, validate=True)
        return case
    if isinstance(case, AllToAllCase) and not target.passes("recv_sizes"):
        case = replace(case, pass_recv=False)
    elif isinstance(case, AllToAllCase) and target.sizes in ("required", "never"):
        case = replace(case, pass_recv=target.sizes == "required")
    if not target.passes("dim"):
        return replace(case, dim=0)
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


_FORWARD: Final = frozenset({"forward"})
_VALUES: Final = frozenset({"forward", "gradient", "adjoint"})


def family_catalogue(target: FamilyTarget) -> list[FamilyProperty]:
    """Every row of ``target.op``'s catalogue, in a fixed order, for ``target``."""
    op = target.op
    draw_cases = _STRATEGIES[op]
    groups = target.passes("group")

    def rows_of(
        dtypes: Sequence[str],
        *,
        subgroups: bool = False,
        grad: bool | None = None,
        special: bool | None = None,
        shape: Callable[[Any], Any] | None = None,
        keep: Callable[[Any], bool] | None = None,
        batch: int = FAMILY_BATCH,
    ) -> Callable[[int], SearchStrategy[list[Any]]]:
        def one(world: int) -> SearchStrategy[Any]:
            kept = tuple(d for d in dtypes if d not in target.refused) or tuple(dtypes)
            drawn: SearchStrategy[Any] = draw_cases(
                world_sizes=(world,), dtypes=kept, subgroups=subgroups
            )

            def fit(case: Any) -> Any:
                if grad is not None:
                    case = replace(case, requires_grad=grad)
                if special is not None:
                    case = replace(case, special=special)
                if shape is not None:
                    case = shape(case)
                return _fitted(target, case)

            fitted = drawn.map(fit)
            return fitted if keep is None else fitted.filter(keep)

        return lambda world: st.lists(one(world), min_size=1, max_size=batch)

    def large(world: int) -> SearchStrategy[list[Any]]:
        case = _large_case(op, world).map(lambda c: _fitted(target, c))
        return st.lists(case, min_size=1, max_size=2)

    def misuse(world: int) -> SearchStrategy[list[Any]]:
        kinds = [k for k in MISUSE_KINDS[op] if k != "absent"]
        one = st.builds(
            MisuseCase,
            st.just(op),
            st.sampled_from(kinds),
            st.just(world),
            st.integers(0, world - 1),
            st.just(target.impl),
        )
        return st.lists(one, min_size=1, max_size=2)

    def sequence(world: int) -> SearchStrategy[list[Any]]:
        drawn: SearchStrategy[Any] = draw_cases(
            world_sizes=(world,), dtypes=_SEQUENCE, subgroups=groups
        )
        return st.lists(drawn.map(lambda c: _fitted(target, c)), min_size=2, max_size=6)

    same = "forward equals the oracle bit for bit on every rank, "
    grads = ", ".join(target.grads) or "none"
    rows = [
        FamilyProperty(
            target, "forward-float", same + "float32/float64", _FORWARD, rows_of(_FLOAT, grad=False)
        ),
        FamilyProperty(
            target, "forward-half", same + "float16/bfloat16", _FORWARD, rows_of(_HALF, grad=False)
        ),
        FamilyProperty(
            target,
            "forward-complex",
            same + "complex64",
            _FORWARD,
            rows_of(("complex64",), grad=False),
        ),
        FamilyProperty(
            target,
            "forward-int",
            same + "int8/16/32/64, uint8",
            _FORWARD,
            rows_of(_INT, grad=False),
        ),
        FamilyProperty(
            target, "forward-bool", same + "bool", _FORWARD, rows_of(("bool",), grad=False)
        ),
        FamilyProperty(
            target,
            "dims",
            "forward and gradient along dims other than 0, negative ones included",
            _VALUES,
            rows_of(_COMMON, shape=_nonzero_dim),
        ),
        FamilyProperty(
            target,
            "empty",
            "one rank's part empty (no block, nothing sent, no elements): forward and gradient",
            _VALUES,
            rows_of(_COMMON, shape=_emptied),
        ),
        FamilyProperty(
            target,
            "subgroup",
            "group= a subgroup of the world: its members only, gradients too",
            _VALUES,
            rows_of(_COMMON, subgroups=True, keep=lambda c: c.group is not None),
            min_world=3,
        ),
        FamilyProperty(
            target,
            "gradient",
            f"input gradients (claimed: {grads}), upstream gradients differing per rank",
            frozenset({"gradient"}),
            rows_of(_GRAD, grad=True),
        ),
        FamilyProperty(
            target,
            "adjoint",
            "sum_r <y_r, g_r> == sum_j <x_j, dx_j> exactly (integer values)",
            frozenset({"gradient", "adjoint"}),
            rows_of(_FLOAT, grad=True, special=False),
        ),
        FamilyProperty(
            target,
            "payload-scale",
            "blocks of up to 320 KiB per rank (past the one-round payload slot): forward "
            "and gradient",
            _VALUES,
            large,
        ),
        FamilyProperty(
            target,
            "call-sequence",
            "calls in a row on one world, shapes, dtypes, sizes and validate changing "
            "between calls (state carried across calls)",
            _VALUES,
            sequence,
        ),
        FamilyProperty(
            target,
            "misuse",
            "one rank's arguments wrong: the same error class and message on every rank, "
            "naming that rank, and the next call works",
            frozenset({"misuse"}),
            misuse,
            misuse=True,
        ),
    ]
    forward = {"forward-float": _FLOAT, "forward-half": _HALF, "forward-int": _INT}
    forward |= {"forward-complex": ("complex64",), "forward-bool": ("bool",)}
    split: list[FamilyProperty] = []
    for row in rows:
        split.append(row)
        for d in forward.get(row.id, ()):
            if d in target.refused:  # the refused dtype alone (rows_of keeps a lone one)
                alone = rows_of((d,), grad=False)
                title = f"{row.title} [{d} only]"
                split.append(replace(row, id=f"{row.id}:{d}", title=title, cases=alone))
    return [_scoped(row) for row in split]


def _scoped(row: FamilyProperty) -> FamilyProperty:
    """``row`` left out (``out_of_scope``) where the target's scope excludes it."""
    target = row.target
    why: str | None = None
    if row.id == "dims":
        if target.op == "all_gather_list":
            why = "all_gather_list takes no dim (every dim may differ)"
        elif not target.passes("dim"):
            why = f"--call {target.call} passes no dim: dim 0 only"
        elif target.dims is not None and all(d == 0 for d in target.dims):
            why = "--dims 0: dim 0 only"
    elif row.id == "subgroup" and not target.passes("group"):
        why = f"--call {target.call} passes no group: no subgroup"
    elif row.id in ("gradient", "adjoint") and not target.differentiable:
        why = "--grad none: not differentiable"
    elif row.id == "adjoint" and target.op == "all_gather_list" and "sum" not in target.grads:
        why = "an identity of grad='sum'; the claimed contract is " + ", ".join(target.grads)
    elif row.id == "misuse" and target.call is not None:
        why = "--call: the misuse cases call ATTR as vargather's function is (timeout= too)"
    return row if why is None else replace(row, out_of_scope=why)


def family_property_ids(op: str) -> tuple[str, ...]:
    """The ids of ``op``'s catalogue, in order (what ``--only`` or an xfails file names)."""
    return tuple(p.id for p in family_catalogue(FamilyTarget(op)))


def reproduction(cases: Sequence[Any], misuse: bool = False) -> str:
    """The failing calls in words, and a shell command that re-runs exactly them."""
    names = sorted({type(c).__name__ for c in cases})
    listed = ", ".join(repr(c) for c in cases)
    if misuse:
        body = f"[check_misuse(get_pool(c.world_size), c) for c in [{listed}]]"
    else:
        body = f"check_sequence(get_pool({cases[0].world_size}), [{listed}])"
    code = (
        "from vargather.testing import get_pool; "
        f"from vargather.testing.family import {', '.join(names)}, "
        f"{'check_misuse' if misuse else 'check_sequence'}; print({body})"
    )
    where = f"on a gloo world of {cases[0].world_size} rank(s)"
    lines = [f"{len(cases)} call(s) {where}, in order:"]
    lines += [f"  {c!r}" for c in cases]
    lines.append(f"reproduce: python -c {shlex.quote(code)}")
    return "\n".join(lines)


def case_dict(case: Any) -> dict[str, Any]:
    """A family case as plain JSON data (the counterexample in the report)."""
    data = dataclasses.asdict(case)
    data["collective"] = case.collective
    data["repr"] = repr(case)
    return data

"""The family's engine: the generic case base, rank runner and judge of every catalogue
collective but the gather (``collectives.FAMILY``).

Where it sits: in the testing kit, beneath ``family_catalogue`` and the catalogue
modules, each of which holds its collective's case class (a ``FamilyCase``), strategy
and call: nothing here names a collective. Every rank's input and upstream gradient
are rebuilt from the case alone. ``judge_case`` holds the reports against the oracle
the table names: forward and gradient bit for bit, and with integer values the
adjoint identity ``sum_r <y_r, g_r> == sum_j <x_j, dx_j>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import torch
from hypothesis import strategies as st

from vargather import COLLECTIVES as TABLE
from vargather import oracle

from .asserts import bitwise_difference, nan_payloads_only
from .calls import bind_call
from .cases import Implementation
from .compiled import call_compiled, patient_default_group
from .dispatch import function_of
from .judge import Failure, without_addresses
from .pool import RankPool
from .rank_runner import Alone, emulation, join
from .rank_side import RankContext
from .repeatable import repeatable
from .values import DTYPE_NAMES, _lay_out, is_differentiable, make_values, torch_dtype

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

CALL_TIMEOUT = 15.0
"""Seconds each collective of a case may wait for its peers (a rank that raised leaves
its peers waiting that long)."""


def values(shape: Sequence[int], dtype: str, seed: int, special: bool) -> torch.Tensor:
    """Small integer values of ``dtype`` (exact sums in every float format); with
    ``special``, NaNs with distinct payloads, -0.0 and infinities among them."""
    return make_values(tuple(shape), torch_dtype(dtype), seed, "special" if special else "integers")


class _Declared:
    """What each case class declares itself: its ``dtype`` field (after its own
    positional ones) and these class attributes (set unannotated: not fields)."""

    collective: ClassVar[str]
    NAMES: ClassVar[tuple[str, ...]]
    """The names a call template (``--call``) may use (``x``, ``group``, ``out`` are
    bound here, the rest by ``template_values``)."""
    POSITIONAL: ClassVar[tuple[str, ...]] = ()
    """The names of ``NAMES`` that ``arguments`` passes positionally, in order."""
    shared_output: ClassVar[bool] = False
    """The oracle returns one result every rank gets (else one per rank)."""
    reduced_forward: ClassVar[bool] = False
    """The forward is a reduction: a NaN's payload may differ (``Failure.nan_payload``)."""

    dtype: str


@dataclass(frozen=True, repr=False)
class FamilyCase(_Declared):
    """What every family case shares: ``world_size`` (positional, first), ``dtype``
    (after each case's own positional fields) and keyword-only fields: ``special``
    (NaN payloads, -0.0, inf among the values), ``group`` (the world's ranks forming
    it), ``memory`` (``x``'s layout: ``contiguous``, ``transposed`` or ``sliced``),
    ``initialized`` (``False``: one rank in the calling process), ``call`` (a
    ``--call`` template), ``emulate`` (``"nccl"``) and ``compile_backend`` (the call
    inside a compiled step). A subclass, a ``@dataclass(frozen=True, repr=False)``,
    says how its call is made and what the oracle needs."""

    world_size: int
    _: KW_ONLY
    requires_grad: bool = True
    special: bool = False
    seed: int = 0
    group: tuple[int, ...] | None = None
    validate: bool = True
    memory: str = "contiguous"
    initialized: bool = True
    impl: str = "vargather"
    call: str | None = None
    emulate: str | None = None
    compile_backend: str | None = None

    def __repr__(self) -> str:
        """Python that ``repro`` parses back: the case's own fields first."""
        shared = [f.name for f in fields(FamilyCase)][1:]
        names = [f.name for f in fields(self) if f.name not in shared] + shared
        listed = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({listed})"

    # -- what a collective's case says

    def input_shapes(self) -> list[tuple[int, ...]]:
        raise NotImplementedError

    def output_shapes(self) -> list[Any]:
        """Each group rank's output shape (a list of shapes for a list result)."""
        raise NotImplementedError

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Group rank ``r``'s arguments after ``x`` (the runner adds ``group=``,
        ``validate=``, ``timeout=``)."""
        raise NotImplementedError

    def template_values(self, r: int) -> dict[str, object]:
        """The names of ``NAMES`` a template may use beside ``x``, ``group``, ``out``:
        what ``arguments`` passes, by name (``None``: a name it leaves out)."""
        args, kwargs = self.arguments(r)
        passed = {**dict(zip(self.POSITIONAL, args, strict=True)), **kwargs}
        return {n: passed.get(n) for n in self.NAMES if n not in ("x", "group", "out")}

    def oracle_args(self) -> dict[str, Any]:
        """The oracle's keyword arguments beside the inputs."""
        raise NotImplementedError

    def grad_args(self) -> dict[str, Any]:
        """The gradient oracle's keyword arguments beside ``oracle_args``."""
        return {}

    @property
    def reduced_gradient(self) -> bool:
        """The gradient is a reduction of upstream gradients (NaN payloads apart)."""
        return False

    @property
    def adjoint_applies(self) -> bool:
        """Whether the exact adjoint identity holds for the case's gradient."""
        return True

    def emptied(self) -> Any:
        """The case with one rank's part empty (chosen by its seed)."""
        raise NotImplementedError

    def compilable(self) -> Any:
        """The case as a compiled step runs it: integer values (``x * 1`` exact on every
        backend) and every size passed as ints (an unknown one takes the eager path
        behind a graph break, which ``fullgraph=True`` refuses)."""
        return replace(self, special=False)

    def fitted(self, target: Implementation, passes: Callable[[str], bool]) -> Any:
        """The case within ``target``'s scope, as far as the collective's own arguments
        go (``passes(name)``: whether the target's call passes ``name``)."""
        return self

    # -- derived, the same for every collective

    @property
    def members(self) -> tuple[int, ...]:
        """The world ranks that call the collective (the group), in group-rank order."""
        return self.group if self.group is not None else tuple(range(self.world_size))

    @property
    def differentiable(self) -> bool:
        return self.requires_grad and is_differentiable(torch_dtype(self.dtype))

    def inputs(self) -> list[torch.Tensor]:
        """Every group rank's input, by group rank (the same on every process)."""
        return [
            values(shape, self.dtype, self.seed * 131 + r, self.special)
            for r, shape in enumerate(self.input_shapes())
        ]

    def upstream(self) -> list[Any]:
        """Each group rank's upstream gradient: integer-valued, different on every rank
        (a list, one per output, for a list result)."""
        return [
            [values(t, self.dtype, 7000 + 97 * r + k, False) for k, t in enumerate(s)]
            if self.shared_output
            else values(s, self.dtype, 7000 + 97 * r, False)
            for r, s in enumerate(self.output_shapes())
        ]


class SplitCase(FamilyCase):
    """A case of a collective that splits or joins along ``dim`` of a shape that is
    ``other`` without it."""

    dim: int
    other: tuple[int, ...]

    def with_dim(self, dim: int, **more: Any) -> Any:
        """The case along ``dim``, with trailing dims of 2 added where it has too few."""
        need = dim + 1 if dim >= 0 else -dim
        other = self.other + (2,) * max(0, need - len(self.other) - 1)
        return replace(self, other=other, dim=dim, **more)  # type: ignore[call-arg]  # fields of each subclass

    def nonzero_dim(self) -> Any:
        """The case along a dim other than 0 (the last or the second, by its seed)."""
        if self.dim not in (0, -(len(self.other) + 1)):
            return self
        return self.with_dim(-1 if self.seed % 2 else 1)


def shape_with(other: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    """``other`` with ``n`` inserted at ``dim`` (negative: counted from the end)."""
    d = dim % (len(other) + 1)
    return (*other[:d], n, *other[d:])


@dataclass(frozen=True, repr=False)
class BlockCase(SplitCase):
    """A case of a collective of one block per group rank (``gather_v``, ``scatter_v``,
    ``reduce_scatter_v``): block ``r`` is ``sizes[r]`` long along ``dim`` of a shape
    that is ``other`` without it; a subclass adds its own fields after these."""

    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int

    def blocks(self) -> list[tuple[int, ...]]:
        """Each group rank's block shape, by group rank."""
        return [shape_with(self.other, self.dim, n) for n in self.sizes]

    def emptied(self) -> Any:
        """No block for one rank (chosen by the seed)."""
        sizes = list(self.sizes)
        sizes[self.seed % len(sizes)] = 0
        return replace(self, sizes=tuple(sizes))


C = TypeVar("C", bound=FamilyCase)


def draw_dims(draw: Any, most: int) -> tuple[int, ...]:
    """The dims besides the one split or joined along: up to two, each up to ``most``."""
    return tuple(draw(st.lists(st.integers(0, most), max_size=2)))


def draw_world(
    draw: Any, world_sizes: Sequence[int], subgroups: bool
) -> tuple[int, tuple[int, ...] | None, int]:
    """A drawn world size, its subgroup (``None``: the whole world) and the group's size."""
    world = draw(st.sampled_from(list(world_sizes)))
    if not subgroups or world < 3 or not draw(st.booleans()):
        return world, None, world
    ranks = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=world - 1, unique=True))
    return world, tuple(sorted(ranks)), len(ranks)


def draw_shared(
    draw: Any, dtypes: Sequence[str], world: int, group: tuple[int, ...] | None
) -> dict[str, Any]:
    """A drawn case's shared fields on ``world`` ranks (``group`` among them)."""
    return {
        "world_size": world,
        "group": group,
        "dtype": draw(st.sampled_from(list(dtypes))),
        "requires_grad": draw(st.booleans()),
        "special": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def block_cases(
    case_type: Callable[..., BlockCase],
    own: Callable[[Any, int], dict[str, Any]] = lambda draw, w: {},
    flags: Callable[[Any], dict[str, Any]] = lambda draw: {},
) -> Callable[..., SearchStrategy[Any]]:
    """A ``BlockCase`` type's strategy ``(world_sizes, dtypes, subgroups, most)``, its
    ``own(draw, w)`` fields (on a group of ``w`` ranks) and ``flags`` drawn too."""

    @st.composite
    def cases(
        draw: Any,
        world_sizes: tuple[int, ...] = (2, 3),
        dtypes: tuple[str, ...] = DTYPE_NAMES,
        subgroups: bool = True,
        most: int = 4,
    ) -> BlockCase:
        world, group, w = draw_world(draw, world_sizes, subgroups)
        other = draw_dims(draw, most)
        return case_type(
            sizes=tuple(draw(st.lists(st.integers(0, most), min_size=w, max_size=w))),
            other=other,
            dim=draw(st.integers(-(len(other) + 1), len(other))),
            **own(draw, w),
            **draw_shared(draw, dtypes, world, group),
            **flags(draw),
            validate=draw(st.booleans()),
        )

    return cases


def fit_passed(
    case: C, target: Implementation, passes: Callable[[str], bool], name: str, flag: str, **off: Any
) -> C:
    """``case`` with its ``flag`` (its call passes the optional ``name``) as ``target``
    takes it: off (and ``off``'s fields set) where the target's call does not pass
    ``name`` or its sizes scope is ``never``; on where it is ``required`` or ``list``."""
    on: dict[str, Any] = {flag: True}
    if not passes(name) or target.sizes_scope == "never":
        return replace(case, **{**off, flag: False})
    return replace(case, **on) if target.sizes_scope in ("required", "list") else case


# --- the rank runner ---------------------------------------------------------------------


class CallReport(NamedTuple):
    """What one rank saw: its output (a list for a list result), its input's gradient,
    or the error it raised (class name, message, blamed ranks)."""

    output: Any
    grad: torch.Tensor | None
    error: tuple[str, str, tuple[int, ...]] | None


def _call(case: FamilyCase, x: torch.Tensor, r: int, group: Any) -> Any:
    """The case's call on group rank ``r``, as documented or by its call template."""
    fn = function_of(case.collective, case.impl)
    if case.call is not None:
        shape, values = lambda: case.output_shapes()[r], case.template_values(r)
        args, kwargs = bind_call(case.call, case.NAMES, x, group, shape, values)
    else:
        rest, named = case.arguments(r)
        args = (x, *rest)
        kwargs = {"group": group, "validate": case.validate, "timeout": CALL_TIMEOUT, **named}
    return call_compiled(fn, case, x, args, kwargs)


def run_case(ctx: RankContext | Alone, case: FamilyCase) -> CallReport | None:
    """Rank side: this rank's call and backward (``None`` outside the case's group)."""
    emulation(case.emulate)
    joined = join(ctx, case.group)
    if joined is None:
        return None
    group, r = joined
    x = _lay_out(case.inputs()[r], case.memory)
    grad_wanted = case.differentiable
    if grad_wanted:
        x.requires_grad_(True)
    try:
        with patient_default_group(ctx, case), repeatable():
            return _run(case, x, r, group, grad_wanted)
    except Exception as err:
        return CallReport(
            None, None, (type(err).__name__, str(err), tuple(getattr(err, "ranks", ())))
        )


def _run(case: FamilyCase, x: torch.Tensor, r: int, group: Any, grad_wanted: bool) -> CallReport:
    """The call and its backward on group rank ``r``, what it returned settled."""
    out = _call(case, x, r, group)
    if grad_wanted:
        up = case.upstream()[r]
        if isinstance(out, (list, tuple)):
            torch.autograd.backward(list(out), list(up))
        else:
            out.backward(up)
    # Waiting for an async result is part of the call (its errors are the call's).
    output = [_settled(o) for o in out] if isinstance(out, (list, tuple)) else _settled(out)
    return CallReport(output, _settled(x.grad), None)


def _settled(t: Any) -> Any:
    """``t`` detached, and waited for when it is torch's ``AsyncCollectiveTensor`` (a
    functional collective's result: its view ops, ``detach`` included, do not wait,
    so its bytes would be read before the collective wrote them)."""
    if not isinstance(t, torch.Tensor):
        return t
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if isinstance(t, AsyncCollectiveTensor):
        return t.wait().detach()
    return t.detach()


# --- the judge ---------------------------------------------------------------------------


def expected(case: FamilyCase) -> tuple[list[Any], list[torch.Tensor] | None]:
    """The table's oracle's results (one per group rank) and input gradients
    (``None``: no backward)."""
    entry = TABLE[case.collective]  # type: ignore[index]  # a catalogue collective's name
    xs, kw = case.inputs(), case.oracle_args()
    out = getattr(oracle, entry.oracle)(xs, **kw)
    if case.shared_output:
        out = [out for _ in xs]
    grads = None
    if case.differentiable:
        up = case.upstream()
        grads = getattr(oracle, entry.oracle_grads)(xs, upstream=up, **kw, **case.grad_args())
    return out, grads


def _compare(got: object, want: Any, reduced: bool) -> tuple[str, bool] | None:
    """How ``got`` differs from the oracle's ``want`` (a tensor or a list of them), and
    whether only in NaN payloads (``reduced``: a reduction's result); ``None``: equal."""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"expected a list of {len(want)} tensors, got {type(got).__name__}", False
        found = [
            (k, _compare(g, w, reduced)) for k, (g, w) in enumerate(zip(got, want, strict=True))
        ]
        bad = [(k, d) for k, d in found if d is not None]
        if not bad:
            return None
        return "; ".join(f"entry {k}: {d[0]}" for k, d in bad), all(d[1] for _, d in bad)
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}", False
    d = bitwise_difference(got, want)
    if d is None:
        return None
    if reduced and nan_payloads_only(got, want):
        return f"NaN payloads differ where both hold a NaN: {d}", True
    return d, False


def _flat(items: Sequence[Any]) -> list[torch.Tensor]:
    return [t for item in items for t in (item if isinstance(item, list) else [item])]


def _dot(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.detach().to(torch.int64) * b.detach().to(torch.int64)).sum())


def judge_case(case: FamilyCase, reports: Sequence[CallReport | None]) -> list[Failure]:
    """The members' reports against the oracle (the module docstring's checks)."""
    name = case.collective
    mine = [rep for rep in reports if rep is not None]

    def failed(aspect: str, ranks: Sequence[int], message: str, nan: bool = False) -> Failure:
        """``call`` (an exception) is an error, the rest mismatches."""
        kind = "error" if aspect == "call" else "mismatch"
        return Failure(
            aspect, kind, message, tuple(ranks), len(mine), name, nan_payload=nan, property=name
        )

    raised = [(r, rep.error) for r, rep in enumerate(mine) if rep.error is not None]
    if raised:  # rep.error is a (class name, message, ranks) triple
        text = "; ".join(f"rank {r}: {e[0]}: {without_addresses(e[1])}" for r, e in raised)
        return [failed("call", tuple(r for r, _ in raised), text)]
    want, want_grads = expected(case)
    failures: list[Failure] = []
    for r, rep in enumerate(mine):
        d = _compare(rep.output, want[r], case.reduced_forward)
        if d is not None:
            failures.append(failed("output", (r,), d[0], d[1]))
        if want_grads is None:
            continue
        d = (
            ("expected a gradient, got None", False)
            if rep.grad is None
            else _compare(rep.grad, want_grads[r], case.reduced_gradient)
        )
        if d is not None:
            failures.append(failed("gradient", (r,), d[0], d[1]))
    if (
        want_grads is not None
        and case.adjoint_applies
        and not case.special
        and not case.dtype.startswith("complex")
        and not failures
    ):
        xs, up = case.inputs(), case.upstream()
        lhs = sum(_dot(o, g) for o, g in zip(_flat(want), _flat(up), strict=True))
        rhs = sum(
            _dot(x, rep.grad) for x, rep in zip(xs, mine, strict=True) if rep.grad is not None
        )
        if lhs != rhs:
            message = f"expected sum_r <y_r, g_r> == sum_j <x_j, dx_j>, got {lhs} != {rhs}"
            failures.append(failed("adjoint", (), message))
    return failures


def check_case(pool: RankPool, case: FamilyCase) -> list[Failure]:
    """The property: run ``case`` on ``pool`` (``case.world_size`` ranks) and judge it."""
    return judge_case(case, pool.run(run_case, case))


def run_sequence(ctx: RankContext, cases: tuple[FamilyCase, ...]) -> list[CallReport | None]:
    """Rank side: the cases one after the other on the same world."""
    return [run_case(ctx, case) for case in cases]


def check_sequence(pool: RankPool, cases: Sequence[FamilyCase]) -> list[Failure]:
    """Each call of a sequence on one world (the fused round's state and the groups'
    sequence numbers carried from call to call) judged as if it ran alone."""
    per_rank = pool.run(run_sequence, tuple(cases))
    return [
        replace(f, message=f"call #{i}: {f.message}")
        for i, case in enumerate(cases)
        for f in judge_case(case, [reports[i] for reports in per_rank])
    ]

"""The kit's one misuse model: a wrong call of any collective and the error it must raise.

Where it sits: in the testing kit, above ``dispatch``, ``rank_runner`` and ``judge``,
beneath the catalogues: each collective's entries are the ``MISUSES`` at the tail of
its catalogue module, the ones every collective shares are ``generic`` here. The
contract (``docs/misuse.md``): one rank's arguments wrong makes every rank raise the
same ``VarGatherError`` subclass with one message naming that rank, and the next call
on the group is right. Calls pickle to the ranks with their tensors as descriptions
(``TensorSpec``, ``SizesTensor``), rebuilt alike on the rank and in the parent.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import torch

import vargather
from vargather import COLLECTIVES, oracle

from .asserts import bitwise_difference
from .collectives import NAMES
from .dispatch import bind, call_collective
from .judge import Failure
from .rank_runner import emulation

# --- descriptions of arguments --------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """A tensor rebuilt on the rank: values ``seed * 1000 + rank * 100 + arange``."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    requires_grad: bool = False
    layout: str = "strided"  # "strided", "sparse", or a non-contiguous "transposed"/"sliced" view
    device: str = "cpu"
    seed: int = 0

    def build(self, rank: int) -> torch.Tensor:
        dtype = getattr(torch, self.dtype)
        n = math.prod(self.shape)
        base = torch.arange(n, dtype=torch.float64) + (self.seed * 1000 + rank * 100)
        if dtype == torch.bool:
            t = (base.long() % 3 == 0).reshape(self.shape)
        elif dtype.is_complex:
            t = torch.complex(base, -base).to(dtype).reshape(self.shape)
        else:
            t = (base % 97 - 40).to(dtype).reshape(self.shape)
        if self.layout == "transposed" and t.ndim >= 2:
            t = t.transpose(0, -1).contiguous().transpose(0, -1)
        if self.layout == "sliced" and t.ndim >= 1:  # every other element of a larger tensor
            t = torch.repeat_interleave(t, 2, dim=-1)[..., ::2]
        if self.device != "cpu":
            t = t.to(self.device)
        if self.layout == "sparse":
            t = t.to_sparse()
        if self.requires_grad:
            t.requires_grad_(True)
        return t


@dataclass(frozen=True)
class SizesTensor:
    """``sizes`` passed as a tensor of this dtype and shape (values ``values``)."""

    values: tuple[int, ...]
    dtype: str = "int64"
    shape: tuple[int, ...] | None = None

    def build(self) -> torch.Tensor:
        t = torch.tensor(self.values, dtype=getattr(torch, self.dtype))
        return t.reshape(self.shape) if self.shape is not None else t


def build_x(value: object, rank: int) -> Any:
    """``value`` as rank ``rank`` passes it: descriptions (in lists and tuples too)
    rebuilt."""
    if isinstance(value, TensorSpec):
        return value.build(rank)
    if isinstance(value, SizesTensor):
        return value.build()
    if isinstance(value, (list, tuple)) and any(
        isinstance(v, (TensorSpec, SizesTensor)) for v in value
    ):
        return type(value)(build_x(v, rank) for v in value)
    return value


@dataclass(frozen=True)
class Call:
    """A rank's call of ``collective`` (a name of ``vargather``), any object in its
    arguments. ``subgroup``: world ranks passed as ``group=`` (created on every rank,
    as ``new_group`` requires); ``backward``: then backpropagate ``upstream_for``."""

    collective: str
    args: tuple[object, ...] = ()
    kwargs: Mapping[str, object] = field(default_factory=dict)
    subgroup: tuple[int, ...] | None = None
    backward: bool = False

    def get(self, name: str) -> Any:
        """Argument ``name``, however passed (its default; ``None``: no such parameter)."""
        return bind(self.collective, self.args, self.kwargs).arguments.get(name)

    def with_(self, **changes: object) -> Call:
        """This call with the arguments ``changes`` (by parameter name) replaced, each
        passed as it was (positionally or by keyword; a new one by keyword)."""
        positional = list(bind(self.collective, (), {}).signature.parameters)[: len(self.args)]
        args, kwargs = list(self.args), dict(self.kwargs)
        for name, value in changes.items():
            if name in positional:
                args[positional.index(name)] = value
            else:
                kwargs[name] = value
        return replace(self, args=tuple(args), kwargs=kwargs)

    @property
    def x(self) -> Any:
        """The first argument: the input."""
        return self.args[0]


def call(collective: str, *args: object, **kwargs: object) -> Call:
    """``Call(collective, args, kwargs)``, written as the call is."""
    return Call(collective, args, kwargs)


def spec_call(
    collective: str,
    rows: int,
    *args: object,
    trail: tuple[int, ...] = (2,),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kwargs: object,
) -> Call:
    """``call(collective, x, *args, **kwargs)`` with ``x`` a ``(rows, *trail)`` tensor:
    each catalogue's base call."""
    return call(collective, TensorSpec((rows, *trail), dtype, requires_grad), *args, **kwargs)


@dataclass(frozen=True)
class Scenario:
    """One ``Call`` per rank (a rank may call another collective); ``absent``: a rank
    that makes no call."""

    collective: str
    calls: tuple[Call, ...]
    absent: int | None = None

    @property
    def world_size(self) -> int:
        return len(self.calls)


@dataclass(frozen=True)
class CallOutput:
    """A rank's output detached, its input's gradient, a ``*_with_layout`` form's sizes."""

    output: Any
    grad: torch.Tensor | None
    layout_sizes: tuple[int, ...] | None = None


def upstream_for(shape: Sequence[int], dtype: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient: small integers, different on every rank."""
    n = math.prod(shape)
    g = (torch.arange(n, dtype=torch.float64) * (rank + 2) % 7 - 3).reshape(tuple(shape))
    return g.to(getattr(torch, dtype))


def _upstream(out: Any, rank: int) -> Any:
    if isinstance(out, (list, tuple)):
        return [_upstream(t, rank) for t in out]
    return upstream_for(out.shape, str(out.dtype).removeprefix("torch."), rank)


# --- the rank side ----------------------------------------------------------------------


def run_call(ctx: Any, scenario: Scenario, impl: str = "vargather") -> CallOutput | None:
    """Rank ``ctx.rank``'s call of ``scenario`` (``impl``'s where it is the scenario's
    collective; ``None`` on the absent rank); raises what the call raises."""
    if ctx.rank == scenario.absent:
        return None
    c = scenario.calls[ctx.rank]
    args = tuple(build_x(a, ctx.rank) for a in c.args)
    kwargs = {k: build_x(v, ctx.rank) for k, v in c.kwargs.items()}
    if c.subgroup is not None:
        kwargs["group"] = ctx.subgroup(list(c.subgroup))
    own = impl if c.collective == scenario.collective else "vargather"
    result = call_collective(c.collective, args, kwargs, own)
    out = getattr(result, "tensor", result)  # a *_with_layout form's result
    layout = None if out is result else result.layout
    grad = None
    if c.backward:
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        torch.autograd.backward(outs, _upstream(outs, ctx.rank))
        grad = args[0].grad
    detached = [t.detach() for t in out] if isinstance(out, (list, tuple)) else out.detach()
    return CallOutput(detached, grad, None if layout is None else tuple(layout.sizes))


# --- the oracle of a scenario -------------------------------------------------------------


def _oracle_kwargs(fn: Callable[..., Any], scenario: Scenario) -> dict[str, Any]:
    """The oracle function ``fn``'s arguments past its inputs, from the calls: rank 0's
    value of the parameter of the same name (``contract``: ``grad``), every rank's
    where ``fn`` takes one per rank (``Sequence[Sequence[int]]``)."""
    bound = [c.get for c in scenario.calls]
    found: dict[str, Any] = {}
    for name, p in list(inspect.signature(fn).parameters.items())[1:]:
        arg = "grad" if name == "contract" else name
        if name == "upstream" or arg not in bind(scenario.collective, (), {}).signature.parameters:
            continue
        values = [_plain(build_x(get(arg), 0)) for get in bound]
        found[name] = values if "Sequence[Sequence" in str(p.annotation) else values[0]
    return found


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, torch.Tensor) else value


def expected_of(scenario: Scenario) -> tuple[list[Any], list[torch.Tensor | None]]:
    """The table's oracle's output of every rank of a valid scenario, and every rank's
    input gradient where the calls backpropagate (else ``None``s)."""
    row = COLLECTIVES[scenario.collective]  # type: ignore[index]  # a table name, by contract
    xs = [build_x(c.x, r).detach() for r, c in enumerate(scenario.calls)]
    fn = getattr(oracle, row.oracle)
    out = fn(xs, **_oracle_kwargs(fn, scenario))
    outs = [out] * len(xs) if row.round == "all_gather" else list(out)
    if not scenario.calls[0].backward:
        return outs, [None] * len(xs)
    ups = [_upstream(o, r) for r, o in enumerate(outs)]
    grads_fn = getattr(oracle, row.oracle_grads)
    return outs, list(grads_fn(xs, upstream=ups, **_oracle_kwargs(grads_fn, scenario)))


# --- the entries ----------------------------------------------------------------------------


Build = Callable[[int, int], Call]  # a rank's call from (rank, world size)


@dataclass(frozen=True)
class Misuse:
    """One class of misuse of a collective: ``bad(rank, world)`` the offending rank's
    call (every rank's, ``all_ranks``; ``None``: it never calls), ``good`` its peers'
    (``misuses`` fills in the valid call), ``error`` the class every rank must raise,
    ``fragments(world, offender)`` what its message must contain, ``blamed`` the ranks
    it must blame (default: the offender; both of two for a mismatch without a
    majority; every rank when all err)."""

    name: str
    summary: str
    error: type[vargather.VarGatherError]
    bad: Build | None
    fragments: Callable[[int, int], tuple[str, ...]]
    good: Build | None = None
    blamed: Callable[[int, int], tuple[int, ...]] | None = None
    all_ranks: bool = False

    @property
    def absent(self) -> bool:
        return self.bad is None

    @property
    def collective(self) -> str:
        return self.build(2, 0).collective

    def build(self, world_size: int, offender: int) -> Scenario:
        good, bad = self.good, self.bad
        assert good is not None, f"{self.name}: not yet in a catalogue (misuses)"
        wrong = [bad is not None and (self.all_ranks or r == offender) for r in range(world_size)]
        calls = tuple(
            bad(r, world_size) if w and bad is not None else good(r, world_size)
            for r, w in enumerate(wrong)
        )
        return Scenario(good(0, world_size).collective, calls, offender if bad is None else None)

    def blamed_ranks(self, world_size: int, offender: int) -> tuple[int, ...]:
        if self.blamed is not None:
            return self.blamed(world_size, offender)
        if self.all_ranks:
            return tuple(range(world_size))
        tie = issubclass(self.error, vargather.MismatchError) and not issubclass(
            self.error, vargather.SizesMismatchError
        )
        return (0, 1) if world_size == 2 and tie else (offender,)

    def follow_up(self, world_size: int) -> Scenario:
        """The next call on the group: the peers' valid call on every rank, its input
        float64 and differentiable, with a backward."""
        assert self.good is not None
        calls = []
        for r in range(world_size):
            c = self.good(r, world_size)
            spec = c.x
            assert isinstance(spec, TensorSpec), self.name
            x = replace(spec, dtype="float64", requires_grad=True)
            calls.append(replace(c, args=(x, *c.args[1:]), backward=True))
        return Scenario(calls[0].collective, tuple(calls))


def valid_scenario(collective: str, world_size: int) -> Scenario:
    """A valid call of ``collective`` on every rank (``Misuse.follow_up``)."""
    return misuse_by_name("none-input", collective).follow_up(world_size)


def tie(w: int, o: int) -> tuple[int, ...]:
    """Two ranks disagreeing have no majority: both are named."""
    return (0, 1) if w == 2 else (o,)


def blocks(w: int) -> list[int]:
    """The base block sizes of ``w`` ranks' calls: 2, 0, 3, 1 rows (one empty)."""
    return [(2, 0, 3, 1)[r] for r in range(w)]


ABSENT_TIMEOUT: Final = 2.0
"""The ``absent`` entry's per-call timeout: what the peers wait for the absent rank."""


def generic(base: Build) -> tuple[Misuse, ...]:
    """The misuses of every collective, from its valid call ``base``."""
    name = base(0, 2).collective

    def x_is(kind: str, x: object, what: str) -> Misuse:
        """One rank passes ``x``, no tensor, as its input."""
        got = type(x).__name__
        return Misuse(
            kind,
            f"one rank passes {what}",
            vargather.InputTypeError,
            lambda r, w: replace(base(r, w), args=(x, *base(r, w).args[1:])),
            lambda w, o: (f"rank {o}: expected a torch.Tensor, got {got}",),
        )

    return (
        Misuse(
            "absent",
            f"one rank never calls {name}",
            vargather.CollectiveTimeoutError,
            None,
            lambda w, o: (
                f"rank(s) [{o}] never arrived at this collective",
                "metadata exchange)",
                f"within {ABSENT_TIMEOUT:g} s (this call's timeout)",
                "destroy it and create a new one",
            ),
            good=lambda r, w: base(r, w).with_(timeout=ABSENT_TIMEOUT),
        ),
        x_is("not-a-tensor", [1.0, 2.0], "a list"),
        x_is("none-input", None, "None"),
    )


def misuses(base: Build, *entries: Misuse, without: Mapping[str, str] = {}) -> tuple[Misuse, ...]:
    """A catalogue's ``MISUSES``: its own ``entries`` (peers calling ``base`` unless
    an entry says otherwise; a table, two lines an entry: name, summary, error; bad
    call, fragments, options), then the ``generic`` ones but ``without``'s (name: why)."""
    shared = tuple(e for e in generic(base) if e.name not in without)
    return tuple(e if e.good is not None else replace(e, good=base) for e in entries + shared)


def entries_of(collective: str) -> tuple[Misuse, ...]:
    """Every misuse of ``collective``: the ``MISUSES`` of its catalogue (the table's)."""
    row = COLLECTIVES[collective]  # type: ignore[index]  # a table name, by contract
    module = importlib.import_module(f"{__package__}.catalogues.{row.catalogue or row.checked_by}")
    found: tuple[Misuse, ...] = module.MISUSES
    return found


def misuse_by_name(name: str, collective: str | None = None) -> Misuse:
    """Entry ``name`` of ``collective`` (``None``: of the first collective having one)."""
    for c in (collective,) if collective else NAMES:
        for m in entries_of(c):
            if m.name == name:
                return m
    raise KeyError(name)


class _Kinds(Mapping[str, tuple[str, ...]]):
    def __getitem__(self, collective: str) -> tuple[str, ...]:
        return tuple(m.name for m in entries_of(collective))

    def __iter__(self) -> Iterator[str]:
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


MISUSE_KINDS: Final[Mapping[str, tuple[str, ...]]] = _Kinds()
"""Every collective's entry names."""


# --- the gate's misuse case: run, judge, check -------------------------------------------------


@dataclass(frozen=True)
class MisuseCase:
    """Entry ``kind`` of ``collective`` on ``world_size`` ranks, rank ``odd`` wrong,
    ``impl``'s collective (``MODULE`` or ``MODULE:ATTR``) under ``emulate``."""

    collective: str
    kind: str
    world_size: int = 3
    odd: int = 1
    impl: str = "vargather"
    emulate: str | None = None

    @property
    def entry(self) -> Misuse:
        return misuse_by_name(self.kind, self.collective)


class GatherMisuseCase(MisuseCase):
    """A ``MisuseCase`` of ``all_gather_v`` as the gather's catalogue builds it."""

    def __init__(
        self,
        kind: str,
        world_size: int,
        odd: int = 0,
        emulate: str | None = None,
        collective: str = next(iter(COLLECTIVES)),
        impl: str = "vargather",
    ) -> None:
        super().__init__(collective, kind, world_size, odd, impl, emulate)


RaisedError = tuple[str, str, tuple[int, ...]]
"""What a rank raised: class name, message, the ranks the error blames."""
Report = tuple[RaisedError | None, CallOutput | str | None]
"""A rank's report: what the misused call raised, and the next call's output (its
error in words; ``None``: not run)."""


def run_follow_up(ctx: Any, case: MisuseCase) -> CallOutput | str | None:
    """Rank side: the next call on the group (``Misuse.follow_up``), or its error."""
    emulation(case.emulate)
    try:
        return run_call(ctx, case.entry.follow_up(case.world_size), case.impl)
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def run_misuse(ctx: Any, case: MisuseCase) -> Report:
    """Rank side: the misused call, then (unless a rank was absent) the next call."""
    emulation(case.emulate)
    error: RaisedError | None = None
    try:
        run_call(ctx, case.entry.build(case.world_size, case.odd), case.impl)
    except Exception as err:
        error = (type(err).__name__, str(err), tuple(getattr(err, "ranks", ())))
    return error, None if case.entry.absent else run_follow_up(ctx, case)


def judge_misuse(case: MisuseCase, reports: Sequence[Report]) -> list[Failure]:
    """The entry's failures: every rank its error class, with one message holding its
    fragments and naming its blamed ranks; every next call right, bit for bit."""
    entry, w, o = case.entry, case.world_size, case.odd
    expected, blamed = entry.error.__name__, entry.blamed_ranks(w, o)
    failures: list[Failure] = []

    def fail(ranks: Sequence[int], message: str, aspect: str = "call") -> None:
        failures.append(
            Failure(
                aspect, "mismatch", f"{entry.name}: {message}", tuple(ranks), w, case.collective
            )
        )

    callers = [r for r in range(w) if not (entry.absent and r == o)]
    errors = {r: reports[r][0] for r in callers}
    if entry.absent and reports[o][0] is not None:
        fail([o], f"the absent rank raised {reports[o][0]}")
    quiet = [r for r, e in errors.items() if e is None]
    if quiet:
        fail(quiet, f"expected {expected} on every rank, got no error")
        return failures
    raised = [e for e in errors.values() if e is not None]
    kinds = sorted({e[0] for e in raised})
    if kinds != [expected]:
        fail(callers, f"expected {expected} on every rank, got {kinds}")
    messages = sorted({e[1] for e in raised})
    if len(messages) != 1 and not entry.absent:
        fail(callers, f"expected one message on every rank, got {messages}")
    for r, e in errors.items():
        assert e is not None
        want = [*entry.fragments(w, o), *([f"on rank {r} of {w} timed out"] * entry.absent)]
        want += [f"rank {b}" for b in blamed if not any(s in e[1] for s in (f"[{b}", f" {b}]"))]
        missing = [f for f in want if f not in e[1]]
        if missing:
            fail([r], f"expected {missing} in the message {e[1]!r}")
        if e[2] != blamed:
            fail([r], f"expected the error to blame {list(blamed)}, got {list(e[2])}")
    return failures + judge_follow_up(case, [after for _, after in reports])


def judge_follow_up(case: MisuseCase, afters: Sequence[CallOutput | str | None]) -> list[Failure]:
    """The next call right on every rank: output and gradient bit for bit."""
    if all(a is None for a in afters):
        return []
    name, w = case.entry.name, case.world_size
    want, grads = expected_of(case.entry.follow_up(w))
    failures = []
    for r, after in enumerate(afters):
        if not isinstance(after, CallOutput):
            why = f"{name}: the next call on the group raised {after}"
            failures.append(Failure("call", "error", why, (r,), w, case.collective))
            continue
        for aspect, got, right in (
            ("output", after.output, want[r]),
            ("gradient", after.grad, grads[r]),
        ):
            gots, rights = (v if isinstance(v, list) else [v] for v in (got, right))
            diff = next(
                (d for g, e in zip(gots, rights, strict=False) if (d := bitwise_difference(g, e))),
                None,
            )
            if len(gots) != len(rights):
                diff = f"{len(gots)} tensors, expected {len(rights)}"
            if diff is not None:
                why = f"{name}: the next call on the group: {aspect} {diff}"
                failures.append(Failure(aspect, "mismatch", why, (r,), w, case.collective))
    return failures


def check_misuse(pool: Any, case: MisuseCase) -> list[Failure]:
    """The misuse property on ``pool``: on the same world (its generation unchanged),
    except after an absent rank: then a rebuilt one."""
    generation = pool.generation
    reports = pool.run(run_misuse, case)
    if case.entry.absent:
        pool.restart()
        generation = pool.generation
        afters = pool.run(run_follow_up, case)
        reports = [(e, a) for (e, _), a in zip(reports, afters, strict=True)]
    failures = judge_misuse(case, reports)
    if pool.generation != generation:
        failures.append(Failure("call", "crash", "the pool rebuilt its world", (), case.world_size))
    return failures

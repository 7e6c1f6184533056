"""The kit's one misuse catalogue: every collective's wrong calls and the error each must raise.

Where it sits: in the testing kit, above ``family`` (the family's case models and
importer) and beneath the catalogues, whose ``misuse`` rows draw from here:
``all_gather_v``'s from ``CATALOGUE`` (``GatherMisuseCase``, ``check_gather_misuse``),
the family's from ``MISUSE_KINDS`` (``MisuseCase``, ``check_misuse``);
``FAMILY_CATALOGUE`` states the family's misuses scenario by scenario for the suite.
``tests/test_misuse.py``, ``tests/test_faults.py``, the per-collective tests and
``fuzz/fuzz_multirank.py`` import it as ``vargather.testing.misuse``.

A ``Call`` says what one rank passes to ``vargather.all_gather_v``; a ``Scenario`` is one
``Call`` per rank. Everything is a small frozen dataclass, so it pickles to the ranks
of the pool, and every tensor is rebuilt on the rank from its description
(``TensorSpec``), deterministically, so the parent can build the oracle's answer from
the same descriptions.

``CATALOGUE`` lists the misuse classes: each entry builds the scenario for a world
size and an offending rank, and states the error class every rank must raise and the
fragments its message must contain (the offending rank, what was expected, what was
got). ``FAMILY_CATALOGUE`` does the same for ``reduce_scatter_v``, ``all_to_all_v``
and ``all_gather_list`` (a ``FamilyScenario`` of ``FamilyArgs``, run by ``run_family``).
The pool pickles ``fn`` by reference, so everything the ranks call lives at
module level here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import torch
from hypothesis import strategies as st

import vargather
from vargather import oracle

from .collectives import FAMILY as FAMILY_OF_THE_TABLE
from .family import COLLECTIVES, emulation, failed, function_of, sized
from .judge import Failure
from .pool import RankContext, RankPool

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


@dataclass(frozen=True)
class Call:
    """What one rank passes. ``x`` is a ``TensorSpec`` or any picklable non-tensor;
    ``group`` a tuple of world ranks forming a subgroup (created on every rank, as
    ``new_group`` requires) or ``None`` for the world."""

    x: object
    dim: object = 0
    sizes: object = None
    grad: object = "sum"
    transport: object = "auto"
    validate: object = True
    timeout: object = None
    group: tuple[int, ...] | None = None
    backward: bool = False


@dataclass(frozen=True)
class Scenario:
    calls: tuple[Call, ...]

    @property
    def world_size(self) -> int:
        return len(self.calls)


@dataclass(frozen=True)
class GatherOutput:
    """What a rank returns from a gather: the output and this rank's input gradient."""

    output: torch.Tensor
    grad: torch.Tensor | None
    layout_sizes: tuple[int, ...]


def build_x(spec: object, rank: int) -> object:
    return spec.build(rank) if isinstance(spec, TensorSpec) else spec


def _build_sizes(sizes: object) -> object:
    return sizes.build() if isinstance(sizes, SizesTensor) else sizes


def upstream_for(shape: Sequence[int], dtype: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient: small integers, different on every rank."""
    n = math.prod(shape)
    g = (torch.arange(n, dtype=torch.float64) * (rank + 2) % 7 - 3).reshape(tuple(shape))
    return g.to(getattr(torch, dtype))


# --- rank-side functions ----------------------------------------------------------------


def run_call(ctx: Any, scenario: Scenario) -> GatherOutput:
    """Rank ``ctx.rank`` makes its call of ``scenario``; raises what vargather raises."""
    call = scenario.calls[ctx.rank]
    group: Any = None
    if call.group is not None:
        group = ctx.subgroup(list(call.group))
    x = build_x(call.x, ctx.rank)
    wrong: Any = call  # deliberately anything: misuse is the point
    result = vargather.all_gather_v_with_layout(
        x,  # type: ignore[arg-type]  # any object: misuse is the point
        wrong.dim,
        sizes=_build_sizes(wrong.sizes),  # type: ignore[arg-type]  # any object, as above
        group=group,
        grad=wrong.grad,
        transport=wrong.transport,
        validate=wrong.validate,
        timeout=wrong.timeout,
    )
    grad = None
    if call.backward:
        assert isinstance(x, torch.Tensor)
        out = result.tensor
        up = upstream_for(out.shape, str(out.dtype).removeprefix("torch."), ctx.rank)
        torch.autograd.backward([out], [up])
        grad = x.grad
    return GatherOutput(result.tensor.detach(), grad, result.layout.sizes)


def valid_scenario(world_size: int, seed: int = 7, dim: int = 1) -> Scenario:
    """A correct ragged gather (sizes 0, 1, 2, ... along ``dim``), with gradients."""
    calls = []
    for r in range(world_size):
        shape = [2, 3, 2]
        shape[dim] = (r * 2 + seed) % 4
        spec = TensorSpec(tuple(shape), "float64", requires_grad=True, seed=seed)
        calls.append(Call(spec, dim=dim, grad="sum", backward=True))
    return Scenario(tuple(calls))


def expected_of(scenario: Scenario) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """The oracle's output and per-rank input gradients for a valid scenario."""
    shards = []
    for r, call in enumerate(scenario.calls):
        x = build_x(call.x, r)
        assert isinstance(x, torch.Tensor)
        shards.append(x.detach())
    dim = scenario.calls[0].dim
    assert isinstance(dim, int)
    out = oracle.expected_output(shards, dim)
    first = scenario.calls[0]
    if not first.backward:
        return out, [None] * len(shards)
    spec = first.x
    assert isinstance(spec, TensorSpec)
    ups = [upstream_for(out.shape, spec.dtype, r) for r in range(len(shards))]
    grads = oracle.expected_input_grads(shards, ups, dim, str(first.grad))
    return out, list(grads)


# --- the catalogue -------------------------------------------------------------------


@dataclass(frozen=True)
class Misuse:
    """One class of misuse.

    ``build(world_size, offender)`` returns the scenario; ``error`` is the class every
    rank must raise; ``fragments(world_size, offender)`` the strings its message must
    contain (the offending rank(s), the expected and the got values). ``all_ranks``:
    the mistake is made on every rank (the offender argument is ignored).
    """

    name: str
    summary: str
    error: type[vargather.VarGatherError]
    build: Callable[[int, int], Scenario]
    fragments: Callable[[int, int], tuple[str, ...]]
    all_ranks: bool = False
    blamed: Callable[[int, int], tuple[int, ...]] | None = None

    def blamed_ranks(self, world_size: int, offender: int) -> tuple[int, ...]:
        if self.blamed is not None:
            return self.blamed(world_size, offender)
        if self.all_ranks:
            return tuple(range(world_size))
        if world_size == 2 and self.error_is_a_tie:
            return (0, 1)
        return (offender,)

    @property
    def error_is_a_tie(self) -> bool:
        """Cross-rank disagreements between 2 ranks have no majority: both are named."""
        return issubclass(self.error, vargather.MismatchError) and not issubclass(
            self.error, vargather.SizesMismatchError
        )


def _size(rank: int) -> int:
    return (2, 0, 3, 1)[rank % 4]


def _scenario(
    world_size: int,
    offender: int,
    good: Callable[[int], Call],
    bad: Callable[[int], Call] | None = None,
) -> Scenario:
    calls = []
    for r in range(world_size):
        calls.append(bad(r) if bad is not None and r == offender else good(r))
    return Scenario(tuple(calls))


def _plain(r: int, dtype: str = "float32", trail: tuple[int, ...] = (2,), **kw: Any) -> Call:
    return Call(TensorSpec((_size(r), *trail), dtype), **kw)


def _true_sizes(world_size: int) -> list[int]:
    return [_size(r) for r in range(world_size)]


def _dtype_pair(a: str, b: str) -> Misuse:
    return Misuse(
        name=f"dtype-{a}-vs-{b}",
        summary=f"one rank passes {b} where the others pass {a}",
        error=vargather.DTypeMismatchError,
        build=lambda w, o: _scenario(w, o, lambda r: _plain(r, a), lambda r: _plain(r, b)),
        fragments=lambda w, o: ("dtype differs", f"torch.{a}", f"torch.{b}", f"rank(s) [{o}]"),
    )


def _sizes_lie(world_size: int, offender: int) -> list[int]:
    lie = _true_sizes(world_size)
    other = (offender + 1) % world_size
    lie[other] += 1
    return lie


CATALOGUE: Final[tuple[Misuse, ...]] = (
    _dtype_pair("float32", "int32"),
    _dtype_pair("float16", "bfloat16"),
    _dtype_pair("int64", "float64"),
    _dtype_pair("float32", "float64"),
    Misuse(
        name="ndim-differs",
        summary="one rank passes a tensor with one more dimension",
        error=vargather.ShapeMismatchError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, trail=(2, 1))),
        fragments=lambda w, o: ("ndim differs", "2", "3", f"rank(s) [{o}]"),
    ),
    Misuse(
        name="trailing-dim-differs",
        summary="a dimension other than the gather dimension differs on one rank",
        error=vargather.ShapeMismatchError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, trail=(3,))),
        fragments=lambda w, o: (
            "shape outside the gather dimension",
            "(*, 2)",
            "(*, 3)",
            f"[{o}]",
            "* is the gather dimension, dim=0; full shapes: rank 0 (",
            f"rank {o} (",
        ),
    ),
    Misuse(
        name="dim-out-of-range-on-one-rank",
        summary="dim is out of range on one rank",
        error=vargather.DimError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, dim=5)),
        fragments=lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=5", "expected -2 <= dim < 2"),
    ),
    Misuse(
        name="dim-out-of-range-on-every-rank",
        summary="dim is out of range on every rank",
        error=vargather.DimError,
        build=lambda w, o: _scenario(w, o, lambda r: _plain(r, dim=-3)),
        fragments=lambda w, o: (
            f"rank(s) {list(range(w))}",
            "dim=-3 is out of range",
            "expected -2 <= dim < 2",
        ),
        all_ranks=True,
    ),
    Misuse(
        name="dim-huge",
        summary="dim does not even fit in int64 on one rank",
        error=vargather.DimError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, dim=2**70)),
        fragments=lambda w, o: (f"rank {o}: dim=9223372036854775807 (or more)", "expected -2"),
    ),
    Misuse(
        name="dim-not-an-int",
        summary="dim is a float on one rank",
        error=vargather.DimError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, dim=0.0)),
        fragments=lambda w, o: (f"rank {o}: expected dim to be an int, got float 0.0",),
    ),
    Misuse(
        name="dim-differs",
        summary="ranks gather along different dimensions (each valid locally)",
        error=vargather.ArgumentMismatchError,
        build=lambda w, o: _scenario(
            w,
            o,
            lambda r: Call(TensorSpec((_size(r), 2)), dim=0),
            lambda r: Call(TensorSpec((2, _size(r))), dim=1),
        ),
        fragments=lambda w, o: ("gather dimension", "0", "1", f"rank(s) [{o}]"),
    ),
    Misuse(
        name="sizes-wrong-length",
        summary="sizes has one entry too many on one rank",
        error=vargather.SizesError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, sizes=[*_true_sizes(w), 1])),
        fragments=lambda w, o: (f"rank {o}: expected len(sizes) == world size {w}, got {w + 1}",),
    ),
    Misuse(
        name="sizes-wrong-own-entry",
        summary="sizes is wrong about the rank's own tensor",
        error=vargather.SizesError,
        build=lambda w, o: _scenario(
            w,
            o,
            _plain,
            lambda r: _plain(
                r, sizes=[n + (i == r) for i, n in enumerate(_true_sizes(w))], validate=True
            ),
        ),
        fragments=lambda w, o: (
            f"rank {o}: expected sizes[{o}] == {_size(o)}",
            f"got sizes[{o}] = {_size(o) + 1}",
        ),
    ),
    Misuse(
        name="sizes-negative",
        summary="sizes holds a negative entry on one rank",
        error=vargather.SizesError,
        build=lambda w, o: _scenario(
            w,
            o,
            _plain,
            lambda r: _plain(r, sizes=[-1 if i != r else n for i, n in enumerate(_true_sizes(w))]),
        ),
        fragments=lambda w, o: (f"rank {o}: sizes must be >= 0", "= -1"),
    ),
    Misuse(
        name="sizes-not-integers",
        summary="sizes holds a float on one rank",
        error=vargather.SizesTypeError,
        build=lambda w, o: _scenario(
            w, o, _plain, lambda r: _plain(r, sizes=[float(n) for n in _true_sizes(w)])
        ),
        fragments=lambda w, o: (f"rank {o}: sizes must hold integers", "sizes[0] = float"),
    ),
    Misuse(
        name="sizes-float-tensor",
        summary="sizes is a float tensor on one rank",
        error=vargather.SizesTypeError,
        build=lambda w, o: _scenario(
            w,
            o,
            _plain,
            lambda r: _plain(r, sizes=SizesTensor(tuple(_true_sizes(w)), "float32")),
        ),
        fragments=lambda w, o: (f"rank {o}: sizes must hold integers", "a tensor of dtype float32"),
    ),
    Misuse(
        name="sizes-2d-tensor",
        summary="sizes is a 2-d integer tensor on one rank",
        error=vargather.SizesError,
        build=lambda w, o: _scenario(
            w,
            o,
            _plain,
            lambda r: _plain(r, sizes=SizesTensor(tuple(_true_sizes(w)), "int64", (1, w))),
        ),
        fragments=lambda w, o: (f"rank {o}: sizes must be a 1-d integer tensor", f"(1, {w})"),
    ),
    Misuse(
        name="sizes-a-string",
        summary="sizes is a string on one rank",
        error=vargather.SizesTypeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, sizes="2,0,3")),
        fragments=lambda w, o: (f"rank {o}: sizes must hold integers", "str"),
    ),
    Misuse(
        name="sizes-lie-about-a-peer",
        summary="sizes is right about the rank itself but wrong about a peer",
        error=vargather.SizesMismatchError,
        build=lambda w, o: _scenario(
            w,
            o,
            lambda r: _plain(r, sizes=_true_sizes(w)),
            lambda r: _plain(r, sizes=_sizes_lie(w, o)),
        ),
        fragments=lambda w, o: (
            f"sizes passed on rank(s) [{o}] contradict the tensors",
            f"expected sizes={_true_sizes(w)}",
            f"rank {o} passed sizes={_sizes_lie(w, o)}",
        ),
    ),
    Misuse(
        name="sizes-passed-on-one-rank-only-and-wrong",
        summary="only one rank passes sizes, and they lie about a peer",
        error=vargather.SizesMismatchError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, sizes=_sizes_lie(w, o))),
        fragments=lambda w, o: (
            f"expected sizes={_true_sizes(w)}",
            f"rank {o} passed sizes={_sizes_lie(w, o)}",
        ),
    ),
    Misuse(
        name="zero-dim-input",
        summary="one rank passes a 0-d tensor",
        error=vargather.InputShapeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: Call(TensorSpec(()))),
        fragments=lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d"),
    ),
    Misuse(
        name="too-many-dims",
        summary="one rank passes a 33-d tensor",
        error=vargather.InputShapeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: Call(TensorSpec((1,) * 33))),
        fragments=lambda w, o: (f"rank {o}: expected at most 32 dimensions, got 33",),
    ),
    Misuse(
        name="not-a-tensor",
        summary="one rank passes a list",
        error=vargather.InputTypeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: Call([1.0, 2.0])),
        fragments=lambda w, o: (f"rank {o}: expected a torch.Tensor, got list",),
    ),
    Misuse(
        name="none-input",
        summary="one rank passes None",
        error=vargather.InputTypeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: Call(None)),
        fragments=lambda w, o: (f"rank {o}: expected a torch.Tensor, got NoneType",),
    ),
    Misuse(
        name="dtype-gloo-cannot-carry",
        summary="one rank passes a float8 tensor, which gloo cannot carry",
        error=vargather.InputTypeError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, "float8_e4m3fn")),
        fragments=lambda w, o: (f"rank {o}: dtype float8_e4m3fn cannot be gathered", "float32"),
    ),
    Misuse(
        name="sparse-input",
        summary="one rank passes a sparse COO tensor",
        error=vargather.InputTypeError,
        build=lambda w, o: _scenario(
            w, o, _plain, lambda r: Call(TensorSpec((_size(r), 2), layout="sparse"))
        ),
        fragments=lambda w, o: (f"rank {o}: expected a dense (torch.strided)", "sparse_coo"),
    ),
    Misuse(
        name="meta-device",
        summary="one rank passes a tensor on the meta device",
        error=vargather.InputTypeError,
        build=lambda w, o: _scenario(
            w, o, _plain, lambda r: Call(TensorSpec((_size(r), 2), device="meta"))
        ),
        fragments=lambda w, o: (f"rank {o}: expected a tensor on a device", "got a meta tensor"),
    ),
    Misuse(
        name="requires-grad-differs-sum",
        summary="under grad='sum' one rank needs a gradient and its peers do not",
        error=vargather.RequiresGradMismatchError,
        build=lambda w, o: _scenario(
            w,
            o,
            lambda r: Call(TensorSpec((_size(r), 2), "float64"), grad="sum"),
            lambda r: Call(TensorSpec((_size(r), 2), "float64", requires_grad=True), grad="sum"),
        ),
        fragments=lambda w, o: ("requires_grad", "grad='sum'", "True", "False", f"[{o}]"),
        blamed=lambda w, o: (0, 1) if w == 2 else (o,),
    ),
    Misuse(
        name="requires-grad-differs-mean",
        summary="under grad='mean' one rank does not need a gradient and its peers do",
        error=vargather.RequiresGradMismatchError,
        build=lambda w, o: _scenario(
            w,
            o,
            lambda r: Call(TensorSpec((_size(r), 2), "float64", requires_grad=True), grad="mean"),
            lambda r: Call(TensorSpec((_size(r), 2), "float64"), grad="mean"),
        ),
        fragments=lambda w, o: ("requires_grad", "grad='mean'", "True", "False", f"[{o}]"),
        blamed=lambda w, o: (0, 1) if w == 2 else (o,),
    ),
    Misuse(
        name="grad-contract-differs",
        summary="one rank asks for grad='local', its peers for grad='sum'",
        error=vargather.ArgumentMismatchError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, grad="local")),
        fragments=lambda w, o: ("gradient contract", "'sum'", "'local'", f"rank(s) [{o}]"),
    ),
    Misuse(
        name="grad-contract-unknown",
        summary="one rank passes an unknown gradient contract",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, grad="avg")),
        fragments=lambda w, o: (f"rank {o}: grad must be one of 'sum', 'local', 'mean'", "'avg'"),
    ),
    Misuse(
        name="transport-differs",
        summary="one rank forces another transport",
        error=vargather.ArgumentMismatchError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, transport="padded")),
        fragments=lambda w, o: ("transport differs", "'auto'", "'padded'", f"rank(s) [{o}]"),
    ),
    Misuse(
        name="transport-unknown",
        summary="one rank passes an unknown transport",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, transport="ring")),
        fragments=lambda w, o: (f"rank {o}: transport must be one of", "'ring'"),
    ),
    Misuse(
        name="transport-unavailable-on-gloo",
        summary="one rank forces transport='views', which gloo cannot run",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, transport="views")),
        fragments=lambda w, o: (f"rank {o}: transport='views'", "gloo"),
    ),
    Misuse(
        name="validate-not-a-bool",
        summary="one rank passes validate='yes'",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, validate="yes")),
        fragments=lambda w, o: (f"rank {o}: validate must be a bool, got str 'yes'",),
    ),
    Misuse(
        name="timeout-below-a-millisecond",
        summary="one rank passes timeout=1e-130 (gloo would round it to 0 ms: expire at once)",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, timeout=1e-130)),
        fragments=lambda w, o: (f"rank {o}: timeout must be None", "from 0.001 s", "1e-130"),
    ),
    Misuse(
        name="timeout-invalid",
        summary="one rank passes a negative timeout",
        error=vargather.ArgumentError,
        build=lambda w, o: _scenario(w, o, _plain, lambda r: _plain(r, timeout=-1.0)),
        fragments=lambda w, o: (f"rank {o}: timeout must be None, or a number of seconds", "-1.0"),
    ),
)
"""Every misuse class, each raised as the same error on every rank."""


def misuse_by_name(name: str) -> Misuse:
    for m in CATALOGUE:
        if m.name == name:
            return m
    raise KeyError(name)


def with_calls(scenario: Scenario, rank: int, **changes: Any) -> Scenario:
    """``scenario`` with rank ``rank``'s call changed."""
    calls = list(scenario.calls)
    calls[rank] = replace(calls[rank], **changes)
    return Scenario(tuple(calls))


# --- the family's catalogue: reduce_scatter_v, all_to_all_v, all_gather_list -----------


FAMILY: Final = FAMILY_OF_THE_TABLE
"""The family's collectives (``collectives.FAMILY``, from the library's table)."""


@dataclass(frozen=True)
class FamilyArgs:
    """What one rank passes to a family collective. ``sizes`` is ``reduce_scatter_v``'s
    ``sizes`` or ``all_to_all_v``'s ``send_sizes``; ``x`` a ``TensorSpec`` or any
    picklable non-tensor. ``collective``: this rank calls another collective than the
    scenario's (a mixed call; also ``all_gather_v`` and ``all_gather_v_coalesced``, of
    ``[x, x]``)."""

    x: object
    sizes: object = None
    recv_sizes: object = None
    shapes: object = None
    dim: object = 0
    grad: object = "sum"
    validate: object = True
    timeout: object = None
    collective: str | None = None


@dataclass(frozen=True)
class FamilyScenario:
    """One ``FamilyArgs`` per rank of a ``collective`` call; ``absent``: a rank that
    never makes its call."""

    collective: str
    calls: tuple[FamilyArgs, ...]
    absent: int | None = None

    @property
    def world_size(self) -> int:
        return len(self.calls)


def call_family(collective: str, call: FamilyArgs, rank: int) -> Any:
    """Rank ``rank`` makes ``call`` of ``collective``; raises what vargather raises."""
    x: Any = build_x(call.x, rank)
    sizes: Any = _build_sizes(call.sizes)
    dim: Any = call.dim
    validate: Any = call.validate
    timeout: Any = call.timeout
    collective = call.collective or collective
    if collective == "all_gather_v":
        return vargather.all_gather_v(x, dim, validate=validate, timeout=timeout)
    if collective == "all_gather_v_coalesced":
        return vargather.all_gather_v_coalesced([x, x], dim, validate=validate, timeout=timeout)
    if collective == "reduce_scatter_v":
        return vargather.reduce_scatter_v(x, sizes, dim, validate=validate, timeout=timeout)
    if collective == "all_to_all_v":
        recv: Any = _build_sizes(call.recv_sizes)
        return vargather.all_to_all_v(
            x, sizes, dim, recv_sizes=recv, validate=validate, timeout=timeout
        )
    shapes: Any = call.shapes
    grad: Any = call.grad
    return vargather.all_gather_list(
        x, shapes=shapes, grad=grad, validate=validate, timeout=timeout
    )


def run_family(ctx: Any, scenario: FamilyScenario) -> Any:
    """Rank ``ctx.rank`` makes its call of ``scenario`` (``None`` on the absent rank):
    the output detached (a list of tensors for ``all_gather_list``)."""
    if ctx.rank == scenario.absent:
        return None
    out = call_family(scenario.collective, scenario.calls[ctx.rank], ctx.rank)
    if isinstance(out, (list, tuple)):
        return [t.detach() for t in out]
    return out.detach()


def family_expected(scenario: FamilyScenario) -> list[Any]:
    """The oracle's output per rank for a valid scenario (every rank's inputs rebuilt
    from their descriptions, ``dim`` as rank 0 passed it)."""
    xs = []
    for r, call in enumerate(scenario.calls):
        x = build_x(call.x, r)
        assert isinstance(x, torch.Tensor)
        xs.append(x.detach())
    first = scenario.calls[0]
    if scenario.collective == "all_gather_list":
        gathered = oracle.expected_gather_list(xs)
        return [gathered for _ in xs]
    dim = first.dim
    assert isinstance(dim, int)
    if scenario.collective == "reduce_scatter_v":
        sizes = _build_sizes(first.sizes)
        assert isinstance(sizes, (list, tuple, torch.Tensor))
        return list(oracle.expected_reduce_scatter(xs, [int(n) for n in sizes], dim))
    send = []
    for call in scenario.calls:
        row = _build_sizes(call.sizes)
        assert isinstance(row, (list, tuple, torch.Tensor))
        send.append([int(n) for n in row])
    return list(oracle.expected_all_to_all(xs, send, dim))


@dataclass(frozen=True)
class FamilyMisuse:
    """One class of misuse of a family collective, as ``Misuse`` for ``all_gather_v``.

    ``absent``: the offender never calls; its peers raise ``error`` (the named
    timeout) and the world is rebuilt after.
    """

    name: str
    collective: str
    summary: str
    error: type[vargather.VarGatherError]
    build: Callable[[int, int], FamilyScenario]
    fragments: Callable[[int, int], tuple[str, ...]]
    blamed: Callable[[int, int], tuple[int, ...]] | None = None
    absent: bool = False

    def blamed_ranks(self, world_size: int, offender: int) -> tuple[int, ...]:
        if self.blamed is not None:
            return self.blamed(world_size, offender)
        tie = issubclass(self.error, vargather.MismatchError) and not issubclass(
            self.error, vargather.SizesMismatchError
        )
        return (0, 1) if world_size == 2 and tie else (offender,)


def _tie(w: int, o: int) -> tuple[int, ...]:
    """Two ranks disagreeing have no majority: both are named."""
    return (0, 1) if w == 2 else (o,)


def rs_sizes(w: int) -> list[int]:
    """The base ``reduce_scatter_v`` sizes: 2, 0, 3 (one empty block)."""
    return [(2, 0, 3, 1)[r] for r in range(w)]


def _rs(
    r: int,
    w: int,
    *,
    rows: int | None = None,
    trail: tuple[int, ...] = (2,),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kw: Any,
) -> FamilyArgs:
    n = sum(rs_sizes(w)) if rows is None else rows
    kw.setdefault("sizes", rs_sizes(w))
    return FamilyArgs(TensorSpec((n, *trail), dtype, requires_grad=requires_grad), **kw)


def a2a_send(w: int, r: int) -> list[int]:
    """Rank ``r``'s base send sizes (a matrix with zeros in it)."""
    return [(r + 2 * j) % 3 for j in range(w)]


def a2a_recv(w: int, r: int) -> list[int]:
    """Rank ``r``'s true receive sizes: column ``r`` of the send matrix."""
    return [a2a_send(w, j)[r] for j in range(w)]


def _a2a(
    r: int,
    w: int,
    *,
    extra_rows: int = 0,
    trail: tuple[int, ...] = (2,),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kw: Any,
) -> FamilyArgs:
    kw.setdefault("sizes", a2a_send(w, r))
    n = sum(a2a_send(w, r)) + extra_rows
    return FamilyArgs(TensorSpec((n, *trail), dtype, requires_grad=requires_grad), **kw)


def list_shape(r: int) -> tuple[int, int]:
    """Rank ``r``'s base ``all_gather_list`` shape: every dimension differs, one empty."""
    return ((2, 3), (0, 1), (4, 2), (1, 1))[r]


def list_shapes(w: int) -> list[list[int]]:
    return [list(list_shape(r)) for r in range(w)]


def _list(
    r: int,
    w: int,
    *,
    extra: tuple[int, ...] = (),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kw: Any,
) -> FamilyArgs:
    return FamilyArgs(
        TensorSpec((*list_shape(r), *extra), dtype, requires_grad=requires_grad), **kw
    )


def _family_scenario(
    collective: str,
    w: int,
    o: int,
    good: Callable[[int, int], FamilyArgs],
    bad: Callable[[int, int], FamilyArgs] | None = None,
    absent: bool = False,
) -> FamilyScenario:
    calls = tuple(bad(r, w) if bad is not None and r == o else good(r, w) for r in range(w))
    return FamilyScenario(collective, calls, o if absent else None)


def _family_entry(
    collective: str,
    name: str,
    summary: str,
    error: type[vargather.VarGatherError],
    bad: Callable[[int, int], FamilyArgs] | None,
    fragments: Callable[[int, int], tuple[str, ...]],
    *,
    good: Callable[[int, int], FamilyArgs] | None = None,
    blamed: Callable[[int, int], tuple[int, ...]] | None = None,
    absent: bool = False,
) -> FamilyMisuse:
    base = (
        good
        or {
            "reduce_scatter_v": _rs,
            "all_to_all_v": _a2a,
            "all_gather_list": _list,
            "all_gather_v": _gather,
        }[collective]
    )
    return FamilyMisuse(
        name=name,
        collective=collective,
        summary=summary,
        error=error,
        build=lambda w, o: _family_scenario(collective, w, o, base, bad, absent),
        fragments=fragments,
        blamed=blamed,
        absent=absent,
    )


ABSENT_TIMEOUT: Final = 2.0
"""The per-call timeout of the ``absent`` entries: what the peers wait for the rank
that never arrives."""


def _rs_entry(name: str, *args: Any, **kw: Any) -> FamilyMisuse:
    return _family_entry("reduce_scatter_v", name, *args, **kw)


def _a2a_entry(name: str, *args: Any, **kw: Any) -> FamilyMisuse:
    return _family_entry("all_to_all_v", name, *args, **kw)


def _list_entry(name: str, *args: Any, **kw: Any) -> FamilyMisuse:
    return _family_entry("all_gather_list", name, *args, **kw)


def _gather(r: int, w: int, **kw: Any) -> FamilyArgs:
    """A plain ragged ``all_gather_v`` shard (sizes 2, 0, 3, 1)."""
    return FamilyArgs(TensorSpec((_size(r), 2)), **kw)


def _mixed_entry(
    name: str,
    collective: str,
    other: str,
    error: type[vargather.VarGatherError],
    fragments: Callable[[int, int], tuple[str, ...]],
    bad: Callable[[int, int], FamilyArgs],
) -> FamilyMisuse:
    """The offender calls ``other`` (with its own valid arguments) where its peers call
    ``collective``: a mismatch every rank sees in the one metadata round."""
    return _family_entry(
        collective,
        name,
        f"one rank calls {other} while its peers call {collective}",
        error,
        lambda r, w: replace(bad(r, w), collective=other),
        fragments,
        blamed=_tie,
    )


def _mixed_family_fragments(bad: str, good: str) -> Callable[[int, int], tuple[str, ...]]:
    return lambda w, o: (
        "reduce_scatter_v / all_to_all_v: collective differs across ranks",
        f"'{bad}' on rank(s) [{o}]",
        f"'{good}'",
        "call the same collective on every rank",
    )


def _reversed_sizes(w: int) -> list[int]:
    return list(reversed(rs_sizes(w)))


def _a2a_recv_lie(w: int, o: int) -> list[int]:
    lie = a2a_recv(w, o)
    lie[(o + 1) % w] += 1
    return lie


def _a2a_matrix(w: int) -> list[list[int]]:
    return [a2a_send(w, j) for j in range(w)]


def _list_shapes_lie(w: int, o: int) -> list[list[int]]:
    lie = list_shapes(w)
    lie[(o + 1) % w] = [5, 5]
    return lie


def _list_shapes_extra_dim(w: int, o: int) -> list[list[int]]:
    lie = list_shapes(w)
    lie[(o + 1) % w] = [*lie[(o + 1) % w], 7]
    return lie


def _absent_fragments(what: str) -> Callable[[int, int], tuple[str, ...]]:
    return lambda w, o: (
        what,
        f"rank(s) [{o}] never arrived at this collective",
        "metadata exchange)",
        f"within {ABSENT_TIMEOUT:g} s (this call's timeout)",
        "destroy it and create a new one",
    )


FAMILY_CATALOGUE: Final[tuple[FamilyMisuse, ...]] = (
    # reduce_scatter_v(x, sizes, dim): the same sizes, shape and dtype on every rank
    _rs_entry(
        "rs-sizes-differ",
        "sizes differ across ranks (each adds up to the rows of its tensor)",
        vargather.SizesMismatchError,
        lambda r, w: _rs(r, w, sizes=_reversed_sizes(w)),
        lambda w, o: (
            "sizes differs across ranks",
            f"sizes={rs_sizes(w)}",
            f"sizes={_reversed_sizes(w)}",
            f"[{o}]",
        ),
        blamed=_tie,
    ),
    _rs_entry(
        "rs-sum-mismatch",
        "sum(sizes) does not match x.shape[dim] on one rank (one more row)",
        vargather.SizesError,
        lambda r, w: _rs(r, w, rows=sum(rs_sizes(w)) + 1),
        lambda w, o: (
            f"rank(s) [{o}]",
            f"rank {o}: expected sum(sizes) == {sum(rs_sizes(w)) + 1}",
            f"got sum(sizes) = {sum(rs_sizes(w))}",
        ),
    ),
    _rs_entry(
        "rs-sizes-wrong-length",
        "sizes has one entry too many on one rank",
        vargather.SizesError,
        lambda r, w: _rs(r, w, sizes=[*rs_sizes(w), 0]),
        lambda w, o: (f"rank {o}: expected len(sizes) == world size {w}, got {w + 1}",),
    ),
    _rs_entry(
        "rs-sizes-missing",
        "one rank passes sizes=None",
        vargather.SizesError,
        lambda r, w: _rs(r, w, sizes=None),
        lambda w, o: (f"rank {o}: sizes is required", "expected one block size per rank"),
    ),
    _rs_entry(
        "rs-sizes-negative",
        "sizes holds a negative entry on one rank",
        vargather.SizesError,
        lambda r, w: _rs(
            r, w, sizes=[-1, *rs_sizes(w)[1:-1], rs_sizes(w)[-1] + rs_sizes(w)[0] + 1]
        ),
        lambda w, o: (f"rank {o}: sizes must be >= 0", "= -1"),
    ),
    _rs_entry(
        "rs-sizes-float-tensor",
        "sizes is a float tensor on one rank",
        vargather.SizesTypeError,
        lambda r, w: _rs(r, w, sizes=SizesTensor(tuple(rs_sizes(w)), "float32")),
        lambda w, o: (f"rank {o}: sizes must hold integers", "float32"),
    ),
    _rs_entry(
        "rs-dtype-differs",
        "one rank passes int32 where the others pass float32",
        vargather.DTypeMismatchError,
        lambda r, w: _rs(r, w, dtype="int32"),
        lambda w, o: ("dtype differs", "torch.float32", "torch.int32", f"[{o}]"),
    ),
    _rs_entry(
        "rs-ndim-differs",
        "one rank passes a tensor with one more dimension",
        vargather.ShapeMismatchError,
        lambda r, w: _rs(r, w, trail=(2, 1)),
        lambda w, o: ("ndim differs", "2", "3", f"[{o}]"),
    ),
    _rs_entry(
        "rs-trailing-dim-differs",
        "a dimension other than dim differs on one rank",
        vargather.ShapeMismatchError,
        lambda r, w: _rs(r, w, trail=(3,)),
        lambda w, o: (
            "shape differs",
            f"({sum(rs_sizes(w))}, 2)",
            f"({sum(rs_sizes(w))}, 3)",
            f"[{o}]",
        ),
    ),
    _rs_entry(
        "rs-dim-differs",
        "one rank scatters along dim 1 of its transposed tensor (valid locally)",
        vargather.ArgumentMismatchError,
        lambda r, w: FamilyArgs(TensorSpec((2, sum(rs_sizes(w)))), sizes=rs_sizes(w), dim=1),
        lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]"),
    ),
    _rs_entry(
        "rs-dim-out-of-range",
        "dim is out of range on one rank",
        vargather.DimError,
        lambda r, w: _rs(r, w, dim=2),
        lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=2", "expected -2 <= dim < 2"),
    ),
    _rs_entry(
        "rs-requires-grad-differs",
        "one rank needs a gradient and its peers do not",
        vargather.RequiresGradMismatchError,
        lambda r, w: _rs(r, w, dtype="float64", requires_grad=True),
        lambda w, o: ("requires_grad", "True", "False", f"[{o}]"),
        good=lambda r, w: _rs(r, w, dtype="float64"),
    ),
    _rs_entry(
        "rs-zero-dim-input",
        "one rank passes a 0-d tensor (nothing to split)",
        vargather.SizesError,
        lambda r, w: FamilyArgs(TensorSpec(()), sizes=rs_sizes(w)),
        lambda w, o: (f"rank {o}: expected a tensor with at least 1 dimension", "0-d"),
    ),
    _rs_entry(
        "rs-not-a-tensor",
        "one rank passes a list",
        vargather.InputTypeError,
        lambda r, w: FamilyArgs([1.0, 2.0], sizes=rs_sizes(w)),
        lambda w, o: (f"rank {o}: expected a torch.Tensor, got list",),
    ),
    _rs_entry(
        "rs-absent",
        "one rank never calls reduce_scatter_v",
        vargather.CollectiveTimeoutError,
        None,
        _absent_fragments("reduce_scatter_v"),
        good=lambda r, w: _rs(r, w, timeout=ABSENT_TIMEOUT),
        absent=True,
    ),
    # all_to_all_v(x, send_sizes, dim, recv_sizes=): one send vector per rank, the
    # receive sizes its transpose; every dimension but dim agrees
    _a2a_entry(
        "a2a-send-sizes-wrong-length",
        "the send-size vector has one entry too many on one rank",
        vargather.SizesError,
        lambda r, w: _a2a(r, w, sizes=[*a2a_send(w, r), 0]),
        lambda w, o: (f"rank {o}: expected len(send_sizes) == world size {w}, got {w + 1}",),
    ),
    _a2a_entry(
        "a2a-sum-mismatch",
        "sum(send_sizes) does not match x.shape[dim] on one rank (one more row)",
        vargather.SizesError,
        lambda r, w: _a2a(r, w, extra_rows=1),
        lambda w, o: (
            f"rank(s) [{o}]",
            f"rank {o}: expected sum(send_sizes) == {sum(a2a_send(w, o)) + 1}",
            f"got sum(send_sizes) = {sum(a2a_send(w, o))}",
        ),
    ),
    _a2a_entry(
        "a2a-send-sizes-missing",
        "one rank passes send_sizes=None",
        vargather.SizesError,
        lambda r, w: _a2a(r, w, sizes=None),
        lambda w, o: (f"rank {o}: send_sizes is required",),
    ),
    _a2a_entry(
        "a2a-send-sizes-a-string",
        "send_sizes is a string on one rank",
        vargather.SizesTypeError,
        lambda r, w: _a2a(r, w, sizes="1,2"),
        lambda w, o: (f"rank {o}: send_sizes must hold integers", "str"),
    ),
    _a2a_entry(
        "a2a-recv-sizes-lie",
        "recv_sizes (passed on every rank) is wrong about one sender on one rank",
        vargather.SizesMismatchError,
        lambda r, w: _a2a(r, w, recv_sizes=_a2a_recv_lie(w, r)),
        lambda w, o: (
            f"recv_sizes passed on rank(s) [{o}] contradict the send sizes",
            f"send matrix {_a2a_matrix(w)}",
            f"rank {o}: expected recv_sizes={a2a_recv(w, o)}",
            f"got recv_sizes={_a2a_recv_lie(w, o)}",
        ),
        good=lambda r, w: _a2a(r, w, recv_sizes=a2a_recv(w, r)),
    ),
    _a2a_entry(
        "a2a-recv-sizes-lie-on-one-rank-only",
        "only one rank passes recv_sizes, and they are wrong",
        vargather.SizesMismatchError,
        lambda r, w: _a2a(r, w, recv_sizes=_a2a_recv_lie(w, r)),
        lambda w, o: (
            f"rank {o}: expected recv_sizes={a2a_recv(w, o)}",
            f"got recv_sizes={_a2a_recv_lie(w, o)}",
        ),
    ),
    _a2a_entry(
        "a2a-recv-sizes-wrong-length",
        "recv_sizes has one entry too few on one rank",
        vargather.SizesError,
        lambda r, w: _a2a(r, w, recv_sizes=a2a_recv(w, r)[:-1]),
        lambda w, o: (f"rank {o}: expected len(recv_sizes) == world size {w}, got {w - 1}",),
    ),
    _a2a_entry(
        "a2a-dtype-differs",
        "one rank passes float64 where the others pass float32",
        vargather.DTypeMismatchError,
        lambda r, w: _a2a(r, w, dtype="float64"),
        lambda w, o: ("dtype differs", "torch.float32", "torch.float64", f"[{o}]"),
    ),
    _a2a_entry(
        "a2a-ndim-differs",
        "one rank passes a tensor with one more dimension",
        vargather.ShapeMismatchError,
        lambda r, w: _a2a(r, w, trail=(2, 1)),
        lambda w, o: ("ndim differs", "2", "3", f"[{o}]"),
    ),
    _a2a_entry(
        "a2a-trailing-dim-differs",
        "a dimension other than dim differs on one rank",
        vargather.ShapeMismatchError,
        lambda r, w: _a2a(r, w, trail=(3,)),
        lambda w, o: ("shape outside the split dimension differs", "(2,)", "(3,)", f"[{o}]"),
    ),
    _a2a_entry(
        "a2a-dim-differs",
        "one rank splits along dim 1 of its transposed tensor (valid locally)",
        vargather.ArgumentMismatchError,
        lambda r, w: FamilyArgs(TensorSpec((2, sum(a2a_send(w, r)))), sizes=a2a_send(w, r), dim=1),
        lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]"),
    ),
    _a2a_entry(
        "a2a-dim-out-of-range",
        "dim is out of range on one rank",
        vargather.DimError,
        lambda r, w: _a2a(r, w, dim=-3),
        lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=-3", "expected -2 <= dim < 2"),
    ),
    _a2a_entry(
        "a2a-requires-grad-differs",
        "one rank does not need a gradient and its peers do",
        vargather.RequiresGradMismatchError,
        lambda r, w: _a2a(r, w, dtype="float64"),
        lambda w, o: ("requires_grad", "True", "False", f"[{o}]"),
        good=lambda r, w: _a2a(r, w, dtype="float64", requires_grad=True),
    ),
    _a2a_entry(
        "a2a-not-a-tensor",
        "one rank passes None",
        vargather.InputTypeError,
        lambda r, w: FamilyArgs(None, sizes=a2a_send(w, r)),
        lambda w, o: (f"rank {o}: expected a torch.Tensor, got NoneType",),
    ),
    _a2a_entry(
        "a2a-absent",
        "one rank never calls all_to_all_v",
        vargather.CollectiveTimeoutError,
        None,
        _absent_fragments("all_to_all_v"),
        good=lambda r, w: _a2a(r, w, timeout=ABSENT_TIMEOUT),
        absent=True,
    ),
    # all_gather_list(x, shapes=, grad=): the same ndim, dtype and contract everywhere
    _list_entry(
        "list-dtype-differs",
        "one rank passes bfloat16 where the others pass float32",
        vargather.DTypeMismatchError,
        lambda r, w: _list(r, w, dtype="bfloat16"),
        lambda w, o: ("dtype differs", "torch.float32", "torch.bfloat16", f"[{o}]"),
    ),
    _list_entry(
        "list-ndim-differs",
        "one rank passes a tensor with one more dimension",
        vargather.ShapeMismatchError,
        lambda r, w: _list(r, w, extra=(1,)),
        lambda w, o: ("ndim differs", "2", "3", f"[{o}]"),
    ),
    _list_entry(
        "list-shapes-lie",
        "shapes (passed on every rank) is wrong about a peer on one rank",
        vargather.SizesMismatchError,
        lambda r, w: _list(r, w, shapes=_list_shapes_lie(w, r)),
        lambda w, o: (
            f"shapes passed on rank(s) [{o}] contradict the tensors",
            f"expected shapes={list_shapes(w)}",
            f"got rank {o} passed shapes={_list_shapes_lie(w, o)}",
        ),
        good=lambda r, w: _list(r, w, shapes=list_shapes(w)),
    ),
    _list_entry(
        "list-shapes-lie-about-ndim",
        "shapes gives a peer one more dimension than its tensor has, on one rank",
        vargather.SizesMismatchError,
        lambda r, w: _list(r, w, shapes=_list_shapes_extra_dim(w, r)),
        lambda w, o: (
            f"shapes passed on rank(s) [{o}] contradict the tensors",
            f"expected shapes={list_shapes(w)}",
            f"got rank {o} passed shapes=[",
            f"{list_shapes(w)[(o + 1) % w]} + 1 more dims",
        ),
    ),
    _list_entry(
        "list-shapes-wrong-own-entry",
        "shapes is wrong about the rank's own tensor",
        vargather.SizesError,
        lambda r, w: _list(r, w, shapes=[[9, 9]] * w),
        lambda w, o: (
            f"rank {o}: expected shapes[{o}] == {list_shape(o)}",
            f"got ({9}, {9})",
        ),
    ),
    _list_entry(
        "list-shapes-wrong-length",
        "shapes has one entry too many on one rank",
        vargather.SizesError,
        lambda r, w: _list(r, w, shapes=[*list_shapes(w), [1, 1]]),
        lambda w, o: (f"rank {o}: expected len(shapes) == world size {w}, got {w + 1}",),
    ),
    _list_entry(
        "list-shapes-not-shapes",
        "shapes is a flat list of ints on one rank",
        vargather.SizesTypeError,
        lambda r, w: _list(r, w, shapes=[2, 3]),
        lambda w, o: (f"rank {o}: shapes[0] must be a sequence of ints, got int",),
    ),
    _list_entry(
        "list-grad-contract-differs",
        "one rank asks for grad='mean', its peers for grad='sum'",
        vargather.ArgumentMismatchError,
        lambda r, w: _list(r, w, grad="mean"),
        lambda w, o: ("gradient contract", "'sum'", "'mean'", f"[{o}]"),
    ),
    _list_entry(
        "list-grad-contract-unknown",
        "one rank passes an unknown gradient contract",
        vargather.ArgumentError,
        lambda r, w: _list(r, w, grad="avg"),
        lambda w, o: (f"rank {o}: grad must be one of 'sum', 'local', 'mean'", "'avg'"),
    ),
    _list_entry(
        "list-requires-grad-differs",
        "under grad='sum' one rank needs a gradient and its peers do not",
        vargather.RequiresGradMismatchError,
        lambda r, w: _list(r, w, dtype="float64", requires_grad=True),
        lambda w, o: ("requires_grad", "True", "False", f"[{o}]"),
        good=lambda r, w: _list(r, w, dtype="float64"),
    ),
    _list_entry(
        "list-not-a-tensor",
        "one rank passes a float",
        vargather.InputTypeError,
        lambda r, w: FamilyArgs(1.5),
        lambda w, o: (f"rank {o}: expected a torch.Tensor, got float",),
    ),
    _list_entry(
        "list-absent",
        "one rank never calls all_gather_list",
        vargather.CollectiveTimeoutError,
        None,
        _absent_fragments("all_gather_list"),
        good=lambda r, w: _list(r, w, timeout=ABSENT_TIMEOUT),
        absent=True,
    ),
    # one rank calls another collective of the same metadata round
    _mixed_entry(
        "mixed-rs-beside-a2a",
        "all_to_all_v",
        "reduce_scatter_v",
        vargather.ProtocolMismatchError,
        _mixed_family_fragments("reduce_scatter_v", "all_to_all_v"),
        _rs,
    ),
    _mixed_entry(
        "mixed-a2a-beside-rs",
        "reduce_scatter_v",
        "all_to_all_v",
        vargather.ProtocolMismatchError,
        _mixed_family_fragments("all_to_all_v", "reduce_scatter_v"),
        _a2a,
    ),
    _mixed_entry(
        "mixed-coalesced-beside-all-gather-v",
        "all_gather_v",
        "all_gather_v_coalesced",
        vargather.ProtocolMismatchError,
        lambda w, o: (
            "all_gather_v / all_gather_v_coalesced: collective differs across ranks",
            f"'all_gather_v_coalesced' on rank(s) [{o}]",
            "'all_gather_v'",
            "call the same collective on every rank",
        ),
        _gather,
    ),
)
"""Every misuse class of the family, each raised as the same error on every rank (the
named timeout on the others, for a rank that never arrives)."""


def family_misuse_by_name(name: str) -> FamilyMisuse:
    for m in FAMILY_CATALOGUE:
        if m.name == name:
            return m
    raise KeyError(name)


__all__ = [
    "CATALOGUE",
    "FAMILY_CATALOGUE",
    "MISUSE_KINDS",
    "Call",
    "FamilyArgs",
    "FamilyMisuse",
    "FamilyScenario",
    "GatherMisuseCase",
    "GatherOutput",
    "Misuse",
    "MisuseCase",
    "Scenario",
    "SizesTensor",
    "TensorSpec",
    "check_gather_misuse",
    "check_misuse",
    "expected_of",
    "judge_gather_misuse",
    "judge_misuse",
    "misuse_cases",
    "run_call",
    "run_gather_misuse",
    "run_misuse",
    "valid_scenario",
]


# --- the gate's misuse row for all_gather_v ----------------------------------------------


@dataclass(frozen=True)
class GatherMisuseCase:
    """Entry ``name`` of ``CATALOGUE`` on ``world_size`` ranks, ``offender`` wrong."""

    name: str
    world_size: int
    offender: int = 0
    emulate: str | None = None
    collective: str = "all_gather_v"


RaisedError = tuple[str, str, tuple[int, ...]]
"""What a rank raised: class name, message, the ranks the error blames."""


def run_gather_misuse(ctx: Any, case: GatherMisuseCase) -> tuple[RaisedError | None, bool]:
    """Rank side: the misused call, then one valid gather on the same world. Returns
    the error raised (``None``: none) and whether the valid gather came out right."""
    from .emulate import activate

    activate(case.emulate)
    entry = misuse_by_name(case.name)
    error: RaisedError | None = None
    try:
        run_call(ctx, entry.build(case.world_size, case.offender))
    except Exception as err:
        error = (type(err).__name__, str(err), tuple(getattr(err, "ranks", ())))
    scenario = valid_scenario(case.world_size)
    try:
        got = run_call(ctx, scenario)
    except Exception:
        return error, False
    want, grads = expected_of(scenario)
    right = got.output.shape == want.shape and bool(torch.equal(got.output, want))
    own = grads[ctx.rank]
    if own is not None:
        right = right and got.grad is not None and bool(torch.equal(got.grad, own))
    return error, right


def judge_gather_misuse(
    case: GatherMisuseCase, reports: Sequence[tuple[RaisedError | None, bool]]
) -> list[Failure]:
    """Every rank the entry's error class with one message holding its fragments and
    blaming its ranks; the next gather right on every rank."""
    entry = misuse_by_name(case.name)
    w, o = case.world_size, case.offender
    expected = entry.error.__name__

    def failed(ranks: Sequence[int], message: str) -> Failure:
        return Failure(
            "misuse",
            "mismatch",
            f"{case.name}: {message}",
            tuple(ranks),
            w,
            call="all_gather_v",
            property="all_gather_v",
        )

    errors = [e for e, _ in reports]
    quiet = [r for r, e in enumerate(errors) if e is None]
    if quiet:
        return [failed(quiet, f"expected {expected} on every rank, got no error")]
    raised = [e for e in errors if e is not None]
    failures: list[Failure] = []
    kinds = sorted({e[0] for e in raised})
    if kinds != [expected]:
        failures.append(failed(range(w), f"expected {expected} on every rank, got {kinds}"))
    messages = sorted({e[1] for e in raised})
    if len(messages) != 1:
        failures.append(failed(range(w), f"expected one message on every rank, got {messages}"))
    missing = [f for f in entry.fragments(w, o) if f not in messages[0]]
    if missing:
        failures.append(failed(range(w), f"expected {missing} in the message {messages[0]!r}"))
    blamed = entry.blamed_ranks(w, o)
    if any(e[2] != blamed for e in raised):
        failures.append(
            failed(range(w), f"expected the error to blame {list(blamed)}, got {raised[0][2]}")
        )
    broken = [r for r, (_, right) in enumerate(reports) if not right]
    if broken:
        failures.append(failed(broken, "expected the group usable after: the next gather failed"))
    return failures


def check_gather_misuse(pool: Any, case: GatherMisuseCase) -> list[Failure]:
    """The misuse property on ``pool`` (``case.world_size`` ranks)."""
    return judge_gather_misuse(case, pool.run(run_gather_misuse, case))


# --- the family's misuse row: one rank's arguments wrong in a family call ------------------------------------------------------------------------------

MISUSE_KINDS: dict[str, tuple[str, ...]] = {
    "reduce_scatter_v": (
        "sizes_differ",
        "sum_mismatch",
        "dtype",
        "ndim",
        "trailing",
        "requires_grad",
        "absent",
    ),
    "all_to_all_v": (
        "send_length",
        "sum_mismatch",
        "recv_lie",
        "dtype",
        "ndim",
        "trailing",
        "requires_grad",
        "cat_dim_differs",
        "cat_blocks",
        "absent",
    ),
    "all_gather_list": ("dtype", "ndim", "shapes_lie", "contract", "requires_grad", "absent"),
}
"""What one odd rank does wrong, per collective (all_to_all_v's ``cat_dim_differs``:
its peers join along ``cat_dim=1``, it along ``dim``; ``cat_blocks``: joined along
``cat_dim=1``, it sends rank 0 two rows along ``dim`` where its peers send one)."""

_EXPECTED_ERROR = {
    "sizes_differ": "SizesMismatchError",
    "sum_mismatch": "SizesError",
    "send_length": "SizesError",
    "recv_lie": "SizesMismatchError",
    "dtype": "DTypeMismatchError",
    "ndim": "ShapeMismatchError",
    "trailing": "ShapeMismatchError",
    "shapes_lie": "SizesMismatchError",
    "contract": "ArgumentMismatchError",
    "requires_grad": "RequiresGradMismatchError",
    "cat_dim_differs": "ArgumentMismatchError",
    "cat_blocks": "SizesMismatchError",
    "absent": "CollectiveTimeoutError",
}


@dataclass(frozen=True)
class MisuseCase:
    """One rank (``odd``) of ``world_size`` gets ``kind`` wrong in a ``collective`` call."""

    collective: str
    kind: str
    world_size: int = 3
    odd: int = 1
    impl: str = "vargather"
    emulate: str | None = None


@st.composite
def misuse_cases(
    draw: Any, world_sizes: Sequence[int] = (2, 3), absent: bool = False
) -> MisuseCase:
    """``MisuseCase``s (``absent``: include a rank that never arrives, which costs a
    timeout and a rebuilt world)."""
    collective = draw(st.sampled_from(COLLECTIVES))
    kinds = [k for k in MISUSE_KINDS[collective] if absent or k != "absent"]
    world = draw(st.sampled_from(list(world_sizes)))
    return MisuseCase(
        collective, draw(st.sampled_from(kinds)), world, draw(st.integers(0, world - 1))
    )


def _misuse_call(case: MisuseCase, rank: int, timeout: float, wrong: bool) -> Any:
    fn = function_of(case.impl, case.collective)
    w, k = case.world_size, case.kind if wrong else ""
    dtype = torch.int32 if k == "dtype" else torch.float32
    grad = k == "requires_grad"  # the odd rank alone needs a gradient
    trail: tuple[int, ...] = (3,) if k == "trailing" else (2,)
    extra: tuple[int, ...] = (1,) if k == "ndim" else ()
    if case.collective == "reduce_scatter_v":
        sizes = [1] * w
        if k == "sizes_differ":
            sizes = [2] + [1] * (w - 2) + [0]
        rows = w + (1 if k == "sum_mismatch" else 0)
        x = torch.ones((rows, *trail, *extra), dtype=dtype, requires_grad=grad)
        return fn(x, sizes, timeout=timeout)
    if case.collective == "all_to_all_v" and case.kind.startswith("cat_"):
        # joined along dim 1, each rank's own size along it (2 + rank)
        send = [2] + [1] * (w - 2) + [0] if k == "cat_blocks" else [1] * w
        cat_dim = 0 if k == "cat_dim_differs" else 1
        x = torch.ones((w, 2 + rank), dtype=dtype, requires_grad=grad)
        return fn(x, send, 0, cat_dim=cat_dim, timeout=timeout)
    if case.collective == "all_to_all_v":
        send = [1] * w
        recv = [1] * w
        if k == "send_length":
            send = [1] * (w + 1)
        if k == "recv_lie":
            recv = [2] + [1] * (w - 1)
        rows = w + (1 if k in ("sum_mismatch", "send_length") else 0)
        x = torch.ones((rows, *trail, *extra), dtype=dtype, requires_grad=grad)
        return fn(x, send, recv_sizes=recv, timeout=timeout)
    shape = (rank + 1, 2, *extra)
    shapes: list[list[int]] | None = None
    if k == "shapes_lie":  # a lie about a peer's shape (its own entry is checked locally)
        shapes = [[r + 1, 2] for r in range(w)]
        shapes[(rank + 1) % w] = [5, 5]
    return fn(
        torch.ones(shape, dtype=dtype, requires_grad=grad),
        shapes=shapes,
        grad="local" if k == "contract" else "sum",
        timeout=timeout,
    )


def run_misuse(
    ctx: RankContext, case: MisuseCase
) -> tuple[tuple[str, str, tuple[int, ...]] | None, bool]:
    """Rank side: the misused call (the odd rank's arguments wrong; absent: it does not
    call), then, except after a timeout, one correct call. Returns the error raised
    (class, message, blamed ranks) and whether the follow-up call worked."""
    emulation(case.emulate)
    wrong = ctx.rank == case.odd
    error = None
    if not (wrong and case.kind == "absent"):
        try:
            _misuse_call(case, ctx.rank, 2.0 if case.kind == "absent" else 30.0, wrong)
        except Exception as err:
            error = (type(err).__name__, str(err), tuple(getattr(err, "ranks", ())))
    if case.kind == "absent":
        return error, True
    try:
        _misuse_call(case, ctx.rank, 30.0, False)
        follow = True
    except Exception:
        follow = False
    return error, follow


def judge_misuse(case: MisuseCase, reports: Sequence[tuple[Any, bool]]) -> list[Failure]:
    """Every rank the same error (class and message, naming the odd rank), the group
    usable after; a rank that never arrives: the named timeout on every other rank."""
    name, expected = case.collective, _EXPECTED_ERROR[case.kind]
    failures: list[Failure] = []
    callers = [r for r in range(case.world_size) if not (case.kind == "absent" and r == case.odd)]
    errors = [reports[r][0] for r in callers]
    missing = [r for r, e in zip(callers, errors, strict=True) if e is None]
    if missing:
        failures.append(
            failed(
                name,
                "misuse",
                tuple(missing),
                f"{case.kind}: expected {expected} on every rank, got no error on rank(s) {missing}",
            )
        )
        return sized(failures, case.world_size)
    kinds = {e[0] for e in errors if e is not None}
    if kinds != {expected}:
        failures.append(
            failed(
                name,
                "misuse",
                tuple(callers),
                f"{case.kind}: expected {expected} on every rank, got {sorted(kinds)}",
            )
        )
    if case.kind != "absent":
        if len({e[1] for e in errors if e is not None}) != 1:
            failures.append(
                failed(
                    name,
                    "misuse",
                    tuple(callers),
                    f"{case.kind}: expected the same message on every rank, got {[e[1] for e in errors if e]}",
                )
            )
        if not all(case.odd in e[2] for e in errors if e is not None):
            failures.append(
                failed(
                    name,
                    "misuse",
                    (case.odd,),
                    f"{case.kind}: expected the error to blame rank {case.odd}, got {[e[2] for e in errors if e]}",
                )
            )
        broken = [r for r, (_, follow) in enumerate(reports) if not follow]
        if broken:
            failures.append(
                failed(
                    name,
                    "misuse",
                    tuple(broken),
                    f"{case.kind}: expected the group usable after, but the next call failed on rank(s) {broken}",
                )
            )
    elif not all(case.odd in e[2] for e in errors if e is not None):
        failures.append(
            failed(
                name,
                "misuse",
                (case.odd,),
                f"absent: expected the timeout to name rank {case.odd}, got {[e[2] for e in errors if e]}",
            )
        )
    return sized(failures, case.world_size)


def check_misuse(pool: RankPool, case: MisuseCase) -> list[Failure]:
    """The misuse property on ``pool``; after ``absent`` the world is rebuilt (a
    timed-out group is out of step)."""
    try:
        return judge_misuse(case, pool.run(run_misuse, case))
    finally:
        if case.kind == "absent":
            pool.restart()

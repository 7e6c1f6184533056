"""The runner's rank side: one case on one rank, a ``RankReport`` back.

Where it sits: in the testing kit, above ``importer`` and ``cases``, beneath ``runner``
(the parent side, which sends ``run_on_rank`` / ``run_coalesced_on_rank`` to a pool:
module-level functions, so the pool pickles them by reference). ``emulation`` serves
the family's and the misuse runners too, ``Alone`` and ``join`` the family's.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Final, Protocol

import torch

from vargather import CollectiveError

from .asserts import bitwise_difference
from .calls import NAMES, bind_call
from .cases import (
    DIGEST_MIN_BYTES,
    GatherCase,
    Implementation,
    RankReport,
    TensorBytes,
    bytes_of,
    digest_of,
    expected_output,
)
from .compiled import call_compiled, patient_default_group
from .importer import load_callable, resolve_coalesced, resolve_compiled, resolve_implementation
from .repeatable import repeatable
from .values import dtype_name


class RankContextLike(Protocol):
    """What ``run_on_rank`` needs from ``vargather.testing.RankContext``."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def subgroup(self, ranks: Sequence[int]) -> object: ...


class Alone:
    """The rank context in this process, torch.distributed not initialized (an
    uninitialized case, ``run_on_rank`` in-process): rank 0 of one, no subgroups."""

    rank = 0
    world_size = 1

    def subgroup(self, ranks: Sequence[int]) -> object:
        raise RuntimeError("no subgroups without torch.distributed")


_POISONED: list[int] = []  # the batch token after which this rank skips the rest


def _layout_fields(layout: object) -> dict[str, object]:
    names = (
        "sizes",
        "offsets",
        "total",
        "max_size",
        "dim",
        "leading_shape",
        "trailing_shape",
        "dtype",
        "rank",
        "world_size",
    )
    fields: dict[str, object] = {}
    for name in names:
        value = getattr(layout, name, "<missing>")
        if isinstance(value, torch.dtype):
            value = dtype_name(value)
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        fields[name] = value
    return fields


def _describe_extra(value: object) -> tuple[object, ...]:
    if value is None:
        return ("sizes", None)
    if isinstance(value, torch.Tensor):
        return ("sizes", TensorBytes.of(value))
    if isinstance(value, (list, tuple)) and all(type(v) is int for v in value):
        return ("sizes", TensorBytes.of(torch.tensor(list(value), dtype=torch.int64)))
    if hasattr(value, "sizes") and hasattr(value, "offsets"):
        return ("layout", _layout_fields(value))
    return ("other", type(value).__name__)


def _call(
    impl: Implementation, case: GatherCase, x: torch.Tensor, group: object
) -> tuple[object, tuple[object, ...]]:
    fn = resolve_implementation(impl) if case.compile_backend is None else resolve_compiled(impl)
    head: tuple[object, ...] = (x, case.dim)
    if impl.ctor_kwargs is not None:
        ctor = dict(impl.ctor_kwargs)
        if impl.ctor_takes_dim and "dim" not in ctor:
            ctor["dim"] = case.dim
            head = (x,)
        fn = fn(**ctor)  # type: ignore[assignment]  # the configured object is called below
        assert callable(fn)  # checked in the parent before any world starts
    sizes = case.sizes_argument()
    if impl.call is not None:
        shapes = [list(s) for s in case.shapes]
        values = {"dim": case.dim, "sizes": sizes, "shapes": shapes, "grad": case.contract}
        args, named = bind_call(impl.call, NAMES, x, group, lambda: case.output_shape, values)
        result = call_compiled(fn, case, x, args, named)
    elif impl.convention == "seed":
        result = call_compiled(fn, case, x, (*head, sizes), {})
    else:
        kwargs: dict[str, object] = {"grad": case.contract} if impl.takes_grad else {}
        if sizes is not None:
            kwargs["sizes"] = sizes
        if case.members is not None:
            kwargs["group"] = group
        if impl.transports is not None:
            kwargs["transport"] = case.transport
        result = call_compiled(fn, case, x, head, kwargs)
    return _unpack(impl, case, result)


def _is_tensor_list(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in value)


def _unpack(
    impl: Implementation, case: GatherCase, result: object
) -> tuple[object, tuple[object, ...]]:
    """The output tensor and what came beside it, as ``--returns`` declares."""
    if impl.returns == "tensor":
        return result, ("none",)
    out: object = result
    extra: tuple[object, ...] = ("none",)
    if impl.returns == "list" and _is_tensor_list(result):
        pass  # the per-rank tensors alone
    elif isinstance(result, tuple) and len(result) == 2:
        first = result[0]
        if isinstance(first, torch.Tensor) or (impl.returns == "list" and _is_tensor_list(first)):
            out, extra = first, _describe_extra(result[1])
    if impl.returns == "list" and _is_tensor_list(out):
        parts = list(out)  # type: ignore[call-overload]  # a list or tuple of tensors
        out = torch.cat(parts, dim=case.dim) if parts else out
    return out, extra


def _loss(out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The real loss ``Re Σ conj(g) · out``, whose gradient for ``out`` is exactly ``g``.

    Its backward is ``out.backward(g)`` (torch's convention for complex tensors
    included), but unlike ``out.backward(g)`` it does not import sympy (torch checks an
    explicit gradient's shape with its symbolic-shape machinery, seconds per process).
    """
    return (out * g.conj()).sum().real if g.is_complex() else (out * g).sum()


def _backward_note(case: GatherCase, out: torch.Tensor) -> str:
    """Why backward is not run for ``out`` (empty: it is)."""
    if tuple(out.shape) != case.output_shape:
        return "backward not run: the output has the wrong shape"
    if not out.requires_grad:
        return "backward not run: the output does not require grad"
    return ""


def _grad_fields(x: torch.Tensor, note: str) -> dict[str, object]:
    """The ``RankReport`` fields about ``x``'s gradient after the backward (if any)."""
    grad = x.grad
    fields: dict[str, object] = {"backward_note": note}
    if isinstance(grad, torch.Tensor):
        fields["grad"] = TensorBytes.of(grad)
    else:
        fields["grad_type"] = type(grad).__name__
    return fields


def emulation(backend: str | None) -> None:
    """Emulate ``backend`` in this rank (``vargather.testing.emulate``), or stop
    emulating where an earlier case did (a rank pool serves both)."""
    if backend is not None or f"{__package__}.emulate" in sys.modules:
        from .emulate import activate

        activate(backend)


def _output_report(out: torch.Tensor, case: GatherCase, expected_digest: str | None) -> TensorBytes:
    """``out`` as it goes back to the parent: its bytes, or for a large case its digest
    and the first element that differs from the oracle's output (found here, so the
    megabytes never cross the pipe; ``expected_digest`` from the parent spares the
    rank rebuilding the oracle's output when nothing differs)."""
    if case.output_nbytes < DIGEST_MIN_BYTES:
        return TensorBytes.of(out)
    digest = digest_of(out)
    mismatch = ""
    comparable = tuple(out.shape) == case.output_shape and out.dtype == case.torch_dtype
    if comparable and digest != expected_digest:
        mismatch = bitwise_difference(out.detach().cpu(), expected_output(case)) or ""
    return TensorBytes.digested(out, mismatch)


def _enter(
    ctx: RankContextLike, impl: Implementation, case: GatherCase
) -> tuple[object, int] | None:
    """Ready this rank for ``case``: the emulation installed, the case checked against
    the world and ``impl``; the gather group (``None``: the default group) and this
    rank's rank in it, or ``None`` when this rank is outside the case's subgroup."""
    emulation(impl.emulate)
    if case.members is None and ctx.world_size != case.group_size:
        raise RuntimeError(
            f"case for {case.group_size} rank(s) sent to a world of {ctx.world_size}"
        )
    joined = join(ctx, case.members)
    if joined is None:
        return None
    if case.contract not in impl.contracts:
        raise ValueError(f"{impl.label} does not claim grad={case.contract!r}")
    if impl.transports is None and case.transport != "auto":
        raise ValueError(f"{impl.label} takes no transport, but the case asks {case.transport!r}")
    return joined


def join(ctx: RankContextLike, members: Sequence[int] | None) -> tuple[object, int] | None:
    """The group of ``members`` (``None``: the whole world's) and this rank's rank in it;
    ``None`` outside it, the subgroup still created with its peers (a collective)."""
    if members is None:
        return None, ctx.rank
    group = ctx.subgroup(list(members))
    return (group, list(members).index(ctx.rank)) if ctx.rank in members else None


def _forward_fields(
    ctx: RankContextLike,
    grank: int,
    case: GatherCase,
    out: object,
    extra: tuple[object, ...],
    intact: bool,
    expected_digest: str | None,
) -> dict[str, object]:
    """The ``RankReport`` fields about one case's forward on this rank."""
    if not isinstance(out, torch.Tensor):
        return dict(rank=grank, global_rank=ctx.rank, out_type=type(out).__name__, extra=extra)
    return dict(
        rank=grank,
        global_rank=ctx.rank,
        out=_output_report(out, case, expected_digest),
        out_requires_grad=out.requires_grad,
        extra=extra,
        input_intact=intact,
    )


def _run_one(
    ctx: RankContextLike, impl: Implementation, case: GatherCase, expected_digest: str | None = None
) -> RankReport | None:
    entered = _enter(ctx, impl, case)
    if entered is None:
        return None
    group, grank = entered
    x = case.shard(grank)
    before = x.detach().clone()
    with patient_default_group(ctx, case):  # a compiled case: peers may compile slower
        out, extra = _call(impl, case, x, group)
        intact = bytes_of(x) == bytes_of(before)
        report = _forward_fields(ctx, grank, case, out, extra, intact, expected_digest)
        if isinstance(out, torch.Tensor) and case.differentiable:
            note = _backward_note(case, out)
            if not note:
                _loss(out, case.upstream_grad(grank)).backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs
            report.update(_grad_fields(x, note))
    return RankReport(**report)  # type: ignore[arg-type]  # keys and types are those of RankReport


def _call_coalesced(
    impl: Implementation, cases: Sequence[GatherCase], xs: Sequence[torch.Tensor]
) -> list[object]:
    """One coalesced call of ``xs``: its results, one per case (``"missing"`` for an
    output it did not return; the whole result when it is not a sequence)."""
    fn = resolve_coalesced(impl)
    first = cases[0]
    kwargs: dict[str, object] = {"grad": first.contract} if impl.takes_grad else {}
    sizes = [c.sizes_argument() for c in cases]
    if any(s is not None for s in sizes):
        kwargs["sizes"] = sizes
    if impl.transports is not None:
        kwargs["transport"] = first.transport
    result = fn(list(xs), [c.dim for c in cases], **kwargs)
    if not isinstance(result, (list, tuple)):
        return [result] * len(cases)
    got = list(result)
    return got[: len(cases)] + ["missing"] * (len(cases) - len(got))


def _check_coalesced(case: GatherCase, first: GatherCase) -> None:
    """``ValueError`` unless ``case`` can be a tensor of one coalesced call with
    ``first``: on the same initialized world, no subgroup, the same contract and
    transport (what the call takes once)."""
    if case.members is not None or not case.initialized:
        raise ValueError("a coalesced batch gathers over an initialized world: no subgroups")
    if case.world_size != first.world_size:
        raise ValueError("the cases of a coalesced batch must share the world size")
    if (case.contract, case.transport) != (first.contract, first.transport):
        raise ValueError("the cases of a coalesced batch must share grad= and transport=")


def _run_coalesced(
    ctx: RankContextLike,
    impl: Implementation,
    cases: Sequence[GatherCase],
    digests: Sequence[str | None],
) -> list[RankReport]:
    grank = ctx.rank
    for case in cases:
        _check_coalesced(case, cases[0])
        entered = _enter(ctx, impl, case)
        assert entered is not None  # no subgroup: every rank takes part
    xs = [case.shard(grank) for case in cases]
    before = [x.detach().clone() for x in xs]
    outs = _call_coalesced(impl, cases, xs)
    reports = []
    losses: list[torch.Tensor] = []
    for case, x, kept, out, digest in zip(cases, xs, before, outs, digests, strict=True):
        intact = bytes_of(x) == bytes_of(kept)
        fields = _forward_fields(ctx, grank, case, out, ("none",), intact, digest)
        if isinstance(out, torch.Tensor) and case.differentiable:
            note = _backward_note(case, out)
            if not note:
                losses.append(_loss(out, case.upstream_grad(grank)))
            fields["backward_note"] = note
        reports.append(fields)
    if losses:
        # One backward over every output: what torch.autograd.backward(outputs,
        # upstreams) does, each loss's gradient for its output being the case's g.
        torch.autograd.backward(losses)
    for x, fields in zip(xs, reports, strict=True):
        if "backward_note" in fields:
            fields.update(_grad_fields(x, str(fields["backward_note"])))
    return [RankReport(**fields) for fields in reports]  # type: ignore[arg-type]  # keys and types are those of RankReport


_KIT_DIRS: Final = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_cli") + os.sep,
)


def implementation_traceback(exc: BaseException) -> str:
    """``exc``'s traceback without the testing kit's and the command line's own frames
    (the runner calling the implementation), so it starts in the implementation."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not os.path.abspath(f.filename).startswith(_KIT_DIRS)
    ]
    text = "".join(traceback.format_list(frames))
    head = "Traceback (most recent call last):\n" if text else ""
    return head + text + "".join(traceback.format_exception_only(type(exc), exc))


def run_on_rank(
    ctx: RankContextLike,
    job: tuple[Implementation, GatherCase, int]
    | tuple[Implementation, GatherCase, int, str | None],
) -> object:
    """Run one case on this rank: the rank function of ``vargather.testing`` pools.

    ``job`` is ``(implementation, case, batch token)``, or with a fourth item, the
    digest of the oracle's output for a large case (``run_cases`` sends it; without it
    a rank rebuilds the oracle's output to compare). Exceptions are caught and
    reported; after one, the rest of the same batch is skipped on this rank (its
    peers may be left in a collective, so nothing after it can be trusted).
    """
    impl, case, token = job[:3]
    expected_digest = job[3] if len(job) > 3 else None
    if _POISONED and _POISONED[0] == token:
        return RankReport(ctx.rank, ctx.rank, skipped="an earlier case of its batch raised here")
    try:
        with repeatable():
            return _run_one(ctx, impl, case, expected_digest)
    except Exception as exc:
        _POISONED[:] = [token]
        return _error_report(ctx, exc)


def _error_report(ctx: RankContextLike, exc: Exception) -> RankReport:
    """This rank's report of ``exc``, raised while it ran a case."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module != "builtins":
        name = f"{module}.{name}"
    dist_error: object = getattr(torch.distributed, "DistError", None)
    collective = isinstance(exc, CollectiveError) or (
        isinstance(dist_error, type) and isinstance(exc, dist_error)
    )
    return RankReport(
        ctx.rank,
        ctx.rank,
        error=(name, str(exc), implementation_traceback(exc)),
        collective_failed=collective,
    )


def run_coalesced_on_rank(
    ctx: RankContextLike,
    job: tuple[Implementation, tuple[GatherCase, ...], tuple[str | None, ...]],
) -> list[RankReport]:
    """Run a coalesced batch on this rank: the rank function of ``run_coalesced``.

    ``job`` is ``(implementation, cases, digests)`` (``digests[i]``: the oracle's output
    digest for a large case, else ``None``): one coalesced call of every case's shard,
    then one backward over every output. One ``RankReport`` per case comes back, as if
    the case had run alone; an exception becomes this rank's report for every case.
    """
    impl, cases, digests = job
    try:
        with repeatable():
            return _run_coalesced(ctx, impl, cases, digests)
    except Exception as exc:
        return [_error_report(ctx, exc)] * len(cases)


def rank_preflight(ctx: RankContextLike, payload: tuple[object, ...]) -> str:
    """Rank function: import ``MODULE:ATTR`` in this rank (``payload``: the reference,
    its search path, and optionally the backend to emulate, installed first); returns
    the callable's qualified name.

    Rank processes inherit the parent's ``sys.path`` when spawned; a pool started before
    the parent fixed its path gets the fix here (it lasts as long as the rank process).
    """
    ref, search_path, *rest = payload
    del ctx
    if rest and rest[0] is not None:
        from .emulate import activate

        activate(str(rest[0]))  # before the import: names it binds get the emulation
    fn = load_callable(str(ref), tuple(str(p) for p in search_path))  # type: ignore[attr-defined]  # a tuple of paths
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"

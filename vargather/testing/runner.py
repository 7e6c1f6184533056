"""The testing kit's runner: imports the implementation under test and runs cases on it.

Where it sits: above ``cases`` (what to run) and ``judge`` (whether the answer is
right), below ``properties`` and the command line. It is the kit's one importer of
implementations under test (``load_callable``: in the parent, to fail early with a clear
message, and in every rank process), the rank side (``run_on_rank``, module level so a
pool can pickle it: one case on one rank, a ``RankReport`` back) and the parent side
(``run_cases``: batches on ``vargather.testing`` pools, one round trip per world size,
each case judged into a ``Verdict``). ``run_coalesced``/``run_coalesced_on_rank`` run
a batch as ONE call of the implementation's coalesced form (each case one tensor, one
backward over every output) and still judge each case alone, with the same pieces.
``describe`` renders a case with the public command that re-runs it, ``python -m
vargather repro`` (``describe_coalesced``: a tensor of a coalesced call, with the call).
"""

from __future__ import annotations

import ast
import functools
import importlib
import itertools
import os
import shlex
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import torch

from vargather import CONTRACTS, CollectiveError, VarGatherError

from .calls import CallTemplate, group_object, parse_call
from .cases import (
    COMPAT,
    DIGEST_MIN_BYTES,
    VARGATHER,
    GatherCase,
    Implementation,
    RankReport,
    TensorBytes,
    bytes_of,
    digest_of,
    expected_output,
)
from .cases import dtype_name as dtype_name
from .compiled import patient_default_group
from .judge import Failure, judge, output_mismatch
from .pool import (
    PoolFailure,
    PoolStartError,
    RankCrashed,
    RankError,
    RankHung,
    RankPool,
    get_pool,
)
from .scale import payload_summary

__all__ = [
    "ImplementationError",
    "RankContextLike",
    "Verdict",
    "backend_refusals",
    "check_cases",
    "describe",
    "describe_coalesced",
    "example_counts",
    "gloo_transports",
    "load_callable",
    "parse_impl_ref",
    "prepend_import_paths",
    "rank_preflight",
    "repro_args",
    "reset_example_counts",
    "run_cases",
    "run_coalesced",
    "run_coalesced_on_rank",
    "run_on_rank",
    "short_traceback",
    "transport_refusals",
]


class ImplementationError(VarGatherError, ValueError):
    """The implementation under test cannot be used: ``MODULE:ATTR`` is malformed, does
    not import, has no such attribute, or is not callable."""


# --- the one importer --------------------------------------------------------------------


def parse_impl_ref(ref: str) -> tuple[str, tuple[tuple[str, object], ...] | None]:
    """``MODULE:ATTR`` or ``MODULE:ATTR(key=literal, ...)`` split into the reference and
    the constructor's keyword arguments (``None``: plain). Only keyword values that
    ``ast.literal_eval`` accepts; nothing is evaluated as code."""
    text = ref.strip()
    if not text.endswith(")") or "(" not in text:
        return ref, None
    base, _, args = text.partition("(")
    bad = ImplementationError(f"must be MODULE:ATTR or MODULE:ATTR(key=literal, ...), got {ref!r}")
    try:
        tree = ast.parse(f"f({args}", mode="eval").body
    except SyntaxError:
        raise bad from None
    if not isinstance(tree, ast.Call) or tree.args:
        raise bad
    kwargs: list[tuple[str, object]] = []
    for kw in tree.keywords:
        if kw.arg is None:
            raise bad
        try:
            kwargs.append((kw.arg, ast.literal_eval(kw.value)))
        except ValueError:
            raise ImplementationError(
                f"{ref}: the value of {kw.arg}= must be a Python literal (a number, string, "
                "bool, None, or a tuple/list/dict of them)"
            ) from None
    return base.strip(), tuple(kwargs)


def _split_ref(ref: str) -> tuple[str, str]:
    ref = parse_impl_ref(ref)[0]
    module, sep, attr = ref.partition(":")
    ok = (
        sep == ":"
        and ":" not in attr
        and all(p.isidentifier() for p in module.split("."))
        and all(p.isidentifier() for p in attr.split("."))
    )
    if not ok:
        raise ImplementationError(
            f"must be MODULE:ATTR, e.g. mypkg.distributed:all_gather, got {ref!r}"
        )
    return module, attr


def _where(paths: Sequence[str]) -> str:
    pythonpath = os.environ.get("PYTHONPATH", "")
    here = f"the current directory ({paths[0]})" if paths else "sys.path"
    return f"MODULE is imported from {here}" + (
        f" and PYTHONPATH ({pythonpath})" if pythonpath else " and PYTHONPATH (not set)"
    )


def short_traceback(err: BaseException, limit: int = 6) -> str:
    """The last ``limit`` frames of ``err``'s traceback, without importlib's and this
    module's own, then the exception itself."""
    noise = (os.path.abspath(__file__), os.path.abspath(importlib.__file__ or ""))
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith("<frozen") and os.path.abspath(f.filename) not in noise
    ][-limit:]
    text = "".join(traceback.format_list(frames))
    return ("Traceback (most recent call last):\n" + text if text else "") + "".join(
        traceback.format_exception_only(type(err), err)
    ).rstrip()


def prepend_import_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` first on ``sys.path``, in order, unless already there."""
    for path in reversed(paths):
        here = os.path.abspath(path)
        if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
            sys.path.insert(0, here)


def load_callable(ref: str, search_path: Sequence[str] = ()) -> Callable[..., object]:
    """Import ``MODULE`` (``search_path`` entries first on ``sys.path``) and return its
    ``ATTR`` (dotted within the module allowed: ``mod:AllGather.apply``).

    Raises ``ImplementationError`` saying what went wrong (after ``ref``, except for a
    malformed ``ref``): no such module (and where it was looked for), an import that raised (with
    the tail of its traceback), no such attribute, not a callable.
    """
    module_name, attr = _split_ref(ref)
    prepend_import_paths(search_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (
            module_name == err.name or module_name.startswith(err.name + ".")
        ):
            raise ImplementationError(
                f"{ref}: cannot import module {module_name!r}: no module named "
                f"{err.name!r}. {_where(search_path)}."
            ) from None
        raise ImplementationError(
            f"{ref}: importing {module_name!r} failed: a module it imports is "
            f"missing: {err}\n" + short_traceback(err)
        ) from None
    except BaseException as err:  # a module whose import raises anything at all
        if isinstance(err, KeyboardInterrupt):
            raise
        raise ImplementationError(
            f"{ref}: importing {module_name!r} failed: {type(err).__name__}: {err}\n"
            + short_traceback(err)
        ) from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(module, "__file__", None) or module_name
            raise ImplementationError(
                f"{ref}: {module_name!r} ({where}) has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ImplementationError(
            f"{ref}: {attr!r} is a {type(obj).__name__}, not a callable; expected "
            "ATTR(t, dim, sizes) like the seed's all_gather = AllGather.apply"
        )
    return obj


_RESOLVED: dict[tuple[str | None, tuple[str, ...]], Callable[..., object]] = {}


def _resolve(impl: Implementation) -> Callable[..., object]:
    key = (impl.ref, impl.search_path)
    fn = _RESOLVED.get(key)
    if fn is None:
        if impl.ref is None:
            from vargather import all_gather_v_with_layout

            fn = all_gather_v_with_layout
        else:
            fn = load_callable(impl.ref, impl.search_path)
        _RESOLVED[key] = fn
    return fn


def _resolve_compiled(impl: Implementation) -> Callable[..., object]:
    """What a compiled step calls: ``ATTR``, or for vargather's own implementation
    ``all_gather_v`` (its ``_with_layout`` form hands back a ``Layout`` of Python ints,
    which needs the sizes while tracing: a graph break without them)."""
    if impl.ref is None:
        import vargather

        return vargather.all_gather_v
    return _resolve(impl)


def _resolve_coalesced(impl: Implementation) -> Callable[..., object]:
    ref = impl.coalesced_form
    if ref is None:
        raise ImplementationError(f"{impl.label} has no coalesced form")
    key = (ref, impl.search_path)
    fn = _RESOLVED.get(key)
    if fn is None:
        fn = _RESOLVED[key] = load_callable(ref, impl.search_path)
    return fn


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


# --- the rank side ------------------------------------------------------------------------


class RankContextLike(Protocol):
    """What ``run_on_rank`` needs from ``vargather.testing.RankContext``."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def subgroup(self, ranks: Sequence[int]) -> object: ...


class _LocalContext:
    """The context ``run_on_rank`` gets in-process (torch.distributed not initialized)."""

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
    fn = _resolve(impl) if case.compile_backend is None else _resolve_compiled(impl)
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
        template = _template(impl.call)
        out = None
        if template.uses("out"):  # a preallocated output the call fills
            out = torch.empty(case.output_shape, dtype=x.dtype, device=x.device)
        args, keywords = template.build(
            {
                "x": x,
                "dim": case.dim,
                "sizes": sizes,
                "shapes": [list(s) for s in case.shapes],
                "group": group_object(group),
                "grad": case.contract,
                "out": out,
            }
        )
        result = _invoke(fn, case, x, tuple(args), dict(keywords))
    elif impl.convention == "seed":
        result = _invoke(fn, case, x, (*head, sizes), {})
    else:
        kwargs: dict[str, object] = {"grad": case.contract} if impl.takes_grad else {}
        if sizes is not None:
            kwargs["sizes"] = sizes
        if case.members is not None:
            kwargs["group"] = group
        if impl.transports is not None:
            kwargs["transport"] = case.transport
        result = _invoke(fn, case, x, head, kwargs)
    return _unpack(impl, case, result)


def _invoke(
    fn: Callable[..., object],
    case: GatherCase,
    x: torch.Tensor,
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> object:
    """``fn(*args, **kwargs)``, or inside the compiled step of ``case.compile_backend``
    (``vargather.testing.compiled``; the shard ``x`` is among the arguments)."""
    if case.compile_backend is None:
        return fn(*args, **kwargs)
    from .compiled import call_compiled  # torch.compile only where a case asks

    return call_compiled(fn, case, x, args, kwargs)


@functools.lru_cache(maxsize=16)
def _template(text: str) -> CallTemplate:
    """A call template, parsed once per process (``calls.parse_call``)."""
    return parse_call(text)


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


def _emulating() -> bool:
    module = sys.modules.get(f"{__package__}.emulate")
    return module is not None and module.installed() is not None


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
        mismatch = output_mismatch(out.detach().cpu(), expected_output(case))
    return TensorBytes.digested(out, mismatch)


def _enter(
    ctx: RankContextLike, impl: Implementation, case: GatherCase
) -> tuple[object, int] | None:
    """Ready this rank for ``case``: the emulation installed, the case checked against
    the world and ``impl``; the gather group (``None``: the default group) and this
    rank's rank in it, or ``None`` when this rank is outside the case's subgroup."""
    if impl.emulate is not None or _emulating():
        from .emulate import activate

        activate(impl.emulate)
    group: object = None
    grank = ctx.rank
    if case.members is not None:
        group = ctx.subgroup(list(case.members))  # collective: every world rank calls it
        if ctx.rank not in case.members:
            return None
        grank = case.members.index(ctx.rank)
    elif ctx.world_size != case.group_size:
        raise RuntimeError(
            f"case for {case.group_size} rank(s) sent to a world of {ctx.world_size}"
        )
    if case.contract not in impl.contracts:
        raise ValueError(f"{impl.label} does not claim grad={case.contract!r}")
    if impl.transports is None and case.transport != "auto":
        raise ValueError(f"{impl.label} takes no transport, but the case asks {case.transport!r}")
    return group, grank


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
    fn = _resolve_coalesced(impl)
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
    job: tuple[Implementation, GatherCase, int] | tuple[Implementation, GatherCase, int, str],
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

    ``job`` is ``(implementation, cases, digests)``: every case's shard is built,
    the implementation's coalesced form is called once with all of them (each case
    one tensor: its own dtype, shape, ``dim``, memory layout and ``sizes`` form; the
    batch's one contract and transport), and when some case requires grad, one
    backward runs over every output, each with its case's upstream gradient on this
    rank. One ``RankReport`` per case comes back, as if the case had run alone
    (``digests[i]``: the oracle's output digest for a large case, else ``None``). An
    exception becomes this rank's report for every case of the batch.
    """
    impl, cases, digests = job
    try:
        return _run_coalesced(ctx, impl, cases, digests)
    except Exception as exc:
        return [_error_report(ctx, exc)] * len(cases)


# --- the parent side: running -----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The judgement of one case: ``failures`` is empty when it passed."""

    case: GatherCase
    implementation: Implementation
    failures: tuple[Failure, ...] = ()
    not_run: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures and not self.not_run


_COUNTS: Counter[tuple[str, str]] = Counter()
_TOKENS = itertools.count(1)


def example_counts() -> dict[tuple[str, str], int]:
    """Cases run and judged in this process, by (implementation label, world)."""
    return dict(_COUNTS)


def reset_example_counts() -> None:
    _COUNTS.clear()


def _world_label(case: GatherCase) -> str:
    return "uninitialized" if not case.initialized else f"W={case.world_size}"


def run_cases(
    cases: Sequence[GatherCase],
    implementation: Implementation = VARGATHER,
    *,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> list[Verdict]:
    """Run ``cases`` and judge them; one pool round trip per world size.

    ``pool_factory(world_size)`` defaults to ``vargather.testing.get_pool``. Cases with
    ``initialized=False`` run in this process, which must not have initialized
    torch.distributed.
    """
    factory = pool_factory or get_pool
    verdicts: list[Verdict | None] = [None] * len(cases)
    by_world: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        if not case.initialized:
            verdicts[i] = _run_in_process(case, implementation)
        else:
            by_world.setdefault(case.world_size, []).append(i)
    for world, indices in by_world.items():
        for i, verdict in _run_world(factory, world, [cases[i] for i in indices], implementation):
            verdicts[indices[i]] = verdict
    done = [v for v in verdicts if v is not None]
    for v in done:
        if not v.not_run:
            _COUNTS[(implementation.label, _world_label(v.case))] += 1
    return done


def run_coalesced(
    batch: Sequence[GatherCase],
    implementation: Implementation = VARGATHER,
    *,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> list[Verdict]:
    """Run ``batch`` as ONE coalesced call on every rank and judge each case alone.

    Each case is one tensor of the call (``run_coalesced_on_rank``); one job crosses to
    the pool. Every case gets its own ``Verdict`` from the judge, as if it had run
    alone (forward bit for bit, gradients under the batch's contract). When the world
    crashes or hangs, every case of the call fails with the pool's diagnosis (there is
    no smaller call to blame: the tensors were gathered together). The cases must share
    the world size, contract and transport (``ValueError`` otherwise), and
    ``implementation`` must have a coalesced form (``Implementation.coalesced_form``).
    """
    cases = list(batch)
    if not cases:
        return []
    for case in cases:
        _check_coalesced(case, cases[0])
    impl = implementation
    if impl.coalesced_form is None:
        raise ValueError(f"{impl.label} has no coalesced form")
    world = cases[0].world_size
    digests = tuple(_expected_digest(c) for c in cases)
    pool = (pool_factory or get_pool)(world)
    try:
        (per_rank,) = pool.run_many(run_coalesced_on_rank, [(impl, tuple(cases), digests)])
    except (PoolFailure, RankError) as exc:
        failure = _pool_failure(exc, world, len(cases), coalesced=True)
        return [Verdict(c, impl, (failure,)) for c in cases]
    per_case = [[reports[i] for reports in per_rank] for i in range(len(cases))]
    _discard_if_suspect(pool, per_case)
    verdicts = [
        Verdict(c, impl, tuple(judge(c, impl, reports, call=_coalesced_call(impl, i, c))))
        for i, (c, reports) in enumerate(zip(cases, per_case, strict=True))
    ]
    for v in verdicts:
        _COUNTS[(impl.label, _world_label(v.case))] += 1
    return verdicts


def _coalesced_call(impl: Implementation, index: int, case: GatherCase) -> str:
    """How a failure names tensor ``index`` of a coalesced call."""
    name = (impl.coalesced_form or "").partition(":")[2].rsplit(".", 1)[-1]
    return f"{name}(tensor #{index}, dim={case.dim})"


def _discard_if_suspect(pool: RankPool, per_rank_lists: Sequence[Sequence[object]]) -> None:
    """Discard ``pool``'s world when the reports say it must not serve another call."""
    suspect = _world_suspect(per_rank_lists)
    if suspect is not None:
        discard = getattr(pool, "discard_world", None)
        if discard is not None:
            discard(suspect)


def _job(
    impl: Implementation, case: GatherCase, token: int
) -> tuple[Implementation, GatherCase, int] | tuple[Implementation, GatherCase, int, str]:
    digest = _expected_digest(case)
    return (impl, case, token) if digest is None else (impl, case, token, digest)


def _expected_digest(case: GatherCase) -> str | None:
    """The oracle's output digest a rank compares a large case's output with (``None``:
    a small case, whose output bytes cross the pipe)."""
    if case.output_nbytes < DIGEST_MIN_BYTES:
        return None
    return case.expected().output_digest


_COLLECTIVE_MARKS: Final = (
    "distributed_c10d",
    "DistBackendError",
    "DistError",
    "CollectiveError",
    "gloo",
    "Gloo",
    "NCCL",
    "Timed out",
    "timed out",
    "Connection closed",
)


def _world_suspect(per_rank_lists: Sequence[Sequence[object]]) -> str | None:
    """Why the world that produced these reports must not serve another call: a rank
    raised from inside a collective (its traceback or error names torch.distributed or
    the backend), or the ranks raised unlike errors (some may be left mid-collective)."""
    for per_rank in per_rank_lists:
        if any(isinstance(r, RankReport) and r.collective_failed for r in per_rank):
            return "a collective failed in a rank (it raised a collective error)"
        errors = [r.error for r in per_rank if isinstance(r, RankReport) and r.error is not None]
        if not errors:
            continue
        for name, message, tb in errors:
            if any(mark in f"{name} {message} {tb}" for mark in _COLLECTIVE_MARKS):
                return f"a collective failed in a rank ({name}: {message.splitlines()[0][:200]})"
        answered = [r for r in per_rank if isinstance(r, RankReport) and not r.skipped]
        if len(errors) != len(answered) or len({(n, m) for n, m, _ in errors}) != 1:
            return "the ranks raised unlike errors: some may be left inside a collective"
    return None


def _run_world(
    factory: Callable[[int], RankPool],
    world: int,
    cases: Sequence[GatherCase],
    impl: Implementation,
) -> list[tuple[int, Verdict]]:
    """Run ``cases`` on the ``world``-rank pool in one round trip. When the world dies or
    hangs, the case that killed it is the one blamed and every other case keeps its own
    verdict: the ranks say which case they were in (``in_flight``); that case runs
    alone on a fresh world and, when it fails alone, the cases before and after it are
    re-run without it (their results died with the world); otherwise the batch is
    bisected on fresh worlds. After a collective error the world is discarded so the
    next call gets a fresh one."""
    token = (os.getpid() << 32) + next(_TOKENS)
    jobs = [_job(impl, case, token) for case in cases]
    pool = factory(world)
    try:
        results = pool.run_many(run_on_rank, jobs)
    except (PoolFailure, RankError) as exc:
        if len(cases) > 1 and isinstance(exc, PoolFailure) and not isinstance(exc, PoolStartError):
            killer = _in_flight_case(exc, len(cases))
            if killer is not None:
                blamed = _run_world(factory, world, [cases[killer]], impl)
                if any(f.kind in ("crash", "hang") for _, v in blamed for f in v.failures):
                    before = _run_world(factory, world, cases[:killer], impl) if killer else []
                    after = _run_world(factory, world, cases[killer + 1 :], impl)
                    return [
                        *before,
                        (killer, blamed[0][1]),
                        *[(i + killer + 1, v) for i, v in after],
                    ]
            half = len(cases) // 2
            first = _run_world(factory, world, cases[:half], impl)
            second = _run_world(factory, world, cases[half:], impl)
            out = first + [(i + half, v) for i, v in second]
            if any(f.kind in ("crash", "hang") for _, v in out for f in v.failures):
                return out
            # Neither half fails alone: only the batch as a whole kills the world.
            failure = _pool_failure(exc, world, len(cases), together=True)
            return [(i, Verdict(c, impl, (failure,))) for i, c in enumerate(cases)]
        failure = _pool_failure(exc, world, len(cases))
        return [(i, Verdict(c, impl, (failure,))) for i, c in enumerate(cases)]
    _discard_if_suspect(pool, results)
    return [
        (i, _verdict(c, impl, per_rank))
        for i, (c, per_rank) in enumerate(zip(cases, results, strict=True))
    ]


def _in_flight_case(exc: PoolFailure, batch: int) -> int | None:
    """The earliest case of the batch some rank was still inside when the world failed
    (a dead rank's case is the one that killed it), or None when no rank says."""
    in_flight = getattr(exc, "in_flight", None) or {}
    indices = [i for i in in_flight.values() if 0 <= i < batch]
    return min(indices) if indices else None


def exc_kind(exc: BaseException) -> str:
    """The judge's failure kind for a pool failure: ``crash``, ``hang`` or ``error``."""
    if isinstance(exc, RankCrashed):
        return "crash"
    if isinstance(exc, RankHung):
        return "hang"
    return "error"


def _pool_failure(
    exc: PoolFailure | RankError,
    world: int,
    batch: int,
    *,
    together: bool = False,
    coalesced: bool = False,
) -> Failure:
    kind = exc_kind(exc)
    if coalesced:
        message = (
            f"the {world}-rank world failed running one coalesced call of {batch} "
            f"tensor(s), this case's among them: {type(exc).__name__}"
        )
    elif batch == 1:
        message = f"the {world}-rank world failed running this case: {type(exc).__name__}"
    elif together:
        message = (
            f"the {world}-rank world failed running a batch of {batch} case(s) containing "
            f"this one, though no part of the batch fails alone: {type(exc).__name__}"
        )
    else:
        message = (
            f"the {world}-rank world failed while running a batch of {batch} case(s) "
            f"containing this one: {type(exc).__name__}"
        )
    return Failure("call", kind, message, detail=str(exc))


def _run_in_process(case: GatherCase, impl: Implementation) -> Verdict:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "a case with initialized=False must run in a process where torch.distributed "
            "is not initialized, but this one has initialized it"
        )
    token = next(_TOKENS)
    report = run_on_rank(_LocalContext(), (impl, case, token))
    _POISONED.clear()
    return _verdict(case, impl, [report])


def _verdict(case: GatherCase, impl: Implementation, per_rank: Sequence[object]) -> Verdict:
    skipped = [r for r, rep in enumerate(per_rank) if isinstance(rep, RankReport) and rep.skipped]
    errors = [r for r, rep in enumerate(per_rank) if isinstance(rep, RankReport) and rep.error]
    if skipped and not errors:
        return Verdict(case, impl, (), f"not run on rank(s) {skipped}: an earlier case raised")
    return Verdict(case, impl, tuple(judge(case, impl, per_rank)))


def check_cases(cases: Sequence[GatherCase], implementation: Implementation = VARGATHER) -> None:
    """Run and judge ``cases``; ``AssertionError`` describing every failing case."""
    verdicts = run_cases(cases, implementation)
    bad = [v for v in verdicts if v.failures]
    if not bad:
        not_run = [v for v in verdicts if v.not_run]
        if not_run:  # cannot happen without a failure; kept so nothing passes silently
            raise AssertionError(f"{len(not_run)} case(s) were not run: {not_run[0].not_run}")
        return
    parts = [f"{len(bad)} of {len(verdicts)} case(s) failed against {implementation.label}:"]
    for v in bad:
        parts.append(describe(v.case, implementation))
        parts.extend(f"  - {f.render()}" for f in v.failures)
    raise AssertionError("\n".join(parts))


def repro_args(case: GatherCase, implementation: Implementation = VARGATHER) -> list[str]:
    """The arguments of ``python -m vargather repro`` that re-run ``case`` against
    ``implementation`` (its reference, call convention, contracts, transports and
    import path carried along)."""
    impl = implementation
    args = [repr(case)]
    if impl.ref is None:
        if impl.contracts != CONTRACTS:
            args += ["--contracts", ",".join(impl.contracts)]
        if impl.transports != VARGATHER.transports:
            args += ["--transports", ",".join(impl.transports or ()) or "none"]
        if impl.emulate is not None:
            args += ["--emulate", impl.emulate]
        return args
    if impl == COMPAT:
        return [*args, "--impl", "compat"]
    args += ["--impl", impl.ref]
    if impl.convention != "vargather":
        args += ["--convention", impl.convention]
    if impl.contracts != CONTRACTS:
        args += ["--contracts", ",".join(impl.contracts)]
    if impl.transports is not None:
        args += ["--transports", ",".join(impl.transports)]
    if impl.convention == "vargather" and not impl.takes_group and impl.call is None:
        args.append("--no-group")
    if impl.convention == "vargather" and not impl.takes_grad and impl.call is None:
        args.append("--no-grad-kw")
    if impl.returns != "auto":
        args += ["--returns", impl.returns]
    if impl.call is not None:
        args += ["--call", impl.call]
    if impl.ctor_takes_dim:
        args.append("--ctor-dim")
    if impl.emulate is not None:
        args += ["--emulate", impl.emulate]
    for path in impl.search_path:
        args += ["--path", path]
    return args


def _shell_quote(arg: str) -> str:
    """``arg`` for a POSIX shell, in double quotes where that is enough (a case's repr
    reads better in them than in ``shlex.quote``'s single quotes)."""
    quoted = shlex.quote(arg)
    if quoted == arg or any(c in arg for c in '"$`\\!'):
        return quoted
    return f'"{arg}"'


def describe(
    case: GatherCase,
    implementation: Implementation = VARGATHER,
    before: Sequence[GatherCase] = (),
) -> str:
    """A failing case in words, with a shell command that re-runs exactly it.

    ``before``: the calls of its call sequence that ran before it on the same world
    (state an implementation carries between calls may be the cause); they are listed,
    and the command re-runs them first, in order."""
    where = (
        "in this process, torch.distributed not initialized"
        if not case.initialized
        else f"on a gloo world of {case.world_size} rank(s)"
        + (f", subgroup {list(case.members)}" if case.members is not None else "")
    )
    memory = [case.memory_of(r) for r in range(case.group_size)]
    case_args = repro_args(case, implementation)
    args = ["python", "-m", "vargather", "repro", *map(repr, before), *case_args]
    command = " ".join(_shell_quote(arg) for arg in args)
    lines = []
    if before:
        lines.append(
            f"call sequence: call {len(before) + 1} failed, after {len(before)} call(s) on "
            "the same world:"
        )
        lines.extend(f"  call {i + 1}: {_one_line(c)}" for i, c in enumerate(before))
    lines += [
        f"case: {implementation.short_name} on {case.group_size} rank(s) {where}",
        f"  per-rank shapes {[tuple(s) for s in case.shapes]} (sizes along dim "
        f"{list(case.sizes)}), dim={case.dim}, dtype={case.dtype}",
        f"  grad={case.contract!r}, transport={case.transport!r}, sizes passed: "
        f"{case.sizes_form}, memory {memory}",
        f"  values={case.values!r}, upstream gradients={case.upstream!r} (different on every "
        f"rank), requires_grad={case.requires_grad}, seed={case.seed}",
        f"  payload: {payload_summary(case.shard_bytes)}",
        f"  reproduce: {command}",
    ]
    return "\n".join(lines)


def describe_coalesced(
    batch: Sequence[GatherCase], index: int, implementation: Implementation = VARGATHER
) -> str:
    """Tensor ``index`` of a coalesced call of ``batch`` that failed, in words: every
    tensor of the call, then the case (``describe``). Its reproduce command re-runs the
    tensor alone through the single-tensor gather, which may pass where the coalesced
    call failed; ``run_coalesced(batch)`` re-runs the call."""
    impl = implementation
    lines = [
        f"coalesced call: tensor #{index} of {len(batch)} failed in one call of "
        f"{impl.coalesced_form} (grad={batch[index].contract!r}, "
        f"transport={batch[index].transport!r}); the call's tensors:"
    ]
    lines.extend(
        f"  tensor #{i}: {_one_line(c)}, sizes passed: {c.sizes_form}, "
        f"requires_grad={c.requires_grad}, seed={c.seed}"
        for i, c in enumerate(batch)
    )
    lines.append(
        "  (the reproduce command below runs this tensor alone through the single gather; "
        "vargather.testing.runner.run_coalesced(cases) re-runs the call, cases as listed "
        "by repr below)"
    )
    lines.extend(f"  {c!r}" for c in batch)
    return "\n".join([*lines, describe(batch[index], impl)])


# --- what the backend refuses ---------------------------------------------------------------


def backend_refusals(ctx: RankContextLike, names: Sequence[str]) -> tuple[str, ...]:
    """Rank function: the dtypes of ``names`` that a plain ``torch.distributed.all_gather``
    on the world group refuses (asked, not hard-coded)."""
    import torch.distributed as dist

    del ctx
    refused: list[str] = []
    for name in names:
        x = torch.zeros(2, dtype=getattr(torch, name))
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        try:
            dist.all_gather(out, x)
        except Exception:
            refused.append(name)
    return tuple(refused)


def _one_line(case: GatherCase) -> str:
    return (
        f"shapes {[tuple(s) for s in case.shapes]}, dim={case.dim}, dtype={case.dtype}, "
        f"transport={case.transport!r}, {max(case.shard_bytes, default=0)} bytes on the "
        "largest shard"
    )


# --- which transports run here ------------------------------------------------------------


def _probe_transport(ctx: RankContextLike, name: str) -> None:
    """Rank function: one small uneven float32 gather with ``transport=name``."""
    from vargather import all_gather_v

    x = torch.zeros(ctx.rank + 1, 2)
    all_gather_v(x, 0, transport=name)  # type: ignore[arg-type]  # names come from TRANSPORT_NAMES at run time


def transport_refusals(names: Sequence[str], *, world_size: int = 2) -> dict[str, str]:
    """The transports vargather itself refuses on this backend, with its message.

    Asked, not hard-coded: each name runs one small uneven gather. A refusal is every
    rank raising the same ``VarGatherError`` (not a ``CollectiveError``, which means the
    transport was accepted and then failed) with the same message; anything else,
    including a wrong result or a crash, leaves the transport in the suite to fail there.
    """
    pool = get_pool(world_size)
    refused: dict[str, str] = {}
    for name in names:
        outcomes = pool.run_outcomes(_probe_transport, name)
        errors = [o.exception for o in outcomes]
        first = errors[0]
        if (
            isinstance(first, VarGatherError)
            and not isinstance(first, CollectiveError)
            and all(type(e) is type(first) and str(e) == str(first) for e in errors)
        ):
            refused[name] = f"{type(first).__name__}: {first}"
    return refused


# --- the properties ---------------------------------------------------------------------------


def gloo_transports() -> tuple[tuple[str, ...], dict[str, str]]:
    """vargather's transports that run on gloo, and why the others do not (asked of
    vargather itself, so a transport added later is checked without editing this)."""
    from vargather.internal import TRANSPORT_NAMES, unsupported_reason

    usable: list[str] = []
    refused: dict[str, str] = {}
    for name in TRANSPORT_NAMES:
        reason = unsupported_reason(name, "gloo")
        if reason is None:
            usable.append(name)
        else:
            refused[name] = reason
    return tuple(usable), refused

"""The testing kit's runner: imports the implementation under test and runs cases on it.

Where it sits: above ``cases`` (what to run) and ``judge`` (whether the answer is
right), below ``properties`` and the command line. It is the kit's one importer of
implementations under test (``load_callable``: in the parent, to fail early with a clear
message, and in every rank process), the rank side (``run_on_rank``, module level so a
pool can pickle it: one case on one rank, a ``RankReport`` back) and the parent side
(``run_cases``: batches on ``vargather.testing`` pools, one round trip per world size,
each case judged into a ``Verdict``). ``describe`` renders a case with the public
command that re-runs it, ``python -m vargather repro``.
"""

from __future__ import annotations

import importlib
import itertools
import os
import shlex
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from vargather import CONTRACTS, CollectiveError, VarGatherError

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
from .judge import Failure, judge, output_mismatch
from .pool import PoolFailure, RankCrashed, RankError, RankHung, RankPool, get_pool
from .scale import payload_summary

__all__ = [
    "ImplementationError",
    "RankContextLike",
    "Verdict",
    "check_cases",
    "describe",
    "example_counts",
    "gloo_transports",
    "load_callable",
    "prepend_import_paths",
    "rank_preflight",
    "repro_args",
    "reset_example_counts",
    "run_cases",
    "run_on_rank",
    "short_traceback",
    "transport_refusals",
]


class ImplementationError(VarGatherError, ValueError):
    """The implementation under test cannot be used: ``MODULE:ATTR`` is malformed, does
    not import, has no such attribute, or is not callable."""


# --- the one importer --------------------------------------------------------------------


def _split_ref(ref: str) -> tuple[str, str]:
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


def rank_preflight(ctx: RankContextLike, payload: tuple[str, tuple[str, ...]]) -> str:
    """Rank function: import ``MODULE:ATTR`` in this rank (``payload``: the reference and
    its search path); returns the callable's qualified name.

    Rank processes inherit the parent's ``sys.path`` when spawned; a pool started before
    the parent fixed its path gets the fix here (it lasts as long as the rank process).
    """
    ref, search_path = payload
    del ctx
    fn = load_callable(ref, search_path)
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
    if hasattr(value, "sizes") and hasattr(value, "offsets"):
        return ("layout", _layout_fields(value))
    return ("other", type(value).__name__)


def _call(
    impl: Implementation, case: GatherCase, x: torch.Tensor, group: object
) -> tuple[object, tuple[object, ...]]:
    fn = _resolve(impl)
    sizes = case.sizes_argument()
    if impl.convention == "seed":
        result = fn(x, case.dim, sizes)
    else:
        kwargs: dict[str, object] = {"grad": case.contract}
        if sizes is not None:
            kwargs["sizes"] = sizes
        if case.members is not None:
            kwargs["group"] = group
        if impl.transports is not None:
            kwargs["transport"] = case.transport
        result = fn(x, case.dim, **kwargs)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor):
        return result[0], _describe_extra(result[1])
    return result, ("none",)


def _backward(out: torch.Tensor, g: torch.Tensor) -> None:
    """``out.backward(g)``, as the backward of the real loss ``Re Σ conj(g) · out``.

    Its gradient for ``out`` is exactly ``g`` (torch's convention for complex tensors
    included), and unlike ``out.backward(g)`` it does not import sympy (torch checks an
    explicit gradient's shape with its symbolic-shape machinery, seconds per process).
    """
    loss = (out * g.conj()).sum().real if g.is_complex() else (out * g).sum()
    loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs


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


def _run_one(
    ctx: RankContextLike, impl: Implementation, case: GatherCase, expected_digest: str | None = None
) -> RankReport | None:
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
    x = case.shard(grank)
    before = x.detach().clone()
    out, extra = _call(impl, case, x, group)
    intact = bytes_of(x) == bytes_of(before)
    if not isinstance(out, torch.Tensor):
        return RankReport(grank, ctx.rank, None, type(out).__name__, extra=extra)
    report = dict(
        rank=grank,
        global_rank=ctx.rank,
        out=_output_report(out, case, expected_digest),
        out_requires_grad=out.requires_grad,
        extra=extra,
        input_intact=intact,
    )
    if case.differentiable:
        note = ""
        if tuple(out.shape) != case.output_shape:
            note = "backward not run: the output has the wrong shape"
        elif not out.requires_grad:
            note = "backward not run: the output does not require grad"
        else:
            _backward(out, case.upstream_grad(grank))
        grad = x.grad
        report["backward_note"] = note
        if isinstance(grad, torch.Tensor):
            report["grad"] = TensorBytes.of(grad)
        else:
            report["grad_type"] = type(grad).__name__
    return RankReport(**report)  # type: ignore[arg-type]  # keys and types are those of RankReport


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
        name = type(exc).__qualname__
        module = type(exc).__module__
        if module != "builtins":
            name = f"{module}.{name}"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        dist_error: object = getattr(torch.distributed, "DistError", None)
        collective = isinstance(exc, CollectiveError) or (
            isinstance(dist_error, type) and isinstance(exc, dist_error)
        )
        return RankReport(
            ctx.rank, ctx.rank, error=(name, str(exc), tb), collective_failed=collective
        )


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
    token_base = os.getpid() << 32
    for world, indices in by_world.items():
        token = token_base + next(_TOKENS)
        jobs = [_job(implementation, cases[i], token) for i in indices]
        pool = factory(world)
        try:
            results = pool.run_many(run_on_rank, jobs)
        except (PoolFailure, RankError) as exc:
            failure = _pool_failure(exc, world, len(indices))
            for i in indices:
                verdicts[i] = Verdict(cases[i], implementation, (failure,))
            continue
        if any(isinstance(r, RankReport) and r.collective_failed for rs in results for r in rs):
            # Its process group may be out of step: no later batch should inherit that
            # (nor the implementation's state that led there).
            pool.restart()
        for i, per_rank in zip(indices, results, strict=True):
            verdicts[i] = _verdict(cases[i], implementation, per_rank)
    done = [v for v in verdicts if v is not None]
    for v in done:
        if not v.not_run:
            _COUNTS[(implementation.label, _world_label(v.case))] += 1
    return done


def _job(
    impl: Implementation, case: GatherCase, token: int
) -> tuple[Implementation, GatherCase, int] | tuple[Implementation, GatherCase, int, str]:
    if case.output_nbytes < DIGEST_MIN_BYTES:
        return (impl, case, token)
    return (impl, case, token, case.expected().output_digest)


def _pool_failure(exc: PoolFailure | RankError, world: int, batch: int) -> Failure:
    kind = (
        "crash"
        if isinstance(exc, RankCrashed)
        else "hang"
        if isinstance(exc, RankHung)
        else "error"
    )
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
    if impl.convention == "vargather" and not impl.takes_group:
        args.append("--no-group")
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
    from vargather._transport import TRANSPORT_NAMES, unsupported_reason

    usable: list[str] = []
    refused: dict[str, str] = {}
    for name in TRANSPORT_NAMES:
        reason = unsupported_reason(name, "gloo")
        if reason is None:
            usable.append(name)
        else:
            refused[name] = reason
    return tuple(usable), refused

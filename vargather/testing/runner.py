"""The testing kit's runner: runs cases on an implementation and judges each one.

Where it sits: above ``cases`` (what to run), ``judge`` (whether the answer is right),
``importer`` (the kit's one importer of implementations under test) and
``rank_runner`` (the rank side), below ``properties`` and the command line. This is
the parent side: batches on ``vargather.testing`` pools, one round trip per world
size, each case judged into a ``Verdict`` and described with the public command that
re-runs it, ``python -m vargather repro``.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from vargather import CONTRACTS, CollectiveError, VarGatherError

from .cases import COMPAT, DIGEST_MIN_BYTES, VARGATHER, GatherCase, Implementation, RankReport
from .judge import Failure, judge, world_failure_text
from .pool import RankPool, get_pool
from .pool_types import PoolFailure, PoolStartError, RankCrashed, RankError, RankHung
from .rank_runner import (
    _POISONED,
    Alone,
    RankContextLike,
    _check_coalesced,
    run_coalesced_on_rank,
    run_on_rank,
)
from .scale import payload_summary


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


def _counted(impl: Implementation, verdicts: list[Verdict]) -> list[Verdict]:
    """``verdicts``, each case run counted in ``example_counts``."""
    for v in verdicts:
        if not v.not_run:
            world = "uninitialized" if not v.case.initialized else f"W={v.case.world_size}"
            _COUNTS[(impl.label, world)] += 1
    return verdicts


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
    return _counted(implementation, [v for v in verdicts if v is not None])


def run_coalesced(
    batch: Sequence[GatherCase],
    implementation: Implementation = VARGATHER,
    *,
    pool_factory: Callable[[int], RankPool] | None = None,
) -> list[Verdict]:
    """Run ``batch`` as ONE coalesced call on every rank (each case one tensor of it)
    and judge each case alone: its own ``Verdict``, as if it had run alone.

    When the world crashes or hangs, every case of the call fails with the pool's
    diagnosis (the tensors were gathered together: no smaller call to blame).
    ``ValueError`` unless the cases share the world size, contract and transport and
    ``implementation`` has a coalesced form.
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
    return _counted(impl, verdicts)


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
    jobs = [(impl, case, token, _expected_digest(case)) for case in cases]
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


def judged(
    batch: Sequence[Any],
    impl: Implementation,
    call: str,
    run: Callable[[], Sequence[Any]],
    judge_one: Callable[[Any, Any], Sequence[Failure]],
) -> list[Verdict]:
    """Each case of ``batch`` judged (``judge_one(case, reports)``) from ``run()``, its
    reports case by case; a world that failed under the batch fails its first case
    (``call``: an error, a crash or a hang, the pool's diagnosis), the rest not run."""
    try:
        results = run()
    except (PoolFailure, RankError) as err:
        message = f"{type(err).__name__}: {world_failure_text(err)}"
        size = batch[0].world_size
        failure = Failure("call", exc_kind(err), message, group_size=size, call=call)
        rest = [Verdict(c, impl, not_run="the world failed earlier") for c in batch[1:]]
        return [Verdict(batch[0], impl, (failure,)), *rest]
    return [
        Verdict(case, impl, tuple(judge_one(case, reports)))
        for case, reports in zip(batch, results, strict=True)
    ]


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
    return Failure("call", kind, message, detail=world_failure_text(exc))


def _run_in_process(case: GatherCase, impl: Implementation) -> Verdict:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "a case with initialized=False must run in a process where torch.distributed "
            "is not initialized, but this one has initialized it"
        )
    token = next(_TOKENS)
    report = run_on_rank(Alone(), (impl, case, token))
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


def repro_command(args: Sequence[str]) -> str:
    """``python -m vargather repro`` with ``args``, as a POSIX shell command line."""
    return " ".join(map(shell_quote, ["python", "-m", "vargather", "repro", *args]))


def reproduction(head: str, items: Iterable[str], args: Sequence[str]) -> str:
    """``head``, each of ``items`` on an indented line, and the ``reproduce:`` line
    (``repro_command(args)``): how a catalogue tells its failing calls."""
    return "\n".join([head, *(f"  {item}" for item in items), f"reproduce: {repro_command(args)}"])


def on_world(initialized: bool, world_size: int) -> str:
    """Where a case ran, in a failure's words."""
    if not initialized:
        return "in this process, torch.distributed not initialized"
    return f"on a gloo world of {world_size} rank(s)"


def shell_quote(arg: str) -> str:
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
    where = on_world(case.initialized, case.world_size)
    where += f", subgroup {list(case.members)}" if case.members is not None else ""
    memory = [case.memory_of(r) for r in range(case.group_size)]
    command = repro_command([*map(repr, before), *repro_args(case, implementation)])
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
    tensor of the call, and the command that re-runs the call (``repro --coalesced``)."""
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
    single = describe(batch[index], impl).splitlines()[:-1]  # the tensor, in words
    command = repro_command(["--coalesced", *map(repr, batch), *repro_args(batch[index], impl)[1:]])
    return "\n".join([*lines, *single, f"  reproduce: {command}"])


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

"""Rank-side functions of tests/test_fused.py and tests/test_coalesced.py (module-level,
so they pickle): scripted sequences of gathers on one world, recording after every call
what the test compares across ranks (outcome, collectives issued, the fused state)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

import vargather
from vargather import _comm, _round_buffers, _round_state
from vargather.testing import RankContext

from ._family_fns import calls_taken


class Step(NamedTuple):
    """One call on every member of ``group`` (``None``: the world).

    ``shapes[r]``/``dtypes[r]``: rank r's shard (for ``op == "co"``: a tuple per tensor).
    ``dim``: an int (``"co"``: an int or a tuple per tensor). ``sizes``: pass the true
    sizes. ``grad``: run a backward with per-rank upstream gradients under that contract.
    """

    op: str  # "v" (all_gather_v) or "co" (all_gather_v_coalesced)
    shapes: tuple[Any, ...]
    dtypes: tuple[Any, ...]
    dim: Any = 0
    group: tuple[int, ...] | None = None
    validate: bool = True
    sizes: bool = False
    transport: str = "auto"
    grad: str | None = None
    rank_dims: tuple[Any, ...] | None = None  # a dim per member, overriding ``dim``


def make_shard(shape: tuple[int, ...], dtype: str, seed: int) -> torch.Tensor:
    """Deterministic values with the awkward bits: NaN, -0.0, inf for floats; small
    integers so that every gradient sum is exact."""
    n = math.prod(shape)
    base = (torch.arange(n, dtype=torch.float64) * 7 + 13 * seed) % 23 - 11
    dt = getattr(torch, dtype)
    if dt == torch.bool:
        return (base > 0).reshape(shape)
    if dt.is_complex:
        return torch.complex(base, -base).to(dt).reshape(shape)
    t = base.to(dt)
    if dt.is_floating_point and n >= 3:
        t[0], t[1], t[2] = float("nan"), -0.0, float("inf")
    return t.reshape(shape)


def upstream(shape: tuple[int, ...], dtype: str, seed: int) -> torch.Tensor:
    n = math.prod(shape)
    values = (torch.arange(n, dtype=torch.float64) * (3 + 2 * seed) + seed) % 17 - 8
    return values.to(getattr(torch, dtype)).reshape(shape)


def grad_shard(shape: tuple[int, ...], dtype: str, seed: int) -> torch.Tensor:
    """Finite values for gradient steps (NaN would make every gradient NaN)."""
    n = math.prod(shape)
    values = (torch.arange(n, dtype=torch.float64) * 5 + 3 * seed) % 19 - 9
    return values.to(getattr(torch, dtype)).reshape(shape)


def _state(group: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (
        dataclasses.astuple(_round_state.state_of(group, "all_gather_v")),
        dataclasses.astuple(_round_state.state_of(group, "all_gather_v_coalesced")),
    )


def reset(group: Any) -> None:
    fresh = dataclasses.asdict(_round_state.FusedState())
    for kind in ("all_gather_v", "all_gather_v_coalesced"):
        _round_state.replace_state(group, kind, **fresh)  # type: ignore[arg-type]


def _sizes_along(shapes: tuple[Any, ...], dim: int) -> list[int]:
    return [s[dim] for s in shapes]


def run_step(ctx: RankContext, step: Step, groups: dict[tuple[int, ...], Any]) -> Any:
    """One step on this rank: ``None`` when it is not a member, else a dict."""
    members = step.group if step.group is not None else tuple(range(ctx.world_size))
    if ctx.rank not in members:
        return None
    group = groups[step.group] if step.group is not None else None
    r = members.index(ctx.rank)
    seed = 31 * ctx.rank + 1
    make = grad_shard if step.grad is not None else make_shard
    dim = step.dim if step.rank_dims is None else step.rank_dims[r]
    before = _comm.collectives_issued()
    state_before = _state(group)
    outcome: dict[str, Any] = {}
    try:
        if step.op == "v":
            x = make(step.shapes[r], step.dtypes[r], seed)
            if step.grad is not None:
                x.requires_grad_(True)
            sizes = _sizes_along(step.shapes, dim) if step.sizes else None
            out = vargather.all_gather_v(
                x,
                dim,
                sizes=sizes,
                group=group,
                validate=step.validate,
                transport=step.transport,  # type: ignore[arg-type]
                grad=(step.grad or "sum"),  # type: ignore[arg-type]
            )
            forward = _comm.collectives_issued() - before
            outs = [out]
            xs = [x]
        else:
            k = len(step.shapes[r])
            dims = dim if isinstance(dim, tuple) else (dim,) * k
            xs = [
                make(s, d, seed + i)
                for i, (s, d) in enumerate(zip(step.shapes[r], step.dtypes[r], strict=False))
            ]
            if step.grad is not None:
                for x in xs:
                    if x.is_floating_point() or x.is_complex():
                        x.requires_grad_(True)
            sizes_arg = None
            if step.sizes:
                sizes_arg = [
                    [step.shapes[q][i][dims[i]] for q in range(len(members))] for i in range(k)
                ]
            outs = vargather.all_gather_v_coalesced(
                xs,
                dim,
                sizes=sizes_arg,
                group=group,
                validate=step.validate,
                transport=step.transport,  # type: ignore[arg-type]
                grad=(step.grad or "sum"),  # type: ignore[arg-type]
            )
            forward = _comm.collectives_issued() - before
        outcome["outputs"] = [o.detach().clone() for o in outs]
        outcome["forward"] = forward
        if step.grad is not None:
            pairs = [
                (o, upstream(tuple(o.shape), str(o.dtype).removeprefix("torch."), seed + i))
                for i, o in enumerate(outs)
                if o.requires_grad
            ]
            torch.autograd.backward([o for o, _ in pairs], grad_tensors=[u for _, u in pairs])
            outcome["grads"] = [None if x.grad is None else x.grad.clone() for x in xs]
    except vargather.VarGatherError as err:
        outcome["error"] = (type(err).__name__, str(err), err.ranks)
    outcome["collectives"] = _comm.collectives_issued() - before
    outcome["state_before"] = state_before
    outcome["state"] = _state(group)
    return outcome


def run_script(ctx: RankContext, steps: list[Step]) -> list[Any]:
    """Every step in order on this rank; the fused state of every group starts fresh."""
    groups: dict[tuple[int, ...], Any] = {}
    for step in steps:  # every rank creates every subgroup, in the same order
        if step.group is not None and step.group not in groups:
            groups[step.group] = ctx.subgroup(step.group)
    reset(None)
    for members, g in groups.items():
        if ctx.rank in members:
            assert isinstance(g, dist.ProcessGroup)
            reset(g)
    found = [run_step(ctx, step, groups) for step in steps]
    reset(None)  # leave the world's state fresh for the next test on this pool
    return found


def views_on_one_rank(ctx: RankContext, coalesced: bool) -> tuple[str, str]:
    """``transport="views"`` in a one-rank gloo world: the error it raises."""
    x = torch.ones(2, 3)
    try:
        if coalesced:
            vargather.all_gather_v_coalesced([x], transport="views")
        else:
            vargather.all_gather_v(x, transport="views")
    except vargather.VarGatherError as err:
        return type(err).__name__, str(err)
    return "", "no error"


def kept_buffers(ctx: RankContext, world: int) -> list[str]:
    """Calls that exercise the fused round's kept send and receive buffers: the failures
    found on this rank (each result against ``torch.cat`` of every rank's shard, and
    every earlier result unchanged by later calls, so that nothing aliases the buffers)."""
    reset(None)
    failures: list[str] = []
    kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def shards(shape_of: Any, dtype: str, salt: int) -> list[torch.Tensor]:
        return [make_shard(shape_of(q), dtype, 31 * q + salt) for q in range(world)]

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        same = got.dtype == want.dtype and got.shape == want.shape
        same = same and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        if not same:
            failures.append(f"{what}: {got} != {want}")
        kept.append((what, got, want.clone()))

    cases: list[tuple[str, Any, str, int, bool]] = [
        ("f32 rows", lambda q: (3 + q, 4), "float32", 0, False),
        ("f32 rows again", lambda q: (3 + q, 4), "float32", 0, False),
        ("f32 rows, other values", lambda q: (3 + q, 4), "float32", 0, False),
        ("fewer rows (stale bytes)", lambda q: (1 + q % 2, 4), "float32", 0, False),
        ("strided shard", lambda q: (2 + q, 4), "float32", 0, True),
        ("int16, dim 1", lambda q: (2, 1 + q, 3), "int16", 1, False),
        ("complex128, dim 1", lambda q: (2, 2 + q), "complex128", 1, False),
        ("bool", lambda q: (5 + 2 * q,), "bool", 0, False),
        ("empty on rank 0", lambda q: (q, 3), "float64", 0, False),
        # Past _KEEP_RECV_MAX received: a fresh receive buffer closed up in place and
        # returned (sizes differ: gaps), then sizes whose padding is past the waste
        # bound (cut out instead), stale bytes, and a leading dim (not adjacent: kept).
        ("large, fresh buffer", lambda q: (100 + q, 1024), "float32", 0, False),
        ("large, strided", lambda q: (100 + q, 1024), "float32", 0, True),
        ("large, fewer rows", lambda q: (60 + 3 * q, 1024), "float32", 0, False),
        ("large, dim 1", lambda q: (2, 50 + q, 1024), "float32", 1, False),
    ]
    for i, (what, shape_of, dtype, dim, strided) in enumerate(cases):
        for repeat in range(3):  # the first call may grow the capacity; then fused
            salt = 1 + i + 7 * repeat
            every = shards(shape_of, dtype, salt)
            x = every[ctx.rank]
            if strided:  # the same values as a transposed (non-contiguous) tensor
                x = x.t().contiguous().t()
                assert not x.is_contiguous()
            out = vargather.all_gather_v(x, dim)
            check(f"{what} #{repeat}", out, torch.cat(every, dim))
    for repeat in range(3):  # coalesced, offsets in the slot not aligned to the dtypes
        salt = 50 + repeat
        a = shards(lambda q: (3 + q,), "bool", salt)
        b = shards(lambda q: (1 + q, 2), "float32", salt + 1)
        c = shards(lambda q: (2, 1 + q), "complex128", salt + 2)
        outs = vargather.all_gather_v_coalesced([a[ctx.rank], b[ctx.rank], c[ctx.rank]], [0, 0, 1])
        for j, (got, every, d) in enumerate(zip(outs, (a, b, c), (0, 0, 1), strict=True)):
            check(f"coalesced #{repeat} tensor {j}", got, torch.cat(every, d))
    for repeat in range(6):  # sizes move every call: the verdict is re-derived
        every = [
            make_shard((2, (q + repeat) % 3, 3), "float64", 31 * q + repeat) for q in range(world)
        ]
        a = [
            make_shard(((q + repeat) % 3 + 1,), "int64", 31 * q + 60 + repeat) for q in range(world)
        ]
        b = [make_shard((2, 2), "float32", 31 * q + 70) for q in range(world)]
        before = _comm.collectives_issued()
        out = vargather.all_gather_v(every[ctx.rank], 1)
        outs = vargather.all_gather_v_coalesced([a[ctx.rank], b[ctx.rank]])
        issued = _comm.collectives_issued() - before
        if repeat >= 2 and issued != 2:
            failures.append(f"moving sizes #{repeat}: {issued} collectives for two calls")
        check(f"moving sizes #{repeat}", out, torch.cat(every, 1))
        check(f"moving coalesced #{repeat} tensor 0", outs[0], torch.cat(a))
        check(f"moving coalesced #{repeat} tensor 1", outs[1], torch.cat(b))
    for what, got, want in kept:
        if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
            failures.append(f"{what}: changed by a later call")
    return failures


def raw_bytes(t: torch.Tensor) -> bytes:
    """``t``'s elements as bytes (any dtype and strides; conjugation and negation bits
    resolved), for bit-exact comparisons across processes."""
    return t.resolve_conj().resolve_neg().unsqueeze(-1).view(torch.uint8).numpy().tobytes()


def _gathered_bytes(x: torch.Tensor) -> tuple[bytes, bool]:
    """``all_gather_v(x, 0)`` on the world: the result's bytes, and whether the call
    issued a single collective."""
    before = _comm.collectives_issued()
    out = vargather.all_gather_v(x, 0)
    issued = _comm.collectives_issued() - before
    return raw_bytes(out.detach()), issued == 1


def strided_in_the_fused_round(ctx: RankContext, dtype: str) -> list[tuple[bytes, bool]]:
    """Strided shards (every other column, then a transposed block) gathered twice on one
    group, so the second call rides in the fused round; each result's bytes and whether
    its call issued a single collective."""
    seen: list[tuple[bytes, bool]] = []
    for layout in ("sliced", "transposed", "sliced", "transposed"):
        base = make_shard((ctx.rank + 1, 8), dtype, seed=11 + ctx.rank)
        x = base[:, ::2] if layout == "sliced" else base.t().contiguous().t()
        assert not x.is_contiguous() or x.shape[0] == 1
        seen.append(_gathered_bytes(x))
    return seen


def lazy_views_in_the_fused_round(ctx: RankContext, kind: str) -> list[tuple[bytes, bool]]:
    """A lazily conjugated (complex) or negated (float) shard gathered three times on one
    group, so the later calls ride in the fused round; each result's bytes (with the
    conjugation or negation resolved) and whether its call issued a single collective."""
    seen: list[tuple[bytes, bool]] = []
    for _ in range(3):
        dtype = "complex64" if kind == "conj" else "float32"
        base = make_shard((ctx.rank + 1, 3), dtype, seed=21 + ctx.rank)
        x = base.conj() if kind == "conj" else base._neg_view()
        assert x.is_conj() or x.is_neg()
        seen.append(_gathered_bytes(x))
    return seen


class _Tagged(torch.Tensor):
    """A trivial tensor subclass: the fused round must not take its ``data_ptr`` as its
    bytes (``_round_buffers.plain``), yet gather it exactly."""


def wrapped_in_the_fused_round(ctx: RankContext, kind: str) -> list[tuple[bytes, bool]]:
    """A shard as an ``nn.Parameter``, a tensor subclass, or a contiguous view that
    starts past its storage's first element, gathered three times on one group (the
    later calls ride in the fused round, the payload copied by ``memmove`` or by a view
    copy); each result's bytes and whether its call issued a single collective."""
    seen: list[tuple[bytes, bool]] = []
    for _ in range(3):
        base = make_shard((ctx.rank + 3, 5), "float64", seed=41 + ctx.rank)
        if kind == "parameter":
            x = torch.nn.Parameter(base[1:].clone())
        elif kind == "subclass":
            x = base[1:].clone().as_subclass(_Tagged)
        else:
            x = base[1:]  # offset: contiguous, its data one row into the storage
            assert x.is_contiguous()
            assert x.storage_offset() == 5
        seen.append(_gathered_bytes(x))
    return seen


def collectives_per_call(ctx: RankContext, job: tuple[list[int], int, int]) -> list[int]:
    """``calls`` validated gathers of ``rows[rank]`` rows of ``columns`` float32 on a
    fresh state: the collectives each call issued on this rank (the scaling study's
    simulation is checked against these)."""
    rows, columns, calls = job
    reset(None)
    x = torch.zeros(rows[ctx.rank], columns)
    seen = []
    for _ in range(calls):
        before = _comm.collectives_issued()
        out = vargather.all_gather_v(x)
        assert out.shape == (sum(rows), columns)
        seen.append(_comm.collectives_issued() - before)
    reset(None)  # leave the world's state fresh for the next test on this pool
    return seen


def _kept(purpose: str) -> list[torch.Tensor]:
    return list(_round_state.group_memory(dist.group.WORLD).handed.get(purpose) or [])


def _until_one_is_free(purpose: str) -> set[int]:
    """The addresses of the kept buffers, once one of them is free: gloo's worker
    thread lets go of a collective's tensors a moment after ``wait()`` returns."""
    deadline = time.monotonic() + 5.0
    while not any(_round_buffers.unreferenced(b) for b in _kept(purpose)):
        if time.monotonic() > deadline:
            return set()
        time.sleep(0.001)
    return {b.data_ptr() for b in _kept(purpose)}


def handed_back_buffers(ctx: RankContext, world: int) -> list[str]:
    """Large rounds whose result is a view of the buffer they received into (the wide
    round; the gather round past ``_KEEP_RECV_MAX``): once a result is dropped its
    buffer is received into again; a result still held (by a name, or only by autograd
    for the backward) is never written. The failures found on this rank."""
    failures: list[str] = []
    cases = [
        ("wide", "wide round", lambda q: (600 + 10 * q, 1024)),  # ~2.4 MB per rank
        # 124 KiB per rank: the gather round's largest slot, 4 x 128 KiB received
        ("gather", "gather round", lambda q: (31, 1024)),
    ]
    for purpose, what, shape_of in cases:
        reset(None)  # every rank alike: the gather round, nothing learned
        every = [  # small integers: every sum below is exact
            (torch.arange(math.prod(shape_of(q))) % 97 + q).float().view(shape_of(q))
            for q in range(world)
        ]
        want = torch.cat(every)
        x = every[ctx.rank]
        for _ in range(2):  # the state learns its slots
            vargather.all_gather_v(x)
        out = vargather.all_gather_v(x)
        if not torch.equal(out, want):
            failures.append(f"{what}: wrong result")
        del out
        free = _until_one_is_free(purpose)
        if not free:
            failures.append(f"{what}: no kept buffer was free 5 s after its result was dropped")
        out = vargather.all_gather_v(x)
        if out.data_ptr() not in free:
            failures.append(f"{what}: a dropped result's buffer was not received into again")
        if not torch.equal(out, want):
            failures.append(f"{what}: wrong result in a buffer received into again")
        held, copy = out, out.clone()
        del out
        other = vargather.all_gather_v(x * 2)
        if other.data_ptr() == held.data_ptr() or not torch.equal(held, copy):
            failures.append(f"{what}: a held result was written by the next call")
        if not torch.equal(other, want * 2):
            failures.append(f"{what}: wrong result beside a held one")
        del held, other
        leaf = x.clone().requires_grad_(True)
        out = vargather.all_gather_v(leaf)
        loss = (out * out).sum()  # saves ``out`` for the backward
        ptr = out.data_ptr()
        del out
        later = vargather.all_gather_v(x * 3)
        if later.data_ptr() == ptr:
            failures.append(f"{what}: a result autograd saved was received into")
        loss.backward()
        assert leaf.grad is not None
        # sum contract: rank r's gradient is the sum over ranks of 2 * want[its rows]
        rows = [e.shape[0] for e in every]
        start = sum(rows[: ctx.rank])
        expected = 2 * want[start : start + rows[ctx.rank]] * world
        if not torch.equal(leaf.grad, expected):
            failures.append(f"{what}: wrong gradient after a later call")
        del later
    return failures


# --- all_gather_v's steady path ------------------------------------------------------


STEADY_COLS = 64
"""Columns of the steady path's shards (float32: 256 bytes a row; past 512 rows per rank,
128 KiB, the wide round)."""


def steady_shard(rank: int, call: int, rows: int, dtype: str = "float32") -> torch.Tensor:
    """Rank ``rank``'s shard for call ``call``: new values every call, NaN and -0.0 in
    them (``make_shard``'s)."""
    return make_shard((rows, STEADY_COLS), dtype, 100 * call + rank)


def steady_upstream(op: str, shape: tuple[int, ...], rank: int, source: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient for a steady call's output (``op="list"``: for
    rank ``source``'s tensor in it), different on every rank."""
    return upstream(shape, "float32", 7 + rank + (10 * source if op == "list" else 0))


def _steady_forgetter(name: str) -> Any:
    """What forgets the world's state of ``name``'s round and its last steady round (the
    state rule is remembered, so a later run can re-derive the very state objects that
    a remembered round was keyed by)."""

    def forget() -> None:
        _round_state.reset_state(None, name)  # type: ignore[arg-type]  # a collective's name
        _round_state.memory(dist.group.WORLD, name).steady = None  # type: ignore[arg-type]  # the same

    return forget


def steady_gathers(
    ctx: RankContext, job: tuple[str, list[tuple[tuple[int, ...], tuple[str, ...], bool]], int]
) -> list[Any]:
    """Every step ``(rows per rank, dtypes per rank or (), grad)`` as one
    ``all_gather_v`` (``op="v"``) or ``all_gather_list`` (``"list"``) on this rank: its
    result (kept, not copied, until every step ran: a buffer a result still views is
    never received into again) and input gradient under ``grad="sum"`` (per-rank
    upstream gradients), or the error it raised (type name and message); and whether
    ``_fused.steady_exchange`` took the call (sent its round: it then answered or
    raised). ``job``: the op, the steps and the wide round's ``HEADERS_APART_MIN``
    meanwhile (0: the headers always apart)."""
    from vargather import _fused

    op, steps, apart_min = job
    name = "all_gather_v" if op == "v" else "all_gather_list"
    forget = _steady_forgetter(name)
    forget()
    saved_min = _fused.HEADERS_APART_MIN
    _fused.HEADERS_APART_MIN = apart_min  # type: ignore[misc]  # a Final, patched for this run
    _fused.wide_layout.cache_clear()
    kept: list[Any] = []
    try:
        with calls_taken(_fused, "steady_exchange") as taken:
            for i, (rows, dtypes, grad) in enumerate(steps):
                dtype = dtypes[ctx.rank] if dtypes else "float32"
                x = steady_shard(ctx.rank, i, rows[ctx.rank], dtype).requires_grad_(grad)
                before = len(taken)
                try:
                    ys = [vargather.all_gather_v(x)] if op == "v" else vargather.all_gather_list(x)
                    dx = None
                    if grad:
                        ups = [
                            steady_upstream(op, tuple(y.shape), ctx.rank, j)
                            for j, y in enumerate(ys)
                        ]
                        torch.autograd.backward(ys, ups)
                        dx = x.grad
                    kept.append(("ok", [y.detach() for y in ys], dx, any(taken[before:])))
                except vargather.VarGatherError as err:
                    kept.append(("raised", type(err).__name__, str(err), any(taken[before:])))
    finally:
        _fused.HEADERS_APART_MIN = saved_min  # type: ignore[misc]  # restored
        _fused.wide_layout.cache_clear()
        forget()  # nothing remembered under the patched layout outlives it
    return [(k[0], [y.clone() for y in k[1]] if k[0] == "ok" else k[1], *k[2:]) for k in kept]

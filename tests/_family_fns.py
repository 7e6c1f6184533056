"""Rank-side functions of the family's tests (module-level, so they pickle)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather._comm import collectives_issued
from vargather.testing import RankContext, assert_bitwise_equal


def _error(err: Exception) -> tuple[str, str, tuple[int, ...]]:
    return type(err).__name__, str(err), tuple(getattr(err, "ranks", ()))


def noncontiguous_reduce_scatter(ctx: RankContext, _: None) -> tuple[torch.Tensor, torch.Tensor]:
    """A transposed (strided) input along dim 1 gives what its contiguous copy gives."""
    base = torch.arange(6 * 4, dtype=torch.float32).view(6, 4) * (ctx.rank + 1)
    x = base.t()  # (4, 6), strided
    sizes = [1, 3, 2][: ctx.world_size] if ctx.world_size == 3 else [4, 2]
    return vargather.reduce_scatter_v(x, sizes, 1), vargather.reduce_scatter_v(
        x.contiguous(), sizes, 1
    )


def noncontiguous_all_to_all(ctx: RankContext, _: None) -> tuple[torch.Tensor, torch.Tensor]:
    x = (torch.arange(5 * 3, dtype=torch.int64).view(5, 3) + 100 * ctx.rank).t()  # (3, 5)
    send = [2, 3] if ctx.rank == 0 else [5, 0]
    return vargather.all_to_all_v(x, send, -1), vargather.all_to_all_v(x.contiguous(), send, -1)


def mesh_calls(ctx: RankContext, _: None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``group=`` as a 1-D DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    x = torch.full((3, 2), float(ctx.rank + 1))
    rs = vargather.reduce_scatter_v(x, [1, 2], group=mesh)
    a2a = vargather.all_to_all_v(x, [2, 1] if ctx.rank == 0 else [0, 3], group=mesh)
    lst = vargather.all_gather_list(x[: ctx.rank + 1], group=mesh)
    return rs, a2a, lst


def timeouts_and_counts(ctx: RankContext, _: None) -> tuple[int, int, int, int, int]:
    """Collectives per call: validated (exchange + payload on a fresh state, then the
    payload riding in the exchange) and trusted (payload)."""
    from vargather import _round_state

    _round_state.reset_state(None, "reduce_scatter_v")
    x = torch.ones(3, 2)
    c0 = collectives_issued()
    vargather.reduce_scatter_v(x, [1, 2], timeout=5.0)
    validated = collectives_issued() - c0
    c0 = collectives_issued()
    vargather.reduce_scatter_v(x, [1, 2], timeout=5.0)
    c1 = collectives_issued()
    vargather.reduce_scatter_v(x, [1, 2], validate=False)
    c2 = collectives_issued()
    vargather.all_to_all_v(
        x,
        [1, 2] if ctx.rank == 0 else [3, 0],
        recv_sizes=[1, 3] if ctx.rank == 0 else [2, 0],
        validate=False,
    )
    c3 = collectives_issued()
    vargather.all_gather_list(x[: ctx.rank + 1])  # the fused round's state settles
    c4 = collectives_issued()
    vargather.all_gather_list(x[: ctx.rank + 1])
    c5 = collectives_issued()
    return validated, c1 - c0, c2 - c1, c3 - c2, c5 - c4


def trusted_local_problem(ctx: RankContext, _: None) -> Any:
    """validate=False: a local problem is raised on that rank only (the peer, told
    nothing, waits in the payload collective and times out)."""
    try:
        sizes = [1, 2] if ctx.rank == 0 else [1, 1]
        vargather.reduce_scatter_v(torch.ones(3, 2), sizes, validate=False, timeout=1.5)
    except vargather.VarGatherError as err:
        return _error(err)
    return None


def compiled_steps(ctx: RankContext, spec: tuple[str, tuple[str, ...]]) -> dict[str, Any]:
    """A compiled (fullgraph) step per collective on 2 ranks, an empty block on rank 1
    in each: forward, a per-rank loss, backward, under ``backend``. Returns per
    collective the collectives issued (forward, backward) and the gradient, with the
    eager step's gradient beside it."""
    backend, which_ones = spec
    r = ctx.rank
    found: dict[str, Any] = {}

    def step(which: str, x: torch.Tensor) -> torch.Tensor:
        if which == "reduce_scatter_v":
            a = vargather.reduce_scatter_v(x, [5, 0], 0, timeout=20.0)
            return (a * (r + 1)).sum()
        if which == "all_to_all_v":
            send, recv = [[2, 0], [1, 0]][r], [[2, 1], [0, 0]][r]
            b = vargather.all_to_all_v(x, send, 0, recv_sizes=recv, timeout=20.0)
            return (b * (r + 2)).sum()
        c = vargather.all_gather_list(x, shapes=[[2, 3], [0, 3]], timeout=20.0)
        return sum(((t * (k + r + 1)).sum() for k, t in enumerate(c)), torch.zeros(()))

    for which, rows in (
        ("reduce_scatter_v", (5, 5)),
        ("all_to_all_v", (2, 1)),
        ("all_gather_list", (2, 0)),
    ):
        if which not in which_ones:
            continue
        torch._dynamo.reset()
        x = torch.arange(rows[r] * 3, dtype=torch.float32).view(rows[r], 3).requires_grad_(True)
        compiled = torch.compile(functools.partial(step, which), backend=backend, fullgraph=True)
        c0 = collectives_issued()
        loss = compiled(x)
        c1 = collectives_issued()
        loss.backward()
        c2 = collectives_issued()
        xe = x.detach().clone().requires_grad_(True)
        step(which, xe).backward()
        found[which] = ((c1 - c0, c2 - c1), x.grad, xe.grad)
    return found


def done_when_rs(ctx: RankContext, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Issue 20's scenario: 3 ranks, dim 0 or -1, an empty block (rank 1's)."""
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn((5, 4) if dim == 0 else (2, 5), generator=g).requires_grad_(True)
    y = vargather.reduce_scatter_v(x, [2, 0, 3], dim)
    y.backward(torch.full_like(y, float(ctx.rank + 1)))
    assert x.grad is not None
    return y.detach(), x.grad


def then_works(ctx: RankContext, which: str) -> tuple[Any, Any]:
    """Issue 20's misuse scenario: rank 2 passes other sizes (or another dtype), every
    rank raises, and the next call works."""
    x = torch.ones(3, 2, dtype=torch.int32 if which == "dtype" and ctx.rank == 2 else torch.float32)
    sizes = [1, 1, 1] if which == "dtype" or ctx.rank != 2 else [0, 2, 1]
    try:
        vargather.reduce_scatter_v(x, sizes)
        err = None
    except vargather.VarGatherError as e:
        err = _error(e)
    return err, vargather.reduce_scatter_v(torch.ones(3, 2), [1, 1, 1])


def world_barrier(ctx: RankContext, _: None) -> None:
    dist.barrier()


def compiled_three_in_one_graph(ctx: RankContext, _: None) -> tuple[list[str], list[str]]:
    """All three collectives in one fullgraph inductor graph, independent of each other,
    with inductor's peak-memory reordering off (docs/family.md: with it on, torch 2.13
    reorders the ordered-effect operators differently on each rank). Returns the
    collectives this rank issued, forward and backward, in order."""

    import vargather._comm as comm

    log: list[str] = []
    original = comm.translate_collective_errors

    def logged(what: str, info: Any, **kwargs: Any) -> Any:
        log.append(what)
        return original(what, info, **kwargs)

    torch._dynamo.reset()
    r = ctx.rank
    send, recv = [[2, 0], [1, 0]][r], [[2, 1], [0, 0]][r]

    def step(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        a = vargather.reduce_scatter_v(x, [5, 0], 0, timeout=20.0)
        b = vargather.all_to_all_v(y, send, 0, recv_sizes=recv, timeout=20.0)
        c = vargather.all_gather_list(z, shapes=[[2, 3], [0, 3]], timeout=20.0)
        return (
            (a * (r + 1)).sum()
            + (b * (r + 2)).sum()
            + sum(((t * (k + 1)).sum() for k, t in enumerate(c)), torch.zeros(()))
        )

    x = torch.ones(5, 3).requires_grad_(True)
    y = torch.ones(sum(send), 3).requires_grad_(True)
    z = torch.ones([[2, 3], [0, 3]][r]).requires_grad_(True)
    comm.translate_collective_errors = logged  # type: ignore[assignment]  # a logging wrapper, restored below
    try:
        # No config patch: tracing a vargather collective turns off inductor's
        # peak-memory reordering itself (``vargather._compiled.keep_collective_order``).
        loss = torch.compile(step, backend="inductor", fullgraph=True)(x, y, z)
        forward = list(log)
        log.clear()
        loss.backward()
    finally:
        comm.translate_collective_errors = original
    return forward, list(log)


def list_beside_coalesced(ctx: RankContext, _: None) -> tuple[Any, list[list[float]]]:
    """Rank 0 calls ``all_gather_list``, the others ``all_gather_v_coalesced`` of one
    1-d tensor of the same dtype (after a good call, so the round's state is warm):
    every rank raises; then a good call works."""
    x = torch.arange(4, dtype=torch.float32) + ctx.rank
    vargather.all_gather_list(x)
    raised: Any = None
    try:
        if ctx.rank == 0:
            vargather.all_gather_list(x)
        else:
            vargather.all_gather_v_coalesced([x])
    except vargather.VarGatherError as err:
        raised = _error(err)
    return raised, [t.tolist() for t in vargather.all_gather_list(x)]


# --- one round for small payloads (the metadata exchange carries x) ------------------------

FusedCase = tuple[str, str, int, int, bool, tuple[tuple[int, ...], ...]]
"""``(kind, dtype, cols, dim, transposed, sizes)``: ``sizes[j]`` rank j's send sizes
(``all_to_all_v``) or ``sizes[0]`` every rank's sizes (``reduce_scatter_v``)."""


def fused_input(case: FusedCase, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s ``x`` of ``case``: special values (NaN payloads, -0.0, inf) for
    floats, a transposed (strided) view when asked."""
    kind, dtype_name, cols, dim, transposed, sizes = case
    dtype = getattr(torch, dtype_name)
    rows = sum(sizes[rank] if kind == "all_to_all_v" else sizes[0])
    g = torch.Generator().manual_seed(7919 * rank + 31 * rows + cols)
    raw = torch.randint(-300, 300, (rows, cols), generator=g)
    if dtype == torch.bool:
        x = raw > 0
    elif dtype.is_floating_point:
        x = (raw.to(torch.float64) / 7).to(dtype)
        flat = x.view(-1)
        if flat.numel() >= 4:
            bits = {torch.float32: torch.int32, torch.float64: torch.int64}.get(dtype)
            flat[0] = -0.0
            flat[1] = float("inf")
            flat[2] = float("nan")
            if bits is not None:  # a NaN with a payload
                flat[3:4].view(bits).fill_(0x7FC01234 if bits == torch.int32 else -0x7A)
    else:
        x = raw.to(dtype)
    if transposed:  # the same elements, laid out (cols, rows) and viewed back
        x = x.t().contiguous().t()
    return x if dim == 0 else x.t()


def fused_calls(ctx: RankContext, cases: tuple[FusedCase, ...]) -> list[Any]:
    """Each case called on a fresh family state: the collectives each call issued on
    this rank, the group's state after it (one for every kind), and its result."""
    from vargather import _round_state

    _round_state.reset_state(None, "reduce_scatter_v")
    out: list[Any] = []
    for case in cases:
        kind, _, _, dim, _, sizes = case
        x = fused_input(case, ctx.rank, ctx.world_size)
        d = dim if dim == 0 else -1
        before = collectives_issued()
        if kind == "all_to_all_v":
            y = vargather.all_to_all_v(x, list(sizes[ctx.rank]), d)
        else:
            y = vargather.reduce_scatter_v(x, list(sizes[0]), d)
        issued = collectives_issued() - before
        out.append((issued, _round_state.state_of(None, "reduce_scatter_v"), y))
    return out


def fused_calls_wide(ctx: RankContext, job: tuple[tuple[FusedCase, ...], int, str]) -> list[Any]:
    """``fused_calls`` with the all_to_all-shaped round going wide past ``job[1]``-byte
    blocks instead of ``FAMILY_FUSED_MAX``, on the wide round's path ``job[2]``:
    ``"packed"`` (one alltoallv: every slot fits ``PACKED_WIDE_MAX``; its send buffer
    written by ``memmove`` on the CPU), ``"packed-copies"`` (the same, written by
    tensor copies as on other devices), ``"short"`` (rows and blocks apart, blocks as
    they lie, in two alltoallvs: gloo's) or ``"whole"`` (point-to-point messages of
    exactly their slot: every other backend's); restored after."""
    from vargather import _family, _round_state

    cases, fused_max, path = job
    saved = (
        _round_state.FAMILY_FUSED_MAX,
        _family.SHORT_MESSAGES,
        _family.PACKED_WIDE_MAX,
        _family.plain,
    )
    _round_state.FAMILY_FUSED_MAX = fused_max  # type: ignore[misc]  # a Final, patched for this test
    _family.SHORT_MESSAGES = ("gloo",) if path == "short" else ()
    _family.PACKED_WIDE_MAX = 1 << 40 if path.startswith("packed") else -1
    if path == "packed-copies":
        _family.plain = lambda t: False  # type: ignore[assignment]  # no block is plain: tensor copies
    try:
        return fused_calls(ctx, cases)
    finally:
        (
            _round_state.FAMILY_FUSED_MAX,  # type: ignore[misc]  # restored
            _family.SHORT_MESSAGES,
            _family.PACKED_WIDE_MAX,
            _family.plain,
        ) = saved


def fused_subgroup(ctx: RankContext, _: None) -> Any:
    """A subgroup of ranks 0 and 2 keeps its own state: its second call is one round."""
    from vargather import _round_state

    sub = dist.new_group([0, 2])
    if ctx.rank == 1:
        return None
    _round_state.reset_state(sub, "reduce_scatter_v")
    me = 0 if ctx.rank == 0 else 1
    x = torch.arange(6.0).view(3, 2) + 10 * ctx.rank
    counts, results = [], []
    for _ in range(2):
        before = collectives_issued()
        a = vargather.all_to_all_v(x, [1, 2] if me == 0 else [3, 0], group=sub)
        r = vargather.reduce_scatter_v(x, [2, 1], group=sub)
        counts.append(collectives_issued() - before)
        results.append((a, r))
    return counts, results, _round_state.state_of(sub, "reduce_scatter_v")


def fused_autograd(ctx: RankContext, _: None) -> Any:
    """Gradients through the one-round forward: the backward paths are unchanged."""
    from vargather import _round_state

    _round_state.reset_state(None, "reduce_scatter_v")
    send = [1, 2, 0] if ctx.rank == 0 else [2, 0, 1]
    grads = []
    for _ in range(2):
        x = (torch.arange(9.0).view(3, 3) * (ctx.rank + 1)).requires_grad_(True)
        y = vargather.all_to_all_v(x, send)
        z = vargather.reduce_scatter_v(x, [1, 1, 1])
        (y.sum() * 2 + (z * z).sum()).backward()
        assert x.grad is not None
        grads.append(x.grad.clone())
    return grads


# --- all_to_all_v's steady path ------------------------------------------------------


@dataclass(frozen=True)
class SteadyStep:
    """One call of ``steady_calls`` on every rank: ``send[r]`` is rank ``r``'s send
    sizes (rows of 512 float32 values: 2 KiB a row, past the packed round's 16 KiB
    blocks from 8 rows), ``dtype`` rank ``r``'s dtype where given (a mismatch), and
    whether the input requires a gradient."""

    send: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...] = ()
    grad: bool = False
    rows: tuple[int, ...] = ()
    """Rank ``r``'s input rows where given (``sum(send[r])`` otherwise: a mismatch)."""
    dims: tuple[int, ...] = ()
    """Rank ``r``'s ``dim`` as passed where given (0 otherwise)."""
    recv: tuple[tuple[int, ...] | None, ...] = ()
    """Rank ``r``'s ``recv_sizes`` where given (none passed otherwise)."""


STEADY_COLS = 512


@contextlib.contextmanager
def calls_taken(module: Any, name: str, collective: str | None = None) -> Iterator[list[bool]]:
    """For each call of the steady path ``module.name`` meanwhile, whether it took the
    call (sent its round: it then answered, returning something, or raised the peers'
    error), in order; ``module.name`` restored after. With ``collective``: only the
    calls whose first argument (a ``_steady.RoundSpec``) is that collective's."""
    taken: list[bool] = []
    original = getattr(module, name)

    def counted(*args: Any) -> Any:
        if collective is not None and args[0].name != collective:
            return original(*args)
        try:
            found = original(*args)
        except vargather.VarGatherError:
            taken.append(True)
            raise
        taken.append(found is not None)
        return found

    setattr(module, name, counted)
    try:
        yield taken
    finally:
        setattr(module, name, original)


def steady_calls_taken(
    collective: str = "all_to_all_v",
) -> contextlib.AbstractContextManager[list[bool]]:
    """``calls_taken`` of the round's steady path (``_steady.replay``) for
    ``collective``'s calls."""
    from vargather import _steady

    return calls_taken(_steady, "replay", collective)


def steady_input(rank: int, call: int, rows: int, dtype: str = "float32") -> torch.Tensor:
    """Rank ``rank``'s input for call ``call``: small integers, new every call."""
    g = torch.Generator().manual_seed(1000 * call + rank)
    x = torch.randint(-50, 50, (rows, STEADY_COLS), generator=g)
    return x.to(getattr(torch, dtype))


def steady_upstream(rank: int, call: int, rows: int) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient for call ``call`` (differs per rank)."""
    g = torch.Generator().manual_seed(7000 + 1000 * call + rank)
    return torch.randint(-9, 10, (rows, STEADY_COLS), generator=g).float()


def assert_step_answered(
    per_rank: list[list[Any]],
    i: int,
    want: list[torch.Tensor],
    grads_of: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None,
) -> None:
    """Step ``i`` of a steady sequence (``per_rank[r][i]``: rank ``r``'s record, as
    ``_step_record`` writes it) answered on every rank with ``want[r]`` bit for bit, and,
    with ``grads_of``, with the input gradients it gives for the steady upstreams."""
    w = len(per_rank)
    for r in range(w):
        status, got, _, _, _ = per_rank[r][i]
        assert status == "ok", (i, r, per_rank[r][i])
        assert_bitwise_equal(got, want[r])
    if grads_of is not None:
        grads = grads_of([steady_upstream(r, i, want[r].shape[0]) for r in range(w)])
        for r in range(w):
            assert_bitwise_equal(per_rank[r][i][2], grads[r])


def steady_calls(ctx: RankContext, job: tuple[tuple[SteadyStep, ...], str]) -> list[Any]:
    """Every step (``job[0]``) on this rank, in order: its result and input gradient,
    or the error it raised (type name and message); whether ``_steady.replay`` took it
    (sent its round: it then answered or raised); and the round's state after it. ``job[1]``: the wide round's path,
    ``"packed"`` (as configured), ``"direct"`` (direct sends, blocks as they lie:
    gloo's) or ``"direct-whole"`` (direct sends of exactly their slot: every other
    backend's); restored after."""
    from vargather import _family

    steps, path = job
    saved = (_family.SHORT_MESSAGES, _family.PACKED_WIDE_MAX)
    if path.startswith("direct"):
        _family.PACKED_WIDE_MAX = -1
        _family.SHORT_MESSAGES = () if path == "direct-whole" else ("gloo",)
    try:
        return _run_steady_steps(ctx, steps)
    finally:
        _family.SHORT_MESSAGES, _family.PACKED_WIDE_MAX = saved


def _run_steady_steps(ctx: RankContext, steps: tuple[SteadyStep, ...]) -> list[Any]:
    """``steady_calls`` on the configured path."""
    from vargather import _round_state

    _round_state.reset_state(None, "all_to_all_v")
    out: list[Any] = []
    with steady_calls_taken() as answered:
        for i, step in enumerate(steps):
            send = list(step.send[ctx.rank])
            dtype = step.dtypes[ctx.rank] if step.dtypes else "float32"
            rows = step.rows[ctx.rank] if step.rows else sum(send)
            x = steady_input(ctx.rank, i, rows, dtype).requires_grad_(step.grad)
            dim = step.dims[ctx.rank] if step.dims else 0
            recv = step.recv[ctx.rank] if step.recv else None
            call = functools.partial(
                vargather.all_to_all_v, send_sizes=send, dim=dim, recv_sizes=recv
            )
            out.append(_step_record(call, x, ctx.rank, i, step.grad, answered))
    return out


def _step_record(
    call: Any, x: torch.Tensor, rank: int, i: int, grad: bool, answered: list[bool]
) -> tuple[Any, ...]:
    """Step ``i`` of a steady sequence on ``rank``: ``call(x)`` (and its backward with
    this rank's upstream when ``grad``), recorded as ``("ok", y, x.grad, taken, state)``
    or ``("raised", error type, message, taken, state)``; ``taken``: whether the steady
    replay answered it."""
    before = len(answered)
    try:
        y = call(x)
        if grad:
            y.backward(steady_upstream(rank, i, y.shape[0]))
        return ("ok", y.detach(), x.grad if grad else None, any(answered[before:]), _a2a_state())
    except vargather.VarGatherError as err:
        taken = any(answered[before:])
        return ("raised", type(err).__name__, str(err), taken, _a2a_state())


def _a2a_state() -> object:
    """This rank's copy of the all_to_all-shaped round's state on the default group."""
    from vargather import _round_state

    return _round_state.state_of(None, "all_to_all_v")


def steady_two_groups(ctx: RankContext, calls: int) -> list[tuple[bool, bool]]:
    """``all_to_all_v`` on the world and on a second group of the same ranks, call for
    call in turn, the same sizes on each: whether ``_steady.replay`` answered each pair
    (each group keeps its own last steady call), every result checked against the
    other group's (the same inputs, so the same answer)."""
    other = dist.new_group(list(range(ctx.world_size)))
    send = [8 + ctx.rank, 12, 20 - ctx.rank][: ctx.world_size]
    out = []
    with steady_calls_taken() as answered:
        for i in range(calls):
            x = steady_input(ctx.rank, i, sum(send))
            a = vargather.all_to_all_v(x, send)
            b = vargather.all_to_all_v(x, send, group=other)
            assert torch.equal(a, b)
            out.append((answered[-2], answered[-1]))
    return out


def round_kind_changes_under_the_steady_path(ctx: RankContext, calls: int) -> list[Any]:
    """The equal round's slots alike the direct round's: with ``FAMILY_FUSED_MAX`` at 8
    bytes the equal slots are 64 bytes; one call of 16-byte blocks takes the group wide
    with every slot 64 bytes, which goes direct (``PACKED_WIDE_MAX`` below it); then
    ``calls`` calls of 8-byte blocks, after ``SHRINK_AFTER`` of which the group is back
    to equal slots of 64 bytes. Rank 0 makes them with a non-contiguous tensor (no
    steady path: the full path, which runs the state's round), its peers with a
    contiguous one (the steady path, whose remembered round was direct). Per call:
    the input, the result, whether the group's round was direct after it and whether
    the steady path answered the call; restored after."""
    from vargather import _family, _round_state

    saved = (_round_state.FAMILY_FUSED_MAX, _family.PACKED_WIDE_MAX)
    _round_state.FAMILY_FUSED_MAX = 8  # type: ignore[misc]  # a Final, patched for this test
    _family.PACKED_WIDE_MAX = -1
    _round_state.reset_state(None, "all_to_all_v")
    w = ctx.world_size
    out: list[Any] = []
    try:
        with steady_calls_taken() as answered:
            for i in range(3 + calls):
                rows = 2 if i == 2 else 1  # 16-byte blocks once, else 8 (two float32 a row)
                x = steady_input(ctx.rank, i, rows * w)[:, :2].contiguous()
                if ctx.rank == 0 and i > 2:
                    x = x.t().contiguous().t()  # the same values, strided: no steady path
                before = len(answered)
                y = vargather.all_to_all_v(x, [rows] * w, timeout=20.0)
                state = _round_state.state_of(None, "all_to_all_v")
                out.append((x, y, _family.goes_direct(state, w), any(answered[before:])))
    finally:
        (_round_state.FAMILY_FUSED_MAX, _family.PACKED_WIDE_MAX) = saved  # type: ignore[misc]  # restored
    return out


# --- the round's steady replay for reduce_scatter_v and the rooted pair ---------------

ROUND_ROOT = 1
"""The root of the rooted steady calls (not rank 0)."""


@dataclass(frozen=True)
class RoundStep:
    """One call of ``steady_round_calls`` on every rank: ``sizes`` (rows of 2 KiB, as
    ``SteadyStep``'s) are the sizes every rank passes (``reduce_scatter_v``,
    ``scatter_v``) or rank ``r``'s rows (``gather_v``); rank ``bad`` passes float64
    (every rank raises the same ``DTypeMismatchError``); whether the input requires a
    gradient."""

    sizes: tuple[int, ...]
    bad: int = -1
    grad: bool = False


def round_input(name: str, rank: int, call: int, step: RoundStep) -> torch.Tensor:
    """Rank ``rank``'s input of ``name`` for call ``call`` (``scatter_v`` off the root:
    0 rows, only its dtype and trailing shape are read)."""
    if name == "gather_v":
        rows = step.sizes[rank]
    elif name == "scatter_v" and rank != ROUND_ROOT:
        rows = 0
    else:
        rows = sum(step.sizes)
    return steady_input(rank, call, rows, "float64" if rank == step.bad else "float32")


def steady_round_calls(ctx: RankContext, job: tuple[str, tuple[RoundStep, ...], str]) -> list[Any]:
    """Every step (``job[1]``) of collective ``job[0]`` on this rank, in order, as
    ``steady_calls`` reports it (result and input gradient, or the error; whether
    ``_steady.replay`` took the call; the round's state after it), on the wide round's
    path ``job[2]`` (``steady_calls``'); restored after."""
    from vargather import _family, _round_state

    name, steps, path = job
    saved = (_family.SHORT_MESSAGES, _family.PACKED_WIDE_MAX)
    if path.startswith("direct"):
        _family.PACKED_WIDE_MAX = -1
        _family.SHORT_MESSAGES = () if path == "direct-whole" else ("gloo",)
    _round_state.reset_state(None, name)  # type: ignore[arg-type]  # a collective's name
    call = {
        "reduce_scatter_v": lambda x, s: vargather.reduce_scatter_v(x, list(s)),
        "gather_v": lambda x, s: vargather.gather_v(x, ROUND_ROOT),
        "scatter_v": lambda x, s: vargather.scatter_v(x, list(s), ROUND_ROOT),
    }[name]
    out: list[Any] = []
    try:
        with steady_calls_taken(name) as answered:
            for i, step in enumerate(steps):
                x = round_input(name, ctx.rank, i, step).requires_grad_(step.grad)
                sized = functools.partial(call, s=step.sizes)
                out.append(_step_record(sized, x, ctx.rank, i, step.grad, answered))
    finally:
        _family.SHORT_MESSAGES, _family.PACKED_WIDE_MAX = saved
    return out

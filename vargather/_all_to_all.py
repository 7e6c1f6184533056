"""``all_to_all_v``: plan (checks, exchange, validation), payload, autograd.

Where it sits: a family collective on ``_family`` and ``_steady`` (stages 1-3),
``_layout``, ``_buffers`` and ``_comm`` (one alltoallv); ``_api`` calls its ``Route``.

The math is ``all_to_all_v``'s docstring (``_api``): rank ``r`` receives block ``r`` of
every ``x_j`` (``s_{j,r}`` rows along ``dim``, ``S`` the send matrix), so its receive
sizes are column ``r`` of ``S``, and the gradient is the same exchange reversed
(``S^T``). With ``cat_dim = c != dim = d`` (the Ulysses switch) every block rank ``r``
receives has one size along ``d`` and rank ``j`` contributes its own
``m_j = x_j.shape[c]``. Each block travels as the contiguous run of its elements, which
is also the ``(pre_c, m_j, post_c)`` block of ``y_r`` along ``c``: the receive
``Layout`` is the result cut along ``c`` by ``(m_0, ..., m_{W-1})``, the send
``Layout`` ``x_j`` cut along ``d`` by ``s_j``, and the gradient swaps the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Final, NamedTuple

import torch
import torch.distributed as dist

from . import _steady
from ._all_to_all_rows import (
    local_call,
    receive_layout,
    received,
    row_bytes,
    split_layout,
    validate_rows,
)
from ._args import MAX_NDIM, Problem
from ._autograd import planned_function
from ._buffers import compact_rank_major, rank_major_gradient
from ._collectives import CollectiveName
from ._comm import all_to_all_uneven
from ._errors import SizesMismatchError
from ._family import DirectRound, goes_direct, landed, resized_round, send_round
from ._group import GroupInfo
from ._layout import Layout
from ._mesh import call_group
from ._round_buffers import Cut, pack, plain, plain_bytes, plain_in_blocks, region_cutter
from ._round_state import FusedState, advance_blocks, block_room, memory, set_state
from ._rows import FamilyCall, ValidatedOnce, check_tensor, raise_own_problem, rows_changed_only_in
from ._steady import RoundSpec, Steady, answer, keep, run_round
from ._wire import RECORD_SHAPE_AT, ROW_EXTRAS_AT

NAME: Final[CollectiveName] = "all_to_all_v"


@dataclass(frozen=True)
class AllToAllPlan:
    """A validated ``all_to_all_v``: this rank's send blocks and receive blocks as
    ``Layout``s (``send.sizes`` = ``send_sizes``, ``recv.sizes`` = ``recv_sizes``; the
    receive layout's offsets are where each source rank's rows sit in the result).
    ``result``: the payload's result when it rode in the metadata exchange
    (``_family.settle``)."""

    send: Layout
    recv: Layout
    info: GroupInfo
    result: torch.Tensor | None = field(default=None, compare=False, repr=False)


_validated: Final = ValidatedOnce(validate_rows)
"""``validate_rows``, once for the steady state's rows (``_rows.ValidatedOnce``)."""


def plan_all_to_all(
    x: object,
    send_sizes: object,
    recv_sizes: object,
    dim: object,
    info: GroupInfo,
    *,
    validate: object,
    timeout: object,
    requires_grad: bool | None = None,
    steady_key: tuple[object, ...] | None = None,
    cat_dim: object = None,
) -> AllToAllPlan:
    """Stages 1-3: the same error on every rank, or this rank's plan. ``steady_key``
    (``_steady_key``): remember the call for ``_steady.replay`` when it is steady.

    The exchange is skipped only with ``validate=False`` and ``recv_sizes`` given;
    then a local problem is raised on this rank only. Without ``recv_sizes`` the send
    sizes have to travel anyway, so the validated exchange runs.
    """
    call = local_call(
        x, send_sizes, recv_sizes, dim, info, validate, timeout, requires_grad, cat_dim
    )
    if call.timeout is not None:
        info = info.with_timeout(call.timeout)
    send, recv = call.sizes
    trusted = validate is False and recv is not None
    d, c = call.record.normalized_dim, call.extras[-1]
    if trusted or not info.communicates:
        problem = call.record.problem
        alone = send if c == d or not isinstance(x, torch.Tensor) else (int(x.shape[c]),)
        if problem is None and not info.communicates and recv is not None and recv != alone:
            what = "send_sizes" if c == d else f"(x.shape[cat_dim],) = {list(alone or ())}, given"
            problem = Problem(
                SizesMismatchError,
                f"expected recv_sizes == {what} in a world of one rank, got "
                f"recv_sizes={list(recv)} and send_sizes={list(send or ())}",
            )
        raise_own_problem(NAME, problem, info, trusted=trusted)
        assert send is not None
        assert alone is not None
        recv = recv if recv is not None else alone
    else:
        return run_round(_SPEC, call, x, info, steady_key)
    assert isinstance(x, torch.Tensor)  # a problem-free record is a tensor's
    shape = tuple(int(n) for n in x.shape)
    recv_layout = receive_layout(shape, d, c, send[info.rank], recv, x.dtype, info)
    return AllToAllPlan(split_layout(shape, d, send, x.dtype, info), recv_layout, info)


def _plan(
    verdict: tuple[Any, ...], x: object, call: FamilyCall, info: GroupInfo
) -> tuple[AllToAllPlan, list[int]]:
    """Stage 3 after the rows validated (``verdict``: ``validate_rows``'): this rank's
    plan and the bytes rank ``j`` sends rank ``k`` at ``j * W + k``."""
    matrix, c, shapes = verdict
    rank = info.rank
    send = matrix[rank]
    recv = received(matrix, shapes, c, rank)
    assert isinstance(x, torch.Tensor)  # a problem-free record is a tensor's
    d = call.record.normalized_dim
    if shapes is None:
        unit = row_bytes(x.shape, d, x.element_size())
        blocks = [n * unit for s in matrix for n in s]
    else:  # each sender's rows along dim have its own size along cat_dim
        units = [row_bytes(sh, d, x.element_size()) for sh in shapes]
        blocks = [n * units[j] for j, s in enumerate(matrix) for n in s]
    shape = tuple(int(n) for n in x.shape)
    recv_layout = receive_layout(shape, d, c, send[rank], recv, x.dtype, info)
    return AllToAllPlan(split_layout(shape, d, send, x.dtype, info), recv_layout, info), blocks


def _finish(plan: AllToAllPlan, slots: Sequence[torch.Tensor], cut: Cut) -> AllToAllPlan:
    """``plan`` with its result from the bytes each rank sent this rank (``slots``), cut
    from the round's one buffer."""
    result = cut((plan.recv,), tuple(s.numel() for s in slots))[0]
    return AllToAllPlan(plan.send, plan.recv, plan.info, result)


def _outgoing(x: object, call: FamilyCall, info: GroupInfo) -> tuple[torch.Tensor, list[int]]:
    """This rank's payload as ``exchange_blocks`` sends it, as bytes (a problem-free
    call, whose ``x`` is a tensor)."""
    send = call.sizes[0]
    assert isinstance(x, torch.Tensor)
    assert send is not None
    d = call.record.normalized_dim
    unit = row_bytes(x.shape, d, x.element_size())
    if plain_in_blocks(x, d):  # its blocks lie one after the other: its bytes as they lie
        return plain_bytes(x), [n * unit for n in send]
    layout = split_layout(tuple(int(n) for n in x.shape), d, send, x.dtype, info)
    return pack([rank_major_gradient(x.detach(), layout)]), [n * unit for n in send]


def exchange_blocks(x: torch.Tensor, send: Layout, recv: Layout, info: GroupInfo) -> torch.Tensor:
    """The payload: block ``r`` of ``x`` (``send``) to rank ``r``; the blocks received
    (``recv``) concatenated in rank order along ``dim``. A fresh tensor."""
    if not info.communicates:
        return x.clone(memory_format=torch.contiguous_format)
    flat = rank_major_gradient(x, send)  # block r's (pre, s_r, post) elements, r = 0, 1, ...
    received = flat.new_empty(recv.pre * recv.total * recv.post)
    all_to_all_uneven(
        received,
        flat,
        output_splits=[recv.pre * n * recv.post for n in recv.sizes],
        input_splits=[send.pre * n * send.post for n in send.sizes],
        info=info,
        what=f"all_to_all ({NAME} payload)",
    )
    return compact_rank_major(received, recv)


AllToAllVFunction = planned_function(
    "AllToAllVFunction",
    """``y_r = cat_j (block r of x_j)`` with the reverse exchange as its backward.""",
    lambda x, plan: exchange_blocks(x, plan.send, plan.recv, plan.info),
    lambda g, plan: exchange_blocks(g, plan.recv, plan.send, plan.info),
)


# --- the steady path: a call repeating the last one replays its round ------------------


def _kept(key: tuple[object, ...]) -> tuple[object, ...] | None:
    """Where the round keeps a steady call of ``key`` (``_steady_key``'s): a call joined
    along another dim than ``dim`` by its key but for the rows and sizes (Ulysses'
    several shapes, ``_steady.JOINED_KEPT`` of them), else ``None`` (the one kept)."""
    other = key[1]
    assert isinstance(other, tuple)  # the shape outside dim
    dim = key[0]
    assert isinstance(dim, int)
    return key[:6] if key[5] != dim % (len(other) + 1) else None


def _steady_key(
    x: object,
    send_sizes: object,
    recv_sizes: object,
    dim: object,
    validate: object,
    timeout: object,
    cat_dim: object = None,
) -> tuple[object, ...] | None:
    """Everything a validated ``all_to_all_v`` call's plan is a function of, besides its
    group (whose ``Memory.steady`` keeps it), the group's state and the peers' rows, for
    the calls the steady path serves (``None`` for others, the conditions below; a
    timeout, which the steady call validated, is the call's). A key equal but for its
    last three parts (the rows along ``dim``, the send and the receive sizes) is a call
    of the same round with new sizes (``_resized_call``)."""
    if (
        validate is not True
        or (timeout is not None and type(timeout) not in (int, float, timedelta))
        or not _int_sizes(send_sizes)
        or not (recv_sizes is None or _int_sizes(recv_sizes))
        or type(x) is not torch.Tensor
        or type(dim) is not int
        or not (cat_dim is None or type(cat_dim) is int)
    ):
        return None
    assert isinstance(send_sizes, (list, tuple))  # for mypy: _int_sizes checked it
    assert recv_sizes is None or isinstance(recv_sizes, (list, tuple))  # the same
    assert isinstance(x, torch.Tensor)  # for mypy: checked just above
    assert isinstance(dim, int)  # for mypy: the same
    if x.layout != torch.strided or x.is_nested or not plain(x) or not -x.ndim <= dim < x.ndim:
        return None
    requires = x.requires_grad and torch.is_grad_enabled()
    d = dim % x.ndim
    if cat_dim is not None and not -x.ndim <= cat_dim < x.ndim:
        return None
    c = d if cat_dim is None else cat_dim % x.ndim
    shape = x.shape
    other = shape[:d] + shape[d + 1 :]
    recv = None if recv_sizes is None else tuple(recv_sizes)
    return (dim, other, x.dtype, requires, timeout, c, shape[d], tuple(send_sizes), recv)


def _int_sizes(sizes: object) -> bool:
    """Whether ``sizes`` is a list or tuple of ints (the steady paths' kind of sizes)."""
    if type(sizes) not in (list, tuple):
        return False
    assert isinstance(sizes, (list, tuple))  # for mypy: checked just above
    return all(type(n) is int for n in sizes)


def _resized_call(
    steady: Steady[AllToAllPlan],
    key: tuple[object, ...],
    x: torch.Tensor,
    info: GroupInfo,
    pg: dist.ProcessGroup,
    state: FusedState,
) -> AllToAllPlan | None:
    """A call of the steady call's round (its key but for the rows and sizes) with other
    rows and sizes (or in another state): ``None`` (the full path runs) unless the
    sizes are this rank's valid ones, every block fits its slot and the group's state
    still gives the steady call's round (its slots, and its kind: ``goes_direct``).
    Then the round runs with this call's row (``resized_round``); rows that
    ``resized_matrix`` reads are checked there, any other rows go on as the full path
    does after its exchange."""
    w, rank = info.world_size, info.rank
    cat, rows, sizes, recv_sizes = key[5:]
    assert isinstance(sizes, tuple)  # _steady_key's: a tuple of ints
    if steady.key[:6] != key[:6] or len(sizes) != w or min(sizes, default=0) < 0:
        return None
    if (
        sum(sizes) != rows or cat != steady.plan.send.dim
    ):  # joined along another dim: the full path (its own sizes)
        return None
    if recv_sizes is not None:
        assert isinstance(recv_sizes, tuple)  # _steady_key's: a tuple of ints
        if len(recv_sizes) != w or min(recv_sizes, default=0) < 0:
            return None
    send = steady.plan.send
    d = send.dim
    record = steady.call.record
    if send.pre != 1:  # blocks apart in x: the full path (sizes changing are MoE's)
        return None
    if d >= MAX_NDIM:  # past the record's shape words (the peers read the sizes alone)
        return None
    if rows != steady.key[6]:  # another length along dim: this call's own record
        record, _ = check_tensor(x, key[0], info=info, split=True)
        if record.problem is not None:
            return None
    found = steady.round
    room = block_room(state, w)
    if room != found.room or isinstance(found, DirectRound) != goes_direct(state, w):
        return None  # the state's round is another: the full path runs it
    unit = send.post * send.dtype.itemsize  # bytes of one row (pre == 1)
    if any(n * unit > room[rank * w + k] for k, n in enumerate(sizes)):
        return None
    passed = (-1,) * (w + 1) if recv_sizes is None else (w, *recv_sizes)
    extras = (w, *sizes, *passed, d)  # _local_call's words
    call = replace(steady.call, record=record, extras=extras, sizes=(sizes, recv_sizes))
    ridden = resized_round(found, call, info)
    pieces = list(torch.split(plain_bytes(x), [n * unit for n in sizes]))
    buf, raw = send_round(call, info, pg, ridden, pieces)
    matrix = resized_matrix(raw, steady.raw, w, d, room, unit)
    if matrix is None:
        return answer(_SPEC, call, x, info, landed(call, info, pg, state, ridden, buf, raw), key)
    blocks = [n * unit for s in matrix for n in s]
    after = advance_blocks(state, fusable=True, blocks=blocks, world=w)
    if after is not state:
        set_state(pg, NAME, after)
    recv = tuple(s[rank] for s in matrix)
    shape = tuple(int(n) for n in x.shape)
    joined = split_layout((*shape[:d], sum(recv), *shape[d + 1 :]), d, recv, x.dtype, info)
    plan = AllToAllPlan(split_layout(shape, d, sizes, x.dtype, info), joined, info)
    needs = tuple(n * unit for n in recv)
    lies = tuple(n * unit for n in sizes)  # x's blocks as they lie
    steady = Steady(key, call, state, after is state, ridden, raw, plan, needs, lies)
    keep(memory(pg, NAME), None, steady)
    regions = [buf[a : a + n] for a, n in zip(ridden.starts, needs, strict=True)]
    return _finish(plan, regions, region_cutter(buf, ridden.starts))


def resized_matrix(
    raw: bytes, last: bytes, w: int, d: int, room: Sequence[int], unit: int
) -> tuple[tuple[int, ...], ...] | None:
    """The send matrix of the received rows ``raw`` when every rank's row is its row in
    ``last`` (rows that validated) but for its length along ``dim`` (``d`` normalized,
    below ``MAX_NDIM``), its send sizes and its receive sizes, its sizes are none
    negative and add up to that length, every block (``unit`` bytes a row) fits its
    slot in ``room``, and receive sizes, where passed, are its column of the matrix;
    else ``None``. A pure function of the rows: every rank decides alike."""
    # rows along dim; send sizes; receive sizes' length (-1: not passed) and words
    spans = ((RECORD_SHAPE_AT + d, 1), (ROW_EXTRAS_AT + 1, 2 * w + 1))
    read = rows_changed_only_in(raw, last, w, spans)
    if read is None:
        return None
    matrix = tuple(t[1 : 1 + w] for t in read)
    for j, (t, s) in enumerate(zip(read, matrix, strict=True)):
        if min(s, default=0) < 0 or sum(s) != t[0]:
            return None
        if any(n * unit > room[j * w + k] for k, n in enumerate(s)):
            return None
        passed = t[1 + w :]
        column = tuple(row[j] for row in matrix)
        if passed != (-1,) * (w + 1) and passed != (w, *column):
            return None
    return matrix


_SPEC: Final = RoundSpec(
    NAME,
    _validated,
    _outgoing,
    _plan,
    _finish,
    _kept,
    lambda *a: _resized_call(*a),  # looked up per call: a script may wrap it
)
"""``all_to_all_v`` as the round takes it (``_steady.RoundSpec``)."""


class AllToAllResult(NamedTuple):
    """An ``all_to_all_v`` result with its receive ``Layout`` (``AllToAllPlan.recv``) and
    this rank's send sizes."""

    tensor: torch.Tensor
    layout: Layout
    send_sizes: tuple[int, ...]


def all_to_all_eager(
    x: Any,
    send_sizes: Any,
    recv_sizes: Any,
    dim: Any,
    group: Any,
    mesh_dim: Any,
    validate: Any,
    timeout: Any,
    cat_dim: Any = None,
) -> AllToAllResult:
    """The eager ``all_to_all_v_with_layout`` (its arguments unchecked: the plan judges
    them, on every rank): the plan (``_steady.replay`` when the call repeats the last
    steady one), then the payload inside ``AllToAllVFunction``."""
    info = call_group(group, mesh_dim)
    key = _steady_key(x, send_sizes, recv_sizes, dim, validate, timeout, cat_dim)
    plan = _steady.replay(_SPEC, key, x, info)
    if plan is None:
        plan = plan_all_to_all(
            x,
            send_sizes,
            recv_sizes,
            dim,
            info,
            validate=validate,
            timeout=timeout,
            steady_key=key,
            cat_dim=cat_dim,
        )
    if plan.result is not None and not (x.requires_grad and torch.is_grad_enabled()):
        out = plan.result  # what the Function's forward returns, with no graph to record
    else:
        out = AllToAllVFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return AllToAllResult(out, plan.recv, plan.send.sizes)


# --- compiled: all_to_all_v's operators and route (``_compiled``) --------------------------

from ._compiled import OpSpec, Route, define_ops, fresh, op_args, plain_sizes, rank_of, resized  # noqa: E402  # this block ends the module on purpose (docs/compile.md)
from ._mesh import named_group  # noqa: E402  # as above


def _all_to_all_op(
    x: torch.Tensor, dim: int, send: Sequence[int], recv: Sequence[int], name: str, *rest: Any
) -> torch.Tensor:
    validate, timeout, requires_grad, *cat = rest
    plan = plan_all_to_all(
        x, list(send), list(recv), dim, named_group(name), validate=validate, timeout=timeout,
        requires_grad=requires_grad, cat_dim=cat[0] if cat else None,
    )  # fmt: skip
    with torch.no_grad():
        out = plan.result
        return fresh(exchange_blocks(x, plan.send, plan.recv, plan.info) if out is None else out, x)


def _cat_of(t: torch.Tensor, dim: int, cat: Sequence[int | None]) -> int:
    """The joining dim, normalized: ``cat`` (the optional ``cat_dim`` argument), else ``dim``."""
    return (dim if not cat or cat[0] is None else cat[0]) % t.dim()


def _all_to_all_fake(
    x: torch.Tensor, dim: int, send: Sequence[int], recv: Sequence[int], name: str, *rest: Any
) -> torch.Tensor:
    c = _cat_of(x, dim, rest[3:])  # along dim: every block's own size (overridden if c == dim)
    return x.new_empty(resized(x, (dim, send[rank_of(name)]), (c, sum(recv))))


def _reverse_exchange(
    g: torch.Tensor, dim: int, send: Sequence[int], recv: Sequence[int], name: str, *rest: Any
) -> torch.Tensor:
    """The backward: ``g`` (the forward's receive sizes, along ``cat_dim``) sent back."""
    info = named_group(name, rest[0])
    d, c = dim % g.dim(), _cat_of(g, dim, rest[1:])
    back = resized(g, (c, recv[info.rank]), (d, sum(send)))  # x's shape
    recv_layout = split_layout(tuple(g.shape), c, tuple(recv), g.dtype, info)
    send_layout = split_layout(tuple(back), d, tuple(send), g.dtype, info)
    with torch.no_grad():
        return fresh(exchange_blocks(g, recv_layout, send_layout, info), g)


_SIZES = "SymInt dim, SymInt[] send_sizes, SymInt[] recv_sizes, str group_name"
define_ops(
    OpSpec(
        "all_to_all_v",
        f"(Tensor x, {_SIZES}, bool validate, float? timeout, bool requires_grad, "
        "SymInt? cat_dim=None) -> Tensor",
        _all_to_all_op,
        _all_to_all_fake,
        "all_to_all_v_backward",
        # the backward's dim, send_sizes, recv_sizes, group_name, timeout, cat_dim
        lambda i, _: (i[1] % i[0].dim(), list(i[2]), list(i[3]), i[4], i[6], *i[8:]),
    ),
    OpSpec(
        "all_to_all_v_backward",
        f"(Tensor grad_output, {_SIZES}, float? timeout, SymInt? cat_dim=None) -> Tensor",
        _reverse_exchange,
        lambda g, dim, send, recv, name, *rest: g.new_empty(
            resized(g, (_cat_of(g, dim, rest[1:]), recv[rank_of(name)]), (dim, sum(send)))
        ),
    ),
)


def _traced(
    x: object, send_sizes: object, recv_sizes: object, dim: object, *rest: object
) -> AllToAllResult | None:
    """The operator (the receive layout built from the sizes, ints here), or ``None``."""
    group, mesh_dim, validate, timeout, cat_dim = rest
    a = op_args(x, dim, group, mesh_dim, validate, timeout)
    send = None if a is None else plain_sizes(send_sizes, a.world_size)
    recv = None if a is None else plain_sizes(recv_sizes, a.world_size)
    along = dim if cat_dim is None else cat_dim
    if a is None or send is None or recv is None or not a.has_dim(along):
        return None
    out: torch.Tensor = torch.ops.vargather.all_to_all_v(
        a.x, a.dim, send, recv, a.group_name, a.validate, a.seconds, a.requires_grad, cat_dim
    )
    lay = split_layout(tuple(out.shape), along, tuple(recv), a.x.dtype, call_group(group, mesh_dim))
    return AllToAllResult(out, lay, tuple(send))


ALL_TO_ALL_V: Route[AllToAllResult] = Route("all_to_all_v", all_to_all_eager, _traced)

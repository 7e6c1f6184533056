"""``reduce_scatter_v``: plan (checks, exchange, validation), payload, autograd.

Where it sits: a family collective on ``_family`` and ``_steady`` (stages 1-3),
``_layout``, ``_buffers`` and ``_comm`` (the payload), and ``_transport`` (its backward
is a gather); ``_api`` calls its ``Route``.

The math is ``reduce_scatter_v``'s docstring (``_api``). Rank ``j`` sends block ``r``
of ``x_j`` to rank ``r`` in one alltoallv (any dtype moves, int16 as bytes; a receive
buffer of ``W x n_r`` rows) and rank ``r`` adds the ``W`` blocks in rank order, every
NaN of the sum then the dtype's canonical quiet NaN (``_reduced``: the bits torch and
the hardware give a NaN depend on the operands' memory layout), so the result is a
function of the inputs alone, whatever the backend. The backward is one gather through
``_transport``'s ``auto`` choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from . import _steady
from ._autograd import planned_function
from ._buffers import rank_major_gradient
from ._collectives import CollectiveName
from ._comm import all_to_all_uneven
from ._errors import SizesMismatchError
from ._exchange import agree, common_checks, raise_local, requires_grad_check, show_sizes
from ._family import known_call
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._mesh import call_group
from ._reduced import add_, canonical_nans_
from ._round_buffers import pack
from ._rows import (
    FamilyCall,
    Row,
    ValidatedOnce,
    block_sizes_problem,
    call_key,
    check_tensor,
    raise_own_problem,
    sizes_words,
    with_problem,
)
from ._steady import RoundSpec, run_round
from ._transport import choose_transport

NAME: Final[CollectiveName] = "reduce_scatter_v"


@dataclass(frozen=True)
class ReduceScatterPlan:
    """A validated ``reduce_scatter_v``: the blocks' ``Layout`` (``shard_shape(r)`` is
    rank r's result, ``output_shape`` the input's shape) and the group. ``result``: the
    payload's result when it rode in the metadata exchange (``_family.settle``)."""

    layout: Layout
    info: GroupInfo
    result: torch.Tensor | None = field(default=None, compare=False, repr=False)


def _local_call(
    x: object,
    sizes: object,
    dim: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
) -> FamilyCall:
    record, call_timeout = check_tensor(
        x,
        dim,
        info=info,
        validate=validate,
        timeout=timeout,
        requires_grad=requires_grad,
        split=True,
    )
    parsed, words = sizes_words(sizes, info.world_size)
    record = with_problem(record, block_sizes_problem(parsed, info.world_size, record))
    own = parsed if isinstance(parsed, tuple) else None
    return FamilyCall(NAME, record, tuple(words), (own,), call_timeout)


def validate_rows(rows: list[Row], *, rank: int) -> tuple[int, ...]:
    """The validated sizes, or the error every rank raises alike (a pure function of
    ``rows``)."""
    records = [row.record for row in rows]
    raise_local(NAME, records)
    checks = common_checks(records, dim=True, shape="full")
    checks.append((SizesMismatchError, "sizes", [row.extras for row in rows], show_sizes))
    checks.append(requires_grad_check(records, "the backward of reduce_scatter_v is a gather"))
    agree(NAME, checks)
    extras = rows[rank].extras
    return tuple(int(n) for n in extras[1 : 1 + extras[0]])


_validated: Final = ValidatedOnce(validate_rows)
"""``validate_rows``, once for the steady state's rows (``_rows.ValidatedOnce``)."""


def plan_reduce_scatter(
    x: object,
    sizes: object,
    dim: object,
    info: GroupInfo,
    *,
    validate: object,
    timeout: object,
    requires_grad: bool | None = None,
) -> ReduceScatterPlan:
    """Stages 1-3: the same error on every rank, or the same plan; a validated call
    that repeats the group's last steady one replays its round (``_steady.replay``).

    With ``validate=False`` the exchange is skipped and a local problem is raised on
    this rank only (its peers wait in the payload collective until they time out).
    """
    key = call_key(x, sizes, dim, validate, timeout, requires_grad)
    steady = key if validate is True else None
    found = _steady.replay(_SPEC, steady, x, info)
    if found is not None:
        return found
    call = known_call(
        NAME, key, info, lambda: _local_call(x, sizes, dim, info, validate, timeout, requires_grad)
    )
    if call.timeout is not None:
        info = info.with_timeout(call.timeout)
    if validate is not False and info.communicates:
        return run_round(_SPEC, call, x, info, steady)
    raise_own_problem(NAME, call.record.problem, info, trusted=validate is False)
    assert call.sizes[0] is not None  # a problem-free call parsed its sizes
    assert isinstance(x, torch.Tensor)  # a problem-free record is a tensor's
    return _plan(call.sizes[0], x, call, info)[0]


def _outgoing(x: object, call: FamilyCall, info: GroupInfo) -> tuple[torch.Tensor, list[int]]:
    """This rank's payload as ``reduce_scatter_blocks`` sends it, as bytes (a
    problem-free call, whose ``x`` is a tensor)."""
    sizes = call.sizes[0]
    assert isinstance(x, torch.Tensor)
    assert sizes is not None
    layout = blocks_layout(
        x.shape, call.record.normalized_dim, sizes, x.dtype, info.rank, info.world_size
    )
    unit = layout.pre * layout.post * x.element_size()
    return pack([rank_major_gradient(x.detach(), layout)]), [n * unit for n in sizes]


def _plan(
    found: tuple[int, ...], x: object, call: FamilyCall, info: GroupInfo
) -> tuple[ReduceScatterPlan, list[int]]:
    """The plan of the validated sizes, and the bytes rank ``j`` sends rank ``k``: block
    ``k`` of ``found``, from every rank."""
    assert isinstance(x, torch.Tensor)  # a problem-free record is a tensor's
    lay = blocks_layout(
        x.shape, call.record.normalized_dim, found, x.dtype, info.rank, info.world_size
    )
    unit = lay.pre * lay.post * x.element_size()
    return ReduceScatterPlan(lay, info), [n * unit for n in found] * info.world_size


_SPEC: Final = RoundSpec(
    NAME,
    _validated,
    _outgoing,
    _plan,
    lambda plan, slots, _: ReduceScatterPlan(
        plan.layout, plan.info, fold_slots(slots, plan.layout)
    ),
)
"""``reduce_scatter_v`` as the round takes it (``_steady.RoundSpec``)."""


def fold_slots(slots: Sequence[torch.Tensor], layout: Layout) -> torch.Tensor:
    """What ``reduce_scatter_blocks`` returns, from the bytes of block ``r`` each rank
    sent this rank (``slots[j]``), stacked in rank order and folded alike."""
    r = layout.rank
    own = layout.pre * layout.local_size * layout.post
    if layout.total == 0 or own == 0:
        return torch.empty(layout.shard_shape(r), dtype=layout.dtype, device=slots[0].device)
    blocks = torch.stack([slot.view(layout.dtype) for slot in slots])
    return fold_blocks(blocks).view(layout.shard_shape(r))


def fold_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """``blocks[0] + blocks[1] + ... `` along dim 0, left to right, in a fresh tensor
    (complex per component), its NaNs canonical (``_reduced``) when there was a sum
    (two blocks or more)."""
    out = blocks[0].clone()
    for j in range(1, blocks.shape[0]):
        add_(out, blocks[j])
    return canonical_nans_(out) if blocks.shape[0] > 1 else out


def reduce_scatter_blocks(x: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
    """The payload: this rank's ``y_r`` (``reduce_scatter_v``), a fresh tensor."""
    r, w = layout.rank, layout.world_size
    if not info.communicates:
        return x.narrow(layout.dim, layout.local_offset, layout.local_size).clone(
            memory_format=torch.contiguous_format
        )
    own = layout.pre * layout.local_size * layout.post
    if layout.total == 0:  # every rank's block is empty, and every rank knows it
        return x.new_empty(layout.shard_shape(r))
    send = rank_major_gradient(x, layout)  # rank j's block j ... as one flat buffer
    received = send.new_empty(w * own)
    all_to_all_uneven(
        received,
        send,
        output_splits=[own] * w,
        input_splits=[layout.pre * n * layout.post for n in layout.sizes],
        info=info,
        what=f"all_to_all ({NAME} payload)",
    )
    if own == 0:
        return x.new_empty(layout.shard_shape(r))
    return fold_blocks(received.view(w, own)).view(layout.shard_shape(r))


def gather_gradient(grad_output: torch.Tensor, layout: Layout, info: GroupInfo) -> torch.Tensor:
    """The backward: ``cat_r g_r`` along ``dim`` on every rank (shaped like the input)."""
    if not info.communicates:
        full = grad_output.new_zeros(layout.output_shape)
        full.narrow(layout.dim, layout.local_offset, layout.local_size).copy_(grad_output)
        return full
    if layout.total == 0:
        return grad_output.new_zeros(layout.output_shape)
    return choose_transport("auto", layout, info).gather(grad_output, layout, info)


ReduceScatterVFunction = planned_function(
    "ReduceScatterVFunction",
    """``y_r = Σ_j x_j[o_r : o_r + n_r]`` with the gathered upstream gradient.""",
    lambda x, plan: reduce_scatter_blocks(x, plan.layout, plan.info),
    lambda g, plan: gather_gradient(g, plan.layout, plan.info),
)


def reduce_scatter_eager(
    x: Any, sizes: Any, dim: Any, group: Any, mesh_dim: Any, validate: Any, timeout: Any
) -> torch.Tensor:
    """The eager ``reduce_scatter_v`` (its arguments unchecked: the plan judges them, on
    every rank): the plan, then the payload inside ``ReduceScatterVFunction``."""
    plan = plan_reduce_scatter(
        x, sizes, dim, call_group(group, mesh_dim), validate=validate, timeout=timeout
    )
    out = ReduceScatterVFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return out


# --- compiled: reduce_scatter_v's operators and route (``_compiled``) ----------------------

from ._compiled import OpSpec, Route, define_ops, fresh, op_args, plain_sizes, rank_of, resized  # noqa: E402  # this block ends the module on purpose (docs/compile.md)
from ._mesh import named_group  # noqa: E402  # as above


def _reduce_scatter_op(
    x: torch.Tensor, dim: int, sizes: Sequence[int], name: str, *rest: Any
) -> torch.Tensor:
    validate, timeout, requires_grad = rest
    plan = plan_reduce_scatter(
        x, list(sizes), dim, named_group(name), validate=validate, timeout=timeout,
        requires_grad=requires_grad,
    )  # fmt: skip
    with torch.no_grad():
        out = plan.result
        return fresh(reduce_scatter_blocks(x, plan.layout, plan.info) if out is None else out, x)


def _reduce_scatter_fake(
    x: torch.Tensor, dim: int, sizes: Sequence[int], name: str, *_: Any
) -> torch.Tensor:
    return x.new_empty(resized(x, (dim, sizes[rank_of(name)])))


def _gathered_like(g: torch.Tensor, dim: int, sizes: Sequence[int], *_: Any) -> torch.Tensor:
    """An empty tensor of ``x``'s shape: the backward's fake, and its layout's model."""
    return g.new_empty(resized(g, (dim, sum(sizes))))


def _gather_gradient_op(
    g: torch.Tensor, dim: int, sizes: Sequence[int], name: str, timeout: float | None
) -> torch.Tensor:
    info = named_group(name, timeout)
    layout = blocks_layout(
        resized(g, (dim, sum(sizes))), dim, sizes, g.dtype, info.rank, info.world_size
    )
    with torch.no_grad():
        return fresh(gather_gradient(g, layout, info), g)


define_ops(
    OpSpec(
        "reduce_scatter_v",
        "(Tensor x, SymInt dim, SymInt[] sizes, str group_name, bool validate, float? timeout, "
        "bool requires_grad) -> Tensor",
        _reduce_scatter_op,
        _reduce_scatter_fake,
        "reduce_scatter_v_backward",
        lambda i, _: (i[1] % i[0].dim(), list(i[2]), i[3], i[5]),  # dim, sizes, group, timeout
    ),
    OpSpec(
        "reduce_scatter_v_backward",
        "(Tensor grad_output, SymInt dim, SymInt[] sizes, str group_name, float? timeout) -> Tensor",
        _gather_gradient_op,
        _gathered_like,
    ),
)


def _traced(
    x: object, sizes: object, dim: object, group: object, *rest: object
) -> torch.Tensor | None:
    mesh_dim, validate, timeout = rest
    a = op_args(x, dim, group, mesh_dim, validate, timeout)
    plain = None if a is None else plain_sizes(sizes, a.world_size)
    if a is None or plain is None:
        return None
    out: torch.Tensor = torch.ops.vargather.reduce_scatter_v(
        a.x, a.dim, plain, a.group_name, a.validate, a.seconds, a.requires_grad
    )
    return out


REDUCE_SCATTER_V: Route[torch.Tensor] = Route("reduce_scatter_v", reduce_scatter_eager, _traced)

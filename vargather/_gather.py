"""``all_gather_v``: plan (checks, exchange, validation), payload, autograd; and its
coalesced form.

Where it sits: one collective's module, below ``_api`` and ``_compiled``, which both
call the eager pipeline here: ``gather_with_layout`` = ``plan_gather`` (argument checks
``_args``, the group ``_mesh.call_group``, the validated round ``_fused``: the
``Layout``, and the payload when it rode along) + ``GatherVFunction`` (``_autograd``,
which moves the payload through a ``_transport`` when it did not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import torch
import torch.autograd.forward_ad as forward_ad

from . import _fused
from ._args import CheckedCall, Problem, check_call
from ._autograd import (
    CoalescedFunction,
    CoalescedPlan,
    GatherPlan,
    GatherVFunction,
    contract_backward,
)
from ._choices import GradContract
from ._errors import DimError, InputTypeError, SizesError, VarGatherError
from ._exchange import plan_layout, trusted_layout
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._mesh import call_group
from ._round_buffers import plain_in_blocks
from ._transport import Transport, choose_transport


class GatherResult(NamedTuple):
    """A gathered tensor with the ``Layout`` that says where each rank's block is."""

    tensor: torch.Tensor
    layout: Layout


def plan_gather(
    x: object,
    dim: object,
    sizes: object,
    group: object,
    grad: object,
    transport: object,
    validate: object,
    timeout: object = None,
    mesh_dim: object = None,
    *,
    layout_only: bool = False,
) -> tuple[Layout, GroupInfo, torch.Tensor | None]:
    """Stages 1-3 for one call: every problem becomes the same error on every rank.

    Returns the layout, the group, and the gathered tensor when the payload rode in
    the fused round (``_fused``; ``None``: the payload still has to move).

    Only two kinds of problem are raised on this rank alone: an unusable ``group``
    (``resolve_group``: without a group there is nobody to tell) and, with
    ``validate=False``, whatever the local checks find (the exchange that would tell
    the peers is exactly what was skipped).
    """
    info = call_group(group, mesh_dim)
    key = None if layout_only else _steady_key(x, dim, sizes, grad, transport, validate, timeout)
    if key is not None and info.communicates:
        assert isinstance(x, torch.Tensor)  # a steady key is a tensor's
        payload = [(x.data_ptr(), x.numel() * x.element_size())]
        steady = _fused.steady_exchange("all_gather_v", key, payload, info)
        if steady is not None:  # the round ran: its verdict, with the result if it rode
            gathered = None if steady.outputs is None else steady.outputs[0]
            return steady.layouts[0], info, gathered
    call = check_call(
        x,
        dim,
        sizes=sizes,
        grad=grad,
        transport=transport,
        info=info,
        validate=validate,
        timeout=timeout,
    )
    if call.timeout is not None:
        info = info.with_timeout(call.timeout)
    if sizes is not None and validate is False:
        return trusted_layout(call, info), info, None
    if not info.communicates:
        return plan_layout(call, info), info, None
    # A non-bool validate runs the exchange, which reports it on every rank.
    eligible = _is_auto(transport) and not layout_only
    found = _fused.exchange("all_gather_v", [call], [x], info, eligible=eligible, steady_key=key)
    return found.layouts[0], info, None if found.outputs is None else found.outputs[0]


def _steady_key(
    x: object,
    dim: object,
    sizes: object,
    grad: object,
    transport: object,
    validate: object,
    timeout: object,
) -> tuple[object, ...] | None:
    """Everything a validated gather's headers and payload layout are a function of,
    besides its group and the group's state, for the calls the steady path serves
    (``_fused.steady_exchange``; ``None`` for others, the conditions below)."""
    if (
        sizes is not None
        or validate is not True
        or timeout is not None
        or type(grad) is not str
        or type(transport) is not str
        or transport != "auto"
        or not plain_in_blocks(x, dim)
    ):
        return None
    assert isinstance(x, torch.Tensor)  # for mypy: plain_in_blocks checked it
    requires = x.requires_grad and torch.is_grad_enabled()
    return (dim, x.shape, x.dtype, requires, grad)


def _autograd_needed(x: torch.Tensor) -> bool:
    """Whether ``GatherVFunction.apply`` could do more than call its forward: a gradient
    to record, a forward-mode AD level open, or functorch transforms active."""
    return (
        (x.requires_grad and torch.is_grad_enabled())
        or getattr(forward_ad, "_current_level", 0) >= 0  # private; unknown: assume yes
        or torch._C._are_functorch_transforms_active()
    )


def _is_auto(transport: object) -> bool:
    return isinstance(transport, str) and transport == "auto"


def gather_with_layout(x: Any, dim: Any, sizes: Any, group: Any, *rest: Any) -> GatherResult:
    """The eager ``all_gather_v_with_layout``, with the face's arguments in its order
    (unchecked: the plan judges them, on every rank)."""
    grad, transport, validate, timeout, mesh_dim = rest
    layout, info, gathered = plan_gather(
        x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim
    )
    assert isinstance(x, torch.Tensor)  # validated by _plan on every rank
    if not info.communicates:
        return GatherResult(x, layout)
    # grad and transport are valid and agreed on every rank by now.
    if gathered is not None and not _autograd_needed(x):
        # What GatherVFunction.forward hands back, without the autograd machinery that
        # nothing here would use.
        return GatherResult(gathered if layout.total else x.new_empty(layout.output_shape), layout)
    chosen: Transport
    if gathered is not None:  # the payload rode in the fused round (transport "auto")
        chosen = _fused.Prefetched(gathered, choose_transport("auto", layout, info))
    else:
        chosen = choose_transport(str(transport), layout, info)
    plan = GatherPlan(layout, info, chosen, grad)
    # Function.apply is untyped in torch's stubs (it forwards *args to forward).
    out = GatherVFunction.apply(x, plan)  # type: ignore[no-untyped-call]
    assert isinstance(out, torch.Tensor)
    return GatherResult(out, layout)


# --- several tensors at once -------------------------------------------------------------


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _coalesced_calls(
    tensors: object,
    dim: object,
    sizes: object,
    grad: object,
    transport: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
) -> tuple[list[object], list[CheckedCall]]:
    """Each tensor's checked call; a problem with the call as a whole (``tensors`` not a
    sequence, ``dim`` or ``sizes`` not one per tensor) is tensor #0's problem."""
    problem: Problem | None = None
    items: list[object]
    if isinstance(tensors, torch.Tensor) or not _is_sequence(tensors):
        problem = Problem(
            InputTypeError,
            f"expected a sequence of tensors, got {type(tensors).__name__}",
        )
        items = [tensors]
    else:
        assert isinstance(tensors, Sequence)
        items = list(tensors)
    k = len(items)
    dims: list[object] = [dim] * k
    if _is_sequence(dim):
        assert isinstance(dim, Sequence)
        if len(dim) == k:
            dims = list(dim)
        else:
            problem = problem or Problem(
                DimError, f"expected one dim, or one per tensor ({k}), got {len(dim)} dims"
            )
            dims = [0] * k
    each: list[object] = [None] * k
    if sizes is not None:
        if _is_sequence(sizes) and len(sizes) == k:  # type: ignore[arg-type]  # a Sequence by now
            assert isinstance(sizes, Sequence)
            each = list(sizes)
        else:
            what = f"{len(sizes)} entries" if _is_sequence(sizes) else type(sizes).__name__  # type: ignore[arg-type]  # a Sequence when _is_sequence
            problem = problem or Problem(
                SizesError, f"expected sizes=None or one entry per tensor ({k}), got {what}"
            )
    if problem is not None and not items:
        items = [None]
        dims, each = [0], [None]
    calls = [
        check_call(
            t,
            d,
            sizes=s,
            grad=grad,
            transport=transport,
            info=info,
            validate=validate,
            timeout=timeout,
        )
        for t, d, s in zip(items, dims, each, strict=True)
    ]
    if problem is not None:
        calls[0] = calls[0]._replace(record=replace(calls[0].record, problem=problem))
    return items, calls


def gather_coalesced(
    tensors: Any, dim: Any, sizes: Any, group: Any, *rest: Any
) -> list[torch.Tensor]:
    """The eager ``all_gather_v_coalesced``, with the face's arguments in its order
    (``_api`` has what it means)."""
    grad, transport, validate, timeout, mesh_dim = rest
    info = call_group(group, mesh_dim)
    items, calls = _coalesced_calls(tensors, dim, sizes, grad, transport, info, validate, timeout)
    call_timeout = calls[0].timeout if calls else None
    if call_timeout is not None:
        info = info.with_timeout(call_timeout)
    trusted = (
        validate is False
        and sizes is not None
        and all(e is not None for e in sizes)
        and len(items) == len(sizes)
    )
    outputs: list[torch.Tensor] | None = None
    if trusted or not info.communicates:  # no round: each tensor on its own
        one = trusted_layout if trusted else plan_layout
        layouts = []
        for i, call in enumerate(calls):
            try:
                layouts.append(one(call, info))
            except VarGatherError as err:
                raise _fused.named(err, i) from None
    else:
        found = _fused.exchange(
            "all_gather_v_coalesced", calls, items, info, eligible=_is_auto(transport)
        )
        layouts = list(found.layouts)
        outputs = found.outputs
    xs = [t for t in items if isinstance(t, torch.Tensor)]
    if not info.communicates:
        return xs
    name = "auto" if outputs is not None else str(transport)
    if outputs is None:
        outputs = _fused.gather_bytes(xs, layouts, info, name)
    if not any(x.requires_grad for x in xs) or not torch.is_grad_enabled():
        return outputs
    plan = CoalescedPlan(
        tuple(layouts),
        info,
        tuple(choose_transport(name, lay, info) for lay in layouts),
        grad,
        [outputs],
    )
    # Function.apply is untyped in torch's stubs (it forwards *args to forward).
    result = CoalescedFunction.apply(plan, *xs)  # type: ignore[no-untyped-call]
    return list(result)


# --- compiled: all_gather_v's operators and routes (``_compiled``) -----------------------
#
# ``docs/compile.md`` ("How", "``sizes=None`` in one graph") says which run when, and why.

from ._compiled import (  # noqa: E402  # this block ends the module on purpose (docs/compile.md)
    OpSpec,
    Route,
    define_ops,
    fresh,
    op_args,
    plain_sizes,
    rank_of,
    resized,
    unbacked_sizes_allowed_here,
)
from ._mesh import group_named, named_group  # noqa: E402  # as above


def _planned(
    x: torch.Tensor,
    dim: int,
    sizes: list[int] | None,
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> tuple[Layout, GroupInfo, torch.Tensor | None]:
    """``plan_gather`` inside an operator, with ``x`` needing a gradient as the caller's
    did (``requires_grad``: autograd is below us here; the exchange compares it)."""
    with torch.enable_grad() if requires_grad else torch.no_grad():
        probe = x.detach().requires_grad_(requires_grad)
        group = group_named(group_name)
        layout_only = sizes is None
        return plan_gather(
            probe, dim, sizes, group, grad, transport, validate, timeout, layout_only=layout_only
        )


def _gather_eagerly(
    x: torch.Tensor, dim: int, sizes: list[int], group_name: str, grad: str, *rest: Any
) -> tuple[torch.Tensor, Layout]:
    """The eager gather inside an operator: ``_planned``, then the payload unless it rode
    along; a fresh, contiguous output."""
    transport, *checked = rest
    layout, info, fused = _planned(x, dim, sizes, group_name, grad, transport, *checked)
    with torch.no_grad():
        if not info.communicates:
            return x.clone(memory_format=torch.contiguous_format), layout
        if layout.total == 0:
            return x.new_empty(layout.output_shape), layout
        if fused is None:
            fused = choose_transport(transport, layout, info).gather(x, layout, info)
        return fresh(fused, x), layout


def _all_gather_v_fake(x: torch.Tensor, dim: int, sizes: Sequence[int], *_: Any) -> torch.Tensor:
    return x.new_empty(resized(x, (dim, sum(sizes))))


def _backward_eagerly(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: GradContract,  # the forward validated it
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """``GatherVFunction.backward`` for a forward that a forward operator validated."""
    info = named_group(group_name, timeout)
    if not info.communicates:  # the eager gather is the identity here
        return grad_output.clone(memory_format=torch.contiguous_format)
    plain = [int(n) for n in sizes]
    layout = blocks_layout(grad_output.shape, dim, plain, grad_output.dtype, info.rank, len(plain))
    with torch.no_grad():
        chosen = choose_transport(transport, layout, info)
        out = contract_backward(grad_output, layout, info, chosen, grad)  # GatherVFunction's
        if grad == "local":  # a view of grad_output
            return out.clone(memory_format=torch.contiguous_format)
        return out.contiguous()


def _all_gather_v_backward_fake(
    grad_output: torch.Tensor, dim: int, sizes: Sequence[int], group_name: str, *_: Any
) -> torch.Tensor:
    group = group_named(group_name)
    if group is None or torch.distributed.get_world_size(group) == 1:  # the identity
        return grad_output.new_empty(grad_output.shape)
    return grad_output.new_empty(resized(grad_output, (dim, sizes[rank_of(group_name)])))


def _exchange_sizes(x: torch.Tensor, dim: int, *rest: Any) -> torch.Tensor:
    """The metadata exchange and its validation (``plan_gather``): every rank's size."""
    layout, _, _ = _planned(x, dim, None, *rest)
    return torch.tensor(layout.sizes, dtype=torch.int64)


def _exchange_sizes_fake(x: torch.Tensor, dim: int, group_name: str, *_: Any) -> torch.Tensor:
    group = group_named(group_name)
    n = 1 if group is None else torch.distributed.get_world_size(group)
    return torch.empty(n, dtype=torch.int64)


def _all_gather_v_sized_by_fake(
    x: torch.Tensor, sizes: torch.Tensor, dim: int, *_: Any
) -> torch.Tensor:
    shape: list[int | torch.SymInt] = list(x.shape)
    if sizes.numel() > 1:  # one rank: the identity, of x's own length
        shape[dim % x.dim()] = torch.library.get_ctx().new_dynamic_size(min=0)
    return x.new_empty(shape)


def _all_gather_v_sized_by_backward_fake(
    grad_output: torch.Tensor, sizes: torch.Tensor, dim: int, local_size: int, *_: Any
) -> torch.Tensor:
    return grad_output.new_empty(resized(grad_output, (dim, local_size)))


def _sized_by(x: torch.Tensor, sizes: torch.Tensor, dim: int, *named: Any) -> torch.Tensor:
    """The payload's transport with the sizes ``exchange_sizes`` validated."""
    group_name, grad, transport, timeout = named
    found = sizes.tolist()
    return _gather_eagerly(x, dim, found, group_name, grad, transport, False, timeout, False)[0]


def _saved(inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, ...]:
    """What ``all_gather_v_backward`` takes after the gradient."""
    x, dim, sizes, group_name, grad, transport, _validate, timeout, _ = inputs
    return (dim % x.dim(), list(sizes), group_name, grad, transport, timeout)


def _sized_by_saved(inputs: tuple[Any, ...], output: torch.Tensor) -> tuple[Any, ...]:
    """What ``all_gather_v_sized_by_backward`` takes after the gradient."""
    x, sizes, dim, *rest = inputs
    d = dim % x.dim()
    return (sizes, d, x.shape[d], *rest)


_NAMED = "str group_name, str grad, str transport"
_CHECKED = "bool validate, float? timeout, bool requires_grad"
define_ops(
    OpSpec(
        "all_gather_v",
        f"(Tensor x, SymInt dim, SymInt[] sizes, {_NAMED}, {_CHECKED}) -> Tensor",
        lambda x, dim, sizes, *rest: _gather_eagerly(x, dim, list(sizes), *rest)[0],
        _all_gather_v_fake,
        "all_gather_v_backward",
        _saved,
    ),
    OpSpec(
        "all_gather_v_backward",
        f"(Tensor grad_output, SymInt dim, SymInt[] sizes, {_NAMED}, float? timeout) -> Tensor",
        _backward_eagerly,
        _all_gather_v_backward_fake,
    ),
    OpSpec(
        "exchange_sizes",
        f"(Tensor x, SymInt dim, {_NAMED}, {_CHECKED}) -> Tensor",
        _exchange_sizes,
        _exchange_sizes_fake,
    ),
    OpSpec(
        "all_gather_v_sized_by",
        f"(Tensor x, Tensor sizes, SymInt dim, {_NAMED}, float? timeout) -> Tensor",
        _sized_by,
        _all_gather_v_sized_by_fake,
        "all_gather_v_sized_by_backward",
        _sized_by_saved,
    ),
    OpSpec(
        "all_gather_v_sized_by_backward",
        f"(Tensor grad_output, Tensor sizes, SymInt dim, SymInt local_size, {_NAMED}, "
        "float? timeout) -> Tensor",
        lambda g, sizes, dim, _n, *rest: _backward_eagerly(g, dim, sizes.tolist(), *rest),
        _all_gather_v_sized_by_backward_fake,
    ),
)


# The routes take the face's arguments: (x, dim, sizes, group, grad, transport, validate,
# timeout, mesh_dim).


def _traced_gather(x: object, dim: object, sizes: object, *rest: object) -> GatherResult | None:
    """``vargather::all_gather_v`` with every size known, else ``None``."""
    group, grad, transport, validate, timeout, mesh_dim = rest
    a = op_args(x, dim, group, mesh_dim, validate, timeout, grad, transport)
    plain = None if a is None else plain_sizes(sizes, a.world_size)
    if a is None or plain is None:
        return None
    args = (a.group_name, grad, transport, a.validate, a.seconds, a.requires_grad)
    out = torch.ops.vargather.all_gather_v(a.x, a.dim, plain, *args)
    return GatherResult(out, blocks_layout(a.x.shape, a.dim, plain, a.x.dtype, a.rank, len(plain)))


def _traced_tensor(x: object, dim: object, sizes: object, *rest: object) -> torch.Tensor | None:
    """``_traced_gather``'s tensor; with ``sizes=None`` where the graph may hold an
    unbacked length, ``exchange_sizes`` then ``all_gather_v_sized_by``; else ``None``."""
    found = _traced_gather(x, dim, sizes, *rest)
    if found is not None or sizes is not None or not unbacked_sizes_allowed_here():
        return None if found is None else found.tensor
    group, grad, transport, validate, timeout, mesh_dim = rest
    a = op_args(x, dim, group, mesh_dim, validate, timeout, grad, transport)
    if a is None:
        return None
    args = (a.group_name, grad, transport, a.validate, a.seconds, a.requires_grad)
    sized = torch.ops.vargather.exchange_sizes(a.x, a.dim, *args)
    out: torch.Tensor = torch.ops.vargather.all_gather_v_sized_by(
        a.x, sized, a.dim, *args[:3], a.seconds
    )
    return out


ALL_GATHER_V: Route[torch.Tensor] = Route(
    "all_gather_v", lambda *args: gather_with_layout(*args).tensor, _traced_tensor
)
ALL_GATHER_V_WITH_LAYOUT: Route[GatherResult] = Route(
    "all_gather_v_with_layout", gather_with_layout, _traced_gather
)

"""torch.compile support for the family: ``torch.library`` custom operators.

Where it sits: above the collectives' modules (``_reduce_scatter``, ``_all_to_all``,
``_gather_list``), whose eager code its operators run and which it registers for the
untraced route itself, and below the public face (``_api``), which routes every call
here under ``torch.compile`` (``torch.compiler.is_compiling()``): an operator call
when the sizes are known as Python ints (``reduce_scatter_v``'s ``sizes``,
``all_to_all_v``'s ``send_sizes`` *and* ``recv_sizes``, ``all_gather_list``'s
``shapes``): one operator call, no graph break. Each operator's eager implementation
is the eager pipeline (exchange and validation unless ``validate=False``, then the
payload), opaque to dynamo; its fake implementation gives the output shape from the
sizes; its autograd formula calls the matching ``*_backward`` operator. Anything else
runs the eager call behind ``torch.compiler.disable``: one graph break.

Every operator is registered **effectful** (``EffectType.ORDERED``): a pure operator
whose output has no elements on one rank (an empty block) may be dropped by inductor
on that rank only, which then issues one collective fewer than its peers, and they
deadlock. An ordered effect keeps every call, in program order, on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.distributed as dist

from ._all_to_all import (
    AllToAllResult,
    all_to_all_eager,
    exchange_blocks,
    plan_all_to_all,
    split_layout,
)
from ._compiled import (
    call_untraced,
    declare_ordered,
    keep_collective_order,
    plain_sizes,
    register_untraced,
)
from ._gather_list import (
    GatherListPlan,
    gather_flat,
    gather_list_eager,
    list_gradient,
    plan_gather_list,
)
from ._mesh import call_group, group_named, group_of, named_group
from ._reduce_scatter import (
    gather_gradient,
    plan_reduce_scatter,
    reduce_scatter_blocks,
    reduce_scatter_eager,
    scatter_layout,
)

__all__ = [
    "EFFECTFUL",
    "compiled_all_gather_list",
    "compiled_all_to_all",
    "compiled_reduce_scatter",
    "decode_shapes",
    "encode_shapes",
]


def _rank_of(name: str) -> int:
    group = group_named(name)
    return 0 if group is None else dist.get_rank(group)


def _fresh(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """An operator's output must not alias its input and must be contiguous."""
    if out.is_contiguous() and (
        out.numel() == 0 or out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    ):
        return out
    return out.clone(memory_format=torch.contiguous_format)


def encode_shapes(shapes: Sequence[Sequence[int]]) -> list[int]:
    """Shapes as one int list for an operator: ``ndim, dims...`` per rank."""
    return [v for s in shapes for v in (len(s), *s)]


def decode_shapes(flat: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    i = 0
    while i < len(flat):
        n = int(flat[i])
        out.append(tuple(int(v) for v in flat[i + 1 : i + 1 + n]))
        i += 1 + n
    return tuple(out)


# --- reduce_scatter_v ----------------------------------------------------------------


@torch.library.custom_op("vargather::reduce_scatter_v", mutates_args=())
def _rs_op(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    info = named_group(group_name)
    plan = plan_reduce_scatter(
        x, list(sizes), dim, info, validate=validate, timeout=timeout, requires_grad=requires_grad
    )
    with torch.no_grad():
        if plan.result is not None:
            return _fresh(plan.result, x)
        return _fresh(reduce_scatter_blocks(x, plan.layout, plan.info), x)


@_rs_op.register_fake
def _rs_fake(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = sizes[_rank_of(group_name)]
    return x.new_empty(shape)


@torch.library.custom_op("vargather::reduce_scatter_v_backward", mutates_args=())
def _rs_backward_op(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    timeout: float | None,
) -> torch.Tensor:
    info = named_group(group_name, timeout)
    d = dim % grad_output.dim()
    shape = list(grad_output.shape)
    shape[d] = sum(sizes)
    layout = scatter_layout(grad_output.new_empty(shape), d, tuple(sizes), info)
    with torch.no_grad():
        return _fresh(gather_gradient(grad_output, layout, info), grad_output)


@_rs_backward_op.register_fake
def _rs_backward_fake(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    timeout: float | None,
) -> torch.Tensor:
    shape = list(grad_output.shape)
    shape[dim % grad_output.dim()] = sum(sizes)
    return grad_output.new_empty(shape)


def _rs_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, dim, sizes, group_name, _validate, timeout, _rg = inputs
    ctx.vargather_args = (dim % x.dim(), list(sizes), group_name, timeout)


def _rs_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    dx = torch.ops.vargather.reduce_scatter_v_backward(grad_output, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None)


_rs_op.register_autograd(_rs_backward, setup_context=_rs_setup)


# --- all_to_all_v --------------------------------------------------------------------


@torch.library.custom_op("vargather::all_to_all_v", mutates_args=())
def _a2a_op(
    x: torch.Tensor,
    dim: int,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group_name: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
    cat_dim: int | None = None,
) -> torch.Tensor:
    info = named_group(group_name)
    plan = plan_all_to_all(
        x,
        list(send_sizes),
        list(recv_sizes),
        dim,
        info,
        validate=validate,
        timeout=timeout,
        requires_grad=requires_grad,
        cat_dim=cat_dim,
    )
    with torch.no_grad():
        if plan.result is not None:
            return _fresh(plan.result, x)
        return _fresh(exchange_blocks(x, plan.send, plan.recv, plan.info), x)


def _a2a_shape(t: torch.Tensor, dim: int, sizes: Sequence[int]) -> list[int]:
    shape = list(t.shape)
    shape[dim % t.dim()] = sum(sizes)
    return shape


def _cat_of(t: torch.Tensor, dim: int, cat_dim: int | None) -> int | None:
    """``cat_dim`` normalized when it is another dim than ``dim``, else ``None``."""
    if cat_dim is None or cat_dim % t.dim() == dim % t.dim():
        return None
    return cat_dim % t.dim()


def _swapped_shape(t: torch.Tensor, dim: int, c: int, along_dim: int, along_cat: int) -> list[int]:
    """``t``'s shape with ``along_dim`` along ``dim`` and ``along_cat`` along ``c``."""
    shape = list(t.shape)
    shape[dim % t.dim()], shape[c] = along_dim, along_cat
    return shape


@_a2a_op.register_fake
def _a2a_fake(
    x: torch.Tensor,
    dim: int,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group_name: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
    cat_dim: int | None = None,
) -> torch.Tensor:
    c = _cat_of(x, dim, cat_dim)
    if c is None:
        return x.new_empty(_a2a_shape(x, dim, recv_sizes))
    own = send_sizes[_rank_of(group_name)]  # every block's size along dim
    return x.new_empty(_swapped_shape(x, dim, c, own, sum(recv_sizes)))


@torch.library.custom_op("vargather::all_to_all_v_backward", mutates_args=())
def _a2a_backward_op(
    grad_output: torch.Tensor,
    dim: int,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group_name: str,
    timeout: float | None,
    cat_dim: int | None = None,
) -> torch.Tensor:
    """The reverse exchange: ``grad_output`` has the forward's receive sizes (along
    ``cat_dim``)."""
    info = named_group(group_name, timeout)
    shape = tuple(int(n) for n in grad_output.shape)
    d = dim % grad_output.dim()
    c = _cat_of(grad_output, d, cat_dim)
    if c is None:
        back = tuple(_a2a_shape(grad_output, d, send_sizes))
        recv = split_layout(shape, d, tuple(recv_sizes), grad_output.dtype, info)
    else:  # x's shape: its own size along cat_dim is what it sent itself
        own = recv_sizes[info.rank]
        back = tuple(_swapped_shape(grad_output, d, c, sum(send_sizes), own))
        recv = split_layout(shape, c, tuple(recv_sizes), grad_output.dtype, info)
    send = split_layout(back, d, tuple(send_sizes), grad_output.dtype, info)
    with torch.no_grad():
        return _fresh(exchange_blocks(grad_output, recv, send, info), grad_output)


@_a2a_backward_op.register_fake
def _a2a_backward_fake(
    grad_output: torch.Tensor,
    dim: int,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group_name: str,
    timeout: float | None,
    cat_dim: int | None = None,
) -> torch.Tensor:
    c = _cat_of(grad_output, dim, cat_dim)
    if c is None:
        return grad_output.new_empty(_a2a_shape(grad_output, dim, send_sizes))
    own = recv_sizes[_rank_of(group_name)]
    return grad_output.new_empty(_swapped_shape(grad_output, dim, c, sum(send_sizes), own))


def _a2a_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, dim, send_sizes, recv_sizes, group_name, _validate, timeout, _rg, *rest = inputs
    cat_dim = rest[0] if rest else None
    ctx.vargather_args = (
        dim % x.dim(),
        list(send_sizes),
        list(recv_sizes),
        group_name,
        timeout,
        _cat_of(x, dim, cat_dim),
    )


def _a2a_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    dx = torch.ops.vargather.all_to_all_v_backward(grad_output, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None, None, None)


_a2a_op.register_autograd(_a2a_backward, setup_context=_a2a_setup)


# --- all_gather_list -----------------------------------------------------------------


@torch.library.custom_op("vargather::all_gather_list", mutates_args=())
def _list_op(
    x: torch.Tensor,
    shapes: Sequence[int],
    group_name: str,
    grad: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> list[torch.Tensor]:
    info = named_group(group_name)
    plan = plan_gather_list(
        x,
        decode_shapes(shapes),
        grad,
        info,
        validate=validate,
        timeout=timeout,
        requires_grad=requires_grad,
    )
    with torch.no_grad():
        if not plan.info.communicates:
            return [x.clone(memory_format=torch.contiguous_format)]
        return [o.clone() for o in gather_flat(x, plan)]


@_list_op.register_fake
def _list_fake(
    x: torch.Tensor,
    shapes: Sequence[int],
    group_name: str,
    grad: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> list[torch.Tensor]:
    return [x.new_empty(s) for s in decode_shapes(shapes)]


@torch.library.custom_op("vargather::all_gather_list_backward", mutates_args=())
def _list_backward_op(
    grads: Sequence[torch.Tensor],
    shapes: Sequence[int],
    group_name: str,
    grad: str,
    timeout: float | None,
) -> torch.Tensor:
    info = named_group(group_name, timeout)
    found = decode_shapes(shapes)
    if not info.communicates:
        return grads[0].clone(memory_format=torch.contiguous_format)
    plan = GatherListPlan(found, info, grad, grads[0].dtype)
    with torch.no_grad():
        return _fresh(list_gradient(list(grads), plan), grads[info.rank])


@_list_backward_op.register_fake
def _list_backward_fake(
    grads: Sequence[torch.Tensor],
    shapes: Sequence[int],
    group_name: str,
    grad: str,
    timeout: float | None,
) -> torch.Tensor:
    found = decode_shapes(shapes)
    return grads[0].new_empty(found[_rank_of(group_name)] if len(found) > 1 else found[0])


def _list_setup(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
    _x, shapes, group_name, grad, _validate, timeout, _rg = inputs
    ctx.vargather_args = (list(shapes), group_name, grad, timeout)
    ctx.vargather_like = [(o.shape, o.dtype, o.device) for o in output]


def _list_backward(ctx: Any, *grads: Any) -> tuple[torch.Tensor | None, ...]:
    # A list output's gradients arrive as one list (or, in some torch versions, spread).
    flat = grads[0] if len(grads) == 1 and isinstance(grads[0], (list, tuple)) else grads
    filled = [
        g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
        for g, (shape, dtype, device) in zip(flat, ctx.vargather_like, strict=True)
    ]
    dx = torch.ops.vargather.all_gather_list_backward(filled, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None)


_list_op.register_autograd(_list_backward, setup_context=_list_setup)


EFFECTFUL: Final = all(
    [
        declare_ordered(op)
        for op in (_rs_op, _rs_backward_op, _a2a_op, _a2a_backward_op, _list_op, _list_backward_op)
    ]
)
"""Whether every family operator is ordered-effectful here (module doc)."""


# --- the traced entry points ---------------------------------------------------------


def _plain_call(x: object, dim: object, validate: object, timeout: object) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.dim() > 0
        and isinstance(dim, int)
        and not isinstance(dim, bool)
        and -x.dim() <= dim < x.dim()
        and isinstance(validate, bool)
        and (
            timeout is None or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool))
        )
    )


def _requires(x: torch.Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


def _reduce_scatter_op_call(
    x: object,
    sizes: object,
    dim: object,
    group: object,
    mesh_dim: object,
    validate: object,
    timeout: object,
) -> torch.Tensor | None:
    """The operator call, or ``None`` when only the eager path can run this call."""
    where = group_of(group, mesh_dim) if isinstance(x, torch.Tensor) else None
    plain = plain_sizes(sizes, where[2]) if where is not None else None
    if where is None or plain is None or not _plain_call(x, dim, validate, timeout):
        return None
    assert isinstance(x, torch.Tensor)
    keep_collective_order()
    seconds = None if timeout is None else float(timeout)  # type: ignore[arg-type]  # a number by _plain_call
    out: torch.Tensor = torch.ops.vargather.reduce_scatter_v(
        x, dim, plain, where[0], validate, seconds, _requires(x)
    )
    return out


def _all_to_all_op_call(
    x: object,
    send_sizes: object,
    recv_sizes: object,
    dim: object,
    group: object,
    mesh_dim: object,
    validate: object,
    timeout: object,
    cat_dim: object = None,
) -> torch.Tensor | None:
    """The operator call, or ``None`` when only the eager path can run this call."""
    where = group_of(group, mesh_dim) if isinstance(x, torch.Tensor) else None
    send = plain_sizes(send_sizes, where[2]) if where is not None else None
    recv = plain_sizes(recv_sizes, where[2]) if where is not None else None
    if where is None or send is None or recv is None or not _plain_call(x, dim, validate, timeout):
        return None
    if cat_dim is not None and not _plain_call(x, cat_dim, validate, timeout):
        return None
    assert isinstance(x, torch.Tensor)
    keep_collective_order()
    seconds = None if timeout is None else float(timeout)  # type: ignore[arg-type]  # a number by _plain_call
    out: torch.Tensor = torch.ops.vargather.all_to_all_v(
        x, dim, send, recv, where[0], validate, seconds, _requires(x), cat_dim
    )
    return out


def _gather_list_op_call(
    x: object,
    shapes: object,
    group: object,
    mesh_dim: object,
    grad: object,
    validate: object,
    timeout: object,
) -> list[torch.Tensor] | None:
    """The operator call, or ``None`` when only the eager path can run this call."""
    where = group_of(group, mesh_dim) if isinstance(x, torch.Tensor) else None
    if where is None or not isinstance(shapes, (list, tuple)) or len(shapes) != where[2]:
        return None
    plain: list[list[int]] = []
    for s in shapes:
        got = plain_sizes(s, len(s)) if isinstance(s, (list, tuple, torch.Size)) else None
        if got is None:
            return None
        plain.append(got)
    if not (_plain_call(x, 0, validate, timeout) and isinstance(grad, str)):
        return None
    assert isinstance(x, torch.Tensor)
    keep_collective_order()
    seconds = None if timeout is None else float(timeout)  # type: ignore[arg-type]  # a number by _plain_call
    out: list[torch.Tensor] = torch.ops.vargather.all_gather_list(
        x, encode_shapes(plain), where[0], grad, validate, seconds, _requires(x)
    )
    return out


# --- the route into compiled mode: the operator, or the eager call untraced ----------

# One graph break per eager call under torch.compile: each collective's eager code.
register_untraced("reduce_scatter_v", reduce_scatter_eager)
register_untraced("all_to_all_v", all_to_all_eager)
register_untraced("all_gather_list", gather_list_eager)


def compiled_reduce_scatter(
    x: object,
    sizes: object,
    dim: object,
    group: object,
    mesh_dim: object,
    validate: object,
    timeout: object,
) -> torch.Tensor:
    """``reduce_scatter_v`` in traced code: its operator, else the eager call untraced."""
    out = _reduce_scatter_op_call(x, sizes, dim, group, mesh_dim, validate, timeout)
    if out is not None:
        return out
    result: torch.Tensor = call_untraced(
        "reduce_scatter_v", x, sizes, dim, group, mesh_dim, validate, timeout
    )
    return result


def compiled_all_to_all(
    x: object,
    send_sizes: object,
    recv_sizes: object,
    dim: object,
    group: object,
    mesh_dim: object,
    validate: object,
    timeout: object,
    cat_dim: object = None,
) -> AllToAllResult:
    """``all_to_all_v_with_layout`` in traced code: its operator (the receive layout
    built from the sizes, which it needs as ints), else the eager call untraced."""
    out = _all_to_all_op_call(
        x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout, cat_dim
    )
    if out is not None:
        assert isinstance(x, torch.Tensor)  # no operator call otherwise
        assert isinstance(dim, int)
        assert isinstance(recv_sizes, (list, tuple))  # plain ints, or no operator call
        assert isinstance(send_sizes, (list, tuple))
        info = call_group(group, mesh_dim)
        along = dim if cat_dim is None else cat_dim
        assert isinstance(along, int)  # an int in range, or no operator call
        layout = split_layout(tuple(out.shape), along, tuple(recv_sizes), x.dtype, info)
        return AllToAllResult(out, layout, tuple(send_sizes))
    found: AllToAllResult = call_untraced(
        "all_to_all_v",
        x,
        send_sizes,
        recv_sizes,
        dim,
        group,
        mesh_dim,
        validate,
        timeout,
        cat_dim,
    )
    return found


def compiled_all_gather_list(
    x: object,
    shapes: object,
    group: object,
    mesh_dim: object,
    grad: object,
    validate: object,
    timeout: object,
) -> list[torch.Tensor]:
    """``all_gather_list`` in traced code: its operator, else the eager call untraced."""
    out = _gather_list_op_call(x, shapes, group, mesh_dim, grad, validate, timeout)
    if out is not None:
        return out
    result: list[torch.Tensor] = call_untraced(
        "all_gather_list", x, shapes, group, mesh_dim, grad, validate, timeout
    )
    return result

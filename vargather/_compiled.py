"""torch.compile support: the gather as two ``torch.library`` custom operators.

Where it sits: beside the pipeline. Eager calls never come here; under
``torch.compile`` (``torch.compiler.is_compiling()``) ``_api`` routes each call to
:func:`compiled_gather`, which dynamo traces:

* ``sizes`` given as Python ints (and plain ``grad``/``transport``/``validate``/
  ``timeout`` values): one call of ``vargather::all_gather_v``, no graph break. Its
  eager implementation is the eager pipeline itself (the metadata exchange and its
  validation, unless ``validate=False``; then the transport), opaque to dynamo, so the
  errors, the checks and the bytes are the eager ones. Its fake implementation gives
  the output shape from ``sizes``; its autograd formula calls
  ``vargather::all_gather_v_backward``, the eager backward of the chosen contract (one
  reduce-scatter for ``sum`` and ``mean``, this rank's slice for ``local``), so the
  forward and the backward trace into one graph each.
* anything else (``sizes=None``, ``sizes`` as a tensor, a ``timedelta`` timeout,
  arguments the eager path would refuse): the eager ``all_gather_v`` behind
  ``torch.compiler.disable``, exactly one graph break per call. The sizes are data on
  other ranks: knowing them inside the graph would take a data-dependent output shape
  (an unbacked size, which dynamo captures only with ``capture_scalar_outputs``), so
  vargather does not try.

A process group travels into the operator by name (``ProcessGroup.group_name``,
resolved back with ``_resolve_process_group``), as torch's functional collectives do;
the empty name stands for "no torch.distributed" (a one-process world).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ._group import GroupInfo, per_call_timeout_supported, resolve_group
from ._layout import Layout
from ._mesh import is_device_mesh, resolve_mesh
from ._transport import choose_transport

__all__ = ["bind_eager", "compiled_gather", "eager_gather", "group_of"]


class _EagerPipeline(NamedTuple):
    """The eager entry points the operators run, handed over by ``_api`` (which imports
    this module, so this module cannot import it)."""

    plan: Callable[..., tuple[Layout, GroupInfo]]
    gather_with_layout: Callable[..., Any]


_BOUND: list[_EagerPipeline] = []


def bind_eager(
    plan: Callable[..., tuple[Layout, GroupInfo]], gather_with_layout: Callable[..., Any]
) -> None:
    """Called once, by ``_api`` at import: ``_plan`` (stages 1-3 for one call) and the
    eager ``all_gather_v_with_layout``."""
    _BOUND[:] = [_EagerPipeline(plan, gather_with_layout)]


def _eager() -> _EagerPipeline:
    if not _BOUND:  # pragma: no cover - vargather/__init__ imports _api, which binds
        raise RuntimeError("vargather._compiled used before vargather._api bound the eager path")
    return _BOUND[0]


_NO_GROUP = ""  # the operator's name for "torch.distributed not initialized"


def _group_of(name: str) -> dist.ProcessGroup | None:
    if name == _NO_GROUP:
        return None
    from torch.distributed import distributed_c10d as c10d

    # Private, as for torch's functional collectives (which resolve names the same way).
    resolve: Callable[[Any], dist.ProcessGroup] = c10d._resolve_process_group  # type: ignore[attr-defined]  # not re-exported
    return resolve(name)


def _timeout_of(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """An operator's output must not alias its input and must match the fake's strides."""
    return t.clone(memory_format=torch.contiguous_format)


# --- the forward operator ----------------------------------------------------------------


@torch.library.custom_op("vargather::all_gather_v", mutates_args=())
def _all_gather_v_op(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    """The eager gather: ``_api._plan`` (exchange + validation) then the transport.

    ``requires_grad`` is whether the caller's ``x`` needed a gradient (inside the
    operator autograd is below us): the metadata exchange compares it across ranks.
    """
    probe = x.detach()
    with torch.enable_grad() if requires_grad else torch.no_grad():
        if requires_grad:
            probe.requires_grad_(True)
        layout, info = _eager().plan(
            probe, dim, list(sizes), _group_of(group_name), grad, transport, validate, timeout
        )
    with torch.no_grad():
        if not info.communicates:
            return _contiguous(x)
        if layout.total == 0:
            return x.new_empty(layout.output_shape)
        out = choose_transport(transport, layout, info).gather(x, layout, info)
        if (
            out.is_contiguous()
            and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        ):
            return out
        return _contiguous(out)


@_all_gather_v_op.register_fake
def _all_gather_v_fake(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = sum(sizes)
    return x.new_empty(shape)


# --- the backward operator ---------------------------------------------------------------


def _backward_layout(
    grad_output: torch.Tensor, dim: int, sizes: Sequence[int], rank: int
) -> Layout:
    d = dim % grad_output.dim()
    return Layout(
        sizes=tuple(int(n) for n in sizes),
        dim=d,
        leading_shape=tuple(grad_output.shape[:d]),
        trailing_shape=tuple(grad_output.shape[d + 1 :]),
        dtype=grad_output.dtype,
        rank=rank,
        world_size=len(sizes),
    )


@torch.library.custom_op("vargather::all_gather_v_backward", mutates_args=())
def _all_gather_v_backward_op(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """``GatherVFunction.backward`` for a forward that the forward operator validated."""
    info = resolve_group(_group_of(group_name))
    if not info.communicates:
        return _contiguous(grad_output)  # the eager gather is the identity here
    call_timeout = _timeout_of(timeout)
    if call_timeout is not None and per_call_timeout_supported(info):
        info = info.with_timeout(call_timeout)
    layout = _backward_layout(grad_output, dim, sizes, info.rank)
    with torch.no_grad():
        if layout.total == 0:
            return grad_output.new_zeros(layout.shard_shape(layout.rank))
        if grad == "local":
            return _contiguous(
                grad_output.narrow(layout.dim, layout.local_offset, layout.local_size)
            )
        chosen = choose_transport(transport, layout, info)
        out = chosen.reduce_scatter_sum(grad_output, layout, info)
        if grad == "mean":
            out.div_(layout.world_size)
        return out.contiguous()


@_all_gather_v_backward_op.register_fake
def _all_gather_v_backward_fake(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    group = _group_of(group_name)
    rank = dist.get_rank(group) if group is not None else 0
    shape = list(grad_output.shape)
    d = dim % grad_output.dim()
    if group is None or dist.get_world_size(group) == 1:
        return grad_output.new_empty(shape)
    shape[d] = sizes[rank]
    return grad_output.new_empty(shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, dim, sizes, group_name, grad, transport, _validate, timeout, _rg = inputs
    ctx.vargather_args = (dim % x.dim(), list(sizes), group_name, grad, transport, timeout)


def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    dx = torch.ops.vargather.all_gather_v_backward(grad_output, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None, None, None)


_all_gather_v_op.register_autograd(_backward, setup_context=_setup_context)


# --- the traced entry point --------------------------------------------------------------


def eager_gather(x: Any, dim: Any, **kwargs: Any) -> Any:
    """``all_gather_v_with_layout``, run where dynamo does not trace (eager)."""
    return _eager().gather_with_layout(x, dim, **kwargs)


# torch.compiler.disable is untyped in torch's stubs.
_eager_gather_disabled = torch.compiler.disable(eager_gather, recursive=True)  # type: ignore[no-untyped-call]


def group_of(group: object, mesh_dim: object) -> tuple[str, int, int] | None:
    """The operator's name for ``group`` (with ``mesh_dim``), this rank's place in it
    and its size; ``None`` when only the eager path can say what is wrong with it."""
    if not (dist.is_available() and dist.is_initialized()):
        return (_NO_GROUP, 0, 1) if group is None and mesh_dim is None else None
    if is_device_mesh(group):
        try:
            group = resolve_mesh(group, mesh_dim)
        except Exception:
            return None
    elif mesh_dim is not None:
        return None
    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, dist.ProcessGroup):
        return None
    rank = dist.get_rank(pg)
    if rank < 0:
        return None
    return str(pg.group_name), rank, dist.get_world_size(pg)


def _plain_sizes(sizes: object, world_size: int) -> list[int] | None:
    """``sizes`` as a list of ints (or dynamo's symbolic ints) that make a ``Layout``."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) != world_size:
        return None
    out: list[int] = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)) or n < 0:
            return None
        out.append(n)  # type: ignore[arg-type]  # a SymInt stands for an int here
    return out


def _layout_of(x: torch.Tensor, dim: int, sizes: list[int], rank: int, world_size: int) -> Layout:
    """The call's ``Layout``, built while tracing (its sizes symbolic once dynamo has
    made them dynamic)."""
    d = dim % x.dim()
    return Layout(
        sizes=tuple(sizes),
        dim=d,
        leading_shape=tuple(x.shape[:d]),
        trailing_shape=tuple(x.shape[d + 1 :]),
        dtype=x.dtype,
        rank=rank,
        world_size=world_size,
    )


def compiled_gather(
    x: object,
    dim: object,
    *,
    sizes: object,
    group: object,
    mesh_dim: object,
    grad: object,
    transport: object,
    validate: object,
    timeout: object,
    with_layout: bool,
) -> tuple[torch.Tensor, Layout | None]:
    """``all_gather_v`` (and its ``Layout`` if ``with_layout``) under ``torch.compile``:
    the operator when it can, else the eager call behind one graph break (see the
    module docstring)."""
    where = group_of(group, mesh_dim) if isinstance(x, torch.Tensor) else None
    plain = _plain_sizes(sizes, where[2]) if where is not None else None
    if (
        where is not None
        and plain is not None
        and isinstance(x, torch.Tensor)
        and x.dim() > 0
        and isinstance(dim, int)
        and not isinstance(dim, bool)
        and -x.dim() <= dim < x.dim()
        and isinstance(grad, str)
        and isinstance(transport, str)
        and isinstance(validate, bool)
        and (
            timeout is None or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool))
        )
    ):
        name, rank, world_size = where
        requires_grad = x.requires_grad and torch.is_grad_enabled()
        seconds = None if timeout is None else float(timeout)
        out: torch.Tensor = torch.ops.vargather.all_gather_v(
            x, dim, plain, name, grad, transport, validate, seconds, requires_grad
        )
        return out, _layout_of(x, dim, plain, rank, world_size) if with_layout else None
    result = _eager_gather_disabled(
        x,
        dim,
        sizes=sizes,
        group=group,
        mesh_dim=mesh_dim,
        grad=grad,
        transport=transport,
        validate=validate,
        timeout=timeout,
    )
    return result.tensor, result.layout

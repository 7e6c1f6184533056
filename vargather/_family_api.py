"""The family's public entry points: ``reduce_scatter_v``, ``all_to_all_v`` (and its
``_with_layout`` form) and ``all_gather_list``.

Where it sits: on top, beside ``_api``. Each call resolves its group (``_group``,
``_mesh``), plans (its module's checks, one exchange, validation: ``_reduce_scatter``,
``_all_to_all``, ``_gather_list`` over ``_family``), then runs the payload inside its
autograd function. Under ``torch.compile`` a call with its sizes given as ints is one
custom operator (``_compiled_family``), any other call one graph break.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, NamedTuple, TypeAlias

import torch

from ._all_to_all import AllToAllVFunction, plan_all_to_all, split_layout
from ._choices import GradContract
from ._compiled import call_untraced, register_untraced
from ._compiled_family import (
    compiled_all_gather_list,
    compiled_all_to_all,
    compiled_reduce_scatter,
)
from ._gather_list import GatherListFunction, plan_gather_list
from ._group import resolve_group
from ._layout import Layout
from ._mesh import GroupLike, MeshDim, resolve_mesh
from ._reduce_scatter import ReduceScatterVFunction, plan_reduce_scatter

__all__ = [
    "AllToAllResult",
    "all_gather_list",
    "all_to_all_v",
    "all_to_all_v_with_layout",
    "reduce_scatter_v",
]

Sizes: TypeAlias = "Sequence[int] | torch.Tensor"
Timeout: TypeAlias = "float | timedelta | None"


class AllToAllResult(NamedTuple):
    """An ``all_to_all_v`` result with its receive ``Layout`` (``layout.sizes`` are the
    receive sizes, ``layout.offsets`` where each source rank's rows start) and this
    rank's send sizes."""

    tensor: torch.Tensor
    layout: Layout
    send_sizes: tuple[int, ...]


def _info(group: object, mesh_dim: object) -> Any:
    return resolve_group(resolve_mesh(group, mesh_dim))  # type: ignore[arg-type]  # judged there


def _eager_reduce_scatter(
    x: Any, sizes: Any, dim: Any, group: Any, mesh_dim: Any, validate: Any, timeout: Any
) -> torch.Tensor:
    plan = plan_reduce_scatter(
        x, sizes, dim, _info(group, mesh_dim), validate=validate, timeout=timeout
    )
    out = ReduceScatterVFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return out


def _eager_all_to_all(
    x: Any,
    send_sizes: Any,
    recv_sizes: Any,
    dim: Any,
    group: Any,
    mesh_dim: Any,
    validate: Any,
    timeout: Any,
) -> AllToAllResult:
    plan = plan_all_to_all(
        x, send_sizes, recv_sizes, dim, _info(group, mesh_dim), validate=validate, timeout=timeout
    )
    out = AllToAllVFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return AllToAllResult(out, plan.recv, plan.send.sizes)


def _eager_all_gather_list(
    x: Any, shapes: Any, group: Any, mesh_dim: Any, grad: Any, validate: Any, timeout: Any
) -> list[torch.Tensor]:
    plan = plan_gather_list(
        x, shapes, grad, _info(group, mesh_dim), validate=validate, timeout=timeout
    )
    if not plan.info.communicates:
        return [x]
    outs = GatherListFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    return list(outs)


# One graph break per eager call under torch.compile.
register_untraced("reduce_scatter_v", _eager_reduce_scatter)
register_untraced("all_to_all_v", _eager_all_to_all)
register_untraced("all_gather_list", _eager_all_gather_list)


def reduce_scatter_v(
    x: torch.Tensor,
    sizes: Sizes,
    dim: int = 0,
    *,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> torch.Tensor:
    """Sum every rank's ``x`` and give rank ``r`` its block ``r`` along ``dim``.

    Every rank holds ``x`` with ``sum(sizes)`` along ``dim`` (the same shape and dtype
    everywhere); ``sizes`` (a sequence of ints or a 1-d integer tensor, the same on
    every rank, in group-rank order) cuts it into one block per rank. Rank ``r``
    returns ``x_0[o_r:o_r+n_r] + ... + x_{W-1}[o_r:o_r+n_r]`` along ``dim``, summed in
    rank order in the input's dtype (bit for bit the same on every backend), a fresh
    tensor. Gradient: ``dx_j = cat_r g_r`` on every rank (the ``all_gather_v`` of the
    upstream gradients). ``validate=False`` skips the metadata exchange (the sizes are
    then trusted); ``timeout``, ``group``, ``mesh_dim`` as for ``all_gather_v``.

    Raises:
        VarGatherError: a subclass naming the offending rank(s), on every rank, before
            any payload moves (a ``SizesMismatchError`` for sizes that differ across
            ranks, ``SizesError`` for ``sum(sizes) != x.shape[dim]``, ...).
        CollectiveTimeoutError: a peer never arrived.
    """
    if torch.compiler.is_compiling():
        out = compiled_reduce_scatter(x, sizes, dim, group, mesh_dim, validate, timeout)
        if out is not None:
            return out
        result: torch.Tensor = call_untraced(
            "reduce_scatter_v", x, sizes, dim, group, mesh_dim, validate, timeout
        )
        return result
    return _eager_reduce_scatter(x, sizes, dim, group, mesh_dim, validate, timeout)


def all_to_all_v_with_layout(
    x: torch.Tensor,
    send_sizes: Sizes,
    dim: int = 0,
    *,
    recv_sizes: Sizes | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> AllToAllResult:
    """``all_to_all_v`` that also returns the receive ``Layout`` and the send sizes."""
    if torch.compiler.is_compiling():
        out = compiled_all_to_all(
            x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout
        )
        if out is not None:
            info = _info(group, mesh_dim)
            assert isinstance(recv_sizes, (list, tuple))  # plain ints, or no operator call
            assert isinstance(send_sizes, (list, tuple))
            layout = split_layout(tuple(out.shape), dim, tuple(recv_sizes), x.dtype, info)
            return AllToAllResult(out, layout, tuple(send_sizes))
        found: AllToAllResult = call_untraced(
            "all_to_all_v", x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout
        )
        return found
    return _eager_all_to_all(x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout)


def all_to_all_v(
    x: torch.Tensor,
    send_sizes: Sizes,
    dim: int = 0,
    *,
    recv_sizes: Sizes | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> torch.Tensor:
    """Send block ``j`` of ``x`` (``send_sizes[j]`` rows along ``dim``, in order) to rank
    ``j``; return the blocks received, concatenated in rank order along ``dim``.

    The receive sizes are the transposed send sizes (rank ``r`` receives
    ``send_sizes[r]`` of every rank): exchanged and validated, or passed as
    ``recv_sizes`` (then checked against the truth, or trusted with
    ``validate=False``, which skips the exchange). Every dimension but ``dim``, the
    ndim and the dtype must agree across ranks; blocks may be empty. Gradient: the
    reverse all_to_all of the upstream gradient with the sizes transposed.
    ``all_to_all_v_with_layout`` also returns the receive sizes.
    """
    return all_to_all_v_with_layout(
        x,
        send_sizes,
        dim,
        recv_sizes=recv_sizes,
        group=group,
        mesh_dim=mesh_dim,
        validate=validate,
        timeout=timeout,
    ).tensor


def all_gather_list(
    x: torch.Tensor,
    *,
    shapes: Sequence[Sequence[int]] | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    grad: GradContract = "sum",
    validate: bool = True,
    timeout: Timeout = None,
) -> list[torch.Tensor]:
    """Every rank's ``x``, as a list in rank order, bit for bit.

    The tensors share ndim, dtype and device type; every dimension may differ from
    rank to rank (empties too). One metadata round (every rank's shape, validated),
    then one payload collective. ``shapes`` (every rank's shape) may be passed: it is
    checked against the truth, or with ``validate=False`` trusted and the metadata
    round skipped (the compiled path needs it). Gradients by ``grad``: ``"sum"``
    gives ``dx_r = Σ_j g_{j,r}``, ``"local"`` ``g_{r,r}``, ``"mean"`` the sum over
    ``W``. In a world of one rank the result is ``[x]``.
    """
    if torch.compiler.is_compiling():
        out = compiled_all_gather_list(x, shapes, group, mesh_dim, grad, validate, timeout)
        if out is not None:
            return out
        result: list[torch.Tensor] = call_untraced(
            "all_gather_list", x, shapes, group, mesh_dim, grad, validate, timeout
        )
        return result
    return _eager_all_gather_list(x, shapes, group, mesh_dim, grad, validate, timeout)

"""The public face: one thin function per collective.

Where it sits: on top, under ``vargather/__init__``. Each function says what its
collective means (its docstring is the user's documentation) and calls its
collective's ``Route`` (``_compiled``, declared at the end of ``_gather``,
``_reduce_scatter``, ``_all_to_all``, ``_gather_list``): the eager code, or under
``torch.compile`` the collective's operators. Nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeAlias, TypeVar

import torch

from ._all_to_all import ALL_TO_ALL_V, AllToAllResult
from ._choices import GradContract, TransportName
from ._gather import (
    ALL_GATHER_V,
    ALL_GATHER_V_WITH_LAYOUT,
    GatherResult,
    gather_coalesced,
    plan_gather,
)
from ._gather_list import ALL_GATHER_LIST
from ._layout import Layout
from ._mesh import GroupLike, MeshDim
from ._reduce_scatter import REDUCE_SCATTER_V

Sizes: TypeAlias = "Sequence[int] | torch.Tensor | None"
SplitSizes: TypeAlias = "Sequence[int] | torch.Tensor"
Timeout: TypeAlias = "float | timedelta | None"


_RAISES = """
    Raises:
        VarGatherError: bad input on any rank, raised on every rank of the group with
            the same message, naming the offending rank(s) (also as ``.ranks``), before
            any payload moves{moves}; the group stays usable. The subclass says what:
            ``DTypeMismatchError``, ``ShapeMismatchError``, ``DimError``,
            ``SizesMismatchError``{sizes}, ... (the misuse catalogue lists each).
        GroupError: on this rank only, when ``group`` is unusable here.
        CollectiveTimeoutError: a peer never arrived within ``timeout`` (or the
            group's timeout), naming it when the arrival census can.
        PeerLostError: a peer died mid-call, naming it when it can.
    """
F = TypeVar("F", bound=Callable[..., object])


def _raises(moves: str = "", sizes: str = "") -> Callable[[F], F]:
    """Adds the ``Raises`` section every face shares at its docstring's end, ``moves``
    and ``sizes`` said after "payload moves" and after ``SizesMismatchError``."""

    def add(face: F) -> F:
        if face.__doc__ is not None:  # None under python -OO
            face.__doc__ = f"{face.__doc__.rstrip()}\n{_RAISES.format(moves=moves, sizes=sizes)}"
        return face

    return add


# --- all_gather_v and its forms ------------------------------------------------------------


@_raises()
def gather_layout(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: GroupLike = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
    timeout: Timeout = None,
    mesh_dim: MeshDim = None,
) -> Layout:
    """The ``Layout`` (sizes, offsets, total, ...) a gather of ``x`` would have.

    Takes ``all_gather_v``'s arguments. It runs the metadata exchange (a collective)
    unless ``sizes`` is given with ``validate=False``, and moves no payload.

    Shapes:
        ``x`` as for ``all_gather_v``, ``lead + (n_r,) + trail``; the layout's
        ``output_shape`` is the gathered ``lead + (Σ_r n_r,) + trail``.

    Gradient:
        None: it returns no tensor.
    """
    layout, _, _ = plan_gather(
        x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim, layout_only=True
    )
    return layout


@_raises()
def all_gather_v_with_layout(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: GroupLike = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
    timeout: Timeout = None,
    mesh_dim: MeshDim = None,
) -> GatherResult:
    """``all_gather_v`` that also returns the gather's ``Layout``.

    Takes ``all_gather_v``'s arguments; returns ``GatherResult(tensor, layout)``, the
    layout saying every rank's size and offset along ``dim``.

    Shapes:
        As ``all_gather_v``; ``layout.sizes`` and ``layout.offsets`` hold every rank's
        ``n_r`` and ``o_r``.

    Gradient:
        As ``all_gather_v``, under ``grad`` (the layout carries none).
    """
    return ALL_GATHER_V_WITH_LAYOUT(
        x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim
    )


@_raises()
def all_gather_v(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: GroupLike = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
    timeout: Timeout = None,
    mesh_dim: MeshDim = None,
) -> torch.Tensor:
    """Gather tensors whose size along ``dim`` differs per rank: ``cat_r x_r`` on every rank.

    Under ``torch.compile`` it is a custom operator: no graph break with ``sizes`` given
    as Python ints, none with ``sizes=None`` under ``fullgraph=True``.

    Args:
        x: this rank's shard (see Shapes).
        dim: the gather dimension, negative values counted from the end.
        sizes: every rank's ``n_r`` if the caller knows them (a sequence of ints or a
            1-d integer tensor, in group-rank order). With ``validate=True`` they are
            checked against the truth on every rank; with ``validate=False`` they are
            trusted and the metadata exchange is skipped.
        group: the process group (``None``: the default group), or a ``DeviceMesh``
            (1-D, or with ``mesh_dim``).
        grad: the gradient contract, ``"sum"``, ``"local"`` or ``"mean"`` (see
            Gradient); the same on every rank.
        transport: ``"auto"``, ``"padded"``, ``"alltoallv"``, ``"broadcast"`` or
            ``"views"`` (NCCL only); the same on every rank.
        validate: run the metadata exchange even when ``sizes`` is given (the default).
            ``validate=False`` with ``sizes`` trusts them: a lie is then raised on the
            lying rank only, or not detected at all; the same on every rank.
        timeout: seconds (or a ``timedelta``) each collective of this call and of its
            backward may wait for the peers, instead of the group's timeout; after a
            timeout the group is out of step (re-create it).
        mesh_dim: with a multi-dimensional ``DeviceMesh`` as ``group``, the mesh
            dimension (index or name) whose process group gathers.

    Returns:
        The gathered tensor, rank 0's block first.

    Shapes:
        ``x`` is ``lead + (n_r,) + trail``: ``lead``, ``trail``, the ndim, the dtype and
        the device type agree across ranks, ``n_r`` may differ and may be 0 (on every
        rank too). The result is ``lead + (Σ_r n_r,) + trail``, rank ``r``'s block at
        offset ``o_r = n_0 + ... + n_{r-1}`` along ``dim``. Without an initialized
        torch.distributed, or in a world of one rank, it is ``x`` itself.

    Gradient:
        With ``g_j`` the upstream gradient on rank ``j``: ``"sum"`` gives
        ``dx_r = Σ_j g_j[o_r : o_r + n_r]`` (one reduce-scatter; exact when each rank
        computes its own loss), ``"mean"`` that sum divided by ``W``, ``"local"``
        ``g_r[o_r : o_r + n_r]`` (no communication; exact only when every rank computes
        the identical loss).
    """
    return ALL_GATHER_V(x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim)


# --- several tensors at once -------------------------------------------------------------


@_raises(
    " (the message names the tensor, ``tensor #1: ...``; a different number of tensors on"
    " one rank is an ``ArgumentMismatchError``)"
)
def all_gather_v_coalesced(
    tensors: Sequence[torch.Tensor],
    dim: int | Sequence[int] = 0,
    *,
    sizes: Sequence[Sizes] | None = None,
    group: GroupLike = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
    timeout: Timeout = None,
    mesh_dim: MeshDim = None,
) -> list[torch.Tensor]:
    """``all_gather_v`` of several tensors at once: one metadata exchange and one payload
    collective for all of them (one collective in all when they are small).

    Each argument means what it means for ``all_gather_v`` and is validated the same
    way; ``dim`` is one int or one per tensor, ``sizes`` ``None`` or one entry
    (``None`` or the sizes) per tensor. With ``validate=False`` and every tensor's
    ``sizes`` given the exchange is skipped. Returns the gathered tensors, in order.

    Shapes:
        ``tensors[i]`` is ``lead_i + (n_{r,i},) + trail_i`` along ``dim[i]``, each with
        its own dtype, shape and ragged size; result ``i`` is
        ``lead_i + (Σ_r n_{r,i},) + trail_i``. In a world of one rank the inputs are
        returned as they are.

    Gradient:
        Every input that requires one gets ``all_gather_v``'s gradient under ``grad``;
        the backward runs one collective per such tensor, in order.
    """
    return gather_coalesced(
        tensors, dim, sizes, group, grad, transport, validate, timeout, mesh_dim
    )


# --- reduce_scatter_v, all_to_all_v, all_gather_list ---------------------------------------


@_raises(
    sizes=" for sizes that differ across ranks, ``SizesError`` for ``sum(sizes) != x.shape[dim]``"
)
def reduce_scatter_v(
    x: torch.Tensor,
    sizes: SplitSizes,
    dim: int = 0,
    *,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> torch.Tensor:
    """Sum every rank's ``x`` and give rank ``r`` its block ``r`` along ``dim``.

    Rank ``r`` returns ``x_0[o_r : o_r + n_r] + ... + x_{W-1}[o_r : o_r + n_r]``,
    added left to right in rank order in the input's dtype (bit for bit the same on
    every backend; integers wrap, bool is a logical or), a fresh tensor.

    Args:
        x: this rank's input (see Shapes).
        sizes: ``(n_0, ..., n_{W-1})``, a sequence of ints or a 1-d integer tensor,
            the same on every rank, in group-rank order.
        dim: the dimension cut into blocks, negative values counted from the end.
        group: as for ``all_gather_v`` (a process group or a ``DeviceMesh``).
        mesh_dim: as for ``all_gather_v``.
        validate: ``False`` skips the metadata exchange; the sizes are then trusted.
        timeout: as for ``all_gather_v``.

    Shapes:
        ``x`` is ``lead + (sum(sizes),) + trail``, the same shape and dtype on every
        rank; rank ``r`` returns ``lead + (n_r,) + trail`` (blocks may be empty).

    Gradient:
        ``dx_j = cat_r g_r`` on every rank: the ``all_gather_v`` of the upstream
        gradients (the exact adjoint).
    """
    return REDUCE_SCATTER_V(x, sizes, dim, group, mesh_dim, validate, timeout)


@_raises()
def all_to_all_v_with_layout(
    x: torch.Tensor,
    send_sizes: SplitSizes,
    dim: int = 0,
    *,
    cat_dim: int | None = None,
    recv_sizes: SplitSizes | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> AllToAllResult:
    """``all_to_all_v`` that also returns the receive ``Layout`` and the send sizes.

    Takes ``all_to_all_v``'s arguments; returns ``AllToAllResult(tensor, layout,
    send_sizes)``: ``layout.sizes`` are the receive sizes, ``layout.offsets`` where each
    source rank's rows start (along ``cat_dim``: ``layout.dim``).

    Shapes:
        As ``all_to_all_v``.

    Gradient:
        As ``all_to_all_v``: the reverse exchange.
    """
    return ALL_TO_ALL_V(x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout, cat_dim)


@_raises()
def all_to_all_v(
    x: torch.Tensor,
    send_sizes: SplitSizes,
    dim: int = 0,
    *,
    cat_dim: int | None = None,
    recv_sizes: SplitSizes | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> torch.Tensor:
    """Send block ``j`` of ``x`` to rank ``j``; return the blocks received, in rank order.

    Block ``j`` is ``send_sizes[j]`` rows along ``dim``, in order; the blocks received
    are joined along ``cat_dim`` (``dim`` when ``None``).

    Args:
        x: this rank's input (see Shapes).
        send_sizes: rows of ``x`` for each rank, a sequence of ints or a 1-d integer
            tensor in group-rank order.
        dim: the dimension cut into blocks, negative values counted from the end.
        cat_dim: the dimension the received blocks are joined along (``dim`` when
            ``None``), negative values counted from the end. Another dim than ``dim``
            is the sequence-parallel switch (``[b, s/P, H, d]`` cut along the heads,
            joined along the sequence: ``vargather.seq_to_heads``).
        recv_sizes: each rank's block's size along ``cat_dim`` (``send_sizes[r]`` of
            every rank when ``cat_dim`` is ``dim``, else every rank's
            ``x.shape[cat_dim]``), if known: checked against the truth, or trusted with
            ``validate=False``; else exchanged and validated.
        group: as for ``all_gather_v`` (a process group or a ``DeviceMesh``).
        mesh_dim: as for ``all_gather_v``.
        validate: ``False`` with ``recv_sizes`` trusts them and skips the exchange.
        timeout: as for ``all_gather_v``.

    Shapes:
        ``x`` is ``lead + (sum(send_sizes),) + trail``: every dimension but ``dim``, the
        ndim and the dtype agree across ranks; blocks may be empty. Rank ``r`` returns
        ``lead + (Σ_j send_sizes_j[r],) + trail``. With ``cat_dim`` another dim,
        ``x.shape[cat_dim]`` may differ across ranks and every rank must send rank
        ``r`` as many rows along ``dim`` (``send_sizes_j[r]`` equal for every ``j``):
        rank ``r`` returns ``x``'s shape with ``send_sizes[r]`` along ``dim`` and
        ``Σ_j x_j.shape[cat_dim]`` along ``cat_dim``.

    Gradient:
        The reverse exchange: the upstream gradient sent back with the sizes
        transposed (pure data movement, exact).
    """
    args = (x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout, cat_dim)
    return ALL_TO_ALL_V(*args).tensor


@_raises()
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

    One metadata round (every rank's shape, validated), then one payload collective;
    one collective in all in steady state when small. ``shapes`` (every rank's shape)
    may be passed: it is checked against the truth, or with ``validate=False`` trusted
    and the metadata round skipped (what ``torch.compile(fullgraph=True)`` needs).

    Args:
        x: this rank's tensor (see Shapes).
        shapes: every rank's shape, in group-rank order, if known.
        group: as for ``all_gather_v`` (a process group or a ``DeviceMesh``).
        mesh_dim: as for ``all_gather_v``.
        grad: ``"sum"``, ``"local"`` or ``"mean"`` (see Gradient); the same on every rank.
        validate: ``False`` with ``shapes`` trusts them and skips the metadata round.
        timeout: as for ``all_gather_v``.

    Shapes:
        ``x_r`` of any shape: the ndim, the dtype and the device type agree across
        ranks, every dimension may differ (empties too). Every rank returns
        ``[x_0, ..., x_{W-1}]``; in a world of one rank, ``[x]``.

    Gradient:
        With ``g_{j,r}`` rank ``j``'s upstream gradient for output ``r``: ``"sum"``
        gives ``dx_r = g_{0,r} + ... + g_{W-1,r}`` (rank order), ``"local"``
        ``g_{r,r}`` (no communication), ``"mean"`` the sum divided by ``W``.
    """
    return ALL_GATHER_LIST(x, shapes, group, mesh_dim, grad, validate, timeout)

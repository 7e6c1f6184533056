"""The public face: one thin function per collective, and one route into compiled mode.

Where it sits: on top, under ``vargather/__init__``. Each function says what its
collective means (its docstring is the user's documentation) and does one thing:
under ``torch.compile`` (``torch.compiler.is_compiling()``) it hands the call to the
compiled layer (``_compiled.compiled_gather``, ``_compiled_family``), which runs a
custom operator or the eager call behind ``torch.compiler.disable``; otherwise it
calls its collective's eager code (``_gather``, ``_reduce_scatter``, ``_all_to_all``,
``_gather_list``), which resolves the group (``_mesh.call_group``), plans (checks, the
one round, validation) and runs the payload inside its autograd function. Nothing
below imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TypeAlias

import torch

from ._all_to_all import AllToAllResult, all_to_all_eager
from ._choices import GradContract, TransportName
from ._compiled import compiled_gather
from ._compiled_family import (
    compiled_all_gather_list,
    compiled_all_to_all,
    compiled_reduce_scatter,
)
from ._gather import GatherResult, gather_coalesced, gather_with_layout, plan_gather
from ._gather_list import gather_list_eager
from ._layout import Layout
from ._mesh import GroupLike, MeshDim
from ._reduce_scatter import reduce_scatter_eager

__all__ = [
    "AllToAllResult",
    "GatherResult",
    "GradContract",
    "TransportName",
    "all_gather_list",
    "all_gather_v",
    "all_gather_v_coalesced",
    "all_gather_v_with_layout",
    "all_to_all_v",
    "all_to_all_v_with_layout",
    "gather_layout",
    "reduce_scatter_v",
]

Sizes: TypeAlias = "Sequence[int] | torch.Tensor | None"
SplitSizes: TypeAlias = "Sequence[int] | torch.Tensor"
Timeout: TypeAlias = "float | timedelta | None"


# --- all_gather_v and its forms ------------------------------------------------------------


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

    A collective (the metadata exchange) unless ``sizes`` is given with
    ``validate=False``; it raises exactly what ``all_gather_v`` would, on every rank.
    """
    layout, _, _ = plan_gather(
        x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim, layout_only=True
    )
    return layout


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
    """``all_gather_v`` that also returns the gather's ``Layout``."""
    if torch.compiler.is_compiling():  # a custom operator dynamo can trace (``_compiled``)
        out, layout = compiled_gather(
            x,
            dim,
            sizes=sizes,
            group=group,
            mesh_dim=mesh_dim,
            grad=grad,
            transport=transport,
            validate=validate,
            timeout=timeout,
            with_layout=True,
        )
        assert layout is not None  # with_layout=True
        return GatherResult(out, layout)
    return gather_with_layout(
        x,
        dim,
        sizes=sizes,
        group=group,
        grad=grad,
        transport=transport,
        validate=validate,
        timeout=timeout,
        mesh_dim=mesh_dim,
    )


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

    Under ``torch.compile`` it is a custom operator: no graph break with ``sizes``
    given as ints, one without (``vargather._compiled``, ``docs/compile.md``).

    Args:
        x: this rank's shard, ``lead + (n_r,) + trail``. ``lead``, ``trail``, ndim,
            dtype and device type must agree across ranks; ``n_r`` may be 0.
        dim: the gather dimension, negative values counted from the end.
        sizes: every rank's ``n_r`` if the caller knows them (a sequence of ints or a
            1-d integer tensor, in group-rank order). With ``validate=True`` they are
            checked against the truth on every rank; with ``validate=False`` they are
            trusted and the metadata exchange is skipped (see ``_exchange``).
        group: the process group (``None``: the default group), or a
            ``DeviceMesh`` (1-D, or with ``mesh_dim``). Without an initialized
            torch.distributed, or in a world of one rank, the gather is the identity
            and returns ``x`` itself.
        grad: the gradient contract, ``"sum"``, ``"local"`` or ``"mean"`` (see
            ``GatherVFunction``); must be the same on every rank.
        transport: ``"auto"``, ``"padded"``, ``"alltoallv"``, ``"broadcast"`` or
            ``"views"`` (NCCL only); same on every rank (``docs/performance.md``).
        validate: run the metadata exchange even when ``sizes`` is given (the
            default). ``validate=False`` with ``sizes`` trusts them and skips it: a
            lie is then raised on the lying rank only, or not detected at all (see
            ``docs/misuse.md``); it must be the same on every rank.
        timeout: seconds (or a ``timedelta``) each collective of this call, and of
            its backward, may wait for the peers, instead of the group's timeout. On
            expiry every waiting rank raises ``CollectiveTimeoutError`` naming the
            ranks that never arrived; the group is out of step afterwards.
        mesh_dim: with a multi-dimensional ``DeviceMesh`` as ``group``, the mesh
            dimension (index or name) whose process group gathers.

    Returns:
        ``lead + (Σ_r n_r,) + trail``, rank 0's block first.

    Raises:
        VarGatherError: a subclass naming the offending rank(s), raised on every rank
            of the group before any payload moves (see ``vargather._errors``).
        GroupError: on this rank only, when ``group`` is unusable here.
        CollectiveError: a peer never arrived (``CollectiveTimeoutError``) or died
            (``PeerLostError``), naming it when the arrival census can.
    """
    if torch.compiler.is_compiling():  # a custom operator dynamo can trace (``_compiled``)
        return compiled_gather(
            x,
            dim,
            sizes=sizes,
            group=group,
            mesh_dim=mesh_dim,
            grad=grad,
            transport=transport,
            validate=validate,
            timeout=timeout,
            with_layout=False,
        )[0]
    return gather_with_layout(
        x,
        dim,
        sizes=sizes,
        group=group,
        grad=grad,
        transport=transport,
        validate=validate,
        timeout=timeout,
        mesh_dim=mesh_dim,
    ).tensor


# --- several tensors at once -------------------------------------------------------------


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

    Each tensor has its own dtype, shape and ragged size along its ``dim``; ``dim`` is
    one int or one per tensor, ``sizes`` ``None`` or one entry (``None`` or the sizes)
    per tensor. Returns the gathered tensors in order. Every argument means what it
    means for ``all_gather_v`` and is validated the same way; an error names the
    tensor (``"tensor #1: ..."``) and is raised on every rank, the number of tensors
    included. Gradients flow to every input under ``grad``; the backward runs one
    collective per tensor that needs a gradient, in order. With ``validate=False`` and
    every tensor's ``sizes`` given the exchange is skipped. In a world of one rank the
    inputs are returned as they are. ``group`` may be a ``DeviceMesh`` (with
    ``mesh_dim``), as for ``all_gather_v``.
    """
    return gather_coalesced(
        tensors,
        dim,
        sizes=sizes,
        group=group,
        grad=grad,
        transport=transport,
        validate=validate,
        timeout=timeout,
        mesh_dim=mesh_dim,
    )


# --- reduce_scatter_v, all_to_all_v, all_gather_list ---------------------------------------


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
        return compiled_reduce_scatter(x, sizes, dim, group, mesh_dim, validate, timeout)
    return reduce_scatter_eager(x, sizes, dim, group, mesh_dim, validate, timeout)


def all_to_all_v_with_layout(
    x: torch.Tensor,
    send_sizes: SplitSizes,
    dim: int = 0,
    *,
    recv_sizes: SplitSizes | None = None,
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
    timeout: Timeout = None,
) -> AllToAllResult:
    """``all_to_all_v`` that also returns the receive ``Layout`` and the send sizes."""
    if torch.compiler.is_compiling():
        return compiled_all_to_all(
            x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout
        )
    return all_to_all_eager(x, send_sizes, recv_sizes, dim, group, mesh_dim, validate, timeout)


def all_to_all_v(
    x: torch.Tensor,
    send_sizes: SplitSizes,
    dim: int = 0,
    *,
    recv_sizes: SplitSizes | None = None,
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
        return compiled_all_gather_list(x, shapes, group, mesh_dim, grad, validate, timeout)
    return gather_list_eager(x, shapes, group, mesh_dim, grad, validate, timeout)

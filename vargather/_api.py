"""The public entry points: plan a gather (check, exchange, validate), then run it.

``all_gather_v`` = ``gather_layout`` (argument checks ``_args``, exchange and
validation ``_exchange``: the ``Layout``) + ``GatherVFunction`` (``_autograd``, which
moves the payload through a ``_transport``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import NamedTuple, TypeAlias

import torch

from ._args import check_call
from ._autograd import GatherPlan, GatherVFunction
from ._choices import GradContract, TransportName
from ._compiled import bind_eager, compiled_gather
from ._exchange import plan_layout, trusted_layout
from ._group import GroupInfo, resolve_group
from ._layout import Layout
from ._mesh import GroupLike, MeshDim, resolve_mesh
from ._transport import choose_transport

__all__ = [
    "GatherResult",
    "GradContract",
    "TransportName",
    "all_gather_v",
    "all_gather_v_with_layout",
    "gather_layout",
]

Sizes: TypeAlias = "Sequence[int] | torch.Tensor | None"
Timeout: TypeAlias = "float | timedelta | None"


class GatherResult(NamedTuple):
    """A gathered tensor with the ``Layout`` that says where each rank's block is."""

    tensor: torch.Tensor
    layout: Layout


def _plan(
    x: object,
    dim: object,
    sizes: object,
    group: object,
    grad: object,
    transport: object,
    validate: object,
    timeout: object = None,
    mesh_dim: object = None,
) -> tuple[Layout, GroupInfo]:
    """Stages 1-3 for one call: every problem becomes the same error on every rank.

    Only two kinds of problem are raised on this rank alone: an unusable ``group``
    (``resolve_group``: without a group there is nobody to tell) and, with
    ``validate=False``, whatever the local checks find (the exchange that would tell
    the peers is exactly what was skipped).
    """
    info = resolve_group(resolve_mesh(group, mesh_dim))  # type: ignore[arg-type]  # judged there
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
        return trusted_layout(call, info), info
    # A non-bool validate runs the exchange, which reports it on every rank.
    return plan_layout(call, info), info


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
    layout, _ = _plan(x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim)
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
    layout, info = _plan(x, dim, sizes, group, grad, transport, validate, timeout, mesh_dim)
    assert isinstance(x, torch.Tensor)  # validated by _plan on every rank
    if not info.communicates:
        return GatherResult(x, layout)
    # grad and transport are valid and agreed on every rank by now.
    plan = GatherPlan(layout, info, choose_transport(str(transport), layout, info), grad)
    # Function.apply is untyped in torch's stubs (it forwards *args to forward).
    out = GatherVFunction.apply(x, plan)  # type: ignore[no-untyped-call]
    assert isinstance(out, torch.Tensor)
    return GatherResult(out, layout)


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
    return all_gather_v_with_layout(
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


bind_eager(_plan, all_gather_v_with_layout)

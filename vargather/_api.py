"""The public entry points: plan a gather (exchange + validate), then run it.

``all_gather_v`` = ``gather_layout`` (metadata exchange and validation, stage 1) +
``GatherVFunction`` (padding, transport, compaction, autograd; stages 2-5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, TypeAlias

import torch
import torch.distributed as dist

from ._autograd import GatherPlan, GatherVFunction
from ._comm import GroupInfo, resolve_group
from ._errors import ArgumentError
from ._layout import Layout
from ._metadata import exchange_records, local_record, trusted_layout, validate_records
from ._transport import TRANSPORT_NAMES, choose_transport

__all__ = [
    "GatherResult",
    "GradContract",
    "all_gather_v",
    "all_gather_v_with_layout",
    "gather_layout",
]

GradContract: TypeAlias = Literal["sum", "local", "mean"]
TransportName: TypeAlias = Literal["auto", "padded", "alltoallv"]
Sizes: TypeAlias = "Sequence[int] | torch.Tensor | None"


class GatherResult(NamedTuple):
    """A gathered tensor with the ``Layout`` that says where each rank's block is."""

    tensor: torch.Tensor
    layout: Layout


def _plan(
    x: object,
    dim: object,
    sizes: object,
    group: dist.ProcessGroup | None,
    grad: object,
    transport: object,
    validate: object,
) -> tuple[Layout, GroupInfo]:
    if not isinstance(validate, bool):
        # Raised locally: validate decides whether the exchange runs at all, so it
        # cannot be reported through the exchange.
        raise ArgumentError(f"validate must be a bool, got {type(validate).__name__}")
    info = resolve_group(group)
    record = local_record(
        x,
        dim,
        sizes=sizes,
        contract=grad,
        transport=transport,
        transports=TRANSPORT_NAMES,
        info=info,
    )
    if sizes is not None and not validate:
        return trusted_layout(record, sizes, info, TRANSPORT_NAMES), info
    records = exchange_records(record, info)
    return validate_records(records, rank=info.rank, transports=TRANSPORT_NAMES), info


def gather_layout(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: dist.ProcessGroup | None = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
) -> Layout:
    """The ``Layout`` (sizes, offsets, total, ...) a gather of ``x`` would have.

    A collective (the metadata exchange) unless ``sizes`` is given with
    ``validate=False``; it raises exactly what ``all_gather_v`` would, on every rank.
    """
    layout, _ = _plan(x, dim, sizes, group, grad, transport, validate)
    return layout


def all_gather_v_with_layout(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: dist.ProcessGroup | None = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
) -> GatherResult:
    """``all_gather_v`` that also returns the gather's ``Layout``."""
    layout, info = _plan(x, dim, sizes, group, grad, transport, validate)
    assert isinstance(x, torch.Tensor)  # validated by _plan on every rank
    if not info.communicates:
        return GatherResult(x, layout)
    plan = GatherPlan(layout, info, choose_transport(str(transport), layout, info), str(grad))
    # Function.apply is untyped in torch's stubs (it forwards *args to forward).
    out = GatherVFunction.apply(x, plan)  # type: ignore[no-untyped-call]
    assert isinstance(out, torch.Tensor)
    return GatherResult(out, layout)


def all_gather_v(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Sizes = None,
    group: dist.ProcessGroup | None = None,
    grad: GradContract = "sum",
    transport: TransportName = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Gather tensors whose size along ``dim`` differs per rank: ``cat_r x_r`` on every rank.

    Args:
        x: this rank's shard, ``lead + (n_r,) + trail``. ``lead``, ``trail``, ndim,
            dtype and device type must agree across ranks; ``n_r`` may be 0.
        dim: the gather dimension, negative values counted from the end.
        sizes: every rank's ``n_r`` if the caller knows them (a sequence of ints or a
            1-d integer tensor, in group-rank order). With ``validate=True`` they are
            checked against the truth on every rank; with ``validate=False`` they are
            trusted and the metadata exchange is skipped (see ``_metadata``).
        group: the process group (``None``: the default group). Without an
            initialized torch.distributed, or in a world of one rank, the gather is
            the identity and returns ``x`` itself.
        grad: the gradient contract, ``"sum"``, ``"local"`` or ``"mean"`` (see
            ``GatherVFunction``); must be the same on every rank.
        transport: ``"auto"``, ``"padded"`` or ``"alltoallv"``; same on every rank.
        validate: run the metadata exchange even when ``sizes`` is given.

    Returns:
        ``lead + (Σ_r n_r,) + trail``, rank 0's block first.

    Raises:
        VarGatherError: a subclass naming the offending rank(s), raised on every rank
            of the group before any payload moves (see ``vargather._errors``).
    """
    return all_gather_v_with_layout(
        x, dim, sizes=sizes, group=group, grad=grad, transport=transport, validate=validate
    ).tensor

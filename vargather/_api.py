"""The public entry points: plan a gather (check, exchange, validate), then run it.

``all_gather_v`` = ``gather_layout`` (argument checks ``_args``, exchange and
validation ``_exchange``: the ``Layout``) + ``GatherVFunction`` (``_autograd``, which
moves the payload through a ``_transport``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import NamedTuple, TypeAlias

import torch
import torch.autograd.forward_ad as forward_ad

from . import _fused
from ._args import CheckedCall, Problem, check_call
from ._autograd import CoalescedFunction, CoalescedPlan, GatherPlan, GatherVFunction
from ._choices import GradContract, TransportName
from ._compiled import bind_eager, compiled_gather
from ._errors import DimError, InputTypeError, SizesError, VarGatherError
from ._exchange import plan_layout, trusted_layout
from ._group import GroupInfo, resolve_group
from ._layout import Layout
from ._mesh import GroupLike, MeshDim, resolve_mesh
from ._transport import Transport, choose_transport

__all__ = [
    "GatherResult",
    "GradContract",
    "TransportName",
    "all_gather_v",
    "all_gather_v_coalesced",
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
        return trusted_layout(call, info), info, None
    if not info.communicates:
        return plan_layout(call, info), info, None
    # A non-bool validate runs the exchange, which reports it on every rank.
    eligible = _is_auto(transport) and not layout_only
    found = _fused.exchange("all_gather_v", [call], [x], info, eligible=eligible)
    return found.layouts[0], info, None if found.outputs is None else found.outputs[0]


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
    layout, _, _ = _plan(
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
    layout, info, gathered = _plan(
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


# --- several tensors at once -------------------------------------------------------------


def _is_sequence(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _with_problem(call: CheckedCall, problem: Problem) -> CheckedCall:
    return call._replace(record=replace(call.record, problem=problem))


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
        calls[0] = _with_problem(calls[0], problem)
    return items, calls


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
    info = resolve_group(resolve_mesh(group, mesh_dim))  # type: ignore[arg-type]  # judged there
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
    if trusted:
        layouts = []
        for i, call in enumerate(calls):
            try:
                layouts.append(trusted_layout(call, info))
            except VarGatherError as err:
                raise _fused.named(err, i) from None
    elif not info.communicates:
        for i, call in enumerate(calls):
            try:
                plan_layout(call, info)
            except VarGatherError as err:
                raise _fused.named(err, i) from None
        return [t for t in items if isinstance(t, torch.Tensor)]
    else:
        found = _fused.exchange(
            "all_gather_v_coalesced", calls, items, info, eligible=_is_auto(transport)
        )
        layouts = list(found.layouts)
        outputs = found.outputs
    if not info.communicates:
        return [t for t in items if isinstance(t, torch.Tensor)]
    xs = [t for t in items if isinstance(t, torch.Tensor)]
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


bind_eager(_plan, all_gather_v_with_layout)

"""Stage 6: autograd, the gather as a differentiable function with a chosen contract.

The contracts ``sum``, ``local`` and ``mean`` and their math are ``all_gather_v``'s
Gradient section (``_api``; ``docs/getting-started.md`` says which loss each is the
gradient of). The backward is a collective under ``sum`` and ``mean``: every rank of
the group must run it (validation refuses ranks that disagree on ``requires_grad``).

``planned_function`` makes the other collectives' autograd functions, all one shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.autograd.function import once_differentiable

from ._choices import GradContract
from ._group import GroupInfo
from ._layout import Layout
from ._reduced import canonical_nans_, mean_
from ._transport import Transport


@dataclass(frozen=True)
class GatherPlan:
    """Everything a validated gather needs, shared by its forward and backward."""

    layout: Layout
    info: GroupInfo
    transport: Transport
    contract: GradContract


class GatherVFunction(torch.autograd.Function):
    """``out = cat_r x_r`` with the backward of ``plan.contract``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, plan: GatherPlan) -> torch.Tensor:
        ctx.plan = plan
        if plan.layout.total == 0:
            # Every rank is empty and every rank knows it: nothing to move.
            return x.new_empty(plan.layout.output_shape)
        return plan.transport.gather(x, plan.layout, plan.info)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        plan: GatherPlan = ctx.plan
        return contract_backward(
            grad_output, plan.layout, plan.info, plan.transport, plan.contract
        ), None


def contract_backward(
    grad_output: torch.Tensor,
    layout: Layout,
    info: GroupInfo,
    transport: Transport,
    contract: GradContract,
) -> torch.Tensor:
    """``dx_r`` under ``contract`` for this rank's upstream gradient ``grad_output``."""
    if layout.total == 0:
        return grad_output.new_zeros(layout.shard_shape(layout.rank))
    if contract == "local":
        # No communication: this rank's slice of its own upstream gradient (a view).
        return grad_output.narrow(layout.dim, layout.local_offset, layout.local_size)
    # One collective for sum and mean alike; never an all_reduce of the whole
    # gradient (each rank needs only its own block of the sum).
    grad = transport.reduce_scatter_sum(grad_output, layout, info)
    if contract == "mean":
        return mean_(grad, layout.world_size)  # in place: the transport's is a fresh tensor
    return canonical_nans_(grad)  # the backend's sum: its NaNs' bits are its own


@dataclass(frozen=True)
class CoalescedPlan:
    """A validated coalesced gather: each tensor's layout and backward transport, and
    the gathered results (handed to the forward once, then dropped)."""

    layouts: tuple[Layout, ...]
    info: GroupInfo
    transports: tuple[Transport, ...]
    contract: GradContract
    box: list[list[torch.Tensor]]


class CoalescedFunction(torch.autograd.Function):
    """``out_i = cat_r x_{r,i}`` for every tensor ``i``, each with the backward of
    ``plan.contract``: in the backward every tensor that needs a gradient takes its own
    collective, in tensor order on every rank."""

    @staticmethod
    def forward(ctx: Any, plan: CoalescedPlan, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.plan = plan
        outputs = plan.box.pop()
        fixed = [o for o in outputs if not (o.is_floating_point() or o.is_complex())]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        plan: CoalescedPlan = ctx.plan
        result: list[torch.Tensor | None] = [None]
        for i, g in enumerate(grads):
            if not ctx.needs_input_grad[1 + i]:
                result.append(None)
                continue
            if g is None:  # an unused output: its gradient is zero, and still a collective
                g = torch.zeros(plan.layouts[i].output_shape, dtype=plan.layouts[i].dtype)
            result.append(
                contract_backward(g, plan.layouts[i], plan.info, plan.transports[i], plan.contract)
            )
        return tuple(result)


Step = Callable[[torch.Tensor, Any], torch.Tensor]
"""A payload or a gradient over a plan: ``(tensor, plan) -> tensor``."""


def planned_function(
    name: str, doc: str, payload: Step, gradient: Step
) -> type[torch.autograd.Function]:
    """The autograd function ``name`` of a collective over its plan (``apply(x, plan)``):
    the forward is ``plan.result`` when the payload rode in the round, else
    ``payload(x, plan)``; the backward ``gradient(g, plan)`` when ``x`` wants one."""

    def forward(ctx: Any, x: torch.Tensor, plan: Any) -> torch.Tensor:
        ctx.plan = plan
        out: torch.Tensor | None = plan.result
        return payload(x, plan) if out is None else out

    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        return gradient(grad_output, ctx.plan), None

    body = {"__doc__": doc, "forward": staticmethod(forward), "backward": staticmethod(backward)}
    body["__module__"] = payload.__module__  # the collective's module, as a class there
    return cast("type[torch.autograd.Function]", type(name, (torch.autograd.Function,), body))

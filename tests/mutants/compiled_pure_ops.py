"""Mutant: vargather's compiled operators registered pure, as they were before the
deadlock fix (``docs/compile.md``).

Eagerly it is ``vargather.all_gather_v`` itself. Under ``torch.compile`` it routes to
its own copies of vargather's custom operators (the same eager bodies and fake
implementations, namespace ``vgmutant``) without the ordered effect: a pure operator
is a value to the compiler, and inductor drops one whose output nothing reads. On a
rank whose shard is empty, the backward's input gradient has zero elements, every
read of it is a no-op, and that rank skips the backward's collective while its peers
wait in it. Only the ``compiled`` property can see it (the rest of the catalogue calls
it eagerly and finds vargather).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import vargather
from vargather import _gather as vc
from vargather._mesh import group_of
from vargather.testing.cases import GatherCase

BUG = (
    "its torch.compile operators are pure (mutates_args=() and no ordered effect): inductor "
    "drops the backward on a rank whose shard is empty, whose peers then wait forever"
)
BENIGN = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", seed=3)
COMPILES = True


@torch.library.custom_op("vgmutant::gather", mutates_args=())
def _gather(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    requires_grad: bool,
) -> torch.Tensor:
    return vc._gather_eagerly(
        x, dim, list(sizes), group_name, grad, transport, True, None, requires_grad
    )[0]


@_gather.register_fake
def _gather_fake(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    requires_grad: bool,
) -> torch.Tensor:
    return vc._all_gather_v_fake(
        x, dim, sizes, group_name, grad, transport, True, None, requires_grad
    )


@torch.library.custom_op("vgmutant::gather_backward", mutates_args=())
def _gather_backward(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
) -> torch.Tensor:
    return vc._backward_eagerly(grad_output, dim, sizes, group_name, grad, transport, None)


@_gather_backward.register_fake
def _gather_backward_fake(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
) -> torch.Tensor:
    return vc._all_gather_v_backward_fake(
        grad_output, dim, sizes, group_name, grad, transport, None
    )


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, dim, sizes, group_name, grad, transport, _rg = inputs
    ctx.args = (dim % x.dim(), list(sizes), group_name, grad, transport)


def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    dx = torch.ops.vgmutant.gather_backward(grad_output, *ctx.args)
    return (dx, None, None, None, None, None, None)


_gather.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("vgmutant::exchange_sizes", mutates_args=())
def _exchange(
    x: torch.Tensor, dim: int, group_name: str, grad: str, transport: str, requires_grad: bool
) -> torch.Tensor:
    found: torch.Tensor = torch.ops.vargather.exchange_sizes(  # run, not traced, here
        x, dim, group_name, grad, transport, True, None, requires_grad
    )
    return found.clone()  # an operator's output must not be another's


@_exchange.register_fake
def _exchange_fake(
    x: torch.Tensor, dim: int, group_name: str, grad: str, transport: str, requires_grad: bool
) -> torch.Tensor:
    return vc._exchange_sizes_fake(x, dim, group_name, grad, transport, True, None, requires_grad)


@torch.library.custom_op("vgmutant::gather_sized_by", mutates_args=())
def _sized_by(
    x: torch.Tensor, sizes: torch.Tensor, dim: int, group_name: str, grad: str, transport: str
) -> torch.Tensor:
    return vc._gather_eagerly(
        x, dim, sizes.tolist(), group_name, grad, transport, False, None, False
    )[0]


@_sized_by.register_fake
def _sized_by_fake(
    x: torch.Tensor, sizes: torch.Tensor, dim: int, group_name: str, grad: str, transport: str
) -> torch.Tensor:
    return vc._all_gather_v_sized_by_fake(x, sizes, dim, group_name, grad, transport, None)


@torch.library.custom_op("vgmutant::gather_sized_by_backward", mutates_args=())
def _sized_by_backward(
    grad_output: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    local_size: int,
    group_name: str,
    grad: str,
    transport: str,
) -> torch.Tensor:
    return vc._backward_eagerly(grad_output, dim, sizes.tolist(), group_name, grad, transport, None)


@_sized_by_backward.register_fake
def _sized_by_backward_fake(
    grad_output: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    local_size: int,
    group_name: str,
    grad: str,
    transport: str,
) -> torch.Tensor:
    return vc._all_gather_v_sized_by_backward_fake(
        grad_output, sizes, dim, local_size, group_name, grad, transport, None
    )


def _sized_by_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, sizes, dim, group_name, grad, transport = inputs
    d = dim % x.dim()
    ctx.save_for_backward(sizes)
    ctx.args = (d, x.shape[d], group_name, grad, transport)


def _sized_by_grad(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    (sizes,) = ctx.saved_tensors
    dx = torch.ops.vgmutant.gather_sized_by_backward(grad_output, sizes, *ctx.args)
    return (dx, None, None, None, None, None)


_sized_by.register_autograd(_sized_by_grad, setup_context=_sized_by_setup)


def all_gather_v(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Any = None,
    group: Any = None,
    grad: str = "sum",
    transport: str = "auto",
) -> torch.Tensor:
    if not torch.compiler.is_compiling():
        return vargather.all_gather_v(
            x,
            dim,
            sizes=sizes,
            group=group,
            grad=grad,  # type: ignore[arg-type]  # passed through: validation is vargather's
            transport=transport,  # type: ignore[arg-type]  # as above
        )
    where = group_of(group, None)
    assert where is not None  # the kit's groups resolve
    name = where[0]
    requires_grad = x.requires_grad and torch.is_grad_enabled()
    if sizes is not None:
        return torch.ops.vgmutant.gather(x, dim, list(sizes), name, grad, transport, requires_grad)
    found = torch.ops.vgmutant.exchange_sizes(x, dim, name, grad, transport, requires_grad)
    return torch.ops.vgmutant.gather_sized_by(x, found, dim, name, grad, transport)

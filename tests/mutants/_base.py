"""The faithful pipeline the mutants break: vargather's stages, wired by hand.

``gather`` is ``vargather.all_gather_v`` rebuilt from its parts (the public
``gather_layout`` for exchange and validation, then ``GatherVFunction`` over the
chosen transport) with four hooks a mutant may replace: the autograd ``function``,
a ``wrap_transport`` around the chosen transport, what a world of one rank
returns (``one_rank``), and how the layout is planned (``plan``, ``layout_of``'s
signature).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import vargather
from vargather._autograd import GatherPlan, GatherVFunction
from vargather._group import resolve_group
from vargather._layout import Layout
from vargather._transport import Transport, choose_transport


def layout_of(
    x: torch.Tensor, dim: int, *, sizes: Any, group: Any, grad: str, transport: str
) -> Layout:
    """vargather's own validated layout: the mutants break what comes after it."""
    return vargather.gather_layout(
        x,
        dim,
        sizes=sizes,
        group=group,
        grad=grad,  # type: ignore[arg-type]  # passed through unchecked: validation is vargather's
        transport=transport,  # type: ignore[arg-type]  # as above
    )


def gather(
    x: torch.Tensor,
    dim: int = 0,
    *,
    sizes: Any = None,
    group: Any = None,
    grad: str = "sum",
    transport: str = "auto",
    function: type[GatherVFunction] = GatherVFunction,
    wrap_transport: Callable[[Transport], Transport] | None = None,
    one_rank: Callable[[torch.Tensor], torch.Tensor] | None = None,
    plan: Callable[..., Layout] = layout_of,
) -> torch.Tensor:
    layout = plan(x, dim, sizes=sizes, group=group, grad=grad, transport=transport)
    info = resolve_group(group)
    if not info.communicates:
        return x if one_rank is None else one_rank(x)
    chosen = choose_transport(transport, layout, info)
    if wrap_transport is not None:
        chosen = wrap_transport(chosen)
    out = function.apply(x, GatherPlan(layout, info, chosen, grad))  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return out


class TransportWrapper:
    """A transport that delegates to ``inner``; mutants override one method."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.name = inner.name

    def gather(self, x: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        return self.inner.gather(x, layout, info)

    def reduce_scatter_sum(self, grad_output: torch.Tensor, layout: Any, info: Any) -> torch.Tensor:
        return self.inner.reduce_scatter_sum(grad_output, layout, info)

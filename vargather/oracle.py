"""The single-process oracle: what a ragged all_gather and its gradients must give.

It sits outside the pipeline on purpose: it never communicates, it sees every rank's
shard and every rank's upstream gradient at once, and it computes with ``torch.cat``
and autograd only, no hand-written slicing. Tests run the real gather on a
multi-process world and compare against it.

Each function's docstring states its definition; gradients are vector-Jacobian
products (``grad_outputs=g``), so complex dtypes follow torch's convention without a
hand-made real loss.

NaNs: what a reduction gives (the ``sum`` and ``mean`` gradients and
``reduce_scatter_v``, in a group of two ranks or more) has every NaN set to its dtype's
canonical quiet NaN by the helpers the collectives use (``vargather._reduced``), so the
oracle's bits are those semantics' and not torch's kernel path's. What only moves
data (the outputs, ``local``, the backwards of ``reduce_scatter_v`` and
``all_to_all_v``) keeps every bit, NaN payloads and ``-0.0`` included.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from ._choices import CONTRACTS
from ._reduced import add_, canonical_nans_, mean_

__all__ = [
    "OracleResult",
    "expected",
    "expected_all_to_all",
    "expected_all_to_all_grads",
    "expected_gather_list",
    "expected_gather_list_grads",
    "expected_gather_v",
    "expected_gather_v_grads",
    "expected_input_grads",
    "expected_output",
    "expected_reduce_scatter",
    "expected_reduce_scatter_grads",
    "expected_scatter_v",
    "expected_scatter_v_grads",
]


class OracleResult(NamedTuple):
    """The gathered tensor and, per rank, the gradient of its shard (if asked)."""

    output: torch.Tensor
    input_grads: list[torch.Tensor] | None


def expected_output(shards: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """What every rank must receive: ``torch.cat(shards, dim)``.

    Shapes:
        ``shards[r]`` is rank ``r``'s ``lead + (n_r,) + trail``; returns
        ``lead + (Σ_r n_r,) + trail``.

    Gradient:
        None: the shards are detached (``expected_input_grads`` has the gradients).

    Raises:
        RuntimeError: ``torch.cat``'s, for shards that do not concatenate.
    """
    return torch.cat([s.detach() for s in shards], dim=dim)


def _unknown(contract: str) -> ValueError:
    return ValueError(
        f"oracle: contract must be one of {', '.join(map(repr, CONTRACTS))}, got {contract!r}"
    )


def _leaves(shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    for r, s in enumerate(shards):
        if not (s.is_floating_point() or s.is_complex()):
            raise TypeError(
                f"oracle: gradients need floating or complex shards, rank {r} has {s.dtype}"
            )
    return [s.detach().clone().requires_grad_(True) for s in shards]


def expected_input_grads(
    shards: Sequence[torch.Tensor],
    upstream: Sequence[torch.Tensor],
    dim: int = 0,
    contract: str = "sum",
) -> list[torch.Tensor]:
    """Each rank's expected ``dx_r`` under ``contract`` for upstream gradients ``upstream``.

    Rank ``j`` computes its own ``out_j = cat(shards)`` and receives ``upstream[j] =
    dL_j / d out_j``. ``"sum"``: ``dx_r = Σ_j upstream[j][o_r : o_r + n_r]`` (the
    gradient of ``Σ_j L_j``); ``"mean"``: that sum over ``W``; ``"local"``:
    ``upstream[r][o_r : o_r + n_r]``. Computed by autograd through ``torch.cat``.

    Shapes:
        ``shards[r]``: ``lead + (n_r,) + trail``; every ``upstream[j]``: the gathered
        shape ``lead + (Σ_r n_r,) + trail``; returns one tensor per rank, shaped as
        its shard.

    Raises:
        ValueError: ``len(upstream) != len(shards)``, or an unknown ``contract``.
        TypeError: a shard that is neither floating nor complex (no gradient).
    """
    world = len(shards)
    if len(upstream) != world:
        raise ValueError(f"oracle: {world} shards but {len(upstream)} upstream gradients")
    xs = _leaves(shards)
    if contract in ("sum", "mean"):
        if world == 1:  # nothing is summed: the gather of one rank is the identity
            return [upstream[0].detach().clone()]
        # Every rank j computes its own out_j = cat(x) and its own loss L_j: autograd
        # gives each L_j's gradient (cat's backward moves data), summed in rank order
        # (autograd's own accumulation would add in its order with torch's complex add,
        # ``_reduced.add_``); mean's 1/W divides that sum component by component.
        per_loss = [
            torch.autograd.grad(torch.cat(xs, dim=dim), xs, grad_outputs=g.detach())
            for g in upstream
        ]
        return _summed(per_loss, contract)
    if contract == "local":
        result: list[torch.Tensor] = []
        for r in range(world):
            out_r = torch.cat(xs, dim=dim)
            (g,) = torch.autograd.grad(out_r, xs[r], grad_outputs=upstream[r].detach())
            result.append(g)
        return result
    raise _unknown(contract)


def expected(
    shards: Sequence[torch.Tensor],
    dim: int = 0,
    *,
    upstream: Sequence[torch.Tensor] | None = None,
    contract: str = "sum",
) -> OracleResult:
    """Output and (when ``upstream`` is given) input gradients, in one call.

    Shapes:
        As ``expected_output`` and ``expected_input_grads``: ``output`` is the
        gathered ``lead + (Σ_r n_r,) + trail``, ``input_grads[r]`` shaped as
        ``shards[r]`` (``None`` without ``upstream``).

    Gradient:
        ``input_grads`` under ``contract``, as ``expected_input_grads`` computes them.

    Raises:
        ValueError: see ``expected_input_grads``.
        TypeError: see ``expected_input_grads``.
    """
    grads = None if upstream is None else expected_input_grads(shards, upstream, dim, contract)
    return OracleResult(expected_output(shards, dim), grads)


# --- the ragged collective family ------------------------------------------------------
#
# reduce_scatter_v's order of addition (rank order, left to right, in the input dtype) is
# part of its definition, so the oracle and the collective agree bit for bit on every
# float and wrap alike on integers. Its backward moves data only: split's backward is a
# cat, with no zero-filled slice added to the gradient (which would turn -0.0 into +0.0).


def _fold(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``blocks[0] + blocks[1] + ...`` left to right (complex per component), NaNs
    canonical when there was a sum (two blocks or more; one block is returned as it
    is)."""
    out = blocks[0].detach().clone()
    for b in blocks[1:]:
        add_(out, b.detach())
    return canonical_nans_(out) if len(blocks) > 1 else out


def _summed(grads: Sequence[Sequence[torch.Tensor]], contract: str) -> list[torch.Tensor]:
    """Per rank ``r``, ``grads[0][r] + ... + grads[W-1][r]`` (``_fold``), divided by ``W``
    under ``mean`` when ``W > 1``."""
    w = len(grads)
    sums = [_fold([grads[j][r] for j in range(w)]) for r in range(w)]
    return [mean_(s, w) for s in sums] if contract == "mean" and w > 1 else sums


def expected_reduce_scatter(
    inputs: Sequence[torch.Tensor], sizes: Sequence[int], dim: int = 0
) -> list[torch.Tensor]:
    """Each rank's ``reduce_scatter_v`` result for every rank's input ``inputs[j]``.

    Rank ``r`` gets ``inputs[0][o_r : o_r + n_r] + ... + inputs[W-1][o_r : o_r + n_r]``
    along ``dim``, added left to right in rank order in the inputs' dtype (every NaN
    the canonical one), as the collective adds them.

    Shapes:
        every ``inputs[j]``: ``lead + (sum(sizes),) + trail``; returns ``W`` tensors,
        rank ``r``'s ``lead + (sizes[r],) + trail``.

    Gradient:
        None (``expected_reduce_scatter_grads`` has it).

    Raises:
        RuntimeError: torch's, for inputs whose shapes or dtypes do not add up.
    """
    offsets = list(itertools.accumulate(sizes, initial=0))
    return [_fold([x.narrow(dim, offsets[r], n) for x in inputs]) for r, n in enumerate(sizes)]


def expected_reduce_scatter_grads(
    inputs: Sequence[torch.Tensor],
    sizes: Sequence[int],
    upstream: Sequence[torch.Tensor],
    dim: int = 0,
) -> list[torch.Tensor]:
    """``dx_j`` of ``L = Σ_r <g_r, y_r>`` for every rank ``j`` (all equal: ``cat_r g_r``).

    Shapes:
        ``inputs`` and ``sizes`` as for ``expected_reduce_scatter``; ``upstream[r]``
        shaped as rank ``r``'s result; returns one tensor per rank, shaped as its input.

    Gradient:
        This is the gradient: the gather of the upstream gradients, by autograd.

    Raises:
        TypeError: an input that is neither floating nor complex.
    """
    xs = _leaves(inputs)
    blocks = [torch.split(x, list(sizes), dim=dim) for x in xs]
    outs = [functools.reduce(torch.add, [b[r] for b in blocks]) for r in range(len(sizes))]
    return list(torch.autograd.grad(outs, xs, grad_outputs=[g.detach() for g in upstream]))


def _blocks(x: torch.Tensor, sizes: Sequence[int], dim: int) -> list[torch.Tensor]:
    return list(torch.split(x, list(sizes), dim=dim))


def _exchanged(
    xs: Sequence[torch.Tensor], send_sizes: Sequence[Sequence[int]], dim: int, cat_dim: int | None
) -> list[torch.Tensor]:
    """Rank ``r``'s block of every ``xs[j]``, joined in rank order along ``cat_dim``."""
    split = [_blocks(x, s, dim) for x, s in zip(xs, send_sizes, strict=True)]
    along = dim if cat_dim is None else cat_dim
    return [torch.cat([split[j][r] for j in range(len(xs))], dim=along) for r in range(len(xs))]


def expected_all_to_all(
    inputs: Sequence[torch.Tensor],
    send_sizes: Sequence[Sequence[int]],
    dim: int = 0,
    cat_dim: int | None = None,
) -> list[torch.Tensor]:
    """Each rank's ``all_to_all_v`` result; ``send_sizes[j]`` is rank ``j``'s vector.

    Rank ``r`` receives block ``r`` of every rank's input (``send_sizes[j][r]`` rows
    of ``inputs[j]`` along ``dim``), concatenated in rank order along ``cat_dim``
    (``dim`` when ``None``).

    Shapes:
        ``inputs[j]``: ``lead + (sum(send_sizes[j]),) + trail``; returns rank ``r``'s
        ``lead + (Σ_j send_sizes[j][r],) + trail``. With ``cat_dim`` another dim:
        rank ``r``'s ``inputs[0]``'s shape with ``send_sizes[0][r]`` along ``dim`` and
        ``Σ_j inputs[j].shape[cat_dim]`` along ``cat_dim``.

    Gradient:
        None (``expected_all_to_all_grads`` has it).

    Raises:
        ValueError: ``len(send_sizes) != len(inputs)``.
        RuntimeError: torch's, for sizes that do not split an input.
    """
    return _exchanged([x.detach() for x in inputs], send_sizes, dim, cat_dim)


def expected_all_to_all_grads(
    inputs: Sequence[torch.Tensor],
    send_sizes: Sequence[Sequence[int]],
    upstream: Sequence[torch.Tensor],
    dim: int = 0,
    cat_dim: int | None = None,
) -> list[torch.Tensor]:
    """``dx_j`` of ``L = Σ_r <g_r, y_r>``: the reverse exchange of the ``g_r``.

    Shapes:
        ``inputs`` and ``send_sizes`` as for ``expected_all_to_all``; ``upstream[r]``
        shaped as rank ``r``'s result; returns one tensor per rank, shaped as its input.

    Gradient:
        This is the gradient, by autograd over the exchange.

    Raises:
        TypeError: an input that is neither floating nor complex.
        ValueError: ``len(send_sizes) != len(inputs)``.
    """
    xs = _leaves(inputs)
    outs = _exchanged(xs, send_sizes, dim, cat_dim)
    return list(torch.autograd.grad(outs, xs, grad_outputs=[g.detach() for g in upstream]))


def expected_gather_list(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """What every rank's ``all_gather_list`` returns: every rank's tensor, in order.

    It raises nothing of its own.

    Shapes:
        any shape per rank (the same ndim and dtype); returns copies of the inputs.

    Gradient:
        None (``expected_gather_list_grads`` has it).
    """
    return [x.detach().clone() for x in inputs]


def expected_gather_list_grads(
    inputs: Sequence[torch.Tensor],
    upstream: Sequence[Sequence[torch.Tensor]],
    contract: str = "sum",
) -> list[torch.Tensor]:
    """``dx_r`` per rank; ``upstream[j][r]`` is rank ``j``'s gradient for output ``r``.

    Shapes:
        ``upstream[j][r]`` shaped as ``inputs[r]``; returns one tensor per rank,
        shaped as its input.

    Gradient:
        ``sum``: ``g_{0,r} + ... + g_{W-1,r}`` in rank order; ``local``: ``g_{r,r}``;
        ``mean``: the sum divided by ``W``.

    Raises:
        ValueError: an unknown ``contract``.
        TypeError: an input that is neither floating nor complex.
    """
    _leaves(inputs)  # the same dtype check as every gradient oracle
    w = len(inputs)
    if contract == "local":
        return [upstream[r][r].detach().clone() for r in range(w)]
    if contract in ("sum", "mean"):
        return _summed(upstream, contract)
    raise _unknown(contract)


def expected_gather_v(inputs: Sequence[torch.Tensor], dst: int, dim: int = 0) -> list[torch.Tensor]:
    """Each rank's ``gather_v`` result: ``torch.cat(inputs, dim)`` on rank ``dst``,
    elsewhere an empty tensor (rank ``r``'s input's shape with 0 along ``dim``).

    Raises:
        RuntimeError: torch's, for inputs that do not concatenate.
    """
    full = torch.cat([x.detach() for x in inputs], dim=dim)
    return [full if r == dst else x.detach().narrow(dim, 0, 0) for r, x in enumerate(inputs)]


def expected_gather_v_grads(
    inputs: Sequence[torch.Tensor], dst: int, upstream: Sequence[torch.Tensor], dim: int = 0
) -> list[torch.Tensor]:
    """``dx_r`` of ``L = <g_dst, cat_j x_j>`` (the other ranks' results are empty): block
    ``r`` of ``upstream[dst]``, by autograd.

    Raises:
        TypeError: an input that is neither floating nor complex.
    """
    xs = _leaves(inputs)
    out = torch.cat(xs, dim=dim)
    return list(torch.autograd.grad([out], xs, grad_outputs=[upstream[dst].detach()]))


def expected_scatter_v(
    inputs: Sequence[torch.Tensor], sizes: Sequence[int], src: int, dim: int = 0
) -> list[torch.Tensor]:
    """Each rank's ``scatter_v`` result: block ``r`` (``sizes[r]`` long along ``dim``)
    of ``inputs[src]`` for every rank ``r`` (the other inputs are not read).

    Raises:
        RuntimeError: torch's, for sizes that do not split ``inputs[src]``.
    """
    return [b.clone() for b in _blocks(inputs[src].detach(), sizes, dim)]


def expected_scatter_v_grads(
    inputs: Sequence[torch.Tensor],
    sizes: Sequence[int],
    src: int,
    upstream: Sequence[torch.Tensor],
    dim: int = 0,
) -> list[torch.Tensor]:
    """``dx_j`` of ``L = Σ_r <g_r, y_r>``: ``cat_r g_r`` on rank ``src`` (by autograd
    over the split), zeros shaped as ``inputs[j]`` on every other rank.

    Raises:
        TypeError: an input that is neither floating nor complex.
    """
    xs = _leaves(inputs)
    outs = _blocks(xs[src], sizes, dim)
    (grad,) = torch.autograd.grad(outs, [xs[src]], grad_outputs=[g.detach() for g in upstream])
    return [grad if j == src else torch.zeros_like(x) for j, x in enumerate(xs)]

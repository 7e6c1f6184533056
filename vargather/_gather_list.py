"""``all_gather_list``: plan (checks, exchange, validation), payload, autograd.

Where it sits: a family collective built on ``_family`` (stages 1-3), ``_transport``
and ``_fused`` (the
validated call: every rank's flat run of elements and its shape ride in ``_fused``'s
round of kind ``coalesced``, the payload in the same collective when it is small) and
``_reduce_scatter`` (the ``sum``/``mean`` backward). ``_family_api`` calls it eagerly;
``_compiled_family`` wraps it in custom operators.

The math, once. Rank ``r`` holds ``x_r`` of shape ``shape_r`` (the same ndim, dtype
and device type everywhere; every dimension may differ, empties too) with
``m_r = numel(x_r)`` elements. Every rank returns ``[x_0, ..., x_{W-1}]``: the flat
run ``cat_r x_r.reshape(-1)`` is one ragged gather along dim 0 with sizes
``(m_0, ..., m_{W-1})`` (offset ``q_r = Σ_{t<r} m_t``), cut at ``q_r`` and reshaped to
``shape_r``. Rank ``j`` then holds upstream gradients ``g_{j,r}`` for output ``r``:

* ``sum``: ``dx_r = g_{0,r} + g_{1,r} + ... + g_{W-1,r}`` (rank order), the gradient
  of ``Σ_j L_j``: the ``reduce_scatter_v`` of the flat runs ``cat_r g_{j,r}``;
* ``local``: ``dx_r = g_{r,r}``, no communication (right only under identical losses);
* ``mean``: the ``sum`` gradient divided by ``W``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import _fused
from ._args import CheckedCall, Problem, check_call, saturate, sizes_hash
from ._comm import GroupInfo, all_gather_equal
from ._errors import (
    ShapeMismatchError,
    SizesError,
    SizesMismatchError,
    SizesTypeError,
    VarGatherError,
)
from ._family import FamilyCall, agree, check_tensor, raise_own_problem, with_problem
from ._layout import Layout
from ._reduce_scatter import reduce_scatter_blocks
from ._transport import choose_transport

__all__ = [
    "GatherListFunction",
    "GatherListPlan",
    "flat_layout",
    "parse_shapes",
    "plan_gather_list",
]

NAME = "all_gather_list"

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class GatherListPlan:
    """A validated ``all_gather_list``: every rank's shape, the group, the contract."""

    shapes: Shapes
    info: GroupInfo
    contract: str
    dtype: torch.dtype
    box: list[list[torch.Tensor]] = field(default_factory=list, compare=False)
    """The gathered tensors when the payload already moved (the fused round): handed
    to the forward once, then dropped."""


def flat_layout(shapes: Shapes, dtype: torch.dtype, info: GroupInfo) -> Layout:
    """The flat ragged run of the ranks' elements (module doc) as a ``Layout``."""
    return Layout(
        sizes=tuple(math.prod(s) for s in shapes),
        dim=0,
        leading_shape=(),
        trailing_shape=(),
        dtype=dtype,
        rank=info.rank,
        world_size=info.world_size,
    )


def parse_shapes(shapes: object, world_size: int) -> Shapes | Problem:
    """Caller ``shapes``: one sequence of non-negative ints per rank. Never raises."""
    if isinstance(shapes, (str, bytes, torch.Tensor)) or not isinstance(shapes, Sequence):
        return Problem(
            SizesTypeError, f"shapes must be a sequence of shapes, got {type(shapes).__name__}"
        )
    out: list[tuple[int, ...]] = []
    try:
        for r, shape in enumerate(shapes):
            if isinstance(shape, torch.Size):
                shape = tuple(shape)
            if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
                return Problem(
                    SizesTypeError,
                    f"shapes[{r}] must be a sequence of ints, got {type(shape).__name__}",
                )
            dims: list[int] = []
            for n in shape:
                if isinstance(n, bool):
                    return Problem(SizesTypeError, f"shapes[{r}] must hold ints, got bool")
                dims.append(operator.index(n))
            if any(n < 0 for n in dims):
                return Problem(SizesError, f"shapes[{r}] must be >= 0, got {dims}")
            out.append(tuple(dims))
    except Exception as err:  # a non-int entry, an iterator that raises
        return Problem(SizesTypeError, f"shapes must hold sequences of ints ({type(err).__name__})")
    if len(out) != world_size:
        return Problem(
            SizesError, f"expected len(shapes) == world size {world_size}, got {len(out)}"
        )
    return tuple(out)


def _local_call(
    x: object,
    shapes: object,
    grad: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
) -> FamilyCall:
    record, call_timeout = check_tensor(
        x, 0, info=info, grad=grad, validate=validate, timeout=timeout, requires_grad=requires_grad
    )
    words = [-1, 0]
    own: Shapes | None = None
    if shapes is not None:
        parsed = parse_shapes(shapes, info.world_size)
        if isinstance(parsed, Problem):
            record = with_problem(record, parsed)
        else:
            own = parsed
            words = [1, sizes_hash([v for s in parsed for v in (len(s), *s)])]
            if (
                isinstance(x, torch.Tensor)
                and record.problem is None
                and parsed[info.rank] != record.shape
            ):
                record = with_problem(
                    record,
                    Problem(
                        SizesError,
                        f"expected shapes[{info.rank}] == {record.shape} (its tensor's "
                        f"shape), got {parsed[info.rank]}",
                    ),
                )
    return FamilyCall(NAME, record, tuple(words), own or (), call_timeout)


def plan_gather_list(
    x: object,
    shapes: object,
    grad: object,
    info: GroupInfo,
    *,
    validate: object,
    timeout: object,
    requires_grad: bool | None = None,
) -> GatherListPlan:
    """Stages 1-3: the same error on every rank, or the same plan. With ``shapes``
    and ``validate=False`` the exchange is skipped (local problems raised here only)."""
    call = _local_call(x, shapes, grad, info, validate, timeout, requires_grad)
    if call.timeout is not None:
        info = info.with_timeout(call.timeout)
    trusted = validate is False and shapes is not None
    if trusted or not info.communicates:
        problem = call.record.problem
        raise_own_problem(NAME, problem, info, trusted=trusted)
        found = tuple(s or () for s in call.sizes) if shapes is not None else (call.record.shape,)
        assert isinstance(x, torch.Tensor)  # validated
        assert isinstance(grad, str)
        return GatherListPlan(found, info, grad, x.dtype)
    return _fused_plan(x, call, grad, info, validate, timeout, requires_grad)


def _renamed(err: VarGatherError) -> VarGatherError:
    """An error of the fused round, told as ``all_gather_list``'s (same class, ranks)."""
    text = str(err)
    for prefix in ("all_gather_v_coalesced: tensor #0: ", "all_gather_v_coalesced: "):
        text = text.removeprefix(prefix)
    return type(err)(f"{NAME}: {text.removeprefix('all_gather_v: ')}", ranks=err.ranks)


def _meta_words(record_shape: tuple[int, ...], words: Sequence[int]) -> list[int]:
    """This rank's shape and passed-shapes words: ``[ndim, *shape, passed, hash]``."""
    return [len(record_shape), *record_shape, *words]


def _exchange_passed_shapes(
    own: Sequence[tuple[int, ...] | None], ndim: int, info: GroupInfo
) -> list[str]:
    """Every rank's passed shapes, shown (``ndim`` entries of each, then how many
    more): one equal-size all_gather, only on the error path, after every rank found
    the same lie. ``own`` is this rank's parsed shapes (empty: none passed)."""
    w, width = info.world_size, 1 + ndim
    row = [-1] * (w * width)
    for r, shape in enumerate(own[:w]):
        if shape is None:
            continue
        row[r * width] = len(shape)
        for i, n in enumerate(shape[:ndim]):
            row[r * width + 1 + i] = saturate(n)
    device = info.default_device()
    local = torch.tensor(row, dtype=torch.int64, device=device)
    gathered = torch.empty(w * len(row), dtype=torch.int64, device=device)
    all_gather_equal(
        gathered, local, info, what=f"all_gather (shapes of a {NAME} mismatch message)"
    )
    shown = []
    for words in gathered.view(w, w, width).tolist():
        entries = []
        for n, *dims in words:
            kept = [int(v) for v in dims[: max(0, min(n, ndim))]]
            entries.append(str(kept) if n <= ndim else f"{kept} + {n - ndim} more dims")
        shown.append("[" + ", ".join(entries) + "]")
    return shown


def _fused_plan(
    x: object,
    call: FamilyCall,
    grad: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
) -> GatherListPlan:
    """The validated call through ``_fused`` (kind ``coalesced``): two 1-d tensors per
    rank, the flat run of ``x`` and its metadata ``[ndim, *shape, passed, hash]``, in one
    fused round when small (the payload rides along) or a round and one payload
    collective. The headers validate the flat run (dtype, device type, ``grad``,
    ``requires_grad``, every local problem) before any payload moves; the ndim and the
    passed shapes are checked from the gathered metadata, the same on every rank."""
    flat: object = x
    if isinstance(x, torch.Tensor) and call.record.problem is None:
        flat = x.reshape(-1)
    checked = check_call(
        flat,
        0,
        sizes=None,
        grad=grad,
        transport="auto",
        info=info,
        validate=validate,
        timeout=timeout,
    )
    record = checked.record
    if requires_grad is not None:
        record = replace(record, requires_grad=requires_grad)
    if call.record.problem is not None:  # this family's own checks (the shapes), first
        record = replace(record, problem=call.record.problem)
    # On x's device: the fused round packs both tensors' bytes together.
    device = x.device if isinstance(x, torch.Tensor) else info.default_device()
    meta = torch.tensor(
        _meta_words(call.record.shape, call.extras), dtype=torch.int64, device=device
    )
    meta_call = check_call(
        meta, 0, sizes=None, grad=grad, transport="auto", info=info, validate=validate
    )
    calls = [CheckedCall(record, None, checked.timeout), meta_call]
    try:
        found = _fused.exchange("coalesced", calls, [flat, meta], info, eligible=True)
        outputs = found.outputs
        if outputs is None:
            assert isinstance(flat, torch.Tensor)  # the headers validated
            outputs = _fused.gather_bytes([flat, meta], found.layouts, info, "auto")
    except VarGatherError as err:
        raise _renamed(err) from None
    rows = [m.tolist() for m in torch.split(outputs[1], list(found.layouts[1].sizes))]
    ndims = [int(row[0]) for row in rows]
    agree(NAME, [(ShapeMismatchError, "ndim", list(ndims), repr)])
    shapes = tuple(
        tuple(int(v) for v in row[1 : 1 + n]) for row, n in zip(rows, ndims, strict=True)
    )
    truth = sizes_hash([v for s in shapes for v in (len(s), *s)])
    liars = [r for r, row in enumerate(rows) if row[-2] == 1 and row[-1] != truth]
    if liars:  # every rank knows: all take one more small gather, to show the lies
        passed = _exchange_passed_shapes(call.sizes, ndims[0], info)
        got = "; ".join(f"rank {r} passed shapes={passed[r]}" for r in liars)
        raise SizesMismatchError(
            f"{NAME}: shapes passed on rank(s) {liars} contradict the tensors: expected "
            f"shapes={[list(s) for s in shapes]} (every rank's tensor's shape), got {got}",
            ranks=liars,
        )
    pieces = torch.split(outputs[0], list(found.layouts[0].sizes))
    assert isinstance(x, torch.Tensor)  # validated
    assert isinstance(grad, str)
    gathered = [p.view(s) for p, s in zip(pieces, shapes, strict=True)]
    return GatherListPlan(shapes, info, grad, x.dtype, [gathered])


def gather_flat(x: torch.Tensor, plan: GatherListPlan) -> list[torch.Tensor]:
    """The payload: every rank's tensor, through one gather of the flat run (or what
    the fused round already gathered)."""
    if plan.box:
        return plan.box.pop()
    layout = flat_layout(plan.shapes, plan.dtype, plan.info)
    if layout.total == 0:
        flat = x.new_empty(0)
    else:
        flat = choose_transport("auto", layout, plan.info).gather(x.reshape(-1), layout, plan.info)
    return [flat[layout.block(r)].view(s) for r, s in enumerate(plan.shapes)]


def list_gradient(grads: Sequence[torch.Tensor], plan: GatherListPlan) -> torch.Tensor:
    """This rank's ``dx_r`` under ``plan.contract`` (module doc)."""
    info, r = plan.info, plan.info.rank
    if plan.contract == "local":
        return grads[r].clone(memory_format=torch.contiguous_format)
    layout = flat_layout(plan.shapes, grads[r].dtype, info)
    flat = torch.cat([g.reshape(-1) for g in grads])
    out = reduce_scatter_blocks(flat, layout, info).view(plan.shapes[r])
    if plan.contract == "mean":
        out.div_(info.world_size)
    return out


class GatherListFunction(torch.autograd.Function):
    """``[x_0, ..., x_{W-1}]`` on every rank, with the backward of ``plan.contract``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, plan: GatherListPlan) -> tuple[torch.Tensor, ...]:
        ctx.plan = plan
        outputs = gather_flat(x, plan)
        if not (x.is_floating_point() or x.is_complex()):
            ctx.mark_non_differentiable(*outputs)
        return tuple(outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        return list_gradient(grads, ctx.plan), None

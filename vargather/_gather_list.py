"""``all_gather_list``: plan (checks, exchange, validation), payload, autograd.

Where it sits: a family collective on ``_rows`` (stages 1-3), ``_transport``,
``_fused`` (the validated call rides its round as one *carrier* per rank: ``_carrier``)
and ``_reduce_scatter`` (the ``sum``/``mean`` backward); ``_api`` calls its ``Route``.

The math is ``all_gather_list``'s docstring (``_api``). Rank ``r``'s ``x_r`` (shape
``shape_r``) has ``m_r = numel(x_r)`` elements: the flat run ``cat_r x_r.reshape(-1)`` is
one ragged gather along dim 0 with sizes ``(m_0, ..., m_{W-1})``, cut at
``q_r = Σ_{t<r} m_t`` and reshaped to ``shape_r``. The ``sum`` gradient
``dx_r = g_{0,r} + ... + g_{W-1,r}`` is the ``reduce_scatter_v`` of the flat runs
``cat_r g_{j,r}`` (``mean`` divides it by ``W``; ``local``, ``g_{r,r}``, moves nothing).
"""

from __future__ import annotations

import ctypes
import functools
import math
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import torch
from torch.autograd.function import once_differentiable

from . import _fused
from ._args import CallRecord, CheckedCall, Problem, check_call, saturate, sizes_hash
from ._collectives import CollectiveName
from ._comm import all_gather_equal
from ._errors import (
    ProtocolMismatchError,
    ShapeMismatchError,
    SizesError,
    SizesMismatchError,
    SizesTypeError,
    VarGatherError,
)
from ._exchange import agree
from ._gather import _autograd_needed
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._mesh import call_group
from ._reduce_scatter import reduce_scatter_blocks
from ._reduced import mean_
from ._round_buffers import plain, row_major_strides
from ._rows import FamilyCall, check_tensor, raise_own_problem, with_problem
from ._transport import choose_transport
from ._wire import carrier_ndim, carrier_words

NAME: Final[CollectiveName] = "all_gather_list"

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
    sizes = tuple(math.prod(s) for s in shapes)
    return blocks_layout((sum(sizes),), 0, sizes, dtype, info.rank, info.world_size)


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
        raise_own_problem(NAME, call.record.problem, info, trusted=trusted)
        found = tuple(s or () for s in call.sizes) if shapes is not None else (call.record.shape,)
        assert isinstance(x, torch.Tensor)  # validated
        assert isinstance(grad, str)
        return GatherListPlan(found, info, grad, x.dtype)
    return _fused_plan(x, call, grad, info, validate, timeout, requires_grad)


def _renamed(err: VarGatherError) -> VarGatherError:
    """An error of the fused round, told as ``all_gather_list``'s (same class, ranks)."""
    text = str(err)
    if " / " in text.partition(": ")[0]:  # ranks called different collectives: told alike
        return err
    for prefix in ("all_gather_v_coalesced: tensor #0: ", "all_gather_v_coalesced: "):
        text = text.removeprefix(prefix)
    return type(err)(f"{NAME}: {text.removeprefix('all_gather_v: ')}", ranks=err.ranks)


CARRIER_SHAPE: Final = (-1, 1, 1)
"""The carrier's shape: ``(n, 1, 1)``, a shape no other caller of the round is likely to
send, so a peer calling ``all_gather_v_coalesced`` of one tensor beside this call
disagrees on the ndim in the headers and every rank, that one included, raises
``ShapeMismatchError`` before any payload is used."""


def _head_elements(words: int, dtype: torch.dtype, element_size: int) -> int:
    """Elements of the carrier's dtype that hold ``words`` int64 words: their bytes,
    zero-padded to whole elements; for ``bool`` (whose elements hold 0 or 1, no other
    byte survives a copy) one element per bit."""
    if dtype == torch.bool:
        return 64 * words
    return -(-8 * words // element_size)


_BITS: Final = torch.arange(64, dtype=torch.int64)


@functools.lru_cache(maxsize=64)
def _head(words: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A carrier's first ``_head_elements`` elements (``_carrier``): the metadata
    ``words`` as elements of ``dtype`` on ``device``. Made once per words, dtype and device
    (a steady caller sends the same words every call) and only ever read: sent as
    they are, or copied into a carrier."""
    if dtype == torch.bool:
        raw = bytes((w >> i) & 1 for w in words for i in range(64))  # two's complement bits
    else:
        pad = _head_elements(len(words), dtype, dtype.itemsize) * dtype.itemsize
        raw = struct.pack(f"={len(words)}q", *words).ljust(pad, b"\0")
    # A copy out of the bytearray into the allocator's (aligned) memory, then typed.
    head = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone().view(dtype)
    return head.to(device)


def _carrier(x: torch.Tensor, words: Sequence[int]) -> torch.Tensor:
    """One ``(n, 1, 1)`` tensor of ``x``'s dtype (``CARRIER_SHAPE``): the metadata
    ``words`` (``_head``), then ``x``'s elements in row-major order. Nothing is
    computed on ``x``: exact for every dtype (a lazily conjugated or negated ``x`` gives
    its values, as a gather of ``x`` does). The fused round never makes it: it copies
    ``_head`` and ``x`` into its payload slot one after the other (``_fused_plan``); a
    call whose payload does not ride gathers it by a transport."""
    head = _head(tuple(words), x.dtype, x.device)
    n = head.numel()
    out = torch.empty(n + x.numel(), dtype=x.dtype, device=x.device)
    out[:n].copy_(head)
    if x.numel():
        out[n:].view(x.shape).copy_(x.detach())
    return out.view(CARRIER_SHAPE)


@functools.lru_cache(maxsize=64)
def _carrier_record(record: CallRecord, n: int) -> CallRecord:
    """The record ``check_call`` makes of a carrier of ``n`` elements, from the
    problem-free ``record`` of ``x.reshape(-1)`` (the same dtype, device, arguments and
    ``requires_grad``; gathered along dim 0 of either): only the shape differs."""
    return replace(record, ndim=len(CARRIER_SHAPE), shape=(n, 1, 1))


_MAX_CARRIER_NDIM: Final = 64
"""The most dimensions a carrier's second word may announce before it is read on."""


def _words(region: torch.Tensor, count: int) -> list[int] | None:
    """The first ``count`` int64 words of a carrier region, or ``None`` if it is
    shorter."""
    head = _head_elements(count, region.dtype, region.element_size())
    if region.numel() < head:
        return None
    part = region[:head].detach().cpu()
    if region.dtype == torch.bool:
        values = (part.to(torch.int64).view(count, 64) << _BITS).sum(dim=1)
    else:
        values = part.view(torch.uint8)[: 8 * count].clone().view(torch.int64)
    return [int(v) for v in values.tolist()]


def _carrier_head(run: torch.Tensor, at: int, n: int, direct: bool) -> tuple[list[int], int] | None:
    """The metadata words of the carrier in elements ``[at, at + n)`` of ``run`` and
    the elements they take (``_head_elements``), or ``None`` when that region is not
    an ``all_gather_list`` carrier. ``direct``: ``run`` is a contiguous CPU tensor of
    a dtype other than ``bool``, whose words are read with ``struct`` where they lie
    (no tensor made per rank); else through tensors (``_words``)."""
    dtype, e = run.dtype, run.element_size()
    if not direct:
        region = run[at : at + n]
        ndim = carrier_ndim(_words(region, 2))
        words = _words(region, ndim + 4) if 0 <= ndim <= _MAX_CARRIER_NDIM else None
        return None if words is None else (words, _head_elements(ndim + 4, dtype, e))
    if n < _head_elements(2, dtype, e):
        return None
    raw = ctypes.string_at(run.data_ptr() + at * e, min(n * e, 8 * (_MAX_CARRIER_NDIM + 4)))
    ndim = carrier_ndim(struct.unpack_from("=2q", raw))
    if not 0 <= ndim <= _MAX_CARRIER_NDIM:
        return None
    head = _head_elements(ndim + 4, dtype, e)
    if n < head:
        return None
    return list(struct.unpack_from(f"={ndim + 4}q", raw)), head


def _read_carriers(run: torch.Tensor, sizes: Sequence[int]) -> list[tuple[list[int], torch.Tensor]]:
    """Every rank's metadata words and elements (a view of ``run``) from the gathered
    carriers; a region that is not an ``all_gather_list`` carrier raises
    ``ProtocolMismatchError`` (every rank reads the same regions: the same error)."""
    out: list[tuple[list[int], torch.Tensor]] = []
    bad: list[int] = []
    direct = _direct(run)
    at = 0
    for r, n in enumerate(sizes):
        found = _carrier_head(run, at, n, direct)
        if found is None:
            bad.append(r)
        else:
            out.append((found[0], run[at + found[1] : at + n]))
        at += n
    if bad:
        raise ProtocolMismatchError(
            f"{NAME}: rank(s) {bad} sent no all_gather_list metadata: expected an "
            f"{NAME} call on every rank of the group (another call of the same round, "
            "such as all_gather_v_coalesced, or another vargather version)",
            ranks=bad,
        )
    return out


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
    """The validated call through ``_fused`` (as ``all_gather_list``, one tensor): every
    rank's carrier (``_carrier``), in the fused round when it fits (the payload rides
    along), else the round and one gather of the carriers. One tensor, so the wide round
    hands back its received buffer and every rank's tensor is a view of it (two tensors
    would be joined with a copy each). The headers validate the carrier (dtype, device
    type, ``grad``, ``requires_grad``, every local problem) before any payload moves;
    the ndim and the passed shapes are checked from the gathered metadata, the same on
    every rank."""
    key = _steady_key(x, call, grad, validate, timeout, requires_grad)
    if key is not None and info.communicates:
        assert isinstance(x, torch.Tensor)  # a steady key is a tensor's
        head = _head(tuple(carrier_words(call.record.shape, call.extras)), x.dtype, x.device)
        payload = [(t.data_ptr(), t.numel() * t.element_size()) for t in (head, x)]
        try:
            steady = _fused.steady_exchange(NAME, key, payload, info)
            run = None if steady is None else _gathered_run(x, call, info, steady)
        except VarGatherError as err:
            raise _renamed(err) from None
        if steady is not None and run is not None:  # the round ran: its verdict
            return _plan_from(x, call, grad, info, run, steady)
    checked = check_call(
        x.reshape(-1) if isinstance(x, torch.Tensor) and call.record.problem is None else x,
        0,
        sizes=None,
        grad=grad,
        transport="auto",
        info=info,
        validate=validate,
        timeout=timeout,
    )
    record = checked.record
    parts: list[torch.Tensor] | None = None
    words: list[int] = []
    if isinstance(x, torch.Tensor) and call.record.problem is None and record.problem is None:
        # The carrier as its two parts, copied by the round straight into its payload
        # slot one after the other: x is copied once, as all_gather_v copies it.
        words = carrier_words(call.record.shape, call.extras)
        parts = [_head(tuple(words), x.dtype, x.device), x]
        record = _carrier_record(record, parts[0].numel() + x.numel())
    if requires_grad is not None:
        record = replace(record, requires_grad=requires_grad)
    if call.record.problem is not None:  # this family's own checks (the shapes), first
        record = replace(record, problem=call.record.problem)
    calls = [CheckedCall(record, None, checked.timeout)]
    try:
        found = _fused.exchange(
            "all_gather_list", calls, [x], info, eligible=True, parts=parts, steady_key=key
        )
        assert isinstance(x, torch.Tensor)  # the headers validated
        assert parts is not None
        run = _gathered_run(x, call, info, found)
    except VarGatherError as err:
        raise _renamed(err) from None
    return _plan_from(x, call, grad, info, run, found)


def _gathered_run(
    x: torch.Tensor, call: FamilyCall, info: GroupInfo, found: _fused.Exchanged
) -> torch.Tensor:
    """Every rank's carrier, one after the other (flat): as they rode in the round, or
    (the payload did not ride) this rank's carrier made and gathered by a transport."""
    if found.outputs is not None:
        return found.outputs[0].reshape(-1)
    lay = found.layouts[0]
    carrier = _carrier(x, carrier_words(call.record.shape, call.extras))
    return choose_transport("auto", lay, info).gather(carrier, lay, info).reshape(-1)


def _plan_from(
    x: torch.Tensor,
    call: FamilyCall,
    grad: object,
    info: GroupInfo,
    run: torch.Tensor,
    found: _fused.Exchanged,
) -> GatherListPlan:
    """The plan from the gathered carriers ``run`` (flat) of the round ``found``: every
    rank's metadata read and checked, its tensor a view of ``run``."""
    sizes = tuple(found.layouts[0].sizes)
    read = _known_read(run, sizes) or _new_read(run, sizes, call, info)
    assert isinstance(grad, str)
    return GatherListPlan(read.shapes, info, grad, x.dtype, [read.views(run)])


def _steady_key(
    x: object,
    call: FamilyCall,
    grad: object,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
) -> tuple[object, ...] | None:
    """Everything a validated call's headers and carrier are a function of, besides its
    group and the group's state, for the calls the steady path serves
    (``_fused.steady_exchange``; ``None`` for others, the conditions below)."""
    if (
        validate is not True
        or timeout is not None
        or type(grad) is not str
        or call.record.problem is not None
        or type(x) is not torch.Tensor
    ):
        return None
    assert isinstance(x, torch.Tensor)  # for mypy: checked just above
    if x.layout != torch.strided or x.is_nested or not plain(x):  # its bytes, one run
        return None
    requires = x.requires_grad and torch.is_grad_enabled()
    return (x.shape, x.dtype, requires, requires_grad, grad, call.extras)


@dataclass(frozen=True)
class _Read:
    """What the gathered carriers held, validated (the same ndim everywhere, no passed
    shapes contradicting the tensors): every rank's metadata ``words`` as the bytes
    they lay in (``struct``'s native int64), its shape, and where its region and its
    elements start in the run (in elements)."""

    words: tuple[bytes, ...]
    shapes: Shapes
    regions: tuple[int, ...]
    starts: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]

    def views(self, run: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor, a view of ``run``: one ``as_strided`` each (``run`` is
        contiguous) or a slice viewed as its shape."""
        if run.is_contiguous():
            base = run.storage_offset()
            return [
                run.as_strided(s, st, base + at)
                for s, st, at in zip(self.shapes, self.strides, self.starts, strict=True)
            ]
        return [
            run[at : at + math.prod(s)].view(s)
            for s, at in zip(self.shapes, self.starts, strict=True)
        ]


_READS: Final[dict[tuple[torch.dtype, tuple[int, ...]], _Read]] = {}
"""The last validated read per dtype and region sizes: a steady caller's carriers hold
the same words every call, so the next read only compares their bytes."""
_READS_MAX: Final = 64


def _direct(run: torch.Tensor) -> bool:
    """Whether ``run``'s metadata words are read with ``struct`` where they lie."""
    return run.dtype != torch.bool and run.device.type == "cpu" and run.is_contiguous()


def _known_read(run: torch.Tensor, sizes: tuple[int, ...]) -> _Read | None:
    """The read of these carriers when every rank's metadata bytes are those of the
    last validated read of the same dtype and region sizes (what ``_new_read`` would
    find: a function of those bytes and sizes alone); else ``None``."""
    if not _direct(run):
        return None
    known = _READS.get((run.dtype, sizes))
    if known is None:
        return None
    base, e = run.data_ptr(), run.element_size()
    for at, words in zip(known.regions, known.words, strict=True):
        if ctypes.string_at(base + at * e, len(words)) != words:
            return None
    return known


def _new_read(
    run: torch.Tensor, sizes: tuple[int, ...], call: FamilyCall, info: GroupInfo
) -> _Read:
    """The gathered carriers read and checked, the same on every rank: the ndim agrees,
    and no rank's passed shapes contradict the tensors (else every rank raises)."""
    read = _read_carriers(run, sizes)
    rows = [words[1:] for words, _ in read]
    ndims = [int(row[0]) for row in rows]
    agree(NAME, [(ShapeMismatchError, "ndim", list(ndims), repr)])
    shapes = tuple(
        tuple(int(v) for v in row[1 : 1 + n]) for row, n in zip(rows, ndims, strict=True)
    )
    liars: list[int] = []
    if any(row[-2] == 1 for row in rows):  # some rank passed shapes: check them
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
    regions = tuple(sum(sizes[:r]) for r in range(len(sizes)))
    found = _Read(
        words=tuple(struct.pack(f"={len(w)}q", *w) for w, _ in read),
        shapes=shapes,
        regions=regions,
        starts=tuple(
            at + n - p.numel() for at, n, (_, p) in zip(regions, sizes, read, strict=True)
        ),
        strides=tuple(row_major_strides(s) for s in shapes),
    )
    if _direct(run):
        if len(_READS) >= _READS_MAX:
            _READS.clear()
        _READS[(run.dtype, sizes)] = found
    return found


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
        mean_(out, info.world_size)
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


def gather_list_eager(
    x: Any, shapes: Any, group: Any, mesh_dim: Any, grad: Any, validate: Any, timeout: Any
) -> list[torch.Tensor]:
    """The eager ``all_gather_list`` (its arguments unchecked: the plan judges them, on
    every rank): the plan, then the payload inside ``GatherListFunction``."""
    plan = plan_gather_list(
        x, shapes, grad, call_group(group, mesh_dim), validate=validate, timeout=timeout
    )
    if not plan.info.communicates:
        return [x]
    if plan.box and not _autograd_needed(x):
        # What GatherListFunction.forward hands back (the tensors the fused round
        # gathered), without the autograd machinery that nothing here would use.
        return plan.box.pop()
    outs = GatherListFunction.apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    return list(outs)


# --- compiled: all_gather_list's operators and route (``_compiled``) -----------------------

from ._compiled import OpSpec, Route, define_ops, fresh, op_args, plain_sizes, rank_of  # noqa: E402  # this block ends the module on purpose (docs/compile.md)
from ._mesh import named_group  # noqa: E402  # as above


def encode_shapes(shapes: Sequence[Sequence[int]]) -> list[int]:
    """Shapes as one int list for an operator: ``ndim, dims...`` per rank."""
    return [v for s in shapes for v in (len(s), *s)]


def decode_shapes(flat: Sequence[int]) -> Shapes:
    out: list[tuple[int, ...]] = []
    i = 0
    while i < len(flat):
        n = int(flat[i])
        out.append(tuple(int(v) for v in flat[i + 1 : i + 1 + n]))
        i += 1 + n
    return tuple(out)


def _gather_list_op(
    x: torch.Tensor, shapes: Sequence[int], group_name: str, grad: str, *rest: Any
) -> list[torch.Tensor]:
    validate, timeout, requires_grad = rest
    plan = plan_gather_list(
        x, decode_shapes(shapes), grad, named_group(group_name), validate=validate,
        timeout=timeout, requires_grad=requires_grad,
    )  # fmt: skip
    with torch.no_grad():
        if not plan.info.communicates:
            return [x.clone(memory_format=torch.contiguous_format)]
        return [o.clone() for o in gather_flat(x, plan)]


def _list_gradient_op(
    grads: Sequence[torch.Tensor], shapes: Sequence[int], group_name: str, grad: str, *rest: Any
) -> torch.Tensor:
    info = named_group(group_name, rest[0])
    if not info.communicates:
        return grads[0].clone(memory_format=torch.contiguous_format)
    plan = GatherListPlan(decode_shapes(shapes), info, grad, grads[0].dtype)
    with torch.no_grad():
        return fresh(list_gradient(list(grads), plan), grads[info.rank])


def _list_gradient_fake(
    grads: Sequence[torch.Tensor], shapes: Sequence[int], group_name: str, *_: Any
) -> torch.Tensor:
    found = decode_shapes(shapes)
    return grads[0].new_empty(found[rank_of(group_name)] if len(found) > 1 else found[0])


define_ops(
    OpSpec(
        "all_gather_list",
        "(Tensor x, SymInt[] shapes, str group_name, str grad, bool validate, float? timeout, "
        "bool requires_grad) -> Tensor[]",
        _gather_list_op,
        lambda x, shapes, *_: [x.new_empty(s) for s in decode_shapes(shapes)],
        "all_gather_list_backward",
        lambda i, _: (list(i[1]), i[2], i[3], i[5]),  # shapes, group_name, grad, timeout
    ),
    OpSpec(
        "all_gather_list_backward",
        "(Tensor[] grads, SymInt[] shapes, str group_name, str grad, float? timeout) -> Tensor",
        _list_gradient_op,
        _list_gradient_fake,
    ),
)


def _traced(
    x: object, shapes: object, group: object, mesh_dim: object, grad: object, *rest: object
) -> list[torch.Tensor] | None:
    """The operator with every rank's shape known as ints, or ``None``."""
    a = op_args(x, 0, group, mesh_dim, *rest, grad)
    if a is None or not isinstance(shapes, (list, tuple)) or len(shapes) != a.world_size:
        return None
    plain: list[list[int]] = []
    for s in shapes:
        found = plain_sizes(s, len(s)) if isinstance(s, (list, tuple)) else None
        if found is None:
            return None
        plain.append(found)
    out: list[torch.Tensor] = torch.ops.vargather.all_gather_list(
        a.x, encode_shapes(plain), a.group_name, grad, a.validate, a.seconds, a.requires_grad
    )
    return out


ALL_GATHER_LIST: Route[list[torch.Tensor]] = Route("all_gather_list", gather_list_eager, _traced)

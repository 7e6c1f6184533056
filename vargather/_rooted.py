"""The rooted ragged collectives ``gather_v`` and ``scatter_v`` (MPI's Gatherv, Scatterv).

Where it sits: beside the family's collectives, on the all_to_all-shaped round through
``_steady`` (``_SPECS``), ``_comm.all_to_all_uneven`` (the payload) and ``_layout``;
``__init__`` exports the two faces. The two are each other's adjoint, so each one's
payload is the other's backward and both live here.

The math is ``gather_v``'s and ``scatter_v``'s docstrings (below); rank ``r``'s block
is ``n_r`` long along ``dim``, at ``o_r = n_0 + ... + n_{r-1}``; ``root`` is a group rank.

The round: every rank sends every rank its row (``_wire.encode_row``: the record, the
root and the passed sizes as extras), so every rank validates the same rows and raises
the same error; the payload rides in it when it fits, only where it belongs (to ``dst``;
from ``src``), else it moves in one alltoallv of bytes, again only where it belongs,
each block as it lies when contiguous (on gloo, 16 KiB to 1 MiB, point-to-point sends
of the same blocks ran 2-4x slower; ``docs/family.md`` has the bench).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import torch

from . import _steady
from ._args import Problem
from ._autograd import planned_function
from ._buffers import rank_major_gradient
from ._collectives import CollectiveName
from ._comm import all_to_all_uneven
from ._errors import ArgumentError, ArgumentMismatchError, SizesError, SizesMismatchError
from ._exchange import Check, agree, common_checks, raise_local, requires_grad_check, show_sizes
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._mesh import GroupLike, MeshDim, call_group
from ._round_buffers import bytes_of
from ._rows import (
    FamilyCall,
    Row,
    ValidatedOnce,
    block_sizes_problem,
    call_key,
    check_tensor,
    raise_own_problem,
    sizes_words,
    with_problem,
)
from ._steady import RoundSpec, run_round

GATHER: Final[CollectiveName] = "gather_v"
SCATTER: Final[CollectiveName] = "scatter_v"


@dataclass(frozen=True)
class RootedPlan:
    """A validated call: ``layout`` (every rank's block along ``dim``; ``output_shape``
    is the gathered one), the ``root``, the group, this rank's input's ``shape`` and
    ``result``, the forward's result when it rode in the round."""

    layout: Layout
    root: int
    info: GroupInfo
    shape: tuple[int, ...]
    result: torch.Tensor | None = field(default=None, compare=False, repr=False)


# --- local checks and the row ----------------------------------------------------------


def _root(value: object, what: str, world_size: int) -> tuple[int, Problem | None]:
    """``value`` as a group rank, and its problem (the word ``-1`` when malformed)."""
    try:
        root = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]  # any object is tried; a non-integer raises TypeError
    except TypeError:
        root = -1
    if 0 <= root < world_size:
        return root, None
    return -1, Problem(
        ArgumentError,
        f"expected {what} to be a rank in the group (not a global rank): an int in "
        f"[0, {world_size}), got {value!r}",
    )


def _local_call(
    name: CollectiveName,
    x: object,
    root: object,
    sizes: object,
    dim: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
) -> FamilyCall:
    """This rank's call: its record (the first local problem in it), and as extras the
    root and the passed sizes (``[root, len, n_0, ..., n_{W-1}]``). ``requires_grad``
    overrides ``x``'s (an operator runs below autograd and passes the caller's)."""
    w = info.world_size
    record, call_timeout = check_tensor(
        x, dim, info=info, validate=validate, timeout=timeout, requires_grad=requires_grad,
        split=True,
    )  # fmt: skip
    own_root, problem = _root(root, "dst" if name == GATHER else "src", w)
    parsed, words = sizes_words(sizes, w)
    d = record.normalized_dim
    if parsed is None and name == SCATTER:
        problem = problem or Problem(SizesError, "sizes is required: one block size per rank")
    elif not isinstance(parsed, tuple) or len(parsed) != w:
        problem = problem or block_sizes_problem(parsed, w, None)
    elif d >= 0 and name == GATHER and parsed[info.rank] != record.size_along_dim:
        problem = problem or Problem(
            SizesError,
            f"expected sizes[{info.rank}] == {record.size_along_dim} (its tensor's size along "
            f"dim {d}), got {parsed[info.rank]}",
        )
    elif (
        d >= 0
        and name == SCATTER
        and own_root == info.rank
        and sum(parsed) != record.size_along_dim
    ):
        problem = problem or Problem(
            SizesError,
            f"expected sum(sizes) == {record.size_along_dim} (src's tensor's size along "
            f"dim {d}), got sum(sizes) = {sum(parsed)} for sizes={list(parsed)}",
        )
    own = parsed if isinstance(parsed, tuple) and len(parsed) == w else None
    return FamilyCall(name, with_problem(record, problem), (own_root, *words), (own,), call_timeout)


def _validate(name: CollectiveName, rows: list[Row], *, rank: int) -> tuple[int, tuple[int, ...]]:
    """The root and every rank's block size, or the error every rank raises alike (a
    pure function of ``rows``)."""
    records = [row.record for row in rows]
    raise_local(name, records)
    what = "dst" if name == GATHER else "src"
    checks: list[Check] = common_checks(records, dim=True, shape="other")
    checks.append(
        (ArgumentMismatchError, f"{what} (a group rank)", [r.extras[0] for r in rows], repr)
    )
    checks.append((SizesMismatchError, "sizes", [row.extras[1:] for row in rows], show_sizes))
    backward = "scatter from dst" if name == GATHER else "gather to src"
    checks.append(requires_grad_check(records, f"the backward of {name} is a {backward}"))
    agree(name, checks)
    extras = rows[rank].extras
    if name == GATHER:
        return extras[0], tuple(rec.size_along_dim for rec in records)
    return extras[0], tuple(int(n) for n in extras[2 : 2 + extras[1]])


def _outgoing(
    name: CollectiveName, x: object, call: FamilyCall, info: GroupInfo
) -> tuple[torch.Tensor, list[int]]:
    """This rank's payload as the round carries it (a problem-free call, whose ``x`` is
    a tensor): its bytes and the bytes for each rank (``_family.Outgoing``)."""
    assert isinstance(x, torch.Tensor)
    w, root, d = info.world_size, call.extras[0], call.record.normalized_dim
    if name == GATHER:
        flat = bytes_of(x)
        return flat, [flat.numel() if k == root else 0 for k in range(w)]
    if info.rank != root:
        return torch.empty(0, dtype=torch.uint8), [0] * w
    sizes = call.sizes[0]
    assert sizes is not None  # src's problem-free call parsed its sizes
    layout = blocks_layout(x.shape, d, sizes, x.dtype, info.rank, info.world_size)
    unit = layout.pre * layout.post * x.element_size()
    return bytes_of(rank_major_gradient(x.detach(), layout)), [n * unit for n in sizes]


def _plan(
    name: CollectiveName,
    x: object,
    root: object,
    sizes: object,
    dim: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None = None,
) -> RootedPlan:
    """The same error on every rank, or the same plan (with ``validate=False`` and the
    sizes passed: no round, and a local problem raised on this rank only); a validated
    call that repeats the group's last steady one replays its round
    (``_steady.replay``)."""
    key = call_key(x, root, sizes, dim, validate, timeout, requires_grad)
    steady = key if validate is True else None
    found = _steady.replay(_SPECS[name], steady, x, info)
    if found is not None:
        return found
    call = _local_call(name, x, root, sizes, dim, info, validate, timeout, requires_grad)
    if call.timeout is not None:
        info = info.with_timeout(call.timeout)
    own = call.sizes[0]
    if info.communicates and (validate is not False or own is None):
        return run_round(_SPECS[name], call, x, info, steady)
    raise_own_problem(name, call.record.problem, info, trusted=validate is False)
    assert isinstance(x, torch.Tensor)  # a problem-free record is a tensor's
    return _plan_of(name, (call.extras[0], own or (call.record.size_along_dim,)), x, call, info)[0]


def _plan_of(
    name: CollectiveName,
    verdict: tuple[int, tuple[int, ...]],
    x: object,
    call: FamilyCall,
    info: GroupInfo,
) -> tuple[RootedPlan, list[int]]:
    """The plan of the validated root and sizes, and the bytes rank ``j`` sends rank
    ``k`` at ``j * W + k`` (``unit``: the bytes of one slice along ``dim``): to the
    root only (``gather_v``), from it only (``scatter_v``)."""
    root, sizes = verdict
    assert isinstance(x, torch.Tensor)  # every rank's record validated: a tensor's
    layout = blocks_layout(
        x.shape, call.record.normalized_dim, sizes, x.dtype, info.rank, info.world_size
    )
    unit, w = layout.pre * layout.post * x.element_size(), info.world_size
    if name == GATHER:
        blocks = [n * unit if k == root else 0 for n in sizes for k in range(w)]
    else:
        blocks = [n * unit if j == root else 0 for j in range(w) for n in sizes]
    return RootedPlan(layout, root, info, tuple(x.shape)), blocks


def _finish(
    name: CollectiveName, plan: RootedPlan, slots: Sequence[torch.Tensor], _: object
) -> RootedPlan:
    """``plan`` with the forward's result from the round's slots (``slots[j]``: what
    rank ``j`` sent this rank)."""
    lay, root = plan.layout, plan.root
    if name == SCATTER:
        out = _assemble([slots[root]], lay.shard_shape(lay.rank), lay, [lay.rank])
    elif lay.rank != root:
        out = _empty(slots[0], lay)
    else:
        out = _assemble(slots, lay.output_shape, lay, range(lay.world_size))
    return RootedPlan(lay, root, plan.info, plan.shape, out)


_SPECS: Final[dict[CollectiveName, RoundSpec[tuple[int, tuple[int, ...]], RootedPlan]]] = {
    name: RoundSpec(
        name,
        ValidatedOnce(functools.partial(_validate, name)),
        functools.partial(_outgoing, name),
        functools.partial(_plan_of, name),
        functools.partial(_finish, name),
    )
    for name in (GATHER, SCATTER)
}
"""Each collective as the round takes it (``_steady.RoundSpec``), its ``_validate``
once for the steady state's rows (``_rows.ValidatedOnce``)."""


def _empty(like: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A gather's result off the root: 0 long along ``dim``."""
    shape = (*layout.leading_shape, 0, *layout.trailing_shape)
    return torch.empty(shape, dtype=layout.dtype, device=like.device)


def _assemble(
    parts: Sequence[torch.Tensor], shape: Sequence[int], layout: Layout, ranks: Sequence[int]
) -> torch.Tensor:
    """A fresh tensor of ``shape`` from the bytes of blocks ``ranks`` (``parts[i]``:
    block ``ranks[i]``, ``(pre, n, post)`` in memory order), joined along ``dim``."""
    out = torch.empty(tuple(shape), dtype=layout.dtype, device=parts[0].device)
    view = out.view(layout.pre, -1, layout.post) if out.numel() else out
    at = 0
    for part, r in zip(parts, ranks, strict=True):
        n = layout.sizes[r]
        if n and out.numel():
            block = part.view(layout.dtype)[: layout.pre * n * layout.post]
            view[:, at : at + n].copy_(block.view(layout.pre, n, layout.post))
        at += n
    return out


# --- the payloads: each collective's forward and the other's backward ------------------


def _all_to_all(
    name: CollectiveName,
    received: torch.Tensor,
    sent: torch.Tensor,
    into: list[int],
    out: list[int],
    info: GroupInfo,
    layout: Layout,
) -> None:
    """The payload: one alltoallv of bytes (``out[k]`` bytes of ``sent`` to rank ``k``,
    ``into[j]`` bytes from rank ``j``) on every rank; none when no byte moves at all
    (every rank knows it from ``layout``)."""
    if not info.communicates:  # a world of one: its block to itself
        received.copy_(sent)
    elif layout.total * layout.pre * layout.post:
        all_to_all_uneven(received, sent, into, out, info, what=f"all_to_all ({name} payload)")


def gather_to(block: torch.Tensor, layout: Layout, root: int, info: GroupInfo) -> torch.Tensor:
    """On ``root``: ``cat_r x_r`` along ``dim`` (a fresh tensor, ``layout.output_shape``),
    block ``r`` sent by rank ``r`` (``block``: this rank's); elsewhere an empty tensor."""
    w, rank, sent = info.world_size, info.rank, bytes_of(block)
    out = [sent.numel() if k == root else 0 for k in range(w)]
    if rank != root:
        _all_to_all(GATHER, sent[:0], sent, [0] * w, out, info, layout)
        return _empty(block, layout)
    unit = layout.pre * layout.post * block.element_size()
    into = [n * unit for n in layout.sizes]
    result = block.new_empty(layout.output_shape)
    if layout.pre == 1:  # every block lands where it belongs in the result
        _all_to_all(GATHER, bytes_of(result), sent, into, out, info, layout)
        return result
    received = torch.empty(sum(into), dtype=torch.uint8, device=block.device)
    _all_to_all(GATHER, received, sent, into, out, info, layout)
    parts = [
        received[o * unit : (o + n) * unit]
        for o, n in zip(layout.offsets, layout.sizes, strict=True)
    ]
    return _assemble(parts, layout.output_shape, layout, range(w))


def scatter_from(full: torch.Tensor, layout: Layout, root: int, info: GroupInfo) -> torch.Tensor:
    """Block ``rank`` along ``dim`` of ``root``'s ``full`` (``layout.output_shape``
    there; elsewhere only its dtype and device are read), a fresh tensor."""
    w, rank = info.world_size, info.rank
    result = torch.empty(layout.shard_shape(rank), dtype=layout.dtype, device=full.device)
    received = bytes_of(result)
    into = [received.numel() if j == root else 0 for j in range(w)]
    if rank != root:
        _all_to_all(SCATTER, received, received[:0], into, [0] * w, info, layout)
        return result
    unit = layout.pre * layout.post * full.element_size()
    sent = bytes_of(rank_major_gradient(full.detach(), layout))
    _all_to_all(SCATTER, received, sent, into, [n * unit for n in layout.sizes], info, layout)
    return result


def _gather_to_root(grad: torch.Tensor, plan: RootedPlan) -> torch.Tensor:
    """scatter_v's backward: ``cat_r g_r`` on the root, zeros shaped as ``x`` elsewhere."""
    full = gather_to(grad, plan.layout, plan.root, plan.info)
    return full if plan.info.rank == plan.root else grad.new_zeros(plan.shape)


_FUNCTIONS: Final = {
    GATHER: planned_function(
        "GatherVFunction",
        """``y_root = cat_r x_r``; the backward scatters ``g_root`` back (``gather_v``).""",
        lambda x, plan: gather_to(x.detach(), plan.layout, plan.root, plan.info),
        lambda g, plan: scatter_from(g, plan.layout, plan.root, plan.info),
    ),
    SCATTER: planned_function(
        "ScatterVFunction",
        """``y_r = x_root[o_r : o_r + n_r]``; the backward gathers the ``g_r`` to the
        root, zeros elsewhere (``scatter_v``).""",
        lambda x, plan: scatter_from(x.detach(), plan.layout, plan.root, plan.info),
        _gather_to_root,
    ),
}
"""Each collective's autograd function (``_autograd.planned_function``)."""


def _eager(
    name: CollectiveName, x: Any, root: Any, sizes: Any, dim: Any, group: Any, *rest: Any
) -> torch.Tensor:
    """The eager call: the plan (every argument judged there, on every rank), then the
    payload inside the collective's autograd function."""
    mesh_dim, validate, timeout = rest
    plan = _plan(name, x, root, sizes, dim, call_group(group, mesh_dim), validate, timeout)
    out = _FUNCTIONS[name].apply(x, plan)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch's stubs
    assert isinstance(out, torch.Tensor)
    return out


# --- the faces -------------------------------------------------------------------------


def gather_v(
    x: torch.Tensor,
    dst: int,
    dim: int = 0,
    *,
    sizes: Sequence[int] | torch.Tensor | None = None,
    group: GroupLike = None,
    validate: bool = True,
    timeout: float | timedelta | None = None,
    mesh_dim: MeshDim = None,
) -> torch.Tensor:
    """Gather every rank's ``x`` onto rank ``dst``, joined along ``dim`` (MPI's Gatherv).

    Rank ``dst`` returns ``torch.cat([x_0, ..., x_{W-1}], dim)`` (rank order; sizes
    along ``dim`` may differ), a fresh tensor; every other rank returns an empty
    tensor (its ``x``'s shape with 0 along ``dim``).

    Args:
        x: this rank's block (see Shapes).
        dst: the receiving rank, **a rank in the group** (``group``'s rank numbering,
            not the global rank), the same on every rank.
        dim: the dimension to join along, negative values counted from the end.
        sizes: optionally every rank's size along ``dim``, in group-rank order, the same
            on every rank.
        group: as for ``all_gather_v`` (a process group or a ``DeviceMesh``).
        validate: ``False`` with ``sizes`` trusts them and skips the metadata round.
        timeout: as for ``all_gather_v``.
        mesh_dim: as for ``all_gather_v``.

    Shapes:
        ``x`` is ``lead + (n_r,) + trail`` with ``lead``, ``trail``, dtype and device
        type the same on every rank; ``dst`` returns ``lead + (Σ n_r,) + trail``.

    Gradient:
        ``dx_r`` is block ``r`` of ``dst``'s upstream gradient (the exact adjoint: a
        scatter from ``dst``). The backward is a collective: every rank runs it.

    Raises:
        VarGatherError: bad input on any rank (``dst`` out of range or differing,
            dtypes, ndim, sizes off ``dim``, ``sizes`` that contradict the tensors,
            ...), raised on every rank with the same message naming the rank(s),
            expected and got, before any payload moves; the group stays usable.
        GroupError: on this rank only, when ``group`` is unusable here.
        CollectiveTimeoutError: a peer never arrived within ``timeout``.
    """
    return _ROUTES[GATHER](x, dst, sizes, dim, group, mesh_dim, validate, timeout)  # at the end


def scatter_v(
    x: torch.Tensor,
    sizes: Sequence[int] | torch.Tensor,
    src: int,
    dim: int = 0,
    *,
    group: GroupLike = None,
    validate: bool = True,
    timeout: float | timedelta | None = None,
    mesh_dim: MeshDim = None,
) -> torch.Tensor:
    """Give rank ``r`` block ``r`` (``sizes[r]`` long along ``dim``) of ``src``'s ``x``
    (MPI's Scatterv), a fresh tensor.

    Args:
        x: on ``src``, the tensor to cut (``sum(sizes)`` long along ``dim``); on every
            other rank only its dtype, device type and the sizes off ``dim`` are read:
            its length along ``dim`` may be anything (0 is cheapest).
        sizes: ``(n_0, ..., n_{W-1})``, a sequence of ints or a 1-d integer tensor, the
            same on every rank, in group-rank order.
        src: the sending rank, **a rank in the group** (``group``'s rank numbering, not
            the global rank), the same on every rank.
        dim: the dimension cut into blocks, negative values counted from the end.
        group: as for ``all_gather_v`` (a process group or a ``DeviceMesh``).
        validate: ``False`` skips the metadata round; ``sizes`` and ``src`` are trusted.
        timeout: as for ``all_gather_v``.
        mesh_dim: as for ``all_gather_v``.

    Shapes:
        ``x`` is ``lead + (m,) + trail`` (``m = sum(sizes)`` on ``src``), ``lead``,
        ``trail``, dtype and device type the same on every rank; rank ``r`` returns
        ``lead + (n_r,) + trail``.

    Gradient:
        ``src``'s ``dx`` is ``cat_r g_r`` (the gather of every rank's upstream
        gradient), every other rank's is zeros. The backward is a collective: every
        rank runs it.

    Raises:
        VarGatherError: bad input on any rank (``src`` out of range or differing,
            ``sizes`` that differ or do not sum to ``src``'s ``x.shape[dim]``, dtypes,
            ndim, ...), raised on every rank with the same message naming the rank(s),
            expected and got, before any payload moves; the group stays usable.
        GroupError: on this rank only, when ``group`` is unusable here.
        CollectiveTimeoutError: a peer never arrived within ``timeout``.
    """
    return _ROUTES[SCATTER](x, src, sizes, dim, group, mesh_dim, validate, timeout)


# --- compiled: gather_v's and scatter_v's operators and routes (``_compiled``) ----------

from ._compiled import OpSpec, Route, define_ops, fresh, op_args, plain_sizes, rank_of, resized  # noqa: E402  # this block ends the module on purpose (docs/compile.md)
from ._mesh import named_group  # noqa: E402  # as above


def _rooted_op(name: CollectiveName) -> Callable[..., torch.Tensor]:
    """The eager pipeline of ``name`` as its operator runs it: the plan (the round and
    its validation unless ``validate=False``), then the payload."""

    def op(
        x: torch.Tensor, root: int, dim: int, sizes: Sequence[int], group: str, *rest: Any
    ) -> torch.Tensor:
        validate, timeout, requires_grad = rest
        plan = _plan(
            name, x, root, list(sizes), dim, named_group(group), validate, timeout, requires_grad
        )
        with torch.no_grad():
            out = plan.result
            if out is None:
                payload = gather_to if name == GATHER else scatter_from
                out = payload(x, plan.layout, plan.root, plan.info)
            return fresh(out, x)

    return op


def _gather_fake(
    x: torch.Tensor, dst: int, dim: int, sizes: Sequence[int], group: str, *_: Any
) -> torch.Tensor:
    return x.new_empty(resized(x, (dim, sum(sizes) if rank_of(group) == dst else 0)))


def _scatter_fake(
    x: torch.Tensor, src: int, dim: int, sizes: Sequence[int], group: str, *_: Any
) -> torch.Tensor:
    return x.new_empty(resized(x, (dim, sizes[rank_of(group)])))


def _scatter_gradient_op(
    g: torch.Tensor, dst: int, dim: int, sizes: Sequence[int], group: str, timeout: float | None
) -> torch.Tensor:
    """gather_v's backward: block ``rank`` of ``dst``'s ``g`` (a scatter from ``dst``)."""
    info = named_group(group, timeout)
    layout = blocks_layout(g.shape, dim, sizes, g.dtype, info.rank, info.world_size)
    with torch.no_grad():
        return fresh(scatter_from(g, layout, dst, info), g)


def _gather_gradient_op(
    g: torch.Tensor, src: int, dim: int, sizes: Sequence[int], length: int, group: str, *rest: Any
) -> torch.Tensor:
    """scatter_v's backward: ``cat_r g_r`` on ``src`` (a gather to ``src``), zeros
    ``length`` long along ``dim`` (``x``'s) elsewhere."""
    (timeout,) = rest
    info = named_group(group, timeout)
    layout = blocks_layout(g.shape, dim, sizes, g.dtype, info.rank, info.world_size)
    with torch.no_grad():
        full = gather_to(g, layout, src, info)
        return fresh(full, g) if info.rank == src else g.new_zeros(resized(g, (dim, length)))


def _gather_gradient_fake(
    g: torch.Tensor, src: int, dim: int, sizes: Sequence[int], length: int, *_: Any
) -> torch.Tensor:
    # On src, length is sum(sizes): the forward's plan refused any other x there.
    return g.new_empty(resized(g, (dim, length)))


def _forward(root: str) -> str:
    """A forward operator's schema, its root named ``root`` (``dst``, ``src``)."""
    return (
        f"(Tensor x, SymInt {root}, SymInt dim, SymInt[] sizes, str group_name, "
        "bool validate, float? timeout, bool requires_grad) -> Tensor"
    )


define_ops(
    OpSpec(
        GATHER,
        _forward("dst"),
        _rooted_op(GATHER),
        _gather_fake,
        "gather_v_backward",
        # dst, dim, sizes, group, timeout
        lambda i, _: (i[1], i[2] % i[0].dim(), list(i[3]), i[4], i[6]),
    ),
    OpSpec(
        "gather_v_backward",
        "(Tensor grad_output, SymInt dst, SymInt dim, SymInt[] sizes, str group_name, "
        "float? timeout) -> Tensor",
        _scatter_gradient_op,
        _scatter_fake,  # the backward is a scatter from dst: this rank's block
    ),
    OpSpec(
        SCATTER,
        _forward("src"),
        _rooted_op(SCATTER),
        _scatter_fake,
        "scatter_v_backward",
        # src, dim, sizes, x's length along dim, group, timeout
        lambda i, _: (i[1], i[2] % i[0].dim(), list(i[3]), i[0].shape[i[2]], i[4], i[6]),
    ),
    OpSpec(
        "scatter_v_backward",
        "(Tensor grad_output, SymInt src, SymInt dim, SymInt[] sizes, SymInt length, "
        "str group_name, float? timeout) -> Tensor",
        _gather_gradient_op,
        _gather_gradient_fake,
    ),
)


def _traced(
    name: CollectiveName, x: object, root: object, sizes: object, dim: object, *rest: object
) -> torch.Tensor | None:
    """The operator's call when ``sizes`` are ints and ``root`` an int, else ``None``
    (the eager call behind one graph break)."""
    group, mesh_dim, validate, timeout = rest
    a = op_args(x, dim, group, mesh_dim, validate, timeout)
    plain = None if a is None else plain_sizes(sizes, a.world_size)
    if a is None or plain is None or isinstance(root, bool) or not isinstance(root, int):
        return None
    op = torch.ops.vargather.gather_v if name == GATHER else torch.ops.vargather.scatter_v
    out: torch.Tensor = op(
        a.x, root, a.dim, plain, a.group_name, a.validate, a.seconds, a.requires_grad
    )
    return out


_ROUTES: Final[dict[CollectiveName, Route[torch.Tensor]]] = {
    name: Route(name, functools.partial(_eager, name), functools.partial(_traced, name))
    for name in (GATHER, SCATTER)
}
"""Each collective's way in (``_compiled.Route``); its operator needs the sizes as ints."""

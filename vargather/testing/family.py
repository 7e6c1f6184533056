"""The testing kit for the ragged collective family: cases, strategies, runners, judge.

Where it sits: in the testing kit, beside ``cases``/``strategies``/``judge`` (which
model ``all_gather_v``), for ``reduce_scatter_v``, ``all_to_all_v`` and
``all_gather_list``. Bottom up:

* **case models** (``ReduceScatterCase``, ``AllToAllCase``, ``GatherListCase``): frozen, picklable, everything a rank needs to rebuild its inputs
  (``inputs_of``) and upstream gradients (``upstream_of``) from the case alone;
* **strategies** (``reduce_scatter_cases``, ``all_to_all_cases``,
  ``gather_list_cases``): Hypothesis draws, in the parent process;
* **rank runners** (``run_case``): module-level functions for
  ``get_pool(W).run``; each imports the implementation under test by name
  (``case.impl``, ``"vargather"`` by default: any module with the collective's
  function, a mutant for one) and reports what it returned, its gradient, or the
  error it raised;
* **the judge and the properties** (``judge_case``, ``check_case``; their misuse
  counterparts are the kit's misuse catalogue's, ``vargather.testing.misuse``): plain functions over a drawn case returning the kit's
  ``judge.Failure`` records (empty: the property holds), so a catalogue entry can call
  them. Forward results
  and gradients are compared bit for bit with ``vargather.oracle``; with integer
  values the adjoint identity ``Σ_r <y_r, g_r> == Σ_j <x_j, dx_j>`` is checked too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, NamedTuple

import torch
from hypothesis import strategies as st

from vargather import oracle

from .asserts import bitwise_difference, nan_payloads_only
from .cases import DTYPE_NAMES, is_differentiable, make_values, torch_dtype
from .collectives import FAMILY
from .judge import Failure, without_addresses
from .pool import RankContext, RankPool
from .runner import load_callable

__all__ = [
    "COLLECTIVES",
    "FAMILY_NAMES",
    "AllToAllCase",
    "CallReport",
    "GatherListCase",
    "ReduceScatterCase",
    "a2a_shapes",
    "all_to_all_cases",
    "call_sequences",
    "call_values",
    "changing_sizes_sequences",
    "check_case",
    "check_sequence",
    "gather_list_cases",
    "inputs_of",
    "joined_along",
    "judge_case",
    "recv_of",
    "reduce_scatter_cases",
    "run_case",
    "run_sequence",
    "upstream_of",
]

COLLECTIVES: Final = FAMILY
"""The family's collectives (``collectives.FAMILY``, from the library's table)."""
FAMILY_NAMES: dict[str, tuple[str, ...]] = {
    "reduce_scatter_v": ("x", "sizes", "dim", "group", "out"),
    "all_to_all_v": ("x", "send_sizes", "recv_sizes", "dim", "cat_dim", "group", "out"),
    "all_gather_list": ("x", "shapes", "group", "grad"),
}
"""The names a call template (``--call``) of each collective may use: ``x`` this rank's
tensor; ``sizes`` every rank's block size (reduce_scatter_v); ``send_sizes`` /
``recv_sizes`` this rank's send and receive sizes (all_to_all_v; ``recv_sizes`` is
``None`` where a case leaves it to the exchange; ``cat_dim`` the dim the received
blocks are joined along, ``None`` for ``dim``); ``shapes`` every rank's shape or
``None`` (all_gather_list); ``out`` a preallocated output (an empty tensor of this
rank's output shape and ``x``'s dtype and device); ``dim``, ``group`` and ``grad`` as
for all_gather_v (``group``: the process-group object, never ``None``)."""
CALL_TIMEOUT = 15.0
"""Seconds each collective of a case may wait for its peers (a rank that raised leaves
its peers waiting that long)."""


# --- case models -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReduceScatterCase:
    """``reduce_scatter_v(x, sizes, dim)``; ``other`` is the shape without ``dim``."""

    world_size: int
    sizes: tuple[int, ...]
    other: tuple[int, ...]
    dim: int
    dtype: str = "float32"
    requires_grad: bool = True
    special: bool = False  # NaN payloads, -0.0, inf among the values
    seed: int = 0
    group: tuple[int, ...] | None = None  # the world's ranks forming the group
    validate: bool = True
    impl: str = "vargather"
    call: str | None = None
    emulate: str | None = None  # "nccl": the ranks' torch.distributed behaves as NCCL
    collective: str = field(default="reduce_scatter_v", init=False, repr=False)


@dataclass(frozen=True)
class AllToAllCase:
    """``all_to_all_v(x_j, send[j], dim, cat_dim=cat_dim)`` on group rank ``j``.

    ``cat``: with ``cat_dim`` another dim than ``dim``, each rank's size along it (its
    entry of ``other`` there is unused), and ``send``'s columns constant (every rank
    sends rank ``r`` as many rows along ``dim``)."""

    world_size: int
    send: tuple[tuple[int, ...], ...]
    other: tuple[int, ...]
    dim: int
    dtype: str = "float32"
    requires_grad: bool = True
    special: bool = False
    seed: int = 0
    group: tuple[int, ...] | None = None
    pass_recv: bool = False
    validate: bool = True
    impl: str = "vargather"
    call: str | None = None
    emulate: str | None = None  # "nccl": the ranks' torch.distributed behaves as NCCL
    cat_dim: int | None = None
    cat: tuple[int, ...] | None = None
    collective: str = field(default="all_to_all_v", init=False, repr=False)


@dataclass(frozen=True)
class GatherListCase:
    """``all_gather_list(x_r, grad=grad)`` with ``x_r`` of shape ``shapes[r]``."""

    world_size: int
    shapes: tuple[tuple[int, ...], ...]
    dtype: str = "float32"
    grad: str = "sum"
    requires_grad: bool = True
    special: bool = False
    seed: int = 0
    group: tuple[int, ...] | None = None
    pass_shapes: bool = False
    validate: bool = True
    impl: str = "vargather"
    call: str | None = None
    emulate: str | None = None  # "nccl": the ranks' torch.distributed behaves as NCCL
    collective: str = field(default="all_gather_list", init=False, repr=False)


Case = ReduceScatterCase | AllToAllCase | GatherListCase


def members(case: Case) -> tuple[int, ...]:
    """The world ranks that call the collective (the group), in group-rank order."""
    return case.group if case.group is not None else tuple(range(case.world_size))


def _shape(other: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    d = dim % (len(other) + 1)
    return (*other[:d], n, *other[d:])


def joined_along(case: AllToAllCase) -> int | None:
    """``case.cat_dim`` normalized when it joins along another dim than ``case.dim``."""
    if case.cat_dim is None or case.cat is None:
        return None
    n = len(case.other) + 1
    c = case.cat_dim % n
    return None if c == case.dim % n else c


def a2a_shapes(case: AllToAllCase) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Every group rank's input shape and output shape."""
    w = len(case.send)
    c = joined_along(case)
    ins = [list(_shape(case.other, case.dim, sum(case.send[j]))) for j in range(w)]
    outs = [list(_shape(case.other, case.dim, sum(s[r] for s in case.send))) for r in range(w)]
    if c is not None:
        assert case.cat is not None  # joined_along checked it
        for j in range(w):
            ins[j][c] = case.cat[j]
            outs[j][case.dim % len(outs[j])] = case.send[j][j]
            outs[j][c] = sum(case.cat)
    return [tuple(s) for s in ins], [tuple(s) for s in outs]


def recv_of(case: AllToAllCase, r: int) -> list[int]:
    """Group rank ``r``'s true receive sizes (along ``cat_dim``)."""
    if joined_along(case) is not None:
        assert case.cat is not None  # joined_along checked it
        return list(case.cat)
    return [s[r] for s in case.send]


def values(shape: Sequence[int], dtype: str, seed: int, special: bool) -> torch.Tensor:
    """Small integer values of ``dtype`` (exact sums in every float format), and with
    ``special`` NaNs with distinct payloads, -0.0 and infinities among them
    (``cases.make_values``, the kit's one value generator)."""
    return make_values(tuple(shape), torch_dtype(dtype), seed, "special" if special else "integers")


def inputs_of(case: Case) -> list[torch.Tensor]:
    """Every group rank's input, by group rank (the same on every process)."""
    w = len(members(case))
    if isinstance(case, ReduceScatterCase):
        shape = _shape(case.other, case.dim, sum(case.sizes))
        return [values(shape, case.dtype, case.seed * 131 + r, case.special) for r in range(w)]
    if isinstance(case, AllToAllCase):
        return [
            values(shape, case.dtype, case.seed * 131 + r, case.special)
            for r, shape in enumerate(a2a_shapes(case)[0])
        ]
    return [values(case.shapes[r], case.dtype, case.seed * 131 + r, case.special) for r in range(w)]


def output_shapes(case: Case) -> list[Any]:
    """Each group rank's output shape (a list of shapes for ``all_gather_list``)."""
    w = len(members(case))
    if isinstance(case, ReduceScatterCase):
        return [_shape(case.other, case.dim, case.sizes[r]) for r in range(w)]
    if isinstance(case, AllToAllCase):
        return list(a2a_shapes(case)[1])
    return [list(case.shapes) for _ in range(w)]


def upstream_of(case: Case) -> list[Any]:
    """Each group rank's upstream gradient: integer-valued, different on every rank (a
    list of ``W`` gradients, one per output, for ``all_gather_list``)."""
    shapes = output_shapes(case)
    dtype = case.dtype
    out: list[Any] = []
    for r, s in enumerate(shapes):
        if isinstance(case, GatherListCase):
            out.append([values(t, dtype, 7000 + 97 * r + k, False) for k, t in enumerate(s)])
        else:
            out.append(values(s, dtype, 7000 + 97 * r, False))
    return out


def _differentiable(case: Case) -> bool:
    return case.requires_grad and is_differentiable(torch_dtype(case.dtype))


# --- strategies --------------------------------------------------------------------------


def _dims(draw: Any, max_dims: int = 2, most: int = 3) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(0, most), max_size=max_dims)))


@st.composite
def reduce_scatter_cases(
    draw: Any,
    world_sizes: Sequence[int] = (2, 3),
    dtypes: Sequence[str] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
) -> ReduceScatterCase:
    """``ReduceScatterCase``s: empty blocks, negative dims, every dtype, subgroups;
    ``most``: the largest block and dimension (payload scale)."""
    world = draw(st.sampled_from(list(world_sizes)))
    group = _draw_group(draw, world, subgroups)
    w = len(group) if group is not None else world
    other = _dims(draw, most=most)
    return ReduceScatterCase(
        world_size=world,
        sizes=tuple(draw(st.lists(st.integers(0, most), min_size=w, max_size=w))),
        other=other,
        dim=draw(st.integers(-(len(other) + 1), len(other))),
        dtype=draw(st.sampled_from(list(dtypes))),
        requires_grad=draw(st.booleans()),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        group=group,
        validate=draw(st.booleans()),
    )


def _draw_group(draw: Any, world: int, subgroups: bool) -> tuple[int, ...] | None:
    if not subgroups or world < 3 or not draw(st.booleans()):
        return None
    ranks = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=world - 1, unique=True))
    return tuple(sorted(ranks))


@st.composite
def all_to_all_cases(
    draw: Any,
    world_sizes: Sequence[int] = (2, 3),
    dtypes: Sequence[str] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
    joined: bool = True,
) -> AllToAllCase:
    """``AllToAllCase``s: send matrices with zeros, negative dims, dtypes, subgroups;
    with ``joined``, a ``cat_dim`` now and then: another dim (uneven sizes along both:
    a constant-column send matrix and each rank's own size along ``cat_dim``, the
    sequence-parallel switch), or ``dim`` itself passed."""
    world = draw(st.sampled_from(list(world_sizes)))
    group = _draw_group(draw, world, subgroups)
    w = len(group) if group is not None else world
    other = _dims(draw, most=most)
    n = len(other) + 1
    dim = draw(st.integers(-n, n - 1))
    row = st.lists(st.integers(0, most), min_size=w, max_size=w).map(tuple)
    send = tuple(draw(st.lists(row, min_size=w, max_size=w)))
    cat_dim: int | None = None
    cat: tuple[int, ...] | None = None
    if joined and draw(st.booleans()):
        cat_dim = draw(st.integers(-n, n - 1))
        if cat_dim % n != dim % n:
            column = draw(row)
            send = tuple(column for _ in range(w))
            cat = draw(row)
    return AllToAllCase(
        world_size=world,
        send=send,
        other=other,
        dim=dim,
        cat_dim=cat_dim,
        cat=cat,
        dtype=draw(st.sampled_from(list(dtypes))),
        requires_grad=draw(st.booleans()),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        group=group,
        pass_recv=draw(st.booleans()),
        validate=draw(st.booleans()),
    )


@st.composite
def gather_list_cases(
    draw: Any,
    world_sizes: Sequence[int] = (2, 3),
    dtypes: Sequence[str] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
) -> GatherListCase:
    """``GatherListCase``s: shapes differing in every dim (empties too), contracts."""
    world = draw(st.sampled_from(list(world_sizes)))
    group = _draw_group(draw, world, subgroups)
    w = len(group) if group is not None else world
    ndim = draw(st.integers(1, 3))
    shape = st.lists(st.integers(0, most), min_size=ndim, max_size=ndim).map(tuple)
    pass_shapes = draw(st.booleans())
    return GatherListCase(
        world_size=world,
        shapes=tuple(draw(st.lists(shape, min_size=w, max_size=w))),
        dtype=draw(st.sampled_from(list(dtypes))),
        grad=draw(st.sampled_from(["sum", "local", "mean"])),
        requires_grad=draw(st.booleans()),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        group=group,
        pass_shapes=pass_shapes,
        validate=draw(st.booleans()) if pass_shapes else True,
    )


# --- rank runners ------------------------------------------------------------------------


class CallReport(NamedTuple):
    """What one rank saw: its output (a list for ``all_gather_list``), its input's
    gradient, or the error it raised (class name, message, blamed ranks)."""

    output: Any
    grad: torch.Tensor | None
    error: tuple[str, str, tuple[int, ...]] | None


def function_of(impl: str, collective: str) -> Callable[..., Any]:
    """The callable ``impl`` names: ``MODULE:ATTR``, or ``MODULE`` (its ``collective``),
    imported by the kit's one importer (``runner.load_callable``)."""
    ref = impl if ":" in impl else f"{impl}:{collective}"
    fn = load_callable(ref)
    assert callable(fn)  # load_callable refuses what is not
    return fn


def _function(case: Case) -> Callable[..., Any]:
    return function_of(case.impl, case.collective)


def call_values(case: Case, x: torch.Tensor, r: int, group: Any) -> dict[str, object]:
    """The names a call template of ``case.collective`` may use, bound for group rank
    ``r`` (``FAMILY_NAMES``)."""
    from .calls import group_object

    group = group_object(group)
    if isinstance(case, ReduceScatterCase):
        out = torch.empty(output_shapes(case)[r], dtype=x.dtype, device=x.device)
        return {"x": x, "sizes": list(case.sizes), "dim": case.dim, "group": group, "out": out}
    if isinstance(case, AllToAllCase):
        recv = recv_of(case, r) if case.pass_recv else None
        send = list(case.send[r])
        out = torch.empty(output_shapes(case)[r], dtype=x.dtype, device=x.device)
        return {
            "x": x,
            "send_sizes": send,
            "recv_sizes": recv,
            "dim": case.dim,
            "cat_dim": case.cat_dim,
            "group": group,
            "out": out,
        }
    shapes = [list(s) for s in case.shapes] if case.pass_shapes else None
    return {"x": x, "shapes": shapes, "group": group, "grad": case.grad}


def _group_of(ctx: RankContext, case: Case) -> tuple[Any, int | None]:
    """The ``group=`` to pass and this rank's group rank (``None``: not a member)."""
    if case.group is None:
        return None, ctx.rank
    group = ctx.subgroup(case.group)
    return group, (case.group.index(ctx.rank) if ctx.rank in case.group else None)


def _call(case: Case, x: torch.Tensor, r: int, group: Any, timeout: float | None) -> Any:
    fn = _function(case)
    if case.call is not None:  # a fork called as it is (``calls.parse_call``)
        from .calls import parse_call

        args, kwargs = parse_call(case.call, FAMILY_NAMES[case.collective]).build(
            call_values(case, x, r, group)
        )
        return fn(*args, **kwargs)
    if isinstance(case, ReduceScatterCase):
        return fn(
            x, list(case.sizes), case.dim, group=group, validate=case.validate, timeout=timeout
        )
    if isinstance(case, AllToAllCase):
        recv = recv_of(case, r) if case.pass_recv else None
        joined = {} if case.cat_dim is None else {"cat_dim": case.cat_dim}
        return fn(
            x,
            list(case.send[r]),
            case.dim,
            recv_sizes=recv,
            group=group,
            validate=case.validate,
            timeout=timeout,
            **joined,
        )
    shapes = [list(s) for s in case.shapes] if case.pass_shapes else None
    return fn(
        x, shapes=shapes, group=group, grad=case.grad, validate=case.validate, timeout=timeout
    )


def emulation(backend: str | None) -> None:
    """Emulate ``backend`` in this rank (``vargather.testing.emulate``), or stop
    emulating where an earlier case did (a rank pool serves both)."""
    if backend is not None or f"{__package__}.emulate" in sys.modules:
        from .emulate import activate

        activate(backend)


def run_case(ctx: RankContext, case: Case) -> CallReport | None:
    """Rank side: build this rank's input, call, backward with this rank's upstream
    gradient. ``None`` on a rank outside the case's group."""
    emulation(case.emulate)
    group, r = _group_of(ctx, case)
    if r is None:
        return None
    x = inputs_of(case)[r]
    grad_wanted = _differentiable(case)
    if grad_wanted:
        x.requires_grad_(True)
    try:
        out = _call(case, x, r, group, CALL_TIMEOUT)
        if grad_wanted:
            up = upstream_of(case)[r]
            if isinstance(out, (list, tuple)):
                torch.autograd.backward(list(out), list(up))
            else:
                out.backward(up)
        # Waiting for an async result is part of the call (its errors are the call's).
        if isinstance(out, (list, tuple)):
            return CallReport([_settled(o) for o in out], _settled(x.grad), None)
        return CallReport(_settled(out), _settled(x.grad), None)
    except Exception as err:
        return CallReport(
            None, None, (type(err).__name__, str(err), tuple(getattr(err, "ranks", ())))
        )


def _settled(t: Any) -> Any:
    """``t`` detached, and waited for when it is torch's ``AsyncCollectiveTensor`` (a
    functional collective's result: its view ops, ``detach`` included, do not wait,
    so its bytes would be read before the collective wrote them)."""
    if not isinstance(t, torch.Tensor):
        return t
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if isinstance(t, AsyncCollectiveTensor):
        return t.wait().detach()
    return t.detach()


# --- the judge ---------------------------------------------------------------------------


_ASPECTS = {"forward": "output", "raised": "call"}
"""The judge's words for the family's checks, as the kit's ``Failure`` spells them."""


def failed(
    name: str, aspect: str, ranks: Sequence[int], message: str, *, nan_payload: bool = False
) -> Failure:
    """A ``Failure`` of collective ``name``: ``raised`` (an exception, the ``call``
    aspect) is an error; ``forward`` (the ``output``), ``gradient``, ``adjoint`` and
    ``misuse`` are mismatches (``nan_payload``: in the payload bits of NaNs only)."""
    kind = "error" if aspect == "raised" else "mismatch"
    return Failure(
        _ASPECTS.get(aspect, aspect),
        kind,
        message,
        tuple(ranks),
        call=name,
        property=name,
        nan_payload=nan_payload,
    )


def _reduced_difference(
    name: str, aspect: str, rank: int, got: object, want: torch.Tensor
) -> Failure | None:
    """The failure of a reduction's result ``got`` against the oracle's ``want``, if
    they differ; marked ``nan_payload`` when only the payloads of NaNs differ."""
    d = _differs(got, want)
    if d is None:
        return None
    payload = isinstance(got, torch.Tensor) and nan_payloads_only(got, want)
    text = f"NaN payloads differ where both hold a NaN: {d}" if payload else d
    return failed(name, aspect, (rank,), text, nan_payload=payload)


def sized(failures: list[Failure], group_size: int) -> list[Failure]:
    return [replace(f, group_size=group_size) for f in failures]


def _expected(case: Case) -> tuple[list[Any], list[torch.Tensor] | None]:
    xs = inputs_of(case)
    up = upstream_of(case)
    grads: list[torch.Tensor] | None = None
    if isinstance(case, ReduceScatterCase):
        out: list[Any] = oracle.expected_reduce_scatter(xs, case.sizes, case.dim)
        if _differentiable(case):
            grads = oracle.expected_reduce_scatter_grads(xs, case.sizes, up, case.dim)
    elif isinstance(case, AllToAllCase):
        out = oracle.expected_all_to_all(xs, case.send, case.dim, case.cat_dim)
        if _differentiable(case):
            grads = oracle.expected_all_to_all_grads(xs, case.send, up, case.dim, case.cat_dim)
    else:
        gathered = oracle.expected_gather_list(xs)
        out = [gathered for _ in xs]
        if _differentiable(case):
            grads = oracle.expected_gather_list_grads(xs, up, case.grad)
    return out, grads


def _differs(got: object, want: torch.Tensor) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    return bitwise_difference(got, want)


def _dot(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.detach().to(torch.int64) * b.detach().to(torch.int64)).sum())


def judge_case(case: Case, reports: Sequence[CallReport | None]) -> list[Failure]:
    """The members' reports against the oracle: forward and gradient bit for bit, and
    (integer values) the adjoint identity of the gradient."""
    name = case.collective
    mine = [rep for rep in reports if rep is not None]
    raised = [(r, rep.error) for r, rep in enumerate(mine) if rep.error is not None]
    if raised:  # rep.error is a (class name, message, ranks) triple
        return sized(
            [
                failed(
                    name,
                    "raised",
                    tuple(r for r, _ in raised),
                    "; ".join(f"rank {r}: {e[0]}: {without_addresses(e[1])}" for r, e in raised),
                )
            ],
            len(mine),
        )
    want, want_grads = _expected(case)
    failures: list[Failure] = []
    for r, rep in enumerate(mine):
        got = rep.output
        if isinstance(case, GatherListCase):
            if not isinstance(got, list) or len(got) != len(want[r]):
                failures.append(
                    failed(
                        name,
                        "forward",
                        (r,),
                        f"expected a list of {len(want[r])} tensors, got {type(got).__name__}",
                    )
                )
                continue
            diffs = [(k, _differs(g, w)) for k, (g, w) in enumerate(zip(got, want[r], strict=True))]
            bad = [f"entry {k}: {d}" for k, d in diffs if d is not None]
            if bad:
                failures.append(failed(name, "forward", (r,), "; ".join(bad)))
        elif isinstance(case, ReduceScatterCase):  # a reduction: its NaNs' payloads apart
            found = _reduced_difference(name, "forward", r, got, want[r])
            if found is not None:
                failures.append(found)
        else:
            d = _differs(got, want[r])
            if d is not None:
                failures.append(failed(name, "forward", (r,), d))
        if want_grads is not None:
            if rep.grad is None:
                failures.append(failed(name, "gradient", (r,), "expected a gradient, got None"))
            elif isinstance(case, GatherListCase) and case.grad != "local":  # a reduction
                found = _reduced_difference(name, "gradient", r, rep.grad, want_grads[r])
                if found is not None:
                    failures.append(found)
            else:
                d = bitwise_difference(rep.grad, want_grads[r])
                if d is not None:
                    failures.append(failed(name, "gradient", (r,), d))
    if (
        want_grads is not None
        and not case.special
        and not case.dtype.startswith("complex")
        and not failures
    ):
        xs, up = inputs_of(case), upstream_of(case)
        if isinstance(case, GatherListCase):
            if case.grad == "sum":
                lhs = sum(
                    _dot(o, g) for j in range(len(xs)) for o, g in zip(want[j], up[j], strict=True)
                )
                rhs = sum(
                    _dot(x, rep.grad)
                    for x, rep in zip(xs, mine, strict=True)
                    if rep.grad is not None
                )
            else:
                lhs = rhs = 0
        else:
            lhs = sum(_dot(w, g) for w, g in zip(want, up, strict=True))
            rhs = sum(
                _dot(x, rep.grad) for x, rep in zip(xs, mine, strict=True) if rep.grad is not None
            )
        if lhs != rhs:
            failures.append(
                failed(
                    name,
                    "adjoint",
                    (),
                    f"expected sum_r <y_r, g_r> == sum_j <x_j, dx_j>, got {lhs} != {rhs}",
                )
            )
    return sized(failures, len(mine))


def check_case(pool: RankPool, case: Case) -> list[Failure]:
    """The property: run ``case`` on ``pool`` (``case.world_size`` ranks) and judge it."""
    return judge_case(case, pool.run(run_case, case))


# --- call sequences ----------------------------------------------------------------------


def run_sequence(ctx: RankContext, cases: tuple[Case, ...]) -> list[CallReport | None]:
    """Rank side: the cases one after the other on the same world."""
    return [run_case(ctx, case) for case in cases]


def check_sequence(pool: RankPool, cases: Sequence[Case]) -> list[Failure]:
    """The call-sequence property: each call of a mixed sequence on one world (the
    fused round's state and the groups' sequence numbers carried from call to call)
    judged as if it ran alone."""
    per_rank = pool.run(run_sequence, tuple(cases))
    failures: list[Failure] = []
    for i, case in enumerate(cases):
        for f in judge_case(case, [reports[i] for reports in per_rank]):
            failures.append(replace(f, message=f"call #{i}: {f.message}"))
    return failures


@st.composite
def call_sequences(draw: Any, world_size: int = 3, max_calls: int = 6, most: int = 4) -> list[Case]:
    """Mixed sequences of the three collectives on one world of ``world_size``."""
    one = st.one_of(
        reduce_scatter_cases(world_sizes=(world_size,), most=most),
        all_to_all_cases(world_sizes=(world_size,), most=most),
        gather_list_cases(world_sizes=(world_size,), most=most),
    )
    cases: list[Case] = draw(st.lists(one, min_size=2, max_size=max_calls))
    return cases


@st.composite
def changing_sizes_sequences(
    draw: Any, world_size: int = 3, max_calls: int = 8, most: int = 4
) -> list[AllToAllCase]:
    """``all_to_all_v`` calls on one world whose send sizes change from call to call
    while the rest stays (dtype, the other dimensions, ``dim``, the gradient): each
    call, each rank keeps its sizes, moves a row from one block to another, or draws
    new ones (its length changes); validated, receive sizes unknown, usually cut along
    the first dimension. What MoE dispatch does every layer, and the calls that
    ``all_to_all_v`` answers by its learned round with new sizes (the full path where
    a block outgrows its slot)."""
    base = draw(
        all_to_all_cases(world_sizes=(world_size,), subgroups=False, most=most, joined=False)
    )
    dim = 0 if draw(st.booleans()) else base.dim
    base = replace(base, dim=dim, pass_recv=False, validate=True)
    w = world_size
    send = [list(row) for row in base.send]
    cases = [base]
    for _ in range(draw(st.integers(1, max_calls - 1))):
        for r in range(w):
            how = draw(st.sampled_from(("same", "move", "new")))
            if how == "move" and sum(send[r]):
                src = draw(st.sampled_from([k for k in range(w) if send[r][k]]))
                dst = draw(st.integers(0, w - 1))
                send[r][src] -= 1
                send[r][dst] += 1
            elif how == "new":
                send[r] = draw(st.lists(st.integers(0, most), min_size=w, max_size=w))
        sizes = tuple(tuple(row) for row in send)
        cases.append(replace(base, send=sizes, seed=draw(st.integers(0, 2**16))))
    return cases

"""Transports, fast paths and backward paths, on real gloo worlds (the pool).

What the property suite does not check: *how* a gather moves its data. Each rank
spies on the ``torch.distributed`` collectives vargather calls (by wrapping them in
the rank) and reports every call with the storage addresses of its tensors, so the
tests can assert:

* equal sizes with a leading ``dim`` pad nothing and copy nothing: the send buffer
  is the input itself and the receive buffer is the result;
* caller-known ``sizes`` with ``validate=False`` skip the metadata exchange;
* (with the fused round's payload off: ``tests/test_fused.py`` covers it) the ``auto``
  policy's collectives;
* a one-rank world issues no collective at all;
* every transport's backward (both branches of the copy-free transports' backward)
  agrees with the oracle bit for bit, under upstream gradients that differ per rank,
  and never all-reduces the whole gradient; ``local`` communicates nothing;
* the ``views`` transport (NCCL-only) builds the right views, checked on gloo with an
  uneven list all_gather emulated by broadcasts;
* the ``auto`` policy and ``unsupported_reason``.

Shard values are small integers, so every sum is exact in any order and gradients
compare bit for bit (``mean`` divides by W: compared bit for bit at W = 2, closely at
W = 3).
"""

from __future__ import annotations

import contextlib
import math
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
import torch.distributed as dist

import vargather
import vargather._choices as choices_module
import vargather._comm as comm_module
import vargather._fused as fused_module
import vargather._round_state as round_state_module
import vargather._transport as transport_module
from vargather import oracle
from vargather._buffers import rank_major_gradient, scatter_into_padded
from vargather._choices import unsupported_reason
from vargather._layout import Layout
from vargather._transport import (
    GLOO_SMALL_BYTES,
    NCCL_SMALL_BYTES,
    TRANSPORTS,
    alltoallv_rounds,
    auto_transport_name,
)
from vargather.testing import RankContext, assert_bitwise_equal, get_pool

pytestmark = pytest.mark.multirank

# Every collective vargather could call, as torch.distributed names it.
_SPIED: tuple[str, ...] = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "batch_isend_irecv",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "send",
)


@dataclass(frozen=True)
class Call:
    """One collective call seen by the spy: its name and the storage address (data_ptr)
    of each tensor argument, lists flattened, in argument order."""

    name: str
    ptrs: tuple[int, ...]


def _ptrs(values: Sequence[object]) -> tuple[int, ...]:
    out: list[int] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v.data_ptr())
        elif isinstance(v, (list, tuple)):
            out.extend(t.data_ptr() for t in v if isinstance(t, torch.Tensor))
            # batch_isend_irecv's operations: the tensor each sends or receives into
            out.extend(op.tensor.data_ptr() for op in v if isinstance(op, dist.P2POp))
    return tuple(out)


@contextlib.contextmanager
def spy() -> Iterator[list[Call]]:
    """Record every torch.distributed collective called while the block runs, and
    each alltoallv vargather runs (``_comm._alltoallv``, as one ``"all_to_all_single"``),
    each batch of point-to-point operations vargather posts (``_comm._post``, as one
    ``"send/recv"`` with every tensor it sends or receives into: on gloo it posts them
    on the process group itself, which no module attribute sees; elsewhere through the
    one ``batch_isend_irecv`` recorded inside it, not recorded twice).

    vargather looks collectives up on the ``torch.distributed`` module at call time, so
    wrapping the module attributes sees them all (torch's internal calls between its
    own functions do not go through these attributes and are not counted).
    """
    calls: list[Call] = []
    originals: dict[str, Callable[..., Any]] = {}
    posting = [False]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not posting[0]:
                calls.append(Call(name, _ptrs([*args, *kwargs.values()])))
            return fn(*args, **kwargs)

        return wrapper

    post = comm_module._post

    def posted(posts: Sequence[tuple[bool, torch.Tensor, int, int]], info: Any) -> Any:
        calls.append(Call("send/recv", tuple(t.data_ptr() for _, t, _, _ in posts)))
        posting[0] = True
        try:
            return post(posts, info)
        finally:
            posting[0] = False

    alltoallv = comm_module._alltoallv

    def alltoallv_seen(out: torch.Tensor, inp: torch.Tensor, *args: Any) -> None:
        # On gloo vargather calls the process group's own alltoallv, which no module
        # attribute sees: recorded as the all_to_all_single it stands for, once.
        calls.append(Call("all_to_all_single", (out.data_ptr(), inp.data_ptr())))
        posting[0] = True
        try:
            alltoallv(out, inp, *args)
        finally:
            posting[0] = False

    comm_module._post = posted  # the spies, restored below
    comm_module._alltoallv = alltoallv_seen

    for name in _SPIED:
        fn = getattr(dist, name, None)
        if fn is not None:
            originals[name] = fn
            setattr(dist, name, wrap(name, fn))
    try:
        yield calls
    finally:
        comm_module._post = post
        comm_module._alltoallv = alltoallv
        for name, fn in originals.items():
            setattr(dist, name, fn)


# --- one gather on every rank --------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One gather: shard r has ``shape`` with ``shape[dim]`` replaced by ``sizes[r]``."""

    sizes: tuple[int, ...]
    shape: tuple[int, ...] = (2, 3, 4)
    dim: int = 0
    dtype: str = "float32"
    transport: str = "auto"
    grad: str = "sum"
    backward: bool = True
    known_sizes: bool = False
    validate: bool = True
    group_ranks: tuple[int, ...] | None = None  # a subgroup of the world (sorted)
    overrides: dict[str, int] = field(default_factory=dict)  # _transport constants
    emulate_views: bool = False  # run `views` on gloo through an emulated list gather
    # The payload may ride in the fused round (tests/test_fused.py); off here, where the
    # tests look at the transports themselves (the round is then headers only).
    fused: bool = False

    def shard_shape(self, r: int) -> tuple[int, ...]:
        shape = list(self.shape)
        shape[self.dim] = self.sizes[r]
        return tuple(shape)

    def shard(self, r: int) -> torch.Tensor:
        n = math.prod(self.shard_shape(r))
        values = (torch.arange(n, dtype=torch.float64) * 7 + 13 * r) % 23 - 11
        return values.to(getattr(torch, self.dtype)).reshape(self.shard_shape(r))

    def upstream(self, r: int, shape: Sequence[int]) -> torch.Tensor:
        n = math.prod(shape)
        values = (torch.arange(n, dtype=torch.float64) * (3 + 2 * r) + r) % 17 - 8
        return values.to(getattr(torch, self.dtype)).reshape(tuple(shape))


@dataclass(frozen=True)
class Outcome:
    """What one rank saw."""

    output: torch.Tensor
    grad: torch.Tensor | None
    forward: tuple[Call, ...]
    backward: tuple[Call, ...]
    output_ptr: int
    input_ptr: int
    input_is_output: bool


def _emulated_list_gather(outputs: Sequence[torch.Tensor], local: torch.Tensor, info: Any) -> None:
    """What NCCL's uneven ``all_gather(list, t)`` does, with gloo broadcasts."""
    assert outputs[info.rank].data_ptr() == local.data_ptr(), "local is not outputs[rank]"
    for r, out in enumerate(outputs):
        if out.numel():
            src = r if info.group is None else dist.get_global_rank(info.group, r)
            dist.broadcast(out, src=src, group=info.group)


def run_case(ctx: RankContext, case: Case) -> Outcome | None:
    """Rank side: one gather (and its backward), with the collectives spied on."""
    group = None
    rank = ctx.rank
    if case.group_ranks is not None:
        g = ctx.subgroup(case.group_ranks)
        if ctx.rank not in case.group_ranks:
            return None
        assert isinstance(g, dist.ProcessGroup)
        group = g
        rank = case.group_ranks.index(ctx.rank)
    x = case.shard(rank)
    if case.backward:
        x.requires_grad_(True)
    saved = {name: getattr(transport_module, name) for name in case.overrides}
    patched = dict(case.overrides)
    with contextlib.ExitStack() as stack:
        for name, value in patched.items():
            setattr(transport_module, name, value)
        stack.callback(lambda: [setattr(transport_module, k, v) for k, v in saved.items()])
        if not case.fused:
            for module in (fused_module, round_state_module):  # the round and its state rule
                stack.callback(setattr, module, "FUSED_MAX_BYTES", module.FUSED_MAX_BYTES)
                module.FUSED_MAX_BYTES = 0  # type: ignore[misc]  # the fused path off
            # and the wide round: no group goes wide, none left wide by an earlier test
            stack.callback(
                setattr, round_state_module, "WIDE_MIN_BYTES", round_state_module.WIDE_MIN_BYTES
            )
            round_state_module.WIDE_MIN_BYTES = 1 << 62  # type: ignore[misc]  # the wide round off
            round_state_module.replace_state(
                group, "all_gather_v", wide=(), wide_idle=0, wide_max=()
            )
        if case.emulate_views:
            original = transport_module.all_gather_list
            transport_module.all_gather_list = _emulated_list_gather  # type: ignore[assignment]
            stack.callback(setattr, transport_module, "all_gather_list", original)
            # and let `views` past the API's refusal on gloo
            refusals = choices_module._REFUSED
            choices_module._REFUSED = {}  # type: ignore[misc]
            stack.callback(setattr, choices_module, "_REFUSED", refusals)
        with spy() as forward:
            out = vargather.all_gather_v(
                x,
                case.dim,
                sizes=list(case.sizes) if case.known_sizes else None,
                group=group,
                grad=case.grad,  # type: ignore[arg-type]
                transport=case.transport,  # type: ignore[arg-type]
                validate=case.validate,
            )
        grad = None
        with spy() as backward:
            if case.backward:
                out.backward(case.upstream(rank, out.shape))
                grad = x.grad
    return Outcome(
        output=out.detach().clone(),
        grad=None if grad is None else grad.clone(),
        forward=tuple(forward),
        backward=tuple(backward),
        output_ptr=out.data_ptr(),
        input_ptr=x.data_ptr(),
        input_is_output=out is x,
    )


def run(case: Case, world: int) -> list[Outcome]:
    results = get_pool(world).run(run_case, case)
    return [r for r in results if r is not None]


def check_against_oracle(case: Case, outcomes: Sequence[Outcome], *, exact_grads: bool) -> None:
    world = len(case.sizes)
    assert len(outcomes) == world
    shards = [case.shard(r) for r in range(world)]
    want = oracle.expected_output(shards, case.dim)
    for r, o in enumerate(outcomes):
        assert_bitwise_equal(o.output, want, f"rank {r}: output")
    if not case.backward:
        return
    upstream = [case.upstream(r, want.shape) for r in range(world)]
    grads = oracle.expected_input_grads(shards, upstream, case.dim, case.grad)
    for r, o in enumerate(outcomes):
        assert o.grad is not None, f"rank {r}: no gradient"
        if exact_grads:
            assert_bitwise_equal(o.grad, grads[r], f"rank {r}: grad")
        else:
            torch.testing.assert_close(o.grad, grads[r], rtol=1e-6, atol=1e-6)


def names(calls: Sequence[Call]) -> list[str]:
    return [c.name for c in calls]


# --- fast paths ------------------------------------------------------------------------------


def test_even_padded_leading_dim_sends_the_input_and_receives_the_result() -> None:
    """Equal sizes, dim 0: no padding copy, no compaction copy."""
    case = Case(sizes=(3, 3, 3), transport="padded", known_sizes=True, validate=False)
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)
    for r, o in enumerate(outcomes):
        (gather,) = o.forward
        assert gather.name in ("all_gather_single", "all_gather_into_tensor"), o.forward
        output_ptr, input_ptr = gather.ptrs
        assert input_ptr == o.input_ptr, f"rank {r}: the input was copied before sending"
        assert output_ptr == o.output_ptr, f"rank {r}: the result is a copy of the buffer"


@pytest.mark.parametrize("transport", ["broadcast", "auto"])
def test_even_broadcast_receives_straight_into_the_result(transport: str) -> None:
    """The copy-free transport: every broadcast targets a view of the result itself.

    ``auto`` picks ``broadcast`` above ``GLOO_SMALL_BYTES`` (forced low here)."""
    case = Case(
        sizes=(2, 2, 2),
        shape=(2, 5),
        transport=transport,
        overrides={"GLOO_SMALL_BYTES": 0},
    )
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)
    row_bytes = 5 * 4
    for r, o in enumerate(outcomes):
        broadcasts = [c for c in o.forward if c.name == "broadcast"]
        assert len(broadcasts) == 3, o.forward
        assert [c.ptrs[0] for c in broadcasts] == [
            o.output_ptr + 2 * s * row_bytes for s in range(3)
        ], f"rank {r}: a broadcast did not land in the result"


def test_auto_small_even_is_one_plain_all_gather() -> None:
    case = Case(sizes=(4, 4), shape=(4, 3))
    outcomes = run(case, 2)
    check_against_oracle(case, outcomes, exact_grads=True)
    for o in outcomes:
        # the metadata exchange, then the payload: both one equal all_gather
        assert len(o.forward) == 2
        assert o.forward[1].ptrs == (o.output_ptr, o.input_ptr)


def test_auto_small_uneven_is_one_alltoallv() -> None:
    case = Case(sizes=(4, 1, 0), shape=(4, 3))
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)
    for o in outcomes:
        assert names(o.forward)[1:] == ["all_to_all_single"]
        assert o.forward[1].ptrs[0] == o.output_ptr  # rank-major buffer is the result


@pytest.mark.parametrize("transport", ["padded", "alltoallv", "broadcast"])
@pytest.mark.parametrize("validate", [False, True])
def test_known_sizes_without_validation_skip_the_exchange(transport: str, validate: bool) -> None:
    case = Case(
        sizes=(2, 0, 3), transport=transport, known_sizes=True, validate=validate, backward=False
    )
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)
    payload = {
        # torch 2.13's name; earlier releases have only all_gather_into_tensor
        "padded": [comm_module._all_gather_single().__name__],
        "alltoallv": ["all_to_all_single"],
        "broadcast": ["broadcast", "broadcast"],  # the empty rank sends nothing
    }[transport]
    exchange = ["send/recv"] if validate else []  # the round: direct sends on gloo
    for o in outcomes:
        assert names(o.forward) == exchange + payload


@pytest.mark.parametrize("transport", ["broadcast", "alltoallv", "padded"])
def test_a_dtype_gloo_refuses_travels_as_bytes(transport: str) -> None:
    """gloo refuses int16 ("Invalid scalar type"); the transports move its bytes."""
    case = Case(sizes=(2, 0, 3), dim=1, dtype="int16", transport=transport, backward=False)
    check_against_oracle(case, run(case, 3), exact_grads=True)


def test_one_rank_world_is_the_identity_without_a_collective() -> None:
    case = Case(sizes=(3,), group_ranks=(1,), transport="auto")
    (o,) = run(case, 2)
    assert o.forward == ()
    assert o.backward == ()
    assert o.input_is_output, "a one-rank gather must return its input"
    check_against_oracle(case, [o], exact_grads=True)


# --- backward paths ----------------------------------------------------------------------------

BACKWARD_COLLECTIVE = {
    "padded": ["reduce_scatter_single"],
    "alltoallv": ["all_to_all_single"],  # times alltoallv_rounds
    "broadcast-small": ["all_to_all_single"],  # one round fits in 2x the output
    "broadcast-skewed": ["all_reduce"],  # small, but alltoallv would need rounds
    "broadcast-large": ["reduce_scatter"],
}


@pytest.mark.parametrize("contract", ["sum", "mean", "local"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("path", sorted(BACKWARD_COLLECTIVE))
@pytest.mark.parametrize("world", [2, 3])
def test_backward_path_matches_the_oracle(path: str, dim: int, contract: str, world: int) -> None:
    transport, _, branch = path.partition("-")
    overrides = {"GLOO_REDUCE_SCATTER_MIN_BYTES": 0} if branch == "large" else {}
    if branch == "small":
        sizes = (3, 2, 3) if world == 3 else (3, 2)
    else:
        sizes = (4, 0, 3) if world == 3 else (0, 5)
    assert (alltoallv_rounds(layout(sizes)) == 1) == (branch == "small")
    case = Case(
        sizes=sizes,
        shape=(3, 2, 4) if dim == 0 else (2, 3, 4),
        dim=dim,
        transport=transport,
        grad=contract,
        overrides=overrides,
    )
    outcomes = run(case, world)
    check_against_oracle(case, outcomes, exact_grads=contract != "mean" or world == 2)
    want = [] if contract == "local" else BACKWARD_COLLECTIVE[path]
    if path == "alltoallv" and want:  # in rounds when one would take too much memory
        want = want * alltoallv_rounds(layout(sizes))
        assert len(want) > 1
    for r, o in enumerate(outcomes):
        got = names(o.backward)
        if got == ["reduce_scatter_tensor"]:  # torch without reduce_scatter_single
            got = ["reduce_scatter_single"]
        assert got == want, f"rank {r}: backward called {got}, expected {want}"


@pytest.mark.parametrize("dtype", ["float64", "bfloat16", "float16", "complex64"])
@pytest.mark.parametrize(
    "path", ["broadcast-small", "broadcast-skewed", "broadcast-large", "alltoallv", "padded"]
)
def test_backward_paths_carry_every_float_dtype(path: str, dtype: str) -> None:
    transport, _, branch = path.partition("-")
    overrides = {"GLOO_REDUCE_SCATTER_MIN_BYTES": 0} if branch == "large" else {}
    sizes = (3, 2, 3) if branch == "small" else (3, 0, 2)
    case = Case(sizes=sizes, dtype=dtype, transport=transport, overrides=overrides)
    check_against_oracle(case, run(case, 3), exact_grads=True)


def test_broadcast_on_a_subgroup_maps_group_ranks_to_global_sources() -> None:
    case = Case(sizes=(2, 3), group_ranks=(1, 2), transport="broadcast", dim=1)
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)


# --- views (NCCL) -------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1])
def test_views_transport_builds_one_buffer_of_rank_major_views(dim: int) -> None:
    """``views`` on gloo, its uneven list all_gather emulated by broadcasts (NCCL does
    the same internally): the list holds views into one buffer, ``local`` is this
    rank's own view, and the result (and backward) match the oracle."""
    case = Case(
        sizes=(3, 0, 2),
        shape=(3, 2, 4) if dim == 0 else (2, 3, 4),
        dim=dim,
        transport="views",
        emulate_views=True,
        known_sizes=True,
        validate=False,
        overrides={"GLOO_REDUCE_SCATTER_MIN_BYTES": 0},
    )
    outcomes = run(case, 3)
    check_against_oracle(case, outcomes, exact_grads=True)
    block = 2 * 4 * 4  # bytes per unit of n: pre * post * itemsize (2 * 4 * 4 either way)
    for o in outcomes:
        broadcasts = [c.ptrs[0] for c in o.forward if c.name == "broadcast"]
        assert len(broadcasts) == 2
        offsets = [b - broadcasts[0] for b in broadcasts]
        assert offsets == [0, 3 * block], "views are not rank-major in one buffer"
        if dim == 0:
            assert broadcasts[0] == o.output_ptr
        assert names(o.backward) == ["reduce_scatter"]


def test_forcing_views_on_gloo_raises_the_same_error_on_every_rank() -> None:
    outcomes = get_pool(2).run_outcomes(
        run_case, Case(sizes=(2, 2), transport="views", backward=False)
    )
    messages = {str(o.exception) for o in outcomes}
    assert all(isinstance(o.exception, vargather.ArgumentError) for o in outcomes), outcomes
    assert len(messages) == 1
    assert "transport='broadcast'" in messages.pop()


# --- pure pieces -----------------------------------------------------------------------------


def layout(sizes: Sequence[int], *, post: int = 1, dtype: torch.dtype = torch.float32) -> Layout:
    return Layout(
        sizes=tuple(sizes),
        dim=0,
        leading_shape=(),
        trailing_shape=(post,),
        dtype=dtype,
        rank=0,
        world_size=len(sizes),
    )


def test_unsupported_reason() -> None:
    reason = unsupported_reason("views", "gloo")
    assert reason is not None
    assert "gloo" in reason
    assert "transport='broadcast'" in reason
    for name in TRANSPORTS:
        assert unsupported_reason(name, "nccl") is None
        if name != "views":
            assert unsupported_reason(name, "gloo") is None


def test_every_transport_name_but_auto_names_a_registered_transport() -> None:
    """One source for the names: ``TransportName``'s values are ``auto`` and the keys
    of ``TRANSPORTS``, each transport registered under its own ``name``."""
    assert typing.get_args(vargather.TransportName) == vargather.TRANSPORT_NAMES
    assert ("auto", *TRANSPORTS) == vargather.TRANSPORT_NAMES
    assert all(t.name == name for name, t in TRANSPORTS.items())
    assert typing.get_args(vargather.GradContract) == vargather.CONTRACTS


def test_auto_policy() -> None:
    big_rows = GLOO_SMALL_BYTES // 4 + 1
    small_even, small_uneven = layout([5, 5]), layout([5, 1])
    big_even, big_uneven = layout([big_rows] * 2), layout([big_rows, 1])
    assert big_even.nbytes >= GLOO_SMALL_BYTES > small_uneven.nbytes
    assert auto_transport_name(small_even, "gloo") == "padded"
    assert auto_transport_name(small_uneven, "gloo") == "alltoallv"
    assert auto_transport_name(big_even, "gloo") == "broadcast"
    assert auto_transport_name(big_uneven, "gloo") == "broadcast"

    nccl_rows = NCCL_SMALL_BYTES // 4
    assert auto_transport_name(layout([nccl_rows] * 4), "nccl") == "padded"
    assert auto_transport_name(layout([nccl_rows, 1, 1, 1]), "nccl") == "views"
    assert auto_transport_name(layout([nccl_rows, nccl_rows - 1]), "nccl") == "padded"  # waste ~0
    assert auto_transport_name(layout([10, 1, 1, 1]), "nccl") == "padded"  # small
    assert auto_transport_name(big_uneven, "mpi") == "padded"


def test_alltoallv_rounds_bound_the_backward_memory() -> None:
    assert alltoallv_rounds(layout([2, 2, 2, 2])) == 1
    assert alltoallv_rounds(layout([4, 5, 6, 7])) == 1  # mild: 5 x 7 <= 2 x 22
    assert alltoallv_rounds(layout([87, 4, 4, 5])) == 4  # heavy
    assert alltoallv_rounds(layout([0, 5])) == 3
    for sizes in ([87, 4, 4, 5], [1, 0, 1, 0], [0, 5], [9, 1, 0]):
        lay, w = layout(sizes), len(sizes)
        k, m, t = alltoallv_rounds(lay), max(sizes), sum(sizes)
        assert m + (t + w * m) / k <= 2 * t, sizes  # gradient + one round's buffers


def test_gradient_buffers_are_views_when_already_laid_out() -> None:
    even = replace(layout([2, 2, 2], post=3), rank=1)
    g = torch.arange(18.0).reshape(6, 3)
    assert rank_major_gradient(g, even).data_ptr() == g.data_ptr()
    assert scatter_into_padded(g, even).data_ptr() == g.data_ptr()
    uneven = layout([2, 0, 4], post=3)
    flat = rank_major_gradient(g, uneven)
    assert flat.data_ptr() == g.data_ptr()  # pre == 1: rank-major already
    padded = scatter_into_padded(g, uneven)
    assert padded.shape == (3, 1, 4, 3)
    assert torch.equal(padded[2, 0], g[2:6])

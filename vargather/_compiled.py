"""torch.compile support: the gather as ``torch.library`` custom operators.

Where it sits: above the gather's module (``_gather``), whose eager pipeline its
operators run, and below the public face. Eager calls never come here; under
``torch.compile`` (``torch.compiler.is_compiling()``) the face (``_api``) routes each
call to :func:`compiled_gather`, which dynamo traces:

* ``sizes`` given as Python ints (and plain ``grad``/``transport``/``validate``/
  ``timeout`` values): one call of ``vargather::all_gather_v``, no graph break. Its
  eager implementation is the eager pipeline itself (the metadata exchange and its
  validation, the payload in the same fused round when it fits, else the transport),
  opaque to dynamo, so the errors, the checks, the bytes and the collectives are the
  eager ones. Its fake implementation gives the output shape from ``sizes``; its
  autograd formula calls ``vargather::all_gather_v_backward``, the eager backward of
  the chosen contract (one reduce-scatter for ``sum`` and ``mean``, this rank's slice
  for ``local``), so the forward and the backward trace into one graph each.
* ``sizes=None`` where dynamo allows data-dependent output shapes (``fullgraph=True``):
  ``vargather::exchange_sizes`` (the validated exchange, every rank's size as an int64
  tensor) then ``vargather::all_gather_v_sized_by``, whose output length is an
  unbacked symbolic int; no graph break.
* anything else (``sizes`` as a tensor, ``sizes=None`` without ``fullgraph`` or with
  the ``Layout`` asked for, a ``timedelta`` timeout, arguments the eager path would
  refuse): the eager ``all_gather_v`` behind ``torch.compiler.disable``, exactly one
  graph break per call.

Every operator is an ordered effect (``declare_ordered``) and tracing one turns off
inductor's peak-memory reordering (``keep_collective_order``): whatever a compiler
decides from a rank's own shapes, every rank issues the same collectives in the same
order (``docs/compile.md``).

A process group travels into the operator by name (``ProcessGroup.group_name``,
resolved back with ``_resolve_process_group``), as torch's functional collectives do;
the empty name stands for "no torch.distributed" (a one-process world).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ._gather import gather_with_layout, plan_gather
from ._layout import Layout
from ._mesh import group_named, group_of, named_group
from ._reduced import canonical_nans_, mean_
from ._transport import choose_transport

__all__ = [
    "compiled_gather",
    "declare_ordered",
    "keep_collective_order",
    "plain_sizes",
]


def _timeout_of(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """An operator's output must not alias its input and must match the fake's strides."""
    return t.clone(memory_format=torch.contiguous_format)


def declare_ordered(op: Any) -> bool:
    """Declare ``op`` an ordered side effect, so no compiler may drop, merge, reorder or
    recompute it.

    Every operator here runs a collective: whether a rank issues it must not depend on
    anything that can differ between ranks. A pure operator (``mutates_args=()`` and
    nothing else) is a value to the compiler: inductor removes it when nothing reads its
    output, and a zero-element output is never read (a consumer's load from it is a
    no-op), so on the rank whose shard is empty the backward's collective vanished and
    its peers waited for it forever. An ordered effect makes AOT autograd thread a token
    through the operators (``with_effects``): each one consumes the previous one's token
    and produces the next, the last token is a graph output, so every operator is live,
    none equals another (CSE), they run in program order, and the partitioner keeps each
    where it was traced (never recomputed in the backward).

    Returns whether it could (a torch with neither registry compiles them pure).
    """
    register = getattr(op, "register_effect", None)  # CustomOpDef.register_effect, torch 2.13
    if register is not None:
        from torch._library.effects import EffectType

        register(EffectType.ORDERED)
        return True
    try:  # older torch: the same table, private
        from torch._higher_order_ops import effects

        effects._register_effectful_op(op._opoverload, effects._EffectType.ORDERED)
    except (ImportError, AttributeError):
        return False
    return True


# --- the forward operator ----------------------------------------------------------------


def _gather_eagerly(
    x: torch.Tensor,
    dim: int,
    sizes: list[int] | None,
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> tuple[torch.Tensor, Layout]:
    """The eager gather inside an operator: ``_gather.plan_gather`` (exchange + validation, with
    the payload in the same collective when the fused round takes it), else the
    transport; the output is fresh and contiguous, as an operator's must be.

    ``requires_grad`` is whether the caller's ``x`` needed a gradient (inside the
    operator autograd is below us): the metadata exchange compares it across ranks.
    """
    probe = x.detach()
    with torch.enable_grad() if requires_grad else torch.no_grad():
        if requires_grad:
            probe.requires_grad_(True)
        layout, info, fused = plan_gather(
            probe, dim, sizes, group_named(group_name), grad, transport, validate, timeout
        )
    with torch.no_grad():
        if not info.communicates:
            return _contiguous(x), layout
        if layout.total == 0:
            return x.new_empty(layout.output_shape), layout
        if fused is not None:  # the payload rode with the headers: one collective
            out = fused
        else:
            out = choose_transport(transport, layout, info).gather(x, layout, info)
        if (
            out.is_contiguous()
            and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        ):
            return out, layout
        return _contiguous(out), layout


@torch.library.custom_op("vargather::all_gather_v", mutates_args=())
def _all_gather_v_op(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    """The eager gather with every rank's size known to the graph (``sizes``)."""
    out, _ = _gather_eagerly(
        x, dim, list(sizes), group_name, grad, transport, validate, timeout, requires_grad
    )
    return out


@_all_gather_v_op.register_fake
def _all_gather_v_fake(
    x: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim % x.dim()] = sum(sizes)
    return x.new_empty(shape)


# --- the backward operator ---------------------------------------------------------------


def _backward_layout(
    grad_output: torch.Tensor, dim: int, sizes: Sequence[int], rank: int
) -> Layout:
    d = dim % grad_output.dim()
    return Layout(
        sizes=tuple(int(n) for n in sizes),
        dim=d,
        leading_shape=tuple(grad_output.shape[:d]),
        trailing_shape=tuple(grad_output.shape[d + 1 :]),
        dtype=grad_output.dtype,
        rank=rank,
        world_size=len(sizes),
    )


def _backward_eagerly(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """``GatherVFunction.backward`` for a forward that a forward operator validated."""
    info = named_group(group_name, timeout)
    if not info.communicates:
        return _contiguous(grad_output)  # the eager gather is the identity here
    layout = _backward_layout(grad_output, dim, sizes, info.rank)
    with torch.no_grad():
        if layout.total == 0:
            return grad_output.new_zeros(layout.shard_shape(layout.rank))
        if grad == "local":
            return _contiguous(
                grad_output.narrow(layout.dim, layout.local_offset, layout.local_size)
            )
        chosen = choose_transport(transport, layout, info)
        out = chosen.reduce_scatter_sum(grad_output, layout, info)
        if grad == "mean":
            return mean_(out, layout.world_size).contiguous()  # as GatherVFunction's backward
        return canonical_nans_(out).contiguous()


@torch.library.custom_op("vargather::all_gather_v_backward", mutates_args=())
def _all_gather_v_backward_op(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """The backward of ``vargather::all_gather_v``: the contract's eager backward."""
    return _backward_eagerly(grad_output, dim, sizes, group_name, grad, transport, timeout)


@_all_gather_v_backward_op.register_fake
def _all_gather_v_backward_fake(
    grad_output: torch.Tensor,
    dim: int,
    sizes: Sequence[int],
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    group = group_named(group_name)
    rank = dist.get_rank(group) if group is not None else 0
    shape = list(grad_output.shape)
    d = dim % grad_output.dim()
    if group is None or dist.get_world_size(group) == 1:
        return grad_output.new_empty(shape)
    shape[d] = sizes[rank]
    return grad_output.new_empty(shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, dim, sizes, group_name, grad, transport, _validate, timeout, _rg = inputs
    ctx.vargather_args = (dim % x.dim(), list(sizes), group_name, grad, transport, timeout)


def _backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    dx = torch.ops.vargather.all_gather_v_backward(grad_output, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None, None, None)


_all_gather_v_op.register_autograd(_backward, setup_context=_setup_context)
declare_ordered(_all_gather_v_op)
declare_ordered(_all_gather_v_backward_op)


# --- the operators for sizes=None ---------------------------------------------------------
#
# With sizes unknown, the output's length along dim is data that only the metadata
# exchange learns. Two operators, each with one output: ``exchange_sizes`` runs the
# exchange and its validation and returns every rank's size as an int64 tensor;
# ``all_gather_v_sized_by`` moves the payload with those sizes, and its fake
# implementation makes the output's length a fresh unbacked symbolic int
# (``new_dynamic_size``, ``>= 0``), which the graph binds from the real output at run
# time. (One operator with both outputs traces on eager and aot_eager, but torch 2.13's
# inductor loses the unbacked binding of an effectful operator with several outputs:
# ``AssertionError: u3 not in dict_keys([u4])`` in its scheduler.) Its backward takes
# the sizes tensor instead of Python ints; its own output is this rank's shard shape,
# known while tracing.


@torch.library.custom_op("vargather::exchange_sizes", mutates_args=())
def _exchange_sizes_op(
    x: torch.Tensor,
    dim: int,
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    """The metadata exchange and its validation (``_gather.plan_gather``): every rank's size."""
    probe = x.detach()
    with torch.enable_grad() if requires_grad else torch.no_grad():
        if requires_grad:
            probe.requires_grad_(True)
        layout, _, _ = plan_gather(
            probe,
            dim,
            None,
            group_named(group_name),
            grad,
            transport,
            validate,
            timeout,
            layout_only=True,
        )
    return torch.tensor(layout.sizes, dtype=torch.int64)


@_exchange_sizes_op.register_fake
def _exchange_sizes_fake(
    x: torch.Tensor,
    dim: int,
    group_name: str,
    grad: str,
    transport: str,
    validate: bool,
    timeout: float | None,
    requires_grad: bool,
) -> torch.Tensor:
    group = group_named(group_name)
    return torch.empty(1 if group is None else dist.get_world_size(group), dtype=torch.int64)


@torch.library.custom_op("vargather::all_gather_v_sized_by", mutates_args=())
def _all_gather_v_sized_by_op(
    x: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """The payload's transport with the sizes ``exchange_sizes`` validated."""
    out, _ = _gather_eagerly(
        x, dim, sizes.tolist(), group_name, grad, transport, False, timeout, False
    )
    return out


@_all_gather_v_sized_by_op.register_fake
def _all_gather_v_sized_by_fake(
    x: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    shape: list[int | torch.SymInt] = list(x.shape)
    if sizes.numel() > 1:  # one rank: the identity, of x's own length
        shape[dim % x.dim()] = torch.library.get_ctx().new_dynamic_size(min=0)
    return x.new_empty(shape)


@torch.library.custom_op("vargather::all_gather_v_sized_by_backward", mutates_args=())
def _all_gather_v_sized_by_backward_op(
    grad_output: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    local_size: int,
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    """The backward of ``vargather::all_gather_v_sized_by``: the contract's eager
    backward, the sizes read from the tensor."""
    return _backward_eagerly(grad_output, dim, sizes.tolist(), group_name, grad, transport, timeout)


@_all_gather_v_sized_by_backward_op.register_fake
def _all_gather_v_sized_by_backward_fake(
    grad_output: torch.Tensor,
    sizes: torch.Tensor,
    dim: int,
    local_size: int,
    group_name: str,
    grad: str,
    transport: str,
    timeout: float | None,
) -> torch.Tensor:
    shape = list(grad_output.shape)
    shape[dim % grad_output.dim()] = local_size
    return grad_output.new_empty(shape)


def _sized_by_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, sizes, dim, group_name, grad, transport, timeout = inputs
    d = dim % x.dim()
    ctx.save_for_backward(sizes)
    ctx.vargather_args = (d, x.shape[d], group_name, grad, transport, timeout)


def _sized_by_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    (sizes,) = ctx.saved_tensors
    dx = torch.ops.vargather.all_gather_v_sized_by_backward(grad_output, sizes, *ctx.vargather_args)
    return (dx, None, None, None, None, None, None)


_all_gather_v_sized_by_op.register_autograd(
    _sized_by_backward, setup_context=_sized_by_setup_context
)
for _op in (_exchange_sizes_op, _all_gather_v_sized_by_op, _all_gather_v_sized_by_backward_op):
    declare_ordered(_op)


# --- the traced entry point --------------------------------------------------------------


def _constant_of_the_trace(fn: Callable[[], bool]) -> Callable[[], bool]:
    """``torch._dynamo.assume_constant_result(fn)`` without importing dynamo.

    That decorator only marks the function (``fn._dynamo_marked_constant = True``, torch
    2.4 to 2.13) for dynamo to call instead of trace. Importing ``torch._dynamo`` to
    apply it cost ``import vargather`` about a second, in every process, compiled or
    not; ``tests/test_compile.py`` shows dynamo still honours the mark (a graph with no
    break under ``fullgraph=True``) and ``tests/test_import_order.py`` that
    ``import vargather`` leaves dynamo unimported.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]  # dynamo's own marker attribute
    return fn


_PLAIN: dict[str, Callable[..., Any]] = {}
_UNTRACED: dict[str, Callable[..., Any]] = {}


def register_untraced(name: str, fn: Callable[..., Any]) -> None:
    """Declare ``fn`` as an eager call that traced code runs behind
    ``torch.compiler.disable`` (one graph break), through :func:`call_untraced`."""
    _PLAIN[name] = fn


def _make_untraced() -> bool:
    """Every registered function behind ``torch.compiler.disable(fn, recursive=True)``.

    Built the first time a trace needs one (dynamo, importing which costs about a
    second, is loaded by then) rather than at ``import vargather``, which therefore
    leaves dynamo unimported."""
    for name, fn in _PLAIN.items():
        if name not in _UNTRACED:
            _UNTRACED[name] = torch.compiler.disable(fn, recursive=True)  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    return True


# Called by dynamo while tracing (its side effect is the point), not traced.
_untraced_ready = _constant_of_the_trace(_make_untraced)


def call_untraced(name: str, *args: Any, **kwargs: Any) -> Any:
    """Run the registered eager function ``name`` from traced code, untraced."""
    _untraced_ready()
    return _UNTRACED[name](*args, **kwargs)


register_untraced("all_gather_v", gather_with_layout)  # the gather's eager code


def plain_sizes(sizes: object, world_size: int) -> list[int] | None:
    """``sizes`` as a list of ints (or dynamo's symbolic ints) that make a ``Layout``."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) != world_size:
        return None
    out: list[int] = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)) or n < 0:
            return None
        out.append(n)  # type: ignore[arg-type]  # a SymInt stands for an int here
    return out


def _layout_of(x: torch.Tensor, dim: int, sizes: list[int], rank: int, world_size: int) -> Layout:
    """The call's ``Layout``, built while tracing (its sizes symbolic once dynamo has
    made them dynamic)."""
    d = dim % x.dim()
    return Layout(
        sizes=tuple(sizes),
        dim=d,
        leading_shape=tuple(x.shape[:d]),
        trailing_shape=tuple(x.shape[d + 1 :]),
        dtype=x.dtype,
        rank=rank,
        world_size=world_size,
    )


def _unbacked_sizes_allowed() -> bool:
    """Whether the graph being traced may hold an operator whose output shape depends
    on data: dynamo allows it under ``fullgraph=True`` (or with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops``). Without it, a
    ``sizes=None`` call takes the eager path behind one graph break, as before."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode()
    shape_env = None if fake_mode is None else fake_mode.shape_env
    return shape_env is not None and bool(shape_env.allow_dynamic_output_shape_ops)


# Read while tracing, a constant of the trace: dynamo calls it instead of tracing it.
_unbacked_sizes_allowed_here = _constant_of_the_trace(_unbacked_sizes_allowed)


def _keep_collective_order() -> bool:
    """Turn off inductor's peak-memory reordering, which reorders vargather's operators.

    The ordered effect (``_declare_ordered``) makes inductor add a dependency from each
    operator to the one before, but torch 2.13's ``reorder_for_peak_memory`` pass (on
    by default) builds its order from the nodes' unmet dependencies, which those added
    dependencies are not among: two independent gathers of one graph were issued in
    one order on a rank whose buffers were large and the other order on a rank whose
    buffers were small (seen as a ``SizesMismatchError`` on every rank; with
    ``validate=False`` the payloads would have crossed). Called while a vargather
    call is traced, before inductor compiles that graph; a process-wide setting from
    then on (it only changes where buffers are freed, never a result).
    """
    import torch._inductor.config as inductor_config

    inductor_config.reorder_for_peak_memory = False
    return True


# Called by dynamo while tracing (its side effect is the point), not traced.
keep_collective_order = _constant_of_the_trace(_keep_collective_order)


class _RoutedCall(NamedTuple):
    """A call's arguments, of the types an operator takes."""

    x: torch.Tensor
    dim: int
    grad: str
    transport: str
    validate: bool
    seconds: float | None


def _routed_call(
    x: object, dim: object, grad: object, transport: object, validate: object, timeout: object
) -> _RoutedCall | None:
    """The arguments as an operator takes them; ``None`` when only the eager path can
    say what is wrong with them."""
    if not (isinstance(x, torch.Tensor) and x.dim() > 0):
        return None
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        return None
    if not (isinstance(grad, str) and isinstance(transport, str) and isinstance(validate, bool)):
        return None
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        return None
    seconds = None if timeout is None else float(timeout)
    return _RoutedCall(x, dim, grad, transport, validate, seconds)


def compiled_gather(
    x: object,
    dim: object,
    *,
    sizes: object,
    group: object,
    mesh_dim: object,
    grad: object,
    transport: object,
    validate: object,
    timeout: object,
    with_layout: bool,
) -> tuple[torch.Tensor, Layout | None]:
    """``all_gather_v`` (and its ``Layout`` if ``with_layout``) under ``torch.compile``:
    the operator when it can, else the eager call behind one graph break (see the
    module docstring)."""
    call = _routed_call(x, dim, grad, transport, validate, timeout)
    where = group_of(group, mesh_dim) if call is not None else None
    plain = plain_sizes(sizes, where[2]) if where is not None else None
    if call is not None and where is not None:
        keep_collective_order()
        name, rank, world_size = where
        requires_grad = call.x.requires_grad and torch.is_grad_enabled()
        args = (name, call.grad, call.transport, call.validate, call.seconds, requires_grad)
        if plain is not None:
            out = torch.ops.vargather.all_gather_v(call.x, call.dim, plain, *args)
            layout = _layout_of(call.x, call.dim, plain, rank, world_size)
            return out, layout if with_layout else None
        if sizes is None and not with_layout and _unbacked_sizes_allowed_here():
            # The output's length: an unbacked symbolic int.
            found = torch.ops.vargather.exchange_sizes(call.x, call.dim, *args)
            out = torch.ops.vargather.all_gather_v_sized_by(
                call.x, found, call.dim, name, call.grad, call.transport, call.seconds
            )
            return out, None
    result = call_untraced(
        "all_gather_v",
        x,
        dim,
        sizes=sizes,
        group=group,
        mesh_dim=mesh_dim,
        grad=grad,
        transport=transport,
        validate=validate,
        timeout=timeout,
    )
    return result.tensor, result.layout

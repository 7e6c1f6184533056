"""torch.compile support for every collective: its custom operators and its one way in.

Where it sits: below the collectives' modules, above ``_mesh``. Each collective's module
ends with a ``# --- compiled`` block: its operators as :class:`OpSpec` rows registered
by :func:`define_ops` (each an ordered effect: :func:`declare_ordered`), and its
:class:`Route`, the one dispatch its face calls (``docs/compile.md``, "Adding a
collective under torch.compile"). A process group enters an operator by name
(``_mesh.group_of``, back by ``_mesh.named_group``); the empty name stands for "no
torch.distributed".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeGuard, TypeVar

import torch

from ._mesh import group_named, group_of

R = TypeVar("R")


def declare_ordered(op: Any) -> bool:
    """Declare ``op`` an ordered side effect, so no compiler may drop, merge, reorder or
    recompute it (``docs/compile.md``, "Every rank issues the same collectives", says
    why). Returns whether it could (a torch with neither registry compiles them pure).
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


# --- the operators ----------------------------------------------------------------------


@dataclass(frozen=True)
class OpSpec:
    """One custom operator ``vargather::<name>``, as :func:`define_ops` registers it:
    ``impl`` its eager implementation (a fresh, contiguous output: :func:`fresh`),
    ``fake`` its output's shape from the arguments alone, and ``backward`` the operator
    its autograd formula calls with the output's gradient, then ``save(inputs, output)``
    (a list output's missing gradients are zeros; without ``backward``: no gradient).
    """

    name: str
    schema: str
    impl: Callable[..., Any]
    fake: Callable[..., Any]
    backward: str | None = None
    save: Callable[[tuple[Any, ...], Any], tuple[Any, ...]] | None = None


_SAVED = object()  # stands for a saved tensor among ``ctx.vargather_args``


def _autograd(spec: OpSpec) -> tuple[Callable[..., Any], Callable[..., None]]:
    """``spec``'s autograd formula and its ``setup_context`` (:class:`OpSpec`)."""
    assert spec.save is not None, spec.name
    save, backward = spec.save, str(spec.backward)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        args = save(inputs, output)
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        ctx.vargather_args = [_SAVED if isinstance(a, torch.Tensor) else a for a in args]
        ctx.vargather_inputs = len(inputs)
        if isinstance(output, (list, tuple)):
            ctx.vargather_like = [(o.shape, o.dtype, o.device) for o in output]

    def formula(ctx: Any, *grads: Any) -> tuple[torch.Tensor | None, ...]:
        saved = iter(ctx.saved_tensors)
        args = [next(saved) if a is _SAVED else a for a in ctx.vargather_args]
        like = getattr(ctx, "vargather_like", None)
        if like is None:
            (grad,) = grads
        else:  # a list output's gradients arrive as one list (or, in some torch, spread)
            flat = grads[0] if len(grads) == 1 and isinstance(grads[0], (list, tuple)) else grads
            grad = [
                g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                for g, (shape, dtype, device) in zip(flat, like, strict=True)
            ]
        dx = getattr(torch.ops.vargather, backward)(grad, *args)
        return (dx, *[None] * (ctx.vargather_inputs - 1))

    return formula, setup_context


_OPS: dict[str, Any] = {}  # every CustomOpDef by name, kept alive here


def define_ops(*specs: OpSpec) -> None:
    """Register every operator of ``specs`` (``torch.library.custom_op`` with its schema,
    its fake, its autograd formula) as an ordered effect."""
    for spec in specs:
        op = torch.library.custom_op(
            f"vargather::{spec.name}", spec.impl, mutates_args=(), schema=spec.schema
        )
        op.register_fake(spec.fake)
        if spec.backward is not None:
            formula, setup_context = _autograd(spec)
            op.register_autograd(formula, setup_context=setup_context)
        declare_ordered(op)
        _OPS[spec.name] = op


def resized(t: torch.Tensor, *along: tuple[int, int]) -> list[int]:
    """``t``'s shape with size ``n`` along ``d`` for each ``(d, n)`` of ``along``, in
    order (negative ``d`` counted from the end): an operator's output shape."""
    shape = list(t.shape)
    for d, n in along:
        shape[d % t.dim()] = n
    return shape


def fresh(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``out`` as an operator must return it: contiguous, not aliasing its input ``x``."""
    if out.is_contiguous() and (
        out.numel() == 0 or out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    ):
        return out
    return out.clone(memory_format=torch.contiguous_format)


def rank_of(group_name: str) -> int:
    """This rank's place in the group an operator names (for a fake's shape)."""
    group = group_named(group_name)
    return 0 if group is None else torch.distributed.get_rank(group)


# --- constants of the trace ---------------------------------------------------------------


def _constant_of_the_trace(fn: Callable[[], bool]) -> Callable[[], bool]:
    """``torch._dynamo.assume_constant_result(fn)`` (the same mark, torch 2.4 to 2.13:
    dynamo calls ``fn`` instead of tracing it) without importing dynamo, which would
    cost every ``import vargather`` about a second (``tests/test_import_order.py``)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]  # dynamo's own marker attribute
    return fn


_PLAIN: dict[str, Callable[..., Any]] = {}
_UNTRACED: dict[str, Callable[..., Any]] = {}


def _make_untraced() -> bool:
    """Every route's eager code behind ``torch.compiler.disable(fn, recursive=True)``,
    built the first time a trace needs one (dynamo is loaded by then), not at import."""
    for name, fn in _PLAIN.items():
        if name not in _UNTRACED:
            _UNTRACED[name] = torch.compiler.disable(fn, recursive=True)  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    return True


# Called by dynamo while tracing (its side effect is the point), not traced.
_untraced_ready = _constant_of_the_trace(_make_untraced)


def _unbacked_sizes_allowed() -> bool:
    """Whether the graph being traced may hold an operator whose output shape depends
    on data (dynamo allows it under ``fullgraph=True``, or with its config's
    ``capture_dynamic_output_shape_ops``)."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode()
    shape_env = None if fake_mode is None else fake_mode.shape_env
    return shape_env is not None and bool(shape_env.allow_dynamic_output_shape_ops)


# Read while tracing, a constant of the trace: dynamo calls it instead of tracing it.
unbacked_sizes_allowed_here = _constant_of_the_trace(_unbacked_sizes_allowed)


def _keep_collective_order() -> bool:
    """Turn off inductor's peak-memory reordering, which reorders vargather's operators:
    torch 2.13's ``reorder_for_peak_memory`` ignores the dependencies the ordered effect
    adds, and issued two independent collectives of one graph in different orders on
    ranks whose buffers differ (``docs/family.md``, "Order across ranks"). Called while a
    vargather call is traced, before inductor compiles that graph; a process-wide setting
    from then on (it only changes where buffers are freed, never a result).
    """
    import torch._inductor.config as inductor_config

    inductor_config.reorder_for_peak_memory = False
    return True


# Called by dynamo while tracing (its side effect is the point), not traced.
keep_collective_order = _constant_of_the_trace(_keep_collective_order)


# --- a traced call's arguments --------------------------------------------------------------


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


def _is_dim(dim: object, x: torch.Tensor) -> TypeGuard[int]:
    """Whether ``dim`` is a dimension of ``x`` (an int, negative counted from the end)."""
    return isinstance(dim, int) and not isinstance(dim, bool) and -x.dim() <= dim < x.dim()


class OpArgs(NamedTuple):
    """A traced call's arguments as its operators take them."""

    x: torch.Tensor
    dim: int
    group_name: str
    rank: int
    world_size: int
    validate: bool
    seconds: float | None
    requires_grad: bool  # whether ``x`` needs a gradient here (the exchange compares it)

    def has_dim(self, dim: object) -> TypeGuard[int]:
        """Whether ``dim`` is a dimension of ``x`` (an int, negative counted from the end)."""
        return _is_dim(dim, self.x)


def op_args(
    x: object,
    dim: object,
    group: object,
    mesh_dim: object,
    validate: object,
    timeout: object,
    *words: object,
) -> OpArgs | None:
    """The arguments every operator takes (``words``: ``grad``, ``transport``), or ``None``
    when only the eager code can say what is wrong with them. Keeps the collectives'
    order in the graph (:func:`keep_collective_order`)."""
    if not (isinstance(x, torch.Tensor) and x.dim() > 0 and _is_dim(dim, x)):
        return None
    if not isinstance(validate, bool) or not all(isinstance(w, str) for w in words):
        return None
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        return None
    where = group_of(group, mesh_dim)
    if where is None:
        return None
    keep_collective_order()
    seconds = None if timeout is None else float(timeout)
    assert isinstance(dim, int)  # by _is_dim
    return OpArgs(x, dim, *where, validate, seconds, x.requires_grad and torch.is_grad_enabled())


# --- the one dispatch ---------------------------------------------------------------------


@dataclass(frozen=True)
class Route(Generic[R]):
    """A collective's way in, called by its face with the face's arguments: ``eager``
    outside ``torch.compile``; under it ``traced`` (its operators' call), or where that
    gives ``None`` the eager code behind ``torch.compiler.disable`` (one graph break)."""

    name: str
    eager: Callable[..., R]
    traced: Callable[..., R | None]

    def __post_init__(self) -> None:
        _PLAIN[self.name] = self.eager

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if not torch.compiler.is_compiling():
            return self.eager(*args, **kwargs)
        out = self.traced(*args, **kwargs)
        if out is not None:
            return out
        _untraced_ready()
        found: R = _UNTRACED[self.name](*args, **kwargs)
        return found

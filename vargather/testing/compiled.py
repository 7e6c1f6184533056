"""The testing kit's compiled path: a case's call inside a ``torch.compile``d step.

Where it sits: beside ``runner``, on the rank side, for a case with a
``compile_backend`` (the ``compiled`` rows). The step, compiled with
``fullgraph=True``, is ``step(x) = ATTR(x * w, dim, ...)`` with ``w = ones(())``
requiring grad like ``x``: in the backward, ``w``'s gradient ``Σ grad_h · x`` reads the
gather's input gradient, which on a rank whose shard is empty has zero elements. A
compiler that drops the gather's backward there (nothing reads a zero-element buffer)
leaves that rank one collective short and its peers waiting: the hang this path
exists to find. ``x * 1`` is exact for the integer values drawn, so results are
compared bit for bit on every backend. Steps are cached per process (per backend and
callable); later cases recompile as dynamo decides, which is part of what is tested.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, Protocol

import torch

COMPILE_TIMEOUT_S: Final = 600.0
"""The default group's collective timeout while a compiled case runs: ranks compile at
different speeds, so longer than any call timeout: a peer still compiling is waited
for and a peer that never comes is the pool's hang."""


class CompiledCase(Protocol):
    """A case of any collective that may run compiled (``GatherCase``, a family case)."""

    @property
    def compile_backend(self) -> str | None: ...


_STEPS: dict[tuple[str, int], Callable[..., object]] = {}
_CACHE_LIMIT: Final = 256
"""Compiled entries kept per process before dynamo's caches are reset (dynamo falls
back to eager silently past its own limits, which would hide what is under test)."""
_CALLS: list[int] = [0]
_WARM: set[str] = set()


def _raise_dynamo_limits() -> None:
    """Past its recompile limit dynamo runs the frame eagerly (and warns); this path
    must fail instead, never test eager code under a compiled name."""
    config: Any = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, _CACHE_LIMIT)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = _CACHE_LIMIT * 4
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def _step(fn: Callable[..., object], backend: str) -> Callable[..., object]:
    key = (backend, id(fn))
    step = _STEPS.get(key)
    if step is None:

        def gather_step(
            x: torch.Tensor,
            w: torch.Tensor,
            rest: tuple[object, ...],
            kwargs: dict[str, object],
            at: int | str,
        ) -> object:
            h = x * w
            if isinstance(at, str):  # the shard is passed by keyword
                return fn(*rest, **{**kwargs, at: h})
            return fn(*rest[:at], h, *rest[at:], **kwargs)

        step = torch.compile(gather_step, backend=backend, fullgraph=True)
        _STEPS[key] = step
    return step


@contextlib.contextmanager
def patient_default_group(ctx: object, case: CompiledCase) -> Iterator[None]:
    """For a compiled ``case`` (forward and backward), the default group's timeout
    lifted to ``COMPILE_TIMEOUT_S`` (``ProcessGroup.set_timeout``), then put back to the
    world's own (``ctx.collective_timeout``); for any other case, nothing."""
    import torch.distributed as dist

    restore = getattr(ctx, "collective_timeout", None)
    live = isinstance(restore, timedelta) and dist.is_available() and dist.is_initialized()
    set_timeout = None
    if case.compile_backend is not None and live:
        set_timeout = getattr(dist.group.WORLD, "set_timeout", None)
    if set_timeout is None:
        yield
        return
    set_timeout(timedelta(seconds=COMPILE_TIMEOUT_S))
    try:
        yield
    finally:
        set_timeout(restore)


def call_compiled(
    fn: Callable[..., object],
    case: CompiledCase,
    x: torch.Tensor,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> object:
    """What ``fn(*args, **kwargs)`` returns (the shard ``x`` among the arguments),
    called eagerly or, for a case with a ``compile_backend``, in its compiled step."""
    backend = case.compile_backend
    if backend is None:
        return fn(*args, **kwargs)
    _raise_dynamo_limits()
    _CALLS[0] += 1
    if _CALLS[0] % _CACHE_LIMIT == 0:
        torch._dynamo.reset()
        _STEPS.clear()
    at: int | str
    position = [i for i, a in enumerate(args) if a is x]
    if position:
        at, rest, named = position[0], (*args[: position[0]], *args[position[0] + 1 :]), kwargs
    else:
        names = [k for k, v in kwargs.items() if v is x]
        if not names:
            raise ValueError("call_compiled: the shard is not among the call's arguments")
        at, rest, named = names[0], tuple(args), {k: v for k, v in kwargs.items() if k != names[0]}
    w = torch.ones((), dtype=x.dtype, requires_grad=x.requires_grad)
    return _step(fn, backend)(x, w, rest, dict(named), at)


def warm_backends(ctx: object, backends: Sequence[str]) -> list[str]:
    """The backends it warmed: each not yet warm in this rank process, by a gather-free
    compiled step (inductor's one-time setup costs seconds to tens of seconds), so a
    compiled batch's call timeout measures its own steps."""
    warmed = []
    for backend in backends:
        if backend in _WARM:
            continue
        step = torch.compile(lambda t: (t * 2).sum(), backend=backend, fullgraph=True)
        step(torch.ones(3, requires_grad=True)).backward()
        _WARM.add(backend)
        warmed.append(backend)
    return warmed

"""The kit's one call dispatcher: collective ``name`` called on this rank with given arguments.

Where it sits: at the bottom of the testing kit, beside ``collectives`` (it reads the
library's table only); the misuse engine (``misuse``), the fuzzers and any rank
runner call a collective through it instead of a ladder over the collectives' names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import vargather


def function_of(name: str, impl: str = "vargather") -> Callable[..., Any]:
    """The function that collective ``name`` (or a public form of it, such as
    ``all_gather_v_with_layout``) is under ``impl`` (``MODULE``, whose attribute
    ``name`` it is, or ``MODULE:ATTR``)."""
    if not any(name.startswith(c) for c in vargather.COLLECTIVES) or name not in dir(vargather):
        raise ValueError(f"{name!r} is not a collective of vargather.COLLECTIVES nor its form")
    if impl == "vargather":
        fn: Callable[..., Any] = getattr(vargather, name)
        return fn
    from .importer import load_callable

    return load_callable(impl if ":" in impl else f"{impl}:{name}")


def call_collective(
    name: str,
    args: tuple[object, ...] = (),
    kwargs: Mapping[str, object] | None = None,
    impl: str = "vargather",
) -> Any:
    """``name(*args, **kwargs)`` on this rank (under ``impl``); raises what it raises."""
    return function_of(name, impl)(*args, **(kwargs or {}))


def bind(
    name: str, args: tuple[object, ...], kwargs: Mapping[str, object]
) -> inspect.BoundArguments:
    """``args``/``kwargs`` bound to vargather's signature of ``name``, defaults applied:
    every argument by its parameter's name, however it was passed."""
    bound = inspect.signature(function_of(name)).bind_partial(*args, **kwargs)
    bound.apply_defaults()
    return bound

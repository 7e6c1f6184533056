"""The kit's one importer of implementations under test.

Where it sits: in the testing kit, beneath ``rank_runner`` (every rank process resolves
the implementation it runs here) and ``runner`` (the parent resolves it first, to fail
early with a clear message), through ``load_callable``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from vargather import VarGatherError

from .cases import Implementation


class ImplementationError(VarGatherError, ValueError):
    """The implementation under test cannot be used: ``MODULE:ATTR`` is malformed, does
    not import, has no such attribute, or is not callable."""


def parse_impl_ref(ref: str) -> tuple[str, tuple[tuple[str, object], ...] | None]:
    """``MODULE:ATTR`` or ``MODULE:ATTR(key=literal, ...)`` split into the reference and
    the constructor's keyword arguments (``None``: plain). Only keyword values that
    ``ast.literal_eval`` accepts; nothing is evaluated as code."""
    text = ref.strip()
    if not text.endswith(")") or "(" not in text:
        return ref, None
    base, _, args = text.partition("(")
    bad = ImplementationError(f"must be MODULE:ATTR or MODULE:ATTR(key=literal, ...), got {ref!r}")
    try:
        tree = ast.parse(f"f({args}", mode="eval").body
    except SyntaxError:
        raise bad from None
    if not isinstance(tree, ast.Call) or tree.args:
        raise bad
    kwargs: list[tuple[str, object]] = []
    for kw in tree.keywords:
        if kw.arg is None:
            raise bad
        try:
            kwargs.append((kw.arg, ast.literal_eval(kw.value)))
        except ValueError:
            raise ImplementationError(
                f"{ref}: the value of {kw.arg}= must be a Python literal (a number, string, "
                "bool, None, or a tuple/list/dict of them)"
            ) from None
    return base.strip(), tuple(kwargs)


def _split_ref(ref: str) -> tuple[str, str]:
    ref = parse_impl_ref(ref)[0]
    module, sep, attr = ref.partition(":")
    ok = (
        sep == ":"
        and ":" not in attr
        and all(p.isidentifier() for p in module.split("."))
        and all(p.isidentifier() for p in attr.split("."))
    )
    if not ok:
        raise ImplementationError(
            f"must be MODULE:ATTR, e.g. mypkg.distributed:all_gather, got {ref!r}"
        )
    return module, attr


def _where(paths: Sequence[str]) -> str:
    pythonpath = os.environ.get("PYTHONPATH") or "not set"
    here = f"the current directory ({paths[0]})" if paths else "sys.path"
    return f"MODULE is imported from {here} and PYTHONPATH ({pythonpath})"


def short_traceback(err: BaseException, limit: int = 6) -> str:
    """The last ``limit`` frames of ``err``'s traceback, without importlib's and this
    module's own, then the exception itself."""
    noise = (os.path.abspath(__file__), os.path.abspath(importlib.__file__ or ""))
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith("<frozen") and os.path.abspath(f.filename) not in noise
    ][-limit:]
    text = "".join(traceback.format_list(frames))
    return ("Traceback (most recent call last):\n" + text if text else "") + "".join(
        traceback.format_exception_only(type(err), err)
    ).rstrip()


def prepend_import_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` first on ``sys.path``, in order, unless already there."""
    for path in reversed(paths):
        here = os.path.abspath(path)
        if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
            sys.path.insert(0, here)


def load_callable(ref: str, search_path: Sequence[str] = ()) -> Callable[..., object]:
    """Import ``MODULE`` (``search_path`` entries first on ``sys.path``) and return its
    ``ATTR`` (dotted within the module allowed: ``mod:AllGather.apply``).

    Raises ``ImplementationError`` saying what went wrong (after ``ref``, except for a
    malformed ``ref``): no such module (and where it was looked for), an import that
    raised (with the tail of its traceback), no such attribute, not a callable.
    """
    module_name, attr = _split_ref(ref)
    prepend_import_paths(search_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (
            module_name == err.name or module_name.startswith(err.name + ".")
        ):
            raise ImplementationError(
                f"{ref}: cannot import module {module_name!r}: no module named "
                f"{err.name!r}. {_where(search_path)}."
            ) from None
        raise ImplementationError(
            f"{ref}: importing {module_name!r} failed: a module it imports is "
            f"missing: {err}\n" + short_traceback(err)
        ) from None
    except BaseException as err:  # a module whose import raises anything at all
        if isinstance(err, KeyboardInterrupt):
            raise
        raise ImplementationError(
            f"{ref}: importing {module_name!r} failed: {type(err).__name__}: {err}\n"
            + short_traceback(err)
        ) from None
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(module, "__file__", None) or module_name
            raise ImplementationError(
                f"{ref}: {module_name!r} ({where}) has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ImplementationError(
            f"{ref}: {attr!r} is a {type(obj).__name__}, not a callable; expected "
            "ATTR(t, dim, sizes) like the seed's all_gather = AllGather.apply"
        )
    return obj


_cached = functools.cache(load_callable)  # once per process for each (ref, search path)


def resolve_implementation(impl: Implementation) -> Callable[..., object]:
    if impl.ref is None:
        from vargather import all_gather_v_with_layout

        return all_gather_v_with_layout
    return _cached(impl.ref, impl.search_path)


def resolve_compiled(impl: Implementation) -> Callable[..., object]:
    """What a compiled step calls: ``ATTR``, or for vargather's own implementation
    ``all_gather_v`` (its ``_with_layout`` form hands back a ``Layout`` of Python ints,
    which needs the sizes while tracing: a graph break without them)."""
    if impl.ref is None:
        import vargather

        return vargather.all_gather_v
    return resolve_implementation(impl)


def resolve_coalesced(impl: Implementation) -> Callable[..., object]:
    ref = impl.coalesced_form
    if ref is None:
        raise ImplementationError(f"{impl.label} has no coalesced form")
    return _cached(ref, impl.search_path)

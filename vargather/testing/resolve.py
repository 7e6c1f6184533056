"""Implementation resolution: what ``impl`` names and how the gate calls it.

Where it sits: in the gate's engine in the testing kit, above ``options`` and
``calls`` and beneath ``engine``. ``resolve_options_impl`` imports ``MODULE:ATTR`` in the
checking process (through the kit's one importer, ``importer.load_callable``), picks
the call and checks it against the callable's signature before any world starts: a
call that does not fit is exit 2, naming the mismatch.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import torch

from .calls import CallTemplate, parse_call
from .importer import ImplementationError, load_callable, parse_impl_ref, prepend_import_paths
from .runner import gloo_transports
from .usage_errors import OptionError

if TYPE_CHECKING:
    from .options import CheckOptions


@dataclass(frozen=True)
class ImplInfo:
    """What ``--impl`` names, as resolved in the parent: the fields of the
    ``cases.Implementation`` it becomes (``ref`` is ``None`` for vargather's own
    ``all_gather_v``), and ``refused_transports``: vargather's transports left out,
    with the reason."""

    ref: str | None
    display: str
    convention: str
    takes_group: bool
    transports: tuple[str, ...] | None = None
    refused_transports: tuple[tuple[str, str], ...] = ()
    takes_grad: bool = True
    ctor_kwargs: tuple[tuple[str, object], ...] | None = None
    ctor_takes_dim: bool = False
    call: str | None = None
    """The ``call`` template ATTR is called with (``None``: the convention's)."""
    scope: Scope | None = None
    """What the call template leaves out of scope (``None``: no template)."""


@dataclass(frozen=True)
class Scope:
    """The declared scope as a call template narrows it: ``dims`` (``None``: every
    dim), ``sizes`` (``--sizes``), ``takes_group``, ``takes_grad``."""

    dims: tuple[int, ...] | None
    sizes: str
    takes_group: bool
    takes_grad: bool


def call_scope(template: CallTemplate, options: CheckOptions) -> Scope:
    """What ``template`` leaves out is out of scope (never drawn); a declared scope
    that asks for what the template cannot pass is an ``OptionError``.

    No ``dim``: dim 0 only, unless ATTR returns per-rank lists (``returns='list'``,
    concatenated by the gate along any dim). No ``sizes``: ``sizes='never'``. No
    ``group``: no subgroup cases. No ``grad``: the contract is not passed."""
    dims = options.dims
    if not template.uses("dim") and options.returns != "list":
        if dims is not None and any(d != 0 for d in dims):
            raise OptionError(
                "dims",
                f"{','.join(map(str, dims))}: the call {template.text} passes no dim, so "
                "only dim 0 can be checked (or --returns list, concatenated by the gate)",
            )
        dims = (0,)
    sizes = options.sizes
    if not template.uses("sizes"):
        if sizes not in ("any", "never"):
            raise OptionError(
                "sizes", f"{sizes}: the call {template.text} passes no sizes (use --sizes never)"
            )
        sizes = "never"
    return Scope(dims, sizes, template.uses("group"), template.uses("grad"))


_PROBE_VALUES: dict[str, object] = {
    "dim": 0,
    "sizes": [1],
    "shapes": [[1]],
    "group": None,
    "grad": "sum",
}


def ensure_import_path(cwd: str | None = None) -> str:
    """Put the current directory first on ``sys.path`` (``python -m`` does; an embedding
    caller may not), so ``MODULE`` resolves as the docs say. Returns the directory."""
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    prepend_import_paths([here])
    return here


def load_impl(ref: str, cwd: str | None = None) -> Callable[..., object]:
    """``MODULE:ATTR`` imported by the kit's importer, from ``cwd`` (default: the current
    directory) and ``PYTHONPATH``; ``CheckUsageError`` naming ``--impl`` otherwise."""
    here = ensure_import_path(cwd)
    try:
        return load_callable(ref, (here,))
    except ImplementationError as err:
        raise OptionError("impl", str(err)) from None


def _overrides_setup_context(owner: type) -> bool:
    """Whether a class of ``owner``'s own (not torch's) defines ``setup_context``."""
    for klass in owner.__mro__:
        if klass.__module__.startswith("torch."):
            return False
        if "setup_context" in vars(klass):
            return True
    return False


def _signature(fn: object) -> inspect.Signature | None:
    """``fn``'s call signature (an ``nn.Module``'s ``forward``; a ``Function.apply``'s
    ``forward`` less ``ctx``); ``None`` when unknown or when it takes anything
    (``*args, **kwargs``)."""
    sig: inspect.Signature | None = None
    if _is_function_apply(fn):
        # its forward without ctx (a forward with a separate setup_context takes no ctx)
        owner = getattr(fn, "__self__")  # noqa: B009  # a Function subclass
        with contextlib.suppress(TypeError, ValueError):
            sig = inspect.signature(owner.forward)
            params = list(sig.parameters.values())
            if not _overrides_setup_context(owner) and params:
                sig = sig.replace(parameters=params[1:])
    else:
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        with contextlib.suppress(TypeError, ValueError):
            sig = inspect.signature(target)  # type: ignore[arg-type]  # any callable
    if sig is None:
        return None
    kinds = {p.kind for p in sig.parameters.values()}
    both = {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    return None if both <= kinds else sig


def _takes(fn: object, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (by name, or through ``**kwargs``)."""
    sig = _signature(fn)
    if sig is None:
        return False
    params = sig.parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _is_function_apply(fn: object) -> bool:
    """``SomeFunction.apply`` of a ``torch.autograd.Function`` (the seed's
    ``all_gather = AllGather.apply``), whose signature is ``(*args, **kwargs)``."""
    owner = getattr(fn, "__self__", None)
    return (
        getattr(fn, "__name__", None) == "apply"
        and isinstance(owner, type)
        and issubclass(owner, torch.autograd.Function)
    )


def _construct(
    ref: str, fn: Callable[..., object], ctor: tuple[tuple[str, object], ...]
) -> tuple[object, bool]:
    """Build ``MODULE:ATTR(key=literal, ...)`` once in the parent (dim=0 where ATTR takes
    ``dim`` and the reference does not set it), to read the configured object's call
    signature; returns it and whether ``dim`` goes to the constructor."""
    kwargs = dict(ctor)
    takes_dim = "dim" not in kwargs and _takes(fn, "dim")
    if takes_dim:
        kwargs["dim"] = 0
    try:
        obj = fn(**kwargs)
    except Exception as err:
        raise OptionError(
            "impl", f"{ref}: constructing it failed: {type(err).__name__}: {err}"
        ) from None
    if not callable(obj):
        raise OptionError(
            "impl", f"{ref}: constructing it gave a {type(obj).__name__}, not a callable"
        )
    return obj, takes_dim


def _check_fits(
    ref: str,
    target: object,
    convention: str,
    *,
    dim_in_call: bool,
    takes_grad: bool,
    sizes: str,
    guessed: bool,
) -> None:
    """``CheckUsageError`` (exit 2, before any world starts) when the call the gate
    would make does not fit ``target``'s signature, saying which options to pass."""
    sig = _signature(target)
    if sig is None:
        return
    x = torch.zeros(1)
    head: tuple[object, ...] = (x, 0) if dim_in_call else (x,)
    how = "guessed (--convention auto)" if guessed else f"--convention {convention}"
    suggested = f"--call '{_suggested_call(sig)}' (the arguments ATTR takes)"
    kwargs: dict[str, object] = {}
    if convention == "seed":
        args: tuple[object, ...] = (*head, None)
        shape = "ATTR(t, dim, sizes)" if dim_in_call else "ATTR(t, sizes)"
    else:
        args, kwargs = head, ({"grad": "sum"} if takes_grad else {})
        if sizes != "never":
            kwargs["sizes"] = [1]
        shape = "ATTR(x, dim, *, " if dim_in_call else "ATTR(x, *, "
        shape += ", ".join([*kwargs, "group", "transport"]) + ")"
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as err:
        hints: list[str] = []
        params = sig.parameters
        if convention == "vargather" and sizes != "never" and not _takes(target, "sizes"):
            hints.append("--sizes never (ATTR takes no sizes=)")
        if convention == "seed" and ("grad" in params or "group" in params):
            hints.append("--convention vargather")
        if convention == "vargather" and not ("grad" in params or "group" in params):
            hints.append("--convention seed")
        if dim_in_call and "dim" not in params and len(params) <= 2:
            hints.append(
                "MODULE:ATTR(dim=...) if ATTR is a class configured with dim, with "
                "--dims naming the dims it supports"
            )
        hints.append(suggested)
        raise OptionError(
            "impl",
            f"{ref}: the call convention {how} calls {shape}, which does not fit "
            f"its signature {sig}: {err}; pass " + " or ".join(hints),
        ) from None
    # It binds, but a positional argument may land in a parameter named otherwise
    # (``f(x, group=None)`` called as ``f(x, dim)`` receives dim as its group).
    passed = ["x", "dim"] if dim_in_call else ["x"]
    if convention == "seed":
        passed.append("sizes")
    wrong = [
        (value, name)
        for value, name in zip(passed, list(bound.arguments)[: len(args)], strict=False)
        if name != value and name in ("dim", "sizes", "group", "grad", "shapes", "transport")
    ]
    if wrong:
        value, name = wrong[0]
        raise OptionError(
            "impl",
            f"{ref}: the call convention {how} calls {shape}, which passes {value} as "
            f"ATTR's parameter {name!r} (its signature is {sig}); pass {suggested}",
        )


_SHARD_NAMES: Final = ("x", "t", "tensor", "input")
"""The names the README gives a gather's first parameter (this rank's shard). Other
names (``result``, ``data``) are not guessed: such a call exits 2 with the template to
pass, which also says whether it returns a list (``--returns list``)."""
_CALL_NAMES: Final = ("dim", "sizes", "shapes", "group", "grad")


def inferred_call(target: object) -> str | None:
    """The call template ``target``'s parameter names spell out (docs/conformance.md,
    "The call inferred from parameter names"), or ``None`` when they do not:
    ``all_gather(x, dim)`` -> ``(x, dim)``; ``gather(tensor, group=None)`` -> ``(x,
    group=group)``."""
    sig = _signature(target)
    if sig is None:
        return None
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not params or params[0].name not in _SHARD_NAMES or params[0].kind is params[0].KEYWORD_ONLY:
        return None
    call = _suggested_call(sig)
    return None if "..." in call else call  # ...: a required argument the gate cannot pass


def _suggested_call(sig: inspect.Signature) -> str:
    """A call template for ``sig``: its parameters the gate has names for, the first
    one as ``x`` (a starting point: the fork decides what its call passes)."""
    parts: list[str] = []
    for i, p in enumerate(sig.parameters.values()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        name = "x" if i == 0 else p.name
        if i > 0 and name not in _CALL_NAMES:
            if p.default is p.empty:
                name = "..."
            else:
                continue
        keyword = p.kind is p.KEYWORD_ONLY or (i > 0 and p.default is not p.empty)
        parts.append(f"{p.name}={name}" if keyword and name != "..." else name)
    return "(" + ", ".join(parts) + ")"


def _load_target(
    ref: str, cwd: str | None
) -> tuple[tuple[tuple[str, object], ...] | None, object, bool]:
    """``MODULE:ATTR[(ctor)]`` imported: its constructor arguments (or ``None``), what
    is called (the constructed object, or the callable itself) and whether the
    constructor takes ``dim``; ``OptionError`` naming a bad reference."""
    fn = load_impl(ref, cwd)  # an OptionError for a malformed reference too
    ctor = parse_impl_ref(ref)[1]
    if ctor is None:
        return None, fn, False
    return (ctor, *_construct(ref, fn, ctor))


def resolve_options_impl(options: CheckOptions, cwd: str | None = None) -> ImplInfo:
    """Check ``options.impl`` in the parent (import, attribute, callable, the call's fit
    to its signature) and pick how to call it: ``--convention`` and ``--transports``
    as docs/conformance.md says (``grad=`` passed only to an ATTR that takes it, never
    under ``--grad none``), or a ``call`` template with the scope it leaves out
    (``call_scope``).
    """
    ref, convention, transports = options.impl, options.convention, options.transports
    grad = options.grad
    if options.call is not None:
        return _resolve_call(ref, options.call, cwd, options)
    usable, refused = gloo_transports()
    if ref is None:
        if convention == "seed":
            raise OptionError(
                "convention", "seed needs --impl (vargather's own API is vargather-style)"
            )
        chosen = usable if transports == "auto" else _transport_list(transports, "vargather")
        if chosen is None:
            raise OptionError("transports", "none needs --impl (vargather takes transport=)")
        return ImplInfo(
            None,
            "vargather.all_gather_v",
            "vargather",
            True,
            chosen,
            tuple(refused.items()),
            takes_grad=grad != "none",
        )
    ctor, target, ctor_takes_dim = _load_target(ref, cwd)
    guessed = convention == "auto"
    if guessed:
        vargather_style = not _is_function_apply(target) and (
            _takes(target, "grad") or _takes(target, "group")
        )
        convention = "vargather" if vargather_style else "seed"
    takes_group = convention == "vargather" and _takes(target, "group")
    takes_grad = convention == "vargather" and grad != "none" and _takes(target, "grad")
    try:
        _check_fits(
            ref,
            target,
            convention,
            dim_in_call=not ctor_takes_dim,
            takes_grad=takes_grad,
            sizes=options.sizes,
            guessed=guessed,
        )
    except OptionError:
        # Neither guessed convention fits: the parameters' names may say the call.
        inferred = inferred_call(target) if guessed and ctor is None else None
        if inferred is None or transports not in ("auto", "none"):
            raise
        return _resolve_call(ref, inferred, cwd, options)
    if transports == "auto":
        takes = convention == "vargather" and _takes(target, "transport")
        chosen = usable if takes else None
        left_out = tuple(refused.items()) if takes else ()
    else:
        chosen, left_out = _transport_list(transports, convention), ()
    return ImplInfo(
        ref,
        ref,
        convention,
        takes_group,
        chosen,
        left_out,
        takes_grad=takes_grad,
        ctor_kwargs=ctor,
        ctor_takes_dim=ctor_takes_dim,
    )


def _resolve_call(ref: str | None, call: str, cwd: str | None, options: CheckOptions) -> ImplInfo:
    """``resolve_options_impl`` for a call template."""
    if ref is None:
        raise OptionError("call", "needs --impl (vargather's own API is called as documented)")
    if options.convention != "auto":
        raise OptionError(
            "call", f"and --convention {options.convention} both say how to call ATTR: give one"
        )
    if options.transports not in ("auto", "none"):
        raise OptionError("transports", ": a call template passes no transport=")
    try:
        template = parse_call(call)
    except ValueError as err:
        raise OptionError("call", f": {err}") from None
    ctor, target, ctor_takes_dim = _load_target(ref, cwd)
    if ctor_takes_dim and template.uses("dim"):
        ctor_takes_dim = False  # the template passes dim to the call instead
    sig = _signature(target)
    if sig is not None:  # the template must bind to it
        args, kwargs = template.build({"x": torch.zeros(1), **_PROBE_VALUES})
        try:
            sig.bind(*args, **kwargs)
        except TypeError as err:
            where = "its forward, less ctx," if _is_function_apply(target) else "its signature"
            raise OptionError(
                "call", f"{template.text} does not fit {ref}: {where} is {sig}: {err}"
            ) from None
    scope = call_scope(template, options)
    if ctor_takes_dim:  # dim= goes to the constructor: every dim can be asked for
        scope = Scope(options.dims, scope.sizes, scope.takes_group, scope.takes_grad)
    return ImplInfo(
        ref,
        ref,
        "vargather",
        scope.takes_group,
        None,
        (),
        takes_grad=scope.takes_grad and options.grad != "none",
        ctor_kwargs=ctor,
        ctor_takes_dim=ctor_takes_dim,
        call=template.text,
        scope=scope,
    )


def _transport_list(text: str, convention: str) -> tuple[str, ...] | None:
    if text.strip() == "none":
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise OptionError("transports", f": expected 'auto', 'none' or names, got {text!r}")
    if convention == "seed":
        raise OptionError(
            "transports", ": the seed's convention ATTR(t, dim, sizes) takes no transport"
        )
    return names

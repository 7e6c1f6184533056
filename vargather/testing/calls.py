"""Call templates: the argument list the gate calls an implementation with.

Where it sits: in the testing kit, beneath ``runner`` (which builds each rank's call
from a template) and ``resolve`` (which checks a template against the callable before
any world starts). ``--call "(x, group=group)"`` is Python call syntax over ``NAMES``
and literals, parsed with ``ast`` and never evaluated; what each name is bound to, and
what a template that leaves one out puts out of scope: ``docs/conformance.md``, "Call
templates".
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import torch

NAMES: Final = ("x", "dim", "sizes", "shapes", "group", "grad", "out")
"""The names a template may use."""


@dataclass(frozen=True)
class Arg:
    """One argument: a name of ``NAMES`` or a literal value."""

    name: str | None
    value: object = None


@dataclass(frozen=True)
class CallTemplate:
    """A parsed ``--call``: positional ``args`` and keyword ``kwargs`` in order."""

    text: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]

    def uses(self, name: str) -> bool:
        """Whether the template passes ``name`` anywhere."""
        return any(a.name == name for a in (*self.args, *(v for _, v in self.kwargs)))

    def build(self, values: Mapping[str, object]) -> tuple[list[object], dict[str, object]]:
        """The positional and keyword arguments, with the names bound to ``values``."""

        def value(arg: Arg) -> object:
            return values[arg.name] if arg.name is not None else arg.value

        return [value(a) for a in self.args], {k: value(v) for k, v in self.kwargs}


def group_object(group: object) -> object:
    """What a template's ``group`` is bound to: ``group``, or for a whole-world case
    (``None``) the world's process-group object, ``dist.group.WORLD`` (functions such as
    torch's functional collectives refuse ``group=None``)."""
    if group is not None:
        return group
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None  # no world: nothing else to pass


@functools.lru_cache(maxsize=16)
def _parsed(text: str, names: tuple[str, ...]) -> CallTemplate:
    return parse_call(text, names)


def bind_call(
    text: str,
    names: Sequence[str],
    x: torch.Tensor,
    group: object,
    out_shape: Callable[[], Sequence[int]],
    values: Mapping[str, object],
) -> tuple[tuple[object, ...], dict[str, object]]:
    """The arguments template ``text`` (over ``names``, parsed once per process) makes
    on a rank: ``x`` its shard, ``group`` its group (``group_object``), ``out`` (where
    the template uses it) an empty tensor of ``out_shape()`` like ``x``, the other
    names bound to ``values``."""
    template = _parsed(text, tuple(names))
    bound = {"x": x, "group": group_object(group), **values}
    if template.uses("out"):  # a preallocated output the call fills
        bound["out"] = torch.empty(tuple(out_shape()), dtype=x.dtype, device=x.device)
    args, kwargs = template.build(bound)
    return tuple(args), kwargs


def _arg(node: ast.expr, text: str, names: Sequence[str]) -> Arg:
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(
                f"{text}: unknown name {node.id!r}; a template may use {', '.join(names)} "
                "and literals"
            )
        return Arg(node.id)
    try:
        return Arg(None, ast.literal_eval(node))
    except ValueError:
        raise ValueError(
            f"{text}: {ast.unparse(node)!r} is neither one of {', '.join(names)} nor a "
            "literal (nothing in a template is evaluated as code)"
        ) from None


def parse_call(text: str, names: Sequence[str] = NAMES) -> CallTemplate:
    """Parse ``"(x, sizes, dim, True, group)"``; ``ValueError`` naming what is wrong.
    ``names``: the names the template may use (the family's collectives have their
    own: each ``FamilyCase``'s ``NAMES``)."""
    stripped = text.strip()
    if not (stripped.startswith("(") and stripped.endswith(")")):
        raise ValueError(f"expected an argument list in parentheses like '(x, dim)', got {text!r}")
    try:
        tree = ast.parse("ATTR" + stripped, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"{text!r} is not Python call syntax: {err.msg}") from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or (
        call.func.id != "ATTR"
    ):
        raise ValueError(f"expected one argument list like '(x, dim)', got {text!r}")
    args: list[Arg] = []
    for node in call.args:
        if isinstance(node, ast.Starred):
            raise ValueError(f"{text}: *args is not allowed in a template")
        args.append(_arg(node, text, names))
    kwargs: list[tuple[str, Arg]] = []
    for kw in call.keywords:
        if kw.arg is None:
            raise ValueError(f"{text}: **kwargs is not allowed in a template")
        kwargs.append((kw.arg, _arg(kw.value, text, names)))
    template = CallTemplate(stripped, tuple(args), tuple(kwargs))
    if not template.uses("x"):
        raise ValueError(f"{text}: the template must pass x (this rank's shard)")
    return template

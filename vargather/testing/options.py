"""The conformance gate's options model: ``CheckOptions``, built from the one schema.

Where it sits: in the gate's engine in the testing kit, above ``schema`` (the option
list) and beneath ``resolve`` and ``engine``. Every surface ``schema`` names builds a
``CheckOptions`` here (``surface_options``, ``from_json``); a bad value raises
``OptionError`` naming the option, which each surface spells its own way.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from . import schema
from .scale import DEFAULT_MAX_PAYLOAD
from .usage_errors import CheckUsageError as CheckUsageError
from .usage_errors import OptionError as OptionError
from .values import DTYPE_NAMES

MAX_WORLD_SIZE: Final = 16
MAX_NDIM: Final = 8
DEFAULT_TIMEOUT: Final = 30.0


def ids_of(op: str) -> tuple[str, ...]:
    """The property ids of ``op``'s catalogue (what ``--only`` and an xfails file name):
    asked of the catalogues, above the options, when an option names one."""
    from .catalogues import property_ids

    return property_ids(op)


CONFIG_TABLE: Final = ("tool", "vargather", "check")


@dataclass(frozen=True)
class CheckOptions:
    """Everything a check run needs, validated. Each field but the bookkeeping ones
    (``config_path``, ``xfails``, ``progress``, ``in_flight``) is an option of
    ``schema.OPTIONS`` (its ``field``)."""

    target: str | None = None
    """A built-in target (``--target``, ``vargather.testing.targets``): the engine
    fills ``op``, ``impl``, ``call`` and the scope from it."""
    op: str = "all_gather_v"
    impl: str | None = None
    call: str | None = None
    grad: str = "sum"
    dims: tuple[int, ...] | None = None
    requires_init: bool = False
    contiguous_only: bool = False
    compile: bool = False
    sizes: str = "any"
    returns: str = "auto"
    emulate: str | None = None
    equal_shapes: bool = False
    nan_payloads: str = "exact"
    strict: bool = False
    db: str | None = None
    config_path: str | None = field(default=None, compare=False)
    """The config file whose ``[tool.vargather.check]`` table gave defaults, if any."""
    world_sizes: tuple[int, ...] = (1, 2, 3, 4)
    max_examples: int = 60
    seed: int = 0
    xfails: frozenset[str] = frozenset()
    xfails_path: str | None = None
    json_path: str | None = None
    timings: bool = False
    convention: str = "auto"
    transports: str = "auto"
    exitfirst: bool = False
    timeout: float = DEFAULT_TIMEOUT
    shrink_budget: int = 200
    progress: bool = True
    only: tuple[str, ...] = ()
    in_flight: str | None = None
    """Set in the child process that runs the in-process property (``uninitialized``):
    the file where it records the batch in flight, for the parent to name a crash or
    hang."""
    max_payload: int = DEFAULT_MAX_PAYLOAD

    def __post_init__(self) -> None:
        for option in schema.OPTIONS:  # the choices: the schema's (emulate may be None)
            value = getattr(self, option.field)
            if option.choices and value is not None and value not in option.choices:
                raise OptionError(
                    option.name, f"must be one of {', '.join(option.choices)}, got {value!r}"
                )
        dims_ok = self.dims is None or (
            bool(self.dims) and all(type(d) is int and -MAX_NDIM <= d < MAX_NDIM for d in self.dims)
        )
        if not dims_ok:
            raise OptionError(
                "dims", f": expected integers in [-{MAX_NDIM}, {MAX_NDIM}), got {self.dims!r}"
            )
        if not self.world_sizes:
            raise OptionError("world-sizes", ": expected at least one world size")
        for w in self.world_sizes:
            if type(w) is not int or not 1 <= w <= MAX_WORLD_SIZE:
                raise OptionError(
                    "world-sizes",
                    f": each world size must be in [1, {MAX_WORLD_SIZE}], got {w!r}",
                )
        counts = (
            ("max-examples", self.max_examples, 1, "a positive integer"),
            ("seed", self.seed, 0, "a non-negative integer"),
            ("shrink-budget", self.shrink_budget, 0, "a number of examples >= 0"),
            ("max-payload", self.max_payload, 0, "a number of bytes >= 0"),
        )
        for name, value, least, what in counts:
            if type(value) is not int or value < least:
                raise OptionError(name, f"must be {what}, got {value!r}")
        if not (self.timeout > 0):
            raise OptionError(
                "timeout", f"must be a positive number of seconds, got {self.timeout!r}"
            )
        if self.call is not None:
            from .calls import NAMES, parse_call  # the template's syntax, checked here
            from .catalogues import catalogue_of

            try:
                parse_call(self.call, getattr(catalogue_of(self.op), "names", NAMES))
            except ValueError as err:
                raise OptionError("call", f": {err}") from None
        if self.target is not None:
            return  # a built-in target's rows are its own: ``targets.apply_target`` checks
        known = ids_of(self.op)
        xfail_rows = {x.partition(":")[0] for x in self.xfails}
        for name, ids in (("only", set(self.only)), ("xfails", xfail_rows)):
            unknown = sorted(set(ids) - set(known))
            if unknown:
                raise OptionError(
                    name,
                    f": unknown property id(s) {', '.join(unknown)}; known: " + ", ".join(known),
                )

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON data (``from_json`` inverts it): how the isolated child
        gets its options, without any flag spelled again."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in out.items():
            if isinstance(value, (frozenset, tuple)):
                out[name] = sorted(value) if isinstance(value, frozenset) else list(value)
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> CheckOptions:
        values = {f.name: data[f.name] for f in dataclasses.fields(CheckOptions) if f.name in data}
        for name, value in values.items():
            if isinstance(value, list):
                values[name] = frozenset(value) if name == "xfails" else tuple(value)
        return CheckOptions(**values)


def build_options(values: Mapping[str, object], **extra: Any) -> CheckOptions:
    """A ``CheckOptions`` from option values keyed by option name (``max-payload``) as
    the schema's parsers give them; loads the xfails file. ``extra``: bookkeeping
    fields (``config_path``, ``progress``, ...)."""
    fields: dict[str, Any] = dict(extra)
    by_name = {o.name: o for o in schema.OPTIONS}
    for name, value in values.items():
        if value is not None:
            fields[by_name[name].field] = value
    path = fields.get("xfails_path")
    if path is not None:
        target = fields.get("target")
        fields["xfails"] = load_xfails(
            str(path), str(fields.get("op", "all_gather_v")), checked=target is None
        )
    if "world_sizes" in fields:
        fields["world_sizes"] = tuple(sorted(set(fields["world_sizes"])))
    if "dims" in fields:
        fields["dims"] = tuple(dict.fromkeys(fields["dims"]))
    return CheckOptions(**fields)


def read_config(path: str) -> dict[str, object]:
    """The ``[tool.vargather.check]`` table of ``path`` as option values (option name
    -> parsed value, ``xfails`` made absolute against the file's folder); unknown keys
    and wrong types are usage errors. A file without the table gives ``{}``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the backport on 3.10
        import tomli as tomllib  # type: ignore[import-not-found, no-redef, unused-ignore]  # the backport, absent on 3.11+
    try:
        with open(path, "rb") as f:
            table: object = tomllib.load(f)
    except OSError as err:
        raise OptionError("config", f": cannot read {path!r}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise OptionError("config", f": {path} is not valid TOML: {err}") from None
    for key in CONFIG_TABLE:
        table = table.get(key, {}) if isinstance(table, dict) else None
    where = f"{path} [{'.'.join(CONFIG_TABLE)}]"
    if not isinstance(table, dict):
        raise OptionError("config", f": {where} must be a table")
    settable = {o.name: o for o in schema.on(schema.CONFIG)}
    values: dict[str, object] = {}
    for key, raw in table.items():
        option = settable.get(key)
        if option is None:
            raise OptionError(
                "config",
                f": {where}: unknown key {key!r}; known keys: " + ", ".join(sorted(settable)),
            )
        try:
            value = option.parse_toml(raw, where)
        except schema.OptionValueError as err:
            text = err.spelled(key)
            raise OptionError(
                "config", f": {text}" if where in text else f": {where}: {text}"
            ) from None
        if option.kind == "path" and isinstance(value, str) and not os.path.isabs(value):
            value = os.path.join(os.path.dirname(os.path.abspath(path)), value)
        values[key] = value
    return values


def surface_options(
    surface: str, given: Mapping[str, object], config: str | None, no_config: bool, **extra: Any
) -> CheckOptions:
    """``build_options`` from a surface's values (option name -> the text given, ``True``
    for a flag) over the config file's: ``config``, else ``./pyproject.toml`` when it
    exists, none with ``no_config``; ``config_path`` is the file when it gave any."""
    values: dict[str, object] = {}
    config_path = None
    if not no_config:
        path = config if config is not None else os.path.join(os.getcwd(), "pyproject.toml")
        if config is not None or os.path.isfile(path):
            values = read_config(path)
            config_path = os.path.abspath(path) if values else None
    for option in schema.on(surface):
        raw = given.get(option.name)
        if raw is not None:
            values[option.name] = True if option.is_flag else option.parse_text(str(raw))
    return build_options(values, config_path=config_path, **extra)


def load_xfails(path: str, op: str = "all_gather_v", *, checked: bool = True) -> frozenset[str]:
    """Read an xfails file: one property id (or ``PROPERTY:DTYPE``) per line; ``#``
    starts a comment. Every id must name a property of ``op``'s catalogue (a typo would
    otherwise silently expect nothing); with ``checked=False`` (a built-in target, whose
    rows ``targets.apply_target`` knows) the ids are checked there instead."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise OptionError("xfails", f": cannot read {path!r}: {err.strerror or err}") from None
    known = set(ids_of(op))
    ids: set[str] = set()
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if len(text.split()) != 1:
            raise OptionError(
                "xfails", f": {path}:{number}: expected one property id per line, got {text!r}"
            )
        prop, colon, dtype = text.partition(":")
        dtype_row = colon and prop in known and dtype in DTYPE_NAMES
        if checked and text not in known and not dtype_row:
            raise OptionError(
                "xfails",
                f": {path}:{number}: unknown property id {text!r}; known ids: "
                + ", ".join(ids_of(op)),
            )
        ids.add(text)
    return frozenset(ids)

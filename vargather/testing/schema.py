"""The conformance gate's one option schema: every option, once.

Where it sits: at the bottom of the gate's engine in the testing kit, beneath
``options`` (the options model built from it). Every surface derives its options from
``OPTIONS`` here and nowhere else (the command line's flags, the config table's keys,
the plugin's ``--vargather-*`` options). Adding an option is one ``Option`` entry here
plus its field in ``options.CheckOptions``.

This module imports nothing but the standard library, and nothing of ``vargather``:
the pytest plugin loads it by file path in every pytest session, where importing
``vargather`` (and torch) would cost every project that has vargather installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Final

CLI: Final = "cli"
CONFIG: Final = "config"
PLUGIN: Final = "plugin"
EVERYWHERE: Final = frozenset({CLI, CONFIG, PLUGIN})


class AnyOptionError(Exception):
    """An error about one option (``OptionValueError``, ``usage_errors.OptionError``).
    ``option`` is the option's name (``max-examples``); ``detail`` the rest of the
    message (``must be a positive integer, got 0``, or ``: expected ...``). ``str()``
    names the option; each surface re-spells it (``spelled("--max-examples")``,
    ``spelled("--vargather-max-examples")``)."""

    def __init__(self, option: str, detail: str) -> None:
        self.option = option
        self.detail = detail
        super().__init__(self.spelled(option))

    def spelled(self, spelling: str) -> str:
        """The message with the option spelled as a surface spells it."""
        joiner = "" if self.detail.startswith((":", ",")) else " "
        return f"{spelling}{joiner}{self.detail}"


class OptionValueError(AnyOptionError, ValueError):
    """A bad value for one option (an ``AnyOptionError``)."""


_UNITS: Final = {"": 1, "b": 1, "kib": 1 << 10, "kb": 1000, "mib": 1 << 20, "mb": 1000**2}


def parse_bytes(name: str, text: str) -> int:
    """``4194304``, ``4MiB``, ``512KiB``, ``2MB``: a number of bytes >= 0."""
    raw = text.strip().lower().replace(" ", "")
    digits = raw.rstrip("kimbg")
    unit = raw[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise OptionValueError(
            name, f": expected a number of bytes like 4194304, 4MiB or 512KiB, got {text!r}"
        )
    return int(digits) * _UNITS[unit]


@dataclass(frozen=True)
class Option:
    """One gate option.

    ``name`` is its name on every surface (``--NAME``, ``NAME = ...`` in the config
    table, ``--vargather-NAME``); ``field`` the ``CheckOptions`` field it sets.
    ``kind``: ``str``, ``choice`` (one of ``choices``), ``int``, ``float``, ``flag``
    (a boolean, a flag on the command line), ``ints`` (a comma-separated list, or a
    TOML list of integers), ``names`` (the same for names, kept as text), ``ids``
    (names, as a tuple), ``bytes`` (``4MiB``), ``path`` (a file; in the config table
    relative to the config file). ``surfaces``: where it can be set.
    """

    name: str
    kind: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    surfaces: frozenset[str] = EVERYWHERE
    example: str = ""
    items: str = "integers"
    field_name: str | None = None

    @property
    def field(self) -> str:
        return self.field_name or self.name.replace("-", "_")

    @property
    def is_flag(self) -> bool:
        return self.kind == "flag"

    def parse_text(self, text: str) -> object:
        """The value from its text (the command line's, the plugin's)."""
        kind, name = self.kind, self.name
        if kind == "flag":
            return True
        if kind == "choice" and text not in self.choices:
            choices = ", ".join(map(repr, self.choices))
            raise OptionValueError(name, f": invalid choice: {text!r} (choose from {choices})")
        if kind in ("int", "float"):
            try:
                return int(text) if kind == "int" else float(text)
            except ValueError:
                what = "an integer" if kind == "int" else "a number"
                raise OptionValueError(name, f": expected {what}, got {text!r}") from None
        if kind == "bytes":
            return parse_bytes(name, text)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if kind == "ids":
            return tuple(dict.fromkeys(parts))
        if kind != "ints":
            return text  # str, path, names, choice: the text itself
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            example = self.example or "0,1"
            raise OptionValueError(
                name, f": expected comma-separated {self.items} like {example}, got {text!r}"
            ) from None
        if not values:
            raise OptionValueError(name, f": expected at least one value, got {text!r}")
        return values

    def parse_toml(self, value: object, where: str) -> object:
        """The value from a TOML value of the config table; ``OptionValueError`` for a
        wrong type (``where`` names the file and table)."""
        wrong = OptionValueError(self.name, f"= {value!r} has the wrong type ({where})")
        if isinstance(value, bool) != (self.kind == "flag"):
            raise wrong
        if self.kind == "float" and isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, {"flag": bool, "int": int, "bytes": int}.get(self.kind, ())):
            return value  # a bool only for a flag (above)
        if self.kind in ("ints", "names", "ids") and isinstance(value, list):
            item = int if self.kind == "ints" else str
            if not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
                raise wrong
            return self.parse_text(",".join(str(v) for v in value))
        if self.kind == "ints" and type(value) is int:
            return (value,)
        if self.kind in ("flag", "int", "float") or not isinstance(value, str):
            raise wrong
        return self.parse_text(value)


def _collectives_with_a_catalogue() -> tuple[str, ...]:
    """The collectives ``--op`` may name, from the library's one table of collectives
    (``vargather/_collectives.py``), loaded by file path: it imports the standard
    library only, so this module still imports nothing of vargather (nor torch)."""
    name = "_vargather_schema_collectives"
    module = sys.modules.get(name)
    if module is None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.util.spec_from_file_location(name, os.path.join(here, "_collectives.py"))
        assert spec is not None  # a file we ship
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
    return tuple(c.catalogue for c in module.COLLECTIVES.values() if c.catalogue is not None)


_OPS: Final = _collectives_with_a_catalogue()

OPTIONS: Final[tuple[Option, ...]] = (
    Option(
        "target",
        "str",
        "a built-in target: torch's or Megatron-core's own ragged code with its declared "
        "collective, call and scope (dtensor, funcol-all-to-all, nn-all-to-all, "
        "nn-all-gather, megatron-all-to-all, megatron-sp-gather, "
        "megatron-sp-reduce-scatter); 'list' lists them and which run here "
        "(see docs/targets.md)",
        metavar="NAME|list",
    ),
    Option(
        "op",
        "choice",
        f"the collective to check, each with its own catalogue: {', '.join(_OPS)} "
        f"(default: {_OPS[0]})",
        choices=_OPS,
    ),
    Option(
        "impl",
        "str",
        "the implementation under test, MODULE:ATTR, imported in every rank from the current "
        "directory and PYTHONPATH (default: vargather's own all_gather_v)",
        metavar="MODULE:ATTR",
    ),
    Option(
        "call",
        "str",
        "the argument list ATTR is called with, in Python call syntax over x, dim, sizes, "
        "shapes, group, grad and literals, e.g. '(x)', '(x, group=group)', "
        "'(x, shapes, group=group)', '(x, sizes, dim, True, group)'; what it leaves out is "
        "out of scope (default: the --convention's call)",
        metavar="(ARGS)",
    ),
    Option(
        "grad",
        "choice",
        "the gradient contract the implementation claims, or 'none' (not differentiable: "
        "the gradient rows do not apply) (default: sum)",
        choices=("sum", "local", "mean", "none"),
    ),
    Option(
        "dims",
        "ints",
        "the literal dim values it supports, e.g. 0 or 0,-1 (default: every dim)",
        metavar="D,D,...",
        example="0,-1",
    ),
    Option(
        "world-sizes",
        "ints",
        "world sizes to run on (default: 1,2,3,4)",
        metavar="W,W,...",
        example="1,2,3,4",
        items="positive integers",
    ),
    Option(
        "requires-init",
        "flag",
        "it needs an initialized torch.distributed (the uninitialized row does not apply)",
    ),
    Option(
        "contiguous-only",
        "flag",
        "it takes contiguous tensors only, as torch.distributed's collectives do on gloo "
        "and NCCL ('Tensors must be contiguous'): the non-contiguous row does not apply",
    ),
    Option(
        "equal-shapes",
        "flag",
        "it gathers equal shapes only, every rank's shard the same shape (the list form of "
        "torch.distributed.all_gather): cases of unequal shapes are not drawn, and rows about "
        "them are out of scope (--op all_gather_v)",
    ),
    Option(
        "compile",
        "flag",
        "it claims to work inside torch.compile(fullgraph=True): the compiled row runs its "
        "calls in compiled steps (vargather's own: always)",
    ),
    Option(
        "sizes",
        "choice",
        "how it takes sizes: 'any' none, a list or a tensor; 'tensor' none or a 1-d int64 "
        "tensor; 'required' always the true sizes; 'list' always, as a list of ints; "
        "'never' called without (default: any)",
        choices=("any", "tensor", "required", "list", "never"),
    ),
    Option(
        "returns",
        "choice",
        "what it returns: 'auto' a tensor or (tensor, sizes|layout); 'tensor'; 'tuple' "
        "(tensor, sizes|layout); 'list' per-rank tensors, concatenated along dim by the "
        "gate (default: auto)",
        choices=("auto", "tensor", "tuple", "list"),
    ),
    Option(
        "convention",
        "choice",
        "how to call ATTR, a shorthand for two call templates: 'seed' (x, dim, sizes), "
        "'vargather' (x, dim, *, sizes, group, grad), or 'auto': vargather when ATTR takes "
        "a 'grad' or 'group' parameter, seed otherwise (default: auto)",
        choices=("auto", "vargather", "seed"),
    ),
    Option(
        "transports",
        "names",
        "transport= values to call a vargather-style ATTR with; 'auto': each of "
        "vargather's gloo transports when ATTR accepts transport=, else none (default: auto)",
        metavar="auto|none|NAME,...",
    ),
    Option(
        "emulate",
        "choice",
        "run the ranks with torch.distributed's collectives intercepted to behave as this "
        "backend does where gloo differs (see docs/conformance.md)",
        choices=("nccl",),
    ),
    Option(
        "nan-payloads",
        "choice",
        "what a NaN in a reduction's result must hold: 'exact' the oracle's bits (default); "
        "'backend' (the code reduces on the backend, whose NaN payloads IEEE 754 leaves "
        "unspecified): a NaN where the oracle has a NaN is equal, a payload difference is "
        "reported, and fails only with --strict (see docs/conformance.md)",
        choices=("exact", "backend"),
    ),
    Option(
        "strict",
        "flag",
        "an 'unsupported' row (the backend refuses a dtype) fails the check too, and so does "
        "a NaN payload difference under --nan-payloads backend",
    ),
    Option(
        "xfails",
        "path",
        "file of property ids expected to fail, one per line, '#' comments (strict)",
        metavar="FILE",
        field_name="xfails_path",
    ),
    Option(
        "max-examples",
        "int",
        "Hypothesis examples per property, each a batch of gathers on one world (default: 60)",
        metavar="N",
    ),
    Option(
        "seed",
        "int",
        "Hypothesis seed; a given seed gives the same run (default: 0)",
        metavar="S",
    ),
    Option(
        "timeout",
        "float",
        "longest a batch of examples may take on the ranks before the implementation "
        "counts as hung (default: 30)",
        metavar="SECONDS",
    ),
    Option(
        "shrink-budget",
        "int",
        "examples a property may run shrinking a failure to a minimal counterexample (a "
        "count, so every run shrinks alike) (default: 200)",
        metavar="N",
    ),
    Option(
        "max-payload",
        "bytes",
        "largest shard a rank gathers in the large cases (about one case in six is sized "
        "around a payload threshold); accepts 4194304, 4MiB, 512KiB; 0 draws small cases "
        "only (default: 4MiB)",
        metavar="BYTES",
    ),
    Option(
        "db",
        "path",
        "keep Hypothesis's example database in DIR (default: nothing is written)",
        metavar="DIR",
        surfaces=frozenset({CLI, PLUGIN}),
    ),
    Option(
        "exitfirst",
        "flag",
        "stop at the first property that fails (the rest are reported as not run)",
        surfaces=frozenset({CLI}),
    ),
    Option(
        "json",
        "path",
        "also write the report as JSON to PATH",
        metavar="PATH",
        surfaces=frozenset({CLI}),
        field_name="json_path",
    ),
    Option(
        "timings",
        "flag",
        "the JSON report holds each row's and the run's seconds (left out by default: "
        "without them a seed's JSON is the same bytes every run)",
        surfaces=frozenset({CLI, CONFIG}),
    ),
    Option(
        "only",
        "ids",
        "run only these properties (default: all)",
        metavar="ID,ID,...",
        surfaces=frozenset({CLI}),
    ),
)
"""Every option of the gate, in the order ``--help`` lists them."""


def on(surface: str) -> tuple[Option, ...]:
    """The options settable on ``surface`` (``CLI``, ``CONFIG``, ``PLUGIN``)."""
    return tuple(o for o in OPTIONS if surface in o.surfaces)

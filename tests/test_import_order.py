"""The library's imports follow its stage story (``docs/architecture.md``): a stage
imports only earlier stages and the modules beneath every stage, and no library module
imports the testing kit, the command line or a test-only dependency."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

import vargather

PACKAGE = pathlib.Path(vargather.__file__).parent
ROOT = pathlib.Path(__file__).resolve().parent.parent

# Bottom to top: a module may import only modules earlier in this list.
ORDER = [
    "_errors",
    "_dtypes",
    "_reduced",
    "_choices",
    "_collectives",
    "_group",
    "_mesh",
    "_census",
    "_comm",
    "_args",
    "_wire",
    "_layout",
    "_exchange",
    "_rows",
    "_buffers",
    "_transport",
    "_round_state",
    "_round_buffers",
    "_fused",
    "_autograd",
    "_compiled",
    "_gather",
    "_family",
    "_steady",
    "_reduce_scatter",
    "_all_to_all_rows",
    "_all_to_all",
    "_gather_list",
    "_rooted",
    "_api",
    "_sequence_parallel",
    "oracle",
    "compat",
    "__init__",
    "internal",
]


def _imports(module: str) -> set[str]:
    """The ``vargather`` modules ``module`` imports (relative or absolute)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("vargather."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vargather."):
                    found.add(alias.name.split(".")[1])
    return found


@pytest.mark.parametrize("module", ORDER)
def test_a_module_imports_only_modules_below_it(module: str) -> None:
    below = set(ORDER[: ORDER.index(module)])
    assert _imports(module) <= below, f"{module} imports {_imports(module) - below}"


def test_the_library_modules_are_all_placed() -> None:
    kit = {"__main__", "strategies", "testing"}  # the kit's own entry points
    library = {
        p.stem
        for p in PACKAGE.glob("*.py")
        if p.stem not in kit
        and not p.stem.startswith(("_cases", "_check", "_pool", "_bench", "_demo"))
    }
    assert library == set(ORDER)


def test_the_exchange_knows_no_transport() -> None:
    assert "_transport" not in _imports("_exchange")
    assert "_transport" not in _imports("_args")


IMPORT_STEPS = {
    "vargather": "import vargather",
    "library": "import vargather.oracle, vargather.compat",
    "kit": "import vargather.testing.engine, vargather.testing.plugin",
}
"""What ``imports_seen`` imports, in this order, in one fresh interpreter."""


@pytest.fixture(scope="module")
def imports_seen() -> dict[str, list[str]]:
    """``sys.modules`` after each of ``IMPORT_STEPS`` in one fresh interpreter (its
    tests share one xdist group, ``conftest.SHARED_MODULE_FIXTURES``): each fresh
    interpreter imports torch, about 2.5 CPU-seconds, and these steps only add
    modules, so a later step's imports cannot hide an earlier step's."""
    lines = ["import json, sys", "seen = {}"]
    for step, statement in IMPORT_STEPS.items():
        lines += [statement, f"seen[{step!r}] = sorted(sys.modules)"]
    lines.append("print(json.dumps(seen))")
    code = "\n".join(lines)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    seen: dict[str, list[str]] = json.loads(out.stdout)
    return seen


def test_import_vargather_loads_none_of_the_kit(imports_seen: dict[str, list[str]]) -> None:
    """Nor dynamo or inductor (about a second of import): the compile support marks and
    wraps its functions for dynamo only when a trace first needs them."""
    bad = sorted(
        m
        for m in imports_seen["vargather"]
        if m.split(".")[0] in ("hypothesis", "pytest", "einops", "rich", "matplotlib")
        or m.startswith(("vargather.testing", "vargather._cli", "torch._dynamo", "torch._inductor"))
    )
    assert bad == []


def test_the_library_modules_import_nothing_of_the_kit(imports_seen: dict[str, list[str]]) -> None:
    """``vargather.oracle`` and ``vargather.compat`` (public modules the package does not
    import itself) leave the kit, the command line and Hypothesis out too."""
    bad = [
        m
        for m in imports_seen["library"]
        if m.startswith(("vargather.testing", "vargather._cli", "hypothesis"))
    ]
    assert bad == []


# --- the testing kit and the command line ------------------------------------------------

KIT = PACKAGE / "testing"
CLI = PACKAGE / "_cli"

# The gate's engine in the kit, bottom to top: a module imports only engine modules
# earlier in this list (and the rest of the kit, beneath the engine).
ENGINE_ORDER = [
    "schema",
    "usage_errors",
    "calls",
    "results",
    "options",
    "resolve",
    "verdict",
    "progress",
    "isolated",
    "races",
    "evaluate",
    "dtensor_program",  # the dtensor target's program and oracle
    "program_rows",  # the rows of the targets that run programs of their own
    "dtensor_target",
    "ulysses_target",
    "ep_dispatch_target",
    "targets",
    "engine",
    "plugin",
]


def _module_imports(path: pathlib.Path, package: str) -> set[str]:
    """Every module ``path`` imports, as absolute dotted names (relative imports
    resolved against ``package``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                found.add(target)
                if not node.module:
                    found.update(f"{base}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(KIT.glob("*.py")), ids=lambda p: p.stem)
def test_the_kit_imports_nothing_of_the_command_line(path: pathlib.Path) -> None:
    imported = _module_imports(path, "vargather.testing")
    assert not {m for m in imported if m.startswith("vargather._cli")}, path.name


@pytest.mark.parametrize("module", ENGINE_ORDER)
def test_an_engine_module_imports_only_engine_modules_below_it(module: str) -> None:
    imported = _module_imports(KIT / f"{module}.py", "vargather.testing")
    engine = {m.removeprefix("vargather.testing.") for m in imported} & set(ENGINE_ORDER)
    below = set(ENGINE_ORDER[: ENGINE_ORDER.index(module)])
    assert engine <= below, f"{module} imports {engine - below}"


def test_the_schema_imports_the_standard_library_only() -> None:
    """The pytest plugin loads ``testing/schema.py`` by path in every session."""
    imported = _module_imports(KIT / "schema.py", "vargather.testing")
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in imported), imported


def test_the_command_line_reaches_the_kit_not_the_reverse(
    imports_seen: dict[str, list[str]],
) -> None:
    """``_cli`` modules import the kit; running the kit's engine and plugin loads no
    ``vargather._cli`` module."""
    assert any(
        m.startswith("vargather.testing")
        for m in _module_imports(CLI / "check.py", "vargather._cli")
    )
    assert [m for m in imports_seen["kit"] if m.startswith("vargather._cli")] == []


def test_the_trace_constant_mark_is_dynamos_own() -> None:
    """vargather marks its trace-time constants itself (``_compiled._constant_of_the_trace``)
    instead of importing dynamo for ``assume_constant_result``: the mark must stay the
    attribute that decorator sets, or a torch upgrade would have dynamo trace them."""
    import torch._dynamo

    from vargather import _compiled

    def probe() -> bool:
        return True

    marked = torch._dynamo.assume_constant_result(probe)  # type: ignore[no-untyped-call]
    mine = _compiled._constant_of_the_trace(lambda: True)
    assert set(vars(marked)) == set(vars(mine)) == {"_dynamo_marked_constant"}
    assert vars(marked) == vars(mine)


def _private_library_imports(path: pathlib.Path, package: str) -> set[str]:
    """The private library modules ``path`` (a module of ``package``) imports
    (``vargather._x``; ``vargather._cli`` not counted), by import statement, from
    ``vargather`` or by ``importlib.import_module("vargather._x")``."""
    names = _module_imports(path, package)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            names.update(a.value for a in node.args if isinstance(a, ast.Constant))
        if isinstance(node, ast.ImportFrom) and not node.module:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            names.update(f"{base}.{alias.name}" for alias in node.names)
        if isinstance(node, ast.ImportFrom) and node.module == "vargather" and not node.level:
            names.update(f"vargather.{alias.name}" for alias in node.names)
    return {
        str(n)
        for n in names
        if str(n).startswith("vargather._")
        and not str(n).startswith(("vargather._cli", "vargather.__"))
    }


def _package_of(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])


@pytest.mark.parametrize(
    "path",
    sorted([*KIT.rglob("*.py"), *CLI.rglob("*.py")]),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_kit_and_the_command_line_import_no_private_library_module(
    path: pathlib.Path,
) -> None:
    """What they need of the internals comes from ``vargather.internal``."""
    assert not _private_library_imports(path, _package_of(path)), path.name


def test_the_private_import_check_can_fail(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    for text in (
        "from vargather._fused import FusedState\n",
        "from .. import _wire\n",
        "from vargather import _round_state\n",
        "import importlib\nimportlib.import_module('vargather._round_state')\n",
    ):
        probe.write_text(text)
        assert _private_library_imports(probe, "vargather.testing"), text
    probe.write_text("from vargather.internal import THRESHOLDS\nfrom .._cli import check\n")
    assert not _private_library_imports(probe, "vargather.testing")


def test_every_collective_of_the_table_has_its_catalogue() -> None:
    """A collective's catalogue plugs in as ``vargather.testing.catalogues.<name>``:
    one module per collective with a catalogue in the library's table, no other."""
    from vargather import COLLECTIVES
    from vargather.testing.catalogues import catalogue_of

    named = {c.catalogue for c in COLLECTIVES.values() if c.catalogue is not None}
    modules = {p.stem for p in (KIT / "catalogues").glob("*.py")} - {"__init__"}
    assert modules == named
    for name in named:
        assert catalogue_of(name).op == name


def test_the_engine_names_no_collective() -> None:
    """The engine's row loop is the same for every collective: it names none."""
    from vargather import COLLECTIVES

    text = (KIT / "engine.py").read_text()
    assert not [name for name in COLLECTIVES if f'"{name}"' in text]


def _import_time_imports(body: list[ast.stmt], package: str, found: set[str]) -> set[str]:
    """The modules ``body`` (a module of ``package``) imports when it is imported: its
    import statements outside functions and outside ``if TYPE_CHECKING:`` (a deferred
    import in a function asks a layer above at call time, a hook, not a layer's
    dependency)."""
    for node in body:
        if isinstance(node, ast.If):
            test = node.test
            if getattr(test, "id", getattr(test, "attr", "")) != "TYPE_CHECKING":
                _import_time_imports(node.body, package, found)
            _import_time_imports(node.orelse, package, found)
        elif isinstance(node, ast.Try):
            for part in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                _import_time_imports(part, package, found)
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            if node.module:
                found.add(f"{base}.{node.module}")
            else:
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _kit_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Every module of the package at ``root`` and the package's modules it imports at
    import time; a ``catalogues`` package imports each of its modules (by importlib)."""
    modules: dict[str, pathlib.Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts)).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        home = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = _import_time_imports(ast.parse(path.read_text()).body, home, set())
        graph[name] = {m for m in found if m in modules and m != name}
    for name in graph:
        if name.endswith(".catalogues"):
            graph[name] |= {m for m in modules if m.startswith(f"{name}.")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        found: list[str] = err.args[1]
        return found
    return None


def test_the_kit_has_no_import_cycle() -> None:
    """The kit's modules form layers as the library's do: no module imports, at import
    time, one that imports it back (the catalogues' rows hold their catalogue, so no row
    looks its collective up, and the options ask the catalogues only when checking an
    id)."""
    assert _cycle(_kit_graph(KIT, "vargather.testing")) is None


def test_the_kit_cycle_check_can_fail(tmp_path: pathlib.Path) -> None:
    (tmp_path / "catalogues").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "options.py").write_text("from .properties import ids\n")
    (tmp_path / "properties.py").write_text("from .catalogues import find\n")
    (tmp_path / "catalogues" / "__init__.py").write_text("import importlib\n")
    (tmp_path / "catalogues" / "one.py").write_text("from ..options import OptionError\n")
    assert _cycle(_kit_graph(tmp_path, "kit")) is not None
    (tmp_path / "options.py").write_text("def ids():\n    from .properties import ids\n")
    assert _cycle(_kit_graph(tmp_path, "kit")) is None

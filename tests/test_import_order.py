"""The library's imports follow its stage story (``docs/architecture.md``): a stage
imports only earlier stages and the modules beneath every stage, and no library module
imports the testing kit, the command line or a test-only dependency."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import vargather

PACKAGE = pathlib.Path(vargather.__file__).parent

# Bottom to top: a module may import only modules earlier in this list.
ORDER = [
    "_errors",
    "_dtypes",
    "_choices",
    "_group",
    "_mesh",
    "_census",
    "_comm",
    "_args",
    "_wire",
    "_layout",
    "_exchange",
    "_buffers",
    "_transport",
    "_fused",
    "_autograd",
    "_compiled",
    "_family",
    "_reduce_scatter",
    "_all_to_all",
    "_gather_list",
    "_compiled_family",
    "_family_api",
    "_api",
    "oracle",
    "compat",
    "__init__",
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


def test_import_vargather_loads_none_of_the_kit() -> None:
    code = (
        "import sys, vargather; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('hypothesis', 'pytest', 'einops', 'rich', 'matplotlib') "
        "or m.startswith(('vargather.testing', 'vargather._cli'))); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

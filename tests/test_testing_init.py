"""The testing kit as a layer (``vargather/testing/__init__.py``): the library never
imports it (``tests/test_import_order.py``), it says what to install when Hypothesis
is missing, and no module of the package takes part in an import cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vargather"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_without_hypothesis_check_and_the_kit_name_the_extra() -> None:
    """One interpreter (each fresh one imports torch, about 2.5 CPU-seconds) without
    Hypothesis: ``check`` first, as a user runs it, exits 2 naming the extra; then
    importing the kit raises an ImportError naming it. (That ``import vargather`` and
    its public modules load nothing of the kit is ``tests/test_import_order.py``'s.)"""
    proc = _python(
        "import sys\n"
        "sys.modules['hypothesis'] = None  # as if not installed\n"
        "from vargather._cli import main\n"
        "status = main(['check', '--list'])\n"
        "try:\n"
        "    import vargather.testing\n"
        "except ImportError as err:\n"
        "    print('kit:', err)\n"
        "sys.exit(status)\n"
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'vargather[test]'" in proc.stderr
    (kit,) = [line for line in proc.stdout.splitlines() if line.startswith("kit: ")]
    assert "pip install 'vargather[test]'" in kit, proc.stdout


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The package modules ``path`` imports, at import time or inside functions (an
    import inside a function hides a cycle, it does not remove it); imports under
    ``if TYPE_CHECKING:`` do not run and do not count."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("vargather")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }
    # A submodule importing names from its own package (already being imported when
    # the submodule runs) is no cycle: drop the edges up to an enclosing package.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    assert _cycles(graph) == []

"""The one table of collectives (``vargather.COLLECTIVES``): every collective vargather
offers is in it once, its wire code is its position, its oracle functions exist, and
no library module writes the collectives' names as a list of its own."""

from __future__ import annotations

import ast
import pathlib

import vargather
import vargather.oracle
from vargather import _collectives

PACKAGE = pathlib.Path(vargather.__file__).parent


def test_the_table_is_every_public_collective_once_in_wire_code_order() -> None:
    names = tuple(vargather.COLLECTIVES)
    assert names == vargather.COLLECTIVE_NAMES
    assert [c.code for c in vargather.COLLECTIVES.values()] == list(range(len(names)))
    for name, c in vargather.COLLECTIVES.items():
        assert c.name == name
        assert callable(getattr(vargather, name)), name
        assert name in vargather.__all__


def test_each_oracle_names_a_function_of_the_oracle() -> None:
    for c in vargather.COLLECTIVES.values():
        assert callable(getattr(vargather.oracle, c.oracle)), c.name
        assert callable(getattr(vargather.oracle, c.oracle_grads)), c.name
        assert c.oracle in vargather.oracle.__all__
        assert c.oracle_grads in vargather.oracle.__all__


def test_a_collective_without_a_catalogue_is_checked_by_one_that_has_one() -> None:
    for c in vargather.COLLECTIVES.values():
        owner = vargather.COLLECTIVES[c.checked_by]
        assert owner.catalogue is not None, c.name
        assert (c.catalogue is None) == (c.checked_by != c.name), c.name


def test_codes_read_back_and_unknown_codes_are_named_so() -> None:
    for c in vargather.COLLECTIVES.values():
        assert _collectives.by_code(c.code) is c
        assert _collectives.name_of_code(c.code) == c.name
    for code in (-1, len(vargather.COLLECTIVES), 1 << 20):
        assert _collectives.by_code(code) is None
        assert _collectives.name_of_code(code) == "?"


def test_the_table_module_imports_the_standard_library_only() -> None:
    """The pytest plugin's option schema may load it by path, without torch."""
    import sys

    tree = ast.parse((PACKAGE / "_collectives.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0
            assert node.module is not None
            assert node.module.split(".")[0] in sys.stdlib_module_names, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name


def _name_lists(path: pathlib.Path) -> list[tuple[int, list[str]]]:
    """Tuples, lists and sets of two or more string constants in ``path`` that are all
    collective names (a hand-written list of the collectives)."""
    found = []
    names = set(vargather.COLLECTIVES)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) >= 2 and all(v in names for v in values):
                found.append((node.lineno, [str(v) for v in values]))
    return found


def test_no_library_module_lists_the_collectives_itself() -> None:
    listed = {
        p.name: _name_lists(p)
        for p in sorted(PACKAGE.glob("*.py"))
        if p.name not in {"_collectives.py", "__init__.py"}
    }
    assert {name: found for name, found in listed.items() if found} == {}

"""vargather's pytest plugin: the ``pytest11`` entry point ``vargather`` (the ``test`` extra).

Where it sits: outside the ``vargather`` package on purpose, so that loading it imports
pytest only; ``import vargather`` would import torch in every pytest session of every
project that has vargather installed. Its machinery is ``vargather.testing.plugin``,
imported only by a session that uses it:

* ``pytest --vargather-impl MODULE:ATTR [--vargather-grad local ...]`` collects the
  conformance properties of ``python -m vargather check`` as test items, one per
  property, ``vargather::ID`` (``-k``, ``-n`` (xdist), ``-x`` and the reports work on
  them as on any test). Each ``--vargather-NAME VALUE`` is the check's option ``NAME``
  of the gate's one option schema (``vargather/testing/schema.py``, loaded by path so
  that nothing of vargather is imported), validated by the gate's options model;
* the fixture ``vargather_world``: ``vargather_world(3).run(fn, payload)`` runs a
  module-level ``fn(ctx, payload)`` on every rank of the session's 3-rank gloo world.

A session that asks for neither gets no items, no header lines and no imports beyond
this module: only the ``vargather`` option group in ``pytest --help``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from vargather.testing.options import CheckOptions
    from vargather.testing.plugin import WorldFactory
    from vargather.testing.schema import Option

__all__ = ["CHECK_OPTIONS", "check_values", "plugin_options"]

_SCHEMA_NAME: Final = "_vargather_check_schema"


def _schema() -> ModuleType:
    """The gate's one option schema, ``vargather/testing/schema.py``, loaded by file
    path under a private name: importing ``vargather.testing`` would import vargather
    and torch in every pytest session. The schema imports the standard library only."""
    loaded = sys.modules.get(_SCHEMA_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("vargather")  # finds, does not import, the package
    if spec is None or spec.origin is None:
        raise pytest.UsageError("vargather: the vargather package is not importable")
    path = os.path.join(os.path.dirname(spec.origin), "testing", "schema.py")
    schema_spec = importlib.util.spec_from_file_location(_SCHEMA_NAME, path)
    assert schema_spec is not None  # a .py file
    assert schema_spec.loader is not None
    module = importlib.util.module_from_spec(schema_spec)
    sys.modules[_SCHEMA_NAME] = module  # dataclasses look their module up by name
    schema_spec.loader.exec_module(module)
    return module


def plugin_options() -> tuple[Option, ...]:
    """The check's options the plugin takes, ``--vargather-NAME``: the schema's
    options settable from pytest (``impl`` among them)."""
    schema = _schema()
    found: tuple[Option, ...] = schema.on(schema.PLUGIN)
    return found


CHECK_OPTIONS: Final = ("config", "no-config")
"""The plugin's options that are not check options but say where the config table is
(``--vargather-config FILE``, ``--vargather-no-config``); every other
``--vargather-NAME`` is an option of the schema (``plugin_options``)."""

_OPTIONS_KEY: Final[pytest.StashKey[CheckOptions]] = pytest.StashKey()
_USED_KEY: Final[pytest.StashKey[bool]] = pytest.StashKey()


def _dest(name: str) -> str:
    return "vargather_" + name.replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "vargather", "vargather: the conformance properties of `python -m vargather check`"
    )
    for option in plugin_options():
        how: dict[str, Any] = {"default": None, "dest": _dest(option.name)}
        if option.is_flag:
            how["action"] = "store_true"
        elif option.kind == "choice":
            how["choices"] = option.choices
        else:
            how["metavar"] = option.metavar or option.name.upper()
        text = option.help
        if option.name == "impl":
            text = (
                "collect vargather's conformance properties as test items (vargather::ID), "
                "run against the ragged all_gather MODULE:ATTR (importable from the current "
                "directory or PYTHONPATH)"
            )
        elif option.name == "target":
            text = (
                "collect a built-in target's properties as test items instead (torch's or "
                "Megatron-core's ragged code: check's --target; 'list' is the command's)"
            )
        else:
            text = f"{text} (check's --{option.name}; needs --vargather-impl)"
        group.addoption(f"--vargather-{option.name}", help=text, **how)
    group.addoption(
        "--vargather-config",
        metavar="FILE",
        default=None,
        dest=_dest("config"),
        help="the TOML file whose [tool.vargather.check] table to read (needs --vargather-impl)",
    )
    group.addoption(
        "--vargather-no-config",
        action="store_true",
        default=None,
        dest=_dest("no-config"),
        help="read no [tool.vargather.check] table (needs --vargather-impl)",
    )


def check_values(config: pytest.Config) -> dict[str, object] | None:
    """The option values the ``--vargather-*`` options give (option name -> the text
    given, ``True`` for a flag), ``config``/``no-config`` among them; ``None`` when the
    session does not ask for the properties (no ``--vargather-impl``)."""
    names = [o.name for o in plugin_options()] + list(CHECK_OPTIONS)
    values = {name: config.getoption(_dest(name)) for name in names}
    given = {name: value for name, value in values.items() if value is not None}
    if "impl" not in given and "target" not in given:
        if given:
            flags = ", ".join(f"--vargather-{name}" for name in given)
            raise pytest.UsageError(
                f"vargather: {flags} given without --vargather-impl or --vargather-target"
            )
        return None
    return given


def pytest_configure(config: pytest.Config) -> None:
    values = check_values(config)
    if values is None:
        return
    from vargather.testing.plugin import configure

    config.stash[_OPTIONS_KEY] = configure(values)
    config.stash[_USED_KEY] = True


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    options = config.stash.get(_OPTIONS_KEY, None)
    if options is None:
        return None
    from vargather.testing.plugin import header_lines

    return header_lines(options)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    options = config.stash.get(_OPTIONS_KEY, None)
    if options is None:
        return
    from vargather.testing.plugin import property_items

    items.extend(property_items(session, options))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Close the rank worlds this session used (through the properties or the fixture)."""
    if not session.config.stash.get(_USED_KEY, False):
        return
    pool = sys.modules.get("vargather.testing.pool")
    if pool is not None:
        pool.close_all_pools()


@pytest.fixture(scope="session")
def vargather_world(request: pytest.FixtureRequest) -> WorldFactory:
    """A factory of persistent gloo worlds: ``vargather_world(3).run(fn, payload)`` runs
    the module-level ``fn(ctx, payload)`` on every rank of the session's 3-rank world and
    returns the per-rank results. A rank's exception, crash or hang fails the test with
    a message naming the rank; the world is rebuilt after a crash or a hang."""
    from vargather.testing.plugin import WorldFactory

    request.config.stash[_USED_KEY] = True
    return WorldFactory()

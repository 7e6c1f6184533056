"""vargather's pytest plugin: the ``pytest11`` entry point ``vargather`` (the ``test`` extra).

Where it sits: outside the ``vargather`` package on purpose, so that loading it imports
pytest only; ``import vargather`` would import torch in every pytest session of every
project that has vargather installed. Its machinery is ``vargather.testing.plugin``,
imported only by a session that uses it:

* ``pytest --vargather-impl MODULE:ATTR [--vargather-grad local ...]`` collects the
  conformance properties of ``python -m vargather check`` as test items, one per
  property, ``vargather::ID`` (``-k``, ``-n`` (xdist), ``-x`` and the reports work on
  them as on any test). Each ``--vargather-NAME VALUE`` is the check's ``--NAME VALUE``
  (``CHECK_OPTIONS``), parsed and validated by the check's own parser;
* the fixture ``vargather_world``: ``vargather_world(3).run(fn, payload)`` runs a
  module-level ``fn(ctx, payload)`` on every rank of the session's 3-rank gloo world.

A session that asks for neither gets no items, no header lines and no imports beyond
this module: only the ``vargather`` option group in ``pytest --help``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from vargather._cli.gate import CheckOptions
    from vargather.testing.plugin import WorldFactory

__all__ = ["CHECK_OPTIONS", "check_argv"]

CHECK_OPTIONS: Final = (
    ("grad", "CONTRACT", "the gradient contract ATTR claims: sum, local or mean"),
    ("world-sizes", "W,W,...", "world sizes to run the properties on, e.g. 2,3"),
    ("max-examples", "N", "Hypothesis examples per property"),
    ("seed", "S", "Hypothesis seed; a given seed gives the same run"),
    ("convention", "auto|seed|vargather", "how to call ATTR"),
    ("transports", "auto|none|NAME,...", "transport= values to call a vargather-style ATTR with"),
    ("timeout", "SECONDS", "longest a batch of examples may take before ATTR counts as hung"),
    ("shrink-budget", "SECONDS", "time a property may spend shrinking a failure"),
    ("xfails", "FILE", "property ids expected to fail, one per line (strict)"),
)
"""The check's options the plugin takes: ``--vargather-NAME VALUE`` is passed on as
``python -m vargather check``'s ``--NAME VALUE`` (see its ``--help`` for the defaults).
(name, metavar, help)."""

_OPTIONS_KEY: Final[pytest.StashKey[CheckOptions]] = pytest.StashKey()
_USED_KEY: Final[pytest.StashKey[bool]] = pytest.StashKey()


def _dest(name: str) -> str:
    return "vargather_" + name.replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "vargather", "vargather: the conformance properties of `python -m vargather check`"
    )
    group.addoption(
        "--vargather-impl",
        metavar="MODULE:ATTR",
        default=None,
        dest="vargather_impl",
        help=(
            "collect vargather's conformance properties as test items (vargather::ID), run "
            "against the ragged all_gather MODULE:ATTR (importable from the current "
            "directory or PYTHONPATH)"
        ),
    )
    for name, metavar, text in CHECK_OPTIONS:
        group.addoption(
            f"--vargather-{name}",
            metavar=metavar,
            default=None,
            dest=_dest(name),
            help=f"{text} (check's --{name}; needs --vargather-impl)",
        )


def check_argv(config: pytest.Config) -> list[str] | None:
    """The ``python -m vargather check`` arguments the ``--vargather-*`` options spell;
    ``None`` when the session does not ask for the properties (no ``--vargather-impl``)."""
    impl = config.getoption("vargather_impl")
    given = [
        (name, config.getoption(_dest(name)))
        for name, _, _ in CHECK_OPTIONS
        if config.getoption(_dest(name)) is not None
    ]
    if impl is None:
        if given:
            flags = ", ".join(f"--vargather-{name}" for name, _ in given)
            raise pytest.UsageError(f"vargather: {flags} given without --vargather-impl")
        return None
    argv = ["--impl", str(impl)]
    for name, value in given:
        argv += [f"--{name}", str(value)]
    return argv


def pytest_configure(config: pytest.Config) -> None:
    argv = check_argv(config)
    if argv is None:
        return
    from vargather.testing.plugin import configure

    config.stash[_OPTIONS_KEY] = configure(argv)
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

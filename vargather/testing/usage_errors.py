"""The kit's usage errors: a check that cannot start, and a bad value of one option.

Where it sits: at the bottom of the gate's engine, beside ``schema`` (whose
``OptionValueError`` an ``OptionError`` spells). ``options`` re-exports both; the
catalogues and ``resolve`` raise them without importing ``options`` (which asks the
catalogues for their row ids), so no import circle runs through them.
"""

from __future__ import annotations

from vargather import VarGatherError

from . import schema


class CheckUsageError(VarGatherError, ValueError):
    """The check cannot start: a bad option, an unreadable xfails file, or an
    implementation that does not import or whose call does not fit. The command line
    prints it and exits with status 2; the pytest plugin stops the session."""


class OptionError(schema.AnyOptionError, CheckUsageError):
    """A bad value of one option: ``option`` is its name, ``detail`` the rest of the
    message; ``spelled(spelling)`` is the message as a surface spells the option."""

"""A source file outside the package (a script, an example, a fuzz program,
``docs/conf.py``) imported by its path, for the tests that check it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_path(name: str, path: Path | str) -> ModuleType:
    """The file at ``path`` imported as module ``name``, registered in ``sys.modules``
    (a dataclass defined in it looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

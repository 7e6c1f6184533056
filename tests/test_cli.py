"""``python -m vargather``: the dispatcher of ``vargather/_cli/__init__.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import vargather
from vargather._cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    found = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml declares no version"
    declared = found.group(1)
    assert vargather.__version__ == declared
    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"vargather {declared} (torch "), out


def test_version_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vargather", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"vargather {vargather.__version__} "), done.stdout


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err

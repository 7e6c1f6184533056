"""The repository keeps its promises to a new user: the README's test command is what CI
runs, the constraints pin the local torch build, the package ships its type marker."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- the test command:.*?-->\s*```bash\n(.+?)\n```", text, re.DOTALL)
    assert match, "README.md lost its marked test-command block"
    return match.group(1).strip()


def test_ci_runs_the_readme_test_command() -> None:
    command = readme_test_command()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines, f"README test command {command!r} is not a line of .ci/run"


def test_constraints_pin_the_local_torch_build() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.strip() for line in lines]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"torch>=[\d.]+', pyproject), "pyproject keeps torch a range"
    assert '"torch==' not in pyproject


def test_py_typed_is_shipped() -> None:
    assert (ROOT / "vargather" / "py.typed").exists()
    assert 'vargather = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()

"""The repository keeps its promises to a new user: the README's test command is what CI
runs, the CI steps are defined once (scripts/ci_steps.sh) and every CI entry point
(.ci/run, tox.ini, the GitHub workflows) goes through them, the constraints pin the local
torch build, the package ships its type marker and its licence."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- the test command:.*?-->\s*```bash\n(.+?)\n```", text, re.DOTALL)
    assert match, "README.md lost its marked test-command block"
    return match.group(1).strip()


CI_STEPS = ROOT / "scripts" / "ci_steps.sh"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# Commands that belong to a CI step: written in scripts/ci_steps.sh and nowhere else.
STEP_COMMANDS = (
    "pytest",
    "ruff check",
    "ruff format",
    "mypy --strict",
    "actionlint .",
    "fuzz/fuzz_",
)


def step_body(step: str) -> list[str]:
    """The lines of one step's branch in scripts/ci_steps.sh's `case`."""
    text = CI_STEPS.read_text()
    match = re.search(rf"^\s*{re.escape(step)}\)\n(.*?)^\s*;;", text, re.DOTALL | re.MULTILINE)
    assert match, f"scripts/ci_steps.sh has no {step!r} step"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def defined_steps() -> set[str]:
    listed = subprocess.run(
        ["bash", str(CI_STEPS), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for step in listed:
        step_body(step)
    return set(listed)


def steps_called(text: str) -> list[set[str]]:
    """The step names of each call of scripts/ci_steps.sh in a file's text (not comments)."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    calls = re.findall(r"scripts/ci_steps\.sh((?: +[a-z][a-z-]*)+)", code)
    return [set(call.split()) for call in calls]


def tox_commands() -> dict[str, str]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    default = config["testenv"]["commands"]
    envs = [env.strip() for env in config["tox"]["envlist"].split(",")]
    return {
        env: config[f"testenv:{env}"].get("commands", default).replace("{envname}", env)
        for env in envs
    }


def test_ci_runs_the_readme_test_command() -> None:
    command = readme_test_command()
    assert step_body("tests") in ([command], [f'{command} "$@"']), (
        f"the tests step of scripts/ci_steps.sh is not the README test command {command!r}"
    )
    assert any("tests" in call for call in steps_called((ROOT / ".ci" / "run").read_text()))
    assert "tests" in steps_called(tox_commands()["tests"])[0]
    ci_yml = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert any("tests" in call for call in steps_called(ci_yml))


def test_every_ci_entry_point_runs_the_steps_through_one_script() -> None:
    steps = defined_steps()
    ci_run = set().union(*steps_called((ROOT / ".ci" / "run").read_text()))
    assert ci_run == steps - {"fuzz", "slow"}, ".ci/run runs every CI step but the long ones"
    tox_steps = set().union(*(set().union(*steps_called(c)) for c in tox_commands().values()))
    assert tox_steps == ci_run, "tox's envlist covers what .ci/run runs"
    workflow_steps = set().union(*(set().union(*steps_called(w.read_text())) for w in WORKFLOWS))
    assert workflow_steps == steps, "the workflows run every step, fuzz and slow on schedule"
    for path in [ROOT / ".ci" / "run", ROOT / "tox.ini", *WORKFLOWS]:
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            if re.match(r"\s*(- )?(name|description)\s*[:=]", code):
                continue  # a label, not a command
            stray = [c for c in STEP_COMMANDS if c in code]
            assert not stray, (
                f"{path.name} runs {stray} itself instead of scripts/ci_steps.sh: {line!r}"
            )


def test_the_docs_step_runs_where_the_docs_extra_is_installed() -> None:
    """The site builds with Sphinx from the `docs` extra: every caller of the docs step
    installs it first (.ci/run's venv, tox's docs env, the workflow's docs job)."""
    assert re.search(r'^docs = \[\n(\s+"[^"]+",\n)+\]', (ROOT / "pyproject.toml").read_text(), re.M)
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'pip install .*-e "\.\[[a-z,]*\bdocs\b[a-z,]*\]"', ci_run)
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    assert "docs" in config["testenv:docs"]["extras"].split()
    for workflow in WORKFLOWS:
        jobs = re.split(r"^  (?=[\w-]+:\n)", workflow.read_text(), flags=re.M)
        for job in jobs:
            if any("docs" in call for call in steps_called(job)):
                assert re.search(r'pip install .*-e "\.\[[a-z,]*\bdocs\b[a-z,]*\]"', job), (
                    f"{workflow.name}: a job runs the docs step without the docs extra"
                )


def steps_in_order(text: str) -> list[str]:
    """The step names a file's calls of scripts/ci_steps.sh run, in the order they run."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    calls = re.findall(r"scripts/ci_steps\.sh((?: +[a-z][a-z-]*)+)", code)
    return [step for call in calls for step in call.split()]


def test_the_browser_step_follows_the_docs_step_with_its_extra_and_chromium() -> None:
    """The browser step (tests/test_docs_browser.py) renders the site the docs step
    builds: every caller runs docs first, with the browser extra installed, installs
    Debian's chromium itself and requires the browser (a missing one fails the step
    instead of skipping it); the README's command leaves the browser tests out."""
    extra = r'pip install .*-e "\.\[[a-z,]*\bbrowser\b[a-z,]*\]"'
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^browser = \[\n(\s+"[^"]+",\n)+\]', pyproject, re.M)
    assert re.search(r'"playwright>=[\d.]+', pyproject), "pyproject keeps playwright a range"
    assert re.search(r'^addopts = .*"-m", "[^"]*\bnot browser\b', pyproject, re.M), (
        "the README's test command would run the browser tests too"
    )
    callers = {".ci/run": (ROOT / ".ci" / "run").read_text()}
    for workflow in WORKFLOWS:
        for job in re.split(r"^  (?=[\w-]+:\n)", workflow.read_text(), flags=re.M):
            if "browser" in steps_in_order(job):
                callers[f"{workflow.name}: {job.split(':', 1)[0]}"] = job
    assert len(callers) >= 2, "no workflow job runs the browser step"
    for name, text in callers.items():
        order = steps_in_order(text)
        assert "docs" in order, f"{name} runs the browser step without building the site"
        assert order.index("docs") < order.index("browser"), f"{name}: browser before docs"
        assert re.search(extra, text), f"{name} runs the browser step without its extra"
        assert re.search(r"apt-get install .*\\?\n?\s*chromium\b", text), (
            f"{name} does not install chromium"
        )
        assert re.search(r"VARGATHER_REQUIRE_BROWSER[=:] ?\"?1", text), (
            f"{name} lets the browser step skip"
        )
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    assert "browser" in config["testenv:browser"]["extras"].split()


def test_constraints_pin_the_local_torch_build() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in [line.strip() for line in lines]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"torch>=[\d.]+', pyproject), "pyproject keeps torch a range"
    assert '"torch==' not in pyproject


def test_py_typed_is_shipped() -> None:
    assert (ROOT / "vargather" / "py.typed").exists()
    assert 'vargather = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_licence_is_declared_and_shipped() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "MIT"' in pyproject
    assert 'license-files = ["LICENSE"]' in pyproject
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")

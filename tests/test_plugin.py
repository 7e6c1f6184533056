"""The pytest plugin, run as a user runs it: pytest in a subprocess, in a temporary project
outside this repository.

The plugin is the ``pytest11`` entry point ``vargather`` (the top-level module
``_vargather_pytestplugin``). A checkout that is not pip-installed has no entry point,
so these tests load the module with ``-p`` exactly when the entry point is absent (with
both, pytest would register the module twice and refuse).

* ``--vargather-impl MODULE:ATTR`` collects one item per property of the catalogue,
  ``vargather::ID``; a correct gather passes, a broken one fails with the check's
  counterexample and a ``reproduce:`` line that re-runs it; under ``-n 2`` too;
* the README's example test ("Test your own distributed code"), taken from the README,
  passes for a correct gather and fails with the README's message for a broken one;
* ``vargather_world``: a rank's exception, crash or hang fails the test naming the
  rank, and the next test gets a working world;
* a project that asks for nothing gets the same output as without the plugin, and
  neither torch nor vargather is imported.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from vargather.testing import property_ids

if TYPE_CHECKING:
    from vargather.testing.schema import Option

ROOT = Path(__file__).resolve().parents[1]
README_SECTION = "## Test your own distributed code"
TIMEOUT = 600

GATHERS = '''\
import vargather


def gather(x, dim, *, sizes=None, group=None, grad="local"):
    """A correct ragged all_gather: vargather's, claiming the local contract."""
    return vargather.all_gather_v(x, dim, sizes=sizes, group=group, grad="local")


def broken(x, dim, *, sizes=None, group=None, grad="local"):
    """Loses the last element along dim (an off-by-one in the offsets)."""
    out = vargather.all_gather_v(x, dim, sizes=sizes, group=group, grad="local")
    return out.narrow(dim, 0, max(out.shape[dim] - 1, 0))
'''

# The README example imports `all_gather` from `mypkg.distributed`: the correct gather
# there, the broken one in `mypkg.broken`.
USER_GATHER = """\
from pkg.gather import {name} as _gather


def all_gather(x, dim):
    return _gather(x, dim)
"""


def plugin_args() -> list[str]:
    """``-p _vargather_pytestplugin`` unless the installed distribution's entry point
    loads the plugin already."""
    installed = any(
        ep.name == "vargather" for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "_vargather_pytestplugin"]


def no_plugin_args() -> list[str]:
    """What keeps the plugin out: blocking the entry point, or nothing."""
    return ["-p", "no:vargather"] if not plugin_args() else []


def make_project(root: Path) -> Path:
    """A project with ``pkg/gather.py`` (``gather`` correct, ``broken``) and its own
    pytest configuration (so no ini file above it applies)."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "gather.py").write_text(GATHERS)
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def run_pytest(project: Path, *args: str, plugin: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("CI", None)
    env["OMP_NUM_THREADS"] = "1"
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    loading = plugin_args() if plugin else no_plugin_args()
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *loading, *args]
    return subprocess.run(
        command,
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


PROPERTY_OPTIONS = ("--vargather-world-sizes", "2", "--vargather-max-examples", "2")


# --- the properties as items -----------------------------------------------------------


_SAMPLES: dict[str, str] = {
    # The str and path options need a value that means something; every other kind
    # gets one from the schema itself (_sample).
    "impl": "vargather.testing.reference_seed:all_gather",
    "call": "(x, dim, sizes)",
    "transports": "none",
    "world-sizes": "2,3",
    "dims": "0,-1",
    "max-payload": "512KiB",
    "only": "forward-float,dims",
    "target": "dtensor",  # its declared --grad local is the base's; it takes no --impl
}


def _sample(option: Option, tmp_path: Path) -> str:
    """A value of ``option`` other than its default, as text."""
    if option.name in _SAMPLES:
        return _SAMPLES[option.name]
    if option.kind == "choice":
        return option.choices[-1]
    if option.kind == "path":
        path = tmp_path / f"{option.name}.txt"
        if option.name == "xfails":
            path.write_text("gradient\n")
        return str(path)
    text: str = {"int": "7", "float": "12.5", "flag": "true"}[option.kind]
    return text


def _toml(option: Option, text: str) -> str:
    """``text`` as the TOML value the config table takes for ``option``."""
    if option.kind == "flag":
        return "true"
    if option.kind in ("int", "float"):
        return text
    if option.kind == "ints":
        return "[" + text + "]"
    return json.dumps(text)


def test_every_schema_option_is_set_alike_by_flag_config_and_plugin(tmp_path: Path) -> None:
    """The one option schema: every option reaches the same ``CheckOptions`` field with
    the same value through each surface it is declared for (the command line's flag,
    the ``[tool.vargather.check]`` table, the plugin's ``--vargather-*``), and each
    surface offers exactly the schema's options."""
    import argparse

    import _vargather_pytestplugin as plugin_module
    from vargather._cli.check import _parser, parse_args
    from vargather.testing import schema
    from vargather.testing.plugin import configure

    actions = _parser()._option_string_actions
    plugin_names = {o.name for o in plugin_module.plugin_options()}
    assert plugin_names == {o.name for o in schema.on(schema.PLUGIN)}
    base = {"impl": "vargather.testing.reference_seed:all_gather", "grad": "local"}
    for option in schema.OPTIONS:
        text = _sample(option, tmp_path)
        expected = True if option.is_flag else option.parse_text(text)
        if option.name == "world-sizes":
            expected = tuple(sorted(set(expected)))  # type: ignore[call-overload]  # a tuple of ints
        extra = {k: v for k, v in base.items() if k != option.name}
        if option.name == "target":  # a target names its implementation itself
            extra.pop("impl")
        if option.name == "call":
            extra["convention"] = "auto"
        if option.name in ("convention", "transports"):
            extra.pop("call", None)
        got: dict[str, object] = {}
        if schema.CLI in option.surfaces:
            flag = "--" + option.name
            assert flag in actions, flag
            assert isinstance(actions[flag], argparse._StoreTrueAction) == option.is_flag
            argv = ["--no-config", *(a for k, v in extra.items() for a in (f"--{k}", v))]
            argv += [flag] if option.is_flag else [flag, text]
            got["flag"] = getattr(parse_args(argv), option.field)
        else:
            assert "--" + option.name not in actions, option.name
        if schema.CONFIG in option.surfaces:
            config = tmp_path / f"{option.name}.toml"
            lines = [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
            lines.append(f"{option.name} = {_toml(option, text)}")
            config.write_text("[tool.vargather.check]\n" + "\n".join(lines) + "\n")
            got["config"] = getattr(parse_args(["--config", str(config)]), option.field)
            impl = {} if option.name == "target" else {"impl": base["impl"]}
            via_plugin = configure({**impl, "config": str(config)})
            got["plugin config"] = getattr(via_plugin, option.field)
        if schema.PLUGIN in option.surfaces:
            values: dict[str, object] = {**extra, "no-config": True}
            values[option.name] = True if option.is_flag else text
            got["plugin"] = getattr(configure(values), option.field)
        assert got, f"{option.name}: settable nowhere"
        for surface, value in got.items():
            assert value == expected, (option.name, surface, value, expected)


def test_the_schema_and_the_options_model_name_the_same_options() -> None:
    """Every schema option sets a ``CheckOptions`` field, and every field a user sets
    is a schema option (the rest are the surfaces' bookkeeping); the isolated child's
    options round-trip through JSON."""
    import dataclasses

    from vargather.testing import schema
    from vargather.testing.options import CheckOptions

    bookkeeping = {"config_path", "xfails", "progress", "in_flight"}
    fields = {f.name for f in dataclasses.fields(CheckOptions)}
    assert {o.field for o in schema.OPTIONS} == fields - bookkeeping
    options = CheckOptions(
        impl="m:f", call="(x)", dims=(0,), world_sizes=(2, 3), xfails=frozenset({"dims"})
    )
    assert CheckOptions.from_json(json.loads(json.dumps(options.to_json()))) == options


def test_plugin_values_need_the_impl() -> None:
    import _vargather_pytestplugin as plugin

    class Config:
        def __init__(self, **values: object) -> None:
            self.values = values

        def getoption(self, dest: str) -> object:
            return self.values.get(dest)

    config = Config(vargather_impl="pkg:f", vargather_grad="local", vargather_seed="3")
    values = plugin.check_values(config)  # type: ignore[arg-type]  # a stand-in for pytest.Config
    assert values == {"impl": "pkg:f", "grad": "local", "seed": "3"}
    assert plugin.check_values(Config()) is None  # type: ignore[arg-type]  # the same stand-in
    with pytest.raises(pytest.UsageError, match="--vargather-seed given without --vargather-impl"):
        plugin.check_values(Config(vargather_seed="3"))  # type: ignore[arg-type]  # the same


def test_one_item_per_property_named_by_its_id(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    impl = ("--vargather-impl", "pkg.gather:gather", "--vargather-grad", "local")
    proc = run_pytest(project, *impl, "--collect-only", "-q")
    assert proc.returncode == 0, output(proc)
    items = [line for line in proc.stdout.splitlines() if line.startswith("vargather::")]
    assert items == [f"vargather::{p}" for p in property_ids()], output(proc)


@pytest.mark.multirank
def test_the_op_option_collects_and_runs_the_family_catalogue(tmp_path: Path) -> None:
    from vargather.testing.catalogues import property_ids

    project = make_project(tmp_path)
    op = ("--vargather-op", "reduce_scatter_v", "--vargather-impl", "vargather:reduce_scatter_v")
    proc = run_pytest(project, *op, "--collect-only", "-q")
    assert proc.returncode == 0, output(proc)
    items = [line for line in proc.stdout.splitlines() if line.startswith("vargather::")]
    assert items == [f"vargather::{p}" for p in property_ids("reduce_scatter_v")]
    proc = run_pytest(project, *op, *PROPERTY_OPTIONS, "-k", "empty or misuse")
    assert proc.returncode == 0, output(proc)
    assert "2 passed" in proc.stdout, output(proc)
    assert (
        "vargather:reduce_scatter_v (--op reduce_scatter_v, vargather's signature)" in proc.stdout
    )


@pytest.mark.slow  # default run: items pass and fail through the plugin in the reproduce-line test below
def test_a_correct_gather_passes_every_property(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    proc = run_pytest(
        project,
        "--vargather-impl",
        "pkg.gather:gather",
        "--vargather-grad",
        "local",
        *PROPERTY_OPTIONS,
        "-rs",
    )
    assert proc.returncode == 0, output(proc)
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed)", summary)}
    assert counts.get("failed", 0) == 0, output(proc)
    assert counts.get("passed", 0) + counts.get("skipped", 0) == len(property_ids()), summary
    assert counts["passed"] >= 12, summary
    # What is checked, in the header; why a property is skipped (n/a under grad=local).
    assert (
        "vargather properties: pkg.gather:gather (vargather convention), claimed gradient "
        "contract: local\nvargather properties: world sizes 2; up to 2 examples per property"
    ) in proc.stdout, output(proc)
    assert "SKIPPED" in proc.stdout
    assert "not applicable: an identity of grad='sum'" in proc.stdout


@pytest.mark.parametrize(
    "workers",
    [
        # one session, as test_plugin's others: the items fail and pass through the plugin
        pytest.param(("-p", "no:xdist"), id="one-process"),
        # the same items on two xdist workers: two interpreters more (10 CPU-s), slow
        pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.slow),
    ],
)
def test_a_broken_gather_fails_with_the_reproduce_line(
    workers: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = make_project(tmp_path)
    proc = run_pytest(
        project,
        "--vargather-impl",
        "pkg.gather:broken",
        "--vargather-grad",
        "local",
        "--vargather-world-sizes",
        "1",
        "--vargather-max-examples",
        "2",
        *workers,
        "-k",
        "forward-float or empty-all",
    )
    assert proc.returncode == 1, output(proc)
    # -k selected two of the 17 items (run on two workers under xdist); empty-all holds
    # for a gather that drops an element.
    if workers[0] == "-n":
        assert re.search(r"^2 workers \[2 items\]", proc.stdout, re.M), output(proc)
    else:
        assert re.search(
            r"^collected \d+ items / \d+ deselected / 2 selected", proc.stdout, re.M
        ), output(proc)
    assert re.search(r"\b1 failed, 1 passed\b", proc.stdout), output(proc)
    assert "FAILED vargather::forward-float - mismatch: out.shape=" in proc.stdout, output(proc)
    assert "minimal counterexample (Hypothesis shrank it):" in proc.stdout, output(proc)
    commands = re.findall(r"^\s*reproduce: (python -m vargather repro .*)$", proc.stdout, re.M)
    assert len(commands) == 1, output(proc)
    assert all("--impl pkg.gather:broken --contracts local" in c for c in commands), commands
    # The line re-runs the counterexample: it still fails (exit status 1).
    status, out = rerun_in_process(commands[0], project, monkeypatch, capsys)
    assert status == 1, out
    assert "out.shape=" in out, out


def rerun_in_process(
    command: str,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str]:
    """A printed ``python -m vargather ...`` line, run from ``project`` through the
    command line's entry point in this process, on a world of its own (so no shared
    rank keeps the project's ``pkg``): exit status and output. A fresh interpreter
    would import torch and start a forkserver again (about 5 CPU-seconds); the printed
    line run from a shell is ``tests/test_cli_repro.py``'s."""
    from vargather._cli import main
    from vargather.testing import RankPool, runner

    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "vargather"]
    monkeypatch.chdir(project)
    for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    worlds: dict[int, RankPool] = {}

    def own_world(world_size: int) -> RankPool:
        if world_size not in worlds:
            worlds[world_size] = RankPool(world_size, start_method="forkserver")
        return worlds[world_size]

    monkeypatch.setattr(runner, "get_pool", own_world)
    capsys.readouterr()
    try:
        status = main(argv[3:])
    finally:
        for pool in worlds.values():
            pool.close()
        for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
            del sys.modules[name]
    done = capsys.readouterr()
    return status, done.out + done.err


def test_usage_errors_name_the_plugins_options(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    proc = run_pytest(project, "--vargather-grad", "local")
    assert proc.returncode == 4, output(proc)
    assert "--vargather-grad given without --vargather-impl" in proc.stderr, output(proc)
    proc = run_pytest(project, "--vargather-impl", "pkg.gather:gather", "--vargather-grad", "all")
    assert proc.returncode == 4, output(proc)
    assert "argument --vargather-grad: invalid choice: 'all'" in proc.stderr, output(proc)
    assert "usage: python -m vargather" not in proc.stderr, output(proc)
    proc = run_pytest(project, "--vargather-impl", "pkg.gather:nothing")
    assert proc.returncode == 4, output(proc)
    assert "vargather: --vargather-impl" in proc.stderr
    assert "nothing" in proc.stderr


# --- the README example and the fixture ----------------------------------------------------


def readme_example() -> str:
    """The first ```python block of the README's section on testing your own code."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n{README_SECTION}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert match, f"no ```python block in the README's section {README_SECTION!r}"
    return match.group(1)


def readme_failure_line() -> str:
    """The failure the README shows for the example against a broken gather."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(f"\n{README_SECTION}\n")[1]
    match = re.search(r"^```text\n(AssertionError: .*?)\n```$", section, re.M)
    assert match, "the README's section shows no AssertionError"
    return match.group(1)


def _user_project(root: Path) -> Path:
    """One user project holding the three sessions' worth of tests below: the README's
    example as written (``mypkg.distributed``, correct), the same test against
    ``mypkg.broken`` and against the typical hand-written gather (``mypkg.plain``), the
    world fixture's faults (``test_worlds.py``) and a dtype the backend refuses
    (``test_refused.py``)."""
    project = make_project(root)
    (project / "mypkg").mkdir()
    (project / "mypkg" / "__init__.py").write_text("")
    for module, name in (("distributed", "gather"), ("broken", "broken")):
        (project / "mypkg" / f"{module}.py").write_text(USER_GATHER.format(name=name))
    example = readme_example()
    assert "from mypkg.distributed import all_gather" in example
    (project / "tests").mkdir()
    (project / "tests" / "test_my_gather.py").write_text(example)
    broken = example.replace("from mypkg.distributed import", "from mypkg.broken import")
    (project / "tests" / "test_my_broken_gather.py").write_text(broken)
    # The typical hand-written gather (sizes exchanged, padded, dist.all_gather, cut):
    # plain gloo refuses int16, which the strategies leave out by default.
    plain = (ROOT / "tests" / "forks" / "plain_all_gather.py").read_text(encoding="utf-8")
    (project / "mypkg" / "plain.py").write_text(plain)
    (project / "pkg" / "plain.py").write_text(plain)
    handwritten = example.replace("from mypkg.distributed import", "from mypkg.plain import")
    (project / "tests" / "test_my_plain_gather.py").write_text(handwritten)
    (project / "test_worlds.py").write_text(FIXTURE_TESTS)
    (project / "test_refused.py").write_text(REFUSED_DTYPE_TEST)
    return project


@pytest.fixture(scope="module")
def user_session(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One pytest session over ``_user_project``, as a user runs it (no xdist, every
    outcome in the short summary): its worlds are shared by the files, so a file's
    tests run on worlds the faults of another rebuilt. One session instead of three
    saves two interpreters, forkservers and worlds (about 12 CPU-seconds)."""
    project = _user_project(tmp_path_factory.mktemp("user"))
    return run_pytest(project, "-p", "no:xdist", "-rA")


def outcomes(proc: subprocess.CompletedProcess[str], prefix: str) -> dict[str, str]:
    """The short summary's outcome of every test whose node id starts with ``prefix``
    (``-rA``), by node id."""
    summary = proc.stdout.split("short test summary info", 1)[-1]
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", summary, re.M)
    return {node: outcome for outcome, node in found if node.startswith(prefix)}


def test_the_readme_example_passes_for_a_correct_gather_and_fails_readably(
    user_session: subprocess.CompletedProcess[str],
) -> None:
    proc = user_session
    assert proc.returncode == 1, output(proc)
    assert outcomes(proc, "tests/test_my_") == {
        "tests/test_my_broken_gather.py::test_all_gather_is_the_concatenation": "FAILED",
        "tests/test_my_gather.py::test_all_gather_is_the_concatenation": "PASSED",
        "tests/test_my_plain_gather.py::test_all_gather_is_the_concatenation": "PASSED",
    }, output(proc)
    assert "FAILED tests/test_my_broken_gather.py::" in proc.stdout, output(proc)
    # The README's failure line, up to the numbers of the minimal case Hypothesis found.
    line = readme_failure_line()
    assert re.search(re.sub(r"\d+", r"\\d+", re.escape(line)), proc.stdout), output(proc)
    # Hypothesis's report of the minimal case ("Falsifying example" before 6.1xx).
    assert re.search(
        r"(Falsifying example|Failing test case): test_all_gather_is_the_concatenation\(",
        proc.stdout,
    ), output(proc)
    assert "def assert_bitwise_equal" not in proc.stdout, output(proc)  # the user's line only


FIXTURE_TESTS = """\
import os
import time

import pytest


def raise_on_one(ctx, payload):
    if ctx.rank == 1:
        raise ValueError(f"rank {ctx.rank} refuses {payload!r}")
    return ctx.rank


def die_on_one(ctx, payload):
    if ctx.rank == 1:
        os._exit(7)
    return ctx.rank


def hang_on_zero(ctx, payload):
    if ctx.rank == 0:
        time.sleep(60)
    return ctx.rank


def ranks(ctx, payload):
    return (ctx.rank, ctx.world_size, payload)


def test_an_exception(vargather_world):
    vargather_world(2, call_timeout=5).run(raise_on_one, "x")


def test_a_crash(vargather_world):
    vargather_world(2, call_timeout=5).run(die_on_one, None)


def test_rebuilt_after_the_crash(vargather_world):
    assert vargather_world(2, call_timeout=5).run(ranks, "p") == [(0, 2, "p"), (1, 2, "p")]


def test_a_hang(vargather_world):
    vargather_world(2, call_timeout=2).run(hang_on_zero, None)


def test_rebuilt_after_the_hang(vargather_world):
    world = vargather_world(2, call_timeout=5)
    assert world.run(ranks, 1) == [(0, 2, 1), (1, 2, 1)]
    assert world.run_many(ranks, [1, 2]) == [[(0, 2, 1), (1, 2, 1)], [(0, 2, 2), (1, 2, 2)]]
"""


def test_the_world_fixture_fails_naming_the_rank_and_recovers(
    user_session: subprocess.CompletedProcess[str],
) -> None:
    proc = user_session
    out = proc.stdout
    assert proc.returncode == 1, output(proc)
    # The two tests after a fault pass: the worlds were rebuilt.
    assert outcomes(proc, "test_worlds.py::") == {
        "test_worlds.py::test_an_exception": "FAILED",
        "test_worlds.py::test_a_crash": "FAILED",
        "test_worlds.py::test_rebuilt_after_the_crash": "PASSED",
        "test_worlds.py::test_a_hang": "FAILED",
        "test_worlds.py::test_rebuilt_after_the_hang": "PASSED",
    }, output(proc)
    summary = out.split("short test summary info")[1]
    assert "WorldRunError: vargather_world(2).run(raise_on_one): 1 of 2 rank(s) raised" in summary
    assert "rank 1 (ValueError)" in out, output(proc)
    assert "ValueError: rank 1 refuses 'x'" in out, output(proc)  # the rank's traceback
    assert 'raise ValueError(f"rank {ctx.rank} refuses {payload!r}")' in out, output(proc)
    assert "During handling of the above exception" not in out, output(proc)
    assert "WorldRunError: vargather_world(2).run(die_on_one): rank 1 (exit code 7) died" in summary
    assert "WorldRunError: vargather_world(2).run(hang_on_zero): rank(s) 0 did not reply" in summary
    for name in ("test_an_exception", "test_a_crash", "test_a_hang"):
        assert f"FAILED test_worlds.py::{name} - " in summary, output(proc)


REFUSED_DTYPE_TEST = """\
from hypothesis import given, settings

from pkg.plain import all_gather
from vargather.testing.strategies import gather_cases


def gather_on_rank(ctx, case):
    return all_gather(case.shard_values(ctx.rank), case.dim)


@settings(max_examples=5, deadline=None, database=None)
@given(case=gather_cases(world_size=2, dtypes=["int16"]))
def test_int16(vargather_world, case):
    vargather_world(case.world_size).run(gather_on_rank, case)
"""


def test_a_rank_failure_keeps_hypothesis_falsifying_example_and_names_a_refusal(
    user_session: subprocess.CompletedProcess[str],
) -> None:
    """A backend refusal inside a user's test: the falsifying example Hypothesis found,
    the rank's traceback, and what to do about the dtype."""
    proc = user_session
    out = proc.stdout
    assert outcomes(proc, "test_refused.py::") == {"test_refused.py::test_int16": "FAILED"}, output(
        proc
    )
    assert re.search(r"(Falsifying example|Failing test case): test_int16\(", out), output(proc)
    assert "RuntimeError: Invalid scalar type" in out, output(proc)
    assert "the backend refused the dtype" in out, output(proc)
    assert "vargather.GLOO_NATIVE_DTYPES" in out, output(proc)


# --- a project that does not ask ------------------------------------------------------------


UNRELATED_TESTS = """\
import sys


def test_nothing_heavy_was_imported():
    heavy = {"torch", "vargather"} & {m.split(".")[0] for m in sys.modules}
    assert not heavy, sorted(m for m in sys.modules if m.split(".")[0] in heavy)


def test_two():
    assert 1 + 1 == 2
"""


def _normalized(text: str) -> str:
    text = re.sub(r"\d+(\.\d+)?s\b", "T", text)  # durations
    return re.sub(r"^plugins: .*$", "plugins: ...", text, flags=re.M)


def test_an_unrelated_project_runs_unchanged(tmp_path: Path) -> None:
    project = tmp_path / "other"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_other.py").write_text(UNRELATED_TESTS)
    with_plugin = run_pytest(project, "-p", "no:xdist", "-v")
    without = run_pytest(project, "-p", "no:xdist", "-v", plugin=False)
    assert with_plugin.returncode == 0, output(with_plugin)
    assert without.returncode == 0, output(without)
    assert _normalized(with_plugin.stdout) == _normalized(without.stdout)
    assert with_plugin.stderr == without.stderr == ""
    # Not vacuous: the plugin was loaded in the first run (its options exist there only).
    helps = run_pytest(project, "--help"), run_pytest(project, "--help", plugin=False)
    assert "--vargather-impl=MODULE:ATTR" in helps[0].stdout, output(helps[0])
    assert "--vargather-impl" not in helps[1].stdout, output(helps[1])


def test_the_plugin_module_imports_only_pytest() -> None:
    code = textwrap.dedent(
        """
        import sys
        import _vargather_pytestplugin
        print(sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "vargather", "hypothesis"}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"

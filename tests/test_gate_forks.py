"""The gate on real forks (issue 10): declared scope, faithful failures, determinism.

The fork zoo (``tests/forks``) runs here with few examples per property and a chosen
set of rows (the default-settings run of every member is the ``slow`` test at the
bottom, and ``python -m tests.forks.run_zoo``, whose timings docs/conformance.md
records). Every correct-within-scope member must pass; every buggy one must fail
with its own bug, whose ``reproduce:`` line exits non-zero.
"""

from __future__ import annotations

import functools
import json
import shlex
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.forks import ZOO, Fork
from vargather._cli import check as check_cli
from vargather._cli import main as cli_main
from vargather._cli.check import parse_args, read_config
from vargather.testing import RankPool, get_pool, runner
from vargather.testing.cases import GatherCase, Implementation
from vargather.testing.engine import run_check
from vargather.testing.importer import ImplementationError, parse_impl_ref
from vargather.testing.options import CheckOptions, CheckUsageError
from vargather.testing.resolve import resolve_options_impl
from vargather.testing.results import EXIT_FAILED, EXIT_USAGE, Report
from vargather.testing.runner import run_cases

ROOT = Path(__file__).resolve().parent.parent
multirank = pytest.mark.multirank

FAST_ROWS = (
    "forward-float",
    "forward-int",
    "dims",
    "non-contiguous",
    "sizes-tensor",
    "returned-sizes",
    "one-rank",
    "subgroup",
    "gradient",
)
OK = ("pass", "n/a", "unsupported")


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root, where ``tests.forks`` imports (as in CI)."""
    monkeypatch.chdir(ROOT)


_ZOO_POOLS: dict[tuple[int, float | None], RankPool] = {}


def _zoo_pool(world_size: int, collective_timeout: float | None = None) -> RankPool:
    """The zoo's own worlds, forked from a forkserver as the command line's are (a
    crashing member rebuilds its world many times), apart from the suite's shared
    pools so those are not replaced; ``collective_timeout``: the group's timeout
    (default: the pool's)."""
    key = (world_size, collective_timeout)
    pool = _ZOO_POOLS.get(key)
    if pool is None or pool.closed:
        timeout = {} if collective_timeout is None else {"collective_timeout": collective_timeout}
        pool = RankPool(world_size, call_timeout=30.0, start_method="forkserver", **timeout)
        _ZOO_POOLS[key] = pool
    return pool


_short_timeout_pool = functools.partial(_zoo_pool, collective_timeout=2.0)
"""A zoo world whose collectives time out after 2 s instead of the default 10 s: for
the member whose failing row waits out the group's timeout."""


@pytest.fixture(scope="module", autouse=True)
def _close_zoo_pools() -> Iterator[None]:
    yield
    for pool in _ZOO_POOLS.values():
        pool.close()
    _ZOO_POOLS.clear()


def zoo_check(
    fork: Fork, *, pool_factory: Callable[[int], RankPool] | None = None, **kwargs: Any
) -> Report:
    kwargs.setdefault("max_examples", fork.examples)
    kwargs.setdefault("shrink_budget", 6)
    kwargs.setdefault("only", FAST_ROWS)
    options = CheckOptions(impl=fork.ref, progress=False, **{**fork.scope, **kwargs})
    return run_check(options, pool_factory=pool_factory or _zoo_pool)


def _verdict(report: Report) -> dict[str, str]:
    return {r.id: r.status for r in report.results}


# --- the zoo, each member against its expected verdict ---------------------------------


_CRASHING = "negative_dim_crash"  # judged by its own test below (with its repro line)
_HANGING = "nccl_hang"  # its failing row waits out a timeout: judged by its own test below
_FAST_ZOO = [
    pytest.param(f, marks=pytest.mark.slow) if f.name == _HANGING else f
    for f in ZOO
    if f.name != _CRASHING
]


@multirank
@pytest.mark.usefixtures("in_root")
@pytest.mark.parametrize("fork", _FAST_ZOO, ids=[f.name for f in ZOO if f.name != _CRASHING])
def test_zoo_member_gets_its_expected_verdict(fork: Fork) -> None:
    report = zoo_check(fork, only=fork.fast_rows or FAST_ROWS)
    statuses = _verdict(report)
    for row in report.results:
        if row.id in fork.fails:
            kind, aspect = fork.fails[row.id]
            assert row.status == "fail", (fork.name, row.id, statuses)
            assert row.failure is not None
            assert (row.failure.kind, row.failure.aspect) == (kind, aspect), row.failure
        elif row.id in fork.also and row.status == "fail":
            assert row.failure is not None
            first = next(iter(fork.fails.values()))
            assert (row.failure.kind, row.failure.aspect) == first, row.failure
        else:
            assert row.status in OK, (fork.name, row.id, row.failure)
    assert set(fork.fails) <= set(statuses), statuses
    assert report.exit_status == (EXIT_FAILED if fork.fails else 0)
    # The report states the declared scope.
    text = report.render()
    assert "declared scope: --grad " + fork.scope.get("grad", "sum") in text
    assert report.to_json()["scope"]["--grad"] == fork.scope.get("grad", "sum")


def _fork(name: str) -> Fork:
    (found,) = [f for f in ZOO if f.name == name]
    return found


def _run_command(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """A printed ``python -m vargather ...`` line, run through the command line's entry
    point in this process on the zoo's worlds: exit status, stdout, stderr. A fresh
    interpreter would import torch and start a forkserver and a world again (about 5
    CPU-seconds a line); the printed line run from a shell is
    ``tests/test_cli_repro.py``'s, ``python -m vargather check`` as a subprocess
    ``tests/test_cli_check.py``'s."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "vargather"]
    monkeypatch.setattr(runner, "get_pool", _zoo_pool)  # repro's worlds: the zoo's
    capsys.readouterr()
    status = cli_main(argv[3:])
    out, err = capsys.readouterr()
    return status, out, err


@multirank
@pytest.mark.usefixtures("in_root")
def test_a_crash_is_blamed_on_the_case_that_crashed_and_its_repro_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = zoo_check(_fork(_CRASHING), only=("dims",), max_examples=6, shrink_budget=2)
    (row,) = report.results
    assert report.exit_status == EXIT_FAILED
    assert row.status == "fail"
    assert row.failure is not None
    assert row.failure.kind == "crash"
    assert "did not reproduce" not in row.failure.message  # shrinking ended cleanly
    case = row.failure.case
    assert case is not None
    assert case["dim"] < 0, case  # the killer, not a bystander
    assert case["world_size"] > 1
    assert "--path" in (row.failure.command or "")
    status, out, err = _run_command(row.failure.command or "", capsys, monkeypatch)
    assert status == EXIT_FAILED, out + err
    assert "FAILED" in out


@multirank
@pytest.mark.usefixtures("in_root")
def test_emulated_nccl_finds_the_strided_bug_that_gloo_misses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fork = _fork("strided_bug")
    on_gloo = zoo_check(fork, emulate=None, only=("non-contiguous",))
    assert _verdict(on_gloo) == {"non-contiguous": "pass"}
    under_nccl = zoo_check(fork, only=("non-contiguous",))
    (row,) = under_nccl.results
    assert row.status == "fail"
    assert row.failure is not None
    assert "must be contiguous" in row.failure.message
    status, out, err = _run_command(row.failure.command or "", capsys, monkeypatch)
    assert status == EXIT_FAILED, out + err


@multirank
@pytest.mark.usefixtures("in_root")
def test_uneven_list_all_gather_needs_the_nccl_emulation() -> None:
    fork = _fork("nccl_uneven")
    report = zoo_check(fork, emulate=None, only=("forward-float",))
    (row,) = report.results
    assert row.status == "fail"  # gloo refuses the uneven list; NCCL (emulated) takes it


@multirank
@pytest.mark.usefixtures("in_root")
def test_same_seed_gives_byte_identical_verdict_json(tmp_path: Path) -> None:
    fork = _fork("strided_bug")
    texts = []
    for i in range(2):
        path = tmp_path / f"run{i}.json"
        report = zoo_check(fork, only=("non-contiguous",), seed=3, max_examples=12)
        report.write_json(str(path))
        data = json.loads(path.read_text())
        assert data["properties"][0]["status"] == "fail"  # counterexamples compared too
        texts.append(json.dumps(data, sort_keys=True))
    assert texts[0] == texts[1]


@multirank
@pytest.mark.usefixtures("in_root")
def test_same_seed_gives_byte_identical_json_with_an_unsupported_row(tmp_path: Path) -> None:
    """Determinism covers the rows a backend refusal splits off: ``function_apply``
    hands int16 to gloo's all_gather, so ``forward-int:int16`` is ``unsupported`` with
    a counterexample, and two runs of one seed agree on it byte for byte."""
    fork = _fork("function_apply")
    texts = []
    for _ in range(2):
        report = zoo_check(fork, only=("forward-int",), seed=5, max_examples=8)
        data = report.to_json()
        rows = {p["id"]: p for p in data["properties"]}
        assert rows["forward-int:int16"]["status"] == "unsupported", rows
        assert rows["forward-int:int16"]["failure"]["case"] is not None
        texts.append(json.dumps(data, sort_keys=True))
    assert texts[0] == texts[1]


@multirank
@pytest.mark.usefixtures("in_root")
def test_a_failure_that_waits_out_a_timeout_is_not_shrunk() -> None:
    """``nccl_hang`` under emulated NCCL: a strided shard is refused on its rank while
    its peers wait in the collective until the group's timeout. Every such attempt
    costs that timeout, so the row ends at its first failure (unshrunk attempts: 0)
    instead of spending the shrink budget at a timeout each (the unbounded check of
    issue 18). The whole zoo at default settings is the slow test below."""
    report = zoo_check(
        _fork("nccl_hang"),
        only=("non-contiguous",),
        shrink_budget=200,
        pool_factory=_short_timeout_pool,
    )
    (row,) = report.results
    assert row.status == "fail", row
    assert row.failure is not None
    assert "must be contiguous" in row.failure.message
    assert "Timed out" in row.failure.message or "timed out" in row.failure.message
    assert row.shrink_runs == 0, row
    assert "--call" in (row.failure.command or "")


# --- the world is rebuilt after a collective error ----------------------------------------


def _seed_convention_fork(ref: str) -> Implementation:
    """A zoo member called as the seed calls it, under the ``local`` contract."""
    return Implementation(ref, convention="seed", contracts=("local",), search_path=(str(ROOT),))


@multirank
@pytest.mark.usefixtures("in_root")
def test_a_world_whose_collective_failed_is_not_reused() -> None:
    impl = _seed_convention_fork("tests.forks.world_assert:all_gather")
    pool = get_pool(2)
    common: dict[str, Any] = {"shapes": ((1,), (2,)), "dim": 0, "contract": "local"}
    bad = GatherCase(dtype="int16", requires_grad=False, **common)
    good = GatherCase(dtype="float32", requires_grad=False, **common)
    run_cases([good], impl, pool_factory=get_pool)
    before = pool.generation
    (verdict,) = run_cases([bad], impl, pool_factory=get_pool)
    assert "Invalid scalar type" in verdict.failures[0].render()  # gloo refuses int16
    (after,) = run_cases([good], impl, pool_factory=get_pool)
    assert after.ok
    assert pool.generation == before + 1  # a fresh world served the next call


@multirank
@pytest.mark.usefixtures("in_root")
def test_a_crash_mid_batch_is_blamed_on_its_case_without_bisecting() -> None:
    """The ranks say which case they were in when one died: that case runs alone (and
    crashes again), the others re-run together and keep their own verdicts. Two world
    rebuilds; bisecting this batch of four would take three."""
    impl = _seed_convention_fork("tests.forks.negative_dim_crash:gather")
    pool = _zoo_pool(2)
    cases = [
        GatherCase(((2, 2), (2, 2)), d, "float32", contract="local", requires_grad=False)
        for d in (0, -1, 1, 0)
    ]
    run_cases(cases[:1], impl, pool_factory=_zoo_pool)  # a started world
    before = pool.generation
    verdicts = run_cases(cases, impl, pool_factory=_zoo_pool)
    kinds = [[f.kind for f in v.failures] for v in verdicts]
    assert kinds == [[], ["crash"], [], []], [v.failures for v in verdicts]
    assert "this case" in verdicts[1].failures[0].message
    assert pool.generation == before + 2


# --- scope, conventions and configuration (no ranks) --------------------------------------


def test_config_table_gives_defaults_and_flags_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [project]
            name = "myfork"
            [tool.vargather.check]
            impl = "myfork.dist:all_gather"
            grad = "none"
            dims = [0, -1]
            world-sizes = [2, 3]
            requires-init = true
            sizes = "tensor"
            returns = "list"
            emulate = "nccl"
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    options = parse_args([])
    assert options.impl == "myfork.dist:all_gather"
    assert (options.grad, options.dims, options.world_sizes) == ("none", (0, -1), (2, 3))
    assert (options.requires_init, options.sizes, options.returns) == (True, "tensor", "list")
    assert options.emulate == "nccl"
    assert options.config_path == str(tmp_path / "pyproject.toml")
    overridden = parse_args(["--grad", "local", "--dims", "0", "--sizes", "any"])
    assert (overridden.grad, overridden.dims, overridden.sizes) == ("local", (0,), "any")
    assert parse_args(["--no-config"]) == CheckOptions()


def test_config_file_option_and_bad_keys(tmp_path: Path) -> None:
    path = tmp_path / "gate.toml"
    path.write_text('[tool.vargather.check]\ngrad = "local"\n')
    assert parse_args(["--config", str(path)]).grad == "local"
    path.write_text('[tool.vargather.check]\ngard = "local"\n')
    with pytest.raises(CheckUsageError, match="unknown key 'gard'"):
        read_config(str(path))
    path.write_text("[tool.vargather.check]\nrequires-init = 1\n")
    with pytest.raises(CheckUsageError, match="wrong type"):
        read_config(str(path))


def test_configured_impl_keywords_are_literals_only() -> None:
    ref = "m:AllGather(all_reduce_grads=True, k=(1, 'a'))"
    assert parse_impl_ref(ref) == ("m:AllGather", (("all_reduce_grads", True), ("k", (1, "a"))))
    assert parse_impl_ref("m:f") == ("m:f", None)
    with pytest.raises(ImplementationError, match="literal"):
        parse_impl_ref("m:AllGather(x=__import__('os').getcwd())")
    with pytest.raises(ImplementationError, match="MODULE:ATTR"):
        parse_impl_ref("m:AllGather(1)")


@pytest.mark.usefixtures("in_root")
def test_a_convention_that_does_not_fit_is_exit_2_naming_the_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Takes group= but neither grad= nor sizes=: the guessed convention must not pass them.
    ref = "tests.forks.list_return:gather_all_tensors"
    assert check_cli.main(["--impl", ref, "--no-progress", "--no-config"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--sizes never" in err
    assert "does not fit" in err
    # Its signature is (result, group=None): even without sizes, the convention's
    # ATTR(x, dim, ...) would pass dim as its group. Exit 2, naming the template.
    argv = ["--impl", ref, "--sizes", "never", "--no-progress", "--no-config"]
    assert check_cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "passes dim as ATTR's parameter 'group'" in err
    assert "--call '(x, group=group)'" in err
    info = resolve_options_impl(
        CheckOptions(impl=ref, sizes="never", grad="local", call="(x, group=group)")
    )
    assert (info.convention, info.takes_grad, info.takes_group) == ("vargather", False, True)


@pytest.mark.usefixtures("in_root")
@pytest.mark.parametrize(
    ("ref", "call", "fragment"),
    [
        ("tests.forks.function_apply:AllGather.apply", "(x, dim)", "its forward, less ctx,"),
        ("tests.forks.with_shapes:all_gather_tensors_with_shapes", "(x)", "'shapes'"),
        ("tests.forks.sizes_flag:all_gather_v", "(x, group=group)", "'sizes'"),
        ("tests.forks.dim0_only:gather_rows", "(x, y)", "unknown name 'y'"),
        ("tests.forks.dim0_only:gather_rows", "(x, __import__('os'))", "nor a literal"),
        ("tests.forks.dim0_only:gather_rows", "(x) or (1)", "one argument list"),
    ],
)
def test_a_call_template_that_does_not_fit_is_exit_2_before_any_world(
    ref: str, call: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--impl", ref, "--call", call, "--no-progress", "--no-config"]
    assert check_cli.main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("vargather check: error: --call"), err
    assert fragment in err, err


@pytest.mark.usefixtures("in_root")
def test_what_a_template_leaves_out_is_out_of_scope() -> None:
    info = resolve_options_impl(
        CheckOptions(impl="tests.forks.function_apply:AllGather.apply", call="(x)")
    )
    assert info.scope is not None
    assert (info.scope.dims, info.scope.sizes, info.scope.takes_group) == ((0,), "never", False)
    listed = CheckOptions(
        impl="tests.forks.list_return:gather_all_tensors", call="(x, group=group)", returns="list"
    )
    scope = resolve_options_impl(listed).scope
    assert scope is not None
    assert (scope.dims, scope.sizes, scope.takes_group) == (None, "never", True)
    # A declared scope the call cannot reach is a usage error naming the option.
    options = CheckOptions(impl="tests.forks.dim0_only:gather_rows", call="(x)", dims=(0, 1))
    with pytest.raises(CheckUsageError) as caught:
        resolve_options_impl(options)
    assert str(caught.value).startswith("dims 0,1: the call (x) passes no dim"), caught.value


@pytest.mark.usefixtures("in_root")
def test_configured_module_is_built_with_dim_per_call() -> None:
    info = resolve_options_impl(
        CheckOptions(impl="tests.forks.allreduce_switch:AllGather(all_reduce_grads=True)")
    )
    assert info.ctor_kwargs == (("all_reduce_grads", True),)
    assert info.ctor_takes_dim
    assert info.convention == "seed"


def test_xfails_may_name_a_dtype(tmp_path: Path) -> None:
    path = tmp_path / "xfails"
    path.write_text("forward-int:int16\ngradient\n")
    assert parse_args(["--xfails", str(path), "--no-config"]).xfails == frozenset(
        {"forward-int:int16", "gradient"}
    )


# --- the whole zoo at default settings --------------------------------------------------------


@pytest.mark.slow
@multirank
@pytest.mark.usefixtures("in_root")
@pytest.mark.parametrize("fork", ZOO, ids=[f.name for f in ZOO])
def test_zoo_member_at_default_settings(fork: Fork) -> None:
    report = zoo_check(fork, max_examples=60, shrink_budget=40, only=())
    for row in report.results:
        if row.id in fork.fails:
            assert row.status == "fail", row
        elif row.id in fork.also:
            assert row.status in (*OK, "fail"), row
        else:
            assert row.status in OK, (fork.name, row.id, row.failure)
    # No timed assertion (a loaded machine is not a failure): the 2-minute budget is
    # measured by `python -m tests.forks.run_zoo` and reported in docs/conformance.md.


@pytest.mark.slow  # default run: the two determinism tests above (strided_bug, function_apply)
@multirank
@pytest.mark.usefixtures("in_root")
@pytest.mark.parametrize("fork", ZOO, ids=[f.name for f in ZOO])
def test_zoo_member_gives_byte_identical_json_for_one_seed(fork: Fork) -> None:
    texts = []
    for _ in range(2):
        report = zoo_check(fork, max_examples=20, shrink_budget=40, only=(), seed=1)
        texts.append(json.dumps(report.to_json(), sort_keys=True))
    assert texts[0] == texts[1]


@multirank
@pytest.mark.usefixtures("in_root")
def test_gradient_counterexample_prefers_non_empty_shards() -> None:
    """The seed's ``local`` backward run under ``sum`` fails on empty shards and on
    full ones alike; the reported counterexample is a full one."""
    options = CheckOptions(
        impl="vargather.testing.reference_seed:all_gather",
        grad="sum",
        only=("gradient",),
        max_examples=6,
        shrink_budget=6,
        world_sizes=(2,),
        progress=False,
    )
    (row,) = run_check(options, pool_factory=get_pool).results
    assert row.status == "fail"
    assert row.failure is not None
    assert row.failure.case is not None
    assert all(n > 0 for n in row.failure.case["sizes"]), row.failure.case
    assert row.failure.aspect == "gradient"


@multirank
def test_nccl_emulation_carries_uneven_all_to_all_and_refuses_what_nccl_refuses() -> None:
    from tests._pool_fns import emulated_nccl_collectives

    results = get_pool(2).run(emulated_nccl_collectives, None)
    for r, (outputs, refused) in enumerate(results):
        # rank r receives from rank s the tensor s built for destination r
        assert outputs == [[float(10 * s + r)] * (s + r + 1) for s in range(2)]
        assert "must be contiguous" in refused[0]
        assert "Unsupported data type for NCCL" in refused[1]

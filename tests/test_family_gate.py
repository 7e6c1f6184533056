"""The gate for the family (issue 20): ``python -m vargather check --op ...`` passes
vargather, fails every family mutant of ``tests/mutants`` with a shrunk, reproducible
counterexample, calls forks through their own signatures (``--call``), and refuses
options that do not apply to the collective."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex

import pytest

from vargather._cli import check as check_cli
from vargather.testing.collectives import FAMILY
from vargather.testing.engine import run_check
from vargather.testing.options import CheckOptions, CheckUsageError, OptionError

ROOT = pathlib.Path(__file__).resolve().parent.parent
MUTANTS = sorted(
    p.stem for p in (ROOT / "tests" / "mutants").glob("*.py") if p.stem.startswith(FAMILY)
)
QUICK = {"max_examples": 15, "shrink_budget": 10, "world_sizes": (2, 3), "progress": False}
OK = ("pass", "n/a")
CLAIMS = {"all_gather_list_mean_not_divided": "mean"}
"""The contract a mutant whose bug is in another contract than sum claims."""


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root, where ``tests.mutants`` and ``tests.forks`` import."""
    monkeypatch.chdir(ROOT)


@pytest.mark.multirank
def test_the_command_passes_vargather_and_writes_the_report(
    tmp_path: pathlib.Path, in_root: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's entry point in this process, on this worker's rank pools: a fresh
    ``python -m vargather check`` costs an interpreter and a forkserver importing torch
    (seconds of CPU), and ``tests/test_cli_check.py`` runs it so already."""
    out = tmp_path / "report.json"
    args = ["--op", "all_to_all_v", "--max-examples", "3", "--world-sizes", "3"]
    status = check_cli.main([*args, "--json", str(out)])
    done = capsys.readouterr()
    assert status == 0, done.out + done.err
    assert "vargather check: vargather.all_to_all_v (called as ATTR(x, send_sizes, dim" in done.out
    report = json.loads(out.read_text())
    assert report["op"] == "all_to_all_v"
    assert report["scope"]["--op"] == "all_to_all_v"
    statuses = {p["id"]: p["status"] for p in report["properties"]}
    assert statuses.pop("one-rank") == "n/a"  # --world-sizes 3
    assert set(statuses.values()) == {"pass"}, statuses
    for row in ("misuse", "payload-scale", "non-contiguous", "uninitialized", "compiled"):
        assert row in statuses


@pytest.mark.multirank
@pytest.mark.parametrize("op", FAMILY)
def test_vargather_passes_every_row_of_its_own_gate(op: str) -> None:
    """Every row, on worlds of 2 and 3 with 15 examples a row: what ``check --op`` at
    default settings would say of vargather, in a fraction of the time. (A row the
    quicker command above never reached, ``non-contiguous`` on a strided ``x`` of one
    element, failed ``all_to_all_v`` on every rank until this ran every row.)"""
    report = run_check(CheckOptions(op=op, **QUICK))
    statuses = {r.id: r.status for r in report.results}
    assert statuses.pop("one-rank") == "n/a"  # no world of 1 here
    assert set(statuses.values()) <= {"pass", "n/a"}, report.render()
    assert statuses["non-contiguous"] == statuses["compiled"] == statuses["misuse"] == "pass"


@pytest.mark.multirank
@pytest.mark.parametrize("mutant", MUTANTS)
def test_every_family_mutant_fails_the_gate(mutant: str, in_root: None) -> None:
    op = next(c for c in FAMILY if mutant.startswith(c))
    ref = f"tests.mutants.{mutant}:{op}"
    grad = CLAIMS.get(mutant, "sum")
    report = run_check(CheckOptions(op=op, impl=ref, grad=grad, exitfirst=True, **QUICK))
    assert report.exit_status == 1, f"{mutant} passed the gate:\n{report.render()}"
    failed = [r for r in report.results if r.status == "fail"]
    failure = failed[0].failure
    assert failure is not None
    assert failure.kind in ("mismatch", "error"), report.render()
    command = failure.command
    assert command is not None
    assert f"python -m vargather repro --op {op} " in command
    assert ref in command


@pytest.mark.multirank
@pytest.mark.parametrize(
    ("row", "mutant"),
    [("dims", "reduce_scatter_v_dim_ignored"), ("gradient", "reduce_scatter_v_grad_own_block")],
)
def test_a_reproduction_line_reruns_the_counterexample(
    row: str, mutant: str, in_root: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed ``python -m vargather repro --op`` line, as the shell splits it, run
    in this process on this worker's worlds (a fresh interpreter would import torch and
    start a forkserver and a world again: about 5 CPU-seconds): it fails again."""
    from vargather._cli import repro as repro_cli

    ref = f"tests.mutants.{mutant}:reduce_scatter_v"
    options = CheckOptions(op="reduce_scatter_v", impl=ref, only=(row,), **QUICK)
    report = run_check(options)
    failure = report.results[0].failure
    assert failure is not None
    assert failure.command is not None
    args = shlex.split(failure.command)
    assert args[:6] == ["python", "-m", "vargather", "repro", "--op", "reduce_scatter_v"]
    capsys.readouterr()
    assert repro_cli.main(args[4:]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert failure.message.splitlines()[0][:40] in out


@pytest.mark.multirank
@pytest.mark.parametrize(
    ("op", "ref", "call", "grad", "out_of_scope"),
    [
        ("reduce_scatter_v", "reduce_scatter", "(x, sizes)", "sum", {"dims", "subgroup"}),
        (
            "all_to_all_v",
            "exchange",
            "(x, send_sizes, dim, recv=recv_sizes, pg=group)",
            "sum",
            set(),
        ),
        ("all_gather_list", "gather_tensors", "(x, group=group)", "sum", {"dims"}),
        (
            "all_gather_list",
            "gather_tensors_detached",
            "(x, group=group)",
            "none",
            {"dims", "gradient", "adjoint"},
        ),
    ],
)
def test_a_fork_is_called_through_its_own_signature(
    op: str, ref: str, call: str, grad: str, out_of_scope: set[str], in_root: None
) -> None:
    options = CheckOptions(
        op=op,
        impl=f"tests.forks.family_calls:{ref}",
        call=call,
        grad=grad,
        **{**QUICK, "max_examples": 4},
    )
    report = run_check(options)
    statuses = {r.id: r.status for r in report.results}
    assert all(s in OK for s in statuses.values()), report.render()
    na = {r.id for r in report.results if r.status == "n/a"}
    # misuse calls vargather's signature; a fork claims no compile; no world of one rank
    assert na == out_of_scope | {"misuse", "compiled", "one-rank"}, statuses
    assert report.call == call


@pytest.mark.multirank
def test_a_detached_fork_claiming_gradients_fails(in_root: None) -> None:
    options = CheckOptions(
        op="all_gather_list",
        impl="tests.forks.family_calls:gather_tensors_detached",
        call="(x, group=group)",
        only=("gradient",),
        **QUICK,
    )
    report = run_check(options)
    assert [r.status for r in report.results] == ["fail"], report.render()
    failure = report.results[0].failure
    assert failure is not None
    assert "does not require grad" in failure.message


def test_options_the_collective_does_not_take_are_refused() -> None:
    for field, value in (
        ("sizes", "tensor"),
        ("sizes", "never"),
        ("returns", "tuple"),
        ("convention", "seed"),
        ("transports", "ring"),
    ):
        options = CheckOptions(op="reduce_scatter_v", **{field: value})
        with pytest.raises(OptionError, match="does not apply to --op reduce_scatter_v"):
            run_check(options)
    with pytest.raises(OptionError, match="returns a list of tensors"):
        run_check(CheckOptions(op="all_gather_list", returns="tensor"))
    with pytest.raises(OptionError, match="passes no recv_sizes"):
        run_check(
            CheckOptions(op="all_to_all_v", impl="m:f", sizes="required", call="(x, send_sizes)")
        )
    with pytest.raises(OptionError, match="does not apply to --op all_to_all_v"):
        run_check(CheckOptions(op="all_to_all_v", grad="local"))
    with pytest.raises(OptionError, match="unknown name 'shapes'"):
        CheckOptions(op="reduce_scatter_v", impl="m:f", call="(x, shapes)")
    with pytest.raises(OptionError, match=r"unknown property id.*sizes-tensor"):
        CheckOptions(op="all_gather_list", only=("sizes-tensor",))
    with pytest.raises(CheckUsageError, match="needs --impl"):
        run_check(CheckOptions(op="all_gather_list", call="(x)"))


def test_the_list_flag_lists_the_collectives_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from vargather._cli import check as check_cli

    assert check_cli.main(["--op", "all_gather_list", "--list"]) == 0
    rows = capsys.readouterr().out.split()
    assert rows[0] == "forward-float"
    assert "misuse" in rows
    assert "dims" in rows
    assert check_cli.main(["--op", "gather", "--list"]) == 2


def test_options_round_trip_with_the_op() -> None:
    options = CheckOptions(op="all_to_all_v", only=("empty",))
    assert CheckOptions.from_json(options.to_json()) == options
    with pytest.raises(OptionError, match="unknown property id"):
        dataclasses.replace(options, op="all_gather_v")  # its catalogue has empty-some


def test_there_are_mutants_for_every_collective() -> None:
    for op in FAMILY:
        assert sum(m.startswith(op) for m in MUTANTS) >= 3, op


@pytest.mark.parametrize("op", FAMILY)
def test_the_scope_options_apply_to_every_collective(op: str) -> None:
    """--sizes required, --returns, --requires-init and --emulate nccl are a scope for
    every collective: accepted, carried into the implementation the rows run."""
    from vargather.testing.catalogues import catalogue_of
    from vargather.testing.resolve import ensure_import_path

    returns = "list" if op == "all_gather_list" else "tensor"
    options = CheckOptions(
        op=op, sizes="required", returns=returns, requires_init=True, emulate="nccl"
    )
    collective = catalogue_of(op)
    cwd = ensure_import_path()
    impl = collective.implementation(collective.resolve(options, cwd), options, cwd)
    assert (impl.op, impl.sizes_scope, impl.returns, impl.emulate) == (
        op,
        "required",
        returns,
        "nccl",
    )
    assert "misuse" in [r.id for r in collective.rows(impl)]


def test_sizes_required_always_passes_the_receive_sizes() -> None:
    from hypothesis import find

    from vargather.testing import Implementation, catalogue

    impl = Implementation(op="all_to_all_v", sizes_scope="required", name="vargather")
    row = next(r for r in catalogue(impl) if r.id == "forward-float")
    batch = find(row.strategy((2, 3)), lambda b: len(b) >= 3)
    assert all(c.pass_recv for c in batch)
    never = Implementation(op="all_to_all_v", sizes_scope="never", name="vargather")
    row = next(r for r in catalogue(never) if r.id == "forward-float")
    batch = find(row.strategy((2, 3)), lambda b: len(b) >= 3)
    assert not any(c.pass_recv for c in batch)

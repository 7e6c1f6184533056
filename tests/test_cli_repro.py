"""``python -m vargather repro`` (``vargather/_cli/repro.py``): the command every failure
report of every collective prints re-runs exactly that case (a gather's, a family
case through ``--op``, a misuse), and its exit status says whether it fails."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vargather._cli import repro
from vargather.testing import GatherCase, Property, describe, parse_case
from vargather.testing.cases import COMPAT

from .mutants import REPO_ROOT, implementation

CASE = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="sum", seed=3)


def _argv(text: str) -> list[str]:
    """The arguments after ``python -m vargather repro`` in a description."""
    command = shlex.split(text.rsplit("reproduce: ", 1)[1])
    assert command[:4] == ["python", "-m", "vargather", "repro"]
    return command[4:]


@pytest.mark.multirank
def test_a_passing_case_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert repro.main(_argv(describe(CASE))) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASSED")


@pytest.mark.multirank
def test_a_failing_case_exits_1_naming_the_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    impl = implementation("rank_order", ("auto",))
    argv = _argv(describe(CASE, impl))
    assert argv[1:3] == ["--impl", "tests.mutants.rank_order:all_gather_v"]
    assert repro.main(argv) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "out differs from torch.cat(x, dim)" in out


@pytest.mark.multirank
def test_compat_is_carried_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    case = GatherCase(shapes=((1, 2), (3, 2)), dim=0, dtype="float64", contract="local")
    argv = _argv(describe(case, COMPAT))
    assert argv[1:] == ["--impl", "compat"]
    assert repro.main(argv) == 0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["print('hi')"], "expected GatherCase"),
        (["GatherCase(shapes=((1,),), dim=0, dtype='float8')"], "dtype='float8'"),
        ([repr(CASE), "--impl", "no_such_module_xyz:f"], "--impl no_such_module_xyz:f: cannot"),
        ([repr(CASE), "--frobnicate"], "unrecognized arguments"),
        (["--op", "reduce_scatter_v", repr(CASE)], "expected ReduceScatterCase or MisuseCase"),
        (
            ["--op", "reduce_scatter_v", "ReduceScatterCase(world_size=2, sizes=(1, 1))"],
            "missing 2 required",
        ),
        (["--op", "all_to_all_v", "AllToAllCase()", "--impl", "m:f"], "--impl: the case names"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert repro.main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_the_printed_command_runs_from_the_shell(tmp_path: Path) -> None:
    """Without torch.distributed (``initialized=False``), as a real subprocess."""
    case = GatherCase(shapes=((2, 2),), dim=-1, dtype="bfloat16", initialized=False)
    proc = subprocess.run(
        [sys.executable, "-m", "vargather", "repro", *_argv(describe(case))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "PASSED" in proc.stdout


@pytest.mark.parametrize("path", ["/plain/dir", "/with space", "/it's", '/quo"te', "/dollar$HOME"])
def test_the_printed_command_splits_back_into_its_arguments(path: str) -> None:
    impl = implementation("rank_order", ("auto",))
    impl = type(impl)(impl.ref, transports=impl.transports, search_path=(path,), name="x")
    argv = _argv(describe(CASE, impl))
    assert parse_case(argv[0]) == CASE
    assert argv[-2:] == ["--path", path]


@pytest.mark.multirank
def test_the_reproduce_line_carries_the_call_template(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork called through ``--call`` is re-run through the same template: the
    ``reproduce:`` line carries it, and without the template the call no longer fits."""
    from vargather.testing.cases import Implementation

    monkeypatch.chdir(REPO_ROOT)
    ref = "tests.forks.function_apply:AllGather.apply"
    impl = Implementation(
        ref, contracts=("local",), search_path=(str(REPO_ROOT),), call="(x)", takes_group=False
    )
    case = GatherCase(shapes=((2, 3), (1, 3)), dim=0, dtype="float32", contract="local", seed=3)
    argv = _argv(describe(case, impl))
    assert argv[argv.index("--call") + 1] == "(x)"
    assert "--no-group" not in argv
    assert repro.main(argv) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASSED")
    without = [a for i, a in enumerate(argv) if a != "--call" and argv[i - 1] != "--call"]
    assert repro.main(without) == 1  # ATTR(x, dim, sizes=...) does not fit forward(ctx, x)
    assert "FAILED" in capsys.readouterr().out


def _family_row(op: str, row_id: str) -> Property:
    from vargather.testing import Implementation, catalogue

    rows = catalogue(Implementation(op=op, name="vargather"))
    return next(r for r in rows if r.id == row_id)


@pytest.mark.multirank
def test_a_family_case_reruns_through_its_catalogue(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A family row's ``reproduce:`` line is ``repro --op NAME CASE...``: the calls in
    order on one world, the implementation named by the case (a mutant fails, exit 1)."""
    from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase

    monkeypatch.chdir(REPO_ROOT)
    row = _family_row("reduce_scatter_v", "dims")
    good = ReduceScatterCase(2, (1, 2), (3,), -1, seed=4)
    bad = replace(good, impl="tests.mutants.reduce_scatter_v_dim_ignored:reduce_scatter_v")
    argv = _argv(row.describe([good, bad], 1))
    assert argv[:2] == ["--op", "reduce_scatter_v"]
    assert repro.main(argv) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "call 2:" in out
    assert repro.main(argv[:3]) == 0  # the first call alone passes
    assert capsys.readouterr().out.rstrip().endswith("PASSED")


@pytest.mark.multirank
def test_misuse_cases_rerun_through_repro(capsys: pytest.CaptureFixture[str]) -> None:
    from vargather.testing.misuse import GatherMisuseCase, MisuseCase, misuse_by_name

    row = _family_row("all_gather_list", "misuse")
    argv = _argv(row.describe([MisuseCase("all_gather_list", "list-dtype-differs", 2, 1)], 0))
    assert repro.main(argv) == 0, capsys.readouterr().out
    gather = GatherMisuseCase(misuse_by_name("ndim-differs").name, 2, 1)
    assert repro.main([repr(gather)]) == 0, capsys.readouterr().out


def test_an_uninitialized_family_case_runs_in_this_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vargather.testing.catalogues.all_to_all_v import AllToAllCase

    row = _family_row("all_to_all_v", "uninitialized")
    case = AllToAllCase(1, ((3,),), (2,), 0, initialized=False, memory="sliced", seed=2)
    argv = _argv(row.describe([case], 0))
    assert repro.main(argv) == 0
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.multirank
def test_a_coalesced_call_reruns_as_one_call(capsys: pytest.CaptureFixture[str]) -> None:
    from vargather.testing.runner import describe_coalesced

    other = GatherCase(shapes=((2, 2, 1), (2, 2, 0)), dim=-1, dtype="float64", seed=5)
    argv = _argv(describe_coalesced([CASE, other], 1))
    assert argv[0] == "--coalesced"
    assert [parse_case(a) for a in argv[1:3]] == [CASE, other]
    assert repro.main(argv) == 0
    out = capsys.readouterr().out
    assert "coalesced call: tensor #1 of 2" in out
    assert out.rstrip().endswith("PASSED")

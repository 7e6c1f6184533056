"""The conformance gate, ``python -m vargather check`` (``vargather/_cli/check.py``, the
command, and the engine it runs, ``vargather/testing/engine.py`` and its modules, here
through the kit's own names: ``vargather.testing.engine``, ``options``, ``resolve``).

Options, import errors and the report are checked directly; the issue's classification
claims are checked by running the check for real on gloo worlds: vargather holds under
every contract, the seed's algorithm (``vargather/testing/reference_seed.py``) holds ``local`` except for
its two genuine bugs and fails ``sum`` with a gradient counterexample, every mutant of
the catalogue fails, a crash or a hang is that property's failure, and a correct
implementation raises no false alarm across 20 seeds.

In-process runs call ``run_check``, the function ``main`` calls after parsing; a few
runs go through a real ``python -m vargather check`` subprocess.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

import vargather
from vargather._cli import check as check_cli
from vargather._cli.check import load_xfails, parse_args
from vargather.testing import Failure, RankPool, get_pool, property_ids
from vargather.testing.cases import GatherCase, parse_case
from vargather.testing.engine import run_check
from vargather.testing.evaluate import render_failures
from vargather.testing.options import CheckOptions, CheckUsageError
from vargather.testing.resolve import resolve_options_impl
from vargather.testing.results import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    STATUSES,
    PropertyFailure,
    PropertyResult,
    Report,
)
from vargather.testing.runner import run_cases

PROPERTY_IDS = property_ids()

ROOT = Path(__file__).resolve().parent.parent
SEED = "vargather.testing.reference_seed:all_gather"

multirank = pytest.mark.multirank


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root, where ``tests.mutants`` imports (as in CI)."""
    monkeypatch.chdir(ROOT)


def check(**kwargs: Any) -> Report:
    """``run_check`` in this process on the suite's shared pools (default settings)."""
    kwargs.setdefault("progress", False)
    kwargs.setdefault("shrink_budget", 5)
    return run_check(CheckOptions(**kwargs), pool_factory=get_pool)


def statuses(report: Report) -> dict[str, str]:
    return {r.id: r.status for r in report.results}


def result(report: Report, prop: str) -> PropertyResult:
    (found,) = [r for r in report.results if r.id == prop]
    return found


def failure(report: Report, prop: str) -> PropertyFailure:
    found = result(report, prop).failure
    assert found is not None, f"{prop} has no failure: {result(report, prop)}"
    return found


def cli(*args: str, cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vargather", "check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- options, xfails, import errors (no ranks) ----------------------------------------


def test_list_prints_the_catalogues_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_cli.main(["--list"]) == EXIT_OK
    assert tuple(capsys.readouterr().out.split()) == PROPERTY_IDS


def test_defaults() -> None:
    options = parse_args([])
    assert options == CheckOptions()
    assert (options.impl, options.grad, options.world_sizes) == (None, "sum", (1, 2, 3, 4))


def test_world_sizes_are_parsed_sorted_and_unique() -> None:
    assert parse_args(["--world-sizes", " 3,1,3 "]).world_sizes == (1, 3)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--grad", "max"], "argument --grad: invalid choice: 'max'"),
        (["--world-sizes", "0,2"], "--world-sizes: each world size must be in [1, 16], got 0"),
        (["--world-sizes", "two"], "--world-sizes: expected comma-separated positive integers"),
        (["--max-examples", "0"], "--max-examples must be a positive integer, got 0"),
        (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
        (["--only", "forward-float,nope"], "--only: unknown property id(s) nope"),
        (["--impl", "no_colon"], "--impl must be MODULE:ATTR"),
        (["--json", "/nonexistent-dir/report.json"], "--json: folder '/nonexistent-dir' does"),
        (["--convention", "seed"], "--convention seed needs --impl"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_cli.main(argv) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("vargather check: error: ")
    assert fragment in err


def test_xfails_file_format(tmp_path: Path) -> None:
    path = tmp_path / "xfails.txt"
    path.write_text("# known failures of my fork\n\ngradient   # issue 12\n  adjoint\n")
    assert load_xfails(str(path)) == frozenset({"gradient", "adjoint"})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gradient\ngradiant\n", "xfails.txt:2: unknown property id 'gradiant'; known ids: "),
        ("gradient adjoint\n", "xfails.txt:1: expected one property id per line"),
    ],
)
def test_xfails_file_errors_name_file_and_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "xfails.txt"
    path.write_text(text)
    with pytest.raises(CheckUsageError, match=re.escape(fragment)):
        load_xfails(str(path))


def test_unreadable_xfails_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(CheckUsageError, match=r"--xfails: cannot read .*missing\.txt"):
        load_xfails(str(tmp_path / "missing.txt"))


_MODULES = {
    "raises_at_import.py": "raise RuntimeError('boom at import')\n",
    "missing_dependency.py": "from attend import exists\n\ndef all_gather(t, dim, sizes):\n    return t\n",
}


@pytest.mark.parametrize(
    ("ref", "fragments"),
    [
        (
            "no_such_module_xyz:all_gather",
            [
                "--impl no_such_module_xyz:all_gather: cannot import module 'no_such_module_xyz'",
                "MODULE is imported from the current directory",
            ],
        ),
        (
            "vargather.testing.reference_seed:nope",
            ["'vargather.testing.reference_seed'", "has no attribute 'nope'"],
        ),
        ("vargather.testing.reference_seed:__doc__", ["'__doc__' is a str, not a callable"]),
        ("raises_at_import:f", ["importing 'raises_at_import' failed", "boom at import"]),
        (
            "missing_dependency:all_gather",
            ["a module it imports is missing: No module named 'attend'", "from attend import"],
        ),
    ],
)
def test_import_errors_exit_2_with_a_clear_message(
    ref: str,
    fragments: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, text in _MODULES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # vargather, from elsewhere
    assert check_cli.main(["--impl", ref]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    for fragment in fragments:
        assert fragment in err


def test_an_import_error_names_the_directory_it_looked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's entry point in this process, from ``tmp_path``; the same typo from
    a real command line is ``docs/conformance.md``'s console block (run by
    ``tests/test_docs.py``: exit 2, this message, nothing else printed)."""
    monkeypatch.chdir(tmp_path)
    assert check_cli.main(["--impl", "mypkg.distributed:all_gather"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert "cannot import module 'mypkg.distributed': no module named 'mypkg'" in err
    assert f"from the current directory ({tmp_path})" in err


def test_call_convention_is_detected(in_root: None) -> None:
    seed = resolve_options_impl(
        CheckOptions(impl=SEED)
    )  # AllGather.apply: (*args, **kwargs), a Function's apply
    assert (seed.convention, seed.takes_group, seed.transports) == ("seed", False, None)
    assert (
        resolve_options_impl(CheckOptions(impl="vargather.compat:all_gather")).convention == "seed"
    )
    mine = resolve_options_impl(CheckOptions(impl="vargather:all_gather_v"))
    assert (mine.convention, mine.takes_group) == ("vargather", True)
    assert mine.transports == resolve_options_impl(CheckOptions()).transports
    assert mine.transports is not None
    assert "auto" in mine.transports
    mutant = resolve_options_impl(
        CheckOptions(impl="tests.mutants.rank_order:all_gather_v")
    )  # (x, dim=0, **kwargs)
    assert (mutant.convention, mutant.transports) == ("vargather", mine.transports)
    # A convention that does not fit the signature is a usage error, before any world.
    with pytest.raises(
        CheckUsageError, match=r"does not fit its signature.*--convention vargather"
    ):
        resolve_options_impl(CheckOptions(impl="vargather:all_gather_v", convention="seed"))
    forced = resolve_options_impl(
        CheckOptions(impl="vargather.compat:all_gather", convention="seed")
    )
    assert (forced.convention, forced.takes_group, forced.transports) == ("seed", False, None)
    narrowed = resolve_options_impl(
        CheckOptions(impl="vargather:all_gather_v", transports="padded, auto")
    )
    assert narrowed.transports == ("padded", "auto")
    assert (
        resolve_options_impl(
            CheckOptions(impl="vargather:all_gather_v", transports="none")
        ).transports
        is None
    )
    with pytest.raises(CheckUsageError, match=r"the seed's convention .* takes no transport"):
        resolve_options_impl(CheckOptions(impl=SEED, transports="padded"))


def test_transports_vargather_refuses_on_gloo_are_named_not_run() -> None:
    info = resolve_options_impl(CheckOptions())
    assert info.transports is not None
    for name, reason in info.refused_transports:
        assert name not in info.transports
        assert "gloo" in reason
    assert set(info.transports) | {n for n, _ in info.refused_transports} == set(
        vargather.TRANSPORT_NAMES
    )


def test_failures_are_rendered_from_their_fields() -> None:
    failures = [
        Failure("output", "mismatch", "out.shape=(3,), but should be (4,)", (0, 2), 3, "f(dim=0)"),
        Failure("gradient", "mismatch", "x.grad differs", (1,), 3, "f(dim=0)"),
        Failure("call", "error", "raised ValueError: no", (0, 1, 2), 3, "f(dim=0)", "Traceback"),
    ]
    assert render_failures(failures) == (
        "out.shape=(3,), but should be (4,) [f(dim=0) on ranks 0, 2 of 3]\n"
        "x.grad differs [f(dim=0) on rank 1 of 3]\n"
        "raised ValueError: no [f(dim=0) on every rank of 3]\nTraceback"
    )
    assert render_failures(failures, limit=1).endswith("... and 2 more distinct failure(s)")


# --- classification (real gloo worlds) ------------------------------------------------


@multirank
@pytest.mark.parametrize(
    "grad", ["sum", *(pytest.param(g, marks=pytest.mark.slow) for g in ("local", "mean"))]
)
def test_vargather_holds_every_property_under_each_contract(grad: str, in_root: None) -> None:
    """Every row but ``compiled`` (its inductor warm-up costs half a minute on 2 cores;
    ``tests/test_properties.py`` and ``tests/test_compile.py`` run it by default) under
    ``sum``; every row under ``local`` and ``mean`` on the slow schedule."""
    only = tuple(i for i in PROPERTY_IDS if i != "compiled") if grad == "sum" else ()
    # 2 examples a row under sum (tests/test_properties.py runs every row on vargather
    # with the profile's examples; this is the gate's verdict on it), 4 on the slow schedule
    report = check(grad=grad, max_examples=2 if grad == "sum" else 4, only=only)
    not_applicable = set() if grad == "sum" else {"adjoint"}
    failed = {r.id: r.failure for r in report.results if r.status not in ("pass", "n/a")}
    assert failed == {}
    assert {r.id for r in report.results if r.status == "n/a"} == not_applicable
    ran = [r for r in report.results if r.status == "pass"]
    assert all(r.cases > 0 for r in ran), [(r.id, r.cases) for r in ran]
    assert report.exit_status == EXIT_OK


SEED_SCOPE_ROWS: Final = (
    "sizes-list",
    "gradient",
    "subgroup",
    "adjoint",
    "coalesced",
    "compiled",
)
"""The rows where the seed's contract and sizes scope decide the verdict: what the
default run checks. The slow variant runs every row, ``forward-int:int16`` included
(gloo's refusal costs a world rebuild per shrinking attempt; the default run sees
that row in ``test_seed_algorithm_fails_sum_with_a_gradient_counterexample``)."""


@multirank
@pytest.mark.parametrize(
    "only", [SEED_SCOPE_ROWS, pytest.param(None, marks=pytest.mark.slow, id="every-row")]
)
def test_seed_algorithm_holds_local_within_its_scope(
    in_root: None, only: tuple[str, ...] | None
) -> None:
    """The seed's algorithm holds the ``local`` contract in every gradient, dim, empty and
    non-contiguous case. Two rows fall outside what it claims, and the gate says so
    rather than failing it: gloo's list all_gather refuses int16 ("Invalid scalar
    type"), a backend limit reported as its own ``forward-int:int16`` row,
    ``unsupported``, while ``forward-int`` keeps its other dtypes; and its callers pass
    ``sizes`` as the tensor it returned (``sizes.amax()``), so a list is out of scope
    with ``--sizes tensor`` and fails without it."""
    report = check(impl=SEED, grad="local", max_examples=6, only=only or ())
    assert {k for k, v in statuses(report).items() if v == "fail"} == {"sizes-list"}
    # misuse: its scenarios call vargather's own signature, which the seed's is not
    misuse = {"misuse"} if only is None else set()
    assert {k for k, v in statuses(report).items() if v == "n/a"} == {
        "subgroup",
        "adjoint",
        "coalesced",
        "compiled",
        *misuse,
    }
    if only is None:
        assert statuses(report)["forward-int"] == "pass"
        assert statuses(report)["forward-int:int16"] == "unsupported"
        ints = failure(report, "forward-int:int16")
        assert ints.kind == "error"
        assert "RuntimeError: Invalid scalar type" in ints.message
        assert ints.case is not None
        assert ints.case["dtype"] == "int16"
    else:
        assert set(statuses(report)) == set(only)
    sizes = failure(report, "sizes-list")
    assert "'list' object has no attribute 'amax'" in sizes.message
    assert sizes.case is not None
    assert sizes.case["sizes_passed"] == "list"
    scoped = check(impl=SEED, grad="local", max_examples=3, sizes="tensor", only=("sizes-list",))
    assert statuses(scoped) == {"sizes-list": "n/a"}
    assert "--sizes tensor" in str(result(scoped, "sizes-list").reason)
    assert report.exit_status == EXIT_FAILED
    assert scoped.exit_status == EXIT_OK
    assert "the seed's convention ATTR(t, dim, sizes) takes no process group" in str(
        result(report, "subgroup").reason
    )
    assert result(report, "coalesced").reason == (
        "ATTR has no coalesced form (vargather.all_gather_v_coalesced only)"
    )
    assert "not claimed to compile" in str(result(report, "compiled").reason)


@multirank
def test_compat_holds_the_seeds_local_contract(in_root: None) -> None:
    """``vargather.compat.all_gather``, the seed's drop-in replacement, fixes both."""
    # 2 examples a row: tests/test_properties.py runs compat's rows with the profile's 20
    report = check(impl="vargather.compat:all_gather", grad="local", max_examples=2)
    # misuse: n/a, its scenarios call vargather's own full signature (as in
    # test_properties, which lists the rows that apply to compat).
    assert {k for k, v in statuses(report).items() if v != "pass"} == {
        "subgroup",
        "adjoint",
        "coalesced",
        "compiled",
        "misuse",
    }
    assert report.exit_status == EXIT_OK


# A structural schema of the JSON report: type per key, nested the same way.
_FAILURE_SCHEMA: dict[str, Any] = {
    "kind": str,
    "message": str,
    "case": (dict, type(None)),
    "reproduction": (str, type(None)),
    "command": (str, type(None)),
    "shrunk": bool,
    "aspect": (str, type(None)),
    "tries": int,
    "failed_tries": int,
    "flaky": bool,
}
_NAN_PAYLOADS_SCHEMA: dict[str, Any] = {
    "cases": int,
    "message": str,
    "reproduction": (str, type(None)),
}
_PROPERTY_SCHEMA: dict[str, Any] = {
    "id": str,
    "title": str,
    "status": str,
    "examples": int,
    "cases": int,
    "shrink_runs": int,
    "seconds": (int, float),
    "reason": (str, type(None)),
    "failure": (_FAILURE_SCHEMA, type(None)),
    "hint": (str, type(None)),
    "nan_payloads": (_NAN_PAYLOADS_SCHEMA, type(None)),
}
_REPORT_SCHEMA: dict[str, Any] = {
    "schema": str,
    "impl": (str, type(None)),
    "impl_display": str,
    "convention": str,
    "call": (str, type(None)),
    "op": str,
    "grad": str,
    "world_sizes": [int],
    "max_examples": int,
    "seed": int,
    "xfails_file": (str, type(None)),
    "versions": dict,
    "transports": ([str], type(None)),
    "refused_transports": dict,
    "scope": {
        "--grad": str,
        "--sizes": str,
        "--returns": str,
        "--world-sizes": str,
    },
    "strict": bool,
    "properties": [_PROPERTY_SCHEMA],
    "summary": {name: int for name in STATUSES},
    "exit_status": int,
    "seconds": (int, float),
}


def conforms(value: Any, schema: Any, where: str = "$") -> list[str]:
    """Where ``value`` departs from ``schema`` (a type, a tuple of alternatives, a
    one-element list for "list of", or a dict of exactly these keys)."""
    if isinstance(schema, tuple):
        per_option = [conforms(value, option, where) for option in schema]
        return [] if any(not p for p in per_option) else per_option[0]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in conforms(v, schema[0], f"{where}[{i}]")]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        problems = (
            [f"{where}: keys {sorted(value)} != {sorted(schema)}"]
            if set(value) != set(schema)
            else []
        )
        return problems + [
            p for k in schema if k in value for p in conforms(value[k], schema[k], f"{where}.{k}")
        ]
    if schema is int and isinstance(value, bool):
        return [f"{where}: expected int, got bool"]
    return (
        [] if isinstance(value, schema) else [f"{where}: expected {schema.__name__}, got {value!r}"]
    )


def table_rows(stdout: str) -> dict[str, tuple[str, str, str]]:
    """``property -> (status, examples, cases)`` from the printed table."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("property  "))
    rows: dict[str, tuple[str, str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


@pytest.fixture(scope="module")
def seed_sum(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """One real ``python -m vargather check`` of the seed under ``sum`` (failing rows,
    shrinking), run from an empty working directory that
    ``test_the_check_writes_nothing_into_the_working_directory`` then reads."""
    path = tmp_path_factory.mktemp("seed-sum") / "report.json"
    workdir = tmp_path_factory.mktemp(_SEED_SUM_CWD, numbered=False)
    proc = cli(
        "--impl", SEED, "--grad", "sum", "--world-sizes", "1,2", "--max-examples", "6",
        "--shrink-budget", "3", "--json", str(path), "--timings", cwd=workdir,
    )  # fmt: skip  # W = 1 and 2 find every failing row W = 3 adds (2 s less)
    return proc, json.loads(path.read_text()) if path.exists() else None


_SEED_SUM_CWD = "seed-sum-cwd"
"""The empty working directory ``seed_sum`` runs in, under the session's base temp."""


@multirank
def test_the_check_writes_nothing_into_the_working_directory(
    seed_sum: tuple[subprocess.CompletedProcess[str], Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """No ``.hypothesis/`` (the run fails rows and shrinks them, where an example
    database would be written) and nothing else in the directory the command ran from."""
    proc, _ = seed_sum
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert os.listdir(tmp_path_factory.getbasetemp() / _SEED_SUM_CWD) == []


@multirank
def test_seed_algorithm_fails_sum_with_a_gradient_counterexample(
    seed_sum: tuple[subprocess.CompletedProcess[str], Any],
) -> None:
    proc, report = seed_sum
    assert proc.returncode == EXIT_FAILED, proc.stderr
    by_id = {p["id"]: p for p in report["properties"]}
    assert {k for k, p in by_id.items() if p["status"] == "fail"} == {
        "sizes-list", "gradient", "adjoint", "call-sequence",
    }  # fmt: skip
    assert by_id["forward-int:int16"]["status"] == "unsupported"
    grad = by_id["gradient"]["failure"]
    assert grad["kind"] == "mismatch"
    assert grad["message"].startswith("x.grad (grad='sum') differs from the oracle")
    assert grad["case"]["contract"] == "sum"
    assert grad["case"]["world_size"] >= 2
    assert grad["case"]["requires_grad"] is True
    assert grad["aspect"] == "gradient"
    assert grad["command"].startswith("python -m vargather repro ")
    assert f"--impl {SEED} --convention seed --contracts sum" in grad["command"]
    for prop in ("forward-float", "dims", "empty-some", "one-rank", "uninitialized"):
        assert by_id[prop]["status"] == "pass", by_id[prop]


@multirank
def test_json_report_has_the_documented_structure(
    seed_sum: tuple[subprocess.CompletedProcess[str], Any],
) -> None:
    _, report = seed_sum
    assert conforms(report, _REPORT_SCHEMA) == []
    assert report["schema"] == "vargather-check-report/1"
    ids = [p["id"] for p in report["properties"]]
    assert [i for i in ids if ":" not in i] == list(PROPERTY_IDS)
    assert [i for i in ids if ":" in i] == ["forward-int:int16"]  # gloo refuses int16


@multirank
def test_json_report_matches_the_printed_table(
    seed_sum: tuple[subprocess.CompletedProcess[str], Any],
) -> None:
    proc, report = seed_sum
    shown = {
        "pass": "pass",
        "fail": "FAIL",
        "xfail": "xfail",
        "xpass": "XPASS",
        "n/a": "n/a",
        "unsupported": "unsupported",
    }
    expected = {}
    for p in report["properties"]:
        examples = str(p["examples"]) + (
            f" (+{p['shrink_runs']} shrinking)" if p["shrink_runs"] else ""
        )
        expected[p["id"]] = (shown[p["status"]], examples, str(p["cases"]))
    assert table_rows(proc.stdout) == expected
    for p in report["properties"]:
        if p["failure"] is not None and p["status"] == "fail":
            f = p["failure"]
            tries = f", failed {f['failed_tries']} of {f['tries']} tries" if f["tries"] > 1 else ""
            tries = tries.replace(", ", ", flaky: ", 1) if f["flaky"] else tries
            assert f"=== {p['id']}: FAILED ({f['kind']}{tries}) ===" in proc.stdout
            assert p["failure"]["command"] in proc.stdout
    summary = report["summary"]
    unsupported = (
        f"{summary['unsupported']} unsupported by the backend, " if summary["unsupported"] else ""
    )
    assert proc.stdout.rstrip().endswith(
        f"FAILED: {summary['pass']} passed, {summary['fail']} failed, {unsupported}"
        f"{summary['n/a']} not applicable of {len(report['properties'])} properties "
        f"in {report['seconds']:.1f} s"
    )
    # progress went to stderr, one line per row of the report
    n = len(report["properties"])
    assert len(re.findall(rf"^\[\s*\d+/{n}\] ", proc.stderr, re.MULTILINE)) == n


@multirank
@pytest.mark.slow  # tests/test_gate_forks.py checks byte-identical verdicts in the default run
def test_same_seed_same_run(in_root: None) -> None:
    def run() -> list[tuple[str, str, int, int, Any]]:
        report = check(impl=SEED, grad="sum", seed=7, max_examples=4, only=("gradient", "dims"))
        return [
            (r.id, r.status, r.examples, r.cases, r.failure and r.failure.case)
            for r in report.results
        ]

    assert run() == run()


@multirank
def test_xfails_are_strict(in_root: None) -> None:
    only = ("forward-float", "sizes-list")
    expected = check(
        impl=SEED, grad="local", max_examples=3, only=only, xfails=frozenset({"sizes-list"})
    )
    assert statuses(expected) == {"forward-float": "pass", "sizes-list": "xfail"}
    assert expected.exit_status == EXIT_OK
    unexpected = check(
        impl=SEED,
        grad="local",
        max_examples=3,
        only=only,
        xfails=frozenset(only),
        xfails_path="x.txt",
    )
    assert statuses(unexpected) == {"forward-float": "xpass", "sizes-list": "xfail"}
    assert unexpected.exit_status == EXIT_FAILED
    assert "=== forward-float: XPASS ===" in unexpected.render()


# --- crashes and hangs ----------------------------------------------------------------

_MISBEHAVING = textwrap.dedent(
    """
    import os
    import time

    import torch
    import torch.distributed as dist


    def aborts_on_float64(t, dim, sizes):
        # gloo-style abort of one rank, only for float64 inputs
        if t.dtype == torch.float64 and dist.is_initialized() and dist.get_rank() == 1:
            os.abort()
        return _gather(t, dim)


    def hangs_on_float64(t, dim, sizes):
        if t.dtype == torch.float64 and dist.is_initialized() and dist.get_rank() == 1:
            time.sleep(3600)
        return _gather(t, dim)


    def aborts_without_distributed(t, dim, sizes):
        if not dist.is_initialized():
            os.abort()
        return _gather(t, dim)


    def _gather(t, dim):
        from vargather.compat import all_gather
        return all_gather(t, dim, None)
    """
)


@pytest.fixture
def misbehaving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "misbehaving.py").write_text(_MISBEHAVING)
    monkeypatch.chdir(tmp_path)
    yield
    sys.modules.pop("misbehaving", None)


@multirank
@pytest.mark.slow  # the default run: the fork zoo's crashing member (test_gate_forks.py)
def test_a_crash_is_a_failure_of_that_property(misbehaving: None) -> None:
    report = check(
        impl="misbehaving:aborts_on_float64",
        grad="local",
        world_sizes=(2,),
        max_examples=5,
        only=("forward-float", "forward-half"),
        shrink_budget=3,
    )
    crash = failure(report, "forward-float")
    assert crash.kind == "crash"
    assert "killed by signal SIGABRT" in crash.message
    assert crash.case is not None
    assert crash.case["dtype"] == "float64"
    assert result(report, "forward-half").status == "pass"  # on a fresh world


@multirank
def test_a_hang_is_a_failure_of_that_property(misbehaving: None) -> None:
    with RankPool(2, call_timeout=3.0, start_method="forkserver") as pool:
        report = run_check(
            CheckOptions(
                impl="misbehaving:hangs_on_float64",
                grad="local",
                world_sizes=(2,),
                max_examples=5,
                only=("forward-float", "forward-half"),
                progress=False,
            ),
            pool_factory=lambda w: pool,
        )
    hang = failure(report, "forward-float")
    assert hang.kind == "hang"
    assert "did not reply" in hang.message
    assert hang.case is not None
    assert hang.case["dtype"] == "float64"
    assert result(report, "forward-half").status == "pass"


@multirank
def test_a_crash_without_torch_distributed_is_that_propertys_failure(misbehaving: None) -> None:
    report = check(
        impl="misbehaving:aborts_without_distributed",
        grad="local",
        max_examples=3,
        only=("uninitialized", "forward-float"),
    )
    crash = failure(report, "uninitialized")
    assert crash.kind == "crash"
    assert "killed by signal SIGABRT" in crash.message
    assert crash.case is not None
    assert crash.case["initialized"] is False
    assert result(report, "forward-float").status == "pass"


@multirank
@pytest.mark.parametrize("forked", [False, True], ids=["interpreter", "forked"])
def test_the_isolated_row_judges_alike_forked_or_started(
    misbehaving: None, monkeypatch: pytest.MonkeyPatch, forked: bool
) -> None:
    """The ``uninitialized`` row's child is forked from this process's forkserver once it
    runs, else a fresh interpreter: either way a passing implementation passes and an
    abort is that row's crash, named by its signal, with the case in flight."""
    from vargather.testing import isolated

    if forked:
        # Started from another directory than the check's (the repository root, as
        # when an earlier world started it): the child runs in the check's.
        with monkeypatch.context() as elsewhere:
            elsewhere.chdir(ROOT)
            with RankPool(1, start_method="forkserver"):
                pass  # a world forked from this process's forkserver: it is running now
    monkeypatch.setattr(isolated, "_forkserver_running", lambda: forked)
    kinds: list[str] = []
    started = isolated._ForkedChild.__init__

    def forked_child(self: Any, *args: Any) -> None:
        kinds.append("forked")
        started(self, *args)

    monkeypatch.setattr(isolated._ForkedChild, "__init__", forked_child)
    good = check(impl="vargather:all_gather_v", max_examples=3, only=("uninitialized",))
    assert statuses(good) == {"uninitialized": "pass"}
    bad = check(
        impl="misbehaving:aborts_without_distributed",
        grad="local",
        max_examples=3,
        only=("uninitialized",),
    )
    crash = failure(bad, "uninitialized")
    assert crash.kind == "crash"
    assert "killed by signal SIGABRT" in crash.message
    assert crash.case is not None
    assert crash.case["initialized"] is False
    assert kinds == (["forked"] * 2 if forked else [])


# --- the mutant catalogue ---------------------------------------------------------------

MUTANT_ROWS = tuple(p for p in PROPERTY_IDS if p != "uninitialized")
"""The rows the mutant runs use: all but the in-process one, whose child process would
cost seconds per run (leaving a row out only makes a mutant harder to catch)."""


def _mutant_names() -> tuple[str, ...]:
    from tests.mutants import NAMES

    return NAMES


@multirank
@pytest.mark.slow  # the catalogue catches every mutant in tests/test_mutants.py (default run)
@pytest.mark.parametrize("name", _mutant_names())
def test_every_mutant_fails_the_check(name: str, in_root: None) -> None:
    """Each deliberately broken gather of ``tests/mutants`` fails the check under some
    claimed contract (tried in the order sum, mean, local; ``--exitfirst``), and its
    minimal counterexample passes on the unbroken pipeline (``tests/mutants/faithful``),
    so the catch is the mutant's bug, not a bug the mutants share."""
    from tests.mutants import MUTANTS, implementation

    (mutant,) = [m for m in MUTANTS if m.name == name]
    # A stateful mutant (a cache) is reproduced by a call sequence only; its earlier
    # calls in this session must not leave state behind, so its worlds start fresh.
    rows = ("call-sequence",) if mutant.stateful else MUTANT_ROWS
    if mutant.stateful:
        _fresh_worlds()
    impl = f"tests.mutants.{name}:all_gather_v"
    for grad in ("sum", "mean", "local"):
        report = check(impl=impl, grad=grad, max_examples=6, exitfirst=True, only=rows)
        failed = [r for r in report.results if r.status == "fail"]
        if failed:
            break
    else:
        pytest.fail(f"mutant {name} survived the check under every contract")
    (row,) = failed
    assert row.failure is not None
    assert row.failure.kind in ("mismatch", "error"), row.failure
    assert row.failure.case is not None
    # The reproduction re-runs the calls before the failing one too (state carried
    # across calls); for a stateless bug it is the failing case alone.
    cases = _reproduced_cases(row.failure.reproduction or "")
    assert cases[-1] == parse_case(row.failure.case["repr"])
    assert report.transports is not None
    faithful = implementation("faithful", report.transports)
    if mutant.stateful:
        _fresh_worlds()
    assert not all(v.ok for v in run_cases(cases, implementation(name, report.transports)))
    control = run_cases(cases, faithful)
    assert all(v.ok for v in control), (row.id, [v.failures for v in control])


def _fresh_worlds() -> None:
    for w in (2, 3, 4):
        get_pool(w).restart()


def _reproduced_cases(reproduction: str) -> list[GatherCase]:
    (line,) = [ln for ln in reproduction.splitlines() if "reproduce: " in ln]
    words = shlex.split(line.split("reproduce: ", 1)[1])
    return [parse_case(w) for w in words if w.startswith("GatherCase(")]


@multirank
@pytest.mark.slow  # default run: test_mutants catches chunked_tail_zeroed (dims[W=2])
def test_a_chunking_bug_above_a_few_kib_fails_the_default_check(in_root: None) -> None:
    """The issue's example: an implementation that moves shards of more than 4 KiB in
    chunks and loses the last partial chunk fails the default check, from the command
    line, with a counterexample that names the payload in bytes per rank, shrunk to a
    shard just above the 4 KiB threshold."""
    proc = cli(
        "--impl",
        "tests.mutants.chunked_tail_zeroed:all_gather_v",
        "--only",
        "forward-float",
        "--no-progress",
        timeout=400,
    )
    assert proc.returncode == EXIT_FAILED, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "payload:" in ln]
    per_rank = [int(n) for n in line.split("[", 1)[1].split("]", 1)[0].split(",")]
    assert 4096 < max(per_rank) <= 4096 + 64, line  # just above the threshold
    assert "bytes per rank" in line


# --- no false alarms --------------------------------------------------------------------


@multirank
@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.slow) for s in range(1, 21)])
def test_no_false_alarm_on_vargather_across_seeds(seed: int, in_root: None) -> None:
    # Small budgets, each contract in turn, on the slow schedule (the default run has
    # the per-contract test above under ``sum``, the compat check under ``local`` and
    # test_properties.py's every contract); the in-process row is left to the
    # per-contract test above (it costs a child process per run).
    grad = ("sum", "local", "mean")[seed % 3]
    only = tuple(p for p in PROPERTY_IDS if p != "uninitialized")
    report = check(grad=grad, seed=seed, max_examples=2, only=only)
    failed = {r.id: r.failure for r in report.results if r.failed}
    assert failed == {}

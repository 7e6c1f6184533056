"""Verdicts that are right on the built-in targets, and the same JSON for flaky code.

The scopes ``--equal-shapes`` (the list form of ``torch.distributed.all_gather``) and
``--contiguous-only`` (``torch.distributed``'s collectives, which refuse strided views), the NaN
rule ``--nan-payloads backend`` for code that reduces on the backend, and the tries a
failing batch gets (a flaky failure shrinks by "fails in any of its tries" and reports
how many of its tries failed). Most tests here run no world: the flaky search runs on a
stand-in row whose failures come and go by a fixed pattern.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vargather._cli import check as check_cli
from vargather.testing import get_pool
from vargather.testing.asserts import nan_payloads_only
from vargather.testing.cases import Implementation
from vargather.testing.catalogues import catalogue_of
from vargather.testing.catalogues.all_gather_v import EQUAL_SHAPES_ONLY, equal_shapes_only
from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase
from vargather.testing.engine import run_check
from vargather.testing.evaluate import TRIES, evaluate_row
from vargather.testing.family import CallReport, expected, judge_case
from vargather.testing.judge import Failure
from vargather.testing.options import CheckOptions, OptionError, read_config
from vargather.testing.progress import Progress
from vargather.testing.properties import Property
from vargather.testing.results import PropertyFailure, PropertyResult, Report
from vargather.testing.targets import apply_target, by_name

# --- --equal-shapes ---------------------------------------------------------------------


def test_equal_shapes_is_an_option_everywhere_and_part_of_the_declared_scope(
    tmp_path: Path,
) -> None:
    assert check_cli.parse_args(["--equal-shapes"]).equal_shapes
    assert not check_cli.parse_args([]).equal_shapes
    config = tmp_path / "pyproject.toml"
    config.write_text(
        '[tool.vargather.check]\nequal-shapes = true\nnan-payloads = "backend"\n', encoding="utf-8"
    )
    assert read_config(str(config)) == {"equal-shapes": True, "nan-payloads": "backend"}
    options = apply_target(CheckOptions(target="nn-all-gather"))
    assert options.equal_shapes
    assert by_name("nn-all-gather").scope["equal_shapes"] is True


def test_the_family_refuses_equal_shapes() -> None:
    options = CheckOptions(op="reduce_scatter_v", equal_shapes=True)
    with pytest.raises(OptionError, match="equal-shapes does not apply to --op reduce_scatter_v"):
        catalogue_of("reduce_scatter_v").resolve(options, ".")


_IMPL = Implementation("tests.forks.plain_all_gather:all_gather", contracts=("sum",))
_ROWS = {r.id: r for r in catalogue_of("all_gather_v").rows(_IMPL)}


def test_rows_about_unequal_shapes_are_out_of_scope() -> None:
    scoped = {i: equal_shapes_only(r) for i, r in _ROWS.items()}
    assert scoped["empty-some"].out_of_scope == EQUAL_SHAPES_ONLY
    assert scoped["forward-float"].equal_shapes
    assert not _ROWS["forward-float"].equal_shapes


def _some_unequal(batch: Sequence[Any]) -> bool:
    return any(len(set(c.shapes)) > 1 for c in batch)


@pytest.mark.parametrize("row", ["forward-float", "subgroup", "call-sequence", "non-contiguous"])
def test_equal_shapes_draws_equal_shapes_only(row: str) -> None:
    plain = _ROWS[row].strategy((2, 3, 4))
    scoped = equal_shapes_only(_ROWS[row]).strategy((2, 3, 4))
    seen: list[bool] = []

    @settings(max_examples=30, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        assert not _some_unequal(data.draw(scoped))
        seen.append(_some_unequal(data.draw(plain)))

    draw()
    assert any(seen)  # without the scope, unequal shapes are drawn


# --- the NaN rule ---------------------------------------------------------------------------


def _nan(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int32).view(torch.float32)


def test_nan_payloads_only_tells_payloads_from_values() -> None:
    quiet, payload = _nan(0x7FC00000), _nan(0x7FC00001)
    one = torch.tensor([1.0])
    assert nan_payloads_only(torch.cat([payload, one]), torch.cat([quiet, one]))
    assert not nan_payloads_only(torch.cat([payload, one]), torch.cat([quiet, one + 1]))
    assert not nan_payloads_only(one, quiet)  # a number where the oracle has a NaN
    assert not nan_payloads_only(quiet, one)
    z = torch.complex(torch.cat([quiet, one]), torch.cat([one, payload]))
    w = torch.complex(torch.cat([payload, one]), torch.cat([one, quiet]))
    assert nan_payloads_only(z, w)
    assert not nan_payloads_only(torch.tensor([1]), torch.tensor([2]))


def test_the_family_judge_marks_a_reduction_that_differs_in_nan_payloads_only() -> None:
    case = next(
        c
        for seed in range(200)
        for c in [
            ReduceScatterCase(2, (2, 1), (3,), 0, requires_grad=False, special=True, seed=seed)
        ]
        if any(bool(t.isnan().any()) for t in expected(c)[0])
    )
    want = expected(case)[0]
    bits = [t.view(torch.int32).clone() for t in want]
    for t, b in zip(want, bits, strict=True):
        b[t.isnan()] = 0x7FC00001  # a NaN, with another payload
    got = [CallReport(b.view(torch.float32), None, None) for b in bits]
    (failure,) = [f for f in judge_case(case, got) if f.aspect == "output"][:1]
    assert failure.nan_payload
    assert failure.message.startswith("NaN payloads differ where both hold a NaN")
    wrong = [CallReport(t + 1, None, None) for t in want]
    assert not any(f.nan_payload for f in judge_case(case, wrong))


# --- a stand-in row whose failures come and go ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _StandIn(Property):
    """A row over lists of integers: ``verdict(x, call)`` is the failure of case ``x``
    on the ``call``-th run (counted in ``calls``), or ``None``."""

    verdict: Callable[[int, int], Failure | None] = lambda x, call: None
    calls: list[int] = dataclasses.field(default_factory=list)

    def strategy(self, world_sizes: Sequence[int], **kwargs: Any) -> Any:
        return st.lists(st.integers(0, 30), min_size=1, max_size=4)

    def run(self, batch: Sequence[Any], *, pool_factory: Any = None) -> list[Any]:
        out = []
        for x in batch:
            self.calls.append(x)
            failure = self.verdict(x, len(self.calls))
            out.append((SimpleNamespace(case=x, not_run=""), [failure] if failure else []))
        return out

    def describe(self, batch: Sequence[Any], index: int) -> str:
        return f"case {batch[index]}\nreproduce: echo {batch[index]}"

    def case_data(self, case: Any) -> dict[str, Any]:
        return {"x": case}


def _stand_in(verdict: Callable[[int, int], Failure | None]) -> _StandIn:
    return _StandIn(_IMPL, "stand-in", "a stand-in row", frozenset({"output"}), verdict=verdict)


def _evaluate(row: _StandIn, **options: Any) -> PropertyResult:
    opts = CheckOptions(max_examples=40, **options)
    return evaluate_row(row, opts, (1,), get_pool, Progress(None, 1))


def _wrong(x: int) -> Failure:
    return Failure("output", "mismatch", f"got garbage for x={x}")


def test_a_failure_that_comes_and_goes_is_reported_the_same_every_run() -> None:
    def every_other_call(x: int, call: int) -> Failure | None:
        return _wrong(x) if x >= 5 and call % 2 == 0 else None  # one try may pass

    reports = []
    for _ in range(3):
        row = _stand_in(every_other_call)
        result = _evaluate(row)
        assert result.status == "fail"
        assert result.failure is not None
        reports.append(json.dumps(result.failure.to_json(), sort_keys=True))
    failure = PropertyFailure(**{k: v for k, v in json.loads(reports[0]).items() if k in _FIELDS})
    assert reports[0] == reports[1] == reports[2]
    assert failure.case == {"x": 5}  # shrunk by "fails in any of its tries"
    assert failure.tries == TRIES
    assert 0 < failure.failed_tries < TRIES
    assert failure.flaky


_FIELDS = {f.name for f in dataclasses.fields(PropertyFailure)}


def test_a_failure_on_every_try_is_not_flaky_and_passing_examples_run_once() -> None:
    row = _stand_in(lambda x, call: _wrong(x) if x >= 7 else None)
    result = _evaluate(row)
    assert result.failure is not None
    assert (result.failure.tries, result.failure.failed_tries) == (TRIES, TRIES)
    assert not result.failure.flaky
    assert result.failure.case == {"x": 7}
    passing = _stand_in(lambda x, call: None)
    assert _evaluate(passing).status == "pass"
    assert len(passing.calls) == _evaluate(_stand_in(lambda x, call: None)).cases


def test_the_table_and_the_json_say_a_failure_is_flaky() -> None:
    failure = PropertyFailure("mismatch", "got garbage", {"x": 5}, tries=3, failed_tries=2)
    row = PropertyResult("forward-int:int16", "forward", "fail", 4, 4, failure=failure)
    report = Report(None, "f", "vargather", "sum", (2,), 4, 0, None, results=[row])
    text = report.render()
    assert "[flaky: failed 2 of 3 tries]" in text
    assert "=== forward-int:int16: FAILED (mismatch, flaky: failed 2 of 3 tries) ===" in text
    data = report.to_json()["properties"][0]
    assert data["failure"]["flaky"] is True
    assert PropertyResult.from_json(data) == dataclasses.replace(row, seconds=0.0)


def _payload(x: int, call: int) -> Failure | None:
    if x < 3:
        return None
    return Failure("output", "mismatch", "NaN payloads differ", nan_payload=True)


def test_nan_payloads_backend_reports_without_failing_unless_strict() -> None:
    exact = _evaluate(_stand_in(_payload))
    assert exact.status == "fail"
    backend = _evaluate(_stand_in(_payload), nan_payloads="backend")
    assert backend.status == "pass"
    assert backend.nan_payloads is not None
    assert 0 < backend.nan_payloads.cases <= backend.cases
    assert "NaN payloads differ" in backend.nan_payloads.message
    strict = _evaluate(_stand_in(_payload), nan_payloads="backend", strict=True)
    assert strict.status == "fail"
    assert strict.nan_payloads is None


def test_an_error_naming_an_object_reads_the_same_on_every_rank_and_run() -> None:
    from vargather.testing.cases import GatherCase, RankReport
    from vargather.testing.judge import judge, without_addresses

    def said(address: str) -> str:
        return f"Global rank 1 is not part of group <ProcessGroup object at {address}>"

    assert without_addresses(said("0x7f3ce15380b0")) == without_addresses(said("0x7fdf26c5ceb0"))
    assert without_addresses("at 0x10 and <a at 0x1f>") == "at 0x10 and <a at 0x...>"
    case = GatherCase(shapes=((1,), (1,)), dim=0, dtype="float32", requires_grad=False)
    reports = [
        RankReport(r, r, error=("ValueError", said(a), "")) for r, a in enumerate(("0x1a", "0x2b"))
    ]
    (failure,) = judge(case, _IMPL, reports)
    assert failure.ranks == (0, 1)
    assert "0x..." in failure.message


# --- the targets that were wrong before ------------------------------------------------------


@pytest.mark.multirank
def test_nn_all_gather_passes_within_its_declared_scope() -> None:
    options = CheckOptions(
        target="nn-all-gather",
        world_sizes=(2,),
        max_examples=4,
        only=("forward-float", "empty-some"),
        shrink_budget=4,
    )
    report = run_check(options, pool_factory=get_pool)
    statuses = {r.id: r.status for r in report.results}
    assert statuses == {"forward-float": "pass", "empty-some": "n/a"}, report.render()
    assert report.scope["--equal-shapes"] == "yes"


@pytest.mark.multirank
def test_torchs_all_to_all_single_passes_within_its_declared_scope() -> None:
    """``torch.distributed.all_to_all_single`` raises on the rank given a strided view
    (``Tensors must be contiguous``, gloo and NCCL alike) and needs an initialized group:
    its scope says so, and those rows are n/a, not failures. (The functional collective
    makes its input contiguous itself: ``funcol-all-to-all`` declares ``--requires-init``
    only, and its ``non-contiguous`` row passes.)"""
    assert check_cli.parse_args(["--contiguous-only"]).contiguous_only
    options = CheckOptions(
        target="nn-all-to-all",
        world_sizes=(2,),
        max_examples=4,
        only=("forward-float", "non-contiguous", "uninitialized"),
        shrink_budget=4,
    )
    report = run_check(options, pool_factory=get_pool)
    statuses = {r.id: r.status for r in report.results if ":" not in r.id}  # not dtype rows
    assert statuses == {
        "forward-float": "pass",
        "non-contiguous": "n/a",
        "uninitialized": "n/a",
    }, report.render()
    assert report.scope["--contiguous-only"] == report.scope["--requires-init"] == "yes"
    without = dataclasses.replace(apply_target(options), contiguous_only=False, target=None)
    failed = run_check(
        dataclasses.replace(without, only=("non-contiguous",), max_examples=20),
        pool_factory=get_pool,
    )
    assert [r.status for r in failed.results] == ["fail"], failed.render()
    assert "Tensors must be contiguous" in failed.render()


# --- the JSON holds nothing that varies run to run --------------------------------------------


@pytest.mark.multirank
def test_two_runs_write_the_same_json_bytes_and_timings_only_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs of one seed write byte-identical JSON (a failing row, shrunk, included):
    no seconds, paths, pids or ports; ``--timings`` puts the seconds back."""
    argv = [
        "--no-config", "--no-progress", "--impl", "vargather.testing.reference_seed:all_gather",
        "--grad", "sum", "--world-sizes", "2", "--max-examples", "3", "--shrink-budget", "3",
        "--only", "forward-float,gradient", "--seed", "4",
    ]  # fmt: skip
    texts = []
    for i in range(2):
        path = tmp_path / f"run{i}.json"
        assert check_cli.main([*argv, "--json", str(path)]) == 1  # the seed's sum gradient
        texts.append(path.read_bytes())
    assert texts[0] == texts[1]
    data = json.loads(texts[0])
    assert "seconds" not in data
    assert all("seconds" not in p for p in data["properties"])
    assert any(p["failure"] is not None for p in data["properties"])
    assert str(tmp_path) not in texts[0].decode()
    timed = tmp_path / "timed.json"
    check_cli.main([*argv, "--json", str(timed), "--timings"])
    data = json.loads(timed.read_text())
    assert isinstance(data["seconds"], float)
    assert all(isinstance(p["seconds"], float) for p in data["properties"])
    capsys.readouterr()


def test_memory_nothing_wrote_reads_the_same_values_while_a_case_runs() -> None:
    """An output read before its collective wrote it (``tests/forks/vq_unwaited.py``)
    holds a fixed value while a rank runs a case, not what memory held before; after the
    case, torch's deterministic mode is as it was (the bench's ranks run untouched)."""
    from vargather.testing.repeatable import fresh_memory_filled

    assert not torch.are_deterministic_algorithms_enabled()
    with fresh_memory_filled():
        ints = [torch.empty(n, dtype=torch.int16).tolist() for n in (1, 64, 4096)]
        floats = torch.zeros(3).new_empty(5)
        flags = torch.empty(4, dtype=torch.bool)
        # an operation torch cannot run deterministically still runs (it only warns)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert ints == [[32767] * n for n in (1, 64, 4096)]
    assert bool(floats.isnan().all())
    assert flags.tolist() == [True] * 4
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_settling_stays_beneath_an_interception_put_in_during_a_case() -> None:
    """The settling functions are put in once and switched per case: an interception put
    in above them while a case runs (``--emulate nccl``) is still there after it."""
    import torch.distributed as dist

    from vargather.testing.repeatable import refusals_settled

    with refusals_settled():
        pass
    kept = dist.broadcast

    def above(*args: object, **kwargs: object) -> object:
        return kept(*args, **kwargs)

    try:
        with refusals_settled():
            dist.broadcast = above  # type: ignore[assignment]  # an interception, as emulate's
        assert dist.broadcast is above
    finally:
        dist.broadcast = kept


def test_a_crash_reads_the_same_whichever_peers_had_replied() -> None:
    """A rank aborts; which of its peers had replied, raised or were still waiting when
    the world was killed varies run to run, and the report says it in one line."""
    from vargather.testing.judge import world_failure_text
    from vargather.testing.pool_types import RankCrashed

    dead = "--- rank 3 died (killed by signal SIGABRT); its stderr:\n  what():  size 40 vs 16"
    head = "rank 3 (killed by signal SIGABRT) died during f:"
    tail = "All rank processes were killed; the next call starts a fresh world."
    silent = ["--- rank 1 did not reply within call_timeout=30 s", "--- rank 2 raised:\n boom"]
    texts = {
        world_failure_text(RankCrashed("\n".join([head, dead, *others, tail]), [3]))
        for others in (silent, silent[:1], silent[1:])
    }
    assert len(texts) == 1
    (text,) = texts
    assert "what():  size 40 vs 16" in text
    assert "rank 1" not in text
    assert "boom" not in text
    assert world_failure_text(RankCrashed("\n".join([head, dead, tail]), [3])) != text

"""The judge (``vargather/testing/judge.py``): rank reports in, structured failures out.

No ranks here: the reports are built by hand from the oracle's answer, then broken one
field at a time, and the ``Failure`` records are checked field by field (aspect, kind,
ranks), never by parsing their text.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vargather.testing.cases import COMPAT, VARGATHER, GatherCase, RankReport, TensorBytes
from vargather.testing.judge import Failure, judge

CASE = GatherCase(shapes=((2, 3), (1, 3), (2, 3)), dim=0, dtype="float32", values="integers")


def _right(case: GatherCase) -> list[RankReport]:
    """The reports a correct vargather would send for ``case``."""
    exp = case.expected()
    assert exp.input_grads is not None
    reports = []
    for r in range(case.group_size):
        offsets = tuple(sum(case.sizes[:i]) for i in range(case.group_size))
        layout = {
            "sizes": case.sizes,
            "offsets": offsets,
            "total": sum(case.sizes),
            "max_size": max(case.sizes),
            "dim": case.normalized_dim,
            "leading_shape": (),
            "trailing_shape": case.shapes[0][1:],
            "dtype": case.dtype,
            "rank": r,
            "world_size": case.group_size,
        }
        reports.append(
            RankReport(
                r,
                r,
                out=TensorBytes.of(exp.output),
                out_requires_grad=True,
                extra=("layout", layout),
                grad=TensorBytes.of(exp.input_grads[r]),
            )
        )
    return reports


def test_a_correct_run_has_no_failure() -> None:
    assert judge(CASE, VARGATHER, _right(CASE)) == []


def test_a_wrong_output_on_one_rank() -> None:
    reports = _right(CASE)
    bad = CASE.expected().output.clone()
    bad[0, 0] += 1
    reports[1] = dataclasses.replace(reports[1], out=TensorBytes.of(bad))
    (failure,) = judge(CASE, VARGATHER, reports)
    assert (failure.aspect, failure.kind, failure.ranks, failure.group_size) == (
        "output",
        "mismatch",
        (1,),
        3,
    )
    assert failure.message.startswith("out differs from torch.cat(x, dim)")
    assert failure.render().endswith("[all_gather_v_with_layout(dim=0) on rank 1 of 3]")


def test_ranks_that_fail_alike_are_one_failure() -> None:
    reports = [
        dataclasses.replace(rep, error=("ValueError", "no", "Traceback ...\nValueError: no"))
        for rep in _right(CASE)
    ]
    (failure,) = judge(CASE, VARGATHER, reports)
    assert (failure.aspect, failure.kind, failure.ranks) == ("call", "error", (0, 1, 2))
    assert failure.message == "raised ValueError: no"
    assert "Traceback" in failure.detail
    assert "on every rank of 3" in failure.render()


def test_each_check_has_its_aspect() -> None:
    reports = _right(CASE)
    layout = dict(reports[0].extra[1])  # type: ignore[call-overload]  # a layout's fields
    layout["total"] = 99
    reports[0] = dataclasses.replace(reports[0], extra=("layout", layout))
    reports[2] = dataclasses.replace(reports[2], grad=None, grad_type="NoneType")
    failures = judge(CASE, VARGATHER, reports)
    assert {(f.aspect, f.ranks) for f in failures} == {("sizes", (0,)), ("gradient", (2,))}


def test_the_seed_convention_judges_returned_sizes() -> None:
    case = dataclasses.replace(CASE, contract="local")
    reports = [
        dataclasses.replace(rep, extra=("sizes", TensorBytes.of(torch.tensor([2, 1, 2]))))
        for rep in _right(case)
    ]
    assert judge(case, COMPAT, reports) == []
    wrong = TensorBytes.of(torch.tensor([2, 2, 2]))
    reports[0] = dataclasses.replace(reports[0], extra=("sizes", wrong))
    (failure,) = judge(case, COMPAT, reports)
    assert (failure.aspect, failure.ranks) == ("sizes", (0,))
    assert failure.message == "sizes=[2, 2, 2], but should be [2, 1, 2]"


def test_a_missing_report_counts_against_the_call() -> None:
    reports: list[object] = list(_right(CASE))
    reports[2] = None
    (failure,) = judge(CASE, VARGATHER, reports)
    assert (failure.aspect, failure.kind, failure.ranks) == ("call", "error", (2,))


@pytest.mark.parametrize(("field", "value"), [("aspect", "speed"), ("kind", "slow")])
def test_failures_name_only_known_aspects_and_kinds(field: str, value: str) -> None:
    kwargs = {"aspect": "output", "kind": "mismatch", "message": "m", field: value}
    with pytest.raises(ValueError, match=field):
        Failure(**kwargs)  # type: ignore[arg-type]  # the keywords are Failure's fields

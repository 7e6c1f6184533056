"""The gate meets a fork as it is written: it infers the call from the parameter names,
and a failure that a declared-scope option would explain names that option beside it
(a hint, never a changed status). Tried on zoo members (``tests/forks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from vargather.testing import get_pool
from vargather.testing.engine import run_check
from vargather.testing.options import CheckOptions, OptionError
from vargather.testing.resolve import inferred_call, resolve_options_impl
from vargather.testing.results import Report

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def check(**kwargs: Any) -> Report:
    kwargs.setdefault("progress", False)
    kwargs.setdefault("shrink_budget", 5)
    return run_check(CheckOptions(**kwargs), pool_factory=get_pool)


def hints(report: Report) -> dict[str, str | None]:
    return {r.id: r.hint for r in report.results}


# --- the call from the parameter names ------------------------------------------------------


def _all_gather(x: torch.Tensor, dim: int) -> torch.Tensor: ...
def _gather_all_tensors(result: torch.Tensor, group: object = None) -> list[torch.Tensor]: ...
def _with_group(tensor: torch.Tensor, group: object = None) -> torch.Tensor: ...
def _with_shapes(tensor: torch.Tensor, shapes: list[list[int]], group: object = None) -> Any: ...
def _physicsnemo(tensor: torch.Tensor, sizes: list[int], dim: int = 0, use_fp32: bool = True, group: object = None) -> Any: ...  # fmt: skip
def _ambiguous(tensor: torch.Tensor, world: int) -> torch.Tensor: ...
def _first_unnamed(values: torch.Tensor, dim: int) -> torch.Tensor: ...


@pytest.mark.parametrize(
    ("fn", "call"),
    [
        (_all_gather, "(x, dim)"),
        (_with_group, "(x, group=group)"),
        (_gather_all_tensors, None),  # 'result': not a name the README gives the shard
        (_with_shapes, "(x, shapes, group=group)"),
        (_physicsnemo, "(x, sizes, dim=dim, group=group)"),
        (_ambiguous, None),  # a required argument the gate has no value for
        (_first_unnamed, None),  # the shard's name says nothing
    ],
)
def test_the_call_is_inferred_from_the_parameter_names(fn: object, call: str | None) -> None:
    assert inferred_call(fn) == call


def test_an_ambiguous_signature_exits_2_with_the_exact_call_line() -> None:
    with pytest.raises(OptionError) as info:
        resolve_options_impl(CheckOptions(impl="tests.test_gate_hints:_ambiguous"), str(ROOT))
    text = str(info.value)
    assert "--call '(x, ...)'" in text, text


@pytest.mark.multirank
def test_the_readme_fork_signature_passes_with_no_option_but_grad(in_root: None) -> None:
    """``all_gather(x, dim)``, the typical hand-written gather: inferred ``(x, dim)``."""
    report = check(impl="tests.forks.plain_all_gather:all_gather", grad="none", max_examples=4)
    assert report.call == "(x, dim)"
    bad = {r.id: r.status for r in report.results if r.status not in ("pass", "n/a")}
    assert bad == {"forward-int:int16": "unsupported"}, bad
    assert report.exit_status == 0


# --- failures that name the scope option ------------------------------------------------------


@pytest.mark.multirank
def test_an_undeclared_scope_is_named_beside_each_failure(in_root: None) -> None:
    """world_assert needs an initialized world of >= 2 ranks and takes sizes as a tensor:
    run without declaring it, each failing row names the option."""
    worlds = check(
        impl="tests.forks.world_assert:all_gather",
        grad="local",
        max_examples=4,
        only=("one-rank", "uninitialized"),
    )
    status = {r.id: r.status for r in worlds.results}
    assert status == {"one-rank": "fail", "uninitialized": "fail"}, status  # still failed
    got = hints(worlds)
    assert "--world-sizes 2,3,4" in str(got["one-rank"])
    assert "--requires-init" in str(got["uninitialized"])
    sizes = check(
        impl="tests.forks.world_assert:all_gather",
        grad="local",
        world_sizes=(2, 3),
        max_examples=4,
        only=("sizes-list", "sizes-tensor"),
    )
    status = {r.id: r.status for r in sizes.results}
    assert status == {"sizes-list": "fail", "sizes-tensor": "pass"}, status
    got = hints(sizes)
    assert "--sizes tensor" in str(got["sizes-list"])
    assert got["sizes-tensor"] is None
    text = "\n".join(sizes.failure_lines())
    assert "hint: sizes-list fails while sizes-tensor passes" in text


@pytest.mark.multirank
def test_a_gradient_row_with_no_gradient_names_grad_none(in_root: None) -> None:
    report = check(
        impl="tests.forks.plain_all_gather:all_gather",
        grad="sum",
        max_examples=4,
        only=("gradient",),
    )
    (row,) = report.results
    assert row.status == "fail"
    assert "--grad none" in str(row.hint)


@pytest.mark.multirank
def test_a_gather_that_raises_off_dim_0_names_dims_0(in_root: None) -> None:
    report = check(
        impl="tests.forks.plain_all_gather:dim0_gather",
        grad="none",
        max_examples=6,
        only=("dims",),
    )
    (row,) = report.results
    assert row.status == "fail"
    assert row.failure is not None
    assert row.failure.kind == "error"
    assert "--dims 0" in str(row.hint)

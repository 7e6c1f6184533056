"""The gate's sequence- and expert-parallel targets (``deepspeed-ulysses``,
``torchtitan-ep-dispatch``): their oracles and judges on one process, what
``--target list`` says where DeepSpeed or torchtitan is absent, and short runs on real
gloo worlds where they are installed (skipped with the reason where not).

The oracle tests run everywhere (they need torch only); the multi-rank runs need the
``deepspeed`` / ``torchtitan`` extras; the full targets at default settings and the
three-run determinism checks are ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import torch

from vargather._cli import check as check_cli
from vargather.testing import ep_dispatch_target as ep
from vargather.testing import get_pool
from vargather.testing import ulysses_target as ul
from vargather.testing.engine import run_check
from vargather.testing.options import CheckOptions, OptionError
from vargather.testing.program_rows import StepsReport
from vargather.testing.results import EXIT_OK
from vargather.testing.targets import apply_target, by_name, listing, target_ids, unavailable

ROOT = Path(__file__).resolve().parent.parent
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed (the deepspeed extra)"
)
needs_torchtitan = pytest.mark.skipif(
    not HAS_TORCHTITAN, reason="torchtitan is not installed (the torchtitan extra)"
)
multirank = pytest.mark.multirank


def _quick(target: str, rows: tuple[str, ...], **kwargs: Any) -> Any:
    options = CheckOptions(
        target=target, world_sizes=(2, 3), max_examples=4, only=rows, shrink_budget=10, **kwargs
    )
    return run_check(options, pool_factory=get_pool)


# --- absent: the reason, not a crash --------------------------------------------------------


def test_an_absent_package_is_named_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name.split(".")[0] in ("deepspeed", "torchtitan") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    text = listing()
    assert "deepspeed-ulysses: unavailable: deepspeed is not installed (" in text
    assert "torchtitan-ep-dispatch: unavailable: torchtitan is not installed (" in text
    assert "vargather[deepspeed]" in text
    assert "vargather[torchtitan]" in text
    for name, package in (
        ("deepspeed-ulysses", "deepspeed"),
        ("torchtitan-ep-dispatch", "torchtitan"),
    ):
        with pytest.raises(OptionError, match=f"unavailable here: {package} is not installed"):
            apply_target(CheckOptions(target=name))


def test_the_plain_environment_says_why_the_targets_do_not_run() -> None:
    ds = unavailable(by_name("deepspeed-ulysses"))
    tt = unavailable(by_name("torchtitan-ep-dispatch"))
    assert (ds is None) == HAS_DEEPSPEED
    assert (tt is None) == HAS_TORCHTITAN
    if ds is not None:
        assert ds.startswith("deepspeed is not installed")
    if tt is not None:
        assert tt.startswith("torchtitan is not installed")


def test_the_targets_rows_are_listed_without_the_packages() -> None:
    assert target_ids(by_name("deepspeed-ulysses")) == tuple(r.id for r in ul.ROWS)
    assert target_ids(by_name("torchtitan-ep-dispatch")) == tuple(r.id for r in ep.ROWS)
    assert "programs" in target_ids(by_name("deepspeed-ulysses"))
    assert "layers" in target_ids(by_name("torchtitan-ep-dispatch"))
    options = apply_target(CheckOptions(target="dtensor"))  # the registry still applies
    assert options.impl is None


# --- the Ulysses oracle -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "basis", "world", "split"),
    [
        (7, 7, 4, [2, 2, 2, 1]),  # remainder heads on the first ranks
        (8, 8, 4, [2, 2, 2, 2]),
        (5, 5, 2, [3, 2]),
        (6, 3, 2, [4, 2]),  # GQA: 3 kv groups of 2 query heads, 2 groups on rank 0
        (3, 3, 2, [2, 1]),
        (12, 4, 4, [3, 3, 3, 3]),
    ],
)
def test_heads_split_as_deepspeed_splits_them(
    heads: int, basis: int, world: int, split: list[int]
) -> None:
    assert ul.head_split(heads, basis, world) == split


def _program(world: int, model: ul.Model, *steps: ul.Step, dtype: str = "float32") -> Any:
    return ul.UlyssesProgram(world, (model,), steps, dtype)


@pytest.mark.parametrize("batch_first", [True, False])
def test_the_ulysses_oracle_tiles_the_global_tensor(batch_first: bool) -> None:
    model = ul.Model(heads=6, kv_heads=3, head_dim=2, batch_first=batch_first)
    step = ul.Step(0, "round-trip", "q", seq=2, batch=2, grad=True, seed=5)
    program = _program(2, model, step)
    for takes_kv in (True, False):
        parts = [ul.expected_heads(program, 0, r, takes_kv) for r in range(2)]
        heads = torch.cat([p["heads"] for p in parts], dim=2)
        back = torch.cat([p["back"] for p in parts], dim=model.seq_dim)
        assert torch.equal(heads, back)  # every rank's heads, all positions: the global
    assert [p["heads"].shape[2] for p in parts] == [3, 3]  # takes_kv=False: 6 over 2


def test_local_attention_refuses_a_torn_group_and_repeats_kv_heads() -> None:
    q = torch.zeros(1, 2, 4, 1)
    k = torch.arange(2.0).reshape(1, 1, 2, 1).expand(1, 2, 2, 1)
    out = ul.local_attention(q, k, torch.zeros(1, 2, 2, 1), seq_dim=1)
    assert out[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="torn"):
        ul.local_attention(torch.zeros(1, 2, 3, 1), torch.zeros(1, 2, 2, 1), k, seq_dim=1)


def _reports(program: Any, takes_kv: bool) -> list[ul.UlyssesReport]:
    return [
        ul.UlyssesReport(
            tuple(ul.expected_heads(program, i, r, takes_kv) for i in range(len(program.steps))),
            None,
            takes_kv,
        )
        for r in range(program.world_size)
    ]


def test_the_ulysses_judge_passes_the_oracle_and_catches_a_wrong_head() -> None:
    model = ul.Model(heads=4, kv_heads=2, head_dim=1, batch_first=True)
    steps = (
        ul.Step(0, "attention", "q", seq=1, batch=1, grad=True, seed=1),
        ul.Step(0, "seq-to-heads", "kv", seq=2, batch=1, grad=True, seed=2),
    )
    program = ul.UlyssesProgram(2, (model,), steps)
    good = _reports(program, True)
    assert ul.judge_ulysses(program, good) == []
    bad = _reports(program, True)
    bad[1].steps[1]["heads"][0, 0, 0, 0] += 1
    failures = ul.judge_ulysses(program, bad)
    assert failures
    assert failures[0][0] == "output"
    assert "rank 1" in failures[0][1]
    raised = _reports(program, True)
    raised[0] = ul.UlyssesReport((), (0, "AssertionError", "Number of heads (1) must be"), True)
    assert ul.judge_ulysses(program, raised)[0][0] == "raised"


def test_a_refusal_holds_only_when_every_rank_refuses() -> None:
    model = ul.Model(heads=2, kv_heads=1, head_dim=1, batch_first=True)
    step = ul.Step(0, "attention", "q", seq=1, batch=1, grad=False, seed=0)
    program = ul.UlyssesProgram(2, (model,), (step,), refusal=True)
    err = (0, "AssertionError", "must be at least the sequence parallel size")
    assert ul.judge_ulysses(program, [ul.UlyssesReport((), err)] * 2) == []
    half = [ul.UlyssesReport((), err), ul.UlyssesReport(({},))]
    assert "ranks [1] did not refuse" in ul.judge_ulysses(program, half)[0][1]


# --- the expert-dispatch oracle ---------------------------------------------------------------


def _layer(**kw: Any) -> ep.Layer:
    base = {"experts": 2, "top_k": 2, "tokens": 3, "dim": 2, "plus_id": True, "unit": False}
    base.update(kw)
    return ep.Layer(grad=True, seed=3, **base)


def test_the_dispatch_oracle_regroups_every_token_by_expert() -> None:
    program = ep.DispatchProgram(3, (_layer(),), "bfloat16")
    want = [ep.expected_layer(program, 0, r) for r in range(3)]
    assert sum(int(w["counts"].sum()) for w in want) == 3 * 3 * 2  # ranks x tokens x top-k
    assert all(w["routed"].shape[0] == int(w["counts"].sum()) for w in want)


def test_identity_experts_with_unit_scores_give_the_tokens_back() -> None:
    program = ep.DispatchProgram(2, (_layer(plus_id=False, unit=True, top_k=2),))
    for r in range(2):
        x = ep.routing(program, 0, r)[0]
        assert torch.equal(ep.expected_layer(program, 0, r)["output"], x)


def test_the_dispatch_judge_catches_a_misrouted_token() -> None:
    program = ep.DispatchProgram(2, (_layer(tokens=2),))
    reports = [StepsReport((ep.expected_layer(program, 0, r),)) for r in range(2)]
    assert ep.judge_dispatch(program, reports) == []
    routed = reports[0].steps[0]["routed"]
    if routed.shape[0] >= 2:
        routed[[0, 1]] = routed[[1, 0]]
        routed[0, 0] += 0.5  # different even where the two rows were equal
    else:
        reports[0].steps[0]["counts"][0] += 1
    assert ep.judge_dispatch(program, reports)[0][0] in ("routed", "sizes")


# --- the targets on real worlds ---------------------------------------------------------------


def _deepspeed_release() -> tuple[int, ...]:
    return tuple(int(p) for p in version("deepspeed").split(".")[:3])


@multirank
@needs_deepspeed
# importing deepspeed warns (its CPU accelerator, pkg_resources, torch deprecations)
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"
)
def test_deepspeed_ulysses_renders_a_verdict_naming_its_release() -> None:
    report = _quick("deepspeed-ulysses", ("seq-to-heads", "attention", "programs"))
    assert report.versions["deepspeed"] == version("deepspeed")
    assert f"DeepSpeed {version('deepspeed')}" in report.render()
    statuses = {r.id: r.status for r in report.results}
    if _deepspeed_release() >= (0, 19, 7):  # #8291 and the seq-first layout fixed
        assert set(statuses.values()) == {"pass"}, report.render()
    else:
        assert set(statuses.values()) <= {"pass", "fail"}, report.render()


@multirank
@needs_torchtitan
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning"
)
def test_torchtitan_dispatch_and_combine_match_the_oracle() -> None:
    report = _quick("torchtitan-ep-dispatch", ("dispatch", "round-trip", "gradient"))
    assert [r.status for r in report.results] == ["pass"] * 3, report.render()
    assert report.versions["torchtitan"] == version("torchtitan")


def test_list_with_a_program_target_prints_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """Installed or not: the rows are the target's own (its module needs torch only)."""
    assert check_cli.main(["--target", "deepspeed-ulysses", "--list"]) == EXIT_OK
    assert capsys.readouterr().out.split() == [r.id for r in ul.ROWS]
    assert check_cli.main(["--target", "torchtitan-ep-dispatch", "--list"]) == EXIT_OK
    assert capsys.readouterr().out.split() == [r.id for r in ep.ROWS]


def test_the_plugin_collects_a_program_targets_rows(tmp_path: Path) -> None:
    """``pytest --vargather-target T --collect-only``: one item per row of the target's own
    programs (nothing imported or resolved); a target whose package is missing stops the
    session with the install line as pip spells it (``--no-build-isolation`` is pip's,
    not a plugin option); a MODULE:ATTR target has no programs of its own."""
    from tests.test_plugin import make_project, output, run_pytest
    from vargather.testing import dtensor_target as dt
    from vargather.testing.targets import program_rows

    project = make_project(tmp_path)
    for target, rows in (("dtensor", dt.ROWS), ("deepspeed-ulysses", ul.ROWS)):
        proc = run_pytest(project, "--vargather-target", target, "--collect-only", "-q")
        if target == "deepspeed-ulysses" and importlib.util.find_spec("deepspeed") is None:
            assert proc.returncode == 4, output(proc)
            assert "pip install -c constraints.txt --no-build-isolation" in proc.stderr
            continue
        items = [line for line in proc.stdout.splitlines() if line.startswith("vargather::")]
        assert items == [f"vargather::{r.id}" for r in rows], output(proc)
    assert program_rows("torchtitan-ep-dispatch") == [(r.id, r.title) for r in ep.ROWS]
    assert program_rows("funcol-all-to-all") is None  # a MODULE:ATTR call: the catalogue's rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [
        pytest.param("deepspeed-ulysses", marks=needs_deepspeed),
        pytest.param("torchtitan-ep-dispatch", marks=needs_torchtitan),
    ],
)
def test_three_runs_give_byte_identical_json(target: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    texts = []
    for i in range(3):
        path = tmp_path / f"r{i}.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "vargather",
                "check",
                "--target",
                target,
                "--no-progress",
                "--json",
                str(path),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        texts.append(path.read_text())  # the bytes: no seconds without --timings
    assert texts[0] == texts[1] == texts[2]

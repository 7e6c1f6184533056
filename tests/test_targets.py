"""The gate's built-in targets (``vargather/testing/targets.py``, ``dtensor_target.py``)
and what they rely on: group objects and preallocated outputs in call templates,
CUDA-only code on the CPU under ``--emulate nccl``, the same JSON every run.

The multi-rank runs here are short (a few examples on 2-rank worlds); the full targets
at default settings, and the three-run determinism checks, are ``slow``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from vargather._cli import check as check_cli
from vargather.testing import get_pool
from vargather.testing.calls import group_object, parse_call
from vargather.testing.engine import run_check
from vargather.testing.options import CheckOptions, OptionError
from vargather.testing.results import EXIT_OK
from vargather.testing.targets import TARGETS, apply_target, by_name, listing, unavailable

ROOT = Path(__file__).resolve().parent.parent
NAMES = (
    "dtensor",
    "funcol-all-to-all",
    "nn-all-to-all",
    "nn-all-gather",
    "megatron-all-to-all",
    "megatron-sp-gather",
    "megatron-sp-reduce-scatter",
    "deepspeed-ulysses",
    "torchtitan-ep-dispatch",
)
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None
multirank = pytest.mark.multirank


def _quick(target: str, rows: tuple[str, ...], **kwargs: Any) -> Any:
    """The target on 2-rank worlds, a few examples of ``rows``, on the suite's pools."""
    options = CheckOptions(
        target=target, world_sizes=(2,), max_examples=3, only=rows, shrink_budget=20, **kwargs
    )
    return run_check(options, pool_factory=get_pool)


# --- the registry ------------------------------------------------------------------------


def test_list_names_every_target_and_whether_it_runs_here(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert check_cli.main(["--target", "list"]) == EXIT_OK
    out = capsys.readouterr().out
    for name in NAMES:
        assert f"{name}: available" in out or f"{name}: unavailable: " in out
    assert tuple(t.name for t in TARGETS) == NAMES


def test_a_missing_megatron_is_named_as_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name.startswith("megatron") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    text = listing()
    for name in ("megatron-all-to-all", "megatron-sp-gather", "megatron-sp-reduce-scatter"):
        assert f"{name}: unavailable: megatron-core is not installed" in text
        with pytest.raises(OptionError, match="unavailable here: megatron-core"):
            apply_target(CheckOptions(target=name))
    assert unavailable(by_name("funcol-all-to-all")) is None


def test_a_target_fills_its_declared_options_and_refuses_contradictions() -> None:
    options = apply_target(CheckOptions(target="funcol-all-to-all", max_examples=7))
    assert options.op == "all_to_all_v"
    assert options.impl == "torch.distributed._functional_collectives:all_to_all_single_autograd"
    assert options.call == "(x, recv_sizes, send_sizes, group)"
    assert (options.sizes, options.max_examples) == ("required", 7)
    assert apply_target(options) == options  # the isolated child applies it again
    with pytest.raises(OptionError, match="declares --impl"):
        apply_target(CheckOptions(target="funcol-all-to-all", impl="mod:fn"))
    with pytest.raises(OptionError, match="declares --sizes required"):
        apply_target(CheckOptions(target="funcol-all-to-all", sizes="never"))
    with pytest.raises(OptionError, match="unknown target 'nope'"):
        apply_target(CheckOptions(target="nope"))
    assert apply_target(CheckOptions(target="dtensor", world_sizes=(2,))).world_sizes == (2,)


def test_the_config_table_and_the_plugin_take_a_target(tmp_path: Path) -> None:
    from vargather.testing.options import read_config

    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.vargather.check]\ntarget = "nn-all-to-all"\n')
    assert read_config(str(config)) == {"target": "nn-all-to-all"}
    import _vargather_pytestplugin as plugin

    assert "target" in {o.name for o in plugin.plugin_options()}


# --- call templates ------------------------------------------------------------------------


def test_a_template_names_a_preallocated_output_and_the_group_object() -> None:
    template = parse_call(
        "(out, x, recv_sizes, send_sizes, group)", ("x", "out", "group", "recv_sizes", "send_sizes")
    )
    assert template.uses("out")
    assert template.uses("group")
    assert group_object(None) is None  # no world: nothing to pass
    sentinel = object()
    assert group_object(sentinel) is sentinel


# --- the emulation's CUDA-to-CPU part --------------------------------------------------------


def test_cuda_allocations_run_on_the_cpu_under_the_emulation() -> None:
    from vargather.testing import emulate

    emulate.activate("nccl")
    try:
        x = torch.ones(2)
        assert torch.empty(3, device=torch.cuda.current_device()).device.type == "cpu"
        assert x.new_empty((2,), device=0).device.type == "cpu"
        assert torch.cuda.current_device() == torch.device("cpu")
        assert torch.zeros(2, device="cuda").device.type == "cpu"
        assert x.to("cuda").device.type == "cpu"
        assert x.cuda() is x
        assert x.to(torch.float64).dtype == torch.float64  # other arguments untouched
    finally:
        emulate.activate(None)
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.cuda.current_device()  # off again: the CPU build's own error


# --- the targets on real worlds --------------------------------------------------------------


@multirank
def test_funcol_all_to_all_is_called_with_the_group_object_and_both_lists() -> None:
    report = _quick("funcol-all-to-all", ("forward-float", "gradient"))
    statuses = {r.id: r.status for r in report.results}
    # complex64 is declared refused on this path (the backend sees the complex tensor)
    want = {"forward-float": "pass", "gradient": "pass", "gradient:complex64": "unsupported"}
    assert statuses == want, report.render()
    assert report.exit_status == EXIT_OK
    assert report.scope["--target"] == "funcol-all-to-all"


@multirank
def test_nn_all_to_all_fills_a_preallocated_output() -> None:
    report = _quick("nn-all-to-all", ("forward-float", "gradient"))
    assert [r.status for r in report.results] == ["pass", "pass"], report.render()


@multirank
def test_dtensor_rows_hold_on_two_ranks() -> None:
    report = _quick("dtensor", ("programs", "entry-points", "gradient"))
    assert [r.status for r in report.results] == ["pass"] * 3, report.render()
    assert all(r.cases > 0 for r in report.results)


@multirank
@pytest.mark.slow  # importing megatron.core costs a minute on the loaded 2-core machine
@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (the megatron extra)")
# Importing megatron.core warns (torch.jit deprecations, no Transformer Engine/Apex).
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_megatron_all_to_all_runs_on_the_cpu_under_the_emulation() -> None:
    report = _quick("megatron-all-to-all", ("forward-float",))
    assert report.results[0].status in ("pass", "fail"), report.render()
    failure = report.results[0].failure
    assert failure is None or "CUDA" not in failure.message, report.render()


# --- the same JSON every run -----------------------------------------------------------------


def _json_runs(args: list[str], runs: int, tmp_path: Path) -> list[str]:
    """The JSON reports of ``runs`` separate ``check`` processes, started
    together: each run's time is mostly its ranks waiting out a peer's timeout, which
    the runs then wait out side by side (and each run's verdict must not depend on
    what else loads the machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    paths = [tmp_path / f"r{i}.json" for i in range(runs)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vargather", "check", *args, "--no-progress", "--json", str(p)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in paths
    ]
    for proc in procs:
        proc.wait()
    return [p.read_text() for p in paths]  # the bytes: no seconds without --timings


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--impl", "tests.forks.vq_broadcast:all_gather", "--call", "(x, dim)", "--grad", "none"],
        ["--impl", "tests.forks.vq_unwaited:all_gather", "--call", "(x, dim)", "--grad", "none"],
        ["--target", "dtensor"],
    ],
    ids=["racing-zoo-member", "unwaited-upstream-shape", "dtensor"],
)
def test_three_runs_give_byte_identical_json(args: list[str], tmp_path: Path) -> None:
    texts = _json_runs(args, 3, tmp_path)
    assert texts[0] == texts[1] == texts[2]


@multirank
def test_the_racing_member_gives_the_same_int16_row_twice(tmp_path: Path) -> None:
    """The refusal on rank 0 races its peers' timeouts: the row reports the same case
    and message both times."""
    args = ["--impl", "tests.forks.vq_broadcast:all_gather", "--call", "(x, dim)"]
    args += ["--grad", "none", "--only", "forward-int", "--world-sizes", "1,2"]
    args += ["--max-examples", "4"]
    first, second = _json_runs(args, 2, tmp_path)
    assert first == second
    rows = {p["id"]: p for p in json.loads(first)["properties"]}
    assert rows["forward-int:int16"]["status"] in ("unsupported", "fail")


@multirank
def test_an_unwaited_refusal_reads_as_a_wrong_value_every_run(tmp_path: Path) -> None:
    """The upstream shape waits for none of its int16 broadcasts, which gloo refuses in
    its worker thread: its barrier raised the refusal in some runs and not in others.
    The rank lets a refused collective finish refusing before its handle comes back
    (``repeatable.refusals_settled``), so every run reads the buffers nothing wrote."""
    args = ["--impl", "tests.forks.vq_unwaited:all_gather", "--call", "(x, dim)"]
    args += ["--grad", "none", "--only", "forward-int", "--world-sizes", "1,2"]
    args += ["--max-examples", "4"]
    first, second = _json_runs(args, 2, tmp_path)
    assert first == second
    row = {p["id"]: p for p in json.loads(first)["properties"]}["forward-int:int16"]
    assert row["status"] == "fail"
    assert "got 32767, expected 0" in json.dumps(row)


def test_every_target_is_documented() -> None:
    text = (ROOT / "docs" / "targets.md").read_text()
    for name in NAMES:
        assert f"`{name}`" in text
    assert dataclasses.fields(CheckOptions)[0].name == "target"


# --- a refusal racing its peers' waiting --------------------------------------------------


def test_a_refusal_reads_the_same_whether_the_peers_wait_was_seen() -> None:
    """One rank refuses int16 while its peers wait: seen as their timeouts, their lost
    connections, a hang of the pool, or not at all, the settled failure is the refusal
    alone; every form of waiting counts as waiting (so shrinking stops alike)."""
    from vargather.testing.judge import Failure
    from vargather.testing.races import PEERS_WAITED, is_wait, raced, settle

    refusal = Failure("call", "error", "raised RuntimeError: Invalid scalar type", (0,), 4)
    timeouts = Failure(
        "call", "error", "raised RuntimeError: [gloo] Timed out waiting 10000ms", (1, 2, 3), 4
    )
    closed = Failure(
        "call", "error", "raised RuntimeError: Connection closed by peer [127.0.0.1]:1", (1,), 4
    )
    hang = Failure("call", "hang", "the 4-rank world failed running this case: RankHung")
    assert settle([refusal]) == [refusal]  # nobody waited: nothing to settle
    settled = settle([refusal, timeouts])
    assert settle([timeouts, refusal]) == settle([hang, refusal]) == settled
    assert settle([refusal, closed]) == settle(settled) == settled
    assert settled[0] == refusal
    assert [f.message for f in settled[1:]] == [PEERS_WAITED]  # the same every time
    assert all(is_wait(f) for f in (timeouts, closed, hang))
    assert not is_wait(refusal)
    assert raced([refusal, timeouts])
    assert not raced([refusal])
    assert settle([timeouts]) == [timeouts]  # nobody refused: the waiting is the failure
    assert not raced([timeouts, hang])


def test_list_with_a_target_prints_its_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_cli.main(["--target", "dtensor", "--list"]) == EXIT_OK
    assert capsys.readouterr().out.split() == [
        "programs",
        "flattened-views",
        "entry-points",
        "gradient",
    ]
    assert check_cli.main(["--target", "nn-all-to-all", "--list"]) == EXIT_OK
    assert "forward-float" in capsys.readouterr().out.split()

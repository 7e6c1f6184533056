"""``python -m vargather bench --parts mpi``: MPI beside vargather and gloo.

Without MPI (CI installs only the dev extra) the part is skipped with a note, and that
path is run everywhere by hiding mpi4py or ``mpiexec``. Where the ``mpi`` extra is
installed, the part runs for real in a tiny configuration (2 ranks launched by
``mpiexec``, 4 KiB, 2 rounds) and every variant's results must have checked out bit for
bit. The rank side's metering runs here on a stand-in communicator, with a variant that
returns a wrong result. Speed is never asserted: the benchmark prints ratios, tests do
not time.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from vargather._cli import bench as _bench
from vargather._cli.bench import _config, _mpi

HAS_MPI = importlib.util.find_spec("mpi4py") is not None and _mpi.mpiexec() is not None

GATHER = list(_mpi.GATHER_NAMES)
EXCHANGE = list(_mpi.EXCHANGE_NAMES)


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    code = _bench.main(
        [
            "--no-progress",
            "--parts",
            "mpi",
            "--ranks",
            "2",
            "--json",
            str(tmp_path / "bench.json"),
            "--markdown",
            str(tmp_path / "bench.md"),
            *args,
        ]
    )
    document = json.loads((tmp_path / "bench.json").read_text())
    return code, document, (tmp_path / "bench.md").read_text()


# --- skipped with a note -----------------------------------------------------------------


def test_skipped_with_a_note_without_mpi4py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` raises ImportError
    code, document, markdown = _run(tmp_path)
    assert code == 0  # a note, not an error
    note = "mpi4py is not installed (pip install 'vargather[mpi]': mpi4py and mpich)"
    assert document["mpi"] == [{"world_size": 2, "skipped": note}]
    assert document["all_verified"] is True
    assert document["config"]["parts"] == ["mpi"]
    assert f"**MPI**: skipped, {note}" in markdown
    assert f"**MPI**: skipped, {note}" in capsys.readouterr().out


def test_skipped_with_a_note_without_mpiexec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", types.ModuleType("mpi4py"))  # importable
    monkeypatch.setattr(_mpi, "mpiexec", lambda: None)
    code, document, _ = _run(tmp_path)
    assert code == 0
    (record,) = document["mpi"]
    assert "no mpiexec next to this Python or on PATH" in record["skipped"]
    assert "**MPI**: skipped, no mpiexec" in capsys.readouterr().out


def test_a_failed_launch_fails_the_run_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in ``mpiexec`` that reports one cell's progress, then fails: the run
    exits 1 with the launch's output, and the progress line reached the callback."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo '{_mpi.PROGRESS_PREFIX}W=2 4 KiB mpi: done'\n"
        "echo 'rank 1: something broke' >&2\n"
        "exit 3\n"
    )
    fake.chmod(0o755)
    monkeypatch.setitem(sys.modules, "mpi4py", types.ModuleType("mpi4py"))
    monkeypatch.setattr(_mpi, "mpiexec", lambda: str(fake))
    seen: list[str] = []
    with pytest.raises(_mpi.MpiLaunchError, match="exited with 3 and no results") as info:
        _mpi.run_mpi(_bench.BenchConfig(mpi_kb=(4.0,)), 2, seen.append)
    assert seen == ["W=2 4 KiB mpi: done"]
    assert "rank 1: something broke" in str(info.value)
    assert _bench.main(["--no-progress", "--parts", "mpi", "--ranks", "2"]) == 1
    err = capsys.readouterr().err
    assert "vargather bench failed: mpiexec -n 2 exited with 3" in err
    assert "rank 1: something broke" in err


def test_mpiexec_is_looked_for_beside_this_python_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, elsewhere = tmp_path / "venv" / "bin", tmp_path / "elsewhere"
    bin_dir.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(elsewhere))
    assert _mpi.mpiexec() is None
    on_path = elsewhere / "mpiexec"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert _mpi.mpiexec() == str(on_path)
    beside = bin_dir / "mpiexec"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert _mpi.mpiexec() == str(beside)


def test_the_mpi_part_is_run_only_when_named() -> None:
    assert "mpi" not in _config.PARTS
    assert "mpi" in _config.OPTIONAL_PARTS
    cfg = _bench.BenchConfig(ranks=(2, 4), parts=("mpi",))
    assert _config.cell_count(cfg) == 2  # one mpiexec launch per world size
    with pytest.raises(SystemExit) as exit_info:
        _bench.main(["--parts", "mpi", "--mpi-sizes", "0"])
    assert exit_info.value.code == 2


# --- the rank side's metering on a stand-in communicator -------------------------------


class _Comm:
    """One rank's view of ``gather`` to rank 0 in a world whose other ranks reported
    ``others`` (their ``(times, verdicts)``)."""

    def __init__(self, others: list[Any]) -> None:
        self.others = others

    def gather(self, mine: Any, root: int = 0) -> list[Any]:
        return [mine, *self.others]


def test_the_metering_catches_a_wrong_result_and_keeps_the_slowest_rank() -> None:
    want = _mpi.shard(1, 0, 3, 4)
    wrong = want.clone()
    wrong[2, 3] += 1
    calls = {"right": 0, "wrong": 0}

    def call(name: str, out: torch.Tensor) -> Any:
        def run() -> torch.Tensor:
            calls[name] += 1
            return out.clone()

        return run

    variants = [
        _mpi._Timed("right", call("right", want), lambda o: _mpi._same(o, want), lambda: None),
        _mpi._Timed("wrong", call("wrong", wrong), lambda o: _mpi._same(o, want), lambda: None),
    ]
    slow = ({"right": [5.0, 5.0], "wrong": [0.0, 0.0]}, {"right": True, "wrong": True})
    results = _mpi._measure(variants, repeats=2, calls=3, warmup=1, comm=_Comm([slow]))
    assert results["right"]["verified"] is True
    assert results["wrong"]["verified"] is False
    assert results["right"]["times_s"] == [5.0, 5.0]  # the other rank's, the slower
    assert all(0 <= t < 5.0 for t in results["wrong"]["times_s"])
    # per variant: 1 warm-up call, then per round 1 untimed and 3 timed calls
    assert calls == {"right": 1 + 2 * 4, "wrong": 1 + 2 * 4}
    # a rank whose own results checked out is outvoted by a peer whose did not
    peer = ({"right": [0.0, 0.0], "wrong": [0.0, 0.0]}, {"right": False, "wrong": True})
    results = _mpi._measure(variants[:1], repeats=2, calls=1, warmup=0, comm=_Comm([peer]))
    assert results["right"]["verified"] is False
    assert _mpi._measure(variants, repeats=1, calls=1, warmup=0, comm=_NotRoot()) == {}


class _NotRoot:
    def gather(self, mine: Any, root: int = 0) -> None:
        return None


def test_the_checker_is_bit_for_bit() -> None:
    a = _mpi.shard(0, 2, 5, 3)
    assert _mpi._same(a, a.clone())
    assert not _mpi._same(a, a.double())
    assert not _mpi._same(a, a[:4])
    assert not _mpi._same(torch.tensor([0.0]), torch.tensor([-0.0]))  # equal, not the same bits
    assert torch.equal(_mpi.shard(2, 1, 2, 3), _mpi.shard(2, 0, 3, 3)[1:])  # rows by position


def test_a_wrong_mpi_result_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def entry(verified: bool) -> dict[str, Any]:
        return {"times_s": [1e-3], "median_us": 1000.0, "verified": verified}

    def ratio() -> dict[str, Any]:
        return {"median": 1.0, "q1": 1.0, "q3": 1.0, "min": 1.0, "max": 1.0, "n": 1}

    record = {
        "world_size": 2,
        "payload_kb": 4.0,
        "profile": "mild",
        "columns": 64,
        "rounds": 1,
        "collectives": {
            op: {
                "baseline": names[0],
                "calls_per_burst": 2,
                "forward": {n: entry(n != names[2]) for n in names},
                "ratios": {n: ratio() for n in names},
                "vargather_vs_gloo": ratio(),
            }
            for op, names in (("all_gather", GATHER), ("all_to_all", EXCHANGE))
        },
    }
    monkeypatch.setattr(_bench, "run_mpi", lambda cfg, w, progress=None: [record])
    code, document, markdown = _run(tmp_path)
    assert code == 1
    assert document["all_verified"] is False
    assert markdown.count("WRONG") == 2
    err = capsys.readouterr().err
    assert "vargather:all_gather_v (mpi all_gather, W=2, 4 KiB, mild)" in err
    assert "vargather:all_to_all_v (mpi all_to_all, W=2, 4 KiB, mild)" in err


# --- the part itself, where MPI is installed ---------------------------------------------


@pytest.mark.multirank
@pytest.mark.skipif(not HAS_MPI, reason="the mpi extra (mpi4py, mpich) is not installed")
def test_mpi_part_runs_and_every_result_checks_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []  # the launch's progress, as rank 0 finishes each cell
    launch = _mpi.run_mpi
    monkeypatch.setattr(
        _bench, "run_mpi", lambda cfg, w, progress=None: launch(cfg, w, seen.append)
    )
    code, document, markdown = _run(
        tmp_path, "--mpi-sizes", "4", "--small-repeats", "2", "--calls", "2"
    )
    assert code == 0, markdown
    assert seen == ["W=2 4 KiB mpi: done"]
    assert document["all_verified"] is True
    (cell,) = document["mpi"]
    assert (cell["world_size"], cell["payload_kb"], cell["profile"]) == (2, 4.0, "mild")
    assert cell["rounds"] == 2
    assert cell["mpi_library"].startswith(("MPICH", "Open MPI", "Intel"))
    shares = _bench.profile_shares("mild", 2)
    gather = cell["collectives"]["all_gather"]
    assert gather["sizes"] == _bench.split_rows(16, shares)  # 4 KiB of 256-byte rows
    assert gather["output_bytes"] == 4096
    exchange = cell["collectives"]["all_to_all"]
    assert exchange["send_sizes"] == _bench.split_rows(8, shares)  # 2 KiB per rank
    for g, names in ((gather, GATHER), (exchange, EXCHANGE)):
        assert g["baseline"] == names[0]
        assert g["calls_per_burst"] == 2
        assert list(g["forward"]) == names
        assert set(g["ratios"]) == set(names)
        assert g["ratios"][names[0]]["median"] == 1.0
        for name, e in g["forward"].items():
            assert e["verified"] is True, name
            assert len(e["times_s"]) == 2, name
            assert all(t > 0 for t in e["times_s"]), name
        q = g["vargather_vs_gloo"]
        assert q["min"] <= q["q1"] <= q["median"] <= q["q3"] <= q["max"]
    assert "**MPI beside gloo**, the same 2 processes" in markdown
    assert "| W | KiB | collective | MPI µs/call (counts exchanged) |" in markdown
    assert "| 2 | 4 | all_gather |" in markdown
    assert "| 2 | 4 | all_to_all |" in markdown
    assert "WRONG" not in markdown

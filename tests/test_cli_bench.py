"""``python -m vargather bench``: a smoke run in a subprocess, and its pure pieces.

The smoke run spawns its own 2-rank gloo world with tiny payloads and checks the JSON
document: its schema, that every variant of every cell was timed, and that every
variant's results (forward outputs and backward gradients) matched what they must be.
Speed is never asserted here: the benchmark prints ratios, tests do not time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from vargather._cli import bench as _bench

pytestmark = pytest.mark.multirank

FORWARD = [
    "limit",
    "vargather:auto",
    "vargather:padded",
    "vargather:alltoallv",
    "vargather:broadcast",
    "vargather:auto+sizes",
    "seed",
    "all_gather_object",
]
BACKWARD = [
    "limit",
    "vargather:auto",
    "vargather:padded",
    "vargather:alltoallv",
    "vargather:broadcast",
    "all_reduce",
]


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vargather", "bench", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("bench")
    proc = bench(
        "--quick",
        "--sizes",
        "0.05",
        "--profiles",
        "even,heavy",
        "--repeats",
        "2",
        "--json",
        str(out / "bench.json"),
        "--markdown",
        str(out / "bench.md"),
        "--plot",
        str(out / "bench.png"),
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    document = json.loads((out / "bench.json").read_text())
    return document, out, proc.stdout


def test_schema_and_every_variant_verified(smoke: tuple[dict[str, Any], Path, str]) -> None:
    document, _, _ = smoke
    assert document["schema"] == _bench.SCHEMA
    assert document["all_verified"] is True
    assert document["environment"]["backend"] == "gloo"
    cells = document["cells"]
    assert [(c["world_size"], c["profile"]) for c in cells] == [(2, "even"), (2, "heavy")]
    for c in cells:
        assert sum(c["rows"]) * c["row_bytes"] == c["output_bytes"]
        assert c["auto_transport"] in ("padded", "alltoallv", "broadcast")
        for direction, names in (("forward", FORWARD), ("backward", BACKWARD)):
            assert list(c[direction]) == names
            for name, entry in c[direction].items():
                where = f"{direction} {name} {c['profile']}"
                assert entry["verified"] is True, where
                assert len(entry["times_s"]) == 2, where
                assert len(entry["ratios"]) == 2, where
                assert all(t > 0 for t in entry["times_s"]), where
                assert entry["median_ratio"] > 0, where
                if name == "limit":
                    assert entry["ratios"] == [1.0, 1.0]
                assert isinstance(entry["peak_extra_bytes"], int), where
    targets = document["targets"]
    assert {t["target"] for t in targets} >= {
        "forward auto / limit",
        "backward auto / limit",
        "seed / auto (speed-up)",
    }
    assert all(isinstance(t["met"], bool) for t in targets)


def test_tables_and_plot_are_written(smoke: tuple[dict[str, Any], Path, str]) -> None:
    _, out, stdout = smoke
    markdown = (out / "bench.md").read_text()
    assert markdown == stdout.strip() + "\n"
    for heading in ("**forward**", "**backward**", "**peak extra memory**", "**targets**"):
        assert heading in markdown
    assert "| 2 | 0.05 | heavy (0.95/0.05) |" in markdown
    assert "WRONG" not in markdown
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_usage_errors_exit_2() -> None:
    proc = bench("--ranks", "1", timeout=60)
    assert proc.returncode == 2
    assert "--ranks" in proc.stderr
    proc = bench("--variants", "nonsense", timeout=60)
    assert proc.returncode == 2
    assert "nonsense" in proc.stderr


# --- pure pieces --------------------------------------------------------------------------


def test_profiles() -> None:
    heavy = _bench.profile_shares("heavy", 4)
    assert [round(s, 3) for s in heavy] == [0.87, 0.043, 0.043, 0.043]
    assert _bench.profile_shares("mild", 4) == pytest.approx(
        [1 / 5.5, 1.25 / 5.5, 1.5 / 5.5, 1.75 / 5.5]
    )
    assert _bench.profile_shares("empty", 4) == (0.5, 0.0, 0.5, 0.0)
    assert round(_bench.floor_ratio(heavy), 2) == 1.28  # the 1.28x
    assert _bench.floor_ratio(_bench.profile_shares("even", 4)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown profile"):
        _bench.profile_shares("lopsided", 4)


def test_split_rows_sums_and_follows_shares() -> None:
    assert _bench.split_rows(10, (0.5, 0.0, 0.5, 0.0)) == [5, 0, 5, 0]
    rows = _bench.split_rows(40_000, _bench.profile_shares("heavy", 4))
    assert sum(rows) == 40_000
    assert rows[0] == pytest.approx(20 * rows[1], rel=0.01)  # one rank 20x each other
    assert _bench.split_rows(7, (1 / 3, 1 / 3, 1 / 3)) == [3, 2, 2]


def test_the_checker_rejects_a_wrong_output() -> None:
    """The bench's verification can fail: one flipped element is caught."""
    sizes = [3, 0, 2]
    cell = _bench._Cell(rank=0, world_size=3, sizes=sizes, offsets=[0, 3, 3], total=5, eq_rows=1)
    right = torch.cat([_bench._shard(r, n) for r, n in enumerate(sizes)])
    assert _bench._check_output(cell, right)
    wrong = right.clone()
    wrong[4, 7] += 1
    assert not _bench._check_output(cell, wrong)
    swapped = torch.cat([_bench._shard(2, 2), _bench._shard(0, 3)])
    assert not _bench._check_output(cell, swapped)

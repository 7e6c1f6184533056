"""``python -m vargather bench``: a smoke run in a subprocess, and its pure pieces.

The smoke run spawns its own 2-rank gloo worlds with tiny payloads and checks the JSON
document: its schema, that every variant of every cell was timed, that every variant's
results (forward outputs and backward gradients) matched what they must be, and that
time was taken with default malloc settings while memory was measured in a pass of its
own. The coalesced cell's code path runs on a 2-rank pool with a stand-in
``all_gather_v_coalesced`` (right, wrong, missing), and the family cell with wrong
stand-ins for the three family collectives: ``tests/_bench_fns.py``. Speed is never
asserted here: the benchmark prints ratios, tests do not time.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import vargather
from vargather._cli import bench as _bench
from vargather._cli.bench import _config, _tables, _variants
from vargather.testing import RankPool
from vargather.testing.pool_types import DEFAULT_SHARED_START_METHOD

from . import _bench_fns

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
SMALL = [
    "limit",
    "sends",
    "vargather:auto",
    "vargather:auto~changing",
    "vargather:auto+sizes",
    "vargather:forced",
    "seed",
]
COALESCED = ["limit", "coalesced", "coalesced+sizes", "separate"]
FAMILY = {
    "reduce_scatter_v": ["limit", "vargather", "vargather+sizes"],
    "all_to_all_v": ["limit", "vargather", "vargather+sizes", "vargather~changing"],
    "all_gather_list": ["limit", "all_gather_v+sizes", "vargather", "vargather+sizes"],
    "gather_v": ["limit", "direct", "vargather", "vargather+sizes"],
    "scatter_v": ["limit", "direct", "vargather", "vargather+sizes"],
}


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
        "--small-sizes",
        "1,8",
        "--small-repeats",
        "3",
        "--peer-sizes",
        "8",
        "--family-sizes",
        "8",
        "--family-profiles",
        "mild",
        "--calls",
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
        # timed with default malloc settings; memory in a pass of its own under the meter's
        assert c["malloc_env"] == {}
        assert c["memory_malloc_env"] == {"MALLOC_MMAP_THRESHOLD_": "65536"}
        # --repeats 2 at 0.05 MB: scaled up to 8x, each variant's calls moving 1 GB
        assert c["repeats"] == 16
        for direction, names in (("forward", FORWARD), ("backward", BACKWARD)):
            assert list(c[direction]) == names
            for name, entry in c[direction].items():
                where = f"{direction} {name} {c['profile']}"
                assert entry["verified"] is True, where
                assert len(entry["times_s"]) == 16, where
                assert len(entry["ratios"]) == 16, where
                assert all(t > 0 for t in entry["times_s"]), where
                assert entry["median_ratio"] > 0, where
                if name == "limit":
                    assert entry["ratios"] == [1.0] * 16
                assert isinstance(entry["peak_extra_bytes"], int), where
    targets = document["targets"]
    assert {t["target"] for t in targets} >= {
        "forward auto / limit",
        "backward auto / limit",
        "seed / auto (speed-up)",
        "small auto / sends",
        "small auto~changing / sends",
    }
    assert all(isinstance(t["met"], bool) for t in targets)
    # the 8 KiB cell is in the targets' range (from 4 KiB up), the 1 KiB cell is not
    assert {t["payload_kb"] for t in targets if t["target"].startswith("small")} == {8.0}


def test_small_part_timed_in_bursts_and_verified(
    smoke: tuple[dict[str, Any], Path, str],
) -> None:
    document, _, _ = smoke
    small = document["small"]
    assert [(c["world_size"], c["payload_kb"]) for c in small] == [(2, 1.0), (2, 8.0)]
    for c in small:
        assert c["malloc_env"] == {}
        assert sum(c["sizes"]) * c["element_bytes"] == c["output_bytes"] == c["limit_bytes"]
        assert c["calls_per_burst"] == 2
        assert c["forced_transport"] in ("padded", "alltoallv", "broadcast")
        assert list(c["forward"]) == SMALL
        for name, entry in c["forward"].items():
            where = f"small {name} {c['payload_kb']} KiB"
            assert entry["verified"] is True, where
            assert len(entry["times_s"]) == len(entry["ratios"]) == 3, where
            assert len(entry["cpu_s"]) == 3, where
            assert all(t > 0 for t in entry["times_s"]), where
            assert entry["median_cpu_ms"] >= 0, where
            q1, q3 = entry["quartile_ratios"]
            assert q1 <= entry["median_ratio"] <= q3, where
            # every ratio against the floor too: the direct sends, timed in the same bursts
            floor = c["forward"]["sends"]["times_s"]
            assert entry["floor_ratios"] == [
                t / f for t, f in zip(entry["times_s"], floor, strict=True)
            ]
            q1, q3 = entry["floor_quartile_ratios"]
            assert q1 <= entry["floor_median_ratio"] <= q3, where
    assert document["config"]["parts"] == ["large", "small", "coalesced", "peers", "family"]


def test_coalesced_part_measured_or_skipped_with_a_note(
    smoke: tuple[dict[str, Any], Path, str],
) -> None:
    document, _, stdout = smoke
    coalesced = document["coalesced"]
    assert [(c["world_size"], c["payload_kb"]) for c in coalesced] == [(2, 1.0), (2, 8.0)]
    if hasattr(vargather, "all_gather_v_coalesced"):
        for c in coalesced:
            assert "skipped" not in c
            assert list(c["forward"]) == COALESCED
            assert all(e["verified"] is True for e in c["forward"].values())
        assert "**coalesced**: int64 ids" in stdout
        assert {t["target"] for t in document["targets"]} >= {
            "coalesced / limit",
            "coalesced / separate",
        }
    else:
        for c in coalesced:
            assert "forward" not in c
            assert "has no all_gather_v_coalesced" in c["skipped"]
        assert "**coalesced**: skipped, vargather" in stdout


def test_peers_part_checked_against_vargather_and_timed_with_spread(
    smoke: tuple[dict[str, Any], Path, str],
) -> None:
    """Every installed peer is checked equal to vargather's output before it is timed;
    a peer that is not installed is skipped with a note; vargather's speed-up over the
    fastest peer comes with its quartiles and range."""
    document, _, stdout = smoke
    (c,) = document["peers"]
    assert (c["world_size"], c["payload_kb"], c["profile"]) == (2, 8.0, "mild")
    assert sum(c["sizes"]) * c["columns"] * c["element_bytes"] == c["output_bytes"]
    names = list(c["forward"])
    assert names[:2] == ["limit", "vargather:auto"]
    assert "seed" in names  # the seed ships with vargather: always there
    for peer, module in (("ignite", "ignite"), ("torchmetrics", "torchmetrics")):
        if importlib.util.find_spec(module) is None:  # not imported: ignite warns at import
            assert peer not in names
            assert "not installed" in c["notes"][peer]
            assert f"**peers**: skipped {peer}: " in stdout
        else:
            assert peer in names
    for name, entry in c["forward"].items():
        assert entry["verified"] is True, name
        assert len(entry["times_s"]) == 3, name
        lo, hi = entry["range_ratios"]
        q1, q3 = entry["quartile_ratios"]
        assert lo <= q1 <= entry["median_ratio"] <= q3 <= hi, name
    up = c["speedup_vs_fastest_peer"]
    assert up["min"] <= up["q1"] <= up["median"] <= up["q3"] <= up["max"]
    assert up["n"] == 3
    assert "**peers**" in stdout
    assert any(t["target"] == "fastest peer / auto (speed-up)" for t in document["targets"])


def test_family_part_checked_against_its_baselines_with_spread(
    smoke: tuple[dict[str, Any], Path, str],
) -> None:
    """Per cell (8 KiB, mild) and collective: the baseline and vargather's
    calls, sizes unknown and known, each verified and timed in the same bursts; each
    ratio per burst with its quartiles and range; one target per ratio."""
    document, _, stdout = smoke
    family = document["family"]
    assert [(c["world_size"], c["payload_kb"], c["profile"]) for c in family] == [
        (2, 8.0, "mild"),
    ]
    for c in family:
        assert c["malloc_env"] == {}
        assert c["calls_per_burst"] == 2
        assert list(c["collectives"]) == list(FAMILY)
        for op, g in c["collectives"].items():
            assert list(g["forward"]) == FAMILY[op], op
            assert g["notes"] == {}, op
            assert g["baseline"] == _variants.FAMILY_BASELINES[op]
            for name, entry in g["forward"].items():
                assert entry["verified"] is True, (op, name)
                assert len(entry["times_s"]) == 3, (op, name)
            kinds = {"all_to_all_v": ("unknown", "known", "changing")}.get(
                op,
                ("unknown", "known", "direct")
                if "direct" in g["forward"]
                else ("unknown", "known"),
            )
            assert tuple(g["ratios"]) == kinds, op
            for known in kinds:
                r = g["ratios"][known]
                assert r["min"] <= r["q1"] <= r["median"] <= r["q3"] <= r["max"], (op, known)
                assert r["n"] == 3
            # the known call skips the metadata round: one collective
            assert g["forward"]["vargather+sizes"]["collectives_per_call"] == 1, op
        rs = c["collectives"]["reduce_scatter_v"]
        assert sum(rs["sizes"]) == rs["rows"] == 8 * 1024 // (4 * c["columns"])
    mild = family[0]["collectives"]["all_gather_list"]["sizes"]
    assert mild == _bench.split_rows(32, _bench.profile_shares("mild", 2))
    targets = [t for t in document["targets"] if t["target"].startswith("family ")]
    # cells x collectives x (unknown, known), and all_to_all_v's sizes changing
    assert len(targets) == 1 * len(FAMILY) * 2 + 1
    assert {t["target"] for t in targets} >= {
        "family reduce_scatter_v / reduce_scatter_tensor",
        "family all_to_all_v+sizes / all_to_all_single",
        "family all_gather_list+sizes / all_gather_v+sizes",
    }
    changing = "family all_to_all_v~changing / all_to_all_single"
    assert all(t["bound"] == (1.3 if t["target"] == changing else 1.15) for t in targets)
    assert [t["target"] for t in targets].count(changing) == 1
    assert all(t["spread"] for t in targets)
    a2a = family[0]["collectives"]["all_to_all_v"]
    assert a2a["changing_step"] == 1  # 5 % of a block of 8 rows, at least one row
    assert "**family**" in stdout
    assert "| 2 | 8 | mild | all_to_all_v |" in stdout


def test_tables_and_plot_are_written(smoke: tuple[dict[str, Any], Path, str]) -> None:
    _, out, stdout = smoke
    markdown = (out / "bench.md").read_text()
    assert markdown == stdout.strip() + "\n"
    for heading in (
        "**small payloads**",
        "**coalesced**",
        "**peers**",
        "**family**",
        "**CPU time per call**",
        "**forward**",
        "**backward**",
        "**peak extra memory**",
        "**targets**",
    ):
        assert heading in markdown
    assert "| 2 | 0.05 | heavy (0.95/0.05) |" in markdown
    assert "| 2 | 8 | 1024/1024 |" in markdown  # 8 KiB of float32 over 2 ranks
    assert "WRONG" not in markdown
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--ranks", "1"], "--ranks"),
        (["--variants", "nonsense"], "nonsense"),
        (["--parts", "small,tiny"], "tiny"),
        (["--small-sizes", "0"], "--small-sizes"),
        (["--calls", "0"], "--calls"),
        (["--small-profile", "lopsided"], "lopsided"),
        (["--peer-profile", "lopsided"], "lopsided"),
        (["--peer-sizes", "0"], "--peer-sizes"),
        (["--family-sizes", "0"], "--family-sizes"),
        (["--family-profiles", "lopsided"], "lopsided"),
    ],
)
def test_usage_errors_exit_2(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _bench.main(args)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


# --- the coalesced cell with a stand-in all_gather_v_coalesced ----------------------------


@pytest.fixture(scope="module")
def pool() -> Any:
    with RankPool(
        2, collective_timeout=60.0, call_timeout=300.0, start_method=DEFAULT_SHARED_START_METHOD
    ) as p:
        yield p


CONFIG = _bench.BenchConfig(small_repeats=2, calls=2, warmup=1)


def test_each_vargather_variant_of_the_small_part_learns_its_own_slots(pool: RankPool) -> None:
    """``own_state``: a fixed-size caller beside one whose sizes grow, on one group,
    keeps its exact slots (no slack from the other's growth), and the group's own state
    is left as it was."""
    results = pool.run(_bench_fns.own_states_kept_apart, 40_000)
    for got in results:
        assert got["fixed_wide"] == got["needs"], got
        assert got["untouched"], got


def test_coalesced_cell_with_a_stand_in(pool: RankPool) -> None:
    record = pool.run(_bench_fns.coalesced_with_stub, (CONFIG, 2.0))[0]
    assert record is not None
    assert "skipped" not in record
    assert list(record["forward"]) == COALESCED
    assert record["sizes"] == [14, 14]  # 2 KiB of 73-byte rows, a multiple of W
    assert record["output_bytes"] == 28 * _variants.coalesced_row_bytes()
    for name, entry in record["forward"].items():
        assert entry["verified"] is True, name
        assert len(entry["times_s"]) == 2, name


def test_coalesced_cell_catches_a_wrong_result(pool: RankPool) -> None:
    record = pool.run(_bench_fns.coalesced_with_wrong_stub, (CONFIG, 2.0))[0]
    assert record is not None
    verdicts = {n: e["verified"] for n, e in record["forward"].items()}
    assert verdicts == {
        "limit": True,
        "coalesced": False,
        "coalesced+sizes": False,
        "separate": True,
    }


def test_coalesced_cell_skipped_without_the_function(pool: RankPool) -> None:
    record = pool.run(_bench_fns.coalesced_without, (CONFIG, 2.0))[0]
    assert record is not None
    assert "forward" not in record
    assert "has no all_gather_v_coalesced: not measured" in record["skipped"]
    report = _tables.markdown_report([], [], [], [record])
    assert "**coalesced**: skipped, vargather" in report
    assert _tables.evaluate_targets([], [], [record]) == []


def test_family_cell_catches_wrong_results(pool: RankPool) -> None:
    """A family collective one element off is caught before it is timed (a note) and
    by the checks of the timed calls; the baselines stay verified."""
    record = pool.run(_bench_fns.family_with_wrong_stand_ins, (CONFIG, 2.0, "mild"))[0]
    assert record is not None
    for op, g in record["collectives"].items():
        verdicts = {n: e["verified"] for n, e in g["forward"].items()}
        assert verdicts == {n: not n.startswith("vargather") for n in FAMILY[op]}, op
        assert set(g["notes"]) == {n for n in FAMILY[op] if n.startswith("vargather")}, op
        assert all("differed from the reference" in t for t in g["notes"].values())
    report = _tables.markdown_report([], [], family=[record])
    assert "WRONG" in report
    assert "**family**: all_to_all_v vargather: its first result differed" in report


# --- pure pieces --------------------------------------------------------------------------


def test_the_family_checker_rejects_a_wrong_result() -> None:
    right = _variants.family_shard(1, 2, 3, 4)
    assert _variants.family_same(right, right.clone())
    wrong = right.clone()
    wrong[2, 3] += 1
    assert not _variants.family_same(wrong, right)
    assert not _variants.family_same(right.double(), right)
    pieces = [right, _variants.family_shard(0, 0, 0, 4)]
    assert _variants.family_same([p.clone() for p in pieces], pieces)
    assert not _variants.family_same(pieces[::-1], pieces)
    assert not _variants.family_same(pieces[:1], pieces)
    assert not _variants.family_same(right, pieces)


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
    cell = _variants._Cell(rank=0, world_size=3, sizes=sizes, offsets=[0, 3, 3], total=5, eq_rows=1)
    right = torch.cat([_variants._shard(r, n) for r, n in enumerate(sizes)])
    assert _variants._check_output(cell, right)
    wrong = right.clone()
    wrong[4, 7] += 1
    assert not _variants._check_output(cell, wrong)
    swapped = torch.cat([_variants._shard(2, 2), _variants._shard(0, 3)])
    assert not _variants._check_output(cell, swapped)


def test_changing_sizes_move_every_call_within_the_band() -> None:
    base = [10, 10, 10, 10]
    seen = [_variants.changing_sizes(base, 2, i) for i in range(8)]
    for i, sizes in enumerate(seen):
        assert sum(sizes) == 40
        assert all(8 <= n <= 12 for n in sizes)
        assert sizes != seen[i - 1]  # the sizes change on every call
    assert seen[0] == [12, 8, 10, 10]
    assert seen[4] == seen[0]  # period W
    assert _variants.changing_sizes([3, 0], 5, 0) == [3, 0]  # never below 0
    assert _variants.changing_sizes([3, 1], 5, 0) == [4, 0]


def _entry(ratio: float) -> dict[str, Any]:
    return {"median_ratio": ratio, "verified": True, "times_s": [1.0], "median_ms": 1.0}


def test_small_and_coalesced_targets() -> None:
    small = [
        {
            "world_size": 4,
            "payload_kb": kb,
            "profile": "even",
            "forward": {
                "limit": _entry(1.0),
                "vargather:auto": _entry(auto),
                "vargather:auto~changing": _entry(1.31),
            },
        }
        for kb, auto in ((1.0, 3.0), (4.0, 1.15), (256.0, 1.16), (1024.0, 3.0))
    ]
    coalesced = [
        {
            "world_size": 4,
            "payload_kb": 64.0,
            "profile": "even",
            "forward": {
                "limit": _entry(1.0),
                "coalesced": _entry(1.2),
                "separate": _entry(1.2),
            },
        }
    ]
    got = {
        (t["target"], t.get("payload_kb")): (t["met"], round(t["value"], 2))
        for t in _tables.evaluate_targets([], small, coalesced)
    }
    assert got == {
        ("small auto / limit", 4.0): (True, 1.15),
        ("small auto~changing / limit", 4.0): (False, 1.31),
        ("small auto / limit", 256.0): (False, 1.16),
        ("small auto~changing / limit", 256.0): (False, 1.31),
        ("small auto / limit", 1024.0): (False, 3.0),  # from 4 KiB up: 1 MiB too
        ("small auto~changing / limit", 1024.0): (False, 1.31),
        ("coalesced / limit", 64.0): (True, 1.2),
        ("coalesced / separate", 64.0): (False, 1.0),  # not faster: missed
    }


def test_small_targets_read_against_the_floor_when_measured() -> None:
    """A small cell that timed the direct sends is judged against them, not against the
    equal all_gather (whose ratio it still shows)."""
    floored = dict(_entry(0.8), floor_median_ratio=1.1, floor_quartile_ratios=[1.0, 1.2])
    slow = dict(_entry(0.9), floor_median_ratio=1.2, floor_quartile_ratios=[1.1, 1.3])
    small = [
        {
            "world_size": 4,
            "payload_kb": 64.0,
            "profile": "mild",
            "sizes": [10, 12, 15, 17],
            "calls_per_burst": 3,
            "forward": {
                "limit": _entry(1.0),
                "sends": dict(_entry(0.7), floor_median_ratio=1.0),
                "vargather:auto": floored,
                "vargather:auto~changing": slow,
            },
        }
    ]
    got = {
        t["target"]: (t["met"], t["value"], t["spread"])
        for t in _tables.evaluate_targets([], small)
    }
    assert got == {
        "small auto / sends": (True, 1.1, [1.0, 1.2]),
        "small auto~changing / sends": (False, 1.2, [1.1, 1.3]),
    }
    table = _tables.markdown_report([], [], small=small)
    assert "sends µs/call" in table
    assert "1.10x (1.00-1.20)" in table


def test_cell_count() -> None:
    cfg = _bench.BenchConfig(
        ranks=(2, 4), sizes_mb=(1.0, 4.0), profiles=("even",), small_kb=(1.0, 4.0, 16.0)
    )
    peers = len(cfg.peer_kb)
    family = len(cfg.family_kb) * len(cfg.family_profiles)
    assert _config.cell_count(cfg) == 2 * (
        3 + 3 + peers + family + 2 * 2
    )  # small, coalesced, peers, family, large x2
    no_mem = _bench.BenchConfig(ranks=(4,), sizes_mb=(1.0,), memory=False, parts=("large",))
    assert _config.cell_count(no_mem) == len(no_mem.profiles)


def test_large_repeats_scale_with_the_payload() -> None:
    # --repeats is the fewest (from 1 GB up); smaller payloads get more calls, so that
    # each variant moves 1 GB in all, at most 8x as many
    assert _config.large_repeats(7, 64) == 16
    assert _config.large_repeats(7, 16) == 56
    assert _config.large_repeats(7, 4) == 56
    assert _config.large_repeats(7, 1) == 56
    assert _config.large_repeats(7, 256) == 7
    assert _config.large_repeats(7, 1024) == 7
    assert _config.large_repeats(2, 0.05) == 16


def test_large_tables_say_how_many_calls_each_size_took() -> None:
    cells = [{"payload_mb": 4.0, "repeats": 28}, {"payload_mb": 64.0, "repeats": 7}]
    assert _tables._repeats_by_size(cells) == (
        " over single calls per variant (28 at 4 MB, 7 at 64 MB)"
    )
    assert _tables._repeats_by_size(cells[1:]) == " over 7 single calls per variant"
    assert _tables._repeats_by_size([{"payload_mb": 4.0}]) == ""  # an older record

"""The scaling study's simulation (``scripts/scale_sim.py``) at a small world.

It runs the real ``all_gather_v`` in W threads over a recording exchange; here it runs
at W = 4, and the collectives it counts are checked against the same calls on a real
4-rank gloo world, so the table in ``docs/performance.md`` counts what the library does.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from vargather import _fused, _round_state, _wire
from vargather.testing import get_pool

from ._by_path import import_path
from ._fused_fns import collectives_per_call

pytestmark = pytest.mark.multirank

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "scale_sim.py"


def _load() -> ModuleType:
    return import_path("scale_sim", SCRIPT)


@pytest.mark.parametrize(
    ("profile", "per_rank"),
    [
        ("even", 4096),
        ("heavy", 4096),
        ("mild", 256 * 1024),
        ("heavy", 256 * 1024),
        ("even", 1024 * 1024),
    ],
)
def test_simulation_counts_what_a_real_world_issues(profile: str, per_rank: int) -> None:
    sim = _load()
    world, calls = 4, 3
    results = sim.simulate(world, profile, per_rank, calls)
    rows = sim.row_counts(world, profile, per_rank, 4 * sim.COLUMNS)
    real = get_pool(world).run(collectives_per_call, (rows, sim.COLUMNS, calls))
    assert all(r == real[0] for r in real), real
    assert [r.collectives for r in results] == real[0] == [2, 1, 1]
    output = sum(rows) * 4 * sim.COLUMNS
    for r in results:
        assert r.output_bytes == output
        assert r.header_max == world * _wire.HEADER_BYTES  # one header slot per rank
        # a rank receives every other rank's payload, their headers and the padding
        assert r.received_max <= output + r.header_max + r.padding_max
    steady = results[-1]
    needs = [n * 4 * sim.COLUMNS for n in rows]
    if _round_state._wants_wide(needs):  # the wide round: direct sends
        assert per_rank > _round_state.SMALL_BYTES or profile == "heavy"
        # a send to and a receive from each peer: one region, or (from HEADERS_APART_MIN
        # of payload in all) a payload slot and the headers apart
        apart = sum(needs) >= _fused.HEADERS_APART_MIN
        assert steady.operations == (4 if apart else 2) * (world - 1)
        assert steady.padding_max == 0
        assert steady.state_ints == world
    else:  # the gather round: direct sends on gloo, every slot as large as the largest need
        assert steady.operations == 2 * (world - 1)  # a send to, a receive from each peer
        if profile == "even":
            assert steady.padding_max == 0


def test_the_script_writes_its_table(tmp_path: Path) -> None:
    sim = _load()
    out = tmp_path / "scale.md"
    assert (
        sim.main(
            ["--worlds", "2", "--profiles", "even", "--per-rank", "4096", "--markdown", str(out)]
        )
        == 0
    )
    text = out.read_text()
    assert text.startswith("| W | per rank |")
    assert "| 2 | 4.0 KiB | even | steady | 1 | 2 |" in text  # one collective: 2 sends/receives

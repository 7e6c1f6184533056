"""``python -m vargather demo`` (``vargather/_cli/demo.py``): it runs and agrees with the
oracle on a world started through the kit's pool."""

from __future__ import annotations

import pytest

from vargather._cli import demo


@pytest.mark.multirank
def test_the_demo_matches_the_oracle(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "rows per rank (dim 0): [2, 0]" in out
    assert out.rstrip().endswith("all ranks match the oracle")


def test_a_bad_world_size_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--world-size", "0"])
    assert exit_info.value.code == 2

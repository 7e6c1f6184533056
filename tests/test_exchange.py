"""Cross-rank validation (``vargather._exchange``), single process: one verdict on
every rank, whichever rank decides."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import vargather
from vargather._args import check_call
from vargather._exchange import validate_records
from vargather._group import GroupInfo
from vargather._layout import Layout
from vargather.testing import strategies as vst
from vargather.testing.values import DTYPE_NAMES

from ._stage_fns import calls


@given(data=st.data())
def test_validation_reaches_one_verdict_whatever_the_rank(data: st.DataObject) -> None:
    """From the same records, every ``rank`` argument raises the same error class with
    the same message, or returns the same layout (but for ``rank``)."""
    w = data.draw(st.integers(1, 4), label="world_size")
    if data.draw(st.booleans(), label="matching calls"):
        case = data.draw(
            vst.gather_cases(world_size=w, max_ndim=3, dtypes=DTYPE_NAMES), label="case"
        )
        records = [
            check_call(
                case.shard(r),
                case.dim,
                sizes=case.sizes_argument(),
                grad=case.contract,
                transport=case.transport,
                info=GroupInfo(None, r, w, True, "gloo"),
            ).record
            for r in range(w)
        ]
    else:
        records = [data.draw(calls(w, r), label=f"rank {r}") for r in range(w)]
    verdicts: list[tuple[str, str] | Layout] = []
    for r in range(w):
        try:
            layout = validate_records(records, rank=r)
        except vargather.VarGatherError as err:
            verdicts.append((type(err).__name__, str(err)))
        else:
            assert layout.rank == r
            verdicts.append(layout)
    first = verdicts[0]
    for r, verdict in enumerate(verdicts):
        if isinstance(first, Layout):
            assert isinstance(verdict, Layout), f"rank 0 got a layout, rank {r} {verdict}"
            assert verdict == Layout(**{**_fields(first), "rank": r})
        else:
            assert verdict == first


def _fields(layout: Layout) -> dict[str, Any]:
    return {
        "sizes": layout.sizes,
        "dim": layout.dim,
        "leading_shape": layout.leading_shape,
        "trailing_shape": layout.trailing_shape,
        "dtype": layout.dtype,
        "rank": layout.rank,
        "world_size": layout.world_size,
    }

"""``Layout`` (``vargather._layout``): the arithmetic every later stage reads."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vargather._layout import Layout


@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    lead=st.lists(st.integers(0, 3), max_size=3),
    trail=st.lists(st.integers(0, 3), max_size=3),
    data=st.data(),
)
def test_layout_offsets_are_the_exclusive_cumsum_and_blocks_tile_the_output(
    sizes: list[int], lead: list[int], trail: list[int], data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, len(sizes) - 1), label="rank")
    layout = Layout(
        sizes=tuple(sizes),
        dim=len(lead),
        leading_shape=tuple(lead),
        trailing_shape=tuple(trail),
        dtype=torch.float32,
        rank=rank,
        world_size=len(sizes),
    )
    assert layout.offsets == tuple(sum(sizes[:r]) for r in range(len(sizes)))
    assert layout.total == sum(sizes)
    assert layout.max_size == max(sizes)
    assert layout.is_even == (len(set(sizes)) == 1)
    assert layout.local_size == sizes[rank]
    assert layout.local_offset == layout.offsets[rank]
    covered = [i for r in range(len(sizes)) for i in range(layout.total)[layout.block(r)]]
    assert covered == list(range(layout.total))
    assert layout.pre == math.prod(lead)
    assert layout.post == math.prod(trail)
    assert layout.output_shape == (*lead, sum(sizes), *trail)
    assert layout.shard_shape(rank) == (*lead, sizes[rank], *trail)
    assert layout.ndim == len(lead) + 1 + len(trail)
    # the byte arithmetic the transports and the fused round read
    item = torch.float32.itemsize
    assert layout.row_bytes == math.prod(trail) * item
    assert layout.nbytes == math.prod(lead) * sum(sizes) * math.prod(trail) * item
    assert sum(layout.shard_bytes(r) for r in range(len(sizes))) == layout.nbytes
    assert layout.shard_bytes(rank) == math.prod(layout.shard_shape(rank)) * item


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": (1, 2), "world_size": 3}, "len(sizes)=2 but world_size=3"),
        ({"rank": 2}, "rank=2 outside [0, 2)"),
        ({"sizes": (1, -1)}, "negative size"),
        ({"dim": 1}, "dim=1 but leading_shape has 0 dims"),
    ],
)
def test_layout_refuses_impossible_fields(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {
        "sizes": (1, 2),
        "dim": 0,
        "leading_shape": (),
        "trailing_shape": (3,),
        "dtype": torch.float32,
        "rank": 0,
        "world_size": 2,
    }
    fields.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        Layout(**fields)


@given(
    before=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    data=st.data(),
    lead=st.lists(st.integers(1, 3), max_size=2),
    trail=st.lists(st.integers(0, 3), max_size=2),
)
def test_with_sizes_is_the_layout_built_from_those_sizes(
    before: list[int], data: st.DataObject, lead: list[int], trail: list[int]
) -> None:
    # The fused round's shortcut for a call whose sizes alone changed: every field and
    # every derived value (cached ones read before the change included) must be what a
    # freshly built layout of the new sizes has.
    after = data.draw(st.lists(st.integers(0, 6), min_size=len(before), max_size=len(before)))
    fields: dict[str, Any] = {
        "dim": len(lead),
        "leading_shape": tuple(lead),
        "trailing_shape": tuple(trail),
        "dtype": torch.bfloat16,
        "rank": len(before) - 1,
        "world_size": len(before),
    }
    old = Layout(sizes=tuple(before), **fields)
    # read (so cached) before the copy
    assert (old.pre, old.row_bytes) == (math.prod(lead), math.prod(trail) * 2)
    new = old.with_sizes(tuple(after))
    fresh = Layout(sizes=tuple(after), **fields)
    assert new == fresh
    assert (new.offsets, new.total, new.max_size) == (fresh.offsets, fresh.total, fresh.max_size)
    assert (new.pre, new.post, new.row_bytes) == (fresh.pre, fresh.post, fresh.row_bytes)
    assert [new.shard_bytes(r) for r in range(len(after))] == [
        fresh.shard_bytes(r) for r in range(len(after))
    ]
    assert (new.nbytes, new.output_shape) == (fresh.nbytes, fresh.output_shape)
    assert old.sizes == tuple(before)  # the original is untouched
    with pytest.raises(ValueError, match="len"):
        old.with_sizes((*after, 1))

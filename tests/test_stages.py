"""Single-process Hypothesis properties of each pipeline stage.

Stage by stage, no communication: the ``Layout`` arithmetic; padding then compaction
(the transports' receive buffers simulated in-process) against ``torch.cat``; the
backward's send buffers against the oracle's gradients; the metadata record's wire
round trip; ``validate_records`` reaching one verdict whatever the ``rank`` argument;
and the oracle's contracts against their stated math.

Every test is a plain ``@given`` function without fixtures, deterministic in its
input, so it doubles as a fuzz target: ``test.hypothesis.fuzz_one_input(buffer)``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import vargather
from vargather import oracle
from vargather import strategies as vst
from vargather._comm import GroupInfo
from vargather._compaction import compact_padded, compact_rank_major, rank_major_blocks
from vargather._layout import Layout
from vargather._metadata import (
    CONTRACTS,
    RECORD_LENGTH,
    TEXT_WORDS,
    MetadataRecord,
    decode_record,
    encode_record,
    local_record,
    validate_records,
)
from vargather._padding import as_blocks, pad_blocks, rank_major_gradient, scatter_into_padded
from vargather.testing.cases import GatherCase

TRANSPORTS = vargather.TRANSPORT_NAMES

# In-process cases: every dtype, dim, ragged sizes (0 and all-zero included), memory
# layouts; the gather group is simulated, so any world size works.
cases = vst.gather_cases(min_world_size=1, max_world_size=5)
float_cases = vst.gather_cases(
    min_world_size=1,
    max_world_size=5,
    dtypes=["float64", "complex128", "float32"],
    values=["integers"],
    upstream=["integers"],
    requires_grad=True,
)


def _layouts(case: GatherCase) -> list[Layout]:
    d = case.normalized_dim
    s = case.shapes[0]
    return [
        Layout(
            sizes=case.sizes,
            dim=d,
            leading_shape=s[:d],
            trailing_shape=s[d + 1 :],
            dtype=case.torch_dtype,
            rank=r,
            world_size=case.group_size,
        )
        for r in range(case.group_size)
    ]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    flat_a = torch.empty(a.shape, dtype=a.dtype).copy_(a).reshape(-1)
    flat_b = torch.empty(b.shape, dtype=b.dtype).copy_(b).reshape(-1)
    if flat_a.numel() == 0:
        return True
    return torch.equal(flat_a.view(torch.uint8), flat_b.view(torch.uint8))


# --- Layout ------------------------------------------------------------------------------


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


# --- padding and compaction ---------------------------------------------------------------


@given(case=cases)
def test_pad_then_compact_is_torch_cat(case: GatherCase) -> None:
    """The padded transport's receive buffer, ``(W, pre, max, post)`` stacked from every
    rank's padded block, compacts to ``torch.cat`` (bytes), whichever rank compacts."""
    layouts = _layouts(case)
    shards = [case.shard(r).detach() for r in range(case.group_size)]
    expected = oracle.expected_output(shards, case.dim)
    m = layouts[0].max_size
    sent = [
        pad_blocks(as_blocks(x, x.shape[case.normalized_dim], lay), m)
        for x, lay in zip(shards, layouts, strict=True)
    ]
    for block, x in zip(sent, shards, strict=True):
        assert block.shape == (layouts[0].pre, m, layouts[0].post)
        assert block.is_contiguous()
        n = x.shape[case.normalized_dim]
        assert bool((block[:, n:] == 0).all()), "padding rows must be zero-filled"
    buffer = torch.stack(sent)
    for layout in layouts:
        assert _same_bytes(compact_padded(buffer, layout), expected)


@given(case=cases)
def test_rank_major_compaction_is_torch_cat(case: GatherCase) -> None:
    """The unpadded transports' receive buffer (rank 0's block, then rank 1's, ...)
    compacts to ``torch.cat`` (bytes)."""
    layouts = _layouts(case)
    shards = [case.shard(r).detach() for r in range(case.group_size)]
    expected = oracle.expected_output(shards, case.dim)
    flat = torch.cat(
        [
            as_blocks(x, x.shape[case.normalized_dim], lay).reshape(-1)
            for x, lay in zip(shards, layouts, strict=True)
        ]
    )
    for layout in layouts:
        assert _same_bytes(compact_rank_major(flat, layout), expected)
        blocks = rank_major_blocks(flat, layout)
        for r, block in enumerate(blocks):
            assert _same_bytes(block, as_blocks(shards[r], case.sizes[r], layout))


@given(case=float_cases)
def test_backward_send_buffers_reduce_to_the_sum_contract(case: GatherCase) -> None:
    """Summing rank r's slot of every rank's padded gradient buffer (what a padded
    reduce-scatter does), or its block of every rank-major gradient buffer, gives the
    oracle's ``sum`` gradient exactly (small integers)."""
    layouts = _layouts(case)
    w = case.group_size
    shards = [case.shard_values(r) for r in range(w)]
    ups = [case.upstream_grad(j) for j in range(w)]
    want = oracle.expected_input_grads(shards, ups, case.dim, "sum")
    for r in range(w):
        layout = layouts[r]
        padded = sum(scatter_into_padded(g, layout)[r] for g in ups)
        assert isinstance(padded, torch.Tensor)
        got = padded[:, : case.sizes[r]].reshape(case.shapes[r])
        assert torch.equal(got, want[r])
        major = sum(rank_major_blocks(rank_major_gradient(g, layout), layout)[r] for g in ups)
        assert isinstance(major, torch.Tensor)
        assert torch.equal(major.reshape(case.shapes[r]), want[r])


# --- metadata ------------------------------------------------------------------------------


_odd_inputs = st.one_of(
    st.just(None),
    st.just(3.5),
    st.just("tensor"),
    st.builds(torch.zeros, st.just(())),
)
_odd_dims = st.one_of(st.integers(-6, 6), st.just(1.0), st.just(True), st.just(None))
_odd_sizes = st.one_of(
    st.none(),
    st.lists(st.integers(-2, 6), max_size=5),
    st.lists(st.integers(0, 6), max_size=5).map(lambda v: torch.tensor(v, dtype=torch.int64)),
    st.just([1.5, 2.0]),
    st.just("12"),
)
_odd_contracts = st.one_of(st.sampled_from(CONTRACTS), st.text(max_size=40), st.none())
_odd_transports = st.one_of(st.sampled_from(TRANSPORTS), st.text(max_size=40), st.just(7))


@st.composite
def _calls(draw: st.DrawFn, world_size: int, rank: int) -> MetadataRecord:
    """One rank's record for a call that may be right or wrong in any argument."""
    if draw(st.integers(0, 4)) == 0:
        x: object = draw(_odd_inputs)
    else:
        case = draw(vst.gather_cases(world_size=1, max_ndim=3))
        x = case.shard(0)
    dim = draw(_odd_dims)
    return local_record(
        x,
        dim,
        sizes=draw(_odd_sizes),
        contract=draw(_odd_contracts),
        transport=draw(_odd_transports),
        transports=TRANSPORTS,
        info=GroupInfo(None, rank, world_size, True, "gloo"),
    )


def _wire_text(text: str) -> str:
    """The detail text as the wire carries it: ``TEXT_WORDS * 8`` ASCII bytes."""
    raw = text.encode("ascii", "replace")[: 8 * TEXT_WORDS]
    return raw.rstrip(b"\0").decode("ascii")


@given(data=st.data())
def test_metadata_records_survive_the_wire(data: st.DataObject) -> None:
    """``decode_record(encode_record(r)) == r`` for records of valid and invalid calls,
    but for the detail text, which the wire carries as at most 32 ASCII bytes; the wire
    vector is ``RECORD_LENGTH`` int64 values and a fixed point of decode-then-encode."""
    w = data.draw(st.integers(1, 4), label="world_size")
    rank = data.draw(st.integers(0, w - 1), label="rank")
    record = data.draw(_calls(w, rank), label="record")
    wire = encode_record(record)
    assert len(wire) == RECORD_LENGTH
    assert torch.tensor(wire, dtype=torch.int64).tolist() == wire
    decoded = decode_record(wire, rank=rank)
    assert decoded == dataclasses.replace(record, text=_wire_text(record.text))
    assert encode_record(decoded) == wire


@given(data=st.data())
def test_validation_reaches_one_verdict_whatever_the_rank(data: st.DataObject) -> None:
    """From the same records, every ``rank`` argument raises the same error class with
    the same message, or returns the same layout (but for ``rank``)."""
    w = data.draw(st.integers(1, 4), label="world_size")
    if data.draw(st.booleans(), label="matching calls"):
        case = data.draw(vst.gather_cases(world_size=w, max_ndim=3), label="case")
        records = [
            local_record(
                case.shard(r),
                case.dim,
                sizes=case.sizes_argument(),
                contract=case.contract,
                transport=case.transport,
                transports=TRANSPORTS,
                info=GroupInfo(None, r, w, True, "gloo"),
            )
            for r in range(w)
        ]
    else:
        records = [data.draw(_calls(w, r), label=f"rank {r}") for r in range(w)]
    verdicts: list[tuple[str, str] | Layout] = []
    for r in range(w):
        try:
            layout = validate_records(records, rank=r, transports=TRANSPORTS)
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


# --- the oracle ---------------------------------------------------------------------------


@given(case=float_cases)
def test_the_oracle_contracts_are_their_stated_math(case: GatherCase) -> None:
    """``sum``: Σ_j g_j[o_r : o_r + n_r]; ``local``: g_r[o_r : o_r + n_r]; ``mean``:
    the sum over W. Slicing by hand (``narrow``) against the oracle's autograd."""
    w, d = case.group_size, case.normalized_dim
    shards = [case.shard_values(r) for r in range(w)]
    ups = [case.upstream_grad(j) for j in range(w)]
    offsets = [sum(case.sizes[:r]) for r in range(w)]
    out = oracle.expected_output(shards, case.dim)
    assert _same_bytes(out, torch.cat(shards, d))
    by_contract = {c: oracle.expected_input_grads(shards, ups, case.dim, c) for c in CONTRACTS}
    for r in range(w):
        blocks = [g.narrow(d, offsets[r], case.sizes[r]) for g in ups]
        total = torch.stack(blocks).sum(0) if blocks else None
        assert total is not None
        assert torch.equal(by_contract["sum"][r], total)
        assert torch.equal(by_contract["local"][r], blocks[r])
        # (1/W) Σ_j g_j and Σ_j (g_j / W) round differently: within (W+1) eps Σ_j|g_j| / W.
        eps = torch.finfo(total.real.dtype).eps
        magnitude = torch.stack([b.abs() for b in blocks]).sum(0) / w
        error = (by_contract["mean"][r] - total / w).abs()
        assert bool((error <= (w + 1) * eps * magnitude).all())

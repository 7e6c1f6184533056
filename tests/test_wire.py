"""The wire format (``vargather._wire``): a call's record survives the int64 vector."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import vargather
import vargather._args
from vargather._args import CallRecord
from vargather._wire import (
    FLAG_ELIGIBLE,
    FLAG_LONG,
    FLAG_PROBLEM,
    HEADER_MAGIC,
    HEADER_WORDS,
    RECORD_LENGTH,
    SHAPE_SLOTS,
    decode_header,
    decode_record,
    encode_header,
    encode_record,
    wire_text,
)

from ._stage_fns import calls


@given(data=st.data())
def test_metadata_records_survive_the_wire(data: st.DataObject) -> None:
    """``decode_record(encode_record(r)) == r`` for records of valid and invalid calls,
    but for the problem's message, which the wire carries as ASCII of bounded length;
    the wire vector is ``RECORD_LENGTH`` int64 values and a fixed point of
    decode-then-encode."""
    w = data.draw(st.integers(1, 4), label="world_size")
    rank = data.draw(st.integers(0, w - 1), label="rank")
    record = data.draw(calls(w, rank), label="record")
    wire = encode_record(record)
    assert len(wire) == RECORD_LENGTH
    assert torch.tensor(wire, dtype=torch.int64).tolist() == wire
    decoded = decode_record(wire, rank=rank)
    problem = record.problem
    if problem is not None:
        problem = dataclasses.replace(problem, message=wire_text(problem.message))
    assert decoded == dataclasses.replace(record, problem=problem)
    assert encode_record(decoded) == wire


@given(data=st.data())
def test_compact_headers_carry_what_validation_compares(data: st.DataObject) -> None:
    """The fused round's compact header (``_wire.encode_header``): ``HEADER_WORDS``
    int64; a problem or more than ``SHAPE_SLOTS`` dims only sets a flag; otherwise
    ``decode_header`` gives back every field validation compares."""
    w = data.draw(st.integers(1, 4), label="world_size")
    rank = data.draw(st.integers(0, w - 1), label="rank")
    record = data.draw(calls(w, rank), label="record")
    count = data.draw(st.integers(1, 5), label="count")
    header = encode_header(record, count, FLAG_ELIGIBLE)
    assert len(header) == HEADER_WORDS
    assert header[0] == HEADER_MAGIC
    assert header[1] & FLAG_ELIGIBLE
    assert header[3] == count
    assert torch.tensor(header, dtype=torch.int64).tolist() == header
    assert bool(header[1] & FLAG_PROBLEM) == (record.problem is not None)
    assert bool(header[1] & FLAG_LONG) == (record.ndim > SHAPE_SLOTS)
    if record.problem is None and record.ndim <= SHAPE_SLOTS:
        got = decode_header(header)
        for name in (
            "ndim",
            "dtype_code",
            "normalized_dim",
            "contract_code",
            "transport_code",
            "requires_grad",
            "device_code",
            "sizes_len",
            "sizes_hash",
            "shape",
        ):
            assert getattr(got, name) == getattr(record, name), name
    unused = encode_header(None, count, 0)
    assert len(unused) == HEADER_WORDS
    assert unused[3] == count


def test_a_foreign_vector_is_a_protocol_mismatch() -> None:
    """A vector of the wrong length, magic or version, or with an unknown error code,
    raises ``ProtocolMismatchError`` naming the sender."""
    good = encode_record(_any_record())
    for bad in (good[:-1], [0, *good[1:]], [good[0], good[1] + 1, *good[2:]]):
        with pytest.raises(vargather.ProtocolMismatchError, match="rank 3 sent metadata"):
            decode_record(bad, rank=3)
    with pytest.raises(vargather.ProtocolMismatchError, match="unknown error code 99"):
        decode_record([*good[:2], 99, *good[3:]], rank=3)


def test_a_long_or_foreign_message_arrives_as_ascii_cut_to_fit() -> None:
    """Every rank reads the same message: ASCII, ``?`` for other characters, cut."""
    record = _any_record()
    message = "é" + "x" * 2000
    sent = dataclasses.replace(
        record, problem=vargather._args.Problem(vargather.ArgumentError, message)
    )
    got = decode_record(encode_record(sent), rank=0).problem
    assert got is not None
    assert got.error is vargather.ArgumentError
    assert got.message == wire_text(message)
    assert got.message.startswith("?xxx")
    assert 0 < len(got.message) < len(message)


def _any_record() -> CallRecord:
    from vargather._args import check_call
    from vargather._comm import GroupInfo

    return check_call(
        torch.zeros(2, 3),
        0,
        sizes=None,
        grad="sum",
        transport="auto",
        info=GroupInfo(None, 0, 1, False, "none"),
    ).record

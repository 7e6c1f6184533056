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
    call_flags,
    decode_header,
    decode_record,
    encode_header,
    encode_headers,
    encode_record,
    header_count,
    header_flags,
    header_kind,
    header_struct,
    magic_mismatch,
    size_word_at,
    sizes_len_word_at,
    split_headers,
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


@given(data=st.data())
def test_headers_read_back_from_their_bytes_field_by_field(data: st.DataObject) -> None:
    """What the fused round reads of a rank's headers (``_wire``'s accessors: flags,
    kind, count, the size along the gather dim, the passed sizes' length) is what the
    sender encoded, after the words went through their byte form (``header_struct``,
    the same bytes as a ``torch.int64`` tensor) and were split per slot."""
    w = data.draw(st.integers(1, 4), label="world_size")
    slots = data.draw(st.integers(1, 4), label="slots")
    count = data.draw(st.integers(1, slots), label="count")
    records = [data.draw(calls(w, 0), label=f"record {i}") for i in range(count)]
    eligible = data.draw(st.booleans(), label="eligible")
    kind = data.draw(st.integers(0, 2), label="kind")
    words = encode_headers(slots, records, count, call_flags(eligible=eligible, kind_code=kind))
    raw = header_struct(slots).pack(*words)
    assert raw == torch.tensor(words, dtype=torch.int64).numpy().tobytes()
    row = header_struct(slots).unpack(raw)
    headers = split_headers(row)
    assert len(headers) == slots
    for i, h in enumerate(headers):
        assert magic_mismatch(h) is None
        assert header_kind(h) == kind
        assert header_count(h) == count
        assert bool(header_flags(h) & FLAG_ELIGIBLE) == eligible
        if i < count:
            rec = records[i]
            assert bool(header_flags(h) & FLAG_PROBLEM) == (rec.problem is not None)
            assert row[sizes_len_word_at(i)] == rec.sizes_len
            for d in range(min(rec.ndim, SHAPE_SLOTS)):
                assert row[size_word_at(i, d)] == rec.shape[d]
    foreign = [0, *words[1:HEADER_WORDS]]
    assert magic_mismatch(foreign) == f"expected magic {HEADER_MAGIC:#x}, got 0x0"


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
    from vargather._group import GroupInfo

    return check_call(
        torch.zeros(2, 3),
        0,
        sizes=None,
        grad="sum",
        transport="auto",
        info=GroupInfo(None, 0, 1, False, "none"),
    ).record


def test_every_format_on_the_wire_has_a_magic_of_one_scheme() -> None:
    """Four letters naming the format, its version in the low byte: no two formats
    share a magic, so a peer sending another format fails the magic check."""
    from vargather import _wire

    magics = {
        "varg": _wire.MAGIC,
        "vgfu": _wire.HEADER_MAGIC,
        "vgfa": _wire.ROW_MAGIC,
        "vgls": _wire.CARRIER_MAGIC,
    }
    assert len(set(magics.values())) == len(magics)
    for tag, magic in magics.items():
        assert (magic >> 8).to_bytes(4, "big") == tag.encode("ascii")
        assert magic == _wire.tagged_magic(tag, magic & 0xFF)
    assert _wire.MAGIC & 0xFF == _wire.PROTOCOL_VERSION


@pytest.mark.parametrize("world", [1, 2, 5])
@pytest.mark.parametrize("n_extras", [0, 3])
def test_a_row_round_trips_with_its_mark_extras_and_flag(world: int, n_extras: int) -> None:
    from vargather import _wire

    record = _any_record()
    extras = tuple(range(7, 7 + min(n_extras, 2 * (world + 1))))
    row = _wire.encode_row(record, 4, extras, world, 3)
    assert len(row) % 2 == 0
    rows_of_other_lengths = {len(_wire.encode_row(record, 3, (), world, 0)), len(row)}
    assert rows_of_other_lengths == {len(row)}  # one length whatever the extras
    assert _wire.row_mark(row) == (_wire.ROW_MAGIC, 4)
    decoded, got, flag = _wire.decode_row(row, len(extras), world, rank=0)
    assert (decoded, got, flag) == (record, extras, 3)
    full = tuple(range(_wire.row_extra_words(world)))  # a collective's words, any meaning
    assert (
        _wire.decode_row(_wire.encode_row(record, 9, full, world, 1), len(full), world, rank=0)[1]
        == full
    )
    with pytest.raises(ValueError, match="at most"):
        _wire.encode_row(record, 9, (*full, 0), world, 1)

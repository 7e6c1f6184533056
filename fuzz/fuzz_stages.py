"""Fuzz targets for vargather's single-process stages.

Not part of the pipeline: each target is a Hypothesis ``@given`` test of one stage, so
it runs three ways:

* ``python fuzz/fuzz_stages.py --minutes N [--target NAME] [--db PATH] [--report FILE]``:
  first every stored finding (``fuzz/findings.py``) is replayed, then Hypothesis
  drives every target (or one) for N minutes in all, with a persistent example
  database (its saved failures replayed first); prints examples run and failures,
  also to ``FILE``; exits 1 on a failure.
* ``python fuzz/fuzz_stages.py --atheris --target NAME [-- atheris options]``: atheris
  (optional, not a dependency) drives ``NAME.hypothesis.fuzz_one_input``;
* ``pytest fuzz/fuzz_stages.py``: once, as ordinary tests.

The targets (the stage under test in brackets):

``record_round_trip`` [wire format, ``_wire``]
    any realistic ``CallRecord`` encodes to ``RECORD_LENGTH`` int64 values and
    decodes back (integers saturated into int64, the message ASCII-replaced and cut).
``decode_is_total`` [wire decode + validation, ``_wire`` and ``_exchange``]
    any int64 matrix decodes to records or raises ``ProtocolMismatchError``; validating
    decoded records returns a ``Layout`` or raises a ``VarGatherError``, nothing else.
``check_call_is_total`` [local argument checks, ``_args``]
    ``check_call`` never raises, whatever the arguments (a rank that raised there
    would leave its peers waiting), and its record survives the wire.
``verdict_is_rank_independent`` [cross-rank validation, ``_exchange``]
    for W ranks' calls, every rank reaches the same verdict (same class and message,
    or the same layout), and the verdict is "valid" exactly when an independent check
    of the raw arguments says the call is valid.
``pad_compact_round_trip`` [the transports' buffers, ``_buffers``]
    padding W ragged shards into a ``(W, pre, max, post)`` buffer, or laying them out
    rank-major, then compacting, gives ``torch.cat`` bit for bit; and the backward's
    buffers (``scatter_into_padded``, ``rank_major_gradient``) put each rank's block
    where the transports expect it.
``family_verdict_is_rank_independent`` [the family's stages 1-3, ``_family`` and its modules]
    ``reduce_scatter_v`` / ``all_to_all_v``: the local checks never raise, and every
    rank's validation of the exchanged rows reaches the same verdict (the same error,
    or plans that agree with the tensors); the unchanged base call is accepted.
``family_row_codec`` [the family's row, ``_family`` and its modules' local calls]
    every kind's local call never raises and its record and size words survive the
    int64 wire within ``row_extra_words(W)``; the kind marks pass exactly when every row
    is this kind's, else blame ranks of the world.
``family_payload_layout`` [the family's layout arithmetic, ``_reduce_scatter``,
``_all_to_all``, ``_gather_list``]
    the bytes each rank's payload sends (``_outgoing``, the carriers), moved as the
    collective would, folded (``fold_slots``: NaNs canonical) or joined
    (``region_cutter``, ``_read_carriers``) give ``vargather.oracle``'s answer bit for bit
    on random bits of every gloo dtype.
``layout_math`` [``Layout``]
    offsets are the exclusive prefix sums, blocks tile ``[0, total)``, ``max_size``
    and ``is_even`` agree with the sizes; invalid layouts raise ``ValueError``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
import types
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as seeded
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

import vargather
from vargather import CONTRACTS, GLOO_DTYPES, TRANSPORT_NAMES, _buffers, _wire
from vargather._args import INT64_MAX, INT64_MIN, MAX_NDIM, CallRecord, Problem, check_call
from vargather._choices import unsupported_reason
from vargather._dtypes import dtype_name
from vargather._exchange import validate_records
from vargather._group import GroupInfo
from vargather._layout import Layout, blocks_layout
from vargather._round_buffers import region_cutter
from vargather._wire import RECORD_LENGTH, decode_record, encode_record, wire_text

DEFAULT_DB = os.path.join(".hypothesis", "fuzz")
EXAMPLES: dict[str, int] = {}

# deadline: a first call into torch can take a while; too_slow / data_too_large: the
# targets draw tensors and argument lists on purpose; none of these is a defect here.
FUZZ_SETTINGS = settings(
    derandomize=False,  # even under $CI, whose Hypothesis profile derandomizes
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=DirectoryBasedExampleDatabase(DEFAULT_DB),
    max_examples=100,
)

BODIES: dict[str, tuple[Callable[..., None], tuple[st.SearchStrategy[Any], ...]]] = {}


def target(
    *strategies: st.SearchStrategy[Any],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a target's body and its strategies; ``build`` makes the ``@given`` test."""

    def register(body: Callable[..., None]) -> Callable[..., None]:
        BODIES[body.__name__] = (body, strategies)
        return body

    return register


def build(name: str, config: settings) -> Callable[..., None]:
    """A fresh ``@given`` test of target ``name`` under ``config``. Hypothesis keys its
    database by the body, so every build of a target shares its saved examples."""
    body, strategies = BODIES[name]
    return config(given(*strategies)(body))


def _count(name: str) -> None:
    EXAMPLES[name] = EXAMPLES.get(name, 0) + 1


def _sat(v: int) -> int:
    return max(INT64_MIN, min(INT64_MAX, v))


# --- strategies --------------------------------------------------------------------------

huge_ints = st.one_of(
    st.integers(-5, 40),
    st.integers(INT64_MIN - 10, INT64_MIN + 10),
    st.integers(INT64_MAX - 10, INT64_MAX + 10),
    st.integers(-(2**80), 2**80),
)

GLOO_NAMES = sorted(dtype_name(d) for d in GLOO_DTYPES)
OTHER_DTYPES = ["uint16", "float8_e4m3fn", "complex32"]


@st.composite
def tensors(draw: st.DrawFn, shape: Sequence[int] | None = None) -> torch.Tensor:
    """A tensor of any gloo dtype (sometimes another), shape, storage kind or device."""
    if shape is None:
        ndim = draw(st.integers(0, 4))
        shape = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    dtype = getattr(torch, draw(st.sampled_from(GLOO_NAMES + OTHER_DTYPES)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "ComplexHalf support is experimental"
        t = torch.zeros(tuple(shape), dtype=dtype)
    kind = draw(st.sampled_from(["plain"] * 6 + ["sparse", "meta", "view", "grad"]))
    if kind == "sparse" and dtype in GLOO_DTYPES and t.ndim > 0:
        return t.to_sparse()
    if kind == "meta":
        return t.to("meta")
    if kind == "view" and t.ndim >= 2:
        return t.transpose(0, -1)
    if kind == "grad" and (dtype.is_floating_point or dtype.is_complex) and dtype in GLOO_DTYPES:
        return t.requires_grad_(True)
    return t


def anything() -> st.SearchStrategy[Any]:
    """Python values a caller might pass by mistake."""
    return st.one_of(
        st.none(),
        st.booleans(),
        huge_ints,
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=80),
        st.binary(max_size=8),
        st.lists(st.one_of(huge_ints, st.floats(), st.booleans(), st.none()), max_size=5),
        st.tuples(huge_ints, huge_ints),
        st.builds(timedelta, seconds=st.floats(-10, 10)),
        st.just(object()),
        st.just(torch.tensor(1)),
        st.just(torch.tensor(1.5)),
    )


def sizes_values(world_size: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.lists(huge_ints, min_size=0, max_size=world_size + 2),
        st.lists(st.integers(0, 4), min_size=world_size, max_size=world_size),
        st.lists(st.integers(0, 4), min_size=world_size, max_size=world_size).map(tuple),
        st.lists(st.integers(-3, 4), min_size=world_size, max_size=world_size).map(
            lambda v: torch.tensor(v, dtype=torch.int64)
        ),
        st.lists(st.integers(0, 4), min_size=1, max_size=world_size + 1).flatmap(
            lambda v: st.sampled_from(["int32", "float32", "bool", "uint8", "2d"]).map(
                lambda k: (
                    torch.tensor(v).reshape(1, -1)
                    if k == "2d"
                    else torch.tensor(v, dtype=getattr(torch, k))
                )
            )
        ),
        anything(),
    )


def infos(world_size: int) -> st.SearchStrategy[GroupInfo]:
    return st.integers(0, world_size - 1).map(
        lambda r: GroupInfo(None, r, world_size, world_size > 1, "gloo")
    )


# --- targets -------------------------------------------------------------------------------


PROBLEM_ERRORS = (
    vargather.InputTypeError,
    vargather.InputShapeError,
    vargather.DimError,
    vargather.SizesTypeError,
    vargather.SizesError,
    vargather.ArgumentError,
)


@st.composite
def records(draw: st.DrawFn) -> CallRecord:
    ndim = draw(st.integers(0, MAX_NDIM + 8))
    shape = tuple(
        draw(st.lists(st.integers(0, INT64_MAX), min_size=min(ndim, MAX_NDIM), max_size=ndim))
    )[:MAX_NDIM]
    problem = draw(
        st.none() | st.builds(Problem, st.sampled_from(PROBLEM_ERRORS), st.text(max_size=600))
    )
    return CallRecord(
        problem=problem,
        ndim=ndim,
        dtype_code=draw(st.integers(0, 40)),
        dim=draw(huge_ints),
        normalized_dim=draw(st.integers(-1, ndim)),
        contract_code=draw(st.integers(-1, 5)),
        transport_code=draw(st.integers(-1, 5)),
        requires_grad=draw(st.booleans()),
        device_code=draw(st.integers(-1, 10)),
        sizes_len=draw(huge_ints),
        sizes_own=draw(huge_ints),
        sizes_sum=draw(huge_ints),
        sizes_hash=draw(st.integers(-1, (1 << 61) - 2)),
        shape=shape,
    )


@target(records())
def record_round_trip(record: CallRecord) -> None:
    _count("record_round_trip")
    values = encode_record(record)
    assert len(values) == RECORD_LENGTH
    assert all(isinstance(v, int) and INT64_MIN <= v <= INT64_MAX for v in values)
    back = decode_record(torch.tensor(values, dtype=torch.int64).tolist(), rank=0)
    problem = record.problem
    want = CallRecord(
        problem=None if problem is None else Problem(problem.error, wire_text(problem.message)),
        ndim=record.ndim,
        dtype_code=record.dtype_code,
        dim=_sat(record.dim),
        normalized_dim=record.normalized_dim,
        contract_code=record.contract_code,
        transport_code=record.transport_code,
        requires_grad=record.requires_grad,
        device_code=record.device_code,
        sizes_len=_sat(record.sizes_len),
        sizes_own=_sat(record.sizes_own),
        sizes_sum=_sat(record.sizes_sum),
        sizes_hash=record.sizes_hash,
        shape=record.shape[: min(record.ndim, MAX_NDIM)],
    )
    assert back == want, (back, want)


@target(
    st.integers(1, 4).flatmap(
        lambda w: st.lists(
            st.lists(
                st.one_of(st.integers(INT64_MIN, INT64_MAX), st.integers(-3, 40)),
                min_size=RECORD_LENGTH,
                max_size=RECORD_LENGTH,
            ),
            min_size=w,
            max_size=w,
        )
    ),
    st.booleans(),
)
def decode_is_total(rows: list[list[int]], genuine_header: bool) -> None:
    _count("decode_is_total")
    if genuine_header:
        header = encode_record(_ok_record())[:2]
        rows = [header + row[2:] for row in rows]
    decoded = []
    refused: vargather.ProtocolMismatchError | None = None
    for r, row in enumerate(rows):
        try:
            decoded.append(decode_record(row, rank=r))
        except vargather.ProtocolMismatchError as err:
            refused = err
            break
    if refused is not None:
        assert refused.ranks == (len(decoded),)
        return
    for r in range(len(decoded)):
        try:
            layout = validate_records(decoded, rank=r)
        except vargather.VarGatherError:
            continue
        assert layout.rank == r
        assert layout.world_size == len(decoded)


def _ok_record() -> CallRecord:
    return check_call(
        torch.zeros(1),
        0,
        sizes=None,
        grad="sum",
        transport="auto",
        info=GroupInfo(None, 0, 1, False, "none"),
    ).record


@st.composite
def calls(draw: st.DrawFn, world_size: int) -> dict[str, Any]:
    """One rank's arguments: mostly plausible, sometimes anything."""
    x = draw(st.one_of(tensors(), tensors(), anything()))
    return {
        "x": x,
        "dim": draw(st.one_of(st.integers(-5, 5), anything())),
        "sizes": draw(sizes_values(world_size)),
        "contract": draw(st.one_of(st.sampled_from(CONTRACTS), anything())),
        "transport": draw(st.one_of(st.sampled_from(TRANSPORT_NAMES), anything())),
        "validate": draw(st.one_of(st.just(True), anything())),
        "timeout": draw(st.one_of(st.none(), st.floats(0.5, 100), anything())),
    }


@target(st.integers(1, 4).flatmap(lambda w: st.tuples(calls(w), infos(w))))
def check_call_is_total(args: tuple[dict[str, Any], GroupInfo]) -> None:
    _count("check_call_is_total")
    call, info = args
    rec = check_call(
        call["x"],
        call["dim"],
        sizes=call["sizes"],
        grad=call["contract"],
        transport=call["transport"],
        info=info,
        validate=call["validate"],
        timeout=call["timeout"],
    ).record
    values = encode_record(rec)
    assert all(INT64_MIN <= v <= INT64_MAX for v in values)
    back = decode_record(values, rank=info.rank)
    assert back.shape == rec.shape
    if rec.problem is None:
        assert back.problem is None
    else:
        assert back.problem is not None
        assert rec.problem.error in PROBLEM_ERRORS
        assert rec.problem.message
        assert back.problem == Problem(rec.problem.error, wire_text(rec.problem.message))


@st.composite
def worlds(draw: st.DrawFn) -> list[dict[str, Any]]:
    """W ranks' calls around one valid base call, some ranks changed."""
    w = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    trail = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    sizes = draw(st.lists(st.integers(0, 4), min_size=w, max_size=w))
    dtype = draw(st.sampled_from(GLOO_NAMES))
    grad = draw(st.sampled_from(CONTRACTS))
    transport = draw(st.sampled_from(TRANSPORT_NAMES))
    floating = getattr(torch, dtype).is_floating_point or getattr(torch, dtype).is_complex
    requires_grad = floating and draw(st.booleans())
    pass_sizes = draw(st.booleans())
    out = []
    for r in range(w):
        shape = list(trail)
        shape[dim] = sizes[r]
        x = torch.zeros(tuple(shape), dtype=getattr(torch, dtype)).requires_grad_(requires_grad)
        call = {
            "x": x,
            "dim": dim,
            "sizes": list(sizes) if pass_sizes else None,
            "contract": grad,
            "transport": transport,
            "validate": True,
            "timeout": None,
        }
        if draw(st.integers(0, 3)) == 0:
            key = draw(st.sampled_from(sorted(call)))
            other = calls(w).map(lambda c, key=key: c[key])  # type: ignore[misc]
            call[key] = draw(other)
        out.append(call)
    return out


def _tensor_ok(x: object, w: int) -> bool:
    """A tensor a ``w``-rank call may pass: its device is one gloo carries only where
    something is carried (``w > 1``); in a world of one nothing communicates and any
    device is the identity's."""
    return (
        isinstance(x, torch.Tensor)
        and x.layout == torch.strided
        and (w == 1 or x.device.type in ("cpu", "cuda"))
        and x.dtype in GLOO_DTYPES
        and 1 <= x.ndim <= MAX_NDIM
    )


def _int_like(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        return int(v.__index__())  # type: ignore[attr-defined]
    except Exception:
        return None


def _valid_world(world: list[dict[str, Any]]) -> bool:
    """An independent statement of what a valid call is."""
    w = len(world)
    xs = [c["x"] for c in world]
    if not all(_tensor_ok(x, w) for x in xs):
        return False
    dims = [_int_like(c["dim"]) for c in world]
    if any(d is None or not -x.ndim <= d < x.ndim for d, x in zip(dims, xs, strict=True)):
        return False
    norm = [d % x.ndim for d, x in zip(dims, xs, strict=True)]  # type: ignore[operator]
    if len({x.ndim for x in xs}) != 1 or len(set(norm)) != 1 or len({x.dtype for x in xs}) != 1:
        return False
    d = norm[0]
    if len({tuple(x.shape[:d]) + tuple(x.shape[d + 1 :]) for x in xs}) != 1:
        return False
    for c in world:
        if c["contract"] not in CONTRACTS or not isinstance(c["contract"], str):
            return False
        if c["transport"] not in TRANSPORT_NAMES or not isinstance(c["transport"], str):
            return False
        if not isinstance(c["validate"], bool):
            return False
        t = c["timeout"]
        if t is not None:
            seconds = t.total_seconds() if isinstance(t, timedelta) else t
            if isinstance(t, bool) or not isinstance(seconds, (int, float)):
                return False
            if not (math.isfinite(seconds) and 1e-3 <= seconds <= 1e9) or w > 1:
                return False  # no live group here, so no per-call timeout either
    if len({c["contract"] for c in world}) != 1 or len({c["transport"] for c in world}) != 1:
        return False
    if w > 1 and unsupported_reason(world[0]["transport"], "gloo") is not None:
        return False  # a transport the backend cannot run (views on gloo)
    truth = [x.shape[d] for x in xs]
    for c in world:
        s = c["sizes"]
        if s is None:
            continue
        if isinstance(s, torch.Tensor):
            if s.is_floating_point() or s.is_complex() or s.dtype == torch.bool or s.ndim != 1:
                return False
            s = s.tolist()
        elif isinstance(s, (str, bytes)) or not isinstance(s, Sequence):
            return False
        ints = [_int_like(v) for v in s]
        if any(
            v is None
            or isinstance(e, bool)
            or (isinstance(e, torch.Tensor) and e.is_floating_point())
            for v, e in zip(ints, s, strict=True)
        ):
            return False
        if ints != truth:
            return False
    grads = {bool(x.requires_grad) and torch.is_grad_enabled() for x in xs}
    return not (world[0]["contract"] != "local" and len(grads) != 1)


@target(worlds())
def verdict_is_rank_independent(world: list[dict[str, Any]]) -> None:
    _count("verdict_is_rank_independent")
    w = len(world)
    recs = [
        check_call(
            c["x"],
            c["dim"],
            sizes=c["sizes"],
            grad=c["contract"],
            transport=c["transport"],
            info=GroupInfo(None, r, w, w > 1, "gloo"),
            validate=c["validate"],
            timeout=c["timeout"],
        ).record
        for r, c in enumerate(world)
    ]
    wire = [decode_record(encode_record(rec), rank=r) for r, rec in enumerate(recs)]
    verdicts: list[tuple[str, str] | Layout] = []
    errors: list[vargather.VarGatherError] = []
    for r in range(w):
        try:
            verdicts.append(validate_records(wire, rank=r))
        except vargather.VarGatherError as err:
            errors.append(err)
            verdicts.append((type(err).__name__, str(err)))
    for err in errors:
        assert err.ranks, err
        assert all(0 <= b < w for b in err.ranks), err
        assert all(f"{b}" in str(err) for b in err.ranks), err
    first = verdicts[0]
    if isinstance(first, tuple):
        assert all(v == first for v in verdicts), verdicts
        assert not _valid_world(world), f"a valid call was refused: {first}"
        return
    assert _valid_world(world), "an invalid call was accepted"
    for r, v in enumerate(verdicts):
        assert isinstance(v, Layout)
        assert v.rank == r
        assert (v.sizes, v.dim, v.dtype, v.leading_shape, v.trailing_shape) == (
            first.sizes,
            first.dim,
            first.dtype,
            first.leading_shape,
            first.trailing_shape,
        )
    xs = [c["x"] for c in world]
    assert first.sizes == tuple(x.shape[first.dim] for x in xs)


@st.composite
def family_worlds(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]], list[bool]]:
    """W ranks' calls of ``reduce_scatter_v`` or ``all_to_all_v`` around one valid base
    call, some ranks' ``x``, ``dim``, sizes or receive sizes changed (and which)."""
    name = draw(st.sampled_from(["reduce_scatter_v", "all_to_all_v"]))
    w = draw(st.integers(2, 4))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    trail = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    dtype = draw(st.sampled_from(GLOO_NAMES))
    floating = getattr(torch, dtype).is_floating_point or getattr(torch, dtype).is_complex
    requires_grad = floating and draw(st.booleans())
    row = st.lists(st.integers(0, 4), min_size=w, max_size=w)
    common = draw(row)
    send = [draw(row) for _ in range(w)]
    pass_recv = draw(st.booleans())
    out, changed = [], []
    for r in range(w):
        sizes = common if name == "reduce_scatter_v" else send[r]
        shape = list(trail)
        shape[dim] = sum(sizes)
        x = torch.zeros(tuple(shape), dtype=getattr(torch, dtype)).requires_grad_(requires_grad)
        recv = [send[j][r] for j in range(w)] if pass_recv else None
        call = {"x": x, "dim": dim, "sizes": list(sizes), "recv_sizes": recv}
        mutated = draw(st.integers(0, 3)) == 0
        if mutated:
            key = draw(st.sampled_from(sorted(call)))
            if key == "x":
                call[key] = draw(st.one_of(tensors(), anything()))
            elif key == "dim":
                call[key] = draw(st.one_of(st.integers(-5, 5), anything()))
            else:
                call[key] = draw(sizes_values(w))
        out.append(call)
        changed.append(mutated)
    return name, out, changed


@target(family_worlds())
def family_verdict_is_rank_independent(
    world: tuple[str, list[dict[str, Any]], list[bool]],
) -> None:
    """The family's local checks never raise, and validating the exchanged rows (the
    wire's view of each record) gives every rank the same verdict: the same error
    class and message, naming ranks of the world, or plans that agree with the
    tensors (``reduce_scatter_v``: sizes adding up to every rank's rows, the same
    everywhere; ``all_to_all_v``: rank r's send row adding up to its rows). The base
    call, unchanged, is accepted."""
    from vargather import _all_to_all_rows, _reduce_scatter
    from vargather._rows import Row

    _count("family_verdict_is_rank_independent")
    name, calls_, changed = world
    w = len(calls_)
    rows = []
    for r, c in enumerate(calls_):
        info = GroupInfo(None, r, w, True, "gloo")
        if name == "reduce_scatter_v":
            call = _reduce_scatter._local_call(c["x"], c["sizes"], c["dim"], info, True, None, None)
        else:
            call = _all_to_all_rows.local_call(
                c["x"], c["sizes"], c["recv_sizes"], c["dim"], info, True, None, None
            )
        assert call.kind == name
        assert all(isinstance(v, int) and INT64_MIN <= v <= INT64_MAX for v in call.extras)
        rows.append(Row(decode_record(encode_record(call.record), rank=r), call.extras))
    assert len({len(row.extras) for row in rows}) == 1, "rows of unequal length"
    verdicts: list[object] = []
    for r in range(w):
        try:
            if name == "reduce_scatter_v":
                verdicts.append(_reduce_scatter.validate_rows(rows, rank=r))
            else:
                verdicts.append(_all_to_all_rows.validate_rows(rows, rank=r))
        except vargather.VarGatherError as err:
            verdicts.append((type(err).__name__, str(err), err.ranks))
    first = verdicts[0]
    assert all(v == first for v in verdicts), verdicts
    if isinstance(first, tuple) and isinstance(first[0], str):
        _, message, ranks = first
        assert ranks, message
        assert all(0 <= b < w for b in ranks), message
        assert all(f"{b}" in message for b in ranks), message
        assert any(changed), f"the valid base call was refused: {message}"
        return
    xs = [c["x"] for c in calls_]
    assert all(isinstance(x, torch.Tensor) for x in xs)
    d = calls_[0]["dim"] % xs[0].ndim
    assert len({(x.dtype, x.ndim, x.shape[:d] + x.shape[d + 1 :]) for x in xs}) == 1
    if name == "reduce_scatter_v":
        assert isinstance(first, tuple)
        assert all(sum(first) == x.shape[d] for x in xs), (first, [x.shape for x in xs])
        assert len({x.shape for x in xs}) == 1
    else:
        assert isinstance(first, _all_to_all_rows.Validated)
        assert first.cat == d, first  # no cat_dim passed: the blocks join along dim
        assert first.shapes is None, first
        matrix = first.matrix
        for r, x in enumerate(xs):
            assert sum(matrix[r]) == x.shape[d], (matrix, r, x.shape)
            recv = calls_[r]["recv_sizes"]
            if recv is not None:
                passed = recv.tolist() if isinstance(recv, torch.Tensor) else list(recv)
                assert passed == [matrix[j][r] for j in range(w)]
    assert len({bool(x.requires_grad) for x in xs}) == 1


@target(
    st.integers(1, 4).flatmap(lambda w: st.tuples(st.just(w), sizes_values(w))),
    st.sampled_from(["reduce_scatter_v", "all_to_all_v", "all_gather_list"]),
    st.one_of(tensors(), anything()),
    st.lists(st.tuples(st.integers(-1, 2**16), st.integers(-1, 40)), min_size=1, max_size=4),
)
def family_row_codec(
    world_sizes: tuple[int, Any], name: str, x: Any, marks: list[tuple[int, int]]
) -> None:
    """The family's row on the wire: every kind's local call never raises; its size
    words (``sizes_words``: ``[len, n_0, ...]``, ``-1`` for absent, saturated) and its
    record survive the int64 wire, within ``row_extra_words(W)``; ``_check_kinds`` over
    any rows' (magic, kind) marks passes exactly when every row is this kind's, and
    otherwise blames ranks of the world, the same on every rank."""
    from vargather import _all_to_all_rows, _gather_list, _reduce_scatter
    from vargather._args import saturate
    from vargather._collectives import COLLECTIVES
    from vargather._rows import _check_kinds, sizes_words
    from vargather._wire import ROW_MAGIC, row_extra_words

    _count("family_row_codec")
    w, sizes = world_sizes
    parsed, words = sizes_words(sizes, w)
    assert len(words) == 1 + w
    assert all(isinstance(v, int) and INT64_MIN <= v <= INT64_MAX for v in words)
    if isinstance(parsed, tuple):
        assert words[0] == len(parsed)
        kept = [saturate(n) for n in parsed[:w]]
        assert words[1 : 1 + len(kept)] == kept
        assert words[1 + len(kept) :] == [-1] * (w - len(kept))
    else:
        assert words == [-1] * (1 + w)
    for r in range(w):
        info = GroupInfo(None, r, w, w > 1, "gloo")
        if name == "reduce_scatter_v":
            call = _reduce_scatter._local_call(x, sizes, 0, info, True, None, None)
        elif name == "all_to_all_v":
            call = _all_to_all_rows.local_call(x, sizes, sizes, 0, info, True, None, None)
        else:
            call = _gather_list._local_call(x, sizes, "sum", info, True, None, None)
        assert call.kind == name
        assert len(call.extras) <= row_extra_words(w)
        assert all(isinstance(v, int) and INT64_MIN <= v <= INT64_MAX for v in call.extras)
        back = decode_record(encode_record(call.record), rank=r)
        assert back.shape == call.record.shape
        assert (back.problem is None) == (call.record.problem is None)
        if not isinstance(x, torch.Tensor):
            assert call.record.problem is not None
    # The kind marks: the calling rank's row is its own kind's, the others anything.
    code = COLLECTIVES[name].code  # type: ignore[index]  # name: one of the table's, as a str
    rows = [(ROW_MAGIC if m % 3 else m, k % 5 if k >= 0 else k) for m, k in marks]
    rows[marks[0][1] % len(rows)] = (ROW_MAGIC, code)
    refused: vargather.ProtocolMismatchError | None = None
    try:
        _check_kinds(name, rows)
    except vargather.ProtocolMismatchError as err:
        refused = err
    if refused is None:
        assert all(r == (ROW_MAGIC, code) for r in rows), rows
        return
    assert any(r != (ROW_MAGIC, code) for r in rows), refused
    assert refused.ranks, refused
    assert all(0 <= b < len(rows) and f"{b}" in str(refused) for b in refused.ranks), refused


@st.composite
def family_payloads(draw: st.DrawFn) -> tuple[str, list[torch.Tensor], Any, int]:
    """W ranks' tensors of a valid family call, random bits of any gloo dtype (NaN
    payloads, -0.0 and infinities among the floats), some strided, and its sizes:
    ``reduce_scatter_v``'s common sizes, ``all_to_all_v``'s send matrix or
    ``all_gather_list``'s passed words."""
    name = draw(st.sampled_from(["reduce_scatter_v", "all_to_all_v", "all_gather_list"]))
    w = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    trail = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    dtype = getattr(torch, draw(st.sampled_from(GLOO_NAMES)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    row = st.lists(st.integers(0, 4), min_size=w, max_size=w)
    common = draw(row)
    send = [draw(row) for _ in range(w)]
    xs = []
    for r in range(w):
        shape = list(trail)
        if name == "reduce_scatter_v":
            shape[dim] = sum(common)
        elif name == "all_to_all_v":
            shape[dim] = sum(send[r])
        else:
            shape = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
        raw = torch.randint(0, 256, (math.prod(shape) * dtype.itemsize,), generator=gen)
        t = raw.to(torch.uint8).view(dtype).reshape(shape)
        if dtype == torch.bool:
            t = raw.to(torch.uint8).view(torch.bool).reshape(shape) & True
        if draw(st.booleans()) and t.ndim >= 2:
            t = t.transpose(0, -1).contiguous().transpose(0, -1)
        xs.append(t)
    if name == "reduce_scatter_v":
        return name, xs, tuple(common), dim
    if name == "all_to_all_v":
        return name, xs, tuple(tuple(s) for s in send), dim
    words = st.integers(INT64_MIN, INT64_MAX)  # the passed-shapes words are int64
    return name, xs, draw(st.lists(words, min_size=2, max_size=2)), dim


def _by_bytes(flat: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    return list(torch.split(flat.view(torch.uint8).reshape(-1), list(sizes)))


@target(family_payloads())
def family_payload_layout(case: tuple[str, list[torch.Tensor], Any, int]) -> None:
    """The family's layout arithmetic against ``vargather.oracle``, bit for bit, by
    moving the bytes the payload collective would move: ``reduce_scatter_v``'s send
    buffer (``_outgoing``: rank j's block r for rank r) folded by ``fold_slots`` (a
    reduction: NaNs canonical, -0.0 and integer wrap-around as the oracle's);
    ``all_to_all_v``'s blocks cut from a round's buffer of padded slots by
    ``region_cutter`` (closed up in place); ``all_gather_list``'s carriers
    (``_carrier``: metadata words then the elements, bool as bits) read back by
    ``_read_carriers``."""
    from vargather import _all_to_all, _all_to_all_rows, _gather_list, _reduce_scatter, oracle

    _count("family_payload_layout")
    name, xs, sizes, dim = case
    w = len(xs)
    infos_ = [GroupInfo(None, r, w, w > 1, "gloo") for r in range(w)]
    d = dim % xs[0].ndim
    if name == "reduce_scatter_v":
        sent = []
        for r, x in enumerate(xs):
            call = _reduce_scatter._local_call(x, list(sizes), dim, infos_[r], True, None, None)
            assert call.record.problem is None, call.record.problem
            flat, splits = _reduce_scatter._outgoing(x, call, infos_[r])
            assert sum(splits) == flat.numel() * flat.element_size()
            sent.append(_by_bytes(flat, splits))
        want = oracle.expected_reduce_scatter(xs, sizes, d)
        for r in range(w):
            lay = blocks_layout(xs[r].shape, d, sizes, xs[r].dtype, r, w)
            assert lay.shard_shape(r) == tuple(want[r].shape)
            got = _reduce_scatter.fold_slots([sent[j][r] for j in range(w)], lay)
            assert _same_bits(got, want[r]), (r, got, want[r])
        return
    if name == "all_to_all_v":
        sent = []
        for r, x in enumerate(xs):
            call = _all_to_all_rows.local_call(
                x, list(sizes[r]), None, dim, infos_[r], True, None, None
            )
            assert call.record.problem is None, call.record.problem
            flat, splits = _all_to_all._outgoing(x, call, infos_[r])
            sent.append(_by_bytes(flat, splits))
        want = oracle.expected_all_to_all(xs, sizes, d)
        for r in range(w):
            recv = tuple(sizes[j][r] for j in range(w))
            shape = list(xs[r].shape)
            shape[d] = sum(recv)
            lay = _all_to_all_rows.split_layout(tuple(shape), d, recv, xs[r].dtype, infos_[r])
            slots = [sent[j][r] for j in range(w)]
            needs = tuple(s.numel() for s in slots)
            starts = list(itertools.accumulate((0, *(n + 16 - n % 16 for n in needs[:-1]))))
            buf = torch.zeros(starts[-1] + needs[-1] + 16, dtype=torch.uint8)
            for at, s in zip(starts, slots, strict=True):
                buf[at : at + s.numel()] = s
            got = region_cutter(buf, starts)((lay,), needs)[0]
            assert _same_bits(got, want[r]), (r, got, want[r])
        return
    carriers = [_gather_list._carrier(x, _wire.carrier_words(tuple(x.shape), sizes)) for x in xs]
    run = torch.cat([c.reshape(-1) for c in carriers])
    read = _gather_list._read_carriers(run, [c.numel() for c in carriers])
    lay = _gather_list.flat_layout(tuple(tuple(x.shape) for x in xs), xs[0].dtype, infos_[0])
    assert lay.sizes == tuple(x.numel() for x in xs)
    for r, ((words, elements), x) in enumerate(zip(read, xs, strict=True)):
        assert words == _wire.carrier_words(tuple(x.shape), sizes), r
        assert _same_bits(elements.view(x.shape), x.contiguous()), r


@st.composite
def ragged_shards(draw: st.DrawFn) -> tuple[list[torch.Tensor], Layout]:
    w = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 4))
    dim = draw(st.integers(0, ndim - 1))
    trail = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    sizes = draw(
        st.one_of(
            st.lists(st.integers(0, 5), min_size=w, max_size=w),
            st.integers(0, 5).map(lambda n: [n] * w),
        )
    )
    dtype = getattr(torch, draw(st.sampled_from(GLOO_NAMES)))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    shards = []
    for n in sizes:
        shape = list(trail)
        shape[dim] = n
        raw = torch.randint(0, 256, (math.prod(shape) * dtype.itemsize,), generator=gen)
        t = raw.to(torch.uint8).view(dtype).reshape(shape)
        if draw(st.booleans()) and t.ndim >= 2:
            t = t.transpose(0, -1).contiguous().transpose(0, -1)
        shards.append(t)
    layout = Layout(
        sizes=tuple(sizes),
        dim=dim,
        leading_shape=tuple(trail[:dim]),
        trailing_shape=tuple(trail[dim + 1 :]),
        dtype=dtype,
        rank=draw(st.integers(0, w - 1)),
        world_size=w,
    )
    return shards, layout


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:  # an empty tensor's strides need not allow a bytes view
        return True
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    # unsqueeze(-1): a new last dimension of stride 1, which a bytes view needs (a
    # contiguous tensor's size-1 last dimension may have another stride).
    return torch.equal(
        a.contiguous().unsqueeze(-1).view(torch.uint8),
        b.contiguous().unsqueeze(-1).view(torch.uint8),
    )


@target(ragged_shards())
def pad_compact_round_trip(case: tuple[list[torch.Tensor], Layout]) -> None:
    _count("pad_compact_round_trip")
    shards, layout = case
    want = torch.cat(shards, dim=layout.dim)
    # Padded: what an equal all_gather of the padded blocks leaves in the buffer.
    padded = [
        _buffers.pad_blocks(_buffers.as_blocks(x, n, layout), layout.max_size)
        for x, n in zip(shards, layout.sizes, strict=True)
    ]
    buffer = torch.stack(padded) if padded else torch.empty(0)
    assert _same_bits(_buffers.compact_padded(buffer, layout), want)
    # Rank-major: what alltoallv leaves (each rank's block, flat, one after another).
    flat = torch.cat(
        [_buffers.as_blocks(x, x.shape[layout.dim], layout).reshape(-1) for x in shards]
    )
    assert _same_bits(_buffers.compact_rank_major(flat, layout), want)
    # Backward buffers: rank r's block of the full gradient lands where r reads it.
    scattered = _buffers.scatter_into_padded(want, layout)
    major = _buffers.rank_major_gradient(want, layout)
    start = 0
    for r, x in enumerate(shards):
        n = layout.sizes[r]
        block = x.reshape(layout.pre, n, layout.post)
        assert _same_bits(scattered[r, :, :n], block)
        count = layout.pre * n * layout.post
        assert _same_bits(major[start : start + count].view(layout.pre, n, layout.post), block)
        start += count


@target(
    st.lists(st.integers(-2, 10**6), min_size=0, max_size=6),
    st.integers(-1, 6),
    st.integers(-1, 4),
    st.lists(st.integers(0, 4), max_size=4),
)
def layout_math(sizes: list[int], rank: int, dim: int, other: list[int]) -> None:
    _count("layout_math")
    lead, trail = tuple(other[: max(dim, 0)]), tuple(other[max(dim, 0) :])
    args = {
        "sizes": tuple(sizes),
        "dim": dim,
        "leading_shape": lead,
        "trailing_shape": trail,
        "dtype": torch.float32,
        "rank": rank,
        "world_size": len(sizes),
    }
    valid = (
        len(sizes) > 0
        and 0 <= rank < len(sizes)
        and all(n >= 0 for n in sizes)
        and dim == len(lead)
    )
    try:
        layout = Layout(**args)  # type: ignore[arg-type]
    except ValueError:
        assert not valid
        return
    assert valid
    assert layout.offsets == tuple(sum(sizes[:r]) for r in range(len(sizes)))
    assert layout.total == sum(sizes)
    assert layout.max_size == max(sizes)
    assert layout.is_even == (len(set(sizes)) == 1)
    covered = [i for r in range(len(sizes)) for i in range(layout.total)[layout.block(r)]]
    assert covered == list(range(layout.total))
    assert layout.output_shape == (*lead, layout.total, *trail)
    assert layout.shard_shape(rank) == (*lead, sizes[rank], *trail)
    assert layout.local_offset == layout.offsets[rank]
    assert layout.pre == math.prod(lead)
    assert layout.post == math.prod(trail)


TARGETS: dict[str, Callable[..., None]] = {name: build(name, FUZZ_SETTINGS) for name in BODIES}
"""Each target as a ``@given`` test; ``TARGETS[name].hypothesis.fuzz_one_input`` is
what atheris (or any byte-level fuzzer) drives."""

for _name, _test in TARGETS.items():  # so that ``pytest fuzz/fuzz_stages.py`` runs them
    globals()[f"test_{_name}"] = _test


# --- the runner ----------------------------------------------------------------------------


def run_timed(
    names: Sequence[str],
    seconds: float,
    db_path: str,
    chunk: int = 50,
    first_seed: int | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Drive each target with Hypothesis for its share of ``seconds``.

    Each round is one ``@given`` run of up to ``chunk`` examples against the database,
    so a failure saved by an earlier run is replayed first; round ``k`` draws from seed
    ``first_seed + k`` when one is given (reproducible), from fresh randomness
    otherwise. Returns (examples run per target, failure reports); a target stops at
    its first failure.
    """
    config = settings(FUZZ_SETTINGS, database=DirectoryBasedExampleDatabase(db_path))
    failures: list[str] = []
    share = seconds / max(1, len(names))
    for name in names:
        end = time.monotonic() + share
        for k in itertools.count():
            test = build(name, settings(config, max_examples=chunk))
            if first_seed is not None:
                test = seeded(first_seed + k)(test)
            try:
                test()
            except Exception as err:  # a failure, shrunk and saved by Hypothesis
                for part in getattr(err, "exceptions", None) or [err]:  # an ExceptionGroup too
                    notes = "\n".join(getattr(part, "__notes__", []))
                    failures.append(f"{name}: {type(part).__name__}: {part}\n{notes}".rstrip())
                break
            if time.monotonic() >= end:
                break
    return dict(EXAMPLES), failures


def replay_findings(names: Sequence[str]) -> tuple[int, list[str]]:
    """Every stored finding of the targets ``names`` (``fuzz/findings.py``), run once:
    (how many ran, failure reports)."""
    from findings import STAGES

    ran, failures = 0, []
    for label, name, args in STAGES:
        if name not in names:
            continue
        ran += 1
        try:
            BODIES[name][0](*args)
        except Exception as err:
            failures.append(f"{name}: stored finding ({label}): {type(err).__name__}: {err}")
    return ran, failures


def write_report(path: str | None, lines: Sequence[str]) -> None:
    """The printed summary, also to ``path`` (CI uploads it), when one is given."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def instrument_vargather(atheris: Any) -> int:
    """Coverage feedback for atheris from vargather's own functions (and methods), in
    place; ``atheris.instrument_all()`` would take minutes over torch's."""
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if name != "vargather" and not name.startswith("vargather."):
            continue
        for obj in list(vars(module).values()):
            members = [obj]
            if isinstance(obj, type) and obj.__module__ == name:
                members += list(vars(obj).values())
            for member in members:
                func = getattr(member, "__func__", member)  # staticmethod, classmethod
                func = func.fget if isinstance(func, property) else func
                if (
                    isinstance(func, types.FunctionType)
                    and func.__module__ == name
                    and id(func) not in seen
                ):
                    seen.add(id(func))
                    atheris.instrument_func(func)
    return len(seen)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="time for all targets")
    parser.add_argument("--target", choices=sorted(TARGETS), action="append")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"example database (default {DEFAULT_DB})")
    parser.add_argument("--atheris", action="store_true", help="drive one --target with atheris")
    parser.add_argument("--report", help="also write the summary and failures to this file")
    parser.add_argument(
        "--seed",
        type=int,
        help="draw round k of each target from seed SEED+k: reproducible (what the CI "
        "smoke uses); fresh randomness when absent",
    )
    args, rest = parser.parse_known_args(argv)
    names = args.target or sorted(TARGETS)
    if args.atheris:
        if len(names) != 1:
            parser.error("--atheris drives exactly one --target")
        try:
            import atheris  # type: ignore[import-not-found]  # optional, not a dependency
        except ImportError:
            print("atheris is not installed: pip install atheris", file=sys.stderr)
            return 2
        test = build(
            names[0], settings(FUZZ_SETTINGS, database=DirectoryBasedExampleDatabase(args.db))
        )
        seconds = max(1, int(args.minutes * 60))
        print(f"atheris: instrumented {instrument_vargather(atheris)} vargather functions")
        atheris.Setup(
            # Hypothesis needs hundreds of bytes for a non-trivial example: start long.
            [sys.argv[0], f"-max_total_time={seconds}", "-max_len=4096", "-len_control=0", *rest],
            test.hypothesis.fuzz_one_input,  # type: ignore[attr-defined]
        )
        atheris.Fuzz()
        return 0
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    started = time.monotonic()
    replayed, failures = replay_findings(names)
    counts, found = run_timed(names, args.minutes * 60, args.db, first_seed=args.seed)
    failures += found
    elapsed = time.monotonic() - started
    drawn = "fresh randomness" if args.seed is None else f"seeds {args.seed}, {args.seed + 1}, ..."
    lines = [f"fuzz_stages: {elapsed:.0f} s, database {args.db}, {drawn}"]
    lines.append(f"  stored findings replayed first (fuzz/findings.py): {replayed}")
    lines += [f"  {name}: {counts.get(name, 0)} examples" for name in names]
    lines.append(f"  total: {sum(counts.values())} examples, {len(failures)} failure(s)")
    lines += [f"FAILURE {failure}" for failure in failures]
    print("\n".join(lines))
    write_report(args.report, lines)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

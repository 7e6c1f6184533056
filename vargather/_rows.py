"""The all_to_all pattern's calls and rows: stages 1 and 3 of its collectives.

Where it sits: beneath the round (``_family``) and the collectives that ride it
(``_reduce_scatter``, ``_all_to_all``, ``_all_to_all_rows``, ``_gather_list``), above
the checks (``_args``), the wire (``_wire``) and the validation rules (``_exchange``,
whose helpers the collectives find here too). ``docs/architecture.md`` ("Adding a
collective to the round") says how a collective uses what is here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Generic, TypeVar

import torch

from ._args import CallRecord, Problem, check_call, parse_sizes, saturate
from ._collectives import COLLECTIVES, CollectiveName, by_code
from ._errors import ProtocolMismatchError, SizesError
from ._exchange import check_same_collective
from ._group import GroupInfo
from ._wire import ROW_MAGIC, decode_row, row_mark


@dataclass(frozen=True)
class FamilyCall:
    """One rank's call of a family collective, as every other rank will see it:
    ``extras``, while ``sizes`` (the parsed size vectors, ``None`` where absent or
    malformed) are for this rank's own use."""

    kind: CollectiveName
    record: CallRecord
    extras: tuple[int, ...]
    sizes: tuple[tuple[int, ...] | None, ...]
    timeout: timedelta | None


@dataclass(frozen=True)
class Row:
    """One rank's gathered metadata: its record and its extras."""

    record: CallRecord
    extras: tuple[int, ...]


def check_tensor(
    x: object,
    dim: object,
    *,
    info: GroupInfo,
    grad: object = "sum",
    validate: object = True,
    timeout: object = None,
    requires_grad: bool | None = None,
    split: bool = False,
) -> tuple[CallRecord, timedelta | None]:
    """``_args.check_call``'s record of ``x`` (no ``sizes``, ``transport="auto"``) and
    the parsed per-call timeout. ``requires_grad`` overrides what ``x`` says (the
    custom operators run below autograd and pass the caller's). A 0-d ``x`` is checked
    as its 1-element view and recorded with its own shape ``()``; with ``split`` (a
    collective that splits ``x`` along ``dim`` by sizes) it is a ``SizesError``."""
    scalar = isinstance(x, torch.Tensor) and x.ndim == 0 and x.layout == torch.strided
    probe = x.reshape(1) if isinstance(x, torch.Tensor) and scalar else x
    checked = check_call(
        probe,
        dim,
        sizes=None,
        grad=grad,
        transport="auto",
        info=info,
        validate=validate,
        timeout=timeout,
    )
    record = checked.record
    if scalar:
        record = replace(record, ndim=0, shape=(), normalized_dim=-1, dim=0)
        if isinstance(x, torch.Tensor):
            record = replace(record, requires_grad=x.requires_grad and torch.is_grad_enabled())
    if requires_grad is not None:
        record = replace(record, requires_grad=requires_grad)
    if split and record.ndim == 0:
        record = with_problem(
            record,
            Problem(SizesError, "expected a tensor with at least 1 dimension, got a 0-d tensor"),
        )
    return record, checked.timeout


def raise_own_problem(
    name: str, problem: Problem | None, info: GroupInfo, *, trusted: bool
) -> None:
    """Raise this rank's own ``problem`` (if any) where no exchange tells the peers: a
    world of one rank, or ``trusted`` (``validate=False`` with known sizes), when the
    message says the peers are left waiting."""
    if problem is None:
        return
    where = (
        " (validate=False: raised on this rank only; its peers wait in the payload "
        "collective until they time out)"
        if trusted and info.communicates
        else ""
    )
    raise problem.error(
        f"{name}{where}: invalid arguments on rank(s) [{info.rank}]: rank "
        f"{info.rank}: {problem.message}",
        ranks=[info.rank],
    )


def with_problem(record: CallRecord, problem: Problem | None) -> CallRecord:
    """``record`` with ``problem`` added, unless it already holds one (first wins)."""
    if problem is None or record.problem is not None:
        return record
    return replace(record, problem=problem)


def sizes_words(
    sizes: object, world_size: int
) -> tuple[tuple[int, ...] | Problem | None, list[int]]:
    """Caller sizes parsed, and their wire form: ``[len, n_0, ..., n_{W-1}]``, ``-1``
    for absent or malformed sizes (length ``-1``) and for missing entries; a longer
    vector's extra entries are dropped (its length says it was longer)."""
    if sizes is None:
        return None, [-1] * (1 + world_size)
    parsed = parse_sizes(sizes)
    if isinstance(parsed, Problem):
        return parsed, [-1] * (1 + world_size)
    words = [len(parsed)] + [saturate(n) for n in parsed[:world_size]]
    return parsed, words + [-1] * (1 + world_size - len(words))


def block_sizes_problem(
    parsed: tuple[int, ...] | Problem | None, w: int, cut: CallRecord | None, what: str = "sizes"
) -> Problem | None:
    """What is wrong with the argument ``what``, one block size per rank (``parsed`` by
    ``sizes_words``): malformed, not ``w`` long, or with ``cut`` (the record of the
    tensor they cut along its dim) absent or not adding up to its length; else ``None``."""
    if isinstance(parsed, Problem):
        return Problem(parsed.error, what.removesuffix("sizes") + parsed.message)
    if parsed is None:
        required = f"{what} is required: expected one block size per rank"
        return None if cut is None else Problem(SizesError, required)
    if len(parsed) != w:
        return Problem(SizesError, f"expected len({what}) == world size {w}, got {len(parsed)}")
    if cut is not None and cut.normalized_dim >= 0 and sum(parsed) != cut.size_along_dim:
        return Problem(
            SizesError,
            f"expected sum({what}) == {cut.size_along_dim} (the tensor's size along dim "
            f"{cut.normalized_dim}), got sum({what}) = {sum(parsed)} for {what}={list(parsed)}",
        )
    return None


def _check_kinds(kind: CollectiveName, marks: Sequence[tuple[int, int]]) -> None:
    """Raise ``ProtocolMismatchError`` unless every rank's row (``marks[r]``: its magic
    and kind code) is a ``kind`` call's: a row vargather cannot read names its rank; a
    peer calling another collective of the round is ``check_same_collective``'s."""
    kind_code = COLLECTIVES[kind].code
    if all(magic == ROW_MAGIC and code == kind_code for magic, code in marks):
        return
    for r, (magic, code) in enumerate(marks):
        found_kind = by_code(code)
        if magic != ROW_MAGIC or found_kind is None or found_kind.round != "all_to_all":
            raise ProtocolMismatchError(
                f"{kind}: rank {r} sent metadata of another collective or vargather "
                f"version: expected a {kind} call on every rank of the group",
                ranks=[r],
            )
    check_same_collective([code for _, code in marks])


def decode_rows(call: FamilyCall, raw: bytes, w: int) -> tuple[list[Row], tuple[int, ...]]:
    """Every rank's row and flag word from the received rows' bytes (``raw``, rank by
    rank); ``ProtocolMismatchError`` on every rank unless every rank called
    ``call.kind``."""
    values = memoryview(raw).cast("q").tolist()  # int64 words, native order as sent
    n = len(values) // w
    words = [values[r * n : (r + 1) * n] for r in range(w)]
    _check_kinds(call.kind, [row_mark(row) for row in words])
    out: list[Row] = []
    flags: list[int] = []
    for r, row in enumerate(words):
        record, extras, flag = decode_row(row, len(call.extras), w, rank=r)
        flags.append(flag)
        out.append(Row(record, extras))
    return out, tuple(flags)


def rows_changed_only_in(
    raw: bytes, last: bytes, w: int, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, ...]] | None:
    """Per rank, the words of its row in ``raw`` (the received rows' bytes,
    ``_round_buffers.landed_bytes``) at ``spans`` (first word and count, in order,
    apart), when every rank's row is its row in ``last`` but for those words; else
    ``None``. Rows equal but for a size vector and a dimension say everything ``last``
    said but those (the same kind, flags and record otherwise: no problem where it had
    none)."""
    if len(raw) != len(last) or len(raw) % w:
        return None
    n = len(raw) // w
    view = memoryview(raw)
    out: list[tuple[int, ...]] = []
    for j in range(w):
        at = prev = j * n
        words: list[int] = []
        for first, count in spans:
            lo, hi = at + 8 * first, at + 8 * (first + count)
            if hi > at + n or raw[prev:lo] != last[prev:lo]:
                return None
            words.extend(view[lo:hi].cast("q"))  # int64 words, native order as sent
            prev = hi
        if raw[prev : at + n] != last[prev : at + n]:
            return None
        out.append(tuple(words))
    return out


T = TypeVar("T")


class ValidatedOnce(Generic[T]):
    """A collective's ``validate_rows`` (a pure function of the rows and this rank),
    remembered for the very list of rows it last validated (``_read_rows`` returns the
    same list for the same bytes); an error is never remembered."""

    def __init__(self, validate: Callable[..., T]) -> None:
        self._validate = validate
        self._last: tuple[list[Row], int, T] | None = None

    def __call__(self, rows: list[Row], *, rank: int) -> T:
        last = self._last
        if last is not None and last[0] is rows and last[1] == rank:
            return last[2]
        result = self._validate(rows, rank=rank)
        self._last = (rows, rank, result)
        return result


def call_key(x: object, *args: object) -> tuple[object, ...] | None:
    """What this rank's call of a plain strided tensor ``x`` with ``args`` is a function
    of (``None`` for other calls): ``x``'s metadata (shape, strides, dtype, device,
    whether a gradient is wanted, its lazy bits) and each argument with its type (so
    ``validate=1`` is not ``True``), lists of ints as tuples: ``known_call``'s key."""
    if type(x) is not torch.Tensor or x.layout != torch.strided or x.is_nested:
        return None
    key: list[object] = [x.shape, x.stride(), x.dtype, x.device, x.is_conj(), x.is_neg()]
    key.append(x.requires_grad and torch.is_grad_enabled())
    for a in args:
        if type(a) in (list, tuple):
            assert isinstance(a, (list, tuple))  # for mypy: checked just above
            if not all(type(n) is int for n in a):
                return None
            key.append((type(a), tuple(a)))
        elif a is None or type(a) in (int, str, bool, float, timedelta):
            key.append((type(a), a))
        else:
            return None
    return tuple(key)

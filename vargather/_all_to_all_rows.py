"""``all_to_all_v``'s call as one row of the family's round, and every rank's rows
validated: stages 1 and 3 of ``_all_to_all``, the part a ``cat_dim`` changes.

Where it sits: above ``_family``, beneath ``_all_to_all``, which turns what these
functions return into its plan. This rank's call (``local_call``) is its record, its
send and receive sizes as words (``_rows.sizes_words``) and one word more: ``cat_dim``
normalized, ``dim``'s when ``None`` (``-1``: unusable, with its problem in the record).
What ``validate_rows`` checks is ``docs/family.md``'s table ("What is validated"); the
math is ``_all_to_all``'s module doc.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Final, NamedTuple

import torch

from ._args import CallRecord, Problem, as_index
from ._collectives import CollectiveName
from ._errors import ArgumentMismatchError, DimError, ShapeMismatchError, SizesMismatchError
from ._exchange import _disagreement, agree, common_checks, raise_local, requires_grad_check
from ._group import GroupInfo
from ._layout import Layout, blocks_layout
from ._rows import FamilyCall, Row, block_sizes_problem, check_tensor, sizes_words, with_problem

NAME: Final[CollectiveName] = "all_to_all_v"


def split_layout(
    shape: tuple[int, ...], dim: int, sizes: tuple[int, ...], dtype: torch.dtype, info: GroupInfo
) -> Layout:
    """The blocks along ``dim`` (normalized) of a tensor of ``shape`` as a ``Layout``
    (remembered for recent arguments: a ``Layout`` is immutable)."""
    return _split_layout(shape, dim % len(shape), sizes, dtype, info.rank, info.world_size)


_split_layout = functools.lru_cache(maxsize=64)(blocks_layout)
"""``blocks_layout``, remembered (``split_layout`` normalizes ``dim`` first)."""


def receive_layout(
    shape: tuple[int, ...],
    d: int,
    c: int,
    own: int,
    recv: tuple[int, ...],
    dtype: torch.dtype,
    info: GroupInfo,
) -> Layout:
    """The result of a rank whose ``x`` has ``shape``, cut into the blocks it received:
    along ``d`` by ``recv`` when ``c == d``; else ``shape`` with ``own`` (its send size
    to itself, every block's size along ``d``) along ``d`` and ``Σ recv`` along ``c``,
    cut along ``c`` by ``recv`` (the senders' sizes along ``c``)."""
    if c == d:
        return split_layout((*shape[:d], sum(recv), *shape[d + 1 :]), d, recv, dtype, info)
    out = list(shape)
    out[d], out[c] = own, sum(recv)
    return split_layout(tuple(out), c, recv, dtype, info)


def _cat_word(cat_dim: object, record: CallRecord) -> tuple[int, Problem | None]:
    """``cat_dim`` normalized (``dim``'s when ``None``; ``-1`` when unusable) and its
    problem, if any (the tensor's own problem, checked before, wins)."""
    if cat_dim is None:
        return record.normalized_dim, None
    c = as_index(cat_dim)
    if c is None:
        text = repr(cat_dim)
        return -1, Problem(
            DimError,
            f"expected cat_dim to be an int or None, got {type(cat_dim).__name__} "
            f"{text if len(text) <= 24 else text[:21] + '...'}",
        )
    n = record.ndim
    if n <= 0:
        return -1, None
    if not -n <= c < n:
        return -1, Problem(
            DimError,
            f"cat_dim={c} is out of range: expected -{n} <= cat_dim < {n} for a {n}-d tensor",
        )
    return c % n, None


def local_call(
    x: object,
    send_sizes: object,
    recv_sizes: object,
    dim: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
    requires_grad: bool | None,
    cat_dim: object = None,
) -> FamilyCall:
    record, call_timeout = check_tensor(
        x,
        dim,
        info=info,
        validate=validate,
        timeout=timeout,
        requires_grad=requires_grad,
        split=True,
    )
    w = info.world_size
    send, send_words = sizes_words(send_sizes, w)
    recv, recv_words = sizes_words(recv_sizes, w)
    cat, problem = _cat_word(cat_dim, record)
    problem = (
        problem
        or block_sizes_problem(send, w, record, "send_sizes")
        or block_sizes_problem(recv, w, None, "recv_sizes")
    )
    record = with_problem(record, problem)
    own_send = send if isinstance(send, tuple) else None
    own_recv = recv if isinstance(recv, tuple) else None
    return FamilyCall(
        NAME, record, (*send_words, *recv_words, cat), (own_send, own_recv), call_timeout
    )


class Validated(NamedTuple):
    """What a round's rows say once validated: the send matrix ``S`` (row ``j``: rank
    ``j``'s send sizes), the normalized ``cat_dim`` and, when it is not ``dim``, every
    rank's shape (its size along ``cat_dim`` and its bytes per row along ``dim``)."""

    matrix: tuple[tuple[int, ...], ...]
    cat: int
    shapes: tuple[tuple[int, ...], ...] | None


def validate_rows(rows: list[Row], *, rank: int) -> Validated:
    """The validated rows, or the error every rank raises alike (a pure function of
    ``rows``)."""
    records = [row.record for row in rows]
    w = len(rows)
    raise_local(NAME, records)
    checks = common_checks(records, dim=True, shape=None)
    cats = [row.extras[2 * w + 2] for row in rows]
    what = "concatenation dimension (cat_dim, normalized; dim when None)"
    checks.append((ArgumentMismatchError, what, list(cats), repr))
    d, c = records[0].normalized_dim, cats[0]
    if c == d:
        checks += common_checks(records, dim=False, shape="other")[-1:]
    else:
        lo, hi = min(c, d), max(c, d)
        others: list[object] = [
            r.shape[:lo] + r.shape[lo + 1 : hi] + r.shape[hi + 1 :] for r in records
        ]
        what = f"shape outside dim {d} and cat_dim {c}"
        checks.append((ShapeMismatchError, what, others, lambda s: str(s)))
    checks.append(requires_grad_check(records, "the backward of all_to_all_v is an all_to_all"))
    agree(NAME, checks)
    matrix = tuple(tuple(int(n) for n in row.extras[1 : 1 + w]) for row in rows)
    shapes = None if c == d else tuple(r.shape for r in records)
    for r in range(w) if shapes is not None else ():
        found = _disagreement(
            f"the size along dim {d} of the blocks rank {r} receives (send_sizes[{r}]; "
            f"cat_dim={c} joins them, so they must match)",
            [s[r] for s in matrix],
        )
        if found is not None:
            raise SizesMismatchError(f"{NAME}: {found[0]}", ranks=found[1])
    liars: list[int] = []
    for r, row in enumerate(rows):
        passed = row.extras[1 + w : 2 + 2 * w]
        if passed[0] >= 0 and tuple(passed[1 : 1 + w]) != received(matrix, shapes, c, r):
            liars.append(r)
    if liars:
        what = (
            f"column r of the send matrix {[list(s) for s in matrix]}"
            if shapes is None
            else f"every rank's size along cat_dim {c}"
        )
        got = "; ".join(
            f"rank {r}: expected recv_sizes={list(received(matrix, shapes, c, r))}, got "
            f"recv_sizes={list(rows[r].extras[2 + w : 2 + 2 * w])}"
            for r in liars
        )
        raise SizesMismatchError(
            f"{NAME}: recv_sizes passed on rank(s) {liars} contradict the send sizes of the "
            f"other ranks (rank r receives {what}): {got}",
            ranks=liars,
        )
    return Validated(matrix, c, shapes)


def received(
    matrix: tuple[tuple[int, ...], ...], shapes: tuple[tuple[int, ...], ...] | None, c: int, r: int
) -> tuple[int, ...]:
    """Rank ``r``'s receive sizes: column ``r`` of the send matrix, or with ``cat_dim``
    another dim, every rank's size along it."""
    if shapes is None:
        return tuple(s[r] for s in matrix)
    return tuple(s[c] for s in shapes)


def row_bytes(shape: Sequence[int], d: int, itemsize: int) -> int:
    """Bytes of one row along ``d`` of a tensor of ``shape``."""
    return itemsize * math.prod(int(n) for i, n in enumerate(shape) if i != d)

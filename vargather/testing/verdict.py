"""The gate's verdict rules: how a property's run becomes its row's status.

Where it sits: in the gate's engine, beneath ``engine``, which applies these rules to
every row it runs: the xfails file, a dtype the backend refuses split into its own row
(``unsupported`` when only the backend's refusal failed it), and the hint beside a
failure that a declared-scope option would explain (a note, never a status).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from .properties import Property
from .results import PropertyResult


def with_xfail(result: PropertyResult, xfails: frozenset[str]) -> PropertyResult:
    """Apply the xfails file: ``PROPERTY`` covers the row and its ``PROPERTY:DTYPE``
    rows; ``PROPERTY:DTYPE`` that one row only."""
    listed = result.id in xfails or result.id.partition(":")[0] in xfails
    if not listed or result.status not in ("pass", "fail"):
        return result
    if result.status == "fail":
        return dataclasses.replace(result, status="xfail")
    return dataclasses.replace(
        result, status="xpass", reason="listed in the xfails file, but it held"
    )


def split_rows(
    rows: Sequence[Property], refused: Sequence[str], xfails: frozenset[str] = frozenset()
) -> list[tuple[str, Property]]:
    """Each row as (id, property): a row whose dtypes the backend refuses (or that the
    xfails file names as ``PROPERTY:DTYPE``) runs without them, and each such dtype runs
    as its own row ``PROPERTY:DTYPE``."""
    out: list[tuple[str, Property]] = []
    for row in rows:
        raw = row.kwargs.get("dtypes")
        dtypes: tuple[str, ...] = tuple(raw) if isinstance(raw, tuple) else ()
        bad = [d for d in dtypes if d in refused or f"{row.id}:{d}" in xfails]
        if not bad or row.out_of_scope is not None:
            out.append((row.id, row))
            continue
        rest = tuple(d for d in dtypes if d not in refused)
        if rest:
            out.append((row.id, dataclasses.replace(row, kwargs={**row.kwargs, "dtypes": rest})))
        for d in bad:
            one = dataclasses.replace(
                row, title=f"{row.title} [{d} only]", kwargs={**row.kwargs, "dtypes": (d,)}
            )
            out.append((f"{row.id}:{d}", one))
    return out


_BACKEND_MARKS: Final = (
    "gloo",
    "Gloo",
    "NCCL",
    "nccl",
    "distributed_c10d",
    "Unsupported",
    "Invalid scalar type",  # gloo's refusal, as the family's one-line messages quote it
)
UNSUPPORTED_EXAMPLES: Final = 10
"""Examples of a ``PROPERTY:DTYPE`` row for a dtype the backend refuses."""


def with_unsupported(result: PropertyResult, dtype: str) -> PropertyResult:
    """A ``PROPERTY:DTYPE`` row that failed only because the backend refused the dtype
    (the implementation raised from the backend) becomes ``unsupported``."""
    f = result.failure
    if result.status != "fail" or f is None or f.kind != "error":
        return result
    # raised: the family's aspect of an error
    if f.aspect not in ("call", "raised") or not any(m in f.message for m in _BACKEND_MARKS):
        return result
    return dataclasses.replace(
        result,
        status="unsupported",
        reason=f"the backend refuses {dtype}; the implementation hands it to the backend",
    )


_NOT_INITIALIZED: Final = ("not been initialized", "not initialized", "init_process_group")


def _hint_for(result: PropertyResult, by_id: dict[str, PropertyResult]) -> str | None:
    """The scope option that would explain ``result``'s failure, or ``None``."""
    f = result.failure
    if f is None or result.status != "fail":
        return None
    row = result.id.partition(":")[0]
    message = f.message
    if row == "sizes-list" and by_id.get("sizes-tensor", result).status == "pass":
        return (
            "sizes-list fails while sizes-tensor passes: if your callers pass sizes as a "
            "tensor (the seed's convention), declare that scope with --sizes tensor "
            "(sizes-list is then out of scope)"
        )
    if row == "uninitialized" and f.kind == "error" and any(m in message for m in _NOT_INITIALIZED):
        return (
            "it raised because torch.distributed is not initialized: if it needs an "
            "initialized process group, declare --requires-init (the row is then out of scope)"
        )
    if row == "one-rank" and f.kind == "error" and "AssertionError" in message:
        return (
            "it asserts in a world of one rank: if it needs at least two ranks, run "
            "--world-sizes 2,3,4"
        )
    no_gradient = ("out.requires_grad=False", "x.grad=NoneType", "does not require grad")
    if f.aspect == "gradient" and any(m in message for m in no_gradient):
        return (
            "no gradient at all reached the input: if it is not differentiable, declare "
            "--grad none (the gradient rows are then out of scope)"
        )
    dim = (f.case or {}).get("dim")
    if f.kind == "error" and isinstance(dim, int) and dim != 0:
        return (
            f"the minimal failing case raised along dim={dim} (Hypothesis found no failure "
            "along dim 0, toward which it shrinks): if it supports dim 0 only, declare --dims 0"
        )
    return None


def scope_hints(results: Sequence[PropertyResult]) -> list[PropertyResult]:
    """``results``, each failure that a declared-scope option would explain noted with
    that option (``PropertyResult.hint``); statuses unchanged."""
    by_id = {r.id: r for r in results}
    return [dataclasses.replace(r, hint=_hint_for(r, by_id) or r.hint) for r in results]

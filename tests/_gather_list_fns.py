"""Rank-side functions of all_gather_list's round tests (module-level, so they pickle)."""

from __future__ import annotations

from typing import Any

import torch

import vargather
from vargather._comm import collectives_issued

PART_CASES = (
    "special",
    "transposed",
    "transposed_reshaped",
    "conj",
    "bool",
    "zero_dim",
    "empty",
    "wide",
    "wide_transposed",
)
"""The inputs ``carrier_parts`` gathers, in order: special float values (NaN payloads,
-0.0, inf); a transposed (strided) view, then one of another shape with the same
number of elements (the round's slot views are cut per shape); a lazily conjugated
complex view; bool; 0-d; empty; past 128 KiB per rank (the wide round), contiguous and
transposed."""


def part_input(case: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input of ``case`` (``PART_CASES``), the same in every process."""
    g = torch.Generator().manual_seed(1009 * rank + len(case))
    if case == "special":
        x = torch.randint(-99, 99, (rank + 2, 3), generator=g).to(torch.float32) / 4
        flat = x.view(-1)
        flat[0] = -0.0
        flat[1] = float("inf")
        flat[2:3].view(torch.int32).fill_(0x7FC01234 + rank)  # a NaN with a payload
        return x
    if case == "transposed":
        return torch.randint(-99, 99, (2, 6 + rank), generator=g).to(torch.float64).t()
    if case == "transposed_reshaped":  # as many elements as "transposed", another shape
        return torch.randint(-99, 99, (6 + rank, 2), generator=g).to(torch.float64).t()
    if case == "conj":
        z = torch.randn(rank + 1, 3, dtype=torch.complex64, generator=g)
        return z.conj()
    if case == "bool":
        return torch.randint(0, 2, (3, rank + 1), generator=g).bool()
    if case == "zero_dim":
        return torch.tensor(float(rank) - 0.5)
    if case == "empty":
        return torch.empty(0, rank + 1)
    rows = 600 + 150 * rank  # 128 columns of float32: 300-450 KiB per rank
    x = torch.randint(-999, 999, (rows, 128), generator=g).to(torch.float32)
    return x if case == "wide" else x.t().contiguous().t()


def carrier_parts(ctx: Any, _: None) -> list[tuple[str, int, int, list[torch.Tensor]]]:
    """Each of ``PART_CASES`` gathered twice on a fresh round state: per call its case,
    the collectives it issued, how many carriers it made (``_gather_list._carrier``,
    counted) and its result."""
    from vargather import _gather_list, _round_state

    _round_state.reset_state(None, "all_gather_list")
    made = [0]
    original = _gather_list._carrier

    def counted(x: torch.Tensor, words: Any) -> torch.Tensor:
        made[0] += 1
        return original(x, words)

    _gather_list._carrier = counted  # type: ignore[assignment]  # a counting stand-in
    out = []
    try:
        for case in PART_CASES:
            x = part_input(case, ctx.rank)
            for _ in range(2):
                before, made[0] = collectives_issued(), 0
                got = vargather.all_gather_list(x)
                out.append((case, collectives_issued() - before, made[0], got))
    finally:
        _gather_list._carrier = original  # type: ignore[assignment]
    return out

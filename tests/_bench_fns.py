"""Module-level rank functions for tests/test_cli_bench.py: the bench's coalesced cell
with a stand-in ``all_gather_v_coalesced`` (right, wrong, or none at all), and its
family cell with wrong stand-ins for the family collectives.

The pool pickles ``fn`` by reference, so these live at module level in a module the rank
processes can import. Each installs its stand-in in the rank process only, runs the
bench's own rank function, and puts back what was there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import vargather
from vargather._cli.bench import _ranks
from vargather.testing import RankContext

_MISSING = object()


def _stub(
    tensors: Sequence[torch.Tensor],
    dim: int | Sequence[int] = 0,
    *,
    sizes: Sequence[Any] | None = None,
    validate: bool = True,
    **_: Any,
) -> list[torch.Tensor]:
    """A stand-in with the coalesced API's signature: one all_gather_v per tensor."""
    per = sizes if sizes is not None else [None] * len(tensors)
    return [
        vargather.all_gather_v(t, 0, sizes=s, validate=validate)
        for t, s in zip(tensors, per, strict=True)
    ]


def _swapped(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    """A wrong stand-in: right tensors, the first two in the wrong order."""
    out = _stub(tensors, *args, **kwargs)
    return [out[1], out[0], *out[2:]]


def _with(fn: Callable[..., Any] | None, ctx: RankContext, job: Any) -> dict[str, Any] | None:
    saved = getattr(vargather, "all_gather_v_coalesced", _MISSING)
    try:
        if fn is None:
            if saved is not _MISSING:
                delattr(vargather, "all_gather_v_coalesced")
        else:
            vargather.all_gather_v_coalesced = fn  # type: ignore[attr-defined]  # the stand-in
        return _ranks._rank_coalesced(ctx, job)
    finally:
        if saved is _MISSING:
            if hasattr(vargather, "all_gather_v_coalesced"):
                delattr(vargather, "all_gather_v_coalesced")
        else:
            vargather.all_gather_v_coalesced = saved  # type: ignore[attr-defined]  # put back


def coalesced_with_stub(ctx: RankContext, job: Any) -> dict[str, Any] | None:
    return _with(_stub, ctx, job)


def coalesced_with_wrong_stub(ctx: RankContext, job: Any) -> dict[str, Any] | None:
    return _with(_swapped, ctx, job)


def coalesced_without(ctx: RankContext, job: Any) -> dict[str, Any] | None:
    return _with(None, ctx, job)


# --- the family cell with wrong stand-ins ---------------------------------------------

_FAMILY = ("reduce_scatter_v", "all_to_all_v", "all_gather_list", "gather_v", "scatter_v")


def _off_by_one(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``'s result with one element changed (a list: its first tensor's)."""

    def wrong(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        first = out[0] if isinstance(out, list) else out
        first = first.clone()
        if first.numel():
            first.view(-1)[-1] += 1
        return [first, *out[1:]] if isinstance(out, list) else first

    return wrong


def family_with_wrong_stand_ins(ctx: RankContext, job: Any) -> dict[str, Any] | None:
    """The bench's family cell with every family collective off by one element (the
    baselines, all_gather_v included, untouched)."""
    saved = {name: getattr(vargather, name) for name in _FAMILY}
    try:
        for name, fn in saved.items():
            setattr(vargather, name, _off_by_one(fn))
        return _ranks._rank_family(ctx, job)
    finally:
        for name, fn in saved.items():
            setattr(vargather, name, fn)


def own_states_kept_apart(ctx: Any, rows: int) -> dict[str, Any]:
    """Two call patterns on the default group, each through the bench's ``own_state``,
    interleaved: a fixed size past the gather round, and one rank's size growing every
    call (its slots grow and carry slack). Returns the fixed pattern's slots and needs,
    and whether the group's own state is what it was before."""
    from vargather import _round_state
    from vargather._cli.bench._variants import own_state

    w = ctx.world_size
    before = _round_state.state_of(None)
    x = torch.ones(rows + ctx.rank, 1)
    want = torch.cat([torch.ones(rows + r, 1) for r in range(w)])
    fixed = own_state(lambda _: (vargather.all_gather_v(x), _round_state.state_of(None)))
    grows = own_state(lambda i: vargather.all_gather_v(torch.ones(rows + ctx.rank + 64 * i, 1)))
    slots: list[int] = []
    for i in range(6):
        out, state = fixed(i)
        assert torch.equal(out, want)
        slots = list(state.wide)
        grows(i)
    return {
        "needs": [4 * (rows + r) for r in range(w)],
        "fixed_wide": slots,
        "untouched": _round_state.state_of(None) == before,
    }

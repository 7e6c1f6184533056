"""Fault-injection rank functions for tests/test_faults.py and tests/test_misuse.py:
a rank that never arrives, dies mid-call, or reads vargather's internals.

The calls themselves are described with the kit's misuse catalogue
(``vargather.testing.misuse``); these functions reach into private modules to inject
faults, so they stay with the tests.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

import vargather
from vargather.testing.misuse import CallOutput, Scenario, build_x, run_call, upstream_for


def skip_call_on(ctx: Any, job: tuple[int, Scenario]) -> CallOutput | None:
    """Every rank but ``job[0]`` makes its call; ``job[0]`` never arrives."""
    absent, scenario = job
    if ctx.rank == absent:
        return None
    return run_call(ctx, scenario)


def skip_a_wide_call_on(ctx: Any, job: tuple[int, float | None]) -> object:
    """Every rank gathers 256 KiB twice (the group goes wide: its next round is the
    wide round's direct sends), then every rank but ``job[0]`` calls again under the
    call timeout ``job[1]``; ``job[0]`` never arrives. Returns the wide slots seen
    before that call (on the rank that skips it)."""
    absent, timeout = job
    x = torch.full((64 * 1024 + 16 * ctx.rank,), float(ctx.rank))
    for _ in range(2):
        vargather.all_gather_v(x)
    from vargather import _round_state

    wide = _round_state.state_of(None).wide
    if ctx.rank == absent:
        return wide
    return vargather.all_gather_v(x, timeout=timeout)


def layout_only_on(ctx: Any, job: tuple[int, Scenario]) -> object:
    """Rank ``job[0]`` runs only the metadata exchange (``gather_layout``) and leaves:
    its peers wait for it in the payload collective."""
    absent, scenario = job
    if ctx.rank != absent:
        return run_call(ctx, scenario)
    call = scenario.calls[ctx.rank]
    x = build_x(call.x, ctx.rank)
    assert isinstance(x, torch.Tensor)
    return vargather.gather_layout(x, call.get("dim")).sizes


def kill_between_exchange_and_payload(ctx: Any, job: tuple[int, Scenario]) -> object:
    """Rank ``job[0]`` is SIGKILLed inside its call, after the metadata exchange and
    before the payload collective (its peers are already waiting there)."""
    victim, scenario = job
    if ctx.rank == victim:
        import vargather._gather as api

        def die(*args: object, **kwargs: object) -> object:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # not reached
            raise AssertionError("unreachable")

        api.choose_transport = die  # type: ignore[assignment]  # the fault injected
    # Keep the payload out of the fused round on every rank, so that there is a
    # payload collective to be killed before (with it, a small gather is one collective).
    import vargather._fused as fused

    fused.FUSED_MAX_BYTES = 0  # type: ignore[misc]  # this world is killed and rebuilt after
    return run_call(ctx, scenario)


def backward_on_one_rank(ctx: Any, job: tuple[int, Scenario]) -> object:
    """Every rank gathers (grad="sum"); only rank ``job[0]`` calls backward, whose
    reduce-scatter the others never join."""
    lone, scenario = job
    call = scenario.calls[ctx.rank]
    x = build_x(call.x, ctx.rank)
    assert isinstance(x, torch.Tensor)
    out = vargather.all_gather_v(x, call.get("dim"), grad="sum", timeout=call.get("timeout"))
    if ctx.rank == lone:
        out.backward(upstream_for(out.shape, "float64", ctx.rank))
    return tuple(out.shape)


def group_timeout_seconds(ctx: Any, payload: object) -> float | None:
    """The world group's current timeout, as vargather reads it."""
    from vargather._group import group_timeout, resolve_group

    t = group_timeout(resolve_group(None))
    return None if t is None else t.total_seconds()


def run_with_group_object(ctx: Any, group: object) -> object:
    """Pass ``group`` (not a process group) as the group, on every rank."""
    return vargather.all_gather_v(torch.zeros(2), group=group)  # type: ignore[arg-type]  # the misuse


def metadata_device(ctx: Any, payload: object) -> str:
    """The device the metadata exchange uses in this world."""
    from vargather._group import resolve_group

    return resolve_group(None).default_device().type


def destroyed_subgroup(ctx: Any, x_shape: tuple[int, ...]) -> object:
    """Create a subgroup of every rank, destroy it, then pass it to all_gather_v."""
    group = dist.new_group(list(range(ctx.world_size)))
    dist.barrier(group=group)  # every rank is connected before any rank tears it down
    dist.destroy_process_group(group)
    dist.barrier()  # and every rank has torn it down before any uses it
    return vargather.all_gather_v(torch.zeros(x_shape), group=group)

"""The bench's rank programs: one cell of one part on one rank of a pool world.

Where it sits: called by the parent (``vargather._cli.bench.main``) through the kit's
``RankPool``, one pool call per cell; builds the variants (``_variants``), measures them
(``_meter``) and returns rank 0's record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from vargather.testing import RankContext
from ._config import (
    CHANGING_VARIANT,
    FAMILY_CHANGING_VARIANT,
    FAMILY_COLUMNS,
    FLOOR_VARIANT,
    FORCED_VARIANT,
    KNOWN_SIZES_VARIANT,
    PEER_COLUMNS,
    ROW_ELEMENTS,
    BenchConfig,
    _wanted,
    floor_ratio,
    large_repeats,
    malloc_environment,
    profile_shares,
    split_rows,
)
from ._meter import _all_true, _measure, _measure_bursts, _measure_memory, spread
from ._variants import (
    FAMILY_BASELINES,
    _backward_variants,
    _Burst,
    _Cell,
    _coalesced_shards,
    _flat_expected,
    _flat_shard,
    _forward_variants,
    _same,
    _selected,
    changing_sizes,
    changing_step,
    coalesced_row_bytes,
    family_groups,
    family_same,
    own_group,
    own_state,
    peer_gathers,
    peer_shard,
)


def _rank_cell(ctx: RankContext, job: tuple[BenchConfig, float, str, str]) -> dict[str, Any] | None:
    """Rank function of the large part: measure one (payload, profile) cell on this
    world, its times (``mode="time"``) or its peak memory (``mode="memory"``); rank 0
    returns the cell's record, the others ``None``."""
    import torch

    from vargather import Layout
    from vargather.internal import auto_transport_name

    torch.set_num_threads(1)
    cfg, mb, profile, mode = job
    rank, world_size = ctx.rank, ctx.world_size
    # a multiple of W, so the even profile is exactly even
    total = world_size * max(1, round(mb * 1e6 / (ROW_ELEMENTS * 4 * world_size)))
    shares = profile_shares(profile, world_size)
    sizes = split_rows(total, shares)
    offsets = [sum(sizes[:r]) for r in range(world_size)]
    cell = _Cell(rank, world_size, sizes, offsets, total, total // world_size)
    layout = Layout(
        sizes=tuple(sizes),
        dim=0,
        leading_shape=(),
        trailing_shape=(ROW_ELEMENTS,),
        dtype=torch.float32,
        rank=rank,
        world_size=world_size,
    )
    repeats = large_repeats(cfg.repeats, mb)
    if mode == "memory":
        forward = _measure_memory(_selected(_forward_variants(cell), cfg))
        backward = _measure_memory(_selected(_backward_variants(cell), cfg))
    else:
        forward = _measure(_selected(_forward_variants(cell), cfg), cfg, repeats)
        backward = _measure(_selected(_backward_variants(cell), cfg), cfg, repeats)
    if rank != 0:
        return None
    return {
        "world_size": world_size,
        "payload_mb": mb,
        "profile": profile,
        "shares": list(shares),
        "rows": sizes,
        "row_bytes": ROW_ELEMENTS * 4,
        "output_bytes": total * ROW_ELEMENTS * 4,
        "limit_bytes": cell.eq_rows * world_size * ROW_ELEMENTS * 4,
        "floor": floor_ratio(shares),
        "repeats": repeats,
        "auto_transport": auto_transport_name(layout, "gloo"),
        "malloc_env": malloc_environment(),
        "forward": forward,
        "backward": backward,
    }


def _rank_small(ctx: RankContext, job: tuple[BenchConfig, float]) -> dict[str, Any] | None:
    """Rank function of the small part: one total (KiB) on this world; rank 0 returns
    the record."""
    import torch
    import torch.distributed as dist

    import vargather
    from vargather import Layout
    from vargather.internal import auto_transport_name
    from vargather.testing.reference_seed import all_gather_variable_dim

    torch.set_num_threads(1)
    cfg, kb = job
    rank, w = ctx.rank, ctx.world_size
    total = w * max(1, round(kb * 1024 / (4 * w)))  # float32 elements, a multiple of W
    shares = profile_shares(cfg.small_profile, w)
    sizes = split_rows(total, shares)
    step = changing_step(total, w)
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    layout = Layout(
        sizes=tuple(sizes),
        dim=0,
        leading_shape=(),
        trailing_shape=(),
        dtype=torch.float32,
        rank=rank,
        world_size=w,
    )
    forced = auto_transport_name(layout, "gloo")
    x = _flat_shard(rank, sizes[rank])
    eq_x = _flat_shard(rank, total // w)
    eq_want = _flat_expected([total // w] * w)
    want = _flat_expected(sizes)
    phases = [changing_sizes(sizes, step, i) for i in range(w)]  # the sizes repeat every W
    phase_x = [_flat_shard(rank, p[rank]) for p in phases]
    phase_want = [_flat_expected(p) for p in phases]

    def limit(_: int) -> torch.Tensor:
        out = eq_x.new_empty((total,))
        gather_single(out, eq_x)
        return out

    offsets = [sum(sizes[:r]) for r in range(w)]
    peers = [(rank + k) % w for k in range(1, w)]

    def floor(_: int) -> torch.Tensor:
        out = x.new_empty((total,))
        ops = [
            dist.P2POp(dist.irecv, out[offsets[q] : offsets[q] + sizes[q]], peer=q)
            for q in peers
            if sizes[q]
        ]
        if sizes[rank]:
            ops += [dist.P2POp(dist.isend, x, peer=q) for q in peers]
        out[offsets[rank] : offsets[rank] + sizes[rank]].copy_(x)
        for work in dist.batch_isend_irecv(ops) if ops else ():
            work.wait()
        return out

    def same(expected: torch.Tensor) -> Callable[[int, Any], bool]:
        return lambda _, out: _same(out, expected)

    variants = [
        _Burst("limit", limit, same(eq_want)),
        _Burst(FLOOR_VARIANT, floor, same(want)),
        _Burst("vargather:auto", own_state(lambda _: vargather.all_gather_v(x)), same(want)),
        _Burst(
            CHANGING_VARIANT,
            own_state(lambda i: vargather.all_gather_v(phase_x[i % w])),
            lambda i, out: _same(out, phase_want[i % w]),
        ),
        _Burst(
            KNOWN_SIZES_VARIANT,
            lambda _: vargather.all_gather_v(x, sizes=sizes, validate=False),
            same(want),
        ),
        _Burst(
            FORCED_VARIANT,
            lambda _: vargather.all_gather_v(x, transport=forced, group=own_group(FORCED_VARIANT)),  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES
            same(want),
        ),
        _Burst("seed", lambda _: all_gather_variable_dim(x, 0)[0], same(want)),
    ]
    variants = [v for v in variants if v.name == "limit" or _wanted(v.name, cfg)]
    results = _measure_bursts(variants, cfg.small_repeats, cfg.calls, max(cfg.warmup, w))
    if rank != 0:
        return None
    return {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.small_profile,
        "sizes": sizes,
        "changing_step": step,
        "element_bytes": 4,
        "output_bytes": total * 4,
        "limit_bytes": total * 4,
        "forced_transport": forced,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
        "forward": results,
    }


def _rank_coalesced(ctx: RankContext, job: tuple[BenchConfig, float]) -> dict[str, Any] | None:
    """Rank function of the coalesced part: one total (KiB) on this world; rank 0 returns
    the record, which says ``skipped`` when this vargather has no
    ``all_gather_v_coalesced`` (every rank sees the same module)."""
    import torch
    import torch.distributed as dist

    import vargather

    torch.set_num_threads(1)
    cfg, kb = job
    rank, w = ctx.rank, ctx.world_size
    row_bytes = coalesced_row_bytes()
    total = w * max(1, round(kb * 1024 / (row_bytes * w)))  # rows, a multiple of W
    sizes = split_rows(total, profile_shares(cfg.small_profile, w))
    record: dict[str, Any] = {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.small_profile,
        "sizes": sizes,
        "row_bytes": row_bytes,
        "dtypes": ["int64", "float32", "bool"],
        "output_bytes": total * row_bytes,
        "limit_bytes": total * row_bytes,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
    }
    coalesced = getattr(vargather, "all_gather_v_coalesced", None)
    if coalesced is None:
        record["skipped"] = (
            f"vargather {vargather.__version__} has no all_gather_v_coalesced: not measured"
        )
        return record if rank == 0 else None
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    mine = _coalesced_shards(rank, sizes[rank])
    every = [_coalesced_shards(r, n) for r, n in enumerate(sizes)]
    want = [torch.cat([shards[k] for shards in every]) for k in range(3)]
    eq_x = torch.zeros(total // w * row_bytes, dtype=torch.uint8)
    eq_x[: min(eq_x.numel(), 251)] = torch.arange(min(eq_x.numel(), 251), dtype=torch.uint8)
    eq_want = eq_x.repeat(w)
    every_sizes = [sizes] * 3

    def limit(_: int) -> torch.Tensor:
        out = eq_x.new_empty((total * row_bytes,))
        gather_single(out, eq_x)
        return out

    def same_list(_: int, outs: Any) -> bool:
        return len(outs) == 3 and all(_same(o, e) for o, e in zip(outs, want, strict=True))

    variants = [
        _Burst("limit", limit, lambda _, out: _same(out, eq_want)),
        _Burst("coalesced", lambda _: coalesced(mine), same_list),
        _Burst(
            "coalesced+sizes",
            lambda _: coalesced(mine, sizes=every_sizes, validate=False),
            same_list,
        ),
        _Burst("separate", lambda _: [vargather.all_gather_v(t) for t in mine], same_list),
    ]
    variants = [v for v in variants if v.name == "limit" or _wanted(v.name, cfg)]
    record["forward"] = _measure_bursts(variants, cfg.small_repeats, cfg.calls, max(cfg.warmup, 1))
    return record if rank == 0 else None


def _speedups(results: dict[str, dict[str, Any]], peers: Sequence[str]) -> dict[str, Any] | None:
    """Per repeat, the fastest peer's time over vargather's (a speed-up: higher is
    better); its median, quartiles and range over the repeats."""
    mine = results["vargather:auto"]["times_s"]
    ups = [
        min(results[p]["times_s"][k] for p in peers) / mine[k] for k in range(len(mine)) if peers
    ]
    if not ups:
        return None
    return spread(ups)


def _rank_peers(ctx: RankContext, job: tuple[BenchConfig, float]) -> dict[str, Any] | None:
    """Rank function of the peers part: one total (KiB) on this world, ``PEER_COLUMNS``
    float32 columns, rows split by the peers profile; rank 0 returns the record. Every
    peer's first call is checked equal to vargather's output (itself checked against
    ``cat`` of the shards) before anything is timed."""
    import torch
    import torch.distributed as dist

    import vargather

    torch.set_num_threads(1)
    cfg, kb = job
    rank, w = ctx.rank, ctx.world_size
    cols = PEER_COLUMNS
    total = w * max(1, round(kb * 1024 / (4 * cols * w)))  # rows, a multiple of W
    sizes = split_rows(total, profile_shares(cfg.peer_profile, w))
    x = peer_shard(rank, sizes[rank], cols)
    want = torch.cat([peer_shard(r, n, cols) for r, n in enumerate(sizes)])
    eq_x = peer_shard(rank, total // w, cols)
    eq_want = torch.cat([peer_shard(r, total // w, cols) for r in range(w)])
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reference = vargather.all_gather_v(x)
    agreed = _all_true(_same(reference, want))

    def limit(_: int) -> torch.Tensor:
        out = eq_x.new_empty((total, cols))
        gather_single(out, eq_x)
        return out

    def same(expected: torch.Tensor) -> Callable[[int, Any], bool]:
        return lambda _, out: _same(out, expected)

    variants = [
        _Burst("limit", limit, same(eq_want)),
        _Burst("vargather:auto", lambda _: vargather.all_gather_v(x), same(want)),
    ]
    notes: dict[str, str] = {}
    for name, fn in peer_gathers().items():
        if isinstance(fn, str):
            notes[name] = fn
            continue
        first = _all_true(_same(fn(x), reference))  # checked before it is timed
        variants.append(_Burst(name, (lambda f: lambda _: f(x))(fn), same(reference)))
        if not first:
            notes[name] = "its first result differed from vargather's"
    variants = [
        v for v in variants if v.name in ("limit", "vargather:auto") or _wanted(v.name, cfg)
    ]
    results = _measure_bursts(variants, cfg.small_repeats, cfg.calls, max(cfg.warmup, w))
    results["vargather:auto"]["verified"] &= agreed
    for name in notes:
        if name in results:
            results[name]["verified"] = False
    peers = [v.name for v in variants if v.name not in ("limit", "vargather:auto")]
    if rank != 0:
        return None
    return {
        "world_size": w,
        "payload_kb": kb,
        "profile": cfg.peer_profile,
        "sizes": sizes,
        "columns": cols,
        "element_bytes": 4,
        "output_bytes": total * cols * 4,
        "limit_bytes": total * cols * 4,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
        "notes": notes,
        "forward": results,
        "speedup_vs_fastest_peer": _speedups(results, peers),
    }


def _paired(results: dict[str, dict[str, Any]], name: str, baseline: str) -> dict[str, Any]:
    """Per burst, ``name``'s time over ``baseline``'s in the same repeat: its median,
    quartiles and range."""
    mine, base = results[name]["times_s"], results[baseline]["times_s"]
    return spread([t / b for t, b in zip(mine, base, strict=True)])


def _issued_per_call(call: Callable[[int], Any]) -> int | None:
    """Collectives one steady-state call enters (``vargather.internal.collectives_issued``);
    every rank makes the call."""
    from vargather.internal import collectives_issued as count

    before = count()
    call(0)
    return int(count() - before)


def _rank_family(ctx: RankContext, job: tuple[BenchConfig, float, str]) -> dict[str, Any] | None:
    """Rank function of the family part: one (total KiB, profile) on this world, rows of
    ``FAMILY_COLUMNS`` float32. Per collective (``_variants.family_groups``) its baseline
    and vargather's validated and known-sizes calls (``all_to_all_v``'s validated calls
    with sizes changing every call too), timed in the same rotated bursts;
    each vargather call's first result is checked equal to the reference (a collective
    with the same splits) before anything is timed. Rank 0 returns the record."""
    import torch

    torch.set_num_threads(1)
    cfg, kb, profile = job
    rank, w = ctx.rank, ctx.world_size
    shares = profile_shares(profile, w)
    collectives: dict[str, Any] = {}
    for group in family_groups(rank, w, kb, shares, FAMILY_COLUMNS):
        notes: dict[str, str] = {}
        via = "all_gather_v" if group.collective == "all_gather_list" else "torch.distributed"
        for burst in group.bursts:
            if not burst.name.startswith("vargather"):
                continue
            reference = group.references.get(burst.name, group.reference)
            first = _all_true(family_same(burst.call(0), reference))  # every rank
            if not first:
                notes[burst.name] = (
                    f"its first result differed from the reference (the same splits through {via})"
                )
        results = _measure_bursts(group.bursts, cfg.small_repeats, cfg.calls, max(cfg.warmup, w))
        for name in notes:
            results[name]["verified"] = False
        for burst in group.bursts:
            if burst.name != "limit" or group.collective == "all_gather_list":
                results[burst.name]["collectives_per_call"] = _issued_per_call(burst.call)
        collectives[group.collective] = {
            "baseline": FAMILY_BASELINES[group.collective],
            "known_baseline": (
                FAMILY_BASELINES[group.collective]
                if group.known_baseline == "limit"
                else group.known_baseline
            ),
            **group.shapes,
            "notes": notes,
            "forward": results,
            "ratios": {
                "unknown": _paired(results, "vargather", "limit"),
                "known": _paired(results, "vargather+sizes", group.known_baseline),
                **(
                    {"changing": _paired(results, FAMILY_CHANGING_VARIANT, "limit")}
                    if FAMILY_CHANGING_VARIANT in results
                    else {}
                ),
                **(
                    {"direct": _paired(results, "vargather", "direct")}
                    if "direct" in results
                    else {}
                ),
            },
        }
    if rank != 0:
        return None
    return {
        "world_size": w,
        "payload_kb": kb,
        "profile": profile,
        "shares": list(shares),
        "columns": FAMILY_COLUMNS,
        "element_bytes": 4,
        "calls_per_burst": cfg.calls,
        "malloc_env": malloc_environment(),
        "collectives": collectives,
    }

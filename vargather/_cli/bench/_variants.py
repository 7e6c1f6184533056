"""The bench's variants: the shards, what each variant runs and how it is checked.

Where it sits: between the rank programs (``_ranks``), which time them with ``_meter``, and
the library and its peers, which they call. Shard values are small integers from a formula
(``_pattern``), so every expected output and gradient is regenerated exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    import torch

    from vargather import CollectiveName

    _State: TypeAlias = tuple[torch.Tensor, torch.Tensor] | None
    """A variant's untimed state: the backward's ``(x, out)``, nothing for the others."""
from ._config import (
    COALESCED_DIM,
    FAMILY_CHANGING_VARIANT,
    KNOWN_SIZES_VARIANT,
    ROW_ELEMENTS,
    BenchConfig,
    forward_transports,
    split_rows,
)

# --- the rank side ---------------------------------------------------------------------------------


_OWN_GROUPS: dict[tuple[int, str], Any] = {}


def own_group(name: str) -> Any:
    """A process group of every rank for the variant ``name``, its own on this world,
    made on first use (every rank makes the variants in the same order, so the groups
    too). Only for the small part's forced transport: vargather learns per group what
    its rounds carry (``_fused.FusedState``), and a burst of calls that do not use the
    learned slots (a forced transport's) resets them, so that the next burst of
    ``auto`` on the same group (sizes changing, above all) would re-learn them: about a
    quarter of its calls paid two rounds. Every other variant runs on the default group,
    as users' calls and the limit do: moving vargather's variants to groups of their own
    made the limit on the default group some 15 % faster in the same run (3.0 against
    3.5 ms at 4 KiB), for reasons not pinned down, and every ratio worse."""
    import torch.distributed as dist

    world = dist.group.WORLD
    key = (id(world), name)
    group = _OWN_GROUPS.get(key)
    if group is None:
        if any(k[0] != id(world) for k in _OWN_GROUPS):
            _OWN_GROUPS.clear()  # another world: its groups are gone with it
        group = _OWN_GROUPS[key] = dist.new_group(list(range(dist.get_world_size())))
    return group


def own_state(
    fn: Callable[[int], Any], collective: CollectiveName = "all_gather_v"
) -> Callable[[int], Any]:
    """``fn`` (one call of a vargather variant on the default group) run with a learned
    state of its own (``internal.swap_state``): what vargather learns per group from its
    calls (the slots its round carries) is this variant's alone, as for a caller whose
    calls all follow this one pattern. Without it the fixed-size ``auto`` inherited the
    slots the sizes-changing variant had grown (12.5 % of slack at 1 MiB per rank, and
    the close-up over it), so its column measured a mix of both callers. The group
    itself stays shared: see ``own_group`` for why. Every rank runs the variants in the
    same order, so every rank swaps alike. ``collective``: whose round's state (the
    gather's, or the family's all_to_all-shaped round for ``all_to_all_v``)."""
    from vargather import internal

    mine = [internal.FusedState()]

    def run(i: int) -> Any:
        before = internal.swap_state(None, mine[0], collective)
        try:
            return fn(i)
        finally:
            mine[0] = internal.swap_state(None, before, collective)

    return run


def _pattern(start: int, count: int, a: int, b: int, modulus: int) -> torch.Tensor:
    """``(i * a + b) % modulus - modulus // 2`` for ``i`` in ``[start, start + count)``,
    as float32: small integers, so sums are exact."""
    import torch

    i = torch.arange(start, start + count, dtype=torch.int64)
    return ((i * a + b) % modulus - modulus // 2).to(torch.float32)


def _shard(rank: int, rows: int) -> torch.Tensor:
    return _pattern(0, rows * ROW_ELEMENTS, 7, 13 * rank, 23).view(rows, ROW_ELEMENTS)


def _upstream_rows(rank: int, first_row: int, rows: int) -> torch.Tensor:
    """Rows ``[first_row, first_row + rows)`` of rank ``rank``'s upstream gradient."""
    start = first_row * ROW_ELEMENTS
    return _pattern(start, rows * ROW_ELEMENTS, 5, 11 * rank, 19).view(rows, ROW_ELEMENTS)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: the same shape, dtype and bytes."""
    import torch

    return bool(
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


@dataclass(frozen=True)
class _Burst:
    """One variant of a small or coalesced cell: ``call(i)`` is its ``i``-th call (the
    index picks the sizes where they change), ``check(i, result)`` verifies it."""

    name: str
    call: Callable[[int], Any]
    check: Callable[[int, Any], bool]


@dataclass
class _Cell:
    """One (world size, payload, profile) on one rank."""

    rank: int
    world_size: int
    sizes: list[int]
    offsets: list[int]
    total: int
    eq_rows: int  # rows per rank of the equal-size limit

    @property
    def rows(self) -> int:
        return self.sizes[self.rank]


def _check_output(cell: _Cell, out: torch.Tensor) -> bool:
    if tuple(out.shape) != (cell.total, ROW_ELEMENTS):
        return False
    for r in range(cell.world_size):
        o, n = cell.offsets[r], cell.sizes[r]
        if not _same(out[o : o + n], _shard(r, n)):
            return False
    return True


def _expected_grad(cell: _Cell, first_row: int, rows: int) -> torch.Tensor:
    total = _upstream_rows(0, first_row, rows)
    for j in range(1, cell.world_size):
        total = total + _upstream_rows(j, first_row, rows)
    return total


@dataclass
class _Variant:
    """How to run, check and measure one variant on a rank.

    ``prepare()`` builds the untimed state (fresh each call); ``run(state)`` is the timed
    part and returns what ``check(result)`` verifies.
    """

    name: str
    prepare: Callable[[], _State]
    run: Callable[[_State], torch.Tensor]
    check: Callable[[torch.Tensor], bool]


def _forward_variants(cell: _Cell) -> list[_Variant]:
    import torch
    import torch.distributed as dist

    import vargather
    from vargather.testing.reference_seed import all_gather_variable_dim

    x = _shard(cell.rank, cell.rows)
    eq_x = _shard(cell.rank, cell.eq_rows)
    eq_cell = _Cell(
        cell.rank,
        cell.world_size,
        [cell.eq_rows] * cell.world_size,
        [r * cell.eq_rows for r in range(cell.world_size)],
        cell.eq_rows * cell.world_size,
        cell.eq_rows,
    )
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def limit(_: _State) -> torch.Tensor:
        out = eq_x.new_empty((eq_cell.total, ROW_ELEMENTS))
        gather_single(out, eq_x)
        return out

    def vargather_run(transport: str) -> Callable[[_State], torch.Tensor]:
        def run(_: _State) -> torch.Tensor:
            return vargather.all_gather_v(x, 0, transport=transport)  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES

        return run

    def vargather_known(_: _State) -> torch.Tensor:
        return vargather.all_gather_v(x, 0, sizes=cell.sizes, validate=False)

    def seed(_: _State) -> torch.Tensor:
        return all_gather_variable_dim(x, 0)[0]

    def gather_object(_: _State) -> torch.Tensor:
        objects: list[torch.Tensor | None] = [None] * dist.get_world_size()
        dist.all_gather_object(objects, x)
        return torch.cat([o for o in objects if o is not None], dim=0)

    variants = [_Variant("limit", lambda: None, limit, lambda out: _check_output(eq_cell, out))]
    variants += [
        _Variant(
            f"vargather:{t}",
            lambda: None,
            vargather_run(t),
            lambda out: _check_output(cell, out),
        )
        for t in forward_transports()
    ]
    variants.append(
        _Variant(
            KNOWN_SIZES_VARIANT,
            lambda: None,
            vargather_known,
            lambda out: _check_output(cell, out),
        )
    )
    variants.append(_Variant("seed", lambda: None, seed, lambda out: _check_output(cell, out)))
    variants.append(
        _Variant(
            "all_gather_object", lambda: None, gather_object, lambda out: _check_output(cell, out)
        )
    )
    return variants


def _backward_variants(cell: _Cell) -> list[_Variant]:
    import torch
    import torch.distributed as dist

    import vargather

    reduce_scatter_single = (
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    )
    upstream = _upstream_rows(cell.rank, 0, cell.total)
    eq_upstream = _upstream_rows(cell.rank, 0, cell.eq_rows * cell.world_size)
    own = slice(cell.offsets[cell.rank], cell.offsets[cell.rank] + cell.rows)
    want = _expected_grad(cell, cell.offsets[cell.rank], cell.rows)
    eq_want = _expected_grad(cell, cell.rank * cell.eq_rows, cell.eq_rows)

    def limit(_: _State) -> torch.Tensor:
        out = eq_upstream.new_empty((cell.eq_rows, ROW_ELEMENTS))
        reduce_scatter_single(out, eq_upstream)
        return out

    def prepare(transport: str) -> Callable[[], _State]:
        def make() -> _State:
            x = _shard(cell.rank, cell.rows).requires_grad_(True)
            out = vargather.all_gather_v(x, 0, transport=transport)  # type: ignore[arg-type]  # a name from TRANSPORT_NAMES
            return x, out

        return make

    def backward(state: _State) -> torch.Tensor:
        assert state is not None  # made by prepare()
        x, out = state
        torch.autograd.backward(out, upstream)
        assert x.grad is not None  # x requires grad and the gather is differentiable
        return x.grad

    def all_reduce(_: _State) -> torch.Tensor:
        full = upstream.clone()
        dist.all_reduce(full)
        return full[own].clone()

    variants = [_Variant("limit", lambda: None, limit, lambda g: _same(g, eq_want))]
    variants += [
        _Variant(f"vargather:{t}", prepare(t), backward, lambda g: _same(g, want))
        for t in forward_transports()
    ]
    variants.append(_Variant("all_reduce", lambda: None, all_reduce, lambda g: _same(g, want)))
    return variants


def _selected(variants: list[_Variant], cfg: BenchConfig) -> list[_Variant]:
    if cfg.variants is None:
        return variants
    return [v for v in variants if v.name == "limit" or v.name in cfg.variants]


def _flat_shard(rank: int, n: int) -> torch.Tensor:
    return _pattern(0, n, 7, 13 * rank, 23)


def _flat_expected(sizes: Sequence[int]) -> torch.Tensor:
    import torch

    return torch.cat([_flat_shard(r, n) for r, n in enumerate(sizes)])


def changing_step(total: int, w: int) -> int:
    """The rows moved per call by ``changing_sizes``: about 5 % of an even share of
    ``total`` rows over ``w`` ranks, at least one."""
    return max(1, round(0.05 * total / w))


def changing_sizes(base: Sequence[int], step: int, i: int) -> list[int]:
    """The small part's sizes at call ``i``: ``base`` with rank ``i % W`` one ``step``
    larger and rank ``(i + 1) % W`` one ``step`` smaller (never below 0): every call's
    sizes differ from the previous call's, within ``step`` of ``base``, same total."""
    w = len(base)
    sizes = list(base)
    grow, shrink = i % w, (i + 1) % w
    moved = min(step, sizes[shrink])
    sizes[grow] += moved
    sizes[shrink] -= moved
    return sizes


def _coalesced_shards(rank: int, n: int) -> list[torch.Tensor]:
    """Rank ``rank``'s three tensors of ``n`` rows: int64 ids (high bits set), float32
    embeddings, a bool mask."""
    import torch

    ids = torch.arange(n, dtype=torch.int64) * 7 + ((rank + 1) << 40)
    emb = _pattern(0, n * COALESCED_DIM, 5, 11 * rank, 19).view(n, COALESCED_DIM)
    mask = torch.arange(n, dtype=torch.int64).add(rank) % 3 == 0
    return [ids, emb, mask]


def coalesced_row_bytes() -> int:
    """Bytes of one row of the coalesced case's three tensors together."""
    return 8 + 4 * COALESCED_DIM + 1


def peer_gathers() -> dict[str, Callable[[torch.Tensor], torch.Tensor] | str]:
    """The gathers users reach for instead, by variant name: each a function of this
    rank's shard returning the gathered tensor, or (not installed) the note saying so.

    ``ignite``: ``ignite.distributed.all_gather_tensors_with_shapes``, which needs every
    rank's shape beforehand: its docs' shape exchange, ``idist.all_gather`` of the
    shape, runs first in every call, then the gather and a ``cat`` of its list.
    ``torchmetrics``: ``torchmetrics.utilities.distributed.gather_all_tensors`` (a
    barrier, a shape all_gather, a padded list all_gather, trimming) and a ``cat``.
    ``seed``: the seed's algorithm (``vargather.testing.reference_seed``).
    """
    import torch

    from vargather.testing.reference_seed import all_gather_variable_dim

    found: dict[str, Callable[[torch.Tensor], torch.Tensor] | str] = {}
    try:
        import ignite.distributed as idist
    except ImportError:
        found["ignite"] = "pytorch-ignite is not installed (pip install pytorch-ignite)"
    else:

        def ignite(x: torch.Tensor) -> torch.Tensor:
            shape = torch.tensor(x.shape, dtype=torch.int64)
            gathered = idist.all_gather(shape)
            assert isinstance(gathered, torch.Tensor)  # a tensor in, a tensor out
            every = gathered.view(-1, x.dim()).tolist()
            return torch.cat(idist.all_gather_tensors_with_shapes(x, every), dim=0)

        found["ignite"] = ignite
    try:
        from torchmetrics.utilities.distributed import gather_all_tensors
    except ImportError:
        found["torchmetrics"] = "torchmetrics is not installed (pip install torchmetrics)"
    else:

        def torchmetrics(x: torch.Tensor) -> torch.Tensor:
            return torch.cat(gather_all_tensors(x), dim=0)

        found["torchmetrics"] = torchmetrics
    found["seed"] = lambda x: all_gather_variable_dim(x, 0)[0]
    return found


def peer_shard(rank: int, rows: int, columns: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the peers part: ``rows x columns`` float32."""
    return _pattern(0, rows * columns, 7, 13 * rank, 23).view(rows, columns)


# --- the family part: reduce_scatter_v, all_to_all_v, all_gather_list ----------------------


FAMILY_BASELINES: Final = {
    "reduce_scatter_v": "reduce_scatter_tensor",
    "all_to_all_v": "all_to_all_single",
    "all_gather_list": "all_gather_v",
    "gather_v": "gather",
    "scatter_v": "scatter",
}
"""What each family collective is timed against (the variant ``limit`` of its group;
the rooted ones' ``direct`` too: batched sends of the exact blocks)."""


@dataclass
class FamilyGroup:
    """One collective of a family cell on one rank: its bursts (``limit`` is the
    baseline), the baseline of the known-sizes variant, and ``reference``: the
    result a torch (or vargather) collective with the same splits gives, which each
    vargather variant's first call must equal before it is timed."""

    collective: str
    bursts: list[_Burst]
    known_baseline: str
    reference: object
    shapes: dict[str, object]
    references: dict[str, object] = field(default_factory=dict)
    """A burst's own first-call reference where its calls differ from the others'
    (the changing sizes' first call)."""


def family_same(out: object, expected: object) -> bool:
    """``out`` equals ``expected`` bit for bit: tensors, or lists of tensors (the
    same length, each equal)."""
    import torch

    if isinstance(expected, torch.Tensor):
        return isinstance(out, torch.Tensor) and _same(out, expected)
    assert isinstance(expected, (list, tuple))  # all_gather_list's result
    return (
        isinstance(out, (list, tuple))
        and len(out) == len(expected)
        and all(
            isinstance(o, torch.Tensor) and _same(o, e) for o, e in zip(out, expected, strict=True)
        )
    )


def family_shard(rank: int, first_row: int, rows: int, columns: int) -> torch.Tensor:
    """Rows ``[first_row, first_row + rows)`` of rank ``rank``'s family input
    (``columns`` float32 columns; small integers, so every sum is exact)."""
    start = first_row * columns
    return _pattern(start, rows * columns, 7, 13 * rank, 23).view(rows, columns)


def _block_sum(w: int, first_row: int, rows: int, columns: int) -> torch.Tensor:
    total = family_shard(0, first_row, rows, columns)
    for j in range(1, w):
        total = total + family_shard(j, first_row, rows, columns)
    return total


def family_groups(
    rank: int, w: int, kb: float, shares: Sequence[float], columns: int
) -> list[FamilyGroup]:
    """The three collectives of a family cell (``kb`` KiB, rows of ``columns`` float32,
    split by ``shares``), each with its baseline, on rank ``rank`` of ``w``.

    ``reduce_scatter_v``: every rank's input holds ``kb`` (``T`` rows, a multiple of
    ``W``), cut by ``shares``; the baseline is one ``reduce_scatter_tensor`` of the same
    input cut into equal blocks. ``all_to_all_v``: every rank sends ``kb / W`` (``R``
    rows) cut by ``shares`` (rank ``r`` receives share ``r`` of every rank's rows); the
    baseline is one ``all_to_all_single`` with the same splits. ``all_gather_list``:
    rank ``r`` holds share ``r`` of ``kb`` (``n_r x columns``); the baselines are
    ``all_gather_v`` of the same tensors (validated, and with the sizes passed and
    ``validate=False`` for the known-sizes variant). vargather's functions are looked up
    on the module at every call (a test can stand in a wrong one).
    """
    import torch
    import torch.distributed as dist

    import vargather

    row_bytes = 4 * columns
    reduce_scatter_single = (
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    )

    def same(expected: object) -> Callable[[int, object], bool]:
        return lambda _, out: family_same(out, expected)

    # reduce_scatter_v
    t = w * max(1, round(kb * 1024 / (row_bytes * w)))
    sizes = split_rows(t, shares)
    offsets = [sum(sizes[:r]) for r in range(w)]
    x = family_shard(rank, 0, t, columns)
    eq = t // w
    rs_limit_want = _block_sum(w, rank * eq, eq, columns)
    rs_want = _block_sum(w, offsets[rank], sizes[rank], columns)
    rs_reference = x.new_empty((sizes[rank], columns))
    dist.reduce_scatter(rs_reference, list(torch.split(x, sizes)))

    def rs_limit(_: int) -> torch.Tensor:
        out = x.new_empty((eq, columns))
        reduce_scatter_single(out, x)
        return out

    rs = FamilyGroup(
        "reduce_scatter_v",
        [
            _Burst("limit", rs_limit, same(rs_limit_want)),
            _Burst("vargather", lambda _: vargather.reduce_scatter_v(x, sizes), same(rs_want)),
            _Burst(
                "vargather+sizes",
                lambda _: vargather.reduce_scatter_v(x, sizes, validate=False),
                same(rs_want),
            ),
        ],
        "limit",
        rs_reference,
        {"rows": t, "sizes": sizes, "baseline_rows": [eq] * w},
    )

    # all_to_all_v
    per_rank = max(1, round(kb * 1024 / (row_bytes * w)))
    send = split_rows(per_rank, shares)
    recv = [send[rank]] * w
    starts = [sum(send[:r]) for r in range(w)]
    xa = family_shard(rank, 0, per_rank, columns)
    a2a_want = torch.cat([family_shard(j, starts[rank], send[rank], columns) for j in range(w)])
    a2a_reference = xa.new_empty((sum(recv), columns))
    dist.all_to_all_single(a2a_reference, xa, recv, send)

    def a2a_limit(_: int) -> torch.Tensor:
        out = xa.new_empty((sum(recv), columns))
        dist.all_to_all_single(out, xa, recv, send)
        return out

    # sizes changing every call: rank j's send sizes at call i are ``changing_sizes`` of
    # ``send`` at ``i + j`` (a step of about 5 % of a block moved from one peer to
    # another, each rank its own way), repeating every W calls
    step = changing_step(per_rank, w)
    phases = [[changing_sizes(send, step, i + j) for j in range(w)] for i in range(w)]

    def phase_want(p: Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.cat([family_shard(j, sum(p[j][:rank]), p[j][rank], columns) for j in range(w)])

    phase_wants = [phase_want(p) for p in phases]
    changing_reference = xa.new_empty((sum(p[rank] for p in phases[0]), columns))
    dist.all_to_all_single(changing_reference, xa, [p[rank] for p in phases[0]], phases[0][rank])
    a2a = FamilyGroup(
        "all_to_all_v",
        [
            _Burst("limit", a2a_limit, same(a2a_want)),
            _Burst("vargather", lambda _: vargather.all_to_all_v(xa, send), same(a2a_want)),
            _Burst(
                "vargather+sizes",
                lambda _: vargather.all_to_all_v(xa, send, recv_sizes=recv, validate=False),
                same(a2a_want),
            ),
            _Burst(
                FAMILY_CHANGING_VARIANT,
                own_state(
                    lambda i: vargather.all_to_all_v(xa, phases[i % w][rank]), "all_to_all_v"
                ),
                lambda i, out: family_same(out, phase_wants[i % w]),
            ),
        ],
        "limit",
        a2a_reference,
        {"rows_per_rank": per_rank, "send_sizes": send, "changing_step": step},
        {FAMILY_CHANGING_VARIANT: changing_reference},
    )

    # all_gather_list
    rows = split_rows(t, shares)
    xl = family_shard(rank, 0, rows[rank], columns)
    pieces = [family_shard(r, 0, n, columns) for r, n in enumerate(rows)]
    cat_want = torch.cat(pieces)
    shapes = [(n, columns) for n in rows]
    list_reference = list(torch.split(vargather.all_gather_v(xl), rows))
    lst = FamilyGroup(
        "all_gather_list",
        [
            _Burst("limit", lambda _: vargather.all_gather_v(xl), same(cat_want)),
            _Burst(
                "all_gather_v+sizes",
                lambda _: vargather.all_gather_v(xl, sizes=rows, validate=False),
                same(cat_want),
            ),
            _Burst("vargather", lambda _: vargather.all_gather_list(xl), same(pieces)),
            _Burst(
                "vargather+sizes",
                lambda _: vargather.all_gather_list(xl, shapes=shapes, validate=False),
                same(pieces),
            ),
        ],
        "all_gather_v+sizes",
        list_reference,
        {"rows": t, "sizes": rows},
    )
    return [rs, a2a, lst, *rooted_groups(rank, w, t, shares, columns)]


def rooted_groups(
    rank: int, w: int, t: int, shares: Sequence[float], columns: int
) -> list[FamilyGroup]:
    """``gather_v`` onto rank 0 and ``scatter_v`` from rank 0 of ``t`` rows split by
    ``shares`` (rank ``r``'s block ``n_r x columns``), each against ``dist.gather`` /
    ``dist.scatter`` of blocks padded to the largest (``limit``) and against batched
    sends of the exact blocks (``direct``), validated and with the sizes passed."""
    import torch
    import torch.distributed as dist

    import vargather

    rows = split_rows(t, shares)
    top = max(rows)
    mine = family_shard(rank, 0, rows[rank], columns)
    pieces = [family_shard(r, 0, n, columns) for r, n in enumerate(rows)]
    full = torch.cat(pieces)
    empty = mine[:0]

    def same(expected: object) -> Callable[[int, object], bool]:
        return lambda _, out: family_same(out, expected)

    def gather_limit(_: int) -> torch.Tensor:
        padded = mine.new_zeros((top, columns))
        padded[: rows[rank]] = mine
        bufs = [mine.new_empty((top, columns)) for _ in range(w)] if rank == 0 else None
        dist.gather(padded, bufs, dst=0)
        return torch.cat([b[:n] for b, n in zip(bufs, rows, strict=True)]) if bufs else empty

    def gather_direct(_: int) -> torch.Tensor:
        if rank != 0:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, 0)]):
                work.wait()
            return empty
        out = full.new_empty(full.shape)
        parts = torch.split(out, rows)
        ops = [dist.P2POp(dist.irecv, parts[r], r) for r in range(1, w) if rows[r]]
        works = dist.batch_isend_irecv(ops) if ops else []
        parts[0].copy_(mine)
        for work in works:
            work.wait()
        return out

    def scatter_limit(_: int) -> torch.Tensor:
        out = mine.new_empty((top, columns))
        blocks = None
        if rank == 0:
            blocks = [full.new_zeros((top, columns)) for _ in range(w)]
            for b, piece in zip(blocks, pieces, strict=True):
                b[: piece.shape[0]] = piece
        dist.scatter(out, blocks, src=0)
        return out[: rows[rank]]

    def scatter_direct(_: int) -> torch.Tensor:
        if rank != 0:
            out = mine.new_empty(mine.shape)
            if rows[rank]:
                for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, out, 0)]):
                    work.wait()
            return out
        ops = [dist.P2POp(dist.isend, p, r) for r, p in enumerate(pieces) if r and rows[r]]
        works = dist.batch_isend_irecv(ops) if ops else []
        out = pieces[0].clone()
        for work in works:
            work.wait()
        return out

    gathered = full if rank == 0 else empty
    gather = FamilyGroup(
        "gather_v",
        [
            _Burst("limit", gather_limit, same(gathered)),
            _Burst("direct", gather_direct, same(gathered)),
            _Burst("vargather", lambda _: vargather.gather_v(mine, 0), same(gathered)),
            _Burst(
                "vargather+sizes",
                lambda _: vargather.gather_v(mine, 0, sizes=rows, validate=False),
                same(gathered),
            ),
        ],
        "limit",
        gather_limit(0),
        {"rows": t, "sizes": rows, "baseline_rows": [top] * w},
    )
    x = full if rank == 0 else empty
    scatter = FamilyGroup(
        "scatter_v",
        [
            _Burst("limit", scatter_limit, same(mine)),
            _Burst("direct", scatter_direct, same(mine)),
            _Burst("vargather", lambda _: vargather.scatter_v(x, rows, 0), same(mine)),
            _Burst(
                "vargather+sizes",
                lambda _: vargather.scatter_v(x, rows, 0, validate=False),
                same(mine),
            ),
        ],
        "limit",
        scatter_limit(0),
        {"rows": t, "sizes": rows, "baseline_rows": [top] * w},
    )
    return [gather, scatter]

"""The bench's ``sequence`` part: ``all_to_all_v`` as sequence and expert parallelism
run it, beside what users run today.

Where it sits: one part of ``python -m vargather bench`` (run when ``--parts`` names
it), on the pool's gloo worlds like the family part; ``__init__`` drives it, this
module has its rank function and its table.

Two cells per size (``--sequence-sizes``: each rank's input, KiB) and split
(``even``, ``uneven``), steady state, timed in rotated bursts (``_meter``), every
result checked equal to the baseline's before it is timed:

* **ulysses**: the switch before attention, ``[b, s_r, H, 64]`` float32 to ``[b, S,
  h_r, 64]`` (``bshd``, ``b = 1``) and ``[s_r, b, H, 64]`` to ``[S, b, h_r, 64]``
  (``sbhd``, ``b = 2``). ``deepspeed``: DeepSpeed's ``single_all_to_all`` written
  inline (``deepspeed/sequence/layer.py``: permute the heads to the front,
  ``contiguous``, one ``all_to_all_single``, permute back; uneven heads as its
  ``uneven_heads_all2all``, uneven sequence chunks with every split list known, which
  DeepSpeed itself does not take). ``vargather``: ``all_to_all_v(x, head_split(H, W),
  2, cat_dim=1)`` validated (nothing known); ``vargather+sizes``: the receive sizes
  passed, ``validate=False``. ``even``: ``H = 4 W``, equal chunks; ``uneven``: ``H =
  4 W - 2`` (DeepSpeed's rule: the first ranks one head more) and chunks 1 to 1.75.
* **moe**: an expert dispatch, rows of 64 float32 cut by the ``mild`` shares (or equal
  ones). ``counts+data``: torchtitan's ``_token_count_exchange`` (an
  ``all_to_all_single`` of the counts, then ``tolist``) and
  ``_dispatch_token_exchange`` (the data's ``all_to_all_single``); ``vargather``:
  ``all_to_all_v(x, send_sizes)``, the receive sizes unknown.

Each vargather row reports its wall time and its CPU time per call (the rank
process's, every thread), each over the baseline's in the same burst (median and
quartiles over the bursts), and the collectives one call issues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from ._config import SEQUENCE_SIZES_KB, BenchConfig, profile_shares, split_rows
from ._meter import _measure_bursts, spread
from ._variants import _Burst, family_same

__all__ = ["SEQUENCE_SIZES_KB", "SEQUENCE_TARGET", "rank_sequence", "sequence_tables"]

SEQUENCE_TARGET: Final = 1.15
"""The issue's bound on vargather's CPU per call over the user's way."""
HEAD_DIM: Final = 64


def _deepspeed_seq_to_heads(
    x: Any, heads: Sequence[int], seq: Sequence[int], rank: int, layout: str
) -> Any:
    """DeepSpeed's ``single_all_to_all`` (scatter the heads, gather the sequence),
    inline: ``x`` of ``[b, s_r, H, d]`` (``bshd``) or ``[s_r, b, H, d]`` (``sbhd``)."""
    import torch
    import torch.distributed as dist

    w = len(heads)
    if layout == "bshd":
        b, s, _, d = x.shape
    else:
        s, b, _, d = x.shape
    h = heads[rank]
    if len(set(heads)) == 1 and len(set(seq)) == 1:  # its even path
        if layout == "bshd":  # [b, s, W, h, d] -> [W, b, s, h, d]
            t = x.reshape(b, s, w, h, d).permute(2, 0, 1, 3, 4).contiguous()
        else:  # [s, b, W, h, d] -> [W, s, b, h, d]
            t = x.reshape(s, b, w, h, d).permute(2, 0, 1, 3, 4).contiguous()
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)
        if layout == "bshd":  # [W, b, s, h, d] -> [b, W s, h, d]
            return out.permute(1, 0, 2, 3, 4).contiguous().reshape(b, w * s, h, d)
        return out.reshape(w * s, b, h, d)  # [W, s, b, h, d] is [S, b, h, d]
    # uneven_heads_all2all: the heads to the front, one all_to_all_single of flat blocks
    t = x.transpose(0, 2).contiguous()  # [H, s, b, d] or [H, b, s, d]
    inner = s * b * d
    out = x.new_empty(h * sum(seq) * b * d)
    dist.all_to_all_single(
        out,
        t.view(-1),
        [h * n * b * d for n in seq],
        [n * inner for n in heads],
    )
    shape = (b, sum(seq), h, d) if layout == "bshd" else (sum(seq), b, h, d)
    y = x.new_empty(shape)
    at = o = 0
    for n in seq:  # block j: [h, s_j, b, d] (sbhd: [h, b, s_j, d]), transposed back
        block = out[at : at + h * n * b * d]
        at += h * n * b * d
        if layout == "bshd":
            y[:, o : o + n].copy_(block.view(h, n, b, d).permute(2, 1, 0, 3))
        else:
            y[o : o + n].copy_(block.view(h, b, n, d).permute(2, 1, 0, 3))
        o += n
    return y


def _ulysses(
    rank: int, w: int, kb: float, split: str, layout: str
) -> tuple[list[_Burst], dict[str, Any]]:
    import torch

    import vargather

    hh = 4 * w if split == "even" else 4 * w - 2
    heads = list(vargather.head_split(hh, w))
    b = 1 if layout == "bshd" else 2
    total = max(w, round(kb * 1024 * w / (hh * b * HEAD_DIM * 4)))  # every rank's chunks
    seq = split_rows(total, profile_shares("even" if split == "even" else "mild", w))
    g = torch.Generator().manual_seed(rank)
    shape = (b, seq[rank], hh, HEAD_DIM) if layout == "bshd" else (seq[rank], b, hh, HEAD_DIM)
    x = torch.randint(-64, 64, shape, generator=g).float()
    seq_dim = 1 if layout == "bshd" else 0
    want = _deepspeed_seq_to_heads(x, heads, seq, rank, layout)

    def ours(_: int) -> Any:
        return vargather.all_to_all_v(x, heads, 2, cat_dim=seq_dim)

    def known(_: int) -> Any:
        return vargather.all_to_all_v(x, heads, 2, cat_dim=seq_dim, recv_sizes=seq, validate=False)

    same = _same(want)
    bursts = [
        _Burst("limit", lambda _: _deepspeed_seq_to_heads(x, heads, seq, rank, layout), same),
        _Burst("vargather", ours, same),
        _Burst("vargather+sizes", known, same),
    ]
    return bursts, {"baseline": "deepspeed", "heads": heads, "seq": seq, "batch": b}


def _moe(rank: int, w: int, kb: float, split: str) -> tuple[list[_Burst], dict[str, Any]]:
    import torch
    import torch.distributed as dist

    import vargather

    rows = max(w, round(kb * 1024 / (HEAD_DIM * 4)))
    shares = profile_shares("even" if split == "even" else "mild", w)
    send = split_rows(rows, shares[rank:] + shares[:rank])  # each rank its own routing
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(-64, 64, (rows, HEAD_DIM), generator=g).float()

    def counts_and_data(_: int) -> Any:
        counts = torch.tensor(send, dtype=torch.int64)  # torchtitan: per-expert counts
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts)  # _token_count_exchange
        recv = got.tolist()
        out = x.new_empty((sum(recv), HEAD_DIM))
        dist.all_to_all_single(out, x, recv, send)  # _dispatch_token_exchange
        return out

    want = counts_and_data(0)
    same = _same(want)
    bursts = [
        _Burst("limit", counts_and_data, same),
        _Burst("vargather", lambda _: vargather.all_to_all_v(x, send), same),
    ]
    return bursts, {"baseline": "counts+data", "send_sizes": send}


def _same(want: Any) -> Callable[[int, object], bool]:
    return lambda _, out: family_same(out, want)


def rank_sequence(ctx: Any, job: tuple[BenchConfig, float, str]) -> dict[str, Any] | None:
    """Rank function of the sequence part: one (KiB, split) on this world, its ulysses
    cells (both layouts) and its moe cell. Rank 0 returns the record."""
    import torch

    from vargather.internal import collectives_issued

    torch.set_num_threads(1)
    cfg, kb, split = job
    rank, w = ctx.rank, ctx.world_size
    cells: dict[str, Any] = {}
    made = [
        (f"ulysses {layout}", *_ulysses(rank, w, kb, split, layout)) for layout in ("bshd", "sbhd")
    ]
    made.append(("moe", *_moe(rank, w, kb, split)))
    for name, bursts, shape in made:
        base = bursts[0].name  # "limit": _measure_bursts' name for the baseline
        results = _measure_bursts(bursts, cfg.small_repeats, cfg.calls, max(cfg.warmup, w))
        for burst in bursts[1:]:
            before = collectives_issued()
            burst.call(0)
            results[burst.name]["collectives_per_call"] = collectives_issued() - before
        cells[name] = {
            **shape,
            "forward": results,
            "ratios": {
                b.name: {
                    "wall": spread(_ratios(results[b.name]["times_s"], results[base]["times_s"])),
                    "cpu": spread(_ratios(results[b.name]["cpu_s"], results[base]["cpu_s"])),
                }
                for b in bursts[1:]
            },
        }
    if rank != 0:
        return None
    return {"world_size": w, "payload_kb": kb, "split": split, "cells": cells}


def _ratios(mine: Sequence[float], base: Sequence[float]) -> list[float]:
    """The per-burst ratios (a burst of no measurable CPU left out)."""
    return [a / b for a, b in zip(mine, base, strict=True) if b > 0] or [float("nan")]


def sequence_tables(records: Sequence[dict[str, Any]]) -> list[str]:
    """The sequence part's table: per cell and vargather variant, the baseline's wall
    and CPU µs per call, vargather's, their ratios (median, quartiles) and the
    collectives a call issues."""
    if not records:
        return []
    rows: list[str] = []
    head = (
        "| W | KiB | split | cell | baseline | µs wall | µs CPU | variant | µs wall | µs CPU "
        "| wall ratio | CPU ratio | collectives |\n|" + "---|" * 13
    )
    for rec in records:
        for name, cell in rec["cells"].items():
            f = cell["forward"]
            base = f["limit"]
            for variant, r in cell["ratios"].items():
                mine = f[variant]
                mark = "" if mine["verified"] and base["verified"] else " WRONG"
                rows.append(
                    f"| {rec['world_size']} | {rec['payload_kb']:g} | {rec['split']} | {name} "
                    f"| {cell['baseline']} | {base['median_ms'] * 1e3:.0f} "
                    f"| {base['median_cpu_ms'] * 1e3:.0f} | {variant}{mark} "
                    f"| {mine['median_ms'] * 1e3:.0f} | {mine['median_cpu_ms'] * 1e3:.0f} "
                    f"| {_spread(r['wall'])} | {_spread(r['cpu'])} "
                    f"| {mine.get('collectives_per_call', '?')} |"
                )
    note = (
        "**sequence**, steady state: each rank's input of KiB, `ulysses`: the switch "
        "before attention (`bshd` batch 1, `sbhd` batch 2) against DeepSpeed's permute + "
        "`all_to_all_single` + permute written inline; `moe`: an expert dispatch against "
        "torchtitan's counts `all_to_all_single` then data `all_to_all_single`. Times per "
        "call (median over bursts: wall, and the rank process's CPU), ratios to the "
        "baseline per burst: median (quartiles); the issue's target is "
        f"{SEQUENCE_TARGET:.2f}x by CPU."
    )
    return [note + "\n\n" + head + "\n" + "\n".join(rows)]


def _spread(r: dict[str, float]) -> str:
    return f"{r['median']:.2f} ({r['q1']:.2f}-{r['q3']:.2f})"

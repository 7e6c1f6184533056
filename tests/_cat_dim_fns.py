"""Rank-side functions of ``tests/test_sequence_parallel.py`` (module level, so the
pool pickles them by reference): ``all_to_all_v(..., cat_dim=)`` compiled, steady
calls counted, and the Ulysses helper around attention."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

import vargather
from vargather import oracle
from vargather.internal import collectives_issued
from vargather.testing.rank_side import RankContext


def compiled_all_to_all_v(
    x: torch.Tensor,
    send_sizes: list[int],
    dim: int = 0,
    *,
    recv_sizes: list[int] | None = None,
    cat_dim: int | None = None,
    group: Any = None,
    validate: bool = True,
    timeout: float | None = None,
) -> torch.Tensor:
    """``vargather.all_to_all_v`` inside ``torch.compile(fullgraph=True)`` (aot_eager:
    the custom operator and its autograd formula, traced), for the kit's cases."""
    torch._dynamo.reset()

    def step(t: torch.Tensor) -> torch.Tensor:
        return vargather.all_to_all_v(
            t,
            send_sizes,
            dim,
            cat_dim=cat_dim,
            recv_sizes=recv_sizes,
            group=group,
            validate=validate,
            timeout=timeout,
        )

    out: torch.Tensor = torch.compile(step, backend="aot_eager", fullgraph=True)(x)
    return out


def steady_collectives(ctx: RankContext, spec: tuple[str, bool]) -> tuple[list[int], bool]:
    """Ulysses' two switches called again and again (uneven sequence chunks; heads
    uneven, or even): the collectives each pair of calls issues, and whether every
    result is the oracle's and the round trip the identity, every time."""
    layout, even = spec
    w, r = ctx.world_size, ctx.rank
    seq = [3 + j for j in range(w)]  # uneven chunks
    heads = 2 * w if even else 2 * w + 1  # uneven: the first rank has one more

    def chunk(j: int) -> torch.Tensor:
        shape = (2, seq[j], heads, 8) if layout == "bshd" else (seq[j], 2, heads, 8)
        return torch.randn(shape, generator=torch.Generator().manual_seed(j))

    x = chunk(r)
    seq_dim = 1 if layout == "bshd" else 0
    split = list(vargather.head_split(heads, w))
    want = oracle.expected_all_to_all([chunk(j) for j in range(w)], [split] * w, 2, seq_dim)[r]
    counts: list[int] = []
    same = True
    for _ in range(12):
        before = collectives_issued()
        y = vargather.seq_to_heads(x, layout=layout)  # type: ignore[arg-type]  # a layout name
        back = vargather.heads_to_seq(y, seq, layout=layout)  # type: ignore[arg-type]  # the same
        counts.append(collectives_issued() - before)
        same = same and torch.equal(back, x) and torch.equal(y, want)
    return counts, same


def attention_step(ctx: RankContext, spec: tuple[str, int, int, list[int]]) -> dict[str, Any]:
    """One attention layer's Ulysses step with grouped-query attention: every rank's
    chunk of Q, K, V (``[b, s_r, H, d]`` or ``[s_r, b, H, d]``), ``seq_to_heads`` (K and
    V with ``q_heads=``), attention on this rank's heads over the whole sequence,
    ``heads_to_seq``, a loss weighted per rank, backward. Returns this rank's output
    and input gradients (the parent compares them with one process's attention)."""
    layout, hq, hkv, seq = spec
    r = ctx.rank
    q, k, v = full_qkv(layout, hq, hkv, seq)
    lo, hi = sum(seq[:r]), sum(seq[: r + 1])
    along = 1 if layout == "bshd" else 0
    mine = [t.narrow(along, lo, hi - lo).clone().requires_grad_(True) for t in (q, k, v)]
    qh = vargather.seq_to_heads(mine[0], layout=layout, seq_sizes=seq)  # type: ignore[arg-type]  # a layout name
    kh = vargather.seq_to_heads(mine[1], layout=layout, q_heads=hq, seq_sizes=seq)  # type: ignore[arg-type]  # the same
    vh = vargather.seq_to_heads(mine[2], layout=layout, q_heads=hq, seq_sizes=seq)  # type: ignore[arg-type]  # the same
    out = attend(qh, kh, vh, layout)
    o = vargather.heads_to_seq(out, seq, heads=hq, layout=layout)  # type: ignore[arg-type]  # the same
    (o * weight(o.shape, r)).sum().backward()
    return {"out": o.detach(), "grads": [t.grad for t in mine]}


def full_qkv(layout: str, hq: int, hkv: int, seq: list[int]) -> list[torch.Tensor]:
    """The whole sequence's Q, K, V (the same on every process)."""
    g = torch.Generator().manual_seed(7)
    s = sum(seq)
    out = []
    for h in (hq, hkv, hkv):
        shape = (2, s, h, 8) if layout == "bshd" else (s, 2, h, 8)
        out.append(torch.randn(shape, generator=g, dtype=torch.float64))
    return out


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str) -> torch.Tensor:
    """Causal grouped-query attention of ``[b, s, h, d]`` (or ``[s, b, h, d]``) tensors,
    in the same layout; K and V may have fewer heads, each serving a group of Q's."""
    if layout == "sbhd":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    group = q.shape[2] // max(k.shape[2], 1)
    if k.shape[2] and group > 1:
        k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    o = functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    return o if layout == "bshd" else o.transpose(0, 1)


def weight(shape: torch.Size | tuple[int, ...], r: int) -> torch.Tensor:
    """A per-rank upstream weight (the loss differs on every rank)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).view(shape) % 5 + r + 1) / 7

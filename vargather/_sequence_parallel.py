"""Ulysses sequence parallelism on ``all_to_all_v``: ``seq_to_heads`` and
``heads_to_seq``.

Where it sits: above the face (``_api``), whose ``all_to_all_v(..., cat_dim=)`` does
the work; ``__init__`` re-exports the names. Nothing here communicates but through it,
so every check of ``all_to_all_v`` holds (the same error on every rank, the gradient,
``torch.compile``).

The math, once. ``W`` ranks each hold a chunk of the sequence with every head: rank
``r`` has ``x_r`` of ``[b, s_r, H, d]`` (``s_r`` may differ per rank). ``seq_to_heads``
gives rank ``r`` the whole sequence of its ``head_split(H, W)[r]`` heads (split along
the heads, joined along the sequence); ``heads_to_seq`` is its inverse, and each is the
other's gradient (the reverse exchange).

Grouped-query attention: splitting the key/value heads by the same rule would give rank
``r`` key/value heads its query heads do not use (``H_q = 8``, ``H_kv = 2``, ``W = 4``:
rank 1's query heads 2, 3 use key/value head 0, which the rule gives rank 0), so
``seq_to_heads(kv, q_heads=H_q)`` first repeats each key/value head ``kv_repeats`` times
in place (``repeat_interleave``, as ``repeat_kv`` does): rank ``r``'s query heads then
use exactly the key/value heads it receives. The gradient of the repeat sums the copies'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import torch

from ._api import all_to_all_v
from ._errors import ArgumentError
from ._mesh import GroupLike, MeshDim, call_group

SequenceLayout = Literal["bshd", "sbhd"]
"""Where the sequence and heads lie: ``[batch, seq, heads, head_dim]`` or ``[seq,
batch, heads, head_dim]`` (DeepSpeed's ``batch_dim_idx`` 0 and 1)."""

_DIMS: Final[dict[str, tuple[int, int]]] = {"bshd": (1, 2), "sbhd": (0, 2)}
"""Per layout: the sequence dim and the heads dim."""


def head_split(heads: int, world_size: int) -> tuple[int, ...]:
    """Heads per rank by DeepSpeed's rule: ``heads // W`` each, the first
    ``heads % W`` ranks one more (``deepspeed/module_inject/tp_shard.py``).

    Raises:
        ArgumentError: ``heads < 0`` or ``world_size < 1``.
    """
    if heads < 0 or world_size < 1:
        raise ArgumentError(
            f"head_split: expected heads >= 0 and world_size >= 1, got heads={heads}, "
            f"world_size={world_size}"
        )
    base, extra = divmod(heads, world_size)
    return tuple(base + (1 if r < extra else 0) for r in range(world_size))


def kv_repeats(q_heads: int, kv_heads: int, world_size: int) -> int:
    """How many times ``seq_to_heads(kv, q_heads=...)`` repeats each key/value head:
    the smallest ``k`` dividing ``g = q_heads / kv_heads`` with ``k * kv_heads`` a
    multiple of ``world_size``, else ``g`` (every query head its own copy).

    Raises:
        ArgumentError: ``q_heads`` not a positive multiple of ``kv_heads``.
    """
    if kv_heads < 1 or q_heads < kv_heads or q_heads % kv_heads:
        raise ArgumentError(
            f"seq_to_heads: expected q_heads a positive multiple of the key/value heads, "
            f"got q_heads={q_heads}, kv_heads={kv_heads}"
        )
    g = q_heads // kv_heads
    for k in range(1, g + 1):
        if g % k == 0 and (k * kv_heads) % world_size == 0:
            return k
    return g


def _dims(layout: object, fn: str) -> tuple[int, int]:
    """The sequence dim and the heads dim of ``layout``."""
    if layout not in _DIMS:
        raise ArgumentError(f"{fn}: expected layout 'bshd' or 'sbhd', got {layout!r}")
    assert isinstance(layout, str)  # a key of _DIMS
    return _DIMS[layout]


def seq_to_heads(
    x: torch.Tensor,
    *,
    seq_sizes: Sequence[int] | None = None,
    q_heads: int | None = None,
    layout: SequenceLayout = "bshd",
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
) -> torch.Tensor:
    """This rank's sequence chunk of every head -> the whole sequence of its heads.

    Args:
        x: ``[b, s_r, H, d]`` (``layout="bshd"``) or ``[s_r, b, H, d]`` (``"sbhd"``):
            this rank's chunk of the sequence, every head.
        seq_sizes: every rank's chunk length ``(s_0, ..., s_{W-1})``, if known (the
            exchange checks them; under ``torch.compile(fullgraph=True)`` they are
            needed: the custom operator takes sizes as ints).
        q_heads: for keys and values of grouped-query attention, the query head count:
            each key/value head is repeated ``kv_repeats(q_heads, H, W)`` times first, so
            the heads this rank receives are the ones its query heads use.
        layout: ``"bshd"`` or ``"sbhd"``.
        group, mesh_dim, validate: as for ``all_to_all_v``.

    Shapes:
        Returns ``[b, Σ s_j, h_r, d]`` (or ``[Σ s_j, b, h_r, d]``), ``h_r =
        head_split(H', W)[r]``, ``H' = H`` (or ``k H`` repeated).

    Gradient:
        The reverse exchange (``heads_to_seq`` of the upstream gradient), summed over a
        key/value head's copies.

    Raises:
        ArgumentError: on this rank, before any collective, for a ``layout`` or
            ``q_heads`` it cannot use (SPMD code passes the same ones everywhere).
        VarGatherError: as for ``all_to_all_v``, on every rank alike (ranks that hold
            another head count, another ``d``, another batch).
    """
    seq, heads = _dims(layout, "seq_to_heads")
    w = call_group(group, mesh_dim).world_size
    if q_heads is not None:
        k = kv_repeats(q_heads, int(x.shape[heads]), w)
        if k > 1:
            x = x.repeat_interleave(k, dim=heads)
    split = list(head_split(int(x.shape[heads]), w))
    return all_to_all_v(
        x,
        split,
        heads,
        cat_dim=seq,
        recv_sizes=None if seq_sizes is None else list(seq_sizes),
        group=group,
        mesh_dim=mesh_dim,
        validate=validate,
    )


def heads_to_seq(
    x: torch.Tensor,
    seq_sizes: Sequence[int],
    *,
    heads: int | None = None,
    layout: SequenceLayout = "bshd",
    group: GroupLike = None,
    mesh_dim: MeshDim = None,
    validate: bool = True,
) -> torch.Tensor:
    """The whole sequence of this rank's heads -> its sequence chunk of every head (the
    inverse of ``seq_to_heads``, e.g. on attention's output).

    Args:
        x: ``[b, S, h_r, d]`` (or ``[S, b, h_r, d]``), ``S = Σ seq_sizes``.
        seq_sizes: every rank's chunk length ``(s_0, ..., s_{W-1})``.
        heads: the total head count ``H``, if known (the heads each rank holds are then
            ``head_split(H, W)``, passed as the receive sizes: under
            ``torch.compile(fullgraph=True)`` they are needed).
        layout, group, mesh_dim, validate: as for ``seq_to_heads``.

    Shapes:
        Returns ``[b, s_r, H, d]`` (or ``[s_r, b, H, d]``).

    Gradient:
        The reverse exchange (``seq_to_heads`` of the upstream gradient).

    Raises:
        ArgumentError: on this rank, before any collective, for a ``layout`` it cannot
            use.
        VarGatherError: as for ``all_to_all_v``, on every rank alike.
    """
    seq, head_dim = _dims(layout, "heads_to_seq")
    w = call_group(group, mesh_dim).world_size
    return all_to_all_v(
        x,
        list(seq_sizes),
        seq,
        cat_dim=head_dim,
        recv_sizes=None if heads is None else list(head_split(heads, w)),
        group=group,
        mesh_dim=mesh_dim,
        validate=validate,
    )

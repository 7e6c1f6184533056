"""Stage 4: the ``Layout`` of a ragged gather, pure arithmetic, no communication.

Validation (``_exchange``) produces a ``Layout``; the later stages only read it. Every
rank holds an equal ``Layout`` except for ``rank``.

Every stage views a tensor of shape ``lead + (n,) + trail`` as the 3-d block
``(pre, n, post)`` with ``pre = prod(lead)`` and ``post = prod(trail)``; for a
contiguous tensor that view is free. When ``pre == 1`` the blocks of the ranks are
adjacent in memory, which is what makes the copy-free paths possible.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def _size_fields(sizes: tuple[int, ...]) -> dict[str, int | tuple[int, ...]]:
    """The fields that follow from the sizes: ``offsets`` (``o_r``, the exclusive
    running sum), ``total`` and ``max_size``."""
    # A plain loop and ``max`` without ``default=``: dynamo traces this with symbolic
    # sizes (``torch.compile``), and it refuses ``max(..., default=...)``.
    offsets: list[int] = []
    running = 0
    for n in sizes:
        offsets.append(running)
        running += n
    return {"offsets": tuple(offsets), "total": running, "max_size": max(sizes) if sizes else 0}


@dataclass(frozen=True)
class Layout:
    """Where every rank's shard lands in the gathered tensor.

    Attributes:
        sizes: ``n_r`` for every rank of the group, in group-rank order.
        dim: the gather dimension, normalized to ``0 <= dim < ndim``.
        leading_shape: the dimensions before ``dim`` (equal on every rank).
        trailing_shape: the dimensions after ``dim`` (equal on every rank).
        dtype: the dtype of every shard and of the result.
        rank: this process's rank within the group.
        world_size: the number of ranks in the group.
        offsets: ``o_r = n_0 + ... + n_{r-1}`` for every rank (computed).
        total: ``Σ_r n_r``, the gathered size along ``dim`` (computed).
        max_size: the largest ``n_r`` (computed; 0 for an empty group).

    Shapes:
        rank ``r``'s shard is ``leading_shape + (sizes[r],) + trailing_shape``
        (``shard_shape``); the result is ``leading_shape + (total,) + trailing_shape``
        (``output_shape``), rank ``r``'s block at ``offsets[r]`` along ``dim``.

    Raises:
        ValueError: on construction, sizes that do not fit ``world_size``, a rank
            outside the group, or a negative size.
    """

    sizes: tuple[int, ...]
    dim: int
    leading_shape: tuple[int, ...]
    trailing_shape: tuple[int, ...]
    dtype: torch.dtype
    rank: int
    world_size: int
    offsets: tuple[int, ...] = field(init=False)
    total: int = field(init=False)
    max_size: int = field(init=False)

    def __post_init__(self) -> None:
        if len(self.sizes) != self.world_size:
            raise ValueError(
                f"Layout: len(sizes)={len(self.sizes)} but world_size={self.world_size}"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Layout: rank={self.rank} outside [0, {self.world_size})")
        if any(n < 0 for n in self.sizes):
            raise ValueError(f"Layout: negative size in sizes={list(self.sizes)}")
        if self.dim != len(self.leading_shape):
            raise ValueError(
                f"Layout: dim={self.dim} but leading_shape has {len(self.leading_shape)} dims"
            )
        # a frozen dataclass's own fields, set as its ``__init__`` sets them (dynamo
        # before torch 2.13 cannot trace ``__dict__.update`` on one, and a compiled
        # step builds a Layout while tracing: torch 2.11 refused ``all_to_all_v``)
        for name, value in _size_fields(self.sizes).items():
            object.__setattr__(self, name, value)

    def with_sizes(self, sizes: tuple[int, ...]) -> Layout:
        """This layout with ``sizes`` (same length, none negative: the caller checked)
        in place of its own: ``dataclasses.replace`` without re-running the checks of
        the fields that did not change (the fused round's steady state with sizes
        changing every call builds one per call)."""
        if len(sizes) != self.world_size:
            raise ValueError(f"Layout: len(sizes)={len(sizes)} but world_size={self.world_size}")
        new = object.__new__(Layout)
        new.__dict__.update(self.__dict__)  # the fields and the size-free cached values
        new.__dict__.update(_size_fields(sizes), sizes=sizes)
        return new

    # -- derived quantities ---------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.leading_shape) + 1 + len(self.trailing_shape)

    # ``pre``, ``post`` and ``row_bytes`` do not depend on the sizes and are read for
    # every rank on every call: computed once per layout (``cached_property`` writes the
    # instance's ``__dict__``, which a frozen dataclass allows). No cached value may
    # depend on the sizes: ``with_sizes`` carries them over.

    @functools.cached_property
    def pre(self) -> int:
        """Product of the leading dimensions (1 when ``dim == 0``)."""
        return math.prod(self.leading_shape)

    @functools.cached_property
    def post(self) -> int:
        """Product of the trailing dimensions (1 when ``dim`` is the last)."""
        return math.prod(self.trailing_shape)

    @property
    def local_size(self) -> int:
        """``n_r`` of this rank."""
        return self.sizes[self.rank]

    @property
    def local_offset(self) -> int:
        """``o_r`` of this rank."""
        return self.offsets[self.rank]

    @property
    def is_even(self) -> bool:
        """Whether every rank contributes the same ``n`` (no padding, maybe no copy)."""
        return all(n == self.sizes[0] for n in self.sizes)

    @property
    def padding_waste(self) -> float:
        """Fraction of a padded ``W x max`` buffer that is padding (0 when even)."""
        padded = self.world_size * self.max_size
        return 0.0 if padded == 0 else 1.0 - self.total / padded

    @functools.cached_property
    def row_bytes(self) -> int:
        """The bytes of one index along ``dim`` of one leading block, ``post * itemsize``."""
        return self.post * self.dtype.itemsize

    def shard_bytes(self, rank: int) -> int:
        """Bytes of ``rank``'s shard: ``pre * n_r * post * itemsize``."""
        return self.pre * self.sizes[rank] * self.row_bytes

    @property
    def nbytes(self) -> int:
        """The gathered result's size in bytes, ``pre * total * post * itemsize``."""
        return self.pre * self.total * self.row_bytes

    def shard_shape(self, rank: int) -> tuple[int, ...]:
        """Shape of ``rank``'s input."""
        return (*self.leading_shape, self.sizes[rank], *self.trailing_shape)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of the gathered result."""
        return (*self.leading_shape, self.total, *self.trailing_shape)

    def block(self, rank: int) -> slice:
        """``slice(o_r, o_r + n_r)``: rank ``rank``'s block along ``dim``."""
        start = self.offsets[rank]
        return slice(start, start + self.sizes[rank])


def blocks_layout(
    shape: Sequence[int],
    dim: int,
    sizes: Sequence[int],
    dtype: torch.dtype,
    rank: int,
    world_size: int,
) -> Layout:
    """The ``Layout`` of a tensor of ``shape`` cut along ``dim`` (normalized here) into
    one block per rank, ``sizes[r]`` long: the one way every collective builds one."""
    d = dim % len(shape)
    shape = tuple(shape)
    return Layout(tuple(sizes), d, shape[:d], shape[d + 1 :], dtype, rank, world_size)

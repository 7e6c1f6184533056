"""BUG, and a hang only under ``--emulate nccl``: ``sizes_flag``'s ``all_gather_v``
without ``.contiguous()``. On NCCL (emulated) a rank whose shard is a strided view is
refused before the collective while its peers, whose shards are contiguous, enter it
and wait for a rank that never comes, until the group's timeout. On plain gloo the
uneven list all_gather is refused on every rank alike (no hang). The gate must end
this row in budget: a failure whose attempts wait out a timeout is not shrunk."""

from __future__ import annotations

from .sizes_flag import all_gather_v_strided as all_gather_v

__all__ = ["all_gather_v"]

"""Thin layer over torch.distributed used by every communicating stage.

It answers "who am I in this group" (``GroupInfo``) and wraps each collective so a
failure surfaces as a vargather ``CollectiveError`` (timeout, lost peer) instead of a
bare ``RuntimeError`` from the backend. Nothing here knows about layouts or padding.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
import torch.distributed as dist

from ._errors import CollectiveError, CollectiveTimeoutError, GroupError, PeerLostError

__all__ = [
    "Group",
    "GroupInfo",
    "all_gather_equal",
    "all_to_all_uneven",
    "reduce_scatter_equal",
    "reduce_scatter_uneven",
    "resolve_group",
    "translate_collective_errors",
]

Group: TypeAlias = "dist.ProcessGroup | None"
"""A process group, or ``None`` for the default (world) group."""


@dataclass(frozen=True)
class GroupInfo:
    """This process's place in the group a gather runs on.

    ``distributed`` is False when torch.distributed is unavailable or not initialized:
    then the "group" is this process alone (rank 0 of 1) and nothing communicates.
    """

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    distributed: bool
    backend: str

    @property
    def communicates(self) -> bool:
        return self.distributed and self.world_size > 1

    def default_device(self) -> torch.device:
        """Device for metadata when the input gives none (it is not a tensor)."""
        if self.backend == "nccl" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def resolve_group(group: dist.ProcessGroup | None) -> GroupInfo:
    """Find this rank's position in ``group`` (``None``: the default group).

    Raises ``GroupError`` when a group is passed but torch.distributed is not
    initialized, or when this process is not a member of ``group``. Membership
    is a local fact: the members of ``group`` are not involved in this rank's
    mistake and proceed with their own gather among themselves.
    """
    initialized = dist.is_available() and dist.is_initialized()
    if not initialized:
        if group is not None:
            raise GroupError(
                "a process group was passed but torch.distributed is not initialized: "
                "expected group=None (a one-process 'world') or an initialized default group"
            )
        return GroupInfo(group=None, rank=0, world_size=1, distributed=False, backend="none")
    passed: object = group  # callers may hand us anything, e.g. NON_GROUP_MEMBER (an int)
    if passed is not None and not isinstance(passed, dist.ProcessGroup):
        if passed == dist.GroupMember.NON_GROUP_MEMBER:
            raise GroupError(
                f"global rank {dist.get_rank()} is not a member of the process group it "
                "passed (torch returns GroupMember.NON_GROUP_MEMBER from new_group on "
                "non-members): expected a group containing this rank"
            )
        raise GroupError(
            f"group must be a torch.distributed.ProcessGroup or None, got {type(passed).__name__}"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise GroupError(
            f"global rank {dist.get_rank()} is not a member of the process group it passed: "
            "expected a group containing this rank"
        )
    return GroupInfo(
        group=group,
        rank=rank,
        world_size=dist.get_world_size(group),
        distributed=True,
        backend=str(dist.get_backend(group)),
    )


_TIMEOUT_PATTERN = re.compile(r"timed? ?out|timeout|deadline", re.IGNORECASE)
_PEER_LOST_PATTERN = re.compile(
    r"connection (closed|reset)|broken pipe|closed by peer|reset by peer|socket|EOF",
    re.IGNORECASE,
)


@contextlib.contextmanager
def translate_collective_errors(what: str, info: GroupInfo) -> Iterator[None]:
    """Re-raise backend failures of the collective ``what`` as ``CollectiveError``s."""
    try:
        yield
    except RuntimeError as err:
        if isinstance(err, CollectiveError):
            raise
        text = str(err)
        where = f"{what} on rank {info.rank} of {info.world_size}"
        if _TIMEOUT_PATTERN.search(text):
            raise CollectiveTimeoutError(
                f"{where}: a peer did not arrive within the group's timeout "
                f"(backend said: {text.strip()[:400]})"
            ) from err
        if _PEER_LOST_PATTERN.search(text):
            raise PeerLostError(
                f"{where}: a peer closed its connection mid-collective, it probably died "
                f"(backend said: {text.strip()[:400]})"
            ) from err
        raise CollectiveError(f"{where} failed: {text.strip()[:400]}") from err


def _all_gather_single() -> Callable[..., Any]:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecates
    # the old name; older torch releases only have the old one.
    fn = getattr(dist, "all_gather_single", None)
    return fn if fn is not None else dist.all_gather_into_tensor


def _reduce_scatter_single() -> Callable[..., Any]:
    fn = getattr(dist, "reduce_scatter_single", None)
    return fn if fn is not None else dist.reduce_scatter_tensor


def all_gather_equal(output: torch.Tensor, local: torch.Tensor, info: GroupInfo) -> None:
    """``output`` (``W * k`` elements) receives every rank's ``local`` (``k`` each)."""
    # Flat views: backends disagree on which output shapes they accept (gloo takes
    # only the "cat along dim 0" form); 1-d is accepted everywhere.
    with translate_collective_errors("all_gather", info):
        _all_gather_single()(output.view(-1), local.reshape(-1), group=info.group)


def reduce_scatter_equal(output: torch.Tensor, full: torch.Tensor, info: GroupInfo) -> None:
    """``output`` (``k``) receives the sum over ranks of chunk ``rank`` of ``full``."""
    with translate_collective_errors("reduce_scatter", info):
        _reduce_scatter_single()(
            output.view(-1), full.reshape(-1), op=dist.ReduceOp.SUM, group=info.group
        )


def reduce_scatter_uneven(
    output: torch.Tensor, chunks: Sequence[torch.Tensor], info: GroupInfo
) -> None:
    """``output`` receives the sum over ranks of ``chunks[rank]`` (chunks may differ)."""
    with translate_collective_errors("reduce_scatter", info):
        dist.reduce_scatter(output, list(chunks), op=dist.ReduceOp.SUM, group=info.group)


def all_to_all_uneven(
    output: torch.Tensor,
    send: torch.Tensor,
    output_splits: Sequence[int],
    input_splits: Sequence[int],
    info: GroupInfo,
) -> None:
    """alltoallv along dim 0: rank ``j`` receives ``input_splits[j]`` rows from each peer."""
    with translate_collective_errors("all_to_all", info):
        dist.all_to_all_single(
            output,
            send,
            output_split_sizes=list(output_splits),
            input_split_sizes=list(input_splits),
            group=info.group,
        )

"""Who am I in this group, and the group's timeout: the facts every stage starts from.

Below every stage, beside ``_comm``: ``resolve_group`` turns ``group=`` into a
``GroupInfo`` (this rank, the world size, the backend), the first thing a call does;
the argument checks (``_args``) ask ``per_call_timeout_supported``, and ``_comm`` runs
each collective under ``call_timeout``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ._errors import GroupError


@dataclass(frozen=True)
class GroupInfo:
    """This process's place in the group a gather runs on.

    ``distributed`` is False when torch.distributed is unavailable or not initialized:
    then the "group" is this process alone (rank 0 of 1) and nothing communicates.
    ``timeout`` is the per-call timeout, ``None`` for the group's own.
    """

    group: dist.ProcessGroup | None
    rank: int
    world_size: int
    distributed: bool
    backend: str
    timeout: timedelta | None = field(default=None, compare=False)
    communicates: bool = field(init=False, compare=False, repr=False)
    """``distributed`` and more than one rank: a field, not a property, as every stage
    reads it on every call."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "communicates", self.distributed and self.world_size > 1)

    def default_device(self) -> torch.device:
        """Device for metadata: CPU except on NCCL, which carries only CUDA tensors."""
        if self.backend == "nccl" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def with_timeout(self, timeout: timedelta | None) -> GroupInfo:
        return GroupInfo(
            self.group, self.rank, self.world_size, self.distributed, self.backend, timeout
        )


def resolve_group(group: dist.ProcessGroup | None) -> GroupInfo:
    """Find this rank's position in ``group`` (``None``: the default group).

    Raises ``GroupError`` when a group is passed but torch.distributed is not
    initialized, when ``group`` is not a process group, or when this process is not a
    member of ``group``. These are raised **on this rank only**: a non-member takes
    no part in the group's collectives, so the members are not involved in its
    mistake and gather among themselves; a rank that passes something that is not a
    group cannot say which peers it meant to reach (they will time out, naming it).
    """
    initialized = dist.is_available() and dist.is_initialized()
    if group is None and initialized:
        world = dist.group.WORLD
        known = _DEFAULT_INFO.get(world) if isinstance(world, dist.ProcessGroup) else None
        if known is not None:  # the same default group as before: the same answers
            return known
    if not initialized:
        if group is not None:
            raise GroupError(
                "a process group was passed but torch.distributed is not initialized "
                "(or the group was destroyed): expected group=None (a one-process "
                f"'world') or a live group, got {type(group).__name__}"
            )
        return GroupInfo(group=None, rank=0, world_size=1, distributed=False, backend="none")
    passed: object = group  # callers may hand us anything, e.g. NON_GROUP_MEMBER (an int)
    if passed is not None and not isinstance(passed, dist.ProcessGroup):
        if isinstance(passed, int) and passed == dist.GroupMember.NON_GROUP_MEMBER:
            raise GroupError(
                f"global rank {dist.get_rank()} is not a member of the process group it "
                "passed (torch returns GroupMember.NON_GROUP_MEMBER from new_group on "
                "non-members): expected a group containing this rank, got "
                "GroupMember.NON_GROUP_MEMBER",
                ranks=[dist.get_rank()],
            )
        raise GroupError(
            "group must be a torch.distributed.ProcessGroup or None, got "
            f"{type(passed).__name__} on global rank {dist.get_rank()}",
            ranks=[dist.get_rank()],
        )
    try:
        rank = dist.get_rank(group)
    except (ValueError, RuntimeError) as err:  # a destroyed group, for one
        raise GroupError(
            f"global rank {dist.get_rank()} cannot use the process group it passed "
            f"(torch says: {err}): expected a live group containing this rank",
            ranks=[dist.get_rank()],
        ) from None
    if rank < 0:
        raise GroupError(
            f"global rank {dist.get_rank()} is not a member of the process group it passed: "
            "expected a group containing this rank",
            ranks=[dist.get_rank()],
        )
    info = GroupInfo(
        group=group,
        rank=rank,
        world_size=dist.get_world_size(group),
        distributed=True,
        backend=str(dist.get_backend(group)),
    )
    if group is None:
        world = dist.group.WORLD
        if isinstance(world, dist.ProcessGroup):
            _DEFAULT_INFO.clear()
            _DEFAULT_INFO[world] = info
    return info


_DEFAULT_INFO: weakref.WeakKeyDictionary[dist.ProcessGroup, GroupInfo] = weakref.WeakKeyDictionary()
"""The default group's ``GroupInfo`` (what ``resolve_group(None)`` found for that very
group object: its rank, size and backend never change; a new default group after
``destroy_process_group`` is another object, and is resolved afresh)."""


# --- timeouts ------------------------------------------------------------------------


def process_group(info: GroupInfo) -> dist.ProcessGroup | None:
    pg = info.group if info.group is not None else dist.group.WORLD
    return pg if isinstance(pg, dist.ProcessGroup) else None


def group_timeout(info: GroupInfo) -> timedelta | None:
    """The group's current default timeout, or ``None`` when torch does not say.

    Reads torch's private backend options (``_get_backend(...).options._timeout``),
    guarded: any failure means "unknown".
    """
    pg = process_group(info)
    if pg is None:
        return None
    try:
        backend = pg._get_backend(torch.device("cuda" if info.backend == "nccl" else "cpu"))
        value: object = backend.options._timeout  # private; may vanish in a later torch
    except Exception:
        return None
    return value if isinstance(value, timedelta) else None


def per_call_timeout_supported(info: GroupInfo) -> bool:
    """A per-call timeout needs the group's timeout readable (to restore it) and
    settable (``ProcessGroup.set_timeout``)."""
    pg = process_group(info)
    return pg is not None and hasattr(pg, "set_timeout") and group_timeout(info) is not None


_TIMEOUT_LOCK = threading.RLock()


@contextlib.contextmanager
def call_timeout(info: GroupInfo) -> Iterator[None]:
    """Run the body under ``info.timeout`` (if any), restoring the group's default."""
    pg = process_group(info)
    old = group_timeout(info) if info.timeout is not None else None
    if info.timeout is None or pg is None or old is None or old == info.timeout:
        yield
        return
    with _TIMEOUT_LOCK:
        pg.set_timeout(info.timeout)
        try:
            yield
        finally:
            pg.set_timeout(old)

"""The one group resolver: ``group=`` (a process group or a ``DeviceMesh``) to a ``GroupInfo``.

Where it sits: in front of every collective's pipeline, above ``_group`` (which knows
process groups only): eager calls resolve their group with ``call_group``, custom
operators (which receive it by name) with ``named_group``, traced code names it with
``group_of`` (which never raises and runs no more than dynamo can trace). As torch's functional collectives do, a 1-D mesh stands for its only
group and a mesh of more dimensions needs ``mesh_dim`` (an index or a dimension name).
Every problem is a ``GroupError``, raised on this rank only, like ``resolve_group``'s: a
rank that cannot name its group cannot tell its peers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

import torch.distributed as dist

from ._errors import GroupError
from ._group import GroupInfo, per_call_timeout_supported, resolve_group

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

GroupLike: TypeAlias = "dist.ProcessGroup | DeviceMesh | None"
"""What ``group=`` accepts: a process group, a device mesh, or ``None`` (the world)."""

MeshDim: TypeAlias = "int | str | None"
"""``mesh_dim=``: a mesh dimension's index or name, ``None`` for a 1-D mesh."""


def is_device_mesh(group: object) -> bool:
    """Whether ``group`` is a ``DeviceMesh`` (False when torch has no device mesh)."""
    if group is None or not dist.is_available():
        return False
    if isinstance(group, dist.ProcessGroup):  # the common case, without the import
        return False
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # a torch built without it
        return False
    return isinstance(group, DeviceMesh)


def _mesh_shape(mesh: DeviceMesh) -> str:
    names = mesh.mesh_dim_names
    shape = tuple(int(n) for n in mesh.shape)
    return f"{shape}" + (f" (dims named {list(names)})" if names else "")


def resolve_mesh(group: object, mesh_dim: object) -> object:
    """``group`` with a ``DeviceMesh`` replaced by its process group along ``mesh_dim``.

    Anything that is not a mesh passes through untouched (``resolve_group`` judges it),
    provided ``mesh_dim`` is ``None``.
    """
    if not is_device_mesh(group):
        if mesh_dim is not None:
            raise GroupError(
                "mesh_dim= names a dimension of a DeviceMesh: expected group= to be a "
                f"DeviceMesh, got {type(group).__name__} with mesh_dim={mesh_dim!r}"
            )
        return group
    mesh: DeviceMesh = group  # type: ignore[assignment]  # checked by is_device_mesh
    ndim = mesh.ndim
    if mesh_dim is None:
        if ndim != 1:
            raise GroupError(
                f"group= is a {ndim}-D DeviceMesh of shape {_mesh_shape(mesh)}: expected a "
                "1-D mesh, or mesh_dim= naming the dimension to gather along"
            )
        index: int | str = 0
    elif isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, str)):
        raise GroupError(
            "mesh_dim must be an int or a mesh dimension name, got "
            f"{type(mesh_dim).__name__} for a DeviceMesh of shape {_mesh_shape(mesh)}"
        )
    elif isinstance(mesh_dim, int):
        if not -ndim <= mesh_dim < ndim:
            raise GroupError(
                f"mesh_dim={mesh_dim} is out of range for a DeviceMesh of shape "
                f"{_mesh_shape(mesh)}: expected -{ndim} <= mesh_dim < {ndim}"
            )
        index = mesh_dim % ndim
    else:
        names = mesh.mesh_dim_names or ()
        if mesh_dim not in names:
            raise GroupError(
                f"mesh_dim={mesh_dim!r} is not a dimension name of the DeviceMesh of shape "
                f"{_mesh_shape(mesh)}: expected one of {list(names)}"
            )
        index = mesh_dim
    try:
        return mesh.get_group(index)
    except Exception as err:  # torch's own refusal (an uninitialized mesh, for one)
        raise GroupError(
            f"the DeviceMesh of shape {_mesh_shape(mesh)} has no usable process group for "
            f"mesh_dim={mesh_dim!r} (torch says: {err})"
        ) from None


def call_group(group: object, mesh_dim: object = None) -> GroupInfo:
    """The group of an eager call: ``group`` (``None``: the default group; a
    ``DeviceMesh`` with ``mesh_dim``) as this rank's ``GroupInfo``."""
    return resolve_group(resolve_mesh(group, mesh_dim))  # type: ignore[arg-type]  # judged there


# --- groups by name (the custom operators) ---------------------------------------------

NO_GROUP = ""  # the operator's name for "torch.distributed not initialized"


def group_named(name: str) -> dist.ProcessGroup | None:
    """The process group an operator names (``""``: no torch.distributed)."""
    if name == NO_GROUP:
        return None
    from torch.distributed import distributed_c10d as c10d

    # Private, as for torch's functional collectives (which resolve names the same way).
    resolve: Callable[[Any], dist.ProcessGroup] = c10d._resolve_process_group  # type: ignore[attr-defined]  # not re-exported
    return resolve(name)


def named_group(name: str, seconds: float | None = None) -> GroupInfo:
    """The group of a custom operator, which names it (``group_named``), with the call's
    per-call timeout of ``seconds`` where the backend supports one."""
    info = resolve_group(group_named(name))
    if seconds is not None and info.communicates and per_call_timeout_supported(info):
        info = info.with_timeout(timedelta(seconds=seconds))
    return info


def group_of(group: object, mesh_dim: object) -> tuple[str, int, int] | None:
    """The operator's name for ``group`` (with ``mesh_dim``), this rank's place in it
    and its size; ``None`` when only the eager path can say what is wrong with it."""
    if not (dist.is_available() and dist.is_initialized()):
        return (NO_GROUP, 0, 1) if group is None and mesh_dim is None else None
    if is_device_mesh(group):
        try:
            group = resolve_mesh(group, mesh_dim)
        except Exception:
            return None
    elif mesh_dim is not None:
        return None
    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, dist.ProcessGroup):
        return None
    rank = dist.get_rank(pg)
    if rank < 0:
        return None
    return str(pg.group_name), rank, dist.get_world_size(pg)

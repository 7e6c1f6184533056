"""``group=`` as a ``DeviceMesh``: resolved to the process group of one mesh dimension.

Where it sits: in front of the pipeline. ``_api`` hands ``group`` and ``mesh_dim`` here
before ``_comm.resolve_group`` (which knows process groups only); the compiled path
(``_compiled``) uses it too. As torch's functional collectives do, a 1-D mesh stands
for its only group and a mesh of more dimensions needs ``mesh_dim`` (an index or a
dimension name). Every problem is a ``GroupError``, raised on this rank only, like
``resolve_group``'s: a rank that cannot name its group cannot tell its peers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import torch.distributed as dist

from ._errors import GroupError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["GroupLike", "MeshDim", "is_device_mesh", "resolve_mesh"]

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

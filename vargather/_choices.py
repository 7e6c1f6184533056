"""The closed vocabularies of a call, and what each backend refuses of them.

Below every stage, beside the dtype table (``_dtypes``): the argument checks
(``_args``) look a choice up here, the wire format (``_wire``) sends its position as
its code, validation (``_exchange``) names a code back, and the transports
(``_transport``) are registered under these names. Each vocabulary is written once,
as a ``Literal`` type; the tuple of its values is derived from it, in the order of the
wire codes (append only).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

GradContract: TypeAlias = Literal["sum", "local", "mean"]
"""The gradient contracts ``grad=`` accepts (see ``_autograd``)."""

CONTRACTS: Final[tuple[GradContract, ...]] = typing.get_args(GradContract)
"""Gradient contracts, in the order of their wire codes."""

TransportName: TypeAlias = Literal["auto", "padded", "alltoallv", "broadcast", "views"]
"""The values ``transport=`` accepts (see ``_transport``)."""

TRANSPORT_NAMES: Final[tuple[TransportName, ...]] = typing.get_args(TransportName)
"""Values accepted for ``transport=``, in the order of their wire codes."""

DEVICE_TYPES: Final = ("cpu", "cuda", "xpu", "mps", "meta", "hpu", "privateuseone")
"""Device types a record can name, in the order of their wire codes (-1: another)."""

BACKEND_DEVICES: Final[Mapping[str, frozenset[str]]] = {
    "gloo": frozenset({"cpu", "cuda"}),
    "nccl": frozenset({"cuda"}),
}
"""Device types each known backend carries; other backends are not checked."""

_REFUSED: Final[Mapping[tuple[str, str], str]] = {
    ("views", "gloo"): (
        "transport='views' gathers with dist.all_gather into views of different sizes, "
        "which the gloo backend refuses (ProcessGroupGloo::allgather: invalid tensor "
        "size); expected transport='broadcast' (the same copy-free one-buffer gather, "
        "as one broadcast per rank), 'auto', or an NCCL group"
    ),
}


def unsupported_reason(name: str, backend: str) -> str | None:
    """Why transport ``name`` cannot run on ``backend`` (a message), or ``None`` if it can.

    Every rank of a group has the same backend, so every rank reaches the same verdict
    without communicating; the argument checks record it, and every rank reports it
    after the exchange, before any payload moves.
    """
    return _REFUSED.get((name, backend))

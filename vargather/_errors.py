"""The error hierarchy: every failure vargather reports is a ``VarGatherError``.

Below every stage: the argument checks (``_args``) pick the class of a local problem,
validation (``_exchange``) raises it, ``_comm`` raises the collective errors.

Each leaf also subclasses the builtin that fits it (``TypeError``, ``ValueError``,
``IndexError``, ``TimeoutError``, ``ConnectionError``), so ``except ValueError`` keeps
working for callers who do not know vargather.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ArgumentError",
    "ArgumentMismatchError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "DTypeMismatchError",
    "DimError",
    "GroupError",
    "InputShapeError",
    "InputTypeError",
    "MismatchError",
    "PeerLostError",
    "ProtocolMismatchError",
    "RequiresGradMismatchError",
    "ShapeMismatchError",
    "SizesError",
    "SizesMismatchError",
    "SizesTypeError",
    "VarGatherError",
]


class VarGatherError(Exception):
    """Root of every error vargather raises.

    ``ranks`` are the group ranks the error blames (the offending or missing ranks),
    in increasing order; empty when no rank can be named. The message names them too.
    """

    ranks: tuple[int, ...]

    def __init__(self, message: str, *, ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(sorted(set(ranks)))


# --- problems with one rank's own arguments (reported on every rank) -------------


class InputTypeError(VarGatherError, TypeError):
    """The input is not a ``torch.Tensor``, or its dtype cannot be gathered."""


class InputShapeError(VarGatherError, ValueError):
    """The input has no dimension to gather along (0-d) or too many dimensions."""


class DimError(VarGatherError, IndexError):
    """``dim`` is out of range for the input, or not an integer."""


class SizesError(VarGatherError, ValueError):
    """Caller-passed ``sizes`` are malformed (wrong length, negative) or disagree with
    the tensors they describe."""


class SizesTypeError(SizesError, TypeError):
    """Caller-passed ``sizes`` are not integers (floats, a float tensor, a string)."""


class ArgumentError(VarGatherError, ValueError):
    """A keyword argument has a value vargather does not know (``grad``, ``transport``)."""


class GroupError(VarGatherError, ValueError):
    """The process group cannot be used: this rank is not a member of it, or a group
    was passed while torch.distributed is not initialized."""


# --- ranks that disagree with each other ------------------------------------------


class MismatchError(VarGatherError, ValueError):
    """Ranks called the gather with arguments that cannot be combined."""


class DTypeMismatchError(MismatchError, TypeError):
    """Ranks passed tensors of different dtypes (gloo would reinterpret the bits)."""


class ShapeMismatchError(MismatchError):
    """Ranks passed tensors whose ndim or non-gathered dimensions differ."""


class SizesMismatchError(MismatchError, SizesError):
    """Ranks passed different ``sizes``, or ``sizes`` that contradict the tensors."""


class ArgumentMismatchError(MismatchError):
    """Ranks passed different ``dim``, ``grad`` contract, ``transport`` or devices."""


class RequiresGradMismatchError(MismatchError):
    """Under a communicating gradient contract (``sum``, ``mean``) the backward is a
    collective: every rank must need a gradient, or none."""


class ProtocolMismatchError(MismatchError):
    """A peer sent metadata vargather cannot read (another vargather version, or a
    different collective issued on the same group)."""


# --- the transport failed ----------------------------------------------------------


class CollectiveError(VarGatherError, RuntimeError):
    """A collective call failed inside torch.distributed."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A peer did not arrive within the timeout (the call's ``timeout=`` or the
    group's). ``ranks`` are the ranks that never arrived, when the arrival census
    (``vargather._comm``) could tell. After it the group is out of step: re-create it."""


class PeerLostError(CollectiveError, ConnectionError):
    """A peer closed its connection mid-collective (it died or aborted). ``ranks``
    are the ranks that never arrived, when the arrival census could tell."""


_classes: list[type[VarGatherError]] = [VarGatherError]
for _cls in _classes:  # this module's classes: none is defined elsewhere yet
    _cls.__module__ = "vargather"  # tracebacks show the public name
    _classes.extend(_cls.__subclasses__())
del _cls, _classes

"""Stage 1: the local argument checks, one rank's call as a ``CallRecord``.

``check_call`` reads what this rank was called with and never raises, whatever the
arguments: a rank that raised here would leave its peers waiting in the exchange. The
first problem it finds becomes a ``Problem``: the error class and the finished message,
written here, where the offending value is at hand. The exchange (``_exchange``) sends
the record to every rank, and every rank raises the same error for it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, NamedTuple

import torch

from ._choices import BACKEND_DEVICES, CONTRACTS, DEVICE_TYPES, TRANSPORT_NAMES, unsupported_reason
from ._dtypes import GLOO_DTYPES, dtype_code, dtype_from_code, dtype_name
from ._errors import (
    ArgumentError,
    DimError,
    InputShapeError,
    InputTypeError,
    SizesError,
    SizesTypeError,
    VarGatherError,
)
from ._group import GroupInfo, per_call_timeout_supported

MAX_NDIM: Final = 32
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
_MAX_TIMEOUT_S: Final = 1e9  # about 31 years; timedelta holds up to 999999999 days
_MIN_TIMEOUT_S: Final = 1e-3  # gloo counts in milliseconds: less rounds to "expire at once"
_CHOICE_SHOWN: Final = 64  # characters of a bad grad=/transport= value in a message
_HASH_MODULUS: Final = (1 << 61) - 1


@dataclass(frozen=True)
class Problem:
    """What is wrong with one rank's own arguments: the error and its message."""

    error: type[VarGatherError]
    message: str


@dataclass(frozen=True)
class CallRecord:
    """One rank's call, as every other rank will see it.

    ``problem`` is the first thing found wrong (``None``: nothing). Sizes fields are -1
    when no ``sizes`` were passed; ``device_code`` is -1 for a device type outside
    ``DEVICE_TYPES``. Every integer fits int64 (``check_call`` saturates).
    """

    problem: Problem | None
    ndim: int
    dtype_code: int
    dim: int  # as passed (may be negative); 0 when not an int
    normalized_dim: int  # -1 when unknown
    contract_code: int
    transport_code: int
    requires_grad: bool
    device_code: int
    sizes_len: int
    sizes_own: int
    sizes_sum: int
    sizes_hash: int
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype | None:
        return dtype_from_code(self.dtype_code)

    @property
    def sizes_passed(self) -> bool:
        return self.sizes_len >= 0

    @property
    def size_along_dim(self) -> int:
        return self.shape[self.normalized_dim]

    @property
    def other_dims(self) -> tuple[int, ...]:
        """The shape without the gather dimension."""
        d = self.normalized_dim
        return self.shape[:d] + self.shape[d + 1 :]


class CheckedCall(NamedTuple):
    """What ``check_call`` found: the record, and what only this rank needs of it.

    ``sizes``: the caller's ``sizes`` as ints (``None`` when not passed or malformed);
    ``timeout``: the per-call timeout to apply (``None``: the group's own).
    """

    record: CallRecord
    sizes: tuple[int, ...] | None
    timeout: timedelta | None


def saturate(value: int) -> int:
    """``value`` clamped into int64 (user values such as ``dim`` can be any int)."""
    return max(INT64_MIN, min(INT64_MAX, value))


def as_index(value: object) -> int | None:
    """``value`` as an int through ``__index__``, or ``None`` (a bool, or no index)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # any object is tried; failing ones give None
    except Exception:
        return None


def show_int(value: int) -> str:
    """A saturated integer for a message: the clamped ends say so."""
    if value == INT64_MAX:
        return f"{value} (or more)"
    if value == INT64_MIN:
        return f"{value} (or less)"
    return str(value)


def sizes_hash(sizes: Sequence[int]) -> int:
    """A 61-bit polynomial hash of a sizes list, identical in every process."""
    h = len(sizes) + 1
    for n in sizes:
        h = (h * 1_000_003 + n + 1) % _HASH_MODULUS
    return h


def _describe_value(v: object) -> str:
    if isinstance(v, torch.Tensor):
        return f"a tensor of dtype {dtype_name(v.dtype)} and shape {tuple(v.shape)}"
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 24 else text[:21] + '...'}"


def _not_integers(at: int, what: str) -> Problem:
    where = f"sizes[{at}]" if at >= 0 else "sizes"
    return Problem(SizesTypeError, f"sizes must hold integers, got {where} = {what}")


def _is_non_integer_tensor(v: torch.Tensor) -> bool:
    return v.is_floating_point() or v.is_complex() or v.dtype == torch.bool


def parse_sizes(sizes: object) -> tuple[int, ...] | Problem:
    """Caller ``sizes`` (a sequence of ints or a 1-d integer tensor) as a tuple of ints,
    or what is wrong with them. Never raises; the length is checked by the caller."""
    try:
        if isinstance(sizes, torch.Tensor):
            if _is_non_integer_tensor(sizes):
                return _not_integers(-1, _describe_value(sizes))
            if sizes.ndim != 1:
                return Problem(
                    SizesError, f"sizes must be a 1-d integer tensor, got {_describe_value(sizes)}"
                )
            values = [int(v) for v in sizes.tolist()]
        elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            return _not_integers(-1, type(sizes).__name__)
        else:
            values = []
            for i, v in enumerate(sizes):
                n = (
                    None
                    if isinstance(v, torch.Tensor) and _is_non_integer_tensor(v)
                    else as_index(v)
                )
                if n is None:
                    return _not_integers(i, _describe_value(v))
                values.append(n)
    except Exception as err:  # a Sequence whose iteration raises, a tensor on a dead device
        return _not_integers(-1, f"{type(err).__name__} reading it")
    for i, n in enumerate(values):
        if n < 0:
            return Problem(
                SizesError, f"sizes must be >= 0, got sizes[{i}] = {show_int(saturate(n))}"
            )
    return tuple(values)


def _bad_timeout(timeout: object) -> Problem:
    return Problem(
        ArgumentError,
        f"timeout must be None, or a number of seconds or a timedelta from "
        f"{_MIN_TIMEOUT_S:g} s to {_MAX_TIMEOUT_S:g} s, got {_describe_value(timeout)}",
    )


def parse_timeout(timeout: object) -> timedelta | Problem | None:
    """``timeout=`` as a positive ``timedelta`` (``None`` stays ``None``), or the problem.

    Accepts seconds (int or float) or a ``timedelta`` from 1 ms (gloo's resolution: a
    shorter one would expire at once) to 1e9 s. Never raises.
    """
    if timeout is None:
        return None
    try:
        if isinstance(timeout, timedelta):
            seconds = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            try:
                seconds = float(timeout)
            except OverflowError:
                seconds = math.inf
        else:
            return _bad_timeout(timeout)
    except Exception:  # an exotic number type whose conversion raises
        return _bad_timeout(timeout)
    if not (math.isfinite(seconds) and _MIN_TIMEOUT_S <= seconds <= _MAX_TIMEOUT_S):
        return _bad_timeout(timeout)
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)


def _code_of(value: object, table: Sequence[str]) -> int:
    return table.index(value) if isinstance(value, str) and value in table else -1


def _choice_problem(what: str, value: object, table: Sequence[str]) -> Problem:
    return Problem(
        ArgumentError,
        f"{what} must be one of {', '.join(map(repr, table))}, got {repr(value)[:_CHOICE_SHOWN]}",
    )


def check_call(
    x: object,
    dim: object,
    *,
    sizes: object,
    grad: object,
    transport: object,
    info: GroupInfo,
    validate: object = True,
    timeout: object = None,
) -> CheckedCall:
    """This rank's call as a record, with the first problem found (never raises)."""
    key: tuple[object, ...] | None = None
    if (
        sizes is None
        and timeout is None
        and type(x) in _PLAIN_TENSORS
        and type(dim) is int
        and type(grad) is str
        and type(transport) is str
        and type(validate) is bool
    ):
        assert isinstance(x, torch.Tensor)
        if x.layout == torch.strided and not x.is_nested:
            requires = x.requires_grad and torch.is_grad_enabled()
            key = (x.shape, x.dtype, x.device, requires, dim, grad, transport, validate)
            key += (info.backend, info.distributed, info.world_size, info.rank)
            known = _CHECKED.get(key)
            if known is not None:
                return known
    checked = _check_call(x, dim, sizes, grad, transport, info, validate, timeout)
    if key is not None and checked.record.problem is None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = checked
    return checked


_PLAIN_TENSORS: Final = (torch.Tensor, torch.nn.Parameter)
_CHECKED: dict[tuple[object, ...], CheckedCall] = {}
"""Problem-free ``check_call`` results by everything they are a function of, for the
common call (a plain strided tensor, no ``sizes``, no ``timeout``, plain ``dim``,
``grad``, ``transport`` and ``validate``): repeated calls skip the checks."""
_CHECKED_MAX: Final = 256


def _check_call(
    x: object,
    dim: object,
    sizes: object,
    grad: object,
    transport: object,
    info: GroupInfo,
    validate: object,
    timeout: object,
) -> CheckedCall:
    problems: list[Problem] = []
    backend = info.backend[:_CHOICE_SHOWN]

    shape: tuple[int, ...] = ()
    code_of_dtype = 0
    requires_grad = False
    device_code = 0
    usable = False  # a strided tensor whose shape can be read
    if not isinstance(x, torch.Tensor):
        problems.append(Problem(InputTypeError, f"expected a torch.Tensor, got {type(x).__name__}"))
    else:
        try:
            if x.is_nested or x.layout != torch.strided:
                kind = "nested" if x.is_nested else str(x.layout)
                problems.append(_not_strided(kind))
            else:
                shape = tuple(int(n) for n in x.shape)
                code_of_dtype = dtype_code(x.dtype)
                requires_grad = x.requires_grad and torch.is_grad_enabled()
                device_code = _code_of(x.device.type, DEVICE_TYPES)
                usable = True
        except Exception as err:  # an exotic tensor subclass whose metadata cannot be read
            shape, usable = (), False
            problems.append(_not_strided(f"{type(x).__name__} ({type(err).__name__})"))
    ndim = len(shape)

    contract_code = _code_of(grad, CONTRACTS)
    if contract_code < 0:
        problems.append(_choice_problem("grad", grad, CONTRACTS))
    transport_code = _code_of(transport, TRANSPORT_NAMES)
    if transport_code < 0:
        problems.append(_choice_problem("transport", transport, TRANSPORT_NAMES))
    elif info.distributed:
        # Refused in every world size, one rank included, so that code tried on one
        # rank does not break when it scales up.
        refused = unsupported_reason(TRANSPORT_NAMES[transport_code], info.backend)
        if refused is not None:
            problems.append(Problem(ArgumentError, refused))
    if not isinstance(validate, bool):
        problems.append(
            Problem(ArgumentError, f"validate must be a bool, got {_describe_value(validate)}")
        )
    call_timeout: timedelta | None = None
    parsed_timeout = parse_timeout(timeout)
    if isinstance(parsed_timeout, Problem):
        problems.append(parsed_timeout)
    elif parsed_timeout is not None and info.communicates:
        if per_call_timeout_supported(info):
            call_timeout = parsed_timeout
        else:
            problems.append(
                Problem(
                    ArgumentError,
                    "a per-call timeout needs a backend whose timeout torch can read and "
                    f"set, got backend {backend} (use the group's timeout: timeout=None)",
                )
            )

    if usable and ndim == 0:
        problems.append(
            Problem(
                InputShapeError, "expected a tensor with at least 1 dimension, got a 0-d tensor"
            )
        )
    elif ndim > MAX_NDIM:
        problems.append(
            Problem(InputShapeError, f"expected at most {MAX_NDIM} dimensions, got {ndim}")
        )
    if isinstance(x, torch.Tensor) and usable:
        if code_of_dtype == 0 or (info.backend == "gloo" and x.dtype not in GLOO_DTYPES):
            problems.append(
                Problem(
                    InputTypeError,
                    f"dtype {dtype_name(x.dtype)} cannot be gathered on this backend: expected "
                    "one of " + ", ".join(sorted(dtype_name(d) for d in GLOO_DTYPES)),
                )
            )
        carried = BACKEND_DEVICES.get(info.backend)
        if info.communicates and carried is not None and x.device.type not in carried:
            problems.append(
                Problem(
                    InputTypeError,
                    "expected a tensor on a device this backend carries, got a "
                    f"{x.device.type} tensor",
                )
            )

    raw_dim = 0
    normalized_dim = -1
    dim_int = as_index(dim)
    if dim_int is None:
        problems.append(Problem(DimError, f"expected dim to be an int, got {_describe_value(dim)}"))
    else:
        raw_dim = saturate(dim_int)
        if usable and ndim > 0:
            if -ndim <= dim_int < ndim:
                normalized_dim = dim_int % ndim
            else:
                problems.append(
                    Problem(
                        DimError,
                        f"dim={show_int(raw_dim)} is out of range: expected -{ndim} <= dim "
                        f"< {ndim} for a {ndim}-d tensor",
                    )
                )

    passed: tuple[int, ...] | None = None
    sizes_len = sizes_own = sizes_sum = hashed = -1
    if sizes is not None:
        parsed = parse_sizes(sizes)
        if isinstance(parsed, Problem):
            problems.append(parsed)
        else:
            passed = parsed
            sizes_len, sizes_sum = len(parsed), saturate(sum(parsed))
            hashed = sizes_hash(parsed)
            if len(parsed) != info.world_size:
                problems.append(
                    Problem(
                        SizesError,
                        f"expected len(sizes) == world size {info.world_size}, got {len(parsed)}",
                    )
                )
            else:
                own = parsed[info.rank]
                sizes_own = saturate(own)
                if normalized_dim >= 0 and own != shape[normalized_dim]:
                    problems.append(
                        Problem(
                            SizesError,
                            f"expected sizes[{info.rank}] == {shape[normalized_dim]} (its "
                            f"tensor's size along dim {normalized_dim}), got "
                            f"sizes[{info.rank}] = {show_int(sizes_own)}",
                        )
                    )

    record = CallRecord(
        problem=problems[0] if problems else None,
        ndim=ndim,
        dtype_code=code_of_dtype,
        dim=raw_dim,
        normalized_dim=normalized_dim,
        contract_code=contract_code,
        transport_code=transport_code,
        requires_grad=requires_grad,
        device_code=device_code,
        sizes_len=sizes_len,
        sizes_own=sizes_own,
        sizes_sum=sizes_sum,
        sizes_hash=hashed,
        shape=shape[:MAX_NDIM],
    )
    return CheckedCall(record, passed, call_timeout)


def _not_strided(kind: str) -> Problem:
    return Problem(InputTypeError, f"expected a dense (torch.strided) tensor, got a {kind} tensor")

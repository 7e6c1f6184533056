"""The property suite's case model, its rank-side runner and its judge.

Where it sits: outside the pipeline, next to ``vargather.oracle``. The pipeline
(metadata -> padding -> transport -> compaction -> autograd) is what is tested; this
module says *what* to run and *whether the answer is right*:

1. A ``GatherCase`` is a small, picklable, frozen description of one ragged gather:
   per-rank shapes, ``dim``, dtype, gradient contract, transport, whether ``sizes`` is
   passed, each rank's memory layout and a ``seed``. Every tensor of the case (rank
   r's shard ``x_r``, rank r's upstream gradient ``g_r``) is rebuilt from the seed by a
   deterministic generator, in the parent and in the ranks alike, so only the
   description crosses the pipe. ``case.expected()`` is the oracle's answer, computed
   lazily in the parent (like ``BroadcastableShapes.result_shape``).
2. ``run_on_rank`` (module level, so the pool can pickle it) runs one case on one rank
   against a pluggable ``Implementation`` and returns a ``RankReport``: the output's
   bytes, dtype, shape and device, the sizes or layout it returned, and the input
   gradient after ``out.backward(g_r)``.
3. ``judge`` compares the reports with the oracle in the parent and returns uniform
   messages (``out.shape=(3,), but should be (4,) [all_gather_v(dim=1) on rank 2 of
   3]``); ``describe`` renders a failing case with a command that reproduces it.

The properties (``properties()``) pair a Hypothesis strategy of case batches with this
runner. ``tests/test_properties.py``, the mutant catalogue and the conformance CLI all
run the same ones.

Comparison rules (``docs/property-suite.md`` has the table):

* forward: bit for bit (the bytes of ``out`` and of ``torch.cat(x, dim)``), so NaN
  payloads, -0.0 and bfloat16 bits count; dtype, shape and device exactly;
* gradients, with ``g_j`` different on every rank: exact (``torch.equal``) for
  ``local``, for ``W = 1``, and when ``g`` holds small integers (``sum``, and ``mean``
  when ``W`` is a power of two); otherwise elementwise
  ``|dx - oracle| <= (W + 1) * eps(dtype) * B + W * s`` where ``B`` is the oracle's
  gradient for ``|g|`` (the floating-point error bound of a sum of ``W`` terms) and
  ``s`` the dtype's smallest subnormal;
* the adjoint identity ``Σ_r <dx_r, x_r> = Σ_j <g_j, out_j>`` (``sum`` contract,
  small-integer values, computed exactly in float64).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import itertools
import math
import os
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, TypeGuard

import torch

from . import oracle
from ._metadata import CONTRACTS, GLOO_DTYPES
from ._transport import TRANSPORT_NAMES

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "COMPAT",
    "DTYPE_NAMES",
    "MEMORY_LAYOUTS",
    "SIZES_FORMS",
    "UPSTREAM_KINDS",
    "VALUE_KINDS",
    "VARGATHER",
    "Expected",
    "GatherCase",
    "Implementation",
    "Property",
    "RankReport",
    "TensorBytes",
    "Verdict",
    "check_cases",
    "describe",
    "example_counts",
    "judge",
    "main",
    "make_upstream",
    "make_values",
    "parse_case",
    "properties",
    "reset_example_counts",
    "run_cases",
    "run_on_rank",
    "transport_refusals",
]

# --- vocabulary ----------------------------------------------------------------------

_PREFERRED_ORDER: Final = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _gloo_dtype_names() -> tuple[str, ...]:
    names = {_dtype_name(d) for d in GLOO_DTYPES}
    ordered = [n for n in _PREFERRED_ORDER if n in names]
    return (*ordered, *sorted(names - set(ordered)))


DTYPE_NAMES: Final[tuple[str, ...]] = _gloo_dtype_names()
"""Every dtype vargather gathers on gloo, simplest first (Hypothesis shrinks toward
``float32``)."""

MEMORY_LAYOUTS: Final = ("contiguous", "transposed", "sliced")
"""How a rank's shard sits in memory: packed; its dimensions stored in reverse order
(a transposed view); or every other element of a larger buffer (strides of 2 and a
non-zero storage offset)."""

SIZES_FORMS: Final = ("none", "list", "tensor")
"""How ``sizes`` is passed: not at all, as a list of ints, as a 1-d int64 tensor."""

VALUE_KINDS: Final = ("full", "integers")
"""``full``: the dtype's whole bit range with special values mixed in (NaN with
payloads, +-inf, -0.0, subnormals, extremes); ``integers``: small integers in
[-8, 8] (sums and inner products of them are exact)."""

UPSTREAM_KINDS: Final = ("integers", "real")
"""Upstream gradients: small integers (exact sums) or real values with full mantissas."""

_SMALL: Final = 8  # |integer values| <= _SMALL


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype={name!r} is not a torch dtype name")
    return dtype


def _is_differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


# --- deterministic values --------------------------------------------------------------

_FLOAT_FORMATS: Final[dict[torch.dtype, tuple[int, int, torch.dtype]]] = {
    # dtype: (bits, mantissa bits, same-width integer dtype)
    torch.float64: (64, 52, torch.int64),
    torch.float32: (32, 23, torch.int32),
    torch.float16: (16, 10, torch.int16),
    torch.bfloat16: (16, 7, torch.int16),
}


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@functools.cache
def _specials(dtype: torch.dtype) -> torch.Tensor:
    """Special values of a real dtype, built from bit patterns (NaN payloads survive)."""
    if dtype in _FLOAT_FORMATS:
        bits, mant, int_dtype = _FLOAT_FORMATS[dtype]
        sign = 1 << (bits - 1)
        exp_all = ((1 << (bits - 1 - mant)) - 1) << mant
        one = ((1 << (bits - 2 - mant)) - 1) << mant
        patterns = [
            0,  # +0.0
            sign,  # -0.0
            exp_all,  # +inf
            sign | exp_all,  # -inf
            exp_all | (1 << (mant - 1)),  # the canonical quiet NaN
            exp_all | (1 << (mant - 1)) | 1,  # a quiet NaN with a payload
            sign | exp_all | (1 << (mant - 1)) | 5,  # a negative NaN with a payload
            exp_all | 1,  # a signaling NaN (payload 1)
            1,  # smallest subnormal
            (1 << mant) - 1,  # largest subnormal
            sign | 1,  # -smallest subnormal
            1 << mant,  # smallest normal
            exp_all - 1,  # largest finite
            sign | (exp_all - 1),  # most negative finite
            one,  # 1.0
            sign | one,  # -1.0
            one | 1,  # 1 + eps
        ]
        raw = torch.tensor([_signed(p, bits) for p in patterns], dtype=int_dtype).view(dtype)
        if dtype == torch.float64:
            # float64 values float32 cannot hold: out of its range, or too precise.
            extra = torch.tensor([1e300, -1e-300, 2.0**-1074 * 3, 1.0 + 2.0**-40, 16777217.0])
            raw = torch.cat([raw, extra.to(torch.float64)])
        return raw
    if dtype == torch.bool:
        return torch.tensor([False, True])
    info = torch.iinfo(dtype)
    values = {0, 1, info.max, info.min, info.max - 1, info.min + 1}
    if info.min < 0:
        values.add(-1)
    if info.bits >= 32:
        values |= {2**24 + 1, -(2**24 + 1)}  # not representable in float32
    if info.bits >= 64:
        values |= {2**53 + 1, -(2**53 + 1), 2**62 + 3}  # not representable in float64
    return torch.tensor(sorted(values), dtype=dtype)


def _seed(seed: int, stream: int) -> int:
    mixed = (seed * 0x9E3779B97F4A7C15 + (stream + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    mixed ^= mixed >> 31
    return mixed & ((1 << 63) - 1)


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.complex64:
        return torch.float32
    if dtype == torch.complex128:
        return torch.float64
    return dtype


def make_values(shape: Sequence[int], dtype: torch.dtype, seed: int, kind: str) -> torch.Tensor:
    """A contiguous tensor of ``shape``, deterministic in ``seed``.

    ``kind="full"``: random bit patterns of the dtype (every exponent, NaNs with
    payloads, subnormals) with about a third of the elements replaced by special
    values (+-0, +-inf, NaNs, subnormal and normal extremes, integer extremes, int64
    values float64 cannot hold, float64 values float32 cannot hold); complex dtypes
    get both parts this way. ``kind="integers"``: integers in [-8, 8] (bool: 0/1).
    """
    if kind not in VALUE_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {VALUE_KINDS}")
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    real = _real_dtype(dtype)
    count = numel * (2 if dtype.is_complex else 1)
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (count,), generator=gen).to(torch.bool)
    elif kind == "integers":
        low = 0 if dtype == torch.uint8 else -_SMALL
        flat = torch.randint(low, _SMALL + 1, (count,), generator=gen).to(real)
    else:
        width = torch.empty((), dtype=real).element_size()
        raw = torch.randint(0, 256, (count * width,), dtype=torch.uint8, generator=gen)
        flat = raw.view(real).clone()
        specials = _specials(real)
        use = torch.randint(0, 3, (count,), generator=gen) == 0
        pick = torch.randint(0, len(specials), (count,), generator=gen)
        flat[use] = specials[pick[use]]
    if dtype.is_complex:
        flat = torch.view_as_complex(flat.view(numel, 2))
    return flat.view(tuple(shape))


def make_upstream(
    shape: Sequence[int], dtype: torch.dtype, seed: int, rank: int, kind: str
) -> torch.Tensor:
    """Rank ``rank``'s upstream gradient ``g_rank``: different on every rank.

    ``kind="integers"``: integers in [-8, 8]; ``kind="real"``: normal values times
    2^k, k in [-3, 3], with full mantissas. Element 0 is ``rank + 1`` so that no two
    ranks' gradients are equal whenever the output is not empty.
    """
    if kind not in UPSTREAM_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {UPSTREAM_KINDS}")
    if not _is_differentiable(dtype):
        raise ValueError(f"dtype {dtype} has no gradients")
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    count = numel * (2 if dtype.is_complex else 1)
    if kind == "integers":
        flat = torch.randint(-_SMALL, _SMALL + 1, (count,), generator=gen).to(torch.float64)
    else:
        scale = torch.randint(-3, 4, (count,), generator=gen).to(torch.float64).exp2()
        flat = torch.randn(count, generator=gen, dtype=torch.float64) * scale
    if count:
        flat[0] = rank + 1
    flat = flat.to(_real_dtype(dtype))
    if dtype.is_complex:
        flat = torch.view_as_complex(flat.view(numel, 2))
    return flat.view(tuple(shape))


def _lay_out(values: torch.Tensor, memory: str) -> torch.Tensor:
    """``values`` (contiguous) in the memory layout ``memory``, same logical content."""
    if memory == "contiguous":
        return values
    if memory == "transposed":
        order = list(range(values.ndim))[::-1]
        return values.permute(order).contiguous().permute(order)
    if memory == "sliced":
        base = torch.zeros([2 * s + 1 for s in values.shape], dtype=values.dtype)
        view = base[tuple(slice(1, None, 2) for _ in values.shape)]
        view.copy_(values)
        return view
    raise ValueError(f"memory={memory!r} is not one of {MEMORY_LAYOUTS}")


# --- the case --------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {tuple(choices)}")


@dataclass(frozen=True)
class GatherCase:
    """One ragged gather, every tensor of it reproducible from ``seed``.

    Rank ``r`` (of the gather group) holds ``x_r``, a tensor of shape ``shapes[r]``
    (shapes differ only along ``dim``) whose values come from ``make_values`` and whose
    memory layout is ``memory[r]``; it calls the gather with ``dim`` (as given, maybe
    negative), contract ``contract``, transport ``transport`` and ``sizes`` in the form
    ``sizes_form``; then, if ``requires_grad`` (float and complex dtypes only), it calls
    ``out.backward(g_r)`` with ``g_r = make_upstream(...)``, different on every rank.

    ``members`` (sorted global ranks) runs the gather on a subgroup of a world of
    ``pool_size`` ranks; group rank ``i`` is global rank ``members[i]``.
    ``initialized=False`` runs a one-rank case in the calling process with
    torch.distributed not initialized.
    """

    shapes: tuple[tuple[int, ...], ...]
    dim: int
    dtype: str
    contract: str = "sum"
    transport: str = "auto"
    sizes_form: str = "none"
    memory: tuple[str, ...] = ()
    values: str = "full"
    upstream: str = "integers"
    requires_grad: bool = True
    seed: int = 0
    members: tuple[int, ...] | None = None
    pool_size: int | None = None
    initialized: bool = True

    def __post_init__(self) -> None:
        # Checked at run time too: cases are also built from text (parse_case) and by hand.
        raw: object = self.shapes
        if not isinstance(raw, tuple) or not raw:
            raise ValueError(f"shapes={raw!r} must be a non-empty tuple of shapes")
        for r, shape in enumerate(raw):
            if not isinstance(shape, tuple) or not all(_is_int(s) and s >= 0 for s in shape):
                raise ValueError(f"shapes[{r}]={shape!r} must be a tuple of ints >= 0")
        shapes = self.shapes
        ndim = len(shapes[0])
        if ndim < 1:
            raise ValueError(f"shapes[0]={shapes[0]!r} must have at least 1 dimension")
        if any(len(s) != ndim for s in shapes):
            raise ValueError(f"shapes={shapes!r} must all have the same ndim")
        if not _is_int(self.dim):
            raise ValueError(f"dim={self.dim!r} must be an int")
        if not -ndim <= self.dim < ndim:
            raise ValueError(f"dim={self.dim} is out of range for {ndim}-d shapes")
        d = self.dim % ndim
        others = {s[:d] + s[d + 1 :] for s in shapes}
        if len(others) != 1:
            raise ValueError(f"shapes={shapes!r} differ outside dim={self.dim}")
        _check_choice("dtype", self.dtype, DTYPE_NAMES)
        _check_choice("contract", self.contract, CONTRACTS)
        transport: object = self.transport
        if not isinstance(transport, str) or not transport:
            raise ValueError(f"transport={transport!r} must be a non-empty str")
        _check_choice("sizes_form", self.sizes_form, SIZES_FORMS)
        memory: object = self.memory
        if not isinstance(memory, tuple):
            raise ValueError(f"memory={memory!r} must be a tuple (empty: all contiguous)")
        if memory:
            if len(memory) != len(shapes):
                raise ValueError(f"memory={memory!r} must have one entry per rank ({len(shapes)})")
            for r, m in enumerate(memory):
                _check_choice(f"memory[{r}]", m, MEMORY_LAYOUTS)
                if m == "transposed" and ndim < 2:
                    raise ValueError(f"memory[{r}]='transposed' needs at least 2 dimensions")
        _check_choice("values", self.values, VALUE_KINDS)
        _check_choice("upstream", self.upstream, UPSTREAM_KINDS)
        for flag in ("requires_grad", "initialized"):
            value: object = getattr(self, flag)
            if not isinstance(value, bool):
                raise ValueError(f"{flag}={value!r} must be a bool")
        if self.requires_grad and not _is_differentiable(_torch_dtype(self.dtype)):
            raise ValueError(f"requires_grad=True needs a float or complex dtype, not {self.dtype}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an int >= 0")
        if self.pool_size is not None and (not _is_int(self.pool_size) or self.pool_size < 1):
            raise ValueError(f"pool_size={self.pool_size!r} must be None or an int >= 1")
        world = len(shapes)
        pool = self.world
        if self.members is not None:
            members: object = self.members
            if (
                not isinstance(members, tuple)
                or len(members) != world
                or list(members) != sorted(set(members))
                or not all(_is_int(m) and 0 <= m < pool for m in members)
            ):
                raise ValueError(
                    f"members={members!r} must be {world} sorted distinct ranks of a world of "
                    f"pool_size={pool}"
                )
        elif self.pool_size is not None and self.pool_size != world:
            raise ValueError(
                f"pool_size={self.pool_size} differs from the {world} ranks of shapes but "
                "members is None"
            )
        if not self.initialized and (world != 1 or self.members is not None):
            raise ValueError(
                "initialized=False (torch.distributed not initialized) needs exactly one "
                f"rank and no members, got {world} rank(s), members={self.members!r}"
            )

    # -- derived facts

    @property
    def world_size(self) -> int:
        """Ranks in the gather group."""
        return len(self.shapes)

    @property
    def world(self) -> int:
        """Ranks in the world (pool) the case runs on."""
        if self.pool_size is not None:
            return self.pool_size
        if self.members is not None:
            return max(self.members) + 1
        return len(self.shapes)

    @property
    def ndim(self) -> int:
        return len(self.shapes[0])

    @property
    def normalized_dim(self) -> int:
        return self.dim % self.ndim

    @property
    def sizes(self) -> tuple[int, ...]:
        """``n_r``: every rank's size along ``dim``."""
        return tuple(s[self.normalized_dim] for s in self.shapes)

    @property
    def output_shape(self) -> tuple[int, ...]:
        d = self.normalized_dim
        s = self.shapes[0]
        return (*s[:d], sum(self.sizes), *s[d + 1 :])

    @property
    def torch_dtype(self) -> torch.dtype:
        return _torch_dtype(self.dtype)

    @property
    def differentiable(self) -> bool:
        """Whether the ranks call backward (``requires_grad`` on a float/complex dtype)."""
        return self.requires_grad and _is_differentiable(self.torch_dtype)

    def memory_of(self, rank: int) -> str:
        return self.memory[rank] if self.memory else "contiguous"

    # -- tensors

    def shard_values(self, rank: int) -> torch.Tensor:
        """``x_rank`` as a fresh contiguous tensor (no ``requires_grad``)."""
        return make_values(
            self.shapes[rank], self.torch_dtype, _seed(self.seed, 2 * rank), self.values
        )

    def shard(self, rank: int) -> torch.Tensor:
        """``x_rank`` in its memory layout, a leaf requiring grad if the case says so."""
        x = _lay_out(self.shard_values(rank), self.memory_of(rank))
        if self.differentiable:
            x.requires_grad_(True)
        return x

    def upstream_grad(self, rank: int) -> torch.Tensor:
        """``g_rank``, the upstream gradient rank ``rank`` feeds to ``out.backward``."""
        return make_upstream(
            self.output_shape,
            self.torch_dtype,
            _seed(self.seed, 2 * rank + 1),
            rank,
            self.upstream,
        )

    def sizes_argument(self) -> list[int] | torch.Tensor | None:
        if self.sizes_form == "list":
            return list(self.sizes)
        if self.sizes_form == "tensor":
            return torch.tensor(self.sizes, dtype=torch.int64)
        return None

    def expected(self) -> Expected:
        """The oracle's answer (computed once per case, in the calling process)."""
        return _expected(self)

    def grads_exact(self) -> bool:
        """Whether gradients must equal the oracle's exactly (see the module docstring)."""
        w = self.world_size
        if self.contract == "local" or w == 1:
            return True
        if self.upstream != "integers":
            return False
        return self.contract == "sum" or (w & (w - 1)) == 0

    def adjoint_applies(self) -> bool:
        """Whether the adjoint identity is checked exactly for this case."""
        return (
            self.differentiable
            and self.contract == "sum"
            and self.values == "integers"
            and self.upstream == "integers"
        )


class Expected(NamedTuple):
    """The oracle's answer for a case."""

    output: torch.Tensor
    output_bytes: bytes
    input_grads: tuple[torch.Tensor, ...] | None
    grad_bounds: tuple[torch.Tensor, ...] | None
    """``B_r``: the oracle's gradient for ``|g|`` (float64), bounding rounding error."""


def _as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _bytes_of(t: torch.Tensor) -> bytes:
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return b""
    if flat.stride(0) != 1:
        # .contiguous() keeps a one-element tensor's stride, which view(uint8) refuses.
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy().tobytes()


@functools.lru_cache(maxsize=256)
def _expected(case: GatherCase) -> Expected:
    shards = [case.shard_values(r) for r in range(case.world_size)]
    output = oracle.expected_output(shards, case.dim)
    grads: tuple[torch.Tensor, ...] | None = None
    bounds: tuple[torch.Tensor, ...] | None = None
    if case.differentiable:
        upstream = [case.upstream_grad(j) for j in range(case.world_size)]
        grads = tuple(oracle.expected_input_grads(shards, upstream, case.dim, case.contract))
        if not case.grads_exact():
            d = case.normalized_dim
            zeros = [torch.zeros(_as_real(s).shape, dtype=torch.float64) for s in shards]
            magnitudes = [_as_real(g).abs().to(torch.float64) for g in upstream]
            bounds = tuple(oracle.expected_input_grads(zeros, magnitudes, d, case.contract))
    return Expected(output, _bytes_of(output), grads, bounds)


# --- implementations ---------------------------------------------------------------------

CONVENTIONS: Final = ("vargather", "seed")


@dataclass(frozen=True)
class Implementation:
    """The gather under test.

    ``ref`` is ``"module:attr"`` (``attr`` may be dotted, ``"pkg.mod:AllGather.apply"``),
    importable in the rank processes (``search_path`` entries are prepended to
    ``sys.path`` there first); ``None`` is vargather's own ``all_gather_v_with_layout``.

    Call conventions:

    * ``"vargather"``: ``fn(x, dim, *, sizes=None, group=None, grad=contract
      [, transport=name]) -> tensor | (tensor, layout)``; ``grad=`` is always passed,
      ``transport=`` only when ``transports`` is not None, ``group=`` only for subgroup
      cases;
    * ``"seed"``: ``fn(x, dim, sizes) -> (tensor, sizes) | tensor`` (``sizes`` is
      passed or None per the case), the seed's ``all_gather = AllGather.apply``.

    ``contracts``: the gradient contracts it claims (the seed's is ``local``).
    """

    ref: str | None = None
    convention: str = "vargather"
    contracts: tuple[str, ...] = CONTRACTS
    transports: tuple[str, ...] | None = None
    search_path: tuple[str, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        if self.ref is not None:
            module, sep, attr = self.ref.partition(":")
            if not (sep and module and attr):
                raise ValueError(f"ref={self.ref!r} must look like 'module:attr'")
        _check_choice("convention", self.convention, CONVENTIONS)
        if not self.contracts:
            raise ValueError("contracts=() must name at least one contract")
        for c in self.contracts:
            _check_choice("contracts[...]", c, CONTRACTS)
        if self.convention == "seed" and self.transports is not None:
            raise ValueError("transports must be None for the seed convention")

    @property
    def label(self) -> str:
        """The full reference, for reports."""
        return self.name or self.ref or "vargather:all_gather_v_with_layout"

    @property
    def short_name(self) -> str:
        """The function's name, for failure messages."""
        ref = self.ref or "vargather:all_gather_v_with_layout"
        attr = ref.partition(":")[2]
        parts = attr.split(".")
        return parts[-2] if parts[-1] == "apply" and len(parts) > 1 else parts[-1]


VARGATHER: Final = Implementation(None, transports=TRANSPORT_NAMES, name="vargather")
"""vargather itself (``all_gather_v_with_layout``), every contract and transport."""

COMPAT: Final = Implementation(
    "vargather.compat:all_gather", convention="seed", contracts=("local",), name="vargather.compat"
)
"""``vargather.compat.all_gather``, the seed's drop-in replacement (``local`` contract)."""


_RESOLVED: dict[tuple[str | None, tuple[str, ...]], Callable[..., object]] = {}


def _resolve(impl: Implementation) -> Callable[..., object]:
    key = (impl.ref, impl.search_path)
    fn = _RESOLVED.get(key)
    if fn is not None:
        return fn
    if impl.ref is None:
        from ._api import all_gather_v_with_layout

        fn = all_gather_v_with_layout
    else:
        for path in reversed(impl.search_path):
            if path not in sys.path:
                sys.path.insert(0, path)
        module_name, _, attr = impl.ref.partition(":")
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if not callable(obj):
            raise TypeError(f"{impl.ref} is not callable (got {type(obj).__name__})")
        fn = obj
    _RESOLVED[key] = fn
    return fn


# --- the rank side ------------------------------------------------------------------------


class RankContextLike(Protocol):
    """What ``run_on_rank`` needs from ``vargather.testing.RankContext``."""

    rank: int
    world_size: int

    def subgroup(self, ranks: Sequence[int]) -> Any: ...


class TensorBytes(NamedTuple):
    """A tensor as it crossed the pipe: dtype name, shape, device and raw bytes."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    data: bytes

    @staticmethod
    def of(t: torch.Tensor) -> TensorBytes:
        return TensorBytes(_dtype_name(t.dtype), tuple(t.shape), str(t.device), _bytes_of(t))

    def to_tensor(self) -> torch.Tensor:
        dtype = _torch_dtype(self.dtype)
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return flat.view(dtype).view(self.shape)


@dataclass(frozen=True)
class RankReport:
    """What one rank saw when it ran one case (``None`` fields: not produced).

    ``extra`` is what the implementation returned beside the tensor: ``("none",)``
    (a plain tensor), ``("sizes", value)`` (value: ``None`` or a ``TensorBytes``),
    ``("layout", fields)`` or ``("other", type name)``.
    """

    rank: int
    global_rank: int
    out: TensorBytes | None = None
    out_type: str = ""
    out_requires_grad: bool = False
    extra: tuple[Any, ...] = ("none",)
    grad: TensorBytes | None = None
    grad_type: str = ""
    backward_note: str = ""
    input_intact: bool = True
    error: tuple[str, str, str] | None = None  # (type name, message, traceback)
    skipped: str = ""


class _LocalContext:
    """The context ``run_on_rank`` gets in-process (torch.distributed not initialized)."""

    rank = 0
    world_size = 1

    def subgroup(self, ranks: Sequence[int]) -> Any:
        raise RuntimeError("no subgroups without torch.distributed")


_POISONED: list[int] = []  # the batch token after which this rank skips the rest


def _layout_fields(layout: object) -> dict[str, object]:
    names = (
        "sizes",
        "offsets",
        "total",
        "max_size",
        "dim",
        "leading_shape",
        "trailing_shape",
        "dtype",
        "rank",
        "world_size",
    )
    fields: dict[str, object] = {}
    for name in names:
        value = getattr(layout, name, "<missing>")
        if isinstance(value, torch.dtype):
            value = _dtype_name(value)
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        fields[name] = value
    return fields


def _describe_extra(value: object) -> tuple[Any, ...]:
    if value is None:
        return ("sizes", None)
    if isinstance(value, torch.Tensor):
        return ("sizes", TensorBytes.of(value))
    if hasattr(value, "sizes") and hasattr(value, "offsets"):
        return ("layout", _layout_fields(value))
    return ("other", type(value).__name__)


def _call(
    impl: Implementation, case: GatherCase, x: torch.Tensor, group: object
) -> tuple[object, tuple[Any, ...]]:
    fn = _resolve(impl)
    sizes = case.sizes_argument()
    if impl.convention == "seed":
        result = fn(x, case.dim, sizes)
    else:
        kwargs: dict[str, object] = {"grad": case.contract}
        if sizes is not None:
            kwargs["sizes"] = sizes
        if case.members is not None:
            kwargs["group"] = group
        if impl.transports is not None:
            kwargs["transport"] = case.transport
        result = fn(x, case.dim, **kwargs)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor):
        return result[0], _describe_extra(result[1])
    return result, ("none",)


def _backward(out: torch.Tensor, g: torch.Tensor) -> None:
    """``out.backward(g)``, as the backward of the real loss ``Re Σ conj(g) · out``.

    Its gradient for ``out`` is exactly ``g`` (torch's convention for complex tensors
    included), and unlike ``out.backward(g)`` it does not import sympy (torch checks an
    explicit gradient's shape with its symbolic-shape machinery, seconds per process).
    """
    loss = (out * g.conj()).sum().real if g.is_complex() else (out * g).sum()
    loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is untyped in torch's stubs


def _run_one(ctx: RankContextLike, impl: Implementation, case: GatherCase) -> RankReport | None:
    group: object = None
    grank = ctx.rank
    if case.members is not None:
        group = ctx.subgroup(list(case.members))  # collective: every world rank calls it
        if ctx.rank not in case.members:
            return None
        grank = case.members.index(ctx.rank)
    elif ctx.world_size != case.world_size:
        raise RuntimeError(
            f"case for {case.world_size} rank(s) sent to a world of {ctx.world_size}"
        )
    if case.contract not in impl.contracts:
        raise ValueError(f"{impl.label} does not claim grad={case.contract!r}")
    if impl.transports is None and case.transport != "auto":
        raise ValueError(f"{impl.label} takes no transport, but the case asks {case.transport!r}")
    x = case.shard(grank)
    before = x.detach().clone()
    out, extra = _call(impl, case, x, group)
    intact = _bytes_of(x) == _bytes_of(before)
    if not isinstance(out, torch.Tensor):
        return RankReport(grank, ctx.rank, None, type(out).__name__, extra=extra)
    report = dict(
        rank=grank,
        global_rank=ctx.rank,
        out=TensorBytes.of(out),
        out_requires_grad=out.requires_grad,
        extra=extra,
        input_intact=intact,
    )
    if case.differentiable:
        note = ""
        if tuple(out.shape) != case.output_shape:
            note = "backward not run: the output has the wrong shape"
        elif not out.requires_grad:
            note = "backward not run: the output does not require grad"
        else:
            _backward(out, case.upstream_grad(grank))
        grad = x.grad
        report["backward_note"] = note
        if isinstance(grad, torch.Tensor):
            report["grad"] = TensorBytes.of(grad)
        else:
            report["grad_type"] = type(grad).__name__
    return RankReport(**report)  # type: ignore[arg-type]  # keys and types are those of RankReport


def run_on_rank(ctx: RankContextLike, job: tuple[Implementation, GatherCase, int]) -> object:
    """Run one case on this rank: the rank function of ``vargather.testing`` pools.

    ``job`` is ``(implementation, case, batch token)``. Exceptions are caught and
    reported; after one, the rest of the same batch is skipped on this rank (its
    peers may be left in a collective, so nothing after it can be trusted).
    """
    impl, case, token = job
    if _POISONED and _POISONED[0] == token:
        return RankReport(ctx.rank, ctx.rank, skipped="an earlier case of its batch raised here")
    try:
        return _run_one(ctx, impl, case)
    except Exception as exc:
        _POISONED[:] = [token]
        name = type(exc).__qualname__
        module = type(exc).__module__
        if module != "builtins":
            name = f"{module}.{name}"
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RankReport(ctx.rank, ctx.rank, error=(name, str(exc), tb))


# --- the parent side: running -----------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The judgement of one case: ``failures`` is empty when it passed."""

    case: GatherCase
    implementation: Implementation
    failures: tuple[str, ...] = ()
    not_run: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures and not self.not_run


_COUNTS: Counter[tuple[str, str]] = Counter()
_TOKENS = itertools.count(1)


def example_counts() -> dict[tuple[str, str], int]:
    """Cases run and judged in this process, by (implementation label, world)."""
    return dict(_COUNTS)


def reset_example_counts() -> None:
    _COUNTS.clear()


def _world_label(case: GatherCase) -> str:
    return "uninitialized" if not case.initialized else f"W={case.world}"


def run_cases(
    cases: Sequence[GatherCase],
    implementation: Implementation = VARGATHER,
    *,
    pool_factory: Callable[[int], Any] | None = None,
) -> list[Verdict]:
    """Run ``cases`` and judge them; one pool round trip per world size.

    ``pool_factory(world_size)`` defaults to ``vargather.testing.get_pool``. Cases with
    ``initialized=False`` run in this process, which must not have initialized
    torch.distributed.
    """
    from ._pool import PoolFailure, RankError, get_pool

    factory = pool_factory or get_pool
    verdicts: list[Verdict | None] = [None] * len(cases)
    by_world: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        if not case.initialized:
            verdicts[i] = _run_in_process(case, implementation)
        else:
            by_world.setdefault(case.world, []).append(i)
    token_base = os.getpid() << 32
    for world, indices in by_world.items():
        token = token_base + next(_TOKENS)
        jobs = [(implementation, cases[i], token) for i in indices]
        try:
            results = factory(world).run_many(run_on_rank, jobs)
        except (PoolFailure, RankError) as exc:
            message = (
                f"the {world}-rank world failed while running a batch of {len(indices)} "
                f"case(s) containing this one: {type(exc).__name__}: {exc}"
            )
            for i in indices:
                verdicts[i] = Verdict(cases[i], implementation, (message,))
            continue
        for i, per_rank in zip(indices, results, strict=True):
            verdicts[i] = _verdict(cases[i], implementation, per_rank)
    done = [v for v in verdicts if v is not None]
    for v in done:
        if not v.not_run:
            _COUNTS[(implementation.label, _world_label(v.case))] += 1
    return done


def _run_in_process(case: GatherCase, impl: Implementation) -> Verdict:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            "a case with initialized=False must run in a process where torch.distributed "
            "is not initialized, but this one has initialized it"
        )
    token = next(_TOKENS)
    report = run_on_rank(_LocalContext(), (impl, case, token))
    _POISONED.clear()
    return _verdict(case, impl, [report])


def _verdict(case: GatherCase, impl: Implementation, per_rank: Sequence[object]) -> Verdict:
    skipped = [r for r, rep in enumerate(per_rank) if isinstance(rep, RankReport) and rep.skipped]
    errors = [r for r, rep in enumerate(per_rank) if isinstance(rep, RankReport) and rep.error]
    if skipped and not errors:
        return Verdict(case, impl, (), f"not run on rank(s) {skipped}: an earlier case raised")
    return Verdict(case, impl, tuple(judge(case, impl, per_rank)))


def check_cases(cases: Sequence[GatherCase], implementation: Implementation = VARGATHER) -> None:
    """Run and judge ``cases``; ``AssertionError`` describing every failing case."""
    verdicts = run_cases(cases, implementation)
    bad = [v for v in verdicts if v.failures]
    if not bad:
        not_run = [v for v in verdicts if v.not_run]
        if not_run:  # cannot happen without a failure; kept so nothing passes silently
            raise AssertionError(f"{len(not_run)} case(s) were not run: {not_run[0].not_run}")
        return
    parts = [f"{len(bad)} of {len(verdicts)} case(s) failed against {implementation.label}:"]
    for v in bad:
        parts.append(describe(v.case, implementation))
        parts.extend(f"  - {f}" for f in v.failures)
    raise AssertionError("\n".join(parts))


# --- the parent side: judging -------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Elementwise bit patterns (complex: one row of two patterns per element)."""
    r = _as_real(t)
    if r.dtype in _FLOAT_FORMATS:
        r = r.view(_FLOAT_FORMATS[r.dtype][2])
    if t.is_complex():
        return r.reshape(-1, 2)
    return r.reshape(-1, 1)


def _show(t: torch.Tensor, flat: int) -> str:
    v = t.reshape(-1)[flat]
    value = v.item()
    if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
        return repr(value)
    words = _bits(v.reshape(1))[0].tolist()
    width = 2 * v.element_size() // (2 if t.is_complex() else 1)
    hexes = "/".join(f"0x{w & ((1 << (4 * width)) - 1):0{width}x}" for w in words)
    return f"{value!r} ({hexes})"


def _index(shape: Sequence[int], flat: int) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(index))


def _mismatch_detail(
    got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, extra: str = ""
) -> str:
    count = int(bad.sum().item())
    first = int(bad.reshape(-1).nonzero()[0, 0].item())
    return (
        f"in {count} of {want.numel()} elements; first at index {_index(want.shape, first)}: "
        f"got {_show(got, first)}, expected {_show(want, first)}{extra}"
    )


def _compare_grad(
    case: GatherCase, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor | None
) -> str | None:
    if case.grads_exact() or bound is None:
        if torch.equal(got, want):
            return None
        bad = (got != want) | (got.isnan() & ~want.isnan())
        return "differs from the oracle (exact comparison) " + _mismatch_detail(got, want, bad)
    info = torch.finfo(_real_dtype(case.torch_dtype))
    w = case.world_size
    tol = (w + 1) * info.eps * bound + w * info.tiny * info.eps
    diff = (_as_real(got).to(torch.float64) - _as_real(want).to(torch.float64)).abs()
    bad_parts = ~(diff <= tol)
    if not bool(bad_parts.any()):
        return None
    # Complex: a tensor of shape want.shape + (2,) (real and imaginary parts).
    bad = bad_parts.any(-1) if got.is_complex() else bad_parts
    first = int(bad.reshape(-1).nonzero()[0, 0].item())
    allowed = tol.amin(-1) if got.is_complex() else tol
    note = f", allowed |difference| <= {float(allowed.reshape(-1)[first]):.3g}"
    return (
        f"differs from the oracle beyond (W+1)*eps*sum|g| (eps={info.eps:.3g}) "
        + _mismatch_detail(got, want, bad, note)
    )


def _inner(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((_as_real(a).to(torch.float64) * _as_real(b).to(torch.float64)).sum().item())


_WHERE: Final = "\x00where\x00"  # stands for "[call on rank r of W]" until ranks are merged


def judge(case: GatherCase, impl: Implementation, per_rank: Sequence[object]) -> list[str]:
    """Failure messages for one case from every world rank's report (empty: passed).

    Each message ends in ``[fn(dim=d) on rank r of W]``; a message that several ranks
    produce alike is given once, naming them all.
    """
    exp = case.expected()
    w = case.world_size
    call = f"{impl.short_name}(dim={case.dim})"
    members = case.members if case.members is not None else tuple(range(case.world))
    reports: dict[int, RankReport] = {}
    by_text: dict[str, list[int]] = {}
    for global_rank, rep in enumerate(per_rank):
        if global_rank not in members:
            if isinstance(rep, RankReport) and rep.error is not None:
                name, message, _ = rep.error
                by_text.setdefault(
                    f"raised {name}: {message} [world rank {global_rank}, not a member]", []
                )
            elif rep is not None and not (isinstance(rep, RankReport) and rep.skipped):
                by_text.setdefault(f"world rank {global_rank}, not a member, reported {rep!r}", [])
            continue
        rank = members.index(global_rank)
        texts: list[str]
        if not isinstance(rep, RankReport):
            texts = [f"no report from the rank (got {type(rep).__name__}) {_WHERE}"]
        elif rep.error is not None:
            name, message, tb = rep.error
            tail = "\n".join(tb.rstrip().splitlines()[-12:])
            texts = [f"raised {name}: {message} {_WHERE}\n{tail}"]
        elif rep.skipped:
            texts = [f"not run: {rep.skipped} {_WHERE}"]
        else:
            reports[rep.rank] = rep
            texts = _judge_rank(case, impl, rep, exp, _WHERE)
        for text in texts:
            by_text.setdefault(text, []).append(rank)
    failures = [
        text.replace(_WHERE, f"[{call} on {_ranks(ranks, w)}]") if ranks else text
        for text, ranks in by_text.items()
    ]
    if len(reports) == w and case.adjoint_applies() and not failures:
        lhs = rhs = 0.0
        for r in range(w):
            lhs += _inner(_grad_of(reports[r]), case.shard_values(r))
            out = reports[r].out
            assert out is not None  # judged above without failure
            rhs += _inner(case.upstream_grad(r), out.to_tensor())
        if lhs != rhs:
            failures.append(
                f"adjoint identity fails: sum_r <dx_r, x_r> = {lhs!r}, but "
                f"sum_j <g_j, out_j> = {rhs!r} [{call}, grad='sum', {w} ranks]"
            )
    return failures


def _ranks(ranks: Sequence[int], w: int) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} of {w}"
    if len(ranks) == w:
        return f"every rank of {w}"
    return f"ranks {', '.join(map(str, ranks))} of {w}"


def _grad_of(rep: RankReport) -> torch.Tensor:
    assert rep.grad is not None  # only called when every rank passed its gradient check
    return rep.grad.to_tensor()


def _judge_rank(
    case: GatherCase, impl: Implementation, rep: RankReport, exp: Expected, where: str
) -> list[str]:
    out = rep.out
    if out is None:
        return [f"returned a {rep.out_type}, but should return a tensor {where}"]
    failures: list[str] = []
    want_dtype = _dtype_name(case.torch_dtype)
    if out.dtype != want_dtype:
        failures.append(f"out.dtype={out.dtype}, but should be {want_dtype} {where}")
    if out.shape != case.output_shape:
        failures.append(f"out.shape={out.shape}, but should be {case.output_shape} {where}")
    if out.device != "cpu":
        failures.append(f"out.device={out.device}, but should be cpu (the input's) {where}")
    if not failures and out.data != exp.output_bytes:
        got = out.to_tensor()
        bad = (_bits(got) != _bits(exp.output)).any(-1).reshape(exp.output.shape)
        failures.append(
            "out differs from torch.cat(x, dim) (bytes compared) "
            + _mismatch_detail(got, exp.output, bad, f" {where}")
        )
    if not rep.input_intact:
        failures.append(f"the input x was modified in place {where}")
    failures.extend(_judge_extra(case, impl, rep, where))
    if case.differentiable:
        failures.extend(_judge_grad(case, rep, exp, where))
    return failures


def _judge_extra(case: GatherCase, impl: Implementation, rep: RankReport, where: str) -> list[str]:
    kind = rep.extra[0]
    distributed = case.initialized and case.world > 1
    if impl.convention == "seed" and kind == "sizes":
        value = rep.extra[1]
        if not distributed:
            if value is not None:
                return [f"sizes={value.shape}, but should be None (not distributed) {where}"]
            return []
        if value is None:
            return [f"sizes=None, but should be {list(case.sizes)} {where}"]
        problems = []
        if value.dtype != "int64" or len(value.shape) != 1 or value.device != "cpu":
            problems.append(
                f"sizes has dtype {value.dtype}, shape {value.shape}, device {value.device}, "
                f"but should be a 1-d int64 tensor on cpu {where}"
            )
        else:
            got = tuple(int(v) for v in value.to_tensor().tolist())
            if got != case.sizes:
                problems.append(f"sizes={list(got)}, but should be {list(case.sizes)} {where}")
        return problems
    if kind == "layout":
        fields: dict[str, object] = rep.extra[1]
        d = case.normalized_dim
        offsets = tuple(itertools.accumulate((0, *case.sizes[:-1])))
        want: dict[str, object] = {
            "sizes": case.sizes,
            "offsets": offsets,
            "total": sum(case.sizes),
            "max_size": max(case.sizes),
            "dim": d,
            "leading_shape": case.shapes[0][:d],
            "trailing_shape": case.shapes[0][d + 1 :],
            "dtype": case.dtype,
            "rank": rep.rank,
            "world_size": case.world_size,
        }
        return [
            f"layout.{k}={fields.get(k)!r}, but should be {v!r} {where}"
            for k, v in want.items()
            if fields.get(k) != v
        ]
    if kind == "other":
        return [f"returned (tensor, {rep.extra[1]}): expected sizes or a layout {where}"]
    return []


def _judge_grad(case: GatherCase, rep: RankReport, exp: Expected, where: str) -> list[str]:
    if not rep.out_requires_grad:
        return [f"out.requires_grad=False, but should be True (x requires grad) {where}"]
    if rep.backward_note:
        return [f"{rep.backward_note} {where}"]
    if rep.grad is None:
        shape = case.shapes[rep.rank]
        return [f"x.grad={rep.grad_type}, but should be a tensor of shape {shape} {where}"]
    assert exp.input_grads is not None  # the case is differentiable
    want = exp.input_grads[rep.rank]
    if rep.grad.dtype != _dtype_name(want.dtype) or rep.grad.shape != tuple(want.shape):
        return [
            f"x.grad has dtype {rep.grad.dtype} and shape {rep.grad.shape}, but should have "
            f"{_dtype_name(want.dtype)} and {tuple(want.shape)} {where}"
        ]
    bound = exp.grad_bounds[rep.rank] if exp.grad_bounds is not None else None
    problem = _compare_grad(case, rep.grad.to_tensor(), want, bound)
    if problem is None:
        return []
    return [f"x.grad (grad={case.contract!r}) {problem} {where}"]


# --- reproducing -----------------------------------------------------------------------------


def _impl_args(impl: Implementation) -> str:
    if impl == VARGATHER:
        return ""
    if impl == COMPAT:
        return " --impl compat"
    args = f" --impl {impl.ref}"
    if impl.convention != "vargather":
        args += f" --convention {impl.convention}"
    if impl.contracts != CONTRACTS:
        args += f" --contracts {','.join(impl.contracts)}"
    if impl.transports is not None:
        args += " --transports " + ",".join(impl.transports)
    for path in impl.search_path:
        args += f" --path {path}"
    return args


def describe(case: GatherCase, implementation: Implementation = VARGATHER) -> str:
    """A failing case in words, with a shell command that re-runs exactly it."""
    where = (
        "in this process, torch.distributed not initialized"
        if not case.initialized
        else f"on a gloo world of {case.world} rank(s)"
        + (f", subgroup {list(case.members)}" if case.members is not None else "")
    )
    memory = [case.memory_of(r) for r in range(case.world_size)]
    lines = [
        f"case: {implementation.short_name} on {case.world_size} rank(s) {where}",
        f"  per-rank shapes {[tuple(s) for s in case.shapes]} (sizes along dim "
        f"{list(case.sizes)}), dim={case.dim}, dtype={case.dtype}",
        f"  grad={case.contract!r}, transport={case.transport!r}, sizes passed: "
        f"{case.sizes_form}, memory {memory}",
        f"  values={case.values!r}, upstream gradients={case.upstream!r} (different on every "
        f"rank), requires_grad={case.requires_grad}, seed={case.seed}",
        "  reproduce: python -m vargather._cases " + repr(repr(case)) + _impl_args(implementation),
    ]
    return "\n".join(lines)


def parse_case(text: str) -> GatherCase:
    """The ``GatherCase`` written by ``repr(case)`` (literal arguments only, no eval)."""
    tree = ast.parse(text.strip(), mode="eval").body
    if not (
        isinstance(tree, ast.Call)
        and isinstance(tree.func, ast.Name)
        and tree.func.id == "GatherCase"
        and not tree.args
    ):
        raise ValueError(f"expected GatherCase(field=literal, ...), got {text[:80]!r}")
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg}
    return GatherCase(**kwargs)


# --- which transports run here ------------------------------------------------------------


def _probe_transport(ctx: RankContextLike, name: str) -> None:
    """Rank function: one small uneven float32 gather with ``transport=name``."""
    from ._api import all_gather_v

    x = torch.zeros(ctx.rank + 1, 2)
    all_gather_v(x, 0, transport=name)  # type: ignore[arg-type]  # names come from TRANSPORT_NAMES at run time


def transport_refusals(names: Sequence[str], *, world_size: int = 2) -> dict[str, str]:
    """The transports vargather itself refuses on this backend, with its message.

    Asked, not hard-coded: each name runs one small uneven gather. A refusal is every
    rank raising the same ``VarGatherError`` (not a ``CollectiveError``, which means the
    transport was accepted and then failed) with the same message; anything else,
    including a wrong result or a crash, leaves the transport in the suite to fail there.
    """
    from ._errors import CollectiveError, VarGatherError
    from ._pool import get_pool

    pool = get_pool(world_size)
    refused: dict[str, str] = {}
    for name in names:
        outcomes = pool.run_outcomes(_probe_transport, name)
        errors = [o.exception for o in outcomes]
        first = errors[0]
        if (
            isinstance(first, VarGatherError)
            and not isinstance(first, CollectiveError)
            and all(type(e) is type(first) and str(e) == str(first) for e in errors)
        ):
            refused[name] = f"{type(first).__name__}: {first}"
    return refused


# --- the properties ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Property:
    """A claim checked on batches of cases drawn from ``strategy``.

    ``check(batch)`` runs the batch against ``implementation`` and raises
    ``AssertionError`` (with ``describe`` of every failing case) if any case fails.
    """

    name: str
    statement: str
    strategy: SearchStrategy[list[GatherCase]] = field(repr=False)
    implementation: Implementation

    def check(self, batch: Sequence[GatherCase]) -> None:
        check_cases(batch, self.implementation)

    def fails(self, batch: Sequence[GatherCase]) -> bool:
        return not all(v.ok for v in run_cases(batch, self.implementation))


def properties(
    implementation: Implementation = VARGATHER,
    *,
    transports: Sequence[str] | None = None,
    world_sizes: Sequence[int] = (1, 2, 3, 4),
    batch_size: int = 8,
) -> list[Property]:
    """The suite's properties for ``implementation``, in a fixed order.

    One property per world size (Hypothesis draws small integers far more often than
    large ones, so a world size drawn per example would leave the 4-rank worlds
    nearly untested), and for ``matches_oracle`` one per transport too; the cheap
    one-rank properties first:

    * ``uninitialized``: in the calling process, torch.distributed not initialized;
    * ``one_rank_world``: W=1 with torch.distributed initialized, every transport;
    * ``matches_oracle[W=w,t]``: forward bit for bit, layout/sizes, gradients;
    * ``adjoint[W=w]``: the adjoint identity under ``sum`` (if claimed);
    * ``subgroup[W=w]``: a subgroup of a w-rank world, float and complex dtypes with
      gradients (the vargather convention).

    ``transports``: the names to test (default: every name the implementation takes).
    """
    from . import strategies as vst

    names = tuple(transports) if transports is not None else (implementation.transports or ())
    every: tuple[str, ...] | None = names or None
    multi = sorted({w for w in world_sizes if w >= 2})
    props: list[Property] = []

    def add(name: str, statement: str, **kwargs: Any) -> None:
        strategy = vst.case_batches(
            implementation=implementation, max_batch=batch_size, transports=every, **kwargs
        )
        props.append(Property(name, statement, strategy, implementation))

    add(
        "uninitialized",
        "without torch.distributed the gather is the identity, gradients flowing",
        min_world_size=1,
        max_world_size=1,
        initialized=False,
    )
    if 1 in world_sizes:
        add(
            "one_rank_world",
            "a world of one rank is the identity, gradients flowing",
            min_world_size=1,
            max_world_size=1,
        )
    for w in multi:
        for t in names or (None,):
            kwargs: dict[str, Any] = {"min_world_size": w, "max_world_size": w}
            suffix = f"W={w}" if t is None else f"W={w},{t}"
            if t is not None:
                kwargs["transports"] = (t,)
            strategy = vst.case_batches(
                implementation=implementation, max_batch=batch_size, **kwargs
            )
            props.append(
                Property(
                    f"matches_oracle[{suffix}]",
                    "the output equals torch.cat bit for bit, the returned layout or sizes "
                    "are the true ones, the gradients equal the oracle's",
                    strategy,
                    implementation,
                )
            )
    if "sum" in implementation.contracts:
        for w in multi:
            add(
                f"adjoint[W={w}]",
                "sum_r <dx_r, x_r> == sum_j <g_j, out_j> exactly under grad='sum'",
                min_world_size=w,
                max_world_size=w,
                contracts=("sum",),
                values=("integers",),
                upstream=("integers",),
                requires_grad=True,
            )
    if implementation.convention == "vargather":
        for w in multi:
            add(
                f"subgroup[W={w}]",
                "a subgroup gathers its members' shards only, in group-rank order, and "
                "its gradients are the group's (mean divides by the group's size)",
                min_world_size=w,
                max_world_size=w,
                subgroups=True,
                # Gradients, where the group's size and ranks enter the arithmetic;
                # every dtype's data movement is matches_oracle's business.
                dtypes=[d for d in DTYPE_NAMES if _is_differentiable(_torch_dtype(d))],
                requires_grad=True,
            )
    return props


# --- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vargather._cases 'GatherCase(...)' [--impl REF]``: re-run one case."""
    parser = argparse.ArgumentParser(
        prog="python -m vargather._cases", description="Re-run one property-suite case."
    )
    parser.add_argument("case", help="the case as printed: GatherCase(shapes=..., ...)")
    parser.add_argument("--impl", default=None, help="module:attr, 'compat', or omit (vargather)")
    parser.add_argument("--convention", default="vargather", choices=CONVENTIONS)
    parser.add_argument("--contracts", default=",".join(CONTRACTS))
    parser.add_argument("--transports", default=None)
    parser.add_argument("--path", action="append", default=[], help="prepend to sys.path")
    args = parser.parse_args(argv)
    case = parse_case(args.case)
    impl: Implementation
    if args.impl is None:
        impl = VARGATHER
    elif args.impl == "compat":
        impl = COMPAT
    else:
        impl = Implementation(
            args.impl,
            convention=args.convention,
            contracts=tuple(args.contracts.split(",")),
            transports=None if args.transports is None else tuple(args.transports.split(",")),
            search_path=tuple(os.path.abspath(p) for p in args.path),
        )
    print(describe(case, impl))
    verdict = run_cases([case], impl)[0]
    if verdict.ok:
        print("PASSED")
        return 0
    print("FAILED")
    for failure in verdict.failures or (verdict.not_run,):
        print(f"  - {failure}")
    return 1


if __name__ == "__main__":
    # Re-enter through the canonical module so the rank processes and this one agree
    # on the classes they pickle (run as __main__, they would be __main__.GatherCase).
    from vargather._cases import main as _main

    sys.exit(_main())

"""The testing kit's case model: what one ragged gather under test is.

Where it sits: the bottom of the kit (``vargather.testing``), above the library's
public names and ``values`` only (the vocabulary and the deterministic values every
tensor of a case is rebuilt from). ``strategies`` draws cases, ``runner`` runs them on
a rank pool, ``judge`` compares the ranks' reports with ``vargather.oracle``,
``catalogues`` list the claims (``properties``' rows).

Comparison rules (``docs/property-suite.md`` has the table): forward bit for bit;
gradients exact for ``local``, ``W = 1`` and small-integer ``g`` (``sum``, and
``mean`` when ``W`` is a power of two), else elementwise
``|dx - oracle| <= (W + 1) * eps(dtype) * B + W * s`` (``B`` the oracle's gradient for
``|g|``, ``s`` the smallest subnormal); the adjoint identity
``Σ_r <dx_r, x_r> = Σ_j <g_j, out_j>`` exactly (``sum``, small-integer values).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeGuard, TypeVar

import torch

from vargather import CONTRACTS, TRANSPORT_NAMES, oracle

from .values import (
    COMPILE_BACKENDS,
    DTYPE_NAMES,
    MEMORY_LAYOUTS,
    SIZES_FORMS,
    UPSTREAM_KINDS,
    VALUE_KINDS,
    _check_choice,
    _lay_out,
    _seed,
    dtype_name,
    is_differentiable,
    make_upstream,
    make_values,
    torch_dtype,
)

_T = TypeVar("_T")

# --- the case --------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


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

    ``compile_backend`` (one of ``COMPILE_BACKENDS``) runs the call inside a step
    compiled with ``torch.compile(fullgraph=True)`` on that backend
    (``vargather.testing.compiled``); ``None``: called eagerly.
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
    compile_backend: str | None = None

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
        if len({s[:d] + s[d + 1 :] for s in shapes}) != 1:
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
        if self.requires_grad and not is_differentiable(torch_dtype(self.dtype)):
            raise ValueError(f"requires_grad=True needs a float or complex dtype, not {self.dtype}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be an int >= 0")
        if self.pool_size is not None and (not _is_int(self.pool_size) or self.pool_size < 1):
            raise ValueError(f"pool_size={self.pool_size!r} must be None or an int >= 1")
        world = len(shapes)
        pool = self.world_size
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
        if self.compile_backend is not None:
            _check_choice("compile_backend", self.compile_backend, COMPILE_BACKENDS)
        if not self.initialized and (world != 1 or self.members is not None):
            raise ValueError(
                "initialized=False (torch.distributed not initialized) needs exactly one "
                f"rank and no members, got {world} rank(s), members={self.members!r}"
            )

    # -- derived facts

    @property
    def group_size(self) -> int:
        """Ranks in the gather group."""
        return len(self.shapes)

    @property
    def world_size(self) -> int:
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
    def shard_bytes(self) -> tuple[int, ...]:
        """The bytes of every rank's shard (its payload), in group rank order."""
        itemsize = self.torch_dtype.itemsize
        return tuple(math.prod(s) * itemsize for s in self.shapes)

    @property
    def output_nbytes(self) -> int:
        """The bytes of the gathered output (what vargather's size thresholds count)."""
        return sum(self.shard_bytes)

    @property
    def output_shape(self) -> tuple[int, ...]:
        d = self.normalized_dim
        s = self.shapes[0]
        return (*s[:d], sum(self.sizes), *s[d + 1 :])

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def differentiable(self) -> bool:
        """Whether the ranks call backward (``requires_grad`` on a float/complex dtype)."""
        return self.requires_grad and is_differentiable(self.torch_dtype)

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
        if self.output_nbytes >= DIGEST_MIN_BYTES:
            return _expected_large(self)
        return _expected(self)

    def grads_exact(self) -> bool:
        """Whether gradients must equal the oracle's exactly (see the module docstring)."""
        w = self.group_size
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
    """The output's bytes; empty for an output of ``DIGEST_MIN_BYTES`` or more, which
    is compared by ``output_digest``."""
    input_grads: tuple[torch.Tensor, ...] | None
    grad_bounds: tuple[torch.Tensor, ...] | None
    """``B_r``: the oracle's gradient for ``|g|`` (float64), bounding rounding error."""
    output_digest: str = ""
    """``digest_of(output)``."""


DIGEST_MIN_BYTES: Final = 64 * 1024
"""From this many output bytes up, a rank does not send its output back: it sends a
digest of its bytes (``digest_of``), and, when that differs from the oracle's, the
first differing element, found on the rank against the oracle's output it rebuilds
from the case's seeds. Below it the output's bytes cross the pipe."""


def as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.stride(0) != 1:
        # .contiguous() keeps a one-element tensor's stride, which view(uint8) refuses.
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8)


def bytes_of(t: torch.Tensor) -> bytes:
    return _flat_bytes(t).numpy().tobytes()


def digest_of(t: torch.Tensor) -> str:
    """A digest of ``t``'s bytes in row-major order (BLAKE2b, 128 bits): equal digests,
    equal bytes (shape and dtype are compared beside it)."""
    view = _flat_bytes(t).numpy().data  # a memoryview: the bytes are not copied
    return hashlib.blake2b(view, digest_size=16).hexdigest()


def expected_output(case: GatherCase) -> torch.Tensor:
    """The oracle's output alone (no gradients): what a rank rebuilds to locate a
    mismatch it found by digest."""
    return oracle.expected_output([case.shard_values(r) for r in range(case.group_size)], case.dim)


def _compute_expected(case: GatherCase) -> Expected:
    shards = [case.shard_values(r) for r in range(case.group_size)]
    output = oracle.expected_output(shards, case.dim)
    grads: tuple[torch.Tensor, ...] | None = None
    bounds: tuple[torch.Tensor, ...] | None = None
    if case.differentiable:
        upstream = [case.upstream_grad(j) for j in range(case.group_size)]
        grads = tuple(oracle.expected_input_grads(shards, upstream, case.dim, case.contract))
        if not case.grads_exact():
            d = case.normalized_dim
            zeros = [torch.zeros(as_real(s).shape, dtype=torch.float64) for s in shards]
            magnitudes = [as_real(g).abs().to(torch.float64) for g in upstream]
            bounds = tuple(oracle.expected_input_grads(zeros, magnitudes, d, case.contract))
    small = case.output_nbytes < DIGEST_MIN_BYTES
    return Expected(output, bytes_of(output) if small else b"", grads, bounds, digest_of(output))


_expected = functools.lru_cache(maxsize=256)(_compute_expected)
_expected_large = functools.lru_cache(maxsize=4)(_compute_expected)
"""Large cases' answers take megabytes each: only the last few are kept."""


# --- implementations ---------------------------------------------------------------------


CONVENTIONS: Final = ("vargather", "seed")

SIZES_SCOPES: Final = ("any", "tensor", "required", "list", "never")
"""How an implementation takes ``sizes`` (``--sizes``): ``any`` none, a list or a
tensor; ``tensor`` none or a 1-d int64 tensor; ``required`` always the true sizes (a
list or a tensor); ``list`` always the true sizes as a list of ints (Megatron's
``output_split_sizes``); ``never`` called without sizes."""

RETURN_KINDS: Final = ("auto", "tensor", "tuple", "list")
"""What an implementation returns (``--returns``): ``auto`` a tensor or ``(tensor,
sizes|layout)``; ``tensor`` a bare tensor; ``tuple`` ``(tensor, sizes|layout)``;
``list`` per-rank tensors (alone or with sizes), concatenated along ``dim``."""


def sizes_forms_for(scope: str) -> tuple[str, ...]:
    """The ``SIZES_FORMS`` a ``sizes_scope`` allows."""
    _check_choice("sizes_scope", scope, SIZES_SCOPES)
    return {
        "any": SIZES_FORMS,
        "tensor": ("none", "tensor"),
        "required": ("list", "tensor"),
        "list": ("list",),
        "never": ("none",),
    }[scope]


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
    ``takes_group``: whether it accepts ``group=`` (subgroup cases need it).

    Declared scope (``python -m vargather check``'s options; defaults: no limit):
    ``dims`` the literal ``dim`` values it supports (``None``: every one);
    ``differentiable`` whether it claims gradients at all; ``sizes_scope`` how it
    takes ``sizes`` (``SIZES_SCOPES``); ``returns`` what it returns (``RETURN_KINDS``);
    ``takes_grad`` whether a vargather-style call passes ``grad=``; ``ctor_kwargs``
    (``MODULE:ATTR(key=literal, ...)``): ATTR is constructed with them per call (plus
    ``dim=`` when ``ctor_takes_dim``) and the object it returns is called; ``emulate``
    ``"nccl"`` intercepts torch.distributed's collectives in the ranks to behave as
    NCCL does (``vargather.testing.emulate``).

    ``compiles``: whether it claims to work inside ``torch.compile(fullgraph=True)``
    (``claims_compile``). ``coalesced_ref`` (``"module:attr"``): its coalesced form,
    called as ``fn(tensors, dims, *, sizes=None, grad=contract[, transport=name])``
    and returning the gathered tensors in order (``coalesced_form``).
    """

    ref: str | None = None
    convention: str = "vargather"
    contracts: tuple[str, ...] = CONTRACTS
    transports: tuple[str, ...] | None = None
    search_path: tuple[str, ...] = ()
    name: str = ""
    takes_group: bool = True
    dims: tuple[int, ...] | None = None
    differentiable: bool = True
    sizes_scope: str = "any"
    returns: str = "auto"
    takes_grad: bool = True
    ctor_kwargs: tuple[tuple[str, object], ...] | None = None
    ctor_takes_dim: bool = False
    emulate: str | None = None
    coalesced_ref: str | None = None
    compiles: bool | None = None
    call: str | None = None
    """A call template (``vargather.testing.calls``), ``"(x, group=group)"``: ATTR is
    called with it instead of the convention's call."""
    op: str = "all_gather_v"
    """The collective it implements (``--op``): which catalogue checks it. For a
    collective other than ``all_gather_v`` ``ref=None`` is vargather's own function of
    that name, called as vargather's is (the convention is ``vargather``)."""

    def __post_init__(self) -> None:
        for what in ("ref", "coalesced_ref"):
            value = getattr(self, what)
            if value is not None:
                module, sep, attr = value.partition(":")
                if not (sep and module and attr):
                    raise ValueError(f"{what}={value!r} must look like 'module:attr'")
        if self.coalesced_ref is not None and self.convention != "vargather":
            raise ValueError("coalesced_ref needs the vargather convention")
        _check_choice("convention", self.convention, CONVENTIONS)
        if not self.contracts:
            raise ValueError("contracts=() must name at least one contract")
        for c in self.contracts:
            _check_choice("contracts[...]", c, CONTRACTS)
        if self.convention == "seed" and self.transports is not None:
            raise ValueError("transports must be None for the seed convention")
        if self.convention == "seed" and self.takes_group:
            object.__setattr__(self, "takes_group", False)  # the seed's call has no group
        _check_choice("sizes_scope", self.sizes_scope, SIZES_SCOPES)
        _check_choice("returns", self.returns, RETURN_KINDS)
        if self.emulate is not None:
            _check_choice("emulate", self.emulate, ("nccl",))

    @property
    def label(self) -> str:
        """The full reference, for reports."""
        return self.name or self.ref or self.own_ref

    @property
    def own_ref(self) -> str:
        """vargather's own function of this collective, ``"module:attr"``."""
        form = "_with_layout" if self.op == "all_gather_v" else ""
        return f"vargather:{self.op}{form}"

    @property
    def claims_compile(self) -> bool:
        """Whether the ``compiled`` property applies (``compiles``; by default
        vargather's own implementation only)."""
        return self.ref is None if self.compiles is None else self.compiles

    @property
    def coalesced_form(self) -> str | None:
        """``"module:attr"`` of its coalesced gather (``None``: it has none)."""
        if self.coalesced_ref is not None:
            return self.coalesced_ref
        return COALESCED_REF if self.ref is None else None

    @property
    def short_name(self) -> str:
        """The function's name, for failure messages."""
        ref = self.ref or self.own_ref
        attr = ref.partition(":")[2]
        parts = attr.split(".")
        return parts[-2] if parts[-1] == "apply" and len(parts) > 1 else parts[-1]


COALESCED_REF: Final = "vargather:all_gather_v_coalesced"
"""vargather's own coalesced gather, the default ``coalesced_form`` of ``ref=None``."""

VARGATHER: Final = Implementation(None, transports=TRANSPORT_NAMES, name="vargather")
"""vargather itself (``all_gather_v_with_layout``), every contract and transport."""

COMPAT: Final = Implementation(
    "vargather.compat:all_gather", convention="seed", contracts=("local",), name="vargather.compat"
)
"""``vargather.compat.all_gather``, the seed's drop-in replacement (``local`` contract)."""


# --- what a rank reports --------------------------------------------------------------------


class TensorBytes(NamedTuple):
    """A tensor as it crossed the pipe: dtype name, shape, device and raw bytes.

    A large output crosses as a digest instead (``data`` empty, ``digest`` set, see
    ``DIGEST_MIN_BYTES``), with ``mismatch``: the first element differing from the
    oracle's output, as the rank found it (empty when none differs, or when dtype or
    shape already differ)."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    data: bytes
    digest: str = ""
    mismatch: str = ""

    @staticmethod
    def of(t: torch.Tensor) -> TensorBytes:
        return TensorBytes(dtype_name(t.dtype), tuple(t.shape), str(t.device), bytes_of(t))

    @staticmethod
    def digested(t: torch.Tensor, mismatch: str = "") -> TensorBytes:
        """``t`` by its digest, not its bytes."""
        return TensorBytes(
            dtype_name(t.dtype), tuple(t.shape), str(t.device), b"", digest_of(t), mismatch
        )

    def to_tensor(self) -> torch.Tensor:
        if self.digest:
            raise ValueError("a digested tensor's bytes did not cross the pipe")
        dtype = torch_dtype(self.dtype)
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
    extra: tuple[object, ...] = ("none",)
    grad: TensorBytes | None = None
    grad_type: str = ""
    backward_note: str = ""
    input_intact: bool = True
    error: tuple[str, str, str] | None = None  # (type name, message, traceback)
    skipped: str = ""
    collective_failed: bool = False
    """The error was a failed collective (vargather's ``CollectiveError``, torch's
    ``DistError``): the world's process group may be out of step, so the runner
    restarts the world before its next batch."""


def parse_literal(text: str, kinds: Sequence[type[_T]]) -> _T:
    """The case ``repr`` wrote, ``Kind(field=literal, ...)`` for one of ``kinds``
    (literal arguments only, no eval).

    Raises:
        ValueError: ``text`` is not such a call, a value is not a literal, or a field is
            one the class does not have.
    """
    by_name = {k.__name__: k for k in kinds}
    tree = ast.parse(text.strip(), mode="eval").body
    if not (
        isinstance(tree, ast.Call)
        and isinstance(tree.func, ast.Name)
        and tree.func.id in by_name
        and not tree.args
    ):
        raise ValueError(f"expected {' or '.join(by_name)}(field=literal, ...), got {text[:80]!r}")
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg}
    try:
        return by_name[tree.func.id](**kwargs)
    except TypeError as err:
        raise ValueError(str(err)) from None


def parse_case(text: str) -> GatherCase:
    """The ``GatherCase`` written by ``repr(case)`` (``parse_literal``)."""
    return parse_literal(text, [GatherCase])

"""NaN semantics on gloo worlds (tests/test_nan_semantics.py, fuzz/fuzz_multirank.py): the case model, its
values from explicit bit patterns, the rank side and the oracle's side.

A ``NanCase`` names one call (``OPS``), its sizes and every rank's input and upstream
gradient element by element as ``Atom``s: a small integer, ``"-0"``, ``"inf"``,
``"-inf"`` or a NaN ``(negative, quiet, payload)``, so Hypothesis shrinks values and
an ``@example`` writes a finding down exactly. Module-level, so cases pickle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

import torch
import torch.distributed as dist
from hypothesis import strategies as st

import vargather
from vargather import oracle
from vargather._choices import unsupported_reason
from vargather.testing import RankContext, assert_bitwise_equal, get_pool

Atom = Union[int, str, tuple[bool, bool, int]]  # noqa: UP007  # a runtime alias, Python 3.10

OPS = (
    "reduce_scatter_v",
    "all_gather_v",
    "all_gather_v_coalesced",
    "all_gather_list",
    "all_to_all_v",
)
REDUCING_BACKWARD = ("all_gather_v", "all_gather_v_coalesced", "all_gather_list")
"""Whose ``sum`` and ``mean`` backwards add gradients across ranks."""
DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")
INT_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_MANTISSA = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


@dataclass(frozen=True)
class NanCase:
    """One call on ``world_size`` ranks.

    ``sizes``: ``reduce_scatter_v``'s sizes; each rank's block along ``dim`` for the
    gathers; each rank's row count for ``all_gather_list`` (shape ``(n, width)``);
    ``send``: ``all_to_all_v``'s send sizes per rank. Tensors are 2-d, ``width`` the
    size of the other dimension. ``values[r]``: rank r's input, row-major (complex:
    real and imaginary parts interleaved); ``upstream[r]``: its upstream gradient(s),
    flat over its outputs (empty: no backward). ``ops``: call the custom operators
    behind ``torch.compile`` (``torch.ops.vargather.*``) instead of the eager API.
    ``strided``: the input is a transposed (non-contiguous) view.
    """

    op: str
    world_size: int
    dtype: str
    sizes: tuple[int, ...]
    width: int
    dim: int = 0
    send: tuple[tuple[int, ...], ...] = ()
    grad: str = "sum"
    transport: str = "auto"
    strided: bool = False
    ops: bool = False
    values: tuple[tuple[Atom, ...], ...] = ()
    upstream: tuple[tuple[Atom, ...], ...] = ()

    def shape(self, n: int) -> tuple[int, int]:
        return (n, self.width) if self.dim % 2 == 0 else (self.width, n)

    def input_shapes(self) -> list[tuple[int, int]]:
        w = self.world_size
        if self.op == "reduce_scatter_v":
            return [self.shape(sum(self.sizes))] * w
        if self.op == "all_to_all_v":
            return [self.shape(sum(self.send[j])) for j in range(w)]
        if self.op == "all_gather_list":
            return [(n, self.width) for n in self.sizes]
        return [self.shape(n) for n in self.sizes]

    def output_shapes(self, r: int) -> list[tuple[int, int]]:
        """Rank r's outputs (one, but ``all_gather_list``'s ``W``)."""
        if self.op == "reduce_scatter_v":
            return [self.shape(self.sizes[r])]
        if self.op == "all_to_all_v":
            return [self.shape(sum(s[r] for s in self.send))]
        if self.op == "all_gather_list":
            return self.input_shapes()
        return [self.shape(sum(self.sizes))]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # type: ignore[no-any-return]  # a dtype name

    @property
    def reducing(self) -> bool:
        """Whether the result under test is a sum across ranks: ``reduce_scatter_v``'s
        forward, the gathers' ``sum``/``mean`` backwards."""
        return self.op == "reduce_scatter_v" or (
            self.op in REDUCING_BACKWARD and self.grad != "local"
        )


def atoms_needed(dtype: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * (2 if dtype.startswith("complex") else 1)


def _real_name(dtype: str) -> str:
    return {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)


def nan_bits(dtype: str, negative: bool, quiet: bool, payload: int) -> int:
    """The bit pattern of a NaN of the real ``dtype``, as a signed integer of its width."""
    mant = _MANTISSA[dtype]
    bits = torch.finfo(getattr(torch, dtype)).bits
    quiet_bit = 1 << (mant - 1)
    low = payload & (quiet_bit - 1)
    if not quiet and low == 0:
        low = 1  # a signalling NaN needs a payload (else it is an infinity)
    raw = (((1 << (bits - 1 - mant)) - 1) << mant) | (quiet_bit if quiet else 0) | low
    raw |= (1 << (bits - 1)) if negative else 0
    return raw - (1 << bits) if raw >= 1 << (bits - 1) else raw


def make_tensor(atoms: Sequence[Atom], shape: Sequence[int], dtype: str) -> torch.Tensor:
    """A contiguous tensor of ``dtype`` holding ``atoms`` bit for bit."""
    real = _real_name(dtype)
    rt = getattr(torch, real)
    plain = [
        float(a)
        if isinstance(a, int)
        else {"-0": -0.0, "inf": math.inf, "-inf": -math.inf}[a]
        if isinstance(a, str)
        else 0.0
        for a in atoms
    ]
    flat = torch.tensor(plain, dtype=rt)
    as_int = flat.view(INT_OF[flat.element_size()])
    for k, a in enumerate(atoms):
        if isinstance(a, tuple):
            as_int[k] = nan_bits(real, *a)
    if dtype.startswith("complex"):
        return torch.view_as_complex(flat.view(-1, 2)).view(tuple(shape))
    return flat.view(tuple(shape))


def _split(
    atoms: Sequence[Atom], shapes: Sequence[Sequence[int]], dtype: str
) -> list[torch.Tensor]:
    out, at = [], 0
    for s in shapes:
        n = atoms_needed(dtype, s)
        out.append(make_tensor(atoms[at : at + n], s, dtype))
        at += n
    return out


def inputs(case: NanCase) -> list[torch.Tensor]:
    return [make_tensor(case.values[r], s, case.dtype) for r, s in enumerate(case.input_shapes())]


def upstreams(case: NanCase) -> list[list[torch.Tensor]]:
    """Rank r's upstream gradient per output (empty lists: no backward)."""
    if not case.upstream:
        return [[] for _ in range(case.world_size)]
    return [
        _split(case.upstream[r], case.output_shapes(r), case.dtype) for r in range(case.world_size)
    ]


# --- the rank side ------------------------------------------------------------------------


def _strided(x: torch.Tensor, strided: bool) -> torch.Tensor:
    return x.t().contiguous().t() if strided else x


def _call(case: NanCase, x: torch.Tensor, r: int) -> list[torch.Tensor]:
    """The collective's outputs on rank r (a list; the coalesced call's two)."""
    group = str(dist.group.WORLD.group_name)
    rg = x.requires_grad
    if case.op == "reduce_scatter_v":
        if case.ops:
            return [
                torch.ops.vargather.reduce_scatter_v(
                    x, case.dim, list(case.sizes), group, True, None, rg
                )
            ]
        return [vargather.reduce_scatter_v(x, list(case.sizes), case.dim)]
    if case.op == "all_to_all_v":
        send = list(case.send[r])
        if case.ops:
            recv = [s[r] for s in case.send]
            return [
                torch.ops.vargather.all_to_all_v(x, case.dim, send, recv, group, True, None, rg)
            ]
        return [vargather.all_to_all_v(x, send, case.dim)]
    if case.op == "all_gather_list":
        if case.ops:
            from vargather._gather_list import encode_shapes

            shapes = encode_shapes(case.input_shapes())
            return list(
                torch.ops.vargather.all_gather_list(x, shapes, group, case.grad, True, None, rg)
            )
        return vargather.all_gather_list(x, grad=case.grad)
    if case.op == "all_gather_v":
        if case.ops:
            return [
                torch.ops.vargather.all_gather_v(
                    x, case.dim, list(case.sizes), group, case.grad, case.transport, True, None, rg
                )
            ]
        return [vargather.all_gather_v(x, case.dim, grad=case.grad, transport=case.transport)]
    raise AssertionError(case.op)


def run_nan_case(
    ctx: RankContext, case: NanCase
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Rank ``ctx.rank``'s outputs and input gradients (the coalesced call: of ``x`` and
    of ``-x``, with upstream gradients ``g`` and ``-g``)."""
    r = ctx.rank
    base = inputs(case)[r]
    ups = upstreams(case)[r]
    grad = bool(ups)
    if case.op == "all_gather_v_coalesced":
        xs = [_strided(base, case.strided), _strided(base.neg(), case.strided)]
        xs = [x.requires_grad_(grad) for x in xs]
        outs = vargather.all_gather_v_coalesced(
            xs, case.dim, grad=case.grad, transport=case.transport
        )
        if grad:
            torch.autograd.backward(outs, [ups[0], ups[0].neg()])
        return [o.detach() for o in outs], [x.grad for x in xs]
    x = _strided(base.clone(), case.strided).requires_grad_(grad)
    outs = _call(case, x, r)
    if grad:
        torch.autograd.backward(outs, ups)
    return [o.detach() for o in outs], [x.grad]


# --- the oracle's side --------------------------------------------------------------------


def expected(case: NanCase) -> list[tuple[list[torch.Tensor], list[torch.Tensor | None]]]:
    """What every rank must return, as ``run_nan_case`` returns it."""
    xs = inputs(case)
    ups = upstreams(case)
    w = case.world_size
    grad = bool(case.upstream)
    if case.op == "reduce_scatter_v":
        outs = [[y] for y in oracle.expected_reduce_scatter(xs, case.sizes, case.dim)]
        gs = (
            oracle.expected_reduce_scatter_grads(xs, case.sizes, [u[0] for u in ups], case.dim)
            if grad
            else [None] * w
        )
        return [(outs[r], [gs[r]]) for r in range(w)]
    if case.op == "all_to_all_v":
        ys = oracle.expected_all_to_all(xs, case.send, case.dim)
        gs = (
            oracle.expected_all_to_all_grads(xs, case.send, [u[0] for u in ups], case.dim)
            if grad
            else [None] * w
        )
        return [([ys[r]], [gs[r]]) for r in range(w)]
    if case.op == "all_gather_list":
        listed = oracle.expected_gather_list(xs)
        gs = oracle.expected_gather_list_grads(xs, ups, case.grad) if grad else [None] * w
        return [(listed, [gs[r]]) for r in range(w)]
    out = oracle.expected_output(xs, case.dim)
    up0 = [u[0] for u in ups] if grad else []
    gs = oracle.expected_input_grads(xs, up0, case.dim, case.grad) if grad else [None] * w
    if case.op == "all_gather_v":
        return [([out], [gs[r]]) for r in range(w)]
    negs = [x.neg() for x in xs]
    out2 = oracle.expected_output(negs, case.dim)
    gs2: Sequence[torch.Tensor | None] = (
        oracle.expected_input_grads(negs, [u.neg() for u in up0], case.dim, case.grad)
        if grad
        else [None] * w
    )
    return [([out, out2], [gs[r], gs2[r]]) for r in range(w)]


def nan_bit_patterns(t: torch.Tensor) -> set[int]:
    """The bit patterns (unsigned) of ``t``'s NaN components."""
    real = torch.view_as_real(t) if t.is_complex() else t
    bits = real[real.isnan()].view(INT_OF[real.element_size()])
    mask = (1 << (8 * real.element_size())) - 1
    return {b & mask for b in bits.tolist()}


def canonical_bits(dtype: torch.dtype) -> int:
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    (bits,) = nan_bit_patterns(torch.tensor([math.nan], dtype=real))
    return bits


# --- the strategy and the check (the property and fuzz/fuzz_multirank.py) ------------------


GLOO_TRANSPORTS = tuple(
    t for t in vargather.TRANSPORT_NAMES if unsupported_reason(t, "gloo") is None
)


def _atoms(dtype: str) -> st.SearchStrategy[Atom]:
    mant = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}
    real = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    payload = st.integers(0, (1 << (mant[real] - 1)) - 1)
    nan = st.tuples(st.booleans(), st.booleans(), payload)
    return st.one_of(
        st.integers(-8, 8),
        st.sampled_from(["-0", "inf", "-inf"]),
        nan,
    )


def _values(draw: Any, dtype: str, shapes: list[tuple[int, int]]) -> tuple[Atom, ...]:
    n = sum(atoms_needed(dtype, s) for s in shapes)
    return tuple(draw(st.lists(_atoms(dtype), min_size=n, max_size=n)))


@st.composite
def nan_cases(draw: Any) -> NanCase:
    op = draw(st.sampled_from(OPS))
    dtype = draw(st.sampled_from(DTYPES))
    grad = draw(st.sampled_from(vargather.CONTRACTS)) if op in REDUCING_BACKWARD else "sum"
    gathers = op in ("all_gather_v", "all_gather_v_coalesced")
    w = draw(st.integers(2, 3))
    width = draw(st.integers(1, 3))
    dim = draw(st.sampled_from([0, 1, -1]))
    sizes = tuple(draw(st.lists(st.integers(0, 3), min_size=w, max_size=w)))
    send: tuple[tuple[int, ...], ...] = ()
    if op == "all_to_all_v":
        row = st.lists(st.integers(0, 2), min_size=w, max_size=w).map(tuple)
        send = tuple(draw(st.lists(row, min_size=w, max_size=w)))
    case = NanCase(
        op,
        w,
        dtype,
        sizes,
        width,
        dim,
        send=send,
        grad=grad,
        transport=draw(st.sampled_from(GLOO_TRANSPORTS)) if gathers else "auto",
        strided=draw(st.booleans()),
        ops=op != "all_gather_v_coalesced" and draw(st.booleans()),
    )
    values = tuple(_values(draw, dtype, [s]) for s in case.input_shapes())
    upstream: tuple[tuple[Atom, ...], ...] = ()
    if draw(st.booleans()) or case.reducing:
        upstream = tuple(_values(draw, dtype, case.output_shapes(r)) for r in range(w))
    return replace(case, values=values, upstream=upstream)


def check(case: NanCase) -> None:
    results = get_pool(case.world_size).run(run_nan_case, case)
    want = expected(case)
    canonical = canonical_bits(case.torch_dtype)
    for r, ((outs, grads), (w_outs, w_grads)) in enumerate(zip(results, want, strict=True)):
        assert len(outs) == len(w_outs), f"rank {r}: {len(outs)} outputs"
        for k, (o, e) in enumerate(zip(outs, w_outs, strict=True)):
            assert_bitwise_equal(o, e, f"rank {r}, output {k}")
            if case.op == "reduce_scatter_v":
                assert nan_bit_patterns(o) <= {canonical}, f"rank {r}: a NaN not canonical"
        for k, (g, e) in enumerate(zip(grads, w_grads, strict=True)):
            if e is None:
                assert g is None, f"rank {r}, gradient {k}: expected none"
                continue
            assert g is not None, f"rank {r}, gradient {k}: none"
            assert_bitwise_equal(g, e, f"rank {r}, gradient {k} (grad={case.grad!r})")
            if case.op in REDUCING_BACKWARD and case.grad != "local":
                assert nan_bit_patterns(g) <= {canonical}, f"rank {r}: a NaN not canonical"

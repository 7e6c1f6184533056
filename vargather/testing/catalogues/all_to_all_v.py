"""``all_to_all_v``'s family catalogue (the family's rows): its case, strategies and call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, Final

from hypothesis import strategies as st

from ..cases import Implementation
from ..family import SplitCase, draw_dims, draw_shared, draw_world, fit_passed, shape_with
from ..family_catalogue import LARGE_ROW, LARGE_ROWS, FamilyCatalogue
from ..values import DTYPE_NAMES


@dataclass(frozen=True, repr=False)
class AllToAllCase(SplitCase):
    """``all_to_all_v(x_j, send[j], dim, cat_dim=cat_dim)`` on group rank ``j``; ``cat``:
    with ``cat_dim`` another dim than ``dim``, each rank's size along it (its entry of
    ``other`` there unused), ``send``'s columns then constant (every rank sends rank
    ``r`` as many rows)."""

    collective = "all_to_all_v"
    NAMES = ("x", "send_sizes", "recv_sizes", "dim", "cat_dim", "group", "out")
    POSITIONAL = ("send_sizes", "dim")

    send: tuple[tuple[int, ...], ...]
    other: tuple[int, ...]
    dim: int
    dtype: str = "float32"
    _: KW_ONLY
    pass_recv: bool = False
    cat_dim: int | None = None
    cat: tuple[int, ...] | None = None

    def input_shapes(self) -> list[tuple[int, ...]]:
        return a2a_shapes(self)[0]

    def output_shapes(self) -> list[Any]:
        return list(a2a_shapes(self)[1])

    def arguments(self, r: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        recv = recv_of(self, r) if self.pass_recv else None
        joined = {} if self.cat_dim is None else {"cat_dim": self.cat_dim}
        return (list(self.send[r]), self.dim), {"recv_sizes": recv, **joined}

    def oracle_args(self) -> dict[str, Any]:
        return {"send_sizes": self.send, "dim": self.dim, "cat_dim": self.cat_dim}

    def emptied(self) -> AllToAllCase:
        """Nothing sent by one rank (joined along another dim: nothing along
        ``cat_dim``, so every block it sends is empty)."""
        k = self.seed % len(self.send)
        if joined_along(self) is not None:
            assert self.cat is not None  # joined_along checked it
            return replace(self, cat=(*self.cat[:k], 0, *self.cat[k + 1 :]))
        send = list(self.send)
        send[k] = tuple(0 for _ in send)
        return replace(self, send=tuple(send))

    def with_dim(self, dim: int, **more: Any) -> Any:
        """Along ``dim``, joined along it too (another dim's ``cat`` is void)."""
        return super().with_dim(dim, cat_dim=None, cat=None, **more)

    def compilable(self) -> AllToAllCase:
        return replace(self, special=False, pass_recv=True)

    def fitted(self, target: Implementation, passes: Callable[[str], bool]) -> AllToAllCase:
        case = self
        if not passes("cat_dim"):
            case = replace(case, cat_dim=None, cat=None)
        return fit_passed(case, target, passes, "recv_sizes", "pass_recv")


def joined_along(case: AllToAllCase) -> int | None:
    """``case.cat_dim`` normalized when it joins along another dim than ``case.dim``."""
    if case.cat_dim is None or case.cat is None:
        return None
    n = len(case.other) + 1
    c = case.cat_dim % n
    return None if c == case.dim % n else c


def a2a_shapes(case: AllToAllCase) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Every group rank's input shape and output shape."""
    w = len(case.send)
    c = joined_along(case)
    ins = [list(shape_with(case.other, case.dim, sum(case.send[j]))) for j in range(w)]
    outs = [list(shape_with(case.other, case.dim, sum(s[r] for s in case.send))) for r in range(w)]
    if c is not None:
        assert case.cat is not None  # joined_along checked it
        for j in range(w):
            ins[j][c] = case.cat[j]
            outs[j][case.dim % len(outs[j])] = case.send[j][j]
            outs[j][c] = sum(case.cat)
    return [tuple(s) for s in ins], [tuple(s) for s in outs]


def recv_of(case: AllToAllCase, r: int) -> list[int]:
    """Group rank ``r``'s true receive sizes (along ``cat_dim``)."""
    if joined_along(case) is not None:
        assert case.cat is not None  # joined_along checked it
        return list(case.cat)
    return [s[r] for s in case.send]


@st.composite
def all_to_all_cases(
    draw: Any,
    world_sizes: tuple[int, ...] = (2, 3),
    dtypes: tuple[str, ...] = DTYPE_NAMES,
    subgroups: bool = True,
    most: int = 4,
    joined: bool = True,
) -> AllToAllCase:
    """``AllToAllCase``s: send matrices with zeros, negative dims, dtypes, subgroups;
    with ``joined``, a ``cat_dim`` now and then: another dim (uneven sizes along both:
    a constant-column send matrix and each rank's own size along ``cat_dim``, the
    sequence-parallel switch), or ``dim`` itself passed."""
    world, group, w = draw_world(draw, world_sizes, subgroups)
    other = draw_dims(draw, most)
    n = len(other) + 1
    dim = draw(st.integers(-n, n - 1))
    row = st.lists(st.integers(0, most), min_size=w, max_size=w).map(tuple)
    send = tuple(draw(st.lists(row, min_size=w, max_size=w)))
    cat_dim: int | None = None
    cat: tuple[int, ...] | None = None
    if joined and draw(st.booleans()):
        cat_dim = draw(st.integers(-n, n - 1))
        if cat_dim % n != dim % n:
            column = draw(row)
            send = tuple(column for _ in range(w))
            cat = draw(row)
    return AllToAllCase(
        send=send,
        other=other,
        dim=dim,
        cat_dim=cat_dim,
        cat=cat,
        **draw_shared(draw, dtypes, world, group),
        pass_recv=draw(st.booleans()),
        validate=draw(st.booleans()),
    )


@st.composite
def changing_sizes_sequences(
    draw: Any, world_size: int = 3, max_calls: int = 8, most: int = 4
) -> list[AllToAllCase]:
    """``all_to_all_v`` calls on one world whose send sizes change from call to call
    while the rest stays: each call, each rank keeps its sizes, moves a row from one
    block to another, or draws new ones; validated, receive sizes unknown. What MoE
    dispatch does every layer, answered by the learned round with new sizes (the full
    path where a block outgrows its slot)."""
    base = draw(
        all_to_all_cases(world_sizes=(world_size,), subgroups=False, most=most, joined=False)
    )
    dim = 0 if draw(st.booleans()) else base.dim
    base = replace(base, dim=dim, pass_recv=False, validate=True)
    w = world_size
    send = [list(row) for row in base.send]
    cases = [base]
    for _ in range(draw(st.integers(1, max_calls - 1))):
        for r in range(w):
            how = draw(st.sampled_from(("same", "move", "new")))
            if how == "move" and sum(send[r]):
                src = draw(st.sampled_from([k for k in range(w) if send[r][k]]))
                dst = draw(st.integers(0, w - 1))
                send[r][src] -= 1
                send[r][dst] += 1
            elif how == "new":
                send[r] = draw(st.lists(st.integers(0, most), min_size=w, max_size=w))
        sizes = tuple(tuple(row) for row in send)
        cases.append(replace(base, send=sizes, seed=draw(st.integers(0, 2**16))))
    return cases


@st.composite
def _large(draw: Any, world: int) -> AllToAllCase:
    row = st.lists(st.integers(0, LARGE_ROWS // world), min_size=world, max_size=world).map(tuple)
    send = tuple(draw(st.lists(row, min_size=world, max_size=world)))
    grad, seed = draw(st.booleans()), draw(st.integers(0, 2**16))
    return AllToAllCase(world, send, (LARGE_ROW,), 0, requires_grad=grad, seed=seed)


CATALOGUE: Final = FamilyCatalogue(
    AllToAllCase,
    cases=all_to_all_cases,
    large=_large,
    signature="(x, send_sizes, dim, *, recv_sizes, group, validate, timeout, cat_dim)",
    sizes_name="recv_sizes",
)


# --- misuse ---
# all_to_all_v(x, send_sizes, dim, recv_sizes=, cat_dim=): one send vector per rank, the
# receive sizes its transpose; every dimension but dim agrees.

import vargather  # noqa: E402

from ..misuse import Call, Misuse, TensorSpec, blocks, call, misuses, spec_call, tie  # noqa: E402


def a2a_send(w: int, r: int) -> list[int]:
    """Rank ``r``'s base send sizes (a matrix with zeros in it)."""
    return [(r + 2 * j) % 3 for j in range(w)]


def a2a_recv(w: int, r: int) -> list[int]:
    """Rank ``r``'s true receive sizes: column ``r`` of the send matrix."""
    return [a2a_send(w, j)[r] for j in range(w)]


def _a2a(r: int, w: int, *, extra_rows: int = 0, **kw: Any) -> Call:
    send = kw.pop("send", a2a_send(w, r))
    return spec_call("all_to_all_v", sum(a2a_send(w, r)) + extra_rows, send, **kw)


def _lie(w: int, o: int) -> list[int]:
    lie = a2a_recv(w, o)
    lie[(o + 1) % w] += 1
    return lie


def _joined(r: int, w: int, send: list[int] | None = None, cat_dim: int = 1) -> Call:
    """Joined along ``cat_dim=1``, each rank's own size along it (2 + rank)."""
    return call("all_to_all_v", TensorSpec((w, 2 + r)), send or [1] * w, 0, cat_dim=cat_dim)


# fmt: off
MISUSES: Final = misuses(
    _a2a,
    Misuse("a2a-send-sizes-wrong-length", "the send-size vector has one entry too many on one rank", vargather.SizesError,
        lambda r, w: _a2a(r, w, send=[*a2a_send(w, r), 0]), lambda w, o: (f"rank {o}: expected len(send_sizes) == world size {w}, got {w + 1}",)),
    Misuse("a2a-sum-mismatch", "sum(send_sizes) does not match x.shape[dim] on one rank (one more row)", vargather.SizesError,
        lambda r, w: _a2a(r, w, extra_rows=1), lambda w, o: (f"rank(s) [{o}]", f"rank {o}: expected sum(send_sizes) == {sum(a2a_send(w, o)) + 1}", f"got sum(send_sizes) = {sum(a2a_send(w, o))}")),
    Misuse("a2a-send-sizes-missing", "one rank passes send_sizes=None", vargather.SizesError,
        lambda r, w: _a2a(r, w, send=None), lambda w, o: (f"rank {o}: send_sizes is required",)),
    Misuse("a2a-send-sizes-a-string", "send_sizes is a string on one rank", vargather.SizesTypeError,
        lambda r, w: _a2a(r, w, send="1,2"), lambda w, o: (f"rank {o}: send_sizes must hold integers", "str")),
    Misuse("a2a-recv-sizes-lie", "recv_sizes (passed on every rank) is wrong about one sender on one rank", vargather.SizesMismatchError,
        lambda r, w: _a2a(r, w, recv_sizes=_lie(w, r)), lambda w, o: (f"recv_sizes passed on rank(s) [{o}] contradict the send sizes", f"send matrix {[a2a_send(w, j) for j in range(w)]}", f"rank {o}: expected recv_sizes={a2a_recv(w, o)}", f"got recv_sizes={_lie(w, o)}"), good=lambda r, w: _a2a(r, w, recv_sizes=a2a_recv(w, r))),
    Misuse("a2a-recv-sizes-lie-on-one-rank-only", "only one rank passes recv_sizes, and they are wrong", vargather.SizesMismatchError,
        lambda r, w: _a2a(r, w, recv_sizes=_lie(w, r)), lambda w, o: (f"rank {o}: expected recv_sizes={a2a_recv(w, o)}", f"got recv_sizes={_lie(w, o)}")),
    Misuse("a2a-recv-sizes-wrong-length", "recv_sizes has one entry too few on one rank", vargather.SizesError,
        lambda r, w: _a2a(r, w, recv_sizes=a2a_recv(w, r)[:-1]), lambda w, o: (f"rank {o}: expected len(recv_sizes) == world size {w}, got {w - 1}",)),
    Misuse("a2a-dtype-differs", "one rank passes float64 where the others pass float32", vargather.DTypeMismatchError,
        lambda r, w: _a2a(r, w, dtype="float64"), lambda w, o: ("dtype differs", "torch.float32", "torch.float64", f"[{o}]")),
    Misuse("a2a-ndim-differs", "one rank passes a tensor with one more dimension", vargather.ShapeMismatchError,
        lambda r, w: _a2a(r, w, trail=(2, 1)), lambda w, o: ("ndim differs", "2", "3", f"[{o}]")),
    Misuse("a2a-trailing-dim-differs", "a dimension other than dim differs on one rank", vargather.ShapeMismatchError,
        lambda r, w: _a2a(r, w, trail=(3,)), lambda w, o: ("shape outside the split dimension differs", "(2,)", "(3,)", f"[{o}]")),
    Misuse("a2a-dim-differs", "one rank splits along dim 1 of its transposed tensor (valid locally)", vargather.ArgumentMismatchError,
        lambda r, w: call("all_to_all_v", TensorSpec((2, sum(a2a_send(w, r)))), a2a_send(w, r), 1), lambda w, o: ("dimension (dim, normalized) differs", "0", "1", f"[{o}]")),
    Misuse("a2a-dim-out-of-range", "dim is out of range on one rank", vargather.DimError,
        lambda r, w: _a2a(r, w, dim=-3), lambda w, o: (f"rank(s) [{o}]", f"rank {o}: dim=-3", "expected -2 <= dim < 2")),
    Misuse("a2a-requires-grad-differs", "one rank does not need a gradient and its peers do", vargather.RequiresGradMismatchError,
        lambda r, w: _a2a(r, w, dtype="float64"), lambda w, o: ("requires_grad", "True", "False", f"[{o}]"), good=lambda r, w: _a2a(r, w, dtype="float64", requires_grad=True)),
    Misuse("a2a-cat-dim-differs", "its peers join the received blocks along cat_dim=1, one rank along dim", vargather.ArgumentMismatchError,
        lambda r, w: _joined(r, w, cat_dim=0), lambda w, o: ("cat_dim", f"[{o}]"), good=_joined),
    Misuse("a2a-cat-blocks", "joined along cat_dim=1, one rank sends rank 0 two rows where its peers send one", vargather.SizesMismatchError,
        lambda r, w: _joined(r, w, [2] + [1] * (w - 2) + [0]), lambda w, o: (f"[{o}]",), good=_joined, blamed=tie),
    Misuse("mixed-rs-beside-a2a", "one rank calls reduce_scatter_v while its peers call all_to_all_v", vargather.ProtocolMismatchError,
        lambda r, w: call("reduce_scatter_v", TensorSpec((5, 2)), blocks(w)), lambda w, o: ("reduce_scatter_v / all_to_all_v: collective differs across ranks", f"'reduce_scatter_v' on rank(s) [{o}]", "'all_to_all_v'", "call the same collective on every rank"), blamed=tie),
)
# fmt: on
"""Every misuse of all_to_all_v, each raised as the same error on every rank."""

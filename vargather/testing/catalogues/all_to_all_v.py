"""``all_to_all_v``'s catalogue: the family's rows (``vargather.testing.family_catalogue``) for it.

Where it sits: one of the kit's catalogues (``vargather.testing.catalogues``), beneath
the engine, which runs its rows as it runs any collective's.
"""

from __future__ import annotations

from typing import Final

from ..family_catalogue import FamilyCatalogue

__all__ = ["CATALOGUE"]

CATALOGUE: Final = FamilyCatalogue("all_to_all_v")


# --- misuse ---
# all_to_all_v(x, send_sizes, dim, recv_sizes=, cat_dim=): one send vector per rank, the
# receive sizes its transpose; every dimension but dim agrees.
from typing import Any  # noqa: E402  # the misuse tail's, below the catalogue above

import vargather  # noqa: E402

from ..misuse import Call, Misuse, TensorSpec, call, misuses, tie  # noqa: E402


def a2a_send(w: int, r: int) -> list[int]:
    """Rank ``r``'s base send sizes (a matrix with zeros in it)."""
    return [(r + 2 * j) % 3 for j in range(w)]


def a2a_recv(w: int, r: int) -> list[int]:
    """Rank ``r``'s true receive sizes: column ``r`` of the send matrix."""
    return [a2a_send(w, j)[r] for j in range(w)]


def _a2a(
    r: int,
    w: int,
    *,
    extra_rows: int = 0,
    trail: tuple[int, ...] = (2,),
    dtype: str = "float32",
    requires_grad: bool = False,
    **kw: Any,
) -> Call:
    send = kw.pop("send", a2a_send(w, r))
    spec = TensorSpec((sum(a2a_send(w, r)) + extra_rows, *trail), dtype, requires_grad)
    return call("all_to_all_v", spec, send, **kw)


def _lie(w: int, o: int) -> list[int]:
    lie = a2a_recv(w, o)
    lie[(o + 1) % w] += 1
    return lie


def _joined(r: int, w: int, send: list[int] | None = None, cat_dim: int = 1) -> Call:
    """Joined along ``cat_dim=1``, each rank's own size along it (2 + rank)."""
    return call("all_to_all_v", TensorSpec((w, 2 + r)), send or [1] * w, 0, cat_dim=cat_dim)


# A table, two lines an entry: name, summary, error; bad call, fragments, options.
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
        lambda r, w: call("reduce_scatter_v", TensorSpec((5, 2)), [(2, 0, 3, 1)[j] for j in range(w)]), lambda w, o: ("reduce_scatter_v / all_to_all_v: collective differs across ranks", f"'reduce_scatter_v' on rank(s) [{o}]", "'all_to_all_v'", "call the same collective on every rank"), blamed=tie),
)
# fmt: on
"""Every misuse of all_to_all_v, each raised as the same error on every rank."""

"""Shared pieces of the single-process stage tests (``test_buffers``, ``test_wire``,
``test_exchange``, ``test_oracle``): layouts of a case, byte equality, and a strategy
for one rank's call, right or wrong in any argument."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import vargather
from vargather._args import CallRecord, check_call
from vargather._group import GroupInfo
from vargather._layout import Layout
from vargather.testing import strategies as vst
from vargather.testing.values import DTYPE_NAMES

try:  # the case model's home once the testing kit is a subpackage
    from vargather.testing.cases import GatherCase
except ImportError:  # the flat layout of the kit
    from vargather._cases import GatherCase  # type: ignore[no-redef]  # one of two homes

TRANSPORTS = vargather.TRANSPORT_NAMES

# In-process cases: every dtype, dim, ragged sizes (0 and all-zero included), strides
# and offsets of the shards; the gather group is simulated, so any world size works.
cases = vst.gather_cases(min_world_size=1, max_world_size=5, dtypes=DTYPE_NAMES)
float_cases = vst.gather_cases(
    min_world_size=1,
    max_world_size=5,
    dtypes=["float64", "complex128", "float32"],
    values=["integers"],
    upstream=["integers"],
    requires_grad=True,
)


def layouts_of(case: GatherCase) -> list[Layout]:
    d = case.normalized_dim
    s = case.shapes[0]
    return [
        Layout(
            sizes=case.sizes,
            dim=d,
            leading_shape=s[:d],
            trailing_shape=s[d + 1 :],
            dtype=case.torch_dtype,
            rank=r,
            world_size=case.world_size,
        )
        for r in range(case.world_size)
    ]


_odd_inputs = st.one_of(
    st.just(None),
    st.just(3.5),
    st.just("tensor"),
    st.builds(torch.zeros, st.just(())),
)
_odd_dims = st.one_of(st.integers(-6, 6), st.just(1.0), st.just(True), st.just(None))
_odd_sizes = st.one_of(
    st.none(),
    st.lists(st.integers(-2, 6), max_size=5),
    st.lists(st.integers(0, 6), max_size=5).map(lambda v: torch.tensor(v, dtype=torch.int64)),
    st.just([1.5, 2.0]),
    st.just("12"),
)
_odd_contracts = st.one_of(st.sampled_from(vargather.CONTRACTS), st.text(max_size=40), st.none())
_odd_transports = st.one_of(st.sampled_from(TRANSPORTS), st.text(max_size=40), st.just(7))


@st.composite
def calls(draw: st.DrawFn, world_size: int, rank: int) -> CallRecord:
    """One rank's record for a call that may be right or wrong in any argument."""
    if draw(st.integers(0, 4)) == 0:
        x: object = draw(_odd_inputs)
    else:
        case = draw(vst.gather_cases(world_size=1, max_ndim=3, dtypes=DTYPE_NAMES))
        x = case.shard(0)
    dim = draw(_odd_dims)
    return check_call(
        x,
        dim,
        sizes=draw(_odd_sizes),
        grad=draw(_odd_contracts),
        transport=draw(_odd_transports),
        info=GroupInfo(None, rank, world_size, True, "gloo"),
    ).record

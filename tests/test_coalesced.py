"""``all_gather_v_coalesced`` on real gloo worlds, against the single-process oracle.

Several tensors (each its own dtype, shape, ragged size and ``dim``) in one call: outputs
bit for bit ``torch.cat`` of each tensor's shards, gradients of every contract under
upstream gradients that differ per rank, one collective in steady state, one metadata
round and one payload collective otherwise; misuse (a dtype on one rank for tensor #1,
different numbers of tensors, different dims) raises the same error on every rank and
leaves the group usable. Agreement on the fused state is checked after every call as
in ``tests/test_fused.py``.
"""

from __future__ import annotations

import pytest
import torch

import vargather

from ._fused_fns import Step
from .test_fused import check_script

pytestmark = pytest.mark.multirank


def three(world: int, lead: int = 0) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per rank: a float32 (n, 4), an int64 (n,) and a bfloat16 (2, n, 3) shard."""
    return tuple(
        ((r + lead, 4), ((2 * r + lead) % 3,), (2, (r + 1 + lead) % 4, 3)) for r in range(world)
    )


DTYPES3 = ("float32", "int64", "bfloat16")
DIMS3 = (0, 0, 1)


def test_the_api_is_exported() -> None:
    assert "all_gather_v_coalesced" in vargather.__all__
    assert callable(vargather.all_gather_v_coalesced)


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_matches_the_oracle_and_is_one_collective_in_steady_state(world: int) -> None:
    d = (DTYPES3,) * world
    steps = [
        Step("co", three(world), d, dim=DIMS3),  # first call: three rounds
        Step("co", three(world), d, dim=DIMS3),  # steady state: one
        Step("co", three(world, 1), d, dim=DIMS3),  # other sizes, still fitting
        # forced transports: the metadata round, then one payload collective
        Step("co", three(world), d, dim=DIMS3, transport="padded"),
        Step("co", three(world), d, dim=DIMS3, transport="alltoallv"),
        Step("co", three(world), d, dim=DIMS3, transport="broadcast"),
        # every sizes known and validate=False: the payload collective only
        Step("co", three(world), d, dim=DIMS3, sizes=True, validate=False),
        # sizes known and validated: the fused round
        Step("co", three(world), d, dim=DIMS3, sizes=True),
        # NaN, -0.0, inf, bool and complex bytes
        Step(
            "co",
            tuple(((r + 1,), (r,), (r, 2)) for r in range(world)),
            (("float16", "bool", "complex128"),) * world,
        ),
        # empty on every rank, and no tensors at all
        Step("co", tuple(((0, 2), (0,)) for _ in range(world)), (("float32", "int32"),) * world),
        Step("co", ((),) * world, ((),) * world),
        # a single call in between keeps its own state
        Step("v", tuple((r, 2) for r in range(world)), ("float32",) * world),
        Step("co", three(world), d, dim=DIMS3),
    ]
    collectives: list[int | None] = [3, 1, None, 2, 2, 2, 1, 1, None, 1, 1, None, 1]
    results = check_script(world, steps, [None] * len(steps), collectives)
    # the coalesced state holds three header slots; the single one is apart
    coalesced_state = results[0][1]["state"][1]
    assert coalesced_state[1] == 3
    assert results[0][11]["state"][1] == results[0][11]["state_before"][1]


@pytest.mark.parametrize("contract", ["sum", "local", "mean"])
def test_coalesced_gradients_match_the_oracle(contract: str) -> None:
    world = 3
    shapes = tuple(((r + 1, 2), (2, (2 * r) % 3), (r,)) for r in range(world))
    dtypes = (("float32", "float64", "int64"),) * world
    steps = [
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract),  # three rounds
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract),  # fused
        Step("co", shapes, dtypes, dim=(0, -1, 0), grad=contract, transport="broadcast"),
    ]
    check_script(world, steps, [None] * 3, [3, 1, 2])


def test_misuse_raises_the_same_error_on_every_rank_and_the_group_stays_usable() -> None:
    world = 3
    d = (DTYPES3,) * world
    ok = Step("co", three(world), d, dim=DIMS3)
    bad_dtype = Step(
        "co",
        three(world),
        (DTYPES3, DTYPES3, ("float32", "int32", "bfloat16")),
        dim=DIMS3,
    )
    fewer = Step("co", (three(world)[0], three(world)[1][:2], three(world)[2]), d, dim=DIMS3)
    other_dims = Step(
        "co",
        tuple(((2, 2), (r,), (2, 2, 3)) for r in range(world)),
        d,
        rank_dims=(DIMS3, DIMS3, (0, 0, 0)),
    )
    dims_count = Step("co", three(world), d, dim=(0, 0))
    local_problem = Step("co", (three(world)[0], three(world)[1], ((2, 4), (1,), ())), d, dim=DIMS3)
    steps = [ok, ok, bad_dtype, ok, fewer, ok, other_dims, ok, dims_count, local_problem, ok]
    errors: list[str | None] = [None] * len(steps)
    errors[2] = "DTypeMismatchError"
    errors[4] = "ArgumentMismatchError"
    errors[6] = "ArgumentMismatchError"
    errors[8] = "DimError"
    errors[9] = "InputShapeError"
    collectives: list[int | None] = [None, 1, None, 1, None, 1, None, 1, None, None, 1]
    results = check_script(world, steps, errors, collectives)
    message = results[0][2]["error"][1]
    assert message.startswith("all_gather_v_coalesced: tensor #1: dtype differs across ranks")
    assert "torch.int32 on rank(s) [2]" in message
    assert results[0][2]["error"][2] == (2,)
    assert "number of tensors differs across ranks" in results[0][4]["error"][1]
    assert results[0][4]["error"][2] == (1,)
    assert results[0][6]["error"][1].startswith("all_gather_v_coalesced: tensor #2: gather dim")
    assert "expected one dim, or one per tensor (3), got 2 dims" in results[0][8]["error"][1]
    assert "tensor #2" in results[0][9]["error"][1]


def test_without_a_world_the_inputs_come_back_and_misuse_still_raises() -> None:
    a, b = torch.ones(2, 3), torch.arange(4)
    got = vargather.all_gather_v_coalesced([a, b], dim=[1, 0])
    assert len(got) == 2
    assert got[0] is a
    assert got[1] is b
    assert vargather.all_gather_v_coalesced([]) == []
    with pytest.raises(vargather.DimError, match=r"tensor #0: .*one per tensor \(2\), got 3"):
        vargather.all_gather_v_coalesced([a, b], dim=[0, 0, 0])
    with pytest.raises(vargather.DimError, match=r"tensor #1: .*dim=2 is out of range"):
        vargather.all_gather_v_coalesced([a, b], dim=[0, 2])
    with pytest.raises(vargather.InputTypeError, match="expected a sequence of tensors"):
        vargather.all_gather_v_coalesced(a)  # type: ignore[arg-type]  # the misuse tested
    with pytest.raises(vargather.SizesError, match=r"one entry per tensor \(2\), got 1"):
        vargather.all_gather_v_coalesced([a, b], sizes=[[2]])

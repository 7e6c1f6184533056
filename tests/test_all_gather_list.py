"""all_gather_list on real gloo worlds: issue 20's 3-rank scenario ((2, 3), (0, 1),
(4, 2)), the contracts, misuse, DeviceMesh, torch.compile (its catalogue rows,
Hypothesis-drawn, run in tests/test_family_properties.py)."""

from __future__ import annotations

import pytest
import torch

import vargather
from vargather import oracle
from vargather.testing import assert_bitwise_equal, get_pool
from vargather.testing.catalogues.all_gather_list import GatherListCase
from vargather.testing.family import check_case
from vargather.testing.misuse import MisuseCase, check_misuse

from . import _family_fns as fns
from . import _gather_list_fns as gl_fns
from ._compile_fns import warm_backend

pytestmark = pytest.mark.multirank

DONE_WHEN = ((2, 3), (0, 1), (4, 2))


@pytest.mark.parametrize("grad", ["sum", "local", "mean"])
def test_done_when_shapes_and_contracts(grad: str) -> None:
    """Issue 20: 3 ranks holding (2, 3), (0, 1), (4, 2): every rank gets each tensor,
    and the gradient of every contract (per-rank upstream gradients)."""
    case = GatherListCase(3, DONE_WHEN, grad=grad, special=True, seed=11)
    assert check_case(get_pool(3), case) == []
    if grad == "sum":  # the sum gradient spelled out: x_r.grad = sum_j g_{j,r}
        ups = case.upstream()
        want = oracle.expected_gather_list_grads(case.inputs(), ups, "sum")
        assert_bitwise_equal(want[2], ups[0][2] + ups[1][2] + ups[2][2])


@pytest.mark.parametrize("dtype", ["bfloat16", "bool", "int16", "complex64", "float64"])
def test_every_dtype_gloo_carries(dtype: str) -> None:
    case = GatherListCase(3, DONE_WHEN, dtype=dtype, special=True, pass_shapes=True)
    assert check_case(get_pool(3), case) == []


def test_trusted_shapes_in_a_subgroup() -> None:
    case = GatherListCase(3, ((1, 2, 0), (3, 1, 2)), group=(0, 1), pass_shapes=True, validate=False)
    assert check_case(get_pool(3), case) == []


@pytest.mark.parametrize(
    "kind",
    [
        "list-dtype-differs",
        "list-ndim-differs",
        "list-shapes-lie",
        "list-grad-contract-differs",
        "list-requires-grad-differs",
    ],
)
def test_misuse_same_error_everywhere(kind: str) -> None:
    assert check_misuse(get_pool(3), MisuseCase("all_gather_list", kind, 3, 2)) == []


def test_a_peer_calling_all_gather_v_coalesced_is_caught_on_every_rank() -> None:
    """all_gather_list's round (kind ``coalesced``, one carrier) beside a peer's
    ``all_gather_v_coalesced([x])``: the headers do not validate (the carrier's ndim
    differs), and every rank raises the one error of ranks calling different
    collectives (``ProtocolMismatchError``, naming both and which rank called which)
    before any output; the next call works."""
    results = get_pool(2).run(fns.list_beside_coalesced, None)
    assert [r[0][0] if r[0] else None for r in results] == ["ProtocolMismatchError"] * 2
    message = results[0][0][1]
    assert message.startswith("all_gather_v_coalesced / all_gather_list: collective differs")
    assert "'all_gather_list' on rank(s) [0]" in message
    assert "'all_gather_v_coalesced' on rank(s) [1]" in message
    for _, after in results:
        assert after == [[0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]


def test_absent_rank_is_the_named_timeout() -> None:
    assert check_misuse(get_pool(3), MisuseCase("all_gather_list", "absent", 3, 0)) == []


def test_device_mesh_as_group() -> None:
    for r, (rs, a2a, lst) in enumerate(get_pool(2).run(fns.mesh_calls, None)):
        assert rs.shape == ((1, 2) if r == 0 else (2, 2))
        assert [t.shape[0] for t in lst] == [1, 2]
        assert a2a.shape[0] == (2 if r == 0 else 4)


ALL = ("reduce_scatter_v", "all_to_all_v", "all_gather_list")


@pytest.mark.parametrize(
    ("backend", "which"),
    [
        ("aot_eager", ALL),
        # slow: 17 s of the default run's 2 cores with cold compile caches. Every
        # collective's op is registered by the one mechanism the gather's is, whose
        # effectful op inductor keeps in test_compile.py's default inductor scenarios.
        pytest.param("inductor", ALL, marks=pytest.mark.slow),
    ],
    ids=["aot_eager-all", "inductor-all"],
)
def test_compiled_fullgraph_step_with_an_empty_block(backend: str, which: tuple[str, ...]) -> None:
    """Each collective's custom op under torch.compile(fullgraph=True), an empty block
    on rank 1: every rank issues the same collectives forward and backward (the ops
    are effectful, so inductor drops none), and the gradients are the eager ones. The
    default run compiles them under aot_eager, the slow run under inductor too."""
    pool = get_pool(2)
    if backend == "inductor":
        # inductor's one-time start in a rank (a minute and more with cold compile
        # caches on 2 loaded cores) in a call of its own, not in the timed steps
        pool.run(warm_backend, backend)
    results = pool.run(fns.compiled_steps, (backend, which))
    for name in which:
        counts = {found[name][0] for found in results}
        assert len(counts) == 1, (name, counts)  # the same collectives on every rank
        (forward, backward) = counts.pop()
        assert backward == 1, name
        # 2 (exchange + payload) or 1 (a small payload riding in the exchange, once the
        # group's state holds a slot); all_gather_list's fused round is 1 to 3
        assert forward in (1, 2) or (name == "all_gather_list" and forward <= 3), name
        for r, found in enumerate(results):
            _, got, want = found[name]
            assert got is not None, (name, r)
            assert_bitwise_equal(got, want, f"{name} rank {r}")


def test_one_process_world() -> None:
    x = torch.ones(2, 3)
    (out,) = vargather.all_gather_list(x)
    assert out is x
    with pytest.raises(vargather.SizesError, match="shapes"):
        vargather.all_gather_list(x, shapes=[[3, 3]])


@pytest.mark.slow
def test_three_collectives_in_one_inductor_graph_keep_one_order() -> None:
    """Independent family collectives in one graph: with inductor's peak-memory
    reordering off, every rank issues the same collectives in the same order."""
    results = get_pool(2).run(fns.compiled_three_in_one_graph, None)
    assert results[0] == results[1]
    assert 5 <= len(results[0][0]) <= 7  # 2 + 2 + all_gather_list's fused round (1 to 3)


@pytest.mark.parametrize("grad", ["sum", "mean"])
def test_zero_dim_tensors(grad: str) -> None:
    """0-d tensors (a loss per rank, say) gather as a list of 0-d tensors."""
    case = GatherListCase(2, ((), ()), grad=grad, seed=9)
    assert check_case(get_pool(2), case) == []


def test_the_carrier_rides_as_its_parts() -> None:
    """The round copies the metadata and x straight into its payload slot: a call whose
    payload rides (one collective) makes no carrier, and the results are the inputs bit
    for bit for strided, lazily conjugated, bool, 0-d, empty and wide-round inputs,
    including two strided inputs of one size and two shapes in a row."""
    w = 3
    results = get_pool(w).run(gl_fns.carrier_parts, None)
    for r, calls in enumerate(results):
        assert [c[0] for c in calls] == [c for c in gl_fns.PART_CASES for _ in range(2)]
        for i, (case, issued, made, got) in enumerate(calls):
            want = oracle.expected_gather_list([gl_fns.part_input(case, j) for j in range(w)])
            assert len(got) == w, (r, case)
            for j in range(w):
                assert_bitwise_equal(got[j], want[j], f"rank {r} {case} call {i % 2} tensor {j}")
            if issued == 1:  # the payload rode: nothing joined x to its metadata
                assert made == 0, (r, case, i)
            if i % 2 == 1:  # the second call of a case rides (the first taught the slots)
                assert issued == 1, (r, case, issued)

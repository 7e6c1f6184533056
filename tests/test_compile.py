"""torch.compile and DeviceMesh on real gloo worlds (see docs/compile.md).

A compiled training step (linear layer -> ``all_gather_v`` with ragged sizes -> a loss
that differs per rank -> backward) must give the eager step's bytes, forward and
gradients, under the eager, aot_eager and inductor backends with ``fullgraph=True``,
and dynamo's own counters must see no graph break; with ``sizes=None`` exactly the one
break ``docs/compile.md`` promises. ``group=`` takes a ``DeviceMesh``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import vargather
from vargather.testing import assert_bitwise_equal, get_pool

from . import _compile_fns as fns

pytestmark = [pytest.mark.multirank, pytest.mark.xdist_group("compile")]

DOCS = Path(__file__).resolve().parent.parent / "docs" / "compile.md"


def _check_step(case: fns.StepCase, results: list[fns.StepResult]) -> None:
    if case.mesh is None:
        rows = [r.eager_out for r in results]
        for rank, o in enumerate(rows):
            assert_bitwise_equal(o, rows[0], f"eager output of rank {rank} differs from rank 0's")
    for rank, res in enumerate(results):
        assert len(res.compiled_out) == 2
        for call, (out, grads) in enumerate(zip(res.compiled_out, res.compiled_grads, strict=True)):
            where = f"rank {rank}, compiled call {call}, {case}"
            assert_bitwise_equal(out, res.eager_out, f"{where}: output differs from eager")
            assert grads.keys() == res.eager_grads.keys() == {"weight", "bias", "x", "loss"}
            for name, want in res.eager_grads.items():
                assert_bitwise_equal(grads[name], want, f"{where}: {name} differs from eager")


def _docs_breaks(which: str) -> int:
    """The graph-break count docs/compile.md states for ``which`` ("given", "None",
    "None, without fullgraph" or "None, with_layout")."""
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(rf"<!-- breaks sizes={re.escape(which)}: (\d+) -->", text)
    assert m is not None, f"docs/compile.md states no graph-break count for sizes={which}"
    return int(m.group(1))


STEPS = [
    fns.StepCase("eager", "sum", (3, 0, 4)),
    fns.StepCase("aot_eager", "sum", (3, 1, 4)),
    fns.StepCase("aot_eager", "local", (2, 5, 1)),
    fns.StepCase("aot_eager", "mean", (2, 0, 1), transport="padded"),
    fns.StepCase("aot_eager", "sum", (1, 3, 2), transport="alltoallv", dim=1),
    fns.StepCase("aot_eager", "sum", (4, 2), validate=False),
    # slow: graph breaks and graph counts are dynamo's, decided before the backend (the
    # aot_eager rows count them); inductor's bytes and collectives under fullgraph=True
    # are the default run's inductor scenarios below (tens of seconds a compile here)
    pytest.param(fns.StepCase("inductor", "sum", (3, 1, 4)), marks=pytest.mark.slow),
]


@pytest.mark.parametrize(
    "case",
    STEPS,
    ids=lambda c: (
        f"W{len(c.sizes)}-{c.backend}-{c.grad}-{c.transport}-dim{c.dim}"
        + ("" if c.validate else "-novalidate")
    ),
)
def test_compiled_step_with_sizes_is_eager_bit_for_bit_with_no_graph_break(
    case: fns.StepCase,
) -> None:
    pool = get_pool(len(case.sizes))
    if case.backend == "inductor":
        pool.run(fns.warm_backend, case.backend)
    results = pool.run(fns.compiled_step, case)
    _check_step(case, results)
    for rank, res in enumerate(results):
        assert res.graph_breaks == 0, f"rank {rank}: {res.graph_breaks} graph breaks"
        assert res.unique_graphs == 1, f"rank {rank}: {res.unique_graphs} graphs"
        assert (res.explain_breaks, res.explain_graphs) == (0, 1)
    assert _docs_breaks("given") == 0


@pytest.mark.parametrize(
    "backend",
    # slow: inductor (the inductor scenario "plain, nosizes" below compiles sizes=None
    # under fullgraph=True in the default run, bit for bit against eager)
    ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)],
)
def test_compiled_step_without_sizes_is_one_graph_bit_for_bit(backend: str) -> None:
    """sizes=None under fullgraph: one graph, no break, the eager bytes (the gathered
    length is an unbacked symbolic int bound at run time). Without fullgraph dynamo
    refuses operators whose output shape depends on data, so the call takes the eager
    path behind the one break ``docs/compile.md`` states (explain counts it)."""
    case = fns.StepCase(backend, "sum", (2, 0, 3), pass_sizes=False, fullgraph=True)
    pool = get_pool(3)
    if backend == "inductor":
        pool.run(fns.warm_backend, backend)
    results = pool.run(fns.compiled_step, case)
    _check_step(case, results)
    assert _docs_breaks("None") == 0
    without_fullgraph = _docs_breaks("None, without fullgraph")
    for rank, res in enumerate(results):
        assert res.graph_breaks == 0, f"rank {rank}: {res.break_reasons}"
        assert res.unique_graphs == 1, f"rank {rank}: {res.unique_graphs} graphs"
        assert res.explain_breaks == without_fullgraph
        assert res.explain_graphs == without_fullgraph + 1


def test_with_layout_without_sizes_breaks_the_graph_as_documented() -> None:
    """``all_gather_v_with_layout(x)`` hands Python ints back (the ``Layout``): without
    sizes that is one graph break, which fullgraph=True refuses (so it cannot hide)."""
    promised = _docs_breaks("None, with_layout")
    for rank, (breaks, graphs, refused) in enumerate(
        get_pool(2).run(fns.with_layout_unsized, None)
    ):
        assert (breaks, graphs) == (promised, promised + 1), f"rank {rank}"
        assert "torch.compiler.disable" in refused, f"rank {rank}: {refused}"


def test_compiled_step_follows_changing_sizes() -> None:
    sizes = ((3, 1, 4), (0, 2, 5), (1, 1, 1), (6, 0, 2))
    for rank, same in enumerate(get_pool(3).run(fns.changing_sizes, sizes)):
        assert same == [True] * len(sizes), f"rank {rank}: {same}"


def test_validation_runs_inside_the_compiled_operator() -> None:
    """A lie about sizes, compiled with fullgraph: the operator's exchange refuses it
    on every rank with the eager error, word for word."""
    results = get_pool(3).run(fns.compiled_lie, 3)
    eager = results[0][0]
    assert eager[0] == "SizesError"
    assert eager[2] == (2,)
    assert "rank 2: expected sizes[2] == 3" in eager[1]
    for rank, (e, c) in enumerate(results):
        assert e == eager, f"rank {rank}: eager raised {e}"
        assert c == eager, f"rank {rank}: compiled raised {c}, eager {eager}"


def test_compiled_with_layout_has_no_graph_break_as_sizes_change() -> None:
    for rank, rows in enumerate(get_pool(2).run(fns.compiled_with_layout, 2)):
        *calls, (breaks, graphs) = rows
        assert breaks == 0, f"rank {rank}: {breaks} graph breaks"
        assert graphs == 2, f"rank {rank}: {graphs} graphs (static, then dynamic sizes)"
        for k, (got, want) in enumerate(calls):
            assert_bitwise_equal(got[0], want[0], f"rank {rank}, call {k}: tensor")
            assert got[1:] == want[1:], f"rank {rank}, call {k}: layout {got[1:]} != {want[1:]}"
            assert all(type(n) is int for n in (*got[1], *got[2], got[3]))
        assert [want[1] for _, want in calls] == [(0, 1), (2, 3), (4, 2)]


def test_compiled_gather_in_one_process_is_the_identity() -> None:
    """No torch.distributed: the operator is the identity, with no graph break."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x = torch.arange(6.0).reshape(3, 2).requires_grad_(True)

    def f(t: torch.Tensor) -> torch.Tensor:
        return vargather.all_gather_v(t * 2, 0, sizes=[3], grad="mean").sum(0)

    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    torch.autograd.backward(got, torch.tensor([1.0, -1.0]))
    assert torch.equal(got, torch.tensor([12.0, 18.0]))
    assert x.grad is not None
    assert torch.equal(x.grad, torch.tensor([[2.0, -2.0]] * 3))
    assert sum(counters["graph_break"].values()) == 0
    torch._dynamo.reset()


def _toy_route() -> object:
    """A collective declared as ``docs/compile.md`` says, outside the library: one
    ``OpSpec`` pair and a ``Route`` (eager: ``x * 3``; the operator only for a plain
    ``sizes``), with no edit of ``_compiled`` or ``_api``."""
    from vargather._compiled import OpSpec, Route, define_ops, fresh, op_args, resized

    def traced(x: object, sizes: object) -> torch.Tensor | None:
        a = op_args(x, 0, None, None, True, None)
        if a is None or not isinstance(sizes, list):
            return None
        out: torch.Tensor = torch.ops.vargather.test_toy_triple(a.x, a.dim, a.group_name)
        return out

    if not hasattr(torch.ops.vargather, "test_toy_triple"):
        define_ops(
            OpSpec(
                "test_toy_triple",
                "(Tensor x, SymInt dim, str group_name) -> Tensor",
                lambda x, dim, name: fresh(x * 3, x),
                lambda x, dim, name: x.new_empty(resized(x, (dim, x.shape[dim]))),
                "test_toy_triple_backward",
                lambda inputs, output: (inputs[2],),
            ),
            OpSpec(
                "test_toy_triple_backward",
                "(Tensor grad_output, str group_name) -> Tensor",
                lambda g, name: g * 3,
                lambda g, name: g.new_empty(g.shape),
            ),
        )
    return Route("test_toy_triple", lambda x, sizes: x * 3, traced)


def test_a_new_collective_needs_only_its_spec_and_route() -> None:
    """The interface a new collective uses: its operator traces with fullgraph=True
    and its backward formula runs; an argument its ``traced`` refuses takes the
    untraced route, exactly one graph break."""
    route = _toy_route()
    assert callable(route)
    torch._dynamo.reset()
    x = torch.arange(6.0).reshape(3, 2).requires_grad_(True)
    got = torch.compile(lambda t: route(t, [3]).sum(), backend="aot_eager", fullgraph=True)(x)
    got.backward()
    assert got.item() == 45.0
    assert x.grad is not None
    assert torch.equal(x.grad, torch.full((3, 2), 3.0))
    explained = torch._dynamo.explain(lambda t: (route(t * 2, None) + 1).sum())(x.detach())
    assert (explained.graph_count, explained.graph_break_count) == (2, 1)
    assert torch.equal(route(x, None), x * 3)  # eagerly: the eager code
    torch._dynamo.reset()


# --- DeviceMesh ------------------------------------------------------------------------


def test_one_dim_mesh_is_its_group() -> None:
    for rank, (out, ref, sizes, ranks) in enumerate(
        get_pool(3).run(fns.mesh_gather, ((3,), None, False))
    ):
        assert_bitwise_equal(out, ref, f"rank {rank}")
        assert sizes == (1, 2, 3)
        assert ranks == [0, 1, 2]


@pytest.mark.parametrize("mesh_dim", [0, 1, -1, "a", "b"])
def test_two_dim_mesh_gathers_along_mesh_dim(mesh_dim: int | str) -> None:
    results = get_pool(4).run(fns.mesh_gather, ((2, 2), mesh_dim, True))
    index = {"a": 0, "b": 1}[mesh_dim] if isinstance(mesh_dim, str) else mesh_dim % 2
    for rank, (out, ref, sizes, ranks) in enumerate(results):
        # mesh (2, 2) over ranks [[0, 1], [2, 3]]: dim 0 groups columns, dim 1 rows
        want = [rank % 2, rank % 2 + 2] if index == 0 else [rank - rank % 2, rank - rank % 2 + 1]
        assert ranks == want, f"rank {rank}: group {ranks}"
        assert sizes == tuple(r + 1 for r in want)
        assert_bitwise_equal(out, ref)
        assert_bitwise_equal(out, torch.cat([torch.full((r + 1, 2), float(r)) for r in want]))


@pytest.mark.parametrize(
    ("what", "fragments"),
    [
        ("no mesh_dim", ["2-D DeviceMesh of shape (2, 2)", "mesh_dim="]),
        ("mesh_dim out of range", ["mesh_dim=2 is out of range", "shape (2, 2)"]),
        ("mesh_dim name unknown", ["mesh_dim='nope'", "shape (2, 2)"]),
        ("mesh_dim without a mesh", ["expected group= to be a DeviceMesh, got NoneType"]),
        ("compiled, no mesh_dim", ["2-D DeviceMesh of shape (2, 2)"]),
    ],
)
def test_mesh_misuse_is_a_group_error(what: str, fragments: list[str]) -> None:
    outcomes = get_pool(4).run_outcomes(fns.mesh_misuse, ((2, 2), what))
    for o in outcomes:
        assert type(o.exception) is vargather.GroupError, o
        for fragment in fragments:
            assert fragment in str(o.exception)


@pytest.mark.parametrize(
    ("case", "rows"),
    [
        (fns.StepCase("aot_eager", "sum", (1, 3, 2, 0), mesh=(2, 2), mesh_dim=1), [4, 4, 2, 2]),
        (fns.StepCase("aot_eager", "mean", (2, 0, 3), mesh=(3,)), [5, 5, 5]),
    ],
    ids=["2d-mesh_dim1", "1d"],
)
def test_compiled_step_over_a_mesh_is_eager_bit_for_bit(
    case: fns.StepCase, rows: list[int]
) -> None:
    results = get_pool(len(case.sizes)).run(fns.compiled_step, case)
    _check_step(case, results)
    assert all(r.graph_breaks == 0 and r.explain_breaks == 0 for r in results)
    assert [r.eager_out.shape[0] for r in results] == rows  # (2, 2) dim 1: [0, 1], [2, 3]


# --- the same collectives on every rank, whatever the compiler decides ------------------

_EMPTY_MIDDLE_THEN_TWO_EMPTY = ((3, 0, 5), (0, 4, 0))
_CONTRACTS = ("sum", "local", "mean")

SCENARIOS = [
    # under inductor: with sizes, a backward with a collective (sum; mean issues the
    # same one) and one without (local); without sizes, sum (a compile per contract
    # costs seconds; SLOW_SCENARIOS has every contract x shape x sizes x backend)
    fns.Scenario("inductor", ("sum", "local"), _EMPTY_MIDDLE_THEN_TWO_EMPTY),
    fns.Scenario("inductor", ("sum",), _EMPTY_MIDDLE_THEN_TWO_EMPTY, pass_sizes=False),
    fns.Scenario("aot_eager", _CONTRACTS, _EMPTY_MIDDLE_THEN_TWO_EMPTY, pass_sizes=False),
    fns.Scenario("inductor", ("sum",), ((0, 0, 0), (2, 0, 1)), shape="unused"),
    fns.Scenario("aot_eager", ("sum",), _EMPTY_MIDDLE_THEN_TWO_EMPTY, shape="twice"),
    # crossed: one compile (the order of its two gathers is decided in it; the
    # recompile for a second size set, 15 s of CPU on 2 cores, is SLOW_SCENARIOS')
    fns.Scenario("inductor", ("sum",), ((64, 1, 0),), shape="crossed"),
    fns.Scenario("aot_eager", ("mean",), ((0, 3, 0), (0, 0, 0)), shape="zero-trailing"),
    fns.Scenario("aot_eager", ("sum",), ((3, 0, 5), (0, 4, 0), (0, 0, 0), (1, 2, 3)), dynamic=True),
]
SLOW_SCENARIOS = [
    fns.Scenario(backend, _CONTRACTS, sizes, pass_sizes=pass_sizes, shape=shape, dynamic=dynamic)
    for backend in ("eager", "aot_eager", "inductor")
    for shape, sizes in (
        ("plain", ((0, 2, 0), (0, 0, 0), (4, 0, 1), (2, 3, 0))),
        ("unused", _EMPTY_MIDDLE_THEN_TWO_EMPTY),
        ("twice", _EMPTY_MIDDLE_THEN_TWO_EMPTY),
        ("crossed", ((64, 1, 0), (0, 2, 48))),
        ("zero-trailing", ((2, 0, 1), (0, 0, 0))),
    )
    for pass_sizes in (True, False)
    for dynamic in (None, True)
]


def _scenario_id(sc: fns.Scenario) -> str:
    sizes = "-".join("".join(map(str, s)) for s in sc.size_sets)
    given = "sizes" if sc.pass_sizes else "nosizes"
    dynamic = "-dynamic" if sc.dynamic else ""
    return f"{sc.backend}-{'+'.join(sc.grads)}-{sc.shape}-{given}-{sizes}{dynamic}"


def _check_scenario(sc: fns.Scenario) -> None:
    """Every rank finishes (a rank that skipped a collective leaves its peers in a
    timeout), issues the collectives rank 0 issues in every forward and backward, as
    many in the backward as its eager step does, and computes the eager bytes."""
    pool = get_pool(3)
    if sc.backend == "inductor":
        pool.run(fns.warm_backend, sc.backend)
    per_rank = pool.run(fns.compiled_scenario, sc)
    assert len(per_rank[0]) == len(sc.grads) * len(sc.size_sets)
    for rank, calls in enumerate(per_rank):
        for call, first in zip(calls, per_rank[0], strict=True):
            where = f"rank {rank}, grad={call.grad}, sizes={call.sizes}"
            assert call.compiled_issued == first.compiled_issued, (
                f"{where}: compiled step issued {call.compiled_issued} collectives "
                f"(forward, backward), rank 0 {first.compiled_issued}"
            )
            assert call.compiled_issued[1] == call.eager_issued[1], (
                f"{where}: compiled backward issued {call.compiled_issued[1]}, "
                f"eager {call.eager_issued[1]}"
            )
            for name, want, got in zip(
                ("output", "loss", "w.grad", "x.grad"), call.eager, call.compiled, strict=True
            ):
                assert_bitwise_equal(got, want, f"{where}: compiled {name} differs from eager")


@pytest.mark.parametrize("sc", SCENARIOS, ids=_scenario_id)
def test_compiled_step_issues_the_same_collectives_on_every_rank(sc: fns.Scenario) -> None:
    _check_scenario(sc)


@pytest.mark.slow
@pytest.mark.parametrize("sc", SLOW_SCENARIOS, ids=_scenario_id)
def test_compiled_step_issues_the_same_collectives_on_every_rank_everywhere(
    sc: fns.Scenario,
) -> None:
    _check_scenario(sc)

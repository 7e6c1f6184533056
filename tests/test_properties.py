"""The multi-rank property suite: vargather against the single-process oracle on gloo.

Each property test draws batches of ``GatherCase`` s from a property of the kit's one
catalogue (``vargather.testing.catalogues``), runs every case on a real gloo world
from ``vargather.testing`` (one pool round trip per batch) and judges the ranks'
reports against ``vargather.oracle`` (``vargather.testing.judge``): the forward bit
for bit, gradients under the case's contract with upstream gradients that differ per
rank, the returned layout or sizes. The same properties drive the mutant search
(``tests/test_mutants.py``) and ``python -m vargather check``.

The second half checks the case model itself: that the strategies validate their
arguments, that the seeded values really cover each dtype's range, that memory layouts
really are non-contiguous, that a described case reproduces.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vargather
from vargather.testing import property_ids
from vargather.testing import strategies as vst
from vargather.testing.cases import COMPAT, VARGATHER, GatherCase, Implementation, parse_case
from vargather.testing.catalogues import catalogue
from vargather.testing.properties import Property
from vargather.testing.runner import describe
from vargather.testing.values import DTYPE_NAMES, make_upstream, make_values

WORLDS = (1, 2, 3, 4)
MULTI = [2, 3, 4]

ALL_GATHER_V = Implementation(
    "vargather:all_gather_v", transports=("auto",), name="vargather.all_gather_v"
)


def _applicable(impl: Implementation) -> list[tuple[str, int]]:
    """(property id, world size) for every property of ``impl``'s catalogue that applies."""
    return [
        (p.id, w)
        for p in catalogue(impl)
        if p.not_applicable(WORLDS) is None
        for w in p.worlds(WORLDS)
    ]


def _params(impl: Implementation) -> list[Any]:
    """One test per applicable property; each example draws its world size (uniformly,
    from the sizes the property applies to), so every world is exercised. The
    ``compiled`` property has tests of its own (its examples are capped)."""
    ids = dict.fromkeys(prop_id for prop_id, _ in _applicable(impl) if prop_id != "compiled")
    return [
        pytest.param(prop_id, marks=() if prop_id == "uninitialized" else (pytest.mark.multirank,))
        for prop_id in ids
    ]


def _by_id(impl: Implementation) -> dict[str, Property]:
    return {p.id: p for p in catalogue(impl)}


COMPAT_PROPS = _by_id(COMPAT)
PLAIN = _by_id(ALL_GATHER_V)


@pytest.fixture(scope="session")
def props(usable_transports: tuple[str, ...]) -> dict[str, Property]:
    """vargather's properties over the transports it accepts on gloo (asked at run time:
    a transport it refuses is skipped and named in the summary, never drawn)."""
    return _by_id(Implementation(None, transports=usable_transports, name="vargather"))


def _run(
    prop: Property,
    worlds: tuple[int, ...],
    data: st.DataObject,
    transports: tuple[str, ...] | None = None,
) -> None:
    prop.check(data.draw(prop.strategy(worlds, transports=transports), label="cases"))


# --- vargather.all_gather_v_with_layout ------------------------------------------------


@pytest.mark.multirank
def test_declared_refusals_are_the_real_ones(refused_transports: dict[str, str]) -> None:
    """The transports a gloo world refuses when asked are exactly those the library
    declares refused on gloo, with the declared message: so parametrizing by the
    declaration (``conftest._gloo_transport_names``) leaves none out and adds none."""
    from vargather._choices import unsupported_reason

    declared = {
        t: unsupported_reason(t, "gloo")
        for t in vargather.TRANSPORT_NAMES
        if unsupported_reason(t, "gloo") is not None
    }
    assert declared, "gloo refuses views: the declaration lost it"
    assert set(refused_transports) == set(declared)
    for name, reason in declared.items():
        assert reason is not None
        assert reason in refused_transports[name]


@pytest.mark.parametrize("prop_id", _params(VARGATHER))
@given(data=st.data())
def test_vargather_holds_the_property(
    prop_id: str, props: dict[str, Property], data: st.DataObject
) -> None:
    """Every property of the catalogue on the world sizes it applies to (1 to 4): forward
    bit for bit for every dtype family, dim, empty shards and memory layout; sizes
    passed as a list or a tensor and the returned layout; one-rank, uninitialized and
    subgroup worlds; gradients under every contract and the adjoint identity under
    ``sum``; batches of tensors gathered by one ``all_gather_v_coalesced`` call."""
    _run(props[prop_id], WORLDS, data)


@pytest.mark.multirank
@pytest.mark.parametrize("world", [2, 3])
@given(data=st.data())
def test_coalesced_calls_hold_on_each_world(
    world: int, props: dict[str, Property], data: st.DataObject
) -> None:
    """The ``coalesced`` property on worlds of 2 and 3 ranks each (the test above draws
    its world per example): a drawn batch gathered by one ``all_gather_v_coalesced``
    call, every tensor's output bit for bit and its gradient under the call's contract
    after one backward over all outputs."""
    _run(props["coalesced"], (world,), data)


@pytest.mark.multirank
@pytest.mark.xdist_group("compile")  # one worker's ranks pay inductor's warm-up (pyproject)
@settings(max_examples=_by_id(VARGATHER)["compiled"].max_examples(10**6))
@given(data=st.data())
def test_compiled_steps_hold_the_property(props: dict[str, Property], data: st.DataObject) -> None:
    """The ``compiled`` property (its capped examples): each drawn batch through steps
    compiled with fullgraph=True on drawn backends, on worlds of 1 to 4 ranks, the
    output and the input gradients bit for bit against the oracle."""
    _run(props["compiled"], WORLDS, data)


@pytest.mark.slow
@pytest.mark.multirank
@settings(max_examples=_by_id(VARGATHER)["compiled"].max_examples(10**6, slow=True))
@given(data=st.data())
def test_compiled_steps_hold_the_property_at_length(
    props: dict[str, Property], data: st.DataObject
) -> None:
    """The ``compiled`` property with the slow schedule's examples."""
    _run(props["compiled"], WORLDS, data)


_PER_TRANSPORT = ("forward-float", "forward-int", "non-contiguous", "sizes-tensor", "gradient")
"""The properties drawn from when each transport is run on its own."""


@pytest.mark.multirank
@pytest.mark.parametrize("world", MULTI)
@given(data=st.data())
def test_each_transport_holds_the_properties(
    world: int, transport: str, props: dict[str, Property], data: st.DataObject
) -> None:
    """Each transport on its own (the test above draws them mixed): forward, layout and
    gradients, a property drawn per example."""
    prop = props[data.draw(st.sampled_from(_PER_TRANSPORT), label="property")]
    _run(prop, (world,), data, transports=(transport,))


@pytest.mark.multirank
@given(data=st.data())
def test_all_gather_v_returns_the_gathered_tensor(data: st.DataObject) -> None:
    """The plain ``all_gather_v`` entry point, through the same checks."""
    prop = PLAIN[data.draw(st.sampled_from(_PER_TRANSPORT), label="property")]
    _run(prop, (3,), data)


# --- vargather.compat ----------------------------------------------------------------------


@pytest.mark.parametrize("prop_id", _params(COMPAT))
@given(data=st.data())
def test_compat_has_the_seed_semantics(prop_id: str, data: st.DataObject) -> None:
    """``vargather.compat.all_gather(x, dim, sizes) -> (tensor, sizes)`` with the seed's
    ``local`` contract: sizes a 1-d int64 tensor, ``(x, None)`` without a multi-rank
    world, this rank's slice of its own upstream gradient."""
    _run(COMPAT_PROPS[prop_id], WORLDS, data)


def test_every_property_runs_for_vargather() -> None:
    """vargather runs the whole catalogue on some world; compat all but what needs a
    process group, the ``sum`` contract or a coalesced form; ``check`` knows the same
    ids."""
    ids = [p.id for p in catalogue(VARGATHER)]
    assert tuple(ids) == property_ids()
    assert len(set(ids)) == len(ids)
    assert {prop_id for prop_id, _ in _applicable(VARGATHER)} == set(ids)
    assert {prop_id for prop_id, _ in _applicable(COMPAT)} == set(ids) - {
        "subgroup",
        "adjoint",
        "coalesced",
        "compiled",
        "misuse",
    }
    assert {prop_id for prop_id, _ in _applicable(ALL_GATHER_V)} == set(ids) - {
        "coalesced",
        "compiled",
        "misuse",
    }
    for w in MULTI:
        assert {
            (prop_id, w) for prop_id in ("gradient", "adjoint", "subgroup", "coalesced")
        } <= set(_applicable(VARGATHER))


# --- the case model ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"min_world_size": 3, "max_world_size": 2},
            "min_world_size=3 is larger than max_world_size=2",
        ),
        ({"world_size": 0}, "world_size=0 must be >= 1"),
        ({"world_size": 2.0}, "world_size=2.0 must be an int"),
        ({"min_ndim": 0}, "min_ndim=0 must be >= 1"),
        ({"min_ndim": 3, "max_ndim": 2}, "min_ndim=3 is larger than max_ndim=2"),
        ({"max_side": 0}, "max_side=0 must be >= 1"),
        ({"dtypes": ["float8"]}, "dtypes=['float8'] contains 'float8'"),
        ({"dtypes": "float32"}, "dtypes='float32' must be a sequence"),
        ({"dtypes": []}, "dtypes=[] must name at least one value"),
        ({"contracts": ["avg"]}, "contracts=['avg'] contains 'avg'"),
        ({"transports": ["carrier-pigeon"]}, "transports=['carrier-pigeon'] contains"),
        ({"memory": ["strided"]}, "memory=['strided'] contains 'strided'"),
        ({"values": ["random"]}, "values=['random'] contains 'random'"),
        ({"upstream": ["huge"]}, "upstream=['huge'] contains 'huge'"),
        ({"requires_grad": 1}, "requires_grad=1 must be True, False or None"),
        ({"requires_grad": True, "dtypes": ["int64"]}, "requires_grad=True needs a float"),
        (
            {"initialized": False, "max_world_size": 2},
            "initialized=False runs one process: it needs max_world_size=1, got 2",
        ),
        ({"pool_size": 3}, "pool_size=3 needs subgroups=True"),
        ({"subgroups": True, "max_world_size": 1}, "subgroups=True needs max_world_size >= 2"),
        (
            {"subgroups": True, "implementation": COMPAT},
            "subgroups=True needs an implementation taking group=",
        ),
        ({"implementation": "vargather"}, "implementation='vargather' must be"),
        ({"memory": ["transposed"], "min_ndim": 1}, "memory=['transposed'] needs min_ndim >= 2"),
    ],
)
def test_gather_cases_validates_its_arguments_eagerly(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        vst.gather_cases(**kwargs)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: vst.case_batches(max_batch=0), "max_batch=0 must be >= 1"),
        (lambda: vst.case_batches(world_size=2), "case_batches() takes no world_size="),
        (lambda: vst.case_batches(dtypes=["x"]), "dtypes=['x'] contains 'x'"),
        (lambda: vst.ragged_sizes(world_size=2, min_size=3, max_size=1), "min_size=3 is larger"),
        (
            lambda: vst.upstream_grads(shape=(2,), dtype="int32", world_size=2),
            "dtype='int32' has no gradients",
        ),
        (lambda: vst.upstream_grads(shape=(-1,), dtype="float32", world_size=2), "shape[0]=-1"),
        (lambda: vst.dtypes(names=["float7"]), "names=['float7'] contains 'float7'"),
    ],
)
def test_the_other_strategies_validate_their_arguments(factory: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        factory()


def _float_bits(t: torch.Tensor) -> set[int]:
    width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return set(t.view(width).tolist())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_full_values_cover_the_special_floats(dtype: torch.dtype) -> None:
    values = torch.cat([make_values((64,), dtype, seed, "full") for seed in range(8)])
    finite = values[values.isfinite()]
    info = torch.finfo(dtype)
    assert bool((values == math.inf).any())
    assert bool((values == -math.inf).any())
    assert bool(((values == 0) & values.signbit()).any()), "no -0.0"
    assert bool(((finite != 0) & (finite.abs() < info.smallest_normal)).any()), "no subnormal"
    assert bool((finite.abs() == info.max).any())
    nan_patterns = _float_bits(values[values.isnan()])
    canonical = _float_bits(torch.tensor([math.nan], dtype=dtype))
    assert len(nan_patterns - canonical) >= 2, "no NaN payloads"
    assert any(p < 0 for p in nan_patterns), "no negative NaN"


def test_full_float64_values_include_values_float32_cannot_hold() -> None:
    values = torch.cat([make_values((64,), torch.float64, seed, "full") for seed in range(4)])
    finite = values[values.isfinite()]
    lossy = finite.to(torch.float32).to(torch.float64) != finite
    assert int(lossy.sum()) >= 32


def test_full_integer_values_include_the_extremes() -> None:
    values = torch.cat([make_values((64,), torch.int64, seed, "full") for seed in range(8)])
    as_float = values.to(torch.float64).to(torch.int64)
    assert int(values.max()) == torch.iinfo(torch.int64).max
    assert int(values.min()) == torch.iinfo(torch.int64).min
    assert bool((as_float != values).any()), "no int64 value that float64 cannot hold"
    for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        small = torch.cat([make_values((64,), dtype, s, "full") for s in range(8)])
        assert int(small.max()) == torch.iinfo(dtype).max
        assert int(small.min()) == torch.iinfo(dtype).min


def test_full_complex_values_have_special_parts() -> None:
    values = torch.cat([make_values((64,), torch.complex128, s, "full") for s in range(8)])
    assert bool((values.real.isnan() & values.imag.isfinite()).any())
    assert bool((values.imag.isinf() & values.real.isfinite()).any())
    assert bool(((values.imag == 0) & values.imag.signbit()).any())


def test_values_are_deterministic_in_the_seed() -> None:
    a = make_values((3, 5), torch.bfloat16, 7, "full")
    b = make_values((3, 5), torch.bfloat16, 7, "full")
    c = make_values((3, 5), torch.bfloat16, 8, "full")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert not torch.equal(a.view(torch.int16), c.view(torch.int16))


@given(
    grads=st.sampled_from(["float32", "complex64", "bfloat16"]).flatmap(
        lambda d: vst.upstream_grads(shape=(2, 3), dtype=d, world_size=4)
    )
)
def test_upstream_gradients_differ_on_every_rank(grads: list[torch.Tensor]) -> None:
    for r in range(1, len(grads)):
        assert not torch.equal(grads[0], grads[r])


def test_integer_upstream_gradients_are_small_integers() -> None:
    g = make_upstream((50,), torch.float32, 3, 2, "integers")
    assert torch.equal(g, g.round())
    assert float(g.abs().max()) <= 8
    assert float(g[0]) == 3.0  # rank 2's marker: rank + 1


def _case(**kw: Any) -> GatherCase:
    base: dict[str, Any] = {
        "shapes": ((2, 3, 4), (2, 1, 4)),
        "dim": -2,
        "dtype": "float64",
        "seed": 11,
    }
    base.update(kw)
    return GatherCase(**base)


def test_memory_layouts_are_what_they_say() -> None:
    case = _case(memory=("transposed", "sliced"))
    t, s = case.shard(0), case.shard(1)
    assert not t.is_contiguous()
    assert t.stride() == (1, 2, 6)
    assert not s.is_contiguous()
    assert s.storage_offset() > 0
    assert t.is_leaf
    assert t.requires_grad
    assert s.is_leaf
    assert s.requires_grad
    for r in range(2):
        assert torch.equal(
            case.shard(r).detach().view(torch.int64), case.shard_values(r).view(torch.int64)
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shapes": ((2, 3, 4), (2, 1, 5))}, "differ outside dim=-2"),
        ({"shapes": ((2,), (2, 1))}, "must all have the same ndim"),
        ({"dim": 3}, "dim=3 is out of range for 3-d shapes"),
        ({"dtype": "float8_e4m3fn"}, "dtype='float8_e4m3fn' is not one of"),
        ({"contract": "avg"}, "contract='avg' is not one of"),
        ({"memory": ("contiguous",)}, "must have one entry per rank (2)"),
        ({"dtype": "int32"}, "requires_grad=True needs a float or complex dtype"),
        ({"members": (0, 0)}, "members=(0, 0) must be 2 sorted distinct ranks"),
        ({"pool_size": 3}, "pool_size=3 differs from the 2 ranks"),
        ({"initialized": False}, "initialized=False (torch.distributed not initialized) needs"),
        ({"seed": -1}, "seed=-1 must be an int >= 0"),
    ],
)
def test_cases_validate_their_fields(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _case(**kwargs)


def test_describe_names_everything_needed_to_reproduce() -> None:
    case = _case(
        contract="mean", transport="padded", sizes_form="tensor", members=(1, 3), pool_size=4
    )
    text = describe(case)
    for fragment in (
        "2 rank(s)",
        "subgroup [1, 3]",
        "per-rank shapes [(2, 3, 4), (2, 1, 4)]",
        "dim=-2",
        "dtype=float64",
        "grad='mean'",
        "transport='padded'",
        "seed=11",
        "python -m vargather repro",
    ):
        assert fragment in text
    command = text.rsplit("reproduce: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:4] == ["python", "-m", "vargather", "repro"]
    assert parse_case(argv[4]) == case


@given(vst.gather_cases(subgroups=True, dtypes=DTYPE_NAMES))
def test_drawn_cases_reproduce_from_their_repr(case: GatherCase) -> None:
    assert parse_case(repr(case)) == case
    assert case.expected().output.shape == case.output_shape


def test_parse_case_refuses_anything_but_literals() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_case("GatherCase(shapes=__import__('os').getcwd(), dim=0, dtype='float32')")
    with pytest.raises(ValueError, match="expected GatherCase"):
        parse_case("print('hi')")


def test_dtype_names_are_every_dtype_vargather_gathers_on_gloo() -> None:
    assert set(DTYPE_NAMES) == {str(d).removeprefix("torch.") for d in vargather.GLOO_DTYPES}
    assert DTYPE_NAMES[0] == "float32"


def test_a_property_builds_each_strategy_once() -> None:
    """``strategy`` with the same arguments gives the same object (tests draw it inside
    every example); other arguments build another."""
    prop = PLAIN["forward-float"]
    first = prop.strategy((2, 3))
    assert prop.strategy([2, 3]) is first
    assert prop.strategy((2, 3), batch=2) is not first
    assert prop.strategy((2,)) is not first

"""``all_to_all_v(..., cat_dim=)`` and the Ulysses helper on real gloo worlds: drawn
cases with uneven heads and uneven sequence chunks judged by the oracle (eager and
compiled, gradients with per-rank upstream gradients), misuse, one collective per call
in steady state, and attention around ``seq_to_heads`` / ``heads_to_seq`` with
grouped-query heads."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vargather
from vargather.testing import get_pool
from vargather.testing.catalogues.all_to_all_v import AllToAllCase
from vargather.testing.family import check_case, check_sequence
from vargather.testing.misuse import MisuseCase, check_misuse

from . import _cat_dim_fns as fns

pytestmark = pytest.mark.multirank

_COMPILED = "tests._cat_dim_fns:compiled_all_to_all_v"


@st.composite
def joined_cases(draw: Any, world: int, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> Any:
    """``AllToAllCase``s joined along another dim than the split one: uneven sizes
    along both (rank ``r``'s block size along ``dim``, ``cat``: each rank's size along
    ``cat_dim``), dims drawn, negative ones too."""
    n = draw(st.integers(2, 4))
    other = tuple(draw(st.lists(st.integers(1, 3), min_size=n - 1, max_size=n - 1)))
    dim = draw(st.integers(-n, n - 1))
    cat_dim = draw(st.integers(-n, n - 1).filter(lambda c: c % n != dim % n))
    sizes = st.lists(st.integers(0, 3), min_size=world, max_size=world).map(tuple)
    column = draw(sizes)
    return AllToAllCase(
        world,
        tuple(column for _ in range(world)),
        other,
        dim,
        dtype=draw(st.sampled_from(dtypes)),
        special=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        pass_recv=draw(st.booleans()),
        cat_dim=cat_dim,
        cat=draw(sizes),
    )


def test_done_when_heads_and_sequence_uneven() -> None:
    """Issue 53: ``all_to_all_v(x, send_sizes, dim=2, cat_dim=1)`` with uneven heads
    (3, 2, 2 of 7) and uneven sequence chunks (2, 5, 0): the oracle's bits and
    gradients, eager and compiled."""
    heads = (3, 2, 2)
    case = AllToAllCase(
        3, (heads,) * 3, (2, 9, 4), 2, cat_dim=1, cat=(2, 5, 0), special=True, seed=5
    )
    pool = get_pool(3)
    assert check_case(pool, case) == []
    assert check_case(pool, AllToAllCase(**{**_fields(case), "pass_recv": True})) == []
    compiled = AllToAllCase(**{**_fields(case), "pass_recv": True, "special": False})
    assert check_case(pool, _impl(compiled, _COMPILED)) == []


def _fields(case: AllToAllCase) -> dict[str, Any]:
    return {k: getattr(case, k) for k in case.__dataclass_fields__ if k != "collective"}


def _impl(case: AllToAllCase, impl: str) -> AllToAllCase:
    return AllToAllCase(**{**_fields(case), "impl": impl})


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cases=st.lists(
        joined_cases(3, ("float32", "bfloat16", "bool", "int16")), min_size=3, max_size=5
    )
)
def test_drawn_joined_cases_eager(cases: list[AllToAllCase]) -> None:
    """Drawn joined cases in a row on one world (the round's state carried across
    calls), each judged by the oracle: forward bit for bit, gradients with per-rank
    upstream gradients, the adjoint identity."""
    assert check_sequence(get_pool(3), cases) == []


@pytest.mark.xdist_group("compile")
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases=st.lists(joined_cases(2, ("float32",)), min_size=2, max_size=2))
def test_drawn_joined_cases_compiled(cases: list[AllToAllCase]) -> None:
    """The same inside ``torch.compile(fullgraph=True)``: the custom operator with
    ``cat_dim`` and its backward (receive sizes passed: the operator takes ints)."""
    compiled = [_impl(AllToAllCase(**{**_fields(c), "pass_recv": True}), _COMPILED) for c in cases]
    assert check_sequence(get_pool(2), compiled) == []


@pytest.mark.parametrize("kind", ["a2a-cat-dim-differs", "a2a-cat-blocks"])
def test_misuse_same_error_everywhere(kind: str) -> None:
    """A rank joining along another dim, or sending a block of another size along
    ``dim``: every rank raises the same error naming it, and the group works after."""
    assert check_misuse(get_pool(3), MisuseCase("all_to_all_v", kind, 3, 2)) == []


def test_steady_state_is_one_collective_per_call() -> None:
    """Ulysses' two switches, again and again, both layouts, heads even and uneven: one
    collective a call once the round's state settled, the oracle's result every call
    (the remembered round replayed), and the round trip is the identity."""
    for spec in (("bshd", False), ("sbhd", False), ("bshd", True), ("sbhd", True)):
        for counts, same in get_pool(3).run(fns.steady_collectives, spec):
            assert same, spec
            assert counts[-4:] == [2, 2, 2, 2], (spec, counts)


@pytest.mark.parametrize(
    ("layout", "hq", "hkv", "seq"),
    [("bshd", 8, 2, [3, 5, 0, 4]), ("sbhd", 6, 3, [4, 1, 2, 3])],
)
def test_attention_around_the_helper(layout: str, hq: int, hkv: int, seq: list[int]) -> None:
    """Grouped-query attention split by the helper (DeepSpeed's head rule, key/value
    heads repeated where the split needs it, uneven sequence chunks) gives one
    process's attention and its gradients."""
    found = get_pool(4).run(fns.attention_step, (layout, hq, hkv, seq))
    q, k, v = (t.requires_grad_(True) for t in fns.full_qkv(layout, hq, hkv, seq))
    out = fns.attend(q, k, v, layout)
    along = 1 if layout == "bshd" else 0
    chunks = out.split(seq, dim=along)
    sum((c * fns.weight(c.shape, r)).sum() for r, c in enumerate(chunks)).backward()
    for r, got in enumerate(found):
        torch.testing.assert_close(got["out"], chunks[r].detach(), rtol=0, atol=1e-12)
        for mine, full in zip(got["grads"], (q, k, v), strict=True):
            assert full.grad is not None
            want = full.grad.split(seq, dim=along)[r]
            torch.testing.assert_close(mine, want, rtol=0, atol=1e-12)


def test_head_split_and_kv_repeats() -> None:
    """DeepSpeed's rule (the first ranks hold one head more) and the repeat that lines
    grouped key/value heads up with the query heads."""
    assert vargather.head_split(7, 3) == (3, 2, 2)
    assert vargather.head_split(2, 4) == (1, 1, 0, 0)
    assert vargather.kv_repeats(32, 8, 4) == 1
    assert vargather.kv_repeats(8, 2, 4) == 2
    assert vargather.kv_repeats(6, 3, 4) == 2  # every query head its own copy
    with pytest.raises(vargather.ArgumentError, match="multiple"):
        vargather.kv_repeats(6, 4, 2)
    with pytest.raises(vargather.ArgumentError, match="layout"):
        vargather.seq_to_heads(torch.ones(1, 2, 2, 1), layout="bhsd")  # type: ignore[arg-type]  # the wrong name on purpose


def test_one_process_world() -> None:
    """Without a process group: every head and the whole sequence stay here, and a
    ``cat_dim`` passed as ``dim`` is today's call."""
    x = torch.arange(24.0).view(1, 3, 4, 2)
    assert torch.equal(vargather.seq_to_heads(x), x)
    assert torch.equal(vargather.heads_to_seq(x, [3]), x)
    assert torch.equal(vargather.all_to_all_v(x, [4], 2, cat_dim=1, recv_sizes=[3]), x)
    with pytest.raises(vargather.SizesMismatchError, match="recv_sizes"):
        vargather.all_to_all_v(x, [4], 2, cat_dim=1, recv_sizes=[4])
    with pytest.raises(vargather.DimError, match="cat_dim"):
        vargather.all_to_all_v(x, [4], 2, cat_dim=4)

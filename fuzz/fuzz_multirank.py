"""Timed multi-rank fuzzing of vargather on real gloo worlds, valid and invalid calls.

Not part of the pipeline: it drives the whole of it, on the persistent rank pools of
``vargather.testing`` (2 and 3 ranks), for a given time::

    python fuzz/fuzz_multirank.py --minutes N [--db PATH] [--chunk K] [--report FILE]

It first replays every stored finding (``fuzz/findings.py``), then draws.

Each example is one of

* a **valid** ragged gather drawn by the property suite's strategy
  (``vargather.testing.strategies.gather_cases``: every gloo dtype over its full value range,
  any ``dim``, sizes including 0, non-contiguous shards, sizes passed or not, every
  contract and transport, gradients with per-rank upstream), run and judged by
  ``vargather._cases`` (forward bit for bit, gradients against the oracle);
* a **mutated** call: a valid base call (``vargather.testing.misuse``) with one or two
  mutations on one or more ranks (dtype, ndim, another dimension, ``dim``, ``sizes``,
  the input itself, ``grad``, ``transport``, ``requires_grad``, ``validate``,
  ``timeout``), drawn with their parameters. Judged by what vargather promises: either
  every rank returns the oracle's answer (the mutation was harmless, e.g. ``dim=-1``
  for ``dim=1``), or every rank raises the same ``VarGatherError`` subclass with the
  same message, naming ranks that were mutated (for local problems and sizes lies) and
  no rank aborts or hangs; then the same process group must still gather correctly;
* a **valid family call** (every collective of the table but the gather: the
  rooted ``gather_v`` and ``scatter_v`` too) drawn by each catalogue's property strategy (``vargather.testing.family``: every gloo
  dtype, any ``dim``, empty blocks, subgroups, sizes or shapes known), judged by the
  kit's ``check_case`` (forward and gradients bit for bit against ``vargather.oracle``);
* a **mutated family call** (``reduce_scatter_v``, ``all_to_all_v``, ``all_gather_list``;
  the rooted pair's wrong calls are their catalogues' misuse entries, run by
  ``tests/test_misuse.py``): a valid base call (``family_bases``) with one rank's
  arguments changed by one kind drawn per collective (``FAMILY_MUTATIONS``: sizes,
  send sizes, receive sizes, dtype, shape, ``dim``, gradient, shapes, the input, and
  for ``reduce_scatter_v`` / ``all_to_all_v`` the collective: the other one of the same
  metadata round, a ``ProtocolMismatchError`` blaming the odd ranks). An
  independent verdict from the raw arguments (``family_verdict``) says what must
  happen, and ``judge_family`` accepts exactly that: every rank the oracle's answer
  for a valid call; else every rank the same ``VarGatherError`` subclass and message,
  of the predicted class (any local one for a rank's own problem), blaming exactly the
  predicted ranks: the odd ones out by majority (both of two on a tie), the ranks with
  local problems, or the ranks whose passed receive sizes or shapes contradict the
  others, which may be unmutated ranks made wrong by a mutated peer that changed its
  send sizes or its tensor honestly. Then the same group runs a correct call of the
  same collective;
* a **steady run** (``SteadyRun``): a valid call (the gather's, small or past the wide
  round's 128 KiB, or a family collective's) repeated 1 to ``SHRINK_AFTER + 3``
  times, its sizes perhaps moving from call to call (``all_to_all_v``'s send sizes,
  the gather's sizes), then a mutated call of the same collective on top of it, then
  the valid call again; each judged as above, on one world. A single drawn call rarely
  repeats the last one, so this is what reaches the steady paths (a round replayed, a
  learned round carrying new sizes) and a peer breaking them;
* a **NaN case** (``tests/_nan_fns.nan_cases``, the property of
  ``tests/test_nan_semantics.py``): values and upstream gradients drawn element by
  element, NaNs of both signs with payloads, ``-0.0``, infinities, through
  ``reduce_scatter_v``'s forward and every backward (eager and the custom operators),
  bit for bit against the oracle, a reduction's NaNs canonical.

Failures are shrunk by Hypothesis and saved in the example database (``--db``,
default ``.hypothesis/fuzz``); the next run replays them first. Prints the examples
run and the failures; exits 1 on a failure, 0 otherwise. ``validate=False`` is not
fuzzed: it trusts the caller by design (``docs/misuse.md``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
import traceback
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as seeded
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

import vargather
from vargather._choices import unsupported_reason
from vargather._round_state import SHRINK_AFTER, WIDE_MIN_BYTES
from vargather.testing import (
    COLLECTIVE_TIMEOUT_ENV,
    GatherCase,
    PoolFailure,
    RankOutcome,
    assert_bitwise_equal,
    close_all_pools,
    describe,
    family,
    get_pool,
    run_cases,
)
from vargather.testing import misuse as fns
from vargather.testing import strategies as vst
from vargather.testing.catalogues import family_catalogues
from vargather.testing.catalogues.all_gather_list import GatherListCase
from vargather.testing.catalogues.all_to_all_v import AllToAllCase
from vargather.testing.catalogues.reduce_scatter_v import ReduceScatterCase
from vargather.testing.collectives import FAMILY
from vargather.testing.dispatch import bind
from vargather.testing.values import DTYPE_NAMES

# The NaN property lives in the test suite (tests/_nan_fns.py, run by
# tests/test_nan_semantics.py); the repository root makes it importable as a module.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the ranks inherit sys.path, and unpickle NanCase from there
    sys.path.insert(0, ROOT)
from tests import _nan_fns  # noqa: E402  # needs the sys.path entry above

DEFAULT_DB = os.path.join(".hypothesis", "fuzz")
COUNTS: Counter[str] = Counter()

GATHER = vargather.COLLECTIVE_NAMES[0]
"""The gather (``all_gather_v``), the collective of the mutated calls beside the family's."""
GLOO_NAMES = sorted(str(d).removeprefix("torch.") for d in vargather.GLOO_DTYPES)
GLOO_TRANSPORTS = tuple(
    t for t in vargather.TRANSPORT_NAMES if unsupported_reason(t, "gloo") is None
)
FLOATING = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
MUTATIONS = (
    "dtype",
    "ndim",
    "trail",
    "dim",
    "dim_object",
    "sizes",
    "sizes_object",
    "input",
    "grad",
    "transport",
    "requires_grad",
    "validate",
    "timeout",
)

# deadline: a pool round trip varies with the machine's load; too_slow: drawing and
# running tensors is the point; neither is a defect of vargather.
SETTINGS = settings(
    derandomize=False,  # even under $CI, whose Hypothesis profile derandomizes
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=DirectoryBasedExampleDatabase(DEFAULT_DB),
    max_examples=50,
)


# --- mutated calls ----------------------------------------------------------------------


@st.composite
def base_calls(draw: st.DrawFn) -> fns.Scenario:
    w = draw(st.integers(2, 3))
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    other = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    sizes = draw(st.lists(st.integers(0, 4), min_size=w, max_size=w))
    dtype = draw(st.sampled_from(GLOO_NAMES))
    grad = draw(st.sampled_from(vargather.CONTRACTS))
    transport = draw(st.sampled_from(GLOO_TRANSPORTS))
    pass_sizes = draw(st.booleans())
    requires_grad = dtype in FLOATING and draw(st.booleans())
    seed = draw(st.integers(0, 99))
    calls = []
    for r in range(w):
        shape = list(other)
        shape[dim] = sizes[r]
        spec = fns.TensorSpec(tuple(shape), dtype, requires_grad=requires_grad, seed=seed)
        passed = list(sizes) if pass_sizes else None
        calls.append(fns.call(GATHER, spec, dim=dim, sizes=passed, grad=grad, transport=transport))
    return fns.Scenario(GATHER, tuple(calls))


odd_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=10),
    st.lists(st.integers(-2, 5), max_size=4),
    st.builds(timedelta, seconds=st.integers(-5, 5)),
)


def mutate(draw: st.DrawFn, call: fns.Call, kind: str, w: int) -> fns.Call:
    spec = call.x
    if not isinstance(spec, fns.TensorSpec):  # an earlier mutation replaced the input
        spec = fns.TensorSpec((1,))
        if kind in ("dtype", "ndim", "trail", "requires_grad"):
            return call
    if kind == "dtype":
        return call.with_(
            x=replace(spec, dtype=draw(st.sampled_from(GLOO_NAMES)), requires_grad=False)
        )
    if kind == "ndim":
        return call.with_(x=replace(spec, shape=(*spec.shape, draw(st.integers(1, 2)))))
    if kind == "trail" and len(spec.shape) > 1:
        i = draw(st.integers(0, len(spec.shape) - 1))
        shape = list(spec.shape)
        shape[i] = draw(st.integers(0, 4))
        return call.with_(x=replace(spec, shape=tuple(shape)))
    if kind == "dim":
        return call.with_(dim=draw(st.integers(-5, 5)))
    if kind == "dim_object":
        return call.with_(dim=draw(odd_values))
    if kind == "sizes":
        return call.with_(sizes=draw(st.lists(st.integers(-2, 5), min_size=w - 1, max_size=w + 1)))
    if kind == "sizes_object":
        value = draw(
            st.one_of(
                odd_values,
                st.sampled_from(["int32", "float32", "bool", "uint8"]).map(
                    lambda d: fns.SizesTensor(tuple(range(w)), d)
                ),
                st.just(fns.SizesTensor(tuple(range(w)), "int64", (1, w))),
            )
        )
        return call.with_(sizes=value)
    if kind == "input":
        value = draw(
            st.one_of(
                odd_values,
                st.just(fns.TensorSpec(())),
                st.just(fns.TensorSpec((2, 2), layout="sparse")),
                st.just(fns.TensorSpec((2, 2), device="meta")),
                st.just(fns.TensorSpec((2, 2), "float8_e5m2")),
                st.just(fns.TensorSpec((1,) * 33)),
            )
        )
        return call.with_(x=value)
    if kind == "grad":
        return call.with_(grad=draw(st.one_of(st.sampled_from(vargather.CONTRACTS), odd_values)))
    if kind == "transport":
        value = draw(st.one_of(st.sampled_from(vargather.TRANSPORT_NAMES), odd_values))
        return call.with_(transport=value)
    if kind == "requires_grad" and spec.dtype in FLOATING:
        return call.with_(x=replace(spec, requires_grad=not spec.requires_grad))
    if kind == "validate":
        return call.with_(validate=draw(odd_values.filter(lambda v: v is not False)))
    if kind == "timeout":
        # A valid but short timeout on one rank is a fault the caller asked for (that
        # rank gives up first), not a misuse to refuse: keep valid ones generous.
        value = draw(st.one_of(st.floats(5, 60), odd_values.filter(_not_a_short_timeout)))
        return call.with_(timeout=value)
    return call


def _not_a_short_timeout(value: object) -> bool:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return not 1e-3 <= value < 5


@st.composite
def mutated_calls(draw: st.DrawFn) -> tuple[fns.Scenario, tuple[int, ...]]:
    return _mutated(draw, draw(base_calls()))


def _mutated(draw: st.DrawFn, base: fns.Scenario) -> tuple[fns.Scenario, tuple[int, ...]]:
    """``base`` with one to two mutations on each of one or more ranks."""
    w = base.world_size
    ranks = draw(st.sets(st.integers(0, w - 1), min_size=1, max_size=w))
    calls = list(base.calls)
    for r in sorted(ranks):
        for kind in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2)):
            calls[r] = mutate(draw, calls[r], kind, w)
    return fns.Scenario(GATHER, tuple(calls)), tuple(sorted(ranks))


# --- judging ------------------------------------------------------------------------------


def _judge_all_ok(scenario: fns.Scenario, outcomes: Sequence[RankOutcome[Any]]) -> None:
    try:
        want = fns.expected_of(scenario)[0]
    except Exception as err:
        raise AssertionError(
            f"every rank accepted a call the oracle cannot even compute ({err!r})"
        ) from None
    for o in outcomes:
        assert o.value is not None
        assert_bitwise_equal(o.value.output, want[o.rank], msg=f"rank {o.rank}")


def _judge_all_raised(
    scenario: fns.Scenario, outcomes: Sequence[RankOutcome[Any]], mutated: tuple[int, ...]
) -> None:
    w = scenario.world_size
    names = {o.exc_type_name for o in outcomes}
    assert len(names) == 1, f"ranks raised different classes: {names}"
    messages = {str(o.exception) for o in outcomes}
    assert len(messages) == 1, f"ranks raised different messages: {messages}"
    error = outcomes[0].exception
    assert isinstance(error, vargather.VarGatherError), f"not a VarGatherError: {error!r}"
    message = str(error)
    assert error.ranks, f"no rank blamed: {message}"
    assert all(0 <= r < w for r in error.ranks), message
    for r in error.ranks:
        assert f"rank {r}" in message or f"{r}]" in message or f"[{r}" in message, message
    if isinstance(error, vargather.SizesMismatchError):
        # The ranks blamed passed sizes that contradict the tensors (or each other): a
        # lie told by a mutated rank, or a true statement about a tensor that a mutated
        # rank changed. Either way a mutated rank is the blamed one or one it names.
        involved = set(error.ranks) | _contradicted_ranks(scenario, error.ranks)
        assert involved & set(mutated), (
            f"blamed {error.ranks}, whose sizes name no mutated rank {mutated}: {message}"
        )
    elif not isinstance(error, vargather.MismatchError):
        # a local problem: only a mutated rank is to blame
        assert set(error.ranks) <= set(mutated), (
            f"blamed {error.ranks}, mutated {mutated}: {message}"
        )


def _contradicted_ranks(scenario: fns.Scenario, blamed: Sequence[int]) -> set[int]:
    """The ranks whose tensor's size along ``dim`` differs from what a blamed rank's
    ``sizes`` say it is (every rank, when that rank's sizes cannot be read so)."""
    w = scenario.world_size
    out: set[int] = set()
    for b in blamed:
        call = scenario.calls[b]
        sizes = call.get("sizes")
        if isinstance(sizes, fns.SizesTensor):
            sizes = list(sizes.values)
        if not isinstance(sizes, list) or len(sizes) != w:
            return set(range(w))
        for r, claimed in enumerate(sizes):
            other = scenario.calls[r]
            spec, dim = other.x, other.get("dim")
            holds = (
                isinstance(spec, fns.TensorSpec)
                and isinstance(dim, int)
                and -len(spec.shape) <= dim < len(spec.shape)
                and spec.shape[dim] == claimed
            )
            if not holds:
                out.add(r)
    return out


HISTORY: dict[int, deque[str]] = {}
"""The last examples run on each world size: a world carries state from one example
to the next, so a failure may need its predecessors to be understood."""


def _remember(world_size: int, example: object) -> str:
    seen = HISTORY.setdefault(world_size, deque(maxlen=6))
    before = "\n".join(f"  {e}" for e in seen)
    seen.append(repr(example))
    return f"\nthe examples run before it on this {world_size}-rank world, oldest first:\n{before}"


def check_mutated(job: tuple[fns.Scenario, tuple[int, ...]]) -> None:
    scenario, mutated = job
    w = scenario.world_size
    history = _remember(w, job)
    try:
        _check_mutated(scenario, mutated)
    except AssertionError as err:
        raise AssertionError(f"{err}{history}") from None


def _check_mutated(scenario: fns.Scenario, mutated: tuple[int, ...]) -> None:
    w = scenario.world_size
    pool = get_pool(w)
    generation = pool.generation
    COUNTS["mutated"] += 1
    COUNTS[f"mutated, {_run_mutated(scenario, mutated)}"] += 1
    # a correct gather with gradients (valid_scenario's: every rank's judged)
    _judged("the next gather on the group", fns.valid_scenario(GATHER, w))
    assert pool.generation == generation, "the process group had to be rebuilt"


def _run_mutated(scenario: fns.Scenario, mutated: tuple[int, ...]) -> str:
    """Run a mutated gather on its world and judge it: ``"harmless"`` (every rank the
    oracle's answer) or ``"refused"`` (every rank the same error blaming a mutated
    rank)."""
    pool = get_pool(scenario.world_size)
    try:
        outcomes = pool.run_outcomes(fns.run_call, scenario)
    except PoolFailure as failure:
        raise AssertionError(f"the world failed (abort or hang): {failure}") from None
    ok = [o.ok for o in outcomes]
    if all(ok):
        _judge_all_ok(scenario, outcomes)
        return "harmless"
    if not any(ok):
        _judge_all_raised(scenario, outcomes, mutated)
        return "refused"
    detail = "; ".join(
        f"rank {o.rank}: " + ("returned" if o.ok else f"{o.exc_type_name}: {o.exception}")
        for o in outcomes
    )
    raise AssertionError(f"some ranks raised and some returned: {detail}")


def check_valid(case: GatherCase) -> None:
    COUNTS["valid"] += 1
    history = _remember(case.world_size, case)
    (verdict,) = run_cases([case])
    if verdict.failures or verdict.not_run:
        failures = [f.render() for f in verdict.failures]
        raise AssertionError(
            "\n".join([describe(case), *failures, verdict.not_run]).strip() + history
        )


# --- the family: reduce_scatter_v, all_to_all_v, all_gather_list --------------------------

FAMILY_MUTATIONS: dict[str, tuple[str, ...]] = {
    "reduce_scatter_v": (
        "sizes",
        "dtype",
        "shape",
        "dim",
        "grad",
        "input",
        "options",
        "collective",
    ),
    "all_to_all_v": (
        "collective",
        "send_sizes",
        "recv_sizes",
        "dtype",
        "shape",
        "dim",
        "grad",
        "input",
        "options",
    ),
    "all_gather_list": ("dtype", "shape", "grad", "shapes", "input", "options"),
}
"""What the mutated rank of a family call changes, per collective."""

FamilyJob = tuple[fns.Scenario, tuple[int, ...], str]
"""A mutated family call: the scenario, the mutated ranks, the mutation kind."""


def _in_family(scenario: fns.Scenario) -> bool:
    return scenario.collective in FAMILY


def _sizes(call: fns.Call) -> Any:
    """``reduce_scatter_v``'s ``sizes``, ``all_to_all_v``'s ``send_sizes``: the second
    argument, as ``family_bases`` passes it."""
    return call.args[1]


def _with_sizes(call: fns.Call, sizes: object) -> fns.Call:
    return replace(call, args=(call.args[0], sizes, *call.args[2:]))


@st.composite
def family_bases(draw: st.DrawFn, collective: str | None = None) -> fns.Scenario:
    """A valid call of a family collective on 2 or 3 ranks (every gloo dtype, any
    ``dim``, empty blocks, sizes/shapes passed or not)."""
    if collective is None:
        collective = draw(st.sampled_from(list(FAMILY_MUTATIONS)))
    w = draw(st.integers(2, 3))
    dtype = draw(st.sampled_from(GLOO_NAMES))
    requires_grad = dtype in FLOATING and draw(st.booleans())
    seed = draw(st.integers(0, 99))

    def spec(shape: Sequence[int]) -> fns.TensorSpec:
        return fns.TensorSpec(tuple(shape), dtype, requires_grad=requires_grad, seed=seed)

    if collective == "all_gather_list":
        ndim = draw(st.integers(0, 3))
        dims = st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim)
        shapes = [draw(dims) for _ in range(w)]
        passed = [list(s) for s in shapes] if draw(st.booleans()) else None
        grad = draw(st.sampled_from(vargather.CONTRACTS))
        calls = tuple(fns.call(collective, spec(s), shapes=passed, grad=grad) for s in shapes)
        return fns.Scenario(collective, calls)
    ndim = draw(st.integers(1, 3))
    dim = draw(st.integers(-ndim, ndim - 1))
    other = draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    if collective == "reduce_scatter_v":
        sizes = draw(st.lists(st.integers(0, 4), min_size=w, max_size=w))
        shape = list(other)
        shape[dim] = sum(sizes)
        calls = tuple(fns.call(collective, spec(shape), list(sizes), dim=dim) for _ in range(w))
        return fns.Scenario(collective, calls)
    send = [draw(st.lists(st.integers(0, 3), min_size=w, max_size=w)) for _ in range(w)]
    pass_recv = draw(st.booleans())
    out = []
    for r in range(w):
        shape = list(other)
        shape[dim] = sum(send[r])
        recv = [send[j][r] for j in range(w)] if pass_recv else None
        out.append(fns.call(collective, spec(shape), list(send[r]), dim=dim, recv_sizes=recv))
    return fns.Scenario(collective, tuple(out))


def mutate_family(draw: st.DrawFn, scenario: fns.Scenario, m: int, kind: str) -> fns.Call:
    """Rank ``m``'s call with ``kind`` changed (drawn; possibly harmlessly)."""
    call, w = scenario.calls[m], scenario.world_size
    spec = call.x
    assert isinstance(spec, fns.TensorSpec)  # a base call's
    if kind == "collective":  # the other collective of the same metadata round
        other = "all_to_all_v" if scenario.collective == "reduce_scatter_v" else "reduce_scatter_v"
        takes = bind(other, (), {}).signature.parameters  # recv_sizes: all_to_all_v's only
        return replace(
            call, collective=other, kwargs={k: v for k, v in call.kwargs.items() if k in takes}
        )
    if kind == "dtype":
        dtype = draw(st.sampled_from([*GLOO_NAMES, "float8_e5m2"]))
        return call.with_(x=replace(spec, dtype=dtype, requires_grad=False))
    if kind == "shape":
        shape = list(spec.shape)
        i = draw(st.integers(0, len(shape)))
        if i == len(shape):
            shape.append(draw(st.integers(1, 2)))
        else:
            shape[i] = draw(st.integers(0, 4))
        new = call.with_(x=replace(spec, shape=tuple(shape)))
        if call.get("shapes") is not None and draw(st.booleans()):  # and says so, honestly
            passed = [list(s) for s in call.get("shapes")]
            passed[m] = shape
            new = new.with_(shapes=passed)
        return new
    if kind == "dim":
        return call.with_(dim=draw(st.one_of(st.integers(-4, 4), st.sampled_from([None, 1.0]))))
    if kind == "grad":
        if scenario.collective == "all_gather_list" and draw(st.booleans()):
            return call.with_(grad=draw(st.sampled_from([*vargather.CONTRACTS, "avg"])))
        if spec.dtype in FLOATING:
            return call.with_(x=replace(spec, requires_grad=not spec.requires_grad))
        return call
    if kind == "sizes":
        base = list(_sizes(call))
        return _with_sizes(
            call,
            draw(
                st.one_of(
                    st.permutations(base).map(list),
                    st.lists(st.integers(-1, 5), min_size=w - 1, max_size=w + 1),
                )
            ),
        )
    if kind == "send_sizes":
        if draw(st.booleans()):  # a lie about its own tensor
            return _with_sizes(
                call, draw(st.lists(st.integers(-1, 4), min_size=w - 1, max_size=w + 1))
            )
        # an honest change of plan: another row, and a tensor that fits it
        d = call.get("dim")
        assert isinstance(d, int)
        row = draw(st.lists(st.integers(0, 3), min_size=w, max_size=w))
        shape = list(spec.shape)
        shape[d] = sum(row)
        return _with_sizes(call, row).with_(x=replace(spec, shape=tuple(shape)))
    if kind == "recv_sizes":
        truth = [list(_sizes(c))[m] for c in scenario.calls]
        lie = list(truth)
        lie[draw(st.integers(0, w - 1))] += 1
        value = draw(
            st.one_of(
                st.none(),
                st.just(truth),
                st.just(lie),
                st.lists(st.integers(-1, 4), min_size=w - 1, max_size=w + 1),
            )
        )
        return call.with_(recv_sizes=value)
    if kind == "shapes":
        truth = [list(c.x.shape) for c in scenario.calls]
        which = draw(st.integers(0, w - 1))
        changed = [list(s) for s in truth]
        changed[which] = [*changed[which], 1] if draw(st.booleans()) else [9] * len(truth[which])
        value = draw(
            st.one_of(
                st.none(),
                st.just(truth),
                st.just(changed),
                st.just(truth[:-1]),
                st.just([len(s) for s in truth]),
            )
        )
        return call.with_(shapes=value)
    if kind == "input":
        odd = [None, [1.0, 2.0], fns.TensorSpec(()), fns.TensorSpec((2, 2), layout="sparse")]
        return call.with_(x=draw(st.sampled_from(odd)))
    if kind == "options":  # validate=False is not fuzzed (it trusts the caller by design)
        if draw(st.booleans()):
            return call.with_(validate=draw(odd_values.filter(lambda v: v is not False)))
        # a valid timeout on one rank is harmless when generous (a short one is a fault)
        return call.with_(
            timeout=draw(st.one_of(st.floats(5, 60), odd_values.filter(_not_a_short_timeout)))
        )
    raise AssertionError(kind)


def _timeout_ok(value: object) -> bool:
    """``timeout=`` as vargather accepts it: ``None``, or seconds (a number or a
    ``timedelta``, not a bool) from 1 ms to 1e9 s."""
    if value is None:
        return True
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value) if abs(value) < 1e300 else math.inf
    else:
        return False
    return math.isfinite(seconds) and 1e-3 <= seconds <= 1e9


@st.composite
def family_mutated_calls(draw: st.DrawFn) -> FamilyJob:
    """A valid family call with one rank's arguments changed by one drawn kind."""
    return _family_mutated(draw, draw(family_bases()))


def _family_mutated(draw: st.DrawFn, base: fns.Scenario) -> FamilyJob:
    """``base`` with one rank's arguments changed by one drawn kind."""
    m = draw(st.integers(0, base.world_size - 1))
    kind = draw(st.sampled_from(FAMILY_MUTATIONS[base.collective]))
    calls = list(base.calls)
    calls[m] = mutate_family(draw, base, m, kind)
    return fns.Scenario(base.collective, tuple(calls)), (m,), kind


# The independent verdict: what vargather must do with a family scenario, derived from
# the raw arguments alone (docs/misuse.md, the order of the family's checks).


def _int_list(value: object) -> list[int] | None:
    """``value`` as a list of non-negative ints, if it is one (a base's or a mutation's
    values: lists of ints, never tensors)."""
    if not isinstance(value, list) or any(
        isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value
    ):
        return None
    return list(value)


def _local_ok(scenario: fns.Scenario, r: int) -> bool:
    """Rank ``r``'s call has no local problem."""
    call, w, name = scenario.calls[r], scenario.world_size, scenario.collective
    spec = call.x
    if not isinstance(call.get("validate"), bool) or not _timeout_ok(call.get("timeout")):
        return False
    if not isinstance(spec, fns.TensorSpec) or spec.layout == "sparse":
        return False
    if spec.dtype not in GLOO_NAMES or len(spec.shape) > 32:
        return False
    ndim = len(spec.shape)
    if name == "all_gather_list":
        if call.get("grad") not in vargather.CONTRACTS:
            return False
        shapes = call.get("shapes")
        if shapes is None:
            return True
        if not isinstance(shapes, list) or len(shapes) != w:
            return False
        if not all(_int_list(s) is not None for s in shapes):
            return False
        return tuple(shapes[r]) == spec.shape
    if ndim == 0:
        return False
    dim = call.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        return False
    sizes = _int_list(_sizes(call))
    if sizes is None or len(sizes) != w or sum(sizes) != spec.shape[dim]:
        return False
    if name == "all_to_all_v" and call.get("recv_sizes") is not None:
        recv = _int_list(call.get("recv_sizes"))
        if recv is None or len(recv) != w:
            return False
    return True


def _odd_ranks(values: Sequence[object]) -> list[int] | None:
    """``None`` when every rank agrees, else the ranks vargather blames: those not
    holding the value most ranks hold, or every rank on a tie."""
    counts = Counter(values).most_common()
    if len(counts) == 1:
        return None
    if counts[0][1] > counts[1][1]:
        return [r for r, v in enumerate(values) if v != counts[0][0]]
    return list(range(len(values)))


def family_verdict(scenario: fns.Scenario) -> tuple[str | None, tuple[int, ...]]:
    """``(None, ())``: the call is valid. Else what every rank must raise: the class
    name (``"local"``: a rank's own problem, any local class) and the blamed ranks."""
    w, name, calls = scenario.world_size, scenario.collective, scenario.calls
    # A rank calling the other collective of the round: its row's kind, read first.
    odd_kind = _odd_ranks([c.collective for c in calls])
    if odd_kind is not None:
        return "ProtocolMismatchError", tuple(odd_kind)
    bad = [r for r in range(w) if not _local_ok(scenario, r)]
    if bad:
        return "local", tuple(bad)
    specs = [c.x for c in calls]
    assert all(isinstance(s, fns.TensorSpec) for s in specs)
    shapes = [s.shape for s in specs]
    dtypes = [s.dtype for s in specs]
    grads = [s.requires_grad for s in specs]
    checks: list[tuple[str, list[object]]] = []
    if name == "all_gather_list":
        checks.append(("ArgumentMismatchError", [c.get("grad") for c in calls]))
        checks.append(("DTypeMismatchError", list(dtypes)))
        if calls[0].get("grad") != "local":
            checks.append(("RequiresGradMismatchError", list(grads)))
        checks.append(("ShapeMismatchError", [len(s) for s in shapes]))
    else:
        ndims = [len(s) for s in shapes]
        dims = [c.get("dim") % n for c, n in zip(calls, ndims, strict=True)]
        checks.append(("ShapeMismatchError", list(ndims)))
        checks.append(("ArgumentMismatchError", list(dims)))
        checks.append(("DTypeMismatchError", list(dtypes)))
        if name == "reduce_scatter_v":
            checks.append(("ShapeMismatchError", list(shapes)))
            checks.append(("SizesMismatchError", [tuple(_sizes(c)) for c in calls]))
        else:
            other = [
                s[: d % len(s)] + s[d % len(s) + 1 :] for s, d in zip(shapes, dims, strict=True)
            ]
            checks.append(("ShapeMismatchError", other))
        checks.append(("RequiresGradMismatchError", list(grads)))
    for error, values in checks:
        odd = _odd_ranks(values)
        if odd is not None:
            return error, tuple(odd)
    liars = _family_liars(scenario)
    return ("SizesMismatchError", tuple(liars)) if liars else (None, ())


def _family_liars(scenario: fns.Scenario) -> list[int]:
    """The ranks whose passed receive sizes (``all_to_all_v``) or shapes
    (``all_gather_list``) contradict the other ranks' send sizes or tensors: an
    unmutated rank is one when a mutated peer changed what it sends or holds."""
    w, calls = scenario.world_size, scenario.calls
    if scenario.collective == "all_to_all_v":
        matrix = [list(_sizes(c)) for c in calls]
        recv = [c.get("recv_sizes") for c in calls]
        return [
            r for r in range(w) if recv[r] is not None and list(recv[r]) != [m[r] for m in matrix]
        ]
    if scenario.collective == "all_gather_list":
        truth = [list(c.x.shape) for c in calls]
        return [
            r
            for r, c in enumerate(calls)
            if c.get("shapes") is not None and [list(s) for s in c.get("shapes")] != truth
        ]
    return []


def judge_family(
    scenario: fns.Scenario,
    outcomes: Sequence[RankOutcome[Any]],
    mutated: tuple[int, ...],
) -> str:
    """Accept exactly the right outcome (``family_verdict``): every rank the oracle's
    answer for a valid call; else every rank the same ``VarGatherError`` (class and
    message) blaming exactly the predicted ranks, which are mutated ones or (a lie
    about receive sizes or shapes) ranks whose passed values a mutated rank made
    wrong. Returns ``"harmless"`` or ``"refused"``; raises ``AssertionError``."""
    error_name, blamed = family_verdict(scenario)
    ok = [o.ok for o in outcomes]
    detail = "; ".join(
        f"rank {o.rank}: " + ("returned" if o.ok else f"{o.exc_type_name}: {o.exception}")
        for o in outcomes
    )
    if error_name is None:
        assert all(ok), f"a valid call was refused: {detail}"
        want = fns.expected_of(scenario)[0]
        for o in outcomes:
            assert o.value is not None
            got = o.value.output
            if isinstance(want[o.rank], list):
                assert isinstance(got, list), f"rank {o.rank}: expected a list, got {type(got)}"
                assert len(got) == len(want[o.rank]), f"rank {o.rank}: {len(got)} tensors"
                for k, (g, t) in enumerate(zip(got, want[o.rank], strict=True)):
                    assert_bitwise_equal(g, t, msg=f"rank {o.rank}, entry {k}")
            else:
                assert_bitwise_equal(got, want[o.rank], msg=f"rank {o.rank}")
        return "harmless"
    assert not any(ok), f"expected {error_name} on every rank blaming {list(blamed)}: {detail}"
    messages = {str(o.exception) for o in outcomes}
    assert len({o.exc_type_name for o in outcomes}) == 1, (
        f"ranks raised different classes: {detail}"
    )
    assert len(messages) == 1, f"ranks raised different messages: {messages}"
    error = outcomes[0].exception
    assert isinstance(error, vargather.VarGatherError), f"not a VarGatherError: {error!r}"
    message = str(error)
    if error_name == "local":
        assert not isinstance(error, (vargather.MismatchError, vargather.CollectiveError)), (
            f"expected a rank's own problem blaming {list(blamed)}: {type(error).__name__}: {message}"
        )
    else:
        assert type(error).__name__ == error_name, (
            f"expected {error_name} blaming {list(blamed)}, got {type(error).__name__}: {message}"
        )
    assert error.ranks == blamed, f"expected the error to blame {list(blamed)}: {message}"
    for r in error.ranks:
        assert f"rank {r}" in message or f"{r}]" in message or f"[{r}" in message, message
    # The blamed ranks were mutated, or (a tie, or a lie a mutated rank made of an
    # honest rank's passed values) a mutated rank is among them or named by them.
    involved = set(blamed) | (
        _mutated_named(scenario, blamed) if error_name == "SizesMismatchError" else set()
    )
    assert involved & set(mutated), f"blamed {list(blamed)}, none mutated {mutated}: {message}"
    return "refused"


def _mutated_named(scenario: fns.Scenario, blamed: Sequence[int]) -> set[int]:
    """The ranks whose sizes or shape a blamed rank's passed values misstate."""
    w, calls = scenario.world_size, scenario.calls
    out: set[int] = set()
    for b in blamed:
        if scenario.collective == "all_to_all_v":
            recv = list(calls[b].get("recv_sizes"))
            out |= {j for j in range(w) if list(_sizes(calls[j]))[b] != recv[j]}
        elif scenario.collective == "all_gather_list":
            passed = calls[b].get("shapes")
            out |= {j for j in range(w) if list(passed[j]) != list(calls[j].x.shape)}
    return out


def check_family_mutated(job: FamilyJob) -> None:
    scenario, mutated, kind = job
    history = _remember(scenario.world_size, job)
    try:
        _check_family_mutated(scenario, mutated, kind)
    except AssertionError as err:
        raise AssertionError(
            f"{scenario.collective}, {kind} on rank(s) {mutated}: {err}{history}"
        ) from None


def _check_family_mutated(scenario: fns.Scenario, mutated: tuple[int, ...], kind: str) -> None:
    w = scenario.world_size
    pool = get_pool(w)
    generation = pool.generation
    COUNTS["family mutated"] += 1
    COUNTS[f"family mutated, {_run_family(scenario, mutated)}"] += 1
    follow = family_follow_up(scenario.collective, w)
    failures = family.check_case(pool, follow)
    assert not failures, f"the next {scenario.collective} on the group failed: {failures}"
    assert pool.generation == generation, "the process group had to be rebuilt"


def _run_family(scenario: fns.Scenario, mutated: tuple[int, ...]) -> str:
    """Run a family scenario on its world and judge it (``judge_family``): ``"harmless"``
    (every rank the oracle's answer) or ``"refused"``."""
    try:
        outcomes = get_pool(scenario.world_size).run_outcomes(fns.run_call, scenario)
    except PoolFailure as failure:
        raise AssertionError(f"the world failed (abort or hang): {failure}") from None
    return judge_family(scenario, outcomes, mutated)


def family_follow_up(collective: str, w: int) -> family.FamilyCase:
    """A correct call with gradients, judged against the oracle by the family's kit."""
    if collective == "reduce_scatter_v":
        return ReduceScatterCase(w, (2, 0, 3)[:w], (2,), 0, "float64", seed=3)
    if collective == "all_to_all_v":
        send = tuple(tuple((r + j) % 3 for j in range(w)) for r in range(w))
        return AllToAllCase(w, send, (2,), -1, "float64", seed=3)
    return GatherListCase(w, ((2, 1), (0, 3), (1, 1))[:w], "float64", seed=3)


def check_family_valid(case: family.FamilyCase) -> None:
    COUNTS["family valid"] += 1
    history = _remember(case.world_size, case)
    failures = family.check_case(get_pool(case.world_size), case)
    if failures:
        raise AssertionError(f"{case}\n" + "\n".join(map(str, failures)) + history)


family_valid_cases = st.one_of(*(c.cases(dtypes=GLOO_NAMES) for c in family_catalogues()))
"""Valid family calls: the family's property strategies (subgroups, ``validate=False``
with known sizes, every gloo dtype)."""

family_examples: st.SearchStrategy[Any] = st.sampled_from([False, True, True]).flatmap(
    lambda mutated: family_mutated_calls() if mutated else family_valid_cases
)
"""A third of the family's examples valid, two thirds mutated (the valid ones are the
property suite's too). One strategy, not a ``one_of``: Hypothesis flattens nested
``one_of``s into their branches, which would give the family most of the examples."""


@dataclass(frozen=True)
class SteadyRun:
    """Calls on one world in a row, the steady paths' ground: ``before`` (a valid call
    repeated, often past the round state's ``SHRINK_AFTER``, perhaps with
    ``all_to_all_v``'s send sizes or the gather's sizes moving from call to call), then
    ``mutated`` (one or more ranks breaking the pattern: a mutated call of the same
    collective, judged as any mutated call is), then ``after`` (the last valid call
    again). Each call is judged alone; the process group must survive them all."""

    before: tuple[fns.Scenario, ...]
    mutated: tuple[fns.Scenario, tuple[int, ...]] | FamilyJob
    after: fns.Scenario


def _moved(draw: st.DrawFn, base: fns.Scenario) -> fns.Scenario:
    """``all_to_all_v``'s ``base`` with each rank perhaps moving one row from one of its
    send blocks to another (its tensor's shape unchanged; passed receive sizes follow)."""
    w = base.world_size
    send: list[list[int]] = []
    for c in base.calls:
        row = _sizes(c)
        assert isinstance(row, list)  # family_bases passes a list of ints
        send.append([int(n) for n in row])
    for r in range(w):
        full = [k for k in range(w) if send[r][k]]
        if not full or not draw(st.booleans()):
            continue
        src, dst = draw(st.sampled_from(full)), draw(st.integers(0, w - 1))
        send[r][src] -= 1
        send[r][dst] += 1
    calls = []
    for r, c in enumerate(base.calls):
        recv = None if c.get("recv_sizes") is None else [send[j][r] for j in range(w)]
        calls.append(_with_sizes(c, list(send[r])).with_(recv_sizes=recv))
    return replace(base, calls=tuple(calls))


def _resized(draw: st.DrawFn, base: fns.Scenario) -> fns.Scenario:
    """The gather's ``base`` with one rank's size along ``dim`` drawn anew (passed sizes
    follow)."""
    w = base.world_size
    r = draw(st.integers(0, w - 1))
    n = draw(st.integers(0, 4))
    dim = base.calls[0].get("dim")
    assert isinstance(dim, int)
    specs = [c.x for c in base.calls]
    assert all(isinstance(spec, fns.TensorSpec) for spec in specs)  # base_calls' own
    sizes = [int(spec.shape[dim]) for spec in specs]
    sizes[r] = n
    calls = []
    for k, c in enumerate(base.calls):
        spec = c.x
        assert isinstance(spec, fns.TensorSpec)
        shape = list(spec.shape)
        if k == r:
            shape[dim] = n
        passed = None if c.get("sizes") is None else list(sizes)
        calls.append(c.with_(x=replace(spec, shape=tuple(shape)), sizes=passed))
    return fns.Scenario(GATHER, tuple(calls))


@st.composite
def wide_base_calls(draw: st.DrawFn) -> fns.Scenario:
    """A valid gather whose largest shard is past the wide round's ``WIDE_MIN_BYTES``
    (rows of ``WIDE_ROW`` elements, 2 to 4 of them on some rank): the round whose
    steady calls replay their direct sends."""
    w = draw(st.integers(2, 3))
    sizes = draw(st.lists(st.integers(0, 4), min_size=w, max_size=w).filter(lambda s: max(s) >= 2))
    dtype = draw(st.sampled_from(GLOO_NAMES))
    split = draw(st.booleans())  # the row as (2, WIDE_ROW // 2): a third dimension
    trail: tuple[int, ...] = (2, WIDE_ROW // 2) if split else (WIDE_ROW,)
    layout = draw(st.sampled_from(["strided", "strided", "transposed"]))
    requires_grad = dtype in FLOATING and draw(st.booleans())
    grad = draw(st.sampled_from(vargather.CONTRACTS))
    pass_sizes = draw(st.booleans())
    seed = draw(st.integers(0, 99))
    calls = []
    for n in sizes:
        spec = fns.TensorSpec((n, *trail), dtype, requires_grad, layout, seed=seed)
        passed = list(sizes) if pass_sizes else None
        calls.append(fns.call(GATHER, spec, dim=0, sizes=passed, grad=grad))
    return fns.Scenario(GATHER, tuple(calls))


WIDE_ROW = WIDE_MIN_BYTES // 2 + 8
"""Elements of one row of ``wide_base_calls``: two rows of any dtype (a byte or more an
element) are past ``WIDE_MIN_BYTES``."""


@st.composite
def steady_runs(draw: st.DrawFn) -> SteadyRun:
    """A ``SteadyRun``: the gather or a family collective, 1 to ``SHRINK_AFTER + 3``
    valid calls, sizes moving in them or not, a mutated one, the valid one again."""
    repeats = draw(st.integers(1, SHRINK_AFTER + 3))
    moving = draw(st.booleans())
    before: list[fns.Scenario] = []
    if draw(st.sampled_from(["gather", "family"])) == "gather":
        base = draw(st.one_of(base_calls(), wide_base_calls()))
        for _ in range(repeats):
            before.append(base)
            if moving:
                base = _resized(draw, base)
        return SteadyRun(tuple(before), _mutated(draw, base), base)
    family_base = draw(family_bases())
    for _ in range(repeats):
        before.append(family_base)
        if moving and family_base.collective == "all_to_all_v":
            family_base = _moved(draw, family_base)
    return SteadyRun(tuple(before), _family_mutated(draw, family_base), family_base)


def check_steady_run(run: SteadyRun) -> None:
    w = run.after.world_size
    history = _remember(w, run)
    try:
        _check_steady_run(run)
    except AssertionError as err:
        raise AssertionError(f"{err}{history}") from None


def _check_steady_run(run: SteadyRun) -> None:
    pool = get_pool(run.after.world_size)
    generation = pool.generation
    COUNTS["steady runs"] += 1
    COUNTS["steady runs, calls"] += len(run.before) + 2
    for i, scenario in enumerate(run.before):
        _judged(f"call #{i} of the run (valid)", scenario)
    try:
        mutated, ranks = run.mutated[0], run.mutated[1]
        judge = _run_family if _in_family(mutated) else _run_mutated
        verdict = judge(mutated, ranks)
        COUNTS[f"steady runs, mutated {verdict}"] += 1
    except AssertionError as err:
        raise AssertionError(f"call #{len(run.before)} of the run (mutated): {err}") from None
    _judged(f"call #{len(run.before) + 1} of the run (valid again)", run.after)
    assert pool.generation == generation, "the process group had to be rebuilt"


def _judged(where: str, scenario: fns.Scenario) -> None:
    """Run a valid call and judge it: every rank the oracle's output (and gradient,
    where the calls backpropagate), saying where in its run it was."""
    try:
        outcomes = get_pool(scenario.world_size).run_outcomes(fns.run_call, scenario)
        refused = [f"rank {o.rank}: {o.exc_type_name}: {o.exception}" for o in outcomes if not o.ok]
        assert not refused, f"a valid call was refused: {'; '.join(refused)}"
        want, grads = fns.expected_of(scenario)
        for r, got in enumerate(o.value for o in outcomes):
            assert got is not None
            outs = got.output if isinstance(want[r], list) else [got.output]
            rights = want[r] if isinstance(want[r], list) else [want[r]]
            assert len(outs) == len(rights), f"rank {r}: {len(outs)} outputs"
            for g, e in zip(outs, rights, strict=True):
                assert_bitwise_equal(g, e, msg=f"rank {r}: output")
            if grads[r] is not None:
                assert got.grad is not None, f"rank {r}: no gradient"
                assert_bitwise_equal(got.grad, grads[r], msg=f"rank {r}: gradient")
    except PoolFailure as failure:
        raise AssertionError(f"{where}: the world failed (abort or hang): {failure}") from None
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from None


examples = st.one_of(
    vst.gather_cases(
        min_world_size=2, max_world_size=3, transports=GLOO_TRANSPORTS, dtypes=DTYPE_NAMES
    ),
    mutated_calls(),
    family_examples,
    _nan_fns.nan_cases(),
    steady_runs(),
)


def fuzz_one(example: Any) -> None:
    """One example, valid or mutated (the body of the ``@given`` test)."""
    if isinstance(example, GatherCase):
        check_valid(example)
    elif isinstance(example, _nan_fns.NanCase):
        COUNTS["nan"] += 1
        history = _remember(example.world_size, example)
        try:
            _nan_fns.check(example)
        except AssertionError as err:
            raise AssertionError(f"{example}: {err}{history}") from None
    elif isinstance(example, family.FamilyCase):
        check_family_valid(example)
    elif isinstance(example, SteadyRun):
        check_steady_run(example)
    elif _in_family(example[0]):
        check_family_mutated(example)
    else:
        check_mutated(example)


def build(config: settings) -> Any:
    """A fresh ``@given`` test under ``config`` (the database key is ``fuzz_one``'s)."""
    return config(given(examples)(fuzz_one))


test_multirank = build(SETTINGS)  # ``pytest fuzz/fuzz_multirank.py`` runs it once


def describe_failure(err: BaseException) -> str:
    """The error and Hypothesis's notes (the falsifying example, the explanation)."""
    parts = getattr(err, "exceptions", None)  # an ExceptionGroup: several distinct bugs
    if parts:
        return "\n\n".join(describe_failure(e) for e in parts)
    text = "".join(traceback.format_exception_only(type(err), err)).rstrip()
    return text if len(text) < 20_000 else text[:20_000] + "\n[...]"


def run_timed(seconds: float, db_path: str, chunk: int, first_seed: int | None = None) -> list[str]:
    """Runs of ``chunk`` examples until ``seconds`` pass; run ``k`` draws from seed
    ``first_seed + k`` when one is given (the same examples on every machine, in
    order), from fresh randomness otherwise."""
    config = settings(SETTINGS, database=DirectoryBasedExampleDatabase(db_path), max_examples=chunk)
    end = time.monotonic() + seconds
    for k in itertools.count():
        test = build(config)
        if first_seed is not None:
            test = seeded(first_seed + k)(test)
        try:
            test()
        except Exception as err:  # a failure, shrunk and saved by Hypothesis
            return [describe_failure(err)]
        if time.monotonic() >= end:
            break
    return []


def replay_findings() -> tuple[int, list[str]]:
    """Every stored finding (``fuzz/findings.py``), run once: (how many, failures)."""
    from findings import MULTIRANK

    failures = []
    for label, example in MULTIRANK:
        try:
            fuzz_one(example)
        except Exception as err:
            failures.append(f"stored finding ({label}): {describe_failure(err)}")
    return len(MULTIRANK), failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--db", default=DEFAULT_DB, help=f"example database (default {DEFAULT_DB})")
    parser.add_argument("--chunk", type=int, default=25, help="examples per Hypothesis run")
    parser.add_argument("--report", help="also write the summary and failures to this file")
    parser.add_argument(
        "--seed",
        type=int,
        help="draw run k from seed SEED+k: reproducible (what the CI smoke uses); "
        "fresh randomness when absent",
    )
    args = parser.parse_args(argv)
    # A loaded machine (CI, xdist neighbours) can stall a healthy collective for
    # seconds; a generous timeout keeps those from reading as failures. Set before the
    # pools start, so the property suite's runner and this file share them.
    os.environ.setdefault(COLLECTIVE_TIMEOUT_ENV, "30")
    started = time.monotonic()
    replayed, failures = replay_findings()
    COUNTS.clear()  # the drawn examples only, below
    failures += run_timed(args.minutes * 60, args.db, args.chunk, args.seed)
    elapsed = time.monotonic() - started
    kinds = ("valid", "mutated", "family valid", "family mutated", "nan", "steady runs")
    total = sum(COUNTS[k] for k in kinds)
    drawn = "fresh randomness" if args.seed is None else f"seeds {args.seed}, {args.seed + 1}, ..."
    lines = [
        f"fuzz_multirank: {elapsed:.0f} s, database {args.db}, {drawn}",
        f"  stored findings replayed first (fuzz/findings.py): {replayed}",
        f"  valid cases (property-suite strategy): {COUNTS['valid']}",
        f"  mutated calls: {COUNTS['mutated']} ({COUNTS['mutated, refused']} refused on every "
        f"rank, {COUNTS['mutated, harmless']} harmless and correct)",
        f"  family (valid: every catalogue but the gather; mutated: reduce_scatter_v, all_to_all_v, all_gather_list): {COUNTS['family valid']} "
        f"valid cases, {COUNTS['family mutated']} mutated calls "
        f"({COUNTS['family mutated, refused']} refused on every rank, "
        f"{COUNTS['family mutated, harmless']} harmless and correct)",
        f"  NaN cases (tests/_nan_fns.nan_cases): {COUNTS['nan']}",
        f"  steady runs (a valid call repeated, a mutated one, the valid one again): "
        f"{COUNTS['steady runs']}, {COUNTS['steady runs, calls']} calls (the mutated "
        f"ones: {COUNTS['steady runs, mutated refused']} refused on every rank, "
        f"{COUNTS['steady runs, mutated harmless']} harmless and correct)",
        f"  total: {total} examples, {len(failures)} failure(s)",
    ]
    lines += [f"FAILURE {failure}" for failure in failures]
    print("\n".join(lines))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    close_all_pools()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

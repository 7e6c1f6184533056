"""The testing kit's one kind of row: ``Property``, a claim an implementation must hold.

Where it sits: above ``cases`` -> ``judge`` -> ``runner``, beneath each collective's
catalogue (``vargather.testing.catalogues.<name>``), which lists its rows, each holding
the catalogue: nothing here looks a collective up. ``tests/`` (pytest), the mutant
search and ``python -m vargather check`` all run the rows ``catalogues.catalogue()``
returns, so the gate and the suite cannot drift. A failure of the call itself
(``call``: an exception, a crash, a hang) counts against every row; how a batch is
drawn, run and told is its catalogue's (``draw``, ``run``, ``describe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from hypothesis import strategies as st

from .cases import Implementation
from .judge import Failure
from .pool import RankPool
from .runner import Verdict
from .scale import DEFAULT_MAX_PAYLOAD

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from .catalogues import Catalogue

BATCH: Final = 6
"""Cases per example by default: one example is one pool round trip (``run_many``)."""

RETURNS: Final = ("sizes", "layout", "none", "unknown")
"""What an implementation returns beside the tensor (``unknown``: not yet asked)."""

_BUILT_MAX: Final = 256
"""How many built strategies ``Property.strategy`` keeps (the newest)."""


_BUILT: dict[tuple[object, ...], tuple[Property, SearchStrategy[list[Any]]]] = {}
"""``Property.strategy``'s memo: a test that draws ``prop.strategy(...)`` inside every
example (``data.draw``) gets the same strategy object each time instead of building
one (milliseconds of the parent's CPU per example: 16 s of 78 in the property tests)."""


@dataclass(frozen=True)
class Property:
    """One claim, checked on batches of cases drawn by ``strategy``.

    ``kwargs`` go to its collective's case strategy (``case_batches`` for
    ``all_gather_v``); ``aspects`` are the judge's aspects it counts
    (``Failure.aspect``; ``call`` always counts); ``keep`` narrows each drawn batch.
    ``min_world``/``max_world`` bound the world sizes it runs on (``None``: no bound);
    ``initialized=False`` runs one rank in the calling process without
    torch.distributed; ``subgroups`` draws subgroups of the world.
    """

    implementation: Implementation
    id: str
    title: str
    aspects: frozenset[str]
    kwargs: Mapping[str, object] = field(default_factory=dict, hash=False)
    min_world: int = 1
    max_world: int | None = None
    keep: Callable[[Any], bool] | None = None
    initialized: bool = True
    subgroups: bool = False
    needs_sum: bool = False
    needs_returned_sizes: bool = False
    out_of_scope: str | None = None
    """Why the implementation's declared scope excludes the whole property (``None``:
    it does not; out-of-scope cases of an in-scope property are never drawn)."""
    sequences: bool = False
    """Draw call sequences (``strategies.call_sequences``): each batch is one sequence of
    gathers, every call following the one before by a small change."""
    coalesced: bool = False
    """Run each batch as ONE call of the implementation's coalesced form
    (``runner.run_coalesced``), every case one tensor of it; the batch is drawn with
    the contract and transport of its first case (what the call takes once)."""
    compiled: bool = False
    """Run every case inside a step compiled with ``torch.compile(fullgraph=True)``, each
    on a backend drawn from ``COMPILE_BACKENDS`` (``vargather.testing.compiled``)."""
    examples: int | None = None
    """At most this many examples per run, whatever the caller asks (``None``: no cap):
    a property whose every example costs seconds (compiling) stays within the check's
    budget; ``slow_examples`` under the slow schedule."""
    slow_examples: int | None = None
    batch: int | None = None
    """Cases per batch at most (``None``: the caller's)."""
    equal_shapes: bool = False
    """Every rank's shard drawn with the first rank's shape (``--equal-shapes``)."""
    misuse: bool = False
    """Its cases are misuses (``vargather.testing.misuse``)."""
    catalogue: Catalogue | None = field(default=None, compare=False, repr=False)
    """The catalogue that listed it, which draws, runs and tells its batches."""

    @property
    def plugin(self) -> Catalogue:
        """Its catalogue (``ValueError`` for a row built without one)."""
        if self.catalogue is None:
            raise ValueError(f"{self.id}: a row built without its catalogue")
        return self.catalogue

    def max_examples(self, asked: int, *, slow: bool = False) -> int:
        """The examples to draw when ``asked`` are: capped by ``examples`` (or by
        ``slow_examples`` when ``slow``)."""
        cap = self.slow_examples if slow and self.slow_examples is not None else self.examples
        return asked if cap is None else min(asked, cap)

    def worlds(self, world_sizes: Sequence[int]) -> list[int]:
        """The world sizes of ``world_sizes`` it runs on (``[1]`` when uninitialized)."""
        if not self.initialized:
            return [1]
        top = self.max_world
        return sorted(
            w for w in set(world_sizes) if w >= self.min_world and (top is None or w <= top)
        )

    def not_applicable(self, world_sizes: Sequence[int], returns: str = "unknown") -> str | None:
        """Why it does not apply to its implementation on ``world_sizes`` (``None``: it
        does). ``returns``: what the implementation returns beside the tensor."""
        impl = self.implementation
        if self.out_of_scope is not None:
            return self.out_of_scope
        if self.needs_sum and "sum" not in impl.contracts:
            claimed = ", ".join(map(repr, impl.contracts))
            return f"an identity of grad='sum'; the claimed contract is {claimed}"
        if self.subgroups:
            if impl.convention == "seed":
                return "the seed's convention ATTR(t, dim, sizes) takes no process group"
            if not impl.takes_group:
                return "ATTR takes no group= parameter"
        if self.needs_returned_sizes and returns == "none":
            return "ATTR returns a bare tensor: no sizes to check"
        if self.initialized and not self.worlds(world_sizes):
            if self.max_world == 1:
                return "needs world size 1 in --world-sizes"
            return f"needs a world size >= {self.min_world} in --world-sizes"
        return None

    def strategy(
        self,
        world_sizes: Sequence[int],
        *,
        batch: int = BATCH,
        transports: Sequence[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> SearchStrategy[list[Any]]:
        """Batches of up to ``batch`` cases, all on one world size drawn from
        ``world_sizes`` (restricted to the property's range); ``transports``: those
        drawn (default: every one it takes); ``max_payload``: a large case's bytes per
        rank (0: small cases only). Memoized: the same arguments, the same object."""
        key = (
            id(self),
            tuple(world_sizes),
            batch,
            None if transports is None else tuple(transports),
            max_payload,
        )
        kept = _BUILT.get(key)
        if kept is not None and kept[0] is self:  # an id is reused only once its object is gone
            return kept[1]
        plugin = self.plugin
        if self.batch is not None:
            batch = min(batch, self.batch)
        worlds = self.worlds(world_sizes)
        if not worlds:
            raise ValueError(f"{self.id}: no world size of {list(world_sizes)} applies")
        # built once per world, not per example (a flatmap's function runs on every draw,
        # and building a case strategy costs milliseconds of the parent's CPU)
        per_world = {w: plugin.draw(self, w, batch, transports, max_payload) for w in worlds}
        built = per_world[worlds[0]]
        if len(worlds) > 1:
            built = st.sampled_from(worlds).flatmap(per_world.__getitem__)
        _BUILT[key] = (self, built)
        while len(_BUILT) > _BUILT_MAX:
            del _BUILT[next(iter(_BUILT))]
        return built

    def counted(self, verdict: Verdict) -> list[Failure]:
        """The verdict's failures this property is about, labelled with its id."""
        return [
            replace(f, property=self.id)
            for f in verdict.failures
            if f.aspect == "call" or f.aspect in self.aspects
        ]

    def run(
        self, batch: Sequence[Any], *, pool_factory: Callable[[int], RankPool] | None = None
    ) -> list[tuple[Verdict, list[Failure]]]:
        """Run ``batch`` and pair every verdict with the failures that count here."""
        if pool_factory is None:
            from .pool import get_pool

            pool_factory = get_pool
        verdicts = self.plugin.run(self, batch, pool_factory)
        return [(v, self.counted(v)) for v in verdicts]

    def describe(self, batch: Sequence[Any], index: int) -> str:
        """Case ``index`` of ``batch`` (it failed) in words, with the command that
        re-runs it."""
        return self.plugin.describe(self, batch, index)

    def case_data(self, case: Any) -> dict[str, Any]:
        """``case`` as plain JSON data (the counterexample in the report)."""
        return self.plugin.case_data(case)

    def fails(self, batch: Sequence[Any]) -> bool:
        """Whether some case of ``batch`` fails this property."""
        return any(failures for _, failures in self.run(batch))

    def check(self, batch: Sequence[Any]) -> None:
        """Run ``batch``; ``AssertionError`` describing every case that fails here."""
        results = self.run(batch)
        bad = [(v, failures) for v, failures in results if failures]
        if not bad:
            return
        impl = self.implementation
        parts = [f"{self.id}: {len(bad)} of {len(results)} case(s) failed against {impl.label}:"]
        for i, (_, failures) in enumerate(results):
            if not failures:
                continue
            parts.append(self.describe(batch, i))
            parts.extend(f"  - {f.render()}" for f in failures)
        raise AssertionError("\n".join(parts))

"""pytest configuration: Hypothesis profiles, ``--max-examples``, the suite's figures.

Hypothesis profiles, registered here explicitly (Hypothesis loads a built-in ``ci``
profile of its own when ``CI`` is set; ours replaces it under the same name):

``dev`` (the default)
    randomized, with the example database, no deadline; ``DEV_EXAMPLES`` per test, the
    same 20 as ``ci``: the README's test command on a fresh clone runs this profile and
    has to stay within 5 minutes on 2 cores. Depth comes from elsewhere: the database
    replays what an earlier run found, the scheduled ``slow`` step runs the property
    files at 60 and the fuzz programs (``fuzz/``) run for minutes.
``ci`` (loaded when the ``CI`` environment variable is set)
    ``derandomize=True``, no database, no deadline, a fixed ``CI_EXAMPLES`` (20) per
    test, so every CI run executes the same cases; the scheduled ``slow`` step runs the
    property files again at 60 (``scripts/ci_steps.sh``).
``fuzz``
    long runs (``FUZZ_EXAMPLES`` per test), randomized, with the database.

``--hypothesis-profile NAME`` picks one explicitly; ``--max-examples N`` overrides the
loaded profile's ``max_examples``. No deadline anywhere: a multi-rank example includes
process round trips whose time varies with the machine's load, and the first example of
a session includes starting the rank pools.

At the end of the run a summary line states how many multi-rank examples (gather cases
run on a gloo world and judged against the oracle) ran, per world size, across all
xdist workers, and the mutation score when the mutant catalogue ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings

# Bytecode caches, written even where PYTHONDONTWRITEBYTECODE is set (as on the CI
# machines): without them every pytest process (the two xdist workers, the pytest
# sessions the plugin's tests start) assertion-rewrites the test modules again (collection
# 9 s instead of 4 s) and every command a test starts (check, bench, repro, torchrun)
# compiles vargather's 29,000 lines again (0.8 s each). Set before the test modules and
# the rest of vargather are imported; the environment carries it to the subprocesses.
# The caches land in __pycache__ directories, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


CI_EXAMPLES = 20
DEV_EXAMPLES = CI_EXAMPLES
FUZZ_EXAMPLES = 2_000

settings.register_profile(
    "dev",
    deadline=None,
    max_examples=DEV_EXAMPLES,
    print_blob=True,
)
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=CI_EXAMPLES,
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    deadline=None,
    max_examples=FUZZ_EXAMPLES,
    print_blob=True,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    verbosity=Verbosity.normal,
    # A long run spends most of its time in rank round trips, not in generation; the
    # health check that times generation measures the machine's load, not the strategy.
    suppress_health_check=(HealthCheck.too_slow,),
)
_DEFAULT_PROFILE = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(_DEFAULT_PROFILE)

_STARTED = time.monotonic()
_WORKER_COUNTS: Counter[tuple[str, str]] = Counter()
_WORKER_MUTANTS: dict[str, str] = {}
_WORKER_REFUSED: dict[str, str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--max-examples",
        type=int,
        default=None,
        metavar="N",
        help="override the Hypothesis profile's max_examples for every property test",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Under -n (xdist's default "load"), the tests marked xdist_group("compile") share
    # one worker, whose rank processes then pay inductor's warm-up once (several
    # seconds per pool on 2 cores) instead of on every worker: "loadgroup" is "load"
    # but for those. Set here, not in addopts, so that -p no:xdist keeps working.
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        # A process that runs tests, not the xdist controller: vargather (and torch, 2 s)
        # is imported here, not at the top of this file, so that the controller starts
        # the workers without importing torch first.
        from vargather.testing.engine import COMPILED_PRELOAD
        from vargather.testing.rank_side import set_inductor_rank_defaults
        from vargather.testing.world import preload

        # The rank pools' inductor settings in this process and in everything it starts
        # (the tests that compile in-process, the commands run as subprocesses): scalar
        # kernels, no pool of compile workers. Set before the test modules (or anything)
        # import inductor, which reads them once; a variable already set (even empty, as
        # the slow step sets TORCHINDUCTOR_VEC_ISA_OK to compile vectorized kernels) is
        # kept.
        set_inductor_rank_defaults()
        # The forkserver this process's worlds fork from imports dynamo and inductor
        # once, and compiles one step on each (_warm_compile), instead of every rank of
        # every world on its first compiled step (seconds of CPU per rank on 2 cores).
        preload((*COMPILED_PRELOAD, "tests._warm_compile"))
    n = config.getoption("--max-examples")
    if n is not None:
        if n < 1:
            raise pytest.UsageError(f"--max-examples={n} must be >= 1")
        settings.register_profile("vargather-max-examples", settings(), max_examples=n)
        settings.load_profile("vargather-max-examples")


SHARED_MODULE_FIXTURES = ("smoke", "seed_sum", "dumps", "sdist", "user_session", "imports_seen")
"""Module-scoped fixtures that run a command for many seconds (the bench smoke, the
seed's gate run, torchrun, the sdist build, the plugin's user session: test_plugin's
pytest over a user's project, 15 s; test_import_order's one interpreter for its import
probes, seconds of CPU). xdist sets a module fixture up on every
worker that runs a test using it; the tests using one of these share an xdist group
named after it instead (one worker, one after the other), so it runs once per run."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for name in SHARED_MODULE_FIXTURES:
            if name in names and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(f"fixture-{name}"))
    if hasattr(config, "workerinput"):
        items.sort(key=_long_first)  # stable: the collection order within each part
        _name_the_groups(items)


LONG_FIRST = (
    "tests/test_plugin.py",
    "tests/test_cli_check.py",
    "tests/test_family_gate.py",
    "tests/test_gate_forks.py",
    "tests/test_targets.py",
    "tests/test_docs.py",
    "tests/test_faults.py",
    "tests/test_mutants.py",
)
"""Files of long tests (runs of the command line or of pytest in a subprocess, many
seconds each): under xdist their tests are handed out first, after the groups (which
``loadgroup`` hands out first, largest first), so that no worker starts one of them
while the other is finishing its last short tests."""


def _long_first(item: pytest.Item) -> int:
    return 0 if item.nodeid.startswith(LONG_FIRST) else 1


def _name_the_groups(items: list[pytest.Item]) -> None:
    """On an xdist worker: the ``@group`` suffix of every grouped test's node id, which
    is what the controller's ``loadgroup`` scheduler groups by.

    pytest-xdist 3.8 appends it by assigning ``item._nodeid``, which pytest 9.2 no
    longer reads (node ids are structured, ``item._id``): the marks are then silently
    ignored and a group's tests spread over every worker (pytest-dev/pytest-xdist#1386,
    open). This sets the structured id the same way, once, where the suffix is missing;
    with an xdist that does it itself it does nothing. The suffix is harmless under the
    other schedulers (``load`` ignores it, ``loadscope`` and ``loadfile`` cut it off with
    the test's name)."""
    try:
        from _pytest.nodes import coerce_node_id
    except ImportError:  # a pytest before structured ids: xdist's own suffix works
        return
    for item in items:
        groups = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if not groups or "@" in item.nodeid.rpartition("]")[2] or not hasattr(item, "_id"):
            continue
        item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


def pytest_report_header(config: pytest.Config) -> str:
    current = settings()
    profile = config.getoption("--hypothesis-profile", default=None) or _DEFAULT_PROFILE
    override = config.getoption("--max-examples")
    return (
        f"vargather property suite: Hypothesis profile {profile!r}"
        + (f" with --max-examples={override}" if override else "")
        + f" (max_examples={current.max_examples}, derandomize={current.derandomize})"
    )


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def refused_transports() -> dict[str, str]:
    """Transports vargather refuses on gloo (name -> its message), asked once.

    (Pools start lazily, one at a time: started together, ten rank processes importing
    torch at once on a loaded machine can outlast the pool's start timeout.)
    """
    import vargather
    from vargather.testing.runner import transport_refusals

    refused = transport_refusals(vargather.TRANSPORT_NAMES)
    _WORKER_REFUSED.update(refused)
    return refused


def _transport_names() -> tuple[str, ...]:
    import vargather

    return tuple(vargather.TRANSPORT_NAMES)


def _gloo_transport_names() -> tuple[str, ...]:
    """The transports vargather declares gloo can run (the others are refused on gloo
    with a message; ``test_declared_refusals_are_the_real_ones`` asks the ranks)."""
    from vargather._choices import unsupported_reason

    return tuple(t for t in _transport_names() if unsupported_reason(t, "gloo") is None)


@pytest.fixture(scope="session", params=_gloo_transport_names())
def transport(request: pytest.FixtureRequest) -> str:
    """Every name in ``vargather.TRANSPORT_NAMES`` that vargather runs on gloo."""
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def usable_transports(refused_transports: dict[str, str]) -> tuple[str, ...]:
    return tuple(t for t in _transport_names() if t not in refused_transports)


# --- the figures at the end ----------------------------------------------------------------


def _local_counts() -> Counter[tuple[str, str]]:
    import sys

    cases = sys.modules.get("vargather.testing.runner")
    if cases is None:
        return Counter()
    return Counter(cases.example_counts())


def _local_mutants() -> dict[str, str]:
    import sys

    mutants = sys.modules.get("tests.mutants")
    return dict(getattr(mutants, "RESULTS", {})) if mutants is not None else {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is None:
        return
    counts = [[label, world, n] for (label, world), n in _local_counts().items()]
    workeroutput["vargather_counts"] = json.dumps(counts)
    workeroutput["vargather_mutants"] = json.dumps(_local_mutants())
    workeroutput["vargather_refused"] = json.dumps(_WORKER_REFUSED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    output = getattr(node, "workeroutput", {})
    for label, world, n in json.loads(output.get("vargather_counts", "[]")):
        _WORKER_COUNTS[(label, world)] += n
    _WORKER_MUTANTS.update(json.loads(output.get("vargather_mutants", "{}")))
    _WORKER_REFUSED.update(json.loads(output.get("vargather_refused", "{}")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts = _local_counts() + _WORKER_COUNTS
    mutants = {**_local_mutants(), **_WORKER_MUTANTS}
    if not counts and not mutants:
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("-", "vargather property suite")
    elapsed = time.monotonic() - _STARTED
    by_impl: dict[str, Counter[str]] = {}
    for (label, world), n in counts.items():
        by_impl.setdefault(label, Counter())[world] += n
    for label in sorted(by_impl, key=lambda name: (not name.startswith("vargather"), name)):
        worlds = by_impl[label]
        multirank = sum(n for w, n in worlds.items() if w.startswith("W="))
        detail = ", ".join(f"{w}: {worlds[w]}" for w in sorted(worlds))
        write(f"{label}: {multirank} multi-rank examples on gloo worlds ({detail})")
    own = sum(
        n
        for (label, world), n in counts.items()
        if world.startswith("W=") and label.split(":")[0].split(".")[0] == "vargather"
    )
    write(
        f"multi-rank examples against vargather's own entry points: {own} "
        f"in {elapsed:.0f} s of session time"
    )
    for name, reason in sorted(_WORKER_REFUSED.items()):
        write(f"transport {name!r} not tested: vargather refuses it on gloo ({reason[:160]})")
    if mutants:
        caught = sum(1 for v in mutants.values() if v)
        write(
            f"mutation score: {caught}/{len(mutants)} mutants caught "
            f"({100.0 * caught / len(mutants):.0f}%)"
        )
        for name, by in sorted(mutants.items()):
            write(f"  {name}: " + (f"caught by {by}" if by else "SURVIVED"))

"""The bench's configuration: size profiles, ``BenchConfig``, the command line, the variant names.

Where it sits: the first module of ``vargather._cli.bench`` (the package doc has the whole
benchmark); every other module of the package reads it, it reads none of them.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    import torch

    _State: TypeAlias = tuple[torch.Tensor, torch.Tensor] | None
    """A variant's untimed state: the backward's ``(x, out)``, nothing for the others."""


SCHEMA: Final = "vargather-bench/2"


PROFILES: Final = ("even", "mild", "heavy", "empty")


PARTS: Final = ("large", "small", "coalesced", "peers", "family")
OPTIONAL_PARTS: Final = ("mpi", "sequence")
"""Parts run only when ``--parts`` names them (``mpi``: launched by ``mpiexec``, needs
the ``mpi`` extra; ``_mpi`` has it; ``sequence``: all_to_all_v as sequence and expert
parallelism run it, ``_sequence``)."""
PEER_SIZES_KB: Final = (64.0, 256.0, 1024.0, 4096.0, 16384.0)
PEER_COLUMNS: Final = 64
"""float32 columns of the peers part's rows (256-byte rows, as the issue's figures)."""


MPI_SIZES_KB: Final = (4.0, 64.0, 1024.0, 16384.0)
"""The mpi part's totals (KiB): all_gather's output, all_to_all's inputs together."""


FAMILY_SIZES_KB: Final = (64.0, 1024.0, 16384.0)
SEQUENCE_SIZES_KB: Final = (64.0, 1024.0, 16384.0)
"""Each rank's input in the sequence part (KiB)."""
SEQUENCE_SPLITS: Final = ("even", "uneven")
FAMILY_PROFILES: Final = ("even", "mild")
FAMILY_COLUMNS: Final = 64
"""float32 columns of the family part's rows (256-byte rows, as the peers part)."""


ROW_ELEMENTS: Final = 256  # float32 elements per row: 1 KiB rows


SMALL_SIZES_KB: Final = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0)


COALESCED_DIM: Final = 16
"""Columns of the coalesced case's float32 embeddings (a row: 8 + 64 + 1 bytes)."""


_MALLOC_ENV: Final = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""The memory pass's allocator setting; never set where time is measured."""


KNOWN_SIZES_VARIANT: Final = "vargather:auto+sizes"
"""``auto`` with the sizes passed and ``validate=False``: no metadata exchange."""


FAMILY_CHANGING_VARIANT: Final = "vargather~changing"
"""The family part's ``all_to_all_v`` with send sizes changing every call (validated,
``recv_sizes`` unknown), on a learned state of its own (``_variants.own_state``)."""


# --- profiles -------------------------------------------------------------------------------


def profile_shares(profile: str, world_size: int) -> tuple[float, ...]:
    """Each rank's share of the gathered rows (they sum to 1).

    ``even``: equal; ``mild``: 1 to 1.75 in equal steps (1, 1.25, 1.5, 1.75 at 4 ranks);
    ``heavy``: one rank 20x every other (.87/.043/.043/.043 at 4 ranks); ``empty``:
    every other rank has nothing (1, 0, 1, 0).
    """
    w = world_size
    if profile == "even":
        weights = [1.0] * w
    elif profile == "mild":
        weights = [1.0 + 0.75 * r / max(w - 1, 1) for r in range(w)]
    elif profile == "heavy":
        weights = [1.0] + [0.05] * (w - 1)
    elif profile == "empty":
        weights = [1.0 if r % 2 == 0 else 0.0 for r in range(w)]
    else:
        raise ValueError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    total = sum(weights)
    return tuple(x / total for x in weights)


def split_rows(total_rows: int, shares: Sequence[float]) -> list[int]:
    """``total_rows`` split by ``shares``, largest remainder first; sums to ``total_rows``."""
    exact = [total_rows * s for s in shares]
    rows = [math.floor(e) for e in exact]
    order = sorted(range(len(shares)), key=lambda r: (rows[r] - exact[r], r))
    for r in order[: total_rows - sum(rows)]:
        rows[r] += 1
    return rows


def floor_ratio(shares: Sequence[float]) -> float:
    """The least ratio to the limit a ragged gather can reach: the rank with the
    smallest share must receive ``1 - s_min`` of the bytes, the limit's ranks
    ``1 - 1/W``."""
    w = len(shares)
    return (1.0 - min(shares)) / (1.0 - 1.0 / w) if w > 1 else 1.0


# --- configuration ---------------------------------------------------------------------------


LARGE_MOVED_MB: Final = 1024.0
"""The large part times each variant at least this many MB in all (``large_repeats``)."""

LARGE_REPEATS_FACTOR: Final = 8
"""At most this many times ``--repeats`` single calls per variant in a large cell."""


def large_repeats(repeats: int, mb: float) -> int:
    """The timed single calls per variant of a large cell of ``mb`` MB: ``repeats`` (the
    count from 1 GB up), more for smaller payloads, so that each variant moves at least
    ``LARGE_MOVED_MB`` in all, at most ``LARGE_REPEATS_FACTOR`` times ``repeats``. A 4 MB
    call lasts a few milliseconds, which this 2-core machine's scheduling jitter
    matches, and one single call of 4-16 MB reads anywhere from 0.5x to 1.6x the
    limit's call beside it: over 7 calls a median ratio moved by a third from run to run
    (1.08x and 1.47x at 4 MB, even), over 28 calls still by a quarter (1.05x and 1.35x
    at 4 MB, mild). 56 calls per variant at 1-16 MB (at the default ``--repeats 7``)
    cost about a minute more per run."""
    wanted = math.ceil(LARGE_MOVED_MB / mb) if mb > 0 else repeats
    return max(repeats, min(LARGE_REPEATS_FACTOR * repeats, wanted))


@dataclass(frozen=True)
class BenchConfig:
    ranks: tuple[int, ...] = (2, 4)
    sizes_mb: tuple[float, ...] = (1.0, 4.0, 16.0, 41.0, 64.0)
    profiles: tuple[str, ...] = PROFILES
    repeats: int = 7
    warmup: int = 1
    memory: bool = True
    timeout_s: float = 300.0
    variants: tuple[str, ...] | None = None  # None: all
    parts: tuple[str, ...] = PARTS
    small_kb: tuple[float, ...] = SMALL_SIZES_KB
    peer_kb: tuple[float, ...] = PEER_SIZES_KB
    peer_profile: str = "mild"
    small_profile: str = "even"
    small_repeats: int = 31
    calls: int = 20
    family_kb: tuple[float, ...] = FAMILY_SIZES_KB
    family_profiles: tuple[str, ...] = FAMILY_PROFILES
    mpi_kb: tuple[float, ...] = MPI_SIZES_KB
    sequence_kb: tuple[float, ...] = SEQUENCE_SIZES_KB
    mpi_profile: str = "mild"


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
        if not values:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return values

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vargather bench",
        description=(
            "Time vargather's ragged all_gather (forward and backward) against the seed's "
            "algorithm, all_gather_object and the equal-size collectives of the same "
            "bytes, on a local gloo world, with default malloc settings: large payloads "
            "per size profile, a small-payload sweep in steady state, and several tensors "
            "gathered at once. Reports median ratios to the equal-size limit and (in a "
            "separate pass) peak extra memory; every variant's result is checked."
        ),
    )
    p.add_argument("--ranks", type=_csv(int), default=None, help="world sizes (default 2,4)")
    p.add_argument(
        "--parts",
        type=_csv(str),
        default=None,
        help=f"which parts to run (default {','.join(PARTS)}; also "
        f"{','.join(OPTIONAL_PARTS)}: MPI beside gloo, needs mpi4py and mpich)",
    )
    p.add_argument(
        "--sizes",
        type=_csv(float),
        default=None,
        help="large part: gathered payloads in MB (default 1,4,16,41,64)",
    )
    p.add_argument(
        "--profiles",
        type=_csv(str),
        default=None,
        help=f"large part: size profiles (default {','.join(PROFILES)})",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="large part: timed single calls per variant from 1 GB up (default 7); smaller "
        "payloads take more, up to 8x, so that each variant moves 1 GB",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed, checked calls per variant first (default 1; small parts: at least W)",
    )
    p.add_argument(
        "--small-sizes",
        type=_csv(float),
        default=None,
        help="small and coalesced parts: gathered totals in KiB (default 1,4,16,64,256,1024)",
    )
    p.add_argument(
        "--peer-sizes",
        type=_csv(float),
        default=None,
        help="peers part: gathered totals in KiB (default 64,256,1024,4096,16384)",
    )
    p.add_argument(
        "--peer-profile",
        default=None,
        help="peers part: the size profile (default mild)",
    )
    p.add_argument(
        "--small-profile",
        default=None,
        help="small part: the size profile of the fixed sizes (default even)",
    )
    p.add_argument(
        "--small-repeats",
        type=int,
        default=None,
        help="small, coalesced, peers, family and mpi parts: timed bursts per variant (default 31)",
    )
    p.add_argument(
        "--calls",
        type=int,
        default=None,
        help="small, coalesced, peers, family and mpi parts: timed calls per burst "
        "(default 20; the mpi part: fewer where a burst would move over 128 MiB)",
    )
    p.add_argument(
        "--family-sizes",
        type=_csv(float),
        default=None,
        help="family part: totals in KiB (reduce_scatter_v: each rank's input; "
        "all_to_all_v: every rank's input together; all_gather_list: gathered) "
        "(default 64,1024,16384)",
    )
    p.add_argument(
        "--family-profiles",
        type=_csv(str),
        default=None,
        help="family part: size profiles (default even,mild)",
    )
    p.add_argument(
        "--mpi-sizes",
        type=_csv(float),
        default=None,
        help="mpi part: totals in KiB (all_gather's output, all_to_all's inputs together) "
        "(default 4,64,1024,16384)",
    )
    p.add_argument(
        "--sequence-sizes",
        type=_csv(float),
        default=None,
        help="sequence part: each rank's input in KiB (default 64,1024,16384)",
    )
    p.add_argument(
        "--mpi-profile",
        default=None,
        help="mpi part: the size profile (default mild)",
    )
    p.add_argument(
        "--variants",
        type=_csv(str),
        default=None,
        help="only these variants (the limit always runs), e.g. seed,vargather:auto",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="collective timeout in seconds (300)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of about a minute: 2 ranks, 1 MB, even and heavy, 3 repeats; "
        "4 and 64 KiB, 5 bursts of 10 calls (explicit options still apply)",
    )
    p.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the tables as markdown")
    p.add_argument("--plot", metavar="PATH", help="write a PNG plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    quick = bool(args.quick)
    cfg = BenchConfig(
        ranks=args.ranks or ((2,) if quick else (2, 4)),
        sizes_mb=args.sizes or ((1.0,) if quick else BenchConfig.sizes_mb),
        profiles=args.profiles or (("even", "heavy") if quick else PROFILES),
        repeats=args.repeats if args.repeats is not None else (3 if quick else 7),
        warmup=args.warmup if args.warmup is not None else 1,
        memory=not args.no_memory,
        timeout_s=args.timeout,
        variants=args.variants,
        parts=args.parts or PARTS,
        small_kb=args.small_sizes or ((4.0, 64.0) if quick else SMALL_SIZES_KB),
        small_profile=args.small_profile or "even",
        peer_kb=args.peer_sizes or ((64.0, 1024.0) if quick else PEER_SIZES_KB),
        peer_profile=args.peer_profile or "mild",
        small_repeats=(
            args.small_repeats if args.small_repeats is not None else (5 if quick else 31)
        ),
        calls=args.calls if args.calls is not None else (10 if quick else 20),
        family_kb=args.family_sizes or ((64.0,) if quick else FAMILY_SIZES_KB),
        family_profiles=args.family_profiles or FAMILY_PROFILES,
        mpi_kb=args.mpi_sizes or ((4.0, 64.0) if quick else MPI_SIZES_KB),
        sequence_kb=args.sequence_sizes or ((64.0,) if quick else SEQUENCE_SIZES_KB),
        mpi_profile=args.mpi_profile or "mild",
    )
    for w in cfg.ranks:
        if w < 2:
            raise ValueError(f"--ranks: every world size must be >= 2, got {w}")
    unknown_parts = [p for p in cfg.parts if p not in (*PARTS, *OPTIONAL_PARTS)]
    if unknown_parts:
        raise ValueError(
            f"--parts: unknown {unknown_parts}; expected some of "
            f"{', '.join((*PARTS, *OPTIONAL_PARTS))}"
        )
    for mb in cfg.sizes_mb:
        if not mb > 0:
            raise ValueError(f"--sizes: payloads must be > 0 MB, got {mb}")
    for option, totals in (
        ("--small-sizes", cfg.small_kb),
        ("--peer-sizes", cfg.peer_kb),
        ("--family-sizes", cfg.family_kb),
        ("--mpi-sizes", cfg.mpi_kb),
        ("--sequence-sizes", cfg.sequence_kb),
    ):
        for kb in totals:
            if not kb > 0:
                raise ValueError(f"{option}: totals must be > 0 KiB, got {kb}")
    for prof in (
        *cfg.profiles,
        cfg.small_profile,
        cfg.peer_profile,
        *cfg.family_profiles,
        cfg.mpi_profile,
    ):
        profile_shares(prof, 2)  # raises on an unknown name
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.small_repeats < 1 or cfg.calls < 1:
        raise ValueError("--repeats, --small-repeats and --calls must be >= 1 and --warmup >= 0")
    if cfg.variants is not None:
        known = set(_forward_names()) | set(_backward_names()) | set(SMALL_NAMES)
        known |= set(COALESCED_NAMES) | set(PEER_NAMES)
        unknown = [v for v in cfg.variants if v not in known]
        if unknown:
            raise ValueError(
                f"--variants: unknown {unknown}; expected some of {', '.join(sorted(known))}"
            )
    return cfg


def forward_transports() -> tuple[str, ...]:
    """The transports timed: every name of ``vargather.TRANSPORT_NAMES`` that runs on
    gloo (asked of vargather, so a new transport is timed without editing this)."""
    from vargather.testing.runner import gloo_transports

    return gloo_transports()[0]


def _forward_names() -> list[str]:
    return [
        "limit",
        *(f"vargather:{t}" for t in forward_transports()),
        KNOWN_SIZES_VARIANT,
        "seed",
        "all_gather_object",
    ]


def _backward_names() -> list[str]:
    return ["limit", *(f"vargather:{t}" for t in forward_transports()), "all_reduce"]


CHANGING_VARIANT: Final = "vargather:auto~changing"


FORCED_VARIANT: Final = "vargather:forced"


FLOOR_VARIANT: Final = "sends"
"""The small part's floor: every rank's block sent straight to every peer and received
in place, sizes known, nothing validated (one ``batch_isend_irecv`` of 2 (W - 1)
operations): gloo's fastest way to move a gather's bytes. Every small ratio is shown
against it, beside the ratio to one equal all_gather (``limit``)."""


SMALL_NAMES: Final = (
    "limit",
    FLOOR_VARIANT,
    "vargather:auto",
    CHANGING_VARIANT,
    KNOWN_SIZES_VARIANT,
    FORCED_VARIANT,
    "seed",
)
"""The small part's variants, in their order."""


COALESCED_NAMES: Final = ("limit", "coalesced", "coalesced+sizes", "separate")
PEER_NAMES: Final = ("limit", "vargather:auto", "ignite", "torchmetrics", "seed")
"""The peers part's variants, in their order (``ignite``: pytorch-ignite's
``all_gather_tensors_with_shapes`` after the shape exchange its docs ask for;
``torchmetrics``: ``gather_all_tensors`` then ``cat``)."""
"""The coalesced part's variants, in their order."""


def malloc_environment() -> dict[str, str]:
    """The ``MALLOC_*`` settings this process runs with (recorded by every pass)."""
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def _wanted(name: str, cfg: BenchConfig) -> bool:
    return cfg.variants is None or name in cfg.variants


def cell_count(cfg: BenchConfig) -> int:
    """Pool calls the run makes (the progress total)."""
    large = len(cfg.sizes_mb) * len(cfg.profiles) if "large" in cfg.parts else 0
    small = len(cfg.small_kb) * (("small" in cfg.parts) + ("coalesced" in cfg.parts))
    peers = len(cfg.peer_kb) if "peers" in cfg.parts else 0
    family = len(cfg.family_kb) * len(cfg.family_profiles) if "family" in cfg.parts else 0
    mpi = 1 if "mpi" in cfg.parts else 0  # one mpiexec launch per world size
    sequence = len(cfg.sequence_kb) * len(SEQUENCE_SPLITS) if "sequence" in cfg.parts else 0
    large *= 2 if cfg.memory else 1
    return len(cfg.ranks) * (small + peers + family + mpi + sequence + large)

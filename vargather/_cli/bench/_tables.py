"""The bench's reporting: markdown tables (every ratio with its spread) and the targets.

Where it sits: the parent side, after the rank programs returned their records; pure
functions of those records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ._config import CHANGING_VARIANT, COALESCED_DIM, FAMILY_CHANGING_VARIANT, FLOOR_VARIANT
from ._variants import coalesced_row_bytes

# --- reporting -------------------------------------------------------------------------------------


def _fmt_ratio(entry: dict[str, Any] | None, of: str = "") -> str:
    """``median (q1-q3)``: the median of the per-repeat ratios and their quartiles
    (``of="floor_"``: the ratios to the floor, ``FLOOR_VARIANT``, which may be absent)."""
    if entry is None or (of and f"{of}median_ratio" not in entry):
        return "—"
    mark = "" if entry["verified"] else " WRONG"
    q = entry.get(f"{of}quartile_ratios")
    spread = f" ({q[0]:.2f}-{q[1]:.2f})" if q else ""
    return f"{entry[f'{of}median_ratio']:.2f}x{spread}{mark}"


def _fmt_spread(s: dict[str, Any] | None) -> str:
    """A ``_meter.spread`` as ``median (q1-q3; min-max)``."""
    if s is None:
        return "—"
    return f"{s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f}; {s['min']:.2f}-{s['max']:.2f})"


def _fmt_mem(entry: dict[str, Any] | None, output_bytes: int) -> str:
    if entry is None or entry.get("peak_extra_bytes") is None:
        return "—"
    return f"{entry['peak_extra_bytes'] / output_bytes:.2f}"


def _columns(cells: Sequence[dict[str, Any]], direction: str) -> list[str]:
    names: list[str] = []
    for c in cells:
        for n in c[direction]:
            if n not in names:
                names.append(n)
    return names


def _row_label(c: dict[str, Any]) -> list[str]:
    shares = "/".join(f"{s:.2f}" for s in c["shares"])
    return [str(c["world_size"]), f"{c['payload_mb']:g}", f"{c['profile']} ({shares})"]


def _repeats_by_size(cells: Sequence[dict[str, Any]]) -> str:
    """`` over N single calls per variant`` (per payload when they differ), or ``""``
    for records that do not say."""
    by_size = {c["payload_mb"]: c["repeats"] for c in cells if "repeats" in c}
    if not by_size:
        return ""
    if len(set(by_size.values())) == 1:
        return f" over {next(iter(by_size.values()))} single calls per variant"
    told = ", ".join(f"{n} at {mb:g} MB" for mb, n in sorted(by_size.items()))
    return f" over single calls per variant ({told})"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _short(name: str) -> str:
    return name.removeprefix("vargather:")


def _payload(record: dict[str, Any]) -> str:
    if "payload_kb" in record:
        return f"{record['payload_kb']:g} KiB"
    return f"{record['payload_mb']:g} MB"


def _limit_us(record: dict[str, Any]) -> str:
    return f"{record['forward']['limit']['median_ms'] * 1e3:.0f}"


def _small_tables(
    small: Sequence[dict[str, Any]], coalesced: Sequence[dict[str, Any]]
) -> list[str]:
    parts: list[str] = []
    if small:
        floored = all(FLOOR_VARIANT in c["forward"] for c in small)
        cols = [n for n in _columns(small, "forward") if not (floored and n == FLOOR_VARIANT)]
        base = FLOOR_VARIANT if floored else "limit"
        head = ["W", "KiB", "sizes", f"{base} µs/call", *(_short(n) for n in cols)]
        of = "floor_" if floored else ""
        rows = [
            [
                str(c["world_size"]),
                f"{c['payload_kb']:g}",
                "/".join(str(n) for n in c["sizes"]),
                f"{c['forward'][base]['median_ms'] * 1e3:.0f}",
                *(_fmt_ratio(c["forward"].get(n), of) for n in cols),
            ]
            for c in small
        ]
        c0 = small[0]
        against = (
            "the direct sends of the same bytes with sizes known (`sends`: gloo's fastest "
            "way to move them; `limit`: one equal-size all_gather of the same bytes)"
            if floored
            else "one equal-size all_gather of the same bytes"
        )
        parts.append(
            "**small payloads**, forward in steady state: median over "
            f"{len(c0['forward']['limit']['times_s'])} bursts of {c0['calls_per_burst']} "
            f"calls of the per-burst ratio to {against} "
            "(float32 elements; `auto`: validated, fixed sizes; `auto~changing`: validated, "
            "sizes changing every call by about 5% of a share; `auto+sizes`: "
            "`validate=False`; `forced`: validated, the payload's transport forced, so "
            "metadata and payload travel in two rounds; `seed`: the seed's algorithm)\n\n"
            + _table(head, rows)
        )
    done = [c for c in coalesced if "skipped" not in c]
    cpu_rows = [
        [
            part,
            str(c["world_size"]),
            f"{c['payload_kb']:g}",
            " · ".join(
                f"{_short(n)} {e['median_cpu_ms'] * 1e3:.0f}"
                for n, e in c["forward"].items()
                if "median_cpu_ms" in e
            ),
        ]
        for part, cells in (("small", small), ("coalesced", done))
        for c in cells
    ]
    if cpu_rows:
        cpu_note = (
            "**CPU time per call**, µs: the rank process's CPU time over a burst (every "
            "thread, gloo's included) divided by its calls, largest over ranks, median over "
            "bursts; far less sensitive to the machine's load than the times above\n\n"
        )
        cpu_table = _table(["part", "W", "KiB", "variant µs"], cpu_rows)
    if done:
        cols = _columns(done, "forward")
        head = [
            "W",
            "KiB",
            "rows",
            "limit µs/call",
            *(_short(n) for n in cols),
            "coalesced / separate",
        ]
        rows = []
        for c in done:
            f = c["forward"]
            vs = (
                f"{f['coalesced']['median_ratio'] / f['separate']['median_ratio']:.2f}"
                if "coalesced" in f and "separate" in f
                else "—"
            )
            rows.append(
                [
                    str(c["world_size"]),
                    f"{c['payload_kb']:g}",
                    "/".join(str(n) for n in c["sizes"]),
                    _limit_us(c),
                    *(_fmt_ratio(f.get(n)) for n in cols),
                    vs,
                ]
            )
        parts.append(
            "**coalesced**: int64 ids, float32 embeddings "
            f"({COALESCED_DIM} columns) and a bool mask of the same rows, "
            f"{coalesced_row_bytes()} bytes a row; median per-burst ratio to one equal-size "
            "all_gather of their total bytes (`coalesced`: `all_gather_v_coalesced`; "
            "`separate`: three `all_gather_v` calls)\n\n" + _table(head, rows)
        )
    notes = sorted({c["skipped"] for c in coalesced if "skipped" in c})
    parts += [f"**coalesced**: skipped, {n}" for n in notes]
    if cpu_rows:
        parts.append(cpu_note + cpu_table)
    return parts


def _peer_tables(peers: Sequence[dict[str, Any]]) -> list[str]:
    """The peers part: every variant's ratio to the limit, and vargather's speed-up over
    the fastest peer, each with its spread over the bursts."""
    if not peers:
        return []
    cols = _columns(peers, "forward")
    head = ["W", "KiB", "rows", "limit µs/call", *(_short(n) for n in cols), "speed-up"]
    rows = [
        [
            str(c["world_size"]),
            f"{c['payload_kb']:g}",
            "/".join(str(n) for n in c["sizes"]),
            _limit_us(c),
            *(_fmt_ratio(c["forward"].get(n)) for n in cols),
            _fmt_spread(c.get("speedup_vs_fastest_peer")),
        ]
        for c in peers
    ]
    c0 = peers[0]
    parts = [
        "**peers**, forward in steady state, rows of "
        f"{c0['columns']} float32 columns split by the `{c0['profile']}` profile: median "
        f"over {len(c0['forward']['limit']['times_s'])} bursts of {c0['calls_per_burst']} "
        "calls of the per-burst ratio to one equal-size all_gather of the same bytes, "
        "quartiles in parentheses (`auto`: vargather's validated `all_gather_v`; `ignite`: "
        "pytorch-ignite's `all_gather_tensors_with_shapes` after the shape exchange its "
        "docs ask for; `torchmetrics`: `gather_all_tensors` + `cat`; `seed`: the seed's "
        "algorithm; each checked equal to vargather's output before it was timed). "
        "speed-up: the fastest peer's time over vargather's, per burst: median "
        "(quartiles; range)\n\n" + _table(head, rows)
    ]
    notes = sorted({f"{n}: {t}" for c in peers for n, t in c.get("notes", {}).items()})
    parts += [f"**peers**: skipped {n}" for n in notes]
    return parts


FAMILY_TARGET: Final = 1.15
"""The issue's bound on every family ratio, sizes known and unknown."""


FAMILY_CHANGING_TARGET: Final = 1.3
"""The issue's bound on ``all_to_all_v`` with sizes changing every call."""


def _issued(entry: dict[str, Any]) -> str:
    n = entry.get("collectives_per_call")
    return "?" if n is None else str(n)


def family_tables(family: Sequence[dict[str, Any]]) -> list[str]:
    """The family part: per cell and collective, vargather's time over its baseline's,
    sizes unknown and known, each with its spread over the bursts."""
    if not family:
        return []
    rows: list[list[str]] = []
    for c in family:
        for op, g in c["collectives"].items():
            f = g["forward"]
            marks = {
                k: "" if f[n]["verified"] else " WRONG"
                for k, n in (
                    ("unknown", "vargather"),
                    ("known", "vargather+sizes"),
                    ("changing", FAMILY_CHANGING_VARIANT),
                )
                if n in f
            }
            changing = g["ratios"].get("changing")
            rows.append(
                [
                    str(c["world_size"]),
                    f"{c['payload_kb']:g}",
                    c["profile"],
                    op,
                    f"{f['limit']['median_ms'] * 1e3:.0f}",
                    _fmt_spread(g["ratios"]["unknown"]) + marks["unknown"],
                    _fmt_spread(g["ratios"]["known"]) + marks["known"],
                    "–" if changing is None else _fmt_spread(changing) + marks["changing"],
                    f"{_issued(f['vargather'])} / {_issued(f['vargather+sizes'])}",
                ]
            )
    head = [
        "W",
        "KiB",
        "profile",
        "collective",
        "baseline µs/call",
        "sizes unknown",
        "sizes known",
        "sizes changing",
        "collectives",
    ]
    c0 = family[0]
    g0 = next(iter(c0["collectives"].values()))
    parts = [
        "**family**, steady state, rows of "
        f"{c0['columns']} float32 columns: median over "
        f"{len(g0['forward']['limit']['times_s'])} bursts of {c0['calls_per_burst']} "
        "calls of the per-burst ratio of vargather's time to its baseline's in the same "
        "repeat: median (quartiles; range); lower is better, the issue's target is "
        f"{FAMILY_TARGET:.2f}x. `reduce_scatter_v(x, sizes)` against one "
        "`reduce_scatter_tensor` of the same input cut into equal blocks (gloo runs it); "
        "`all_to_all_v(x, send_sizes)` against one `all_to_all_single` with the same "
        "splits; `all_gather_list(x)` against `all_gather_v(x)` of the same tensors; "
        "`gather_v(x, 0)` and `scatter_v(x, sizes, 0)` against `dist.gather` and "
        "`dist.scatter` of the blocks padded to the largest (and, as the `direct` ratio "
        "of the JSON, against batched sends of the exact blocks). "
        "sizes unknown: validated (the sizes exchanged and checked; all_to_all_v "
        "without `recv_sizes`, all_gather_list without `shapes`); sizes known: the sizes "
        "passed with `validate=False` (all_gather_list's baseline then "
        "`all_gather_v(x, sizes=..., validate=False)`); sizes changing: all_to_all_v "
        "validated, every rank's send sizes moving about 5% of a block between two peers "
        f"every call (the issue's target {FAMILY_CHANGING_TARGET:.1f}x), against the same "
        "baseline. collectives: what one call issues "
        "through vargather (unknown / known); the baseline is one. KiB: reduce_scatter_v's "
        "input on every rank, all_to_all_v's inputs together, all_gather_list's output. "
        "Every vargather result was checked equal to the same splits through "
        "`dist.reduce_scatter`, `all_to_all_single` or `all_gather_v` before it was "
        "timed\n\n" + _table(head, rows)
    ]
    notes = sorted(
        {
            f"{op} {n}: {t}"
            for c in family
            for op, g in c["collectives"].items()
            for n, t in g.get("notes", {}).items()
        }
    )
    parts += [f"**family**: {n}" for n in notes]
    return parts


def markdown_report(
    cells: Sequence[dict[str, Any]],
    targets: Sequence[dict[str, Any]],
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
    peers: Sequence[dict[str, Any]] = (),
    family: Sequence[dict[str, Any]] = (),
) -> str:
    """The tables: the small, coalesced, peers and family parts, the large part's
    forward and backward ratios (median and quartiles) and peak extra memory, the
    targets."""
    parts: list[str] = _small_tables(small, coalesced) + _peer_tables(peers) + family_tables(family)
    for direction in ("forward", "backward") if cells else ():
        cols = _columns(cells, direction)
        head = ["W", "MB", "profile", "floor", "auto ->", *(_short(n) for n in cols)]
        rows = [
            [
                *_row_label(c),
                f"{c['floor']:.2f}x",
                c["auto_transport"],
                *(_fmt_ratio(c[direction].get(n)) for n in cols),
            ]
            for c in cells
        ]
        parts.append(
            f"**{direction}**, median of per-repeat ratios{_repeats_by_size(cells)} "
            "(quartiles in parentheses) to the equal-size "
            f"{'all_gather' if direction == 'forward' else 'reduce_scatter'} of the same bytes "
            "(lower is better; `limit` is 1.00x by definition)\n\n" + _table(head, rows)
        )
    mem_rows = []
    cols_f = _columns(cells, "forward")
    cols_b = _columns(cells, "backward")
    for c in cells:
        mem_rows.append(
            [
                *_row_label(c),
                *(_fmt_mem(c["forward"].get(n), c["output_bytes"]) for n in cols_f),
                *(_fmt_mem(c["backward"].get(n), c["output_bytes"]) for n in cols_b),
            ]
        )
    mem_head = [
        "W",
        "MB",
        "profile",
        *(f"fwd {_short(n)}" for n in cols_f),
        *(f"bwd {_short(n)}" for n in cols_b),
    ]
    measured = any(
        e.get("peak_extra_bytes") is not None
        for c in cells
        for d in ("forward", "backward")
        for e in c[d].values()
    )
    if measured:
        parts.append(
            "**peak extra memory**, largest over ranks, in multiples of the output's bytes "
            "(peak resident growth during one call; the output itself counts 1.00)\n\n"
            + _table(mem_head, mem_rows)
        )
    if targets:
        t_rows = [
            [
                t["target"],
                str(t["world_size"]),
                _payload(t),
                t["profile"],
                (f"{t['value']:.2f}" if t["value"] is not None else "—")
                + (f" ({t['spread'][0]:.2f}-{t['spread'][1]:.2f})" if t.get("spread") else ""),
                f"{t['op']} {t['bound']:.2f}",
                "met" if t["met"] else "**missed**",
            ]
            for t in targets
        ]
        parts.append(
            "**targets** (the issue's, checked per cell on the median; quartiles in "
            "parentheses)\n\n"
            + _table(["target", "W", "payload", "profile", "measured", "bound", ""], t_rows)
        )
    return "\n\n".join(parts) + "\n"


SMALL_TARGET_KB: Final = (4.0, 65536.0)
"""The small-payload targets hold for totals in this range (KiB, both ends included)."""


def _met(value: float | None, op: str, bound: float) -> bool:
    if value is None:
        return False
    if op == "<=":
        return value <= bound
    if op == "<":
        return value < bound
    return value >= bound


def evaluate_targets(
    cells: Sequence[dict[str, Any]],
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
    peers: Sequence[dict[str, Any]] = (),
    family: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The issue's targets, one verdict per cell: ``vargather:auto`` in the large part,
    validated gathers from 4 KiB up in the small part (fixed and changing sizes), the
    coalesced gather, vargather's speed-up over the fastest peer, and every family
    collective against its baseline (sizes unknown and known)."""
    out: list[dict[str, Any]] = []

    def add(
        c: dict[str, Any],
        target: str,
        value: float | None,
        op: str,
        bound: float,
        quartiles: Sequence[float] | None = None,
    ) -> None:
        size = {"payload_kb": c["payload_kb"]} if "payload_kb" in c else {}
        out.append(
            {
                "target": target,
                "world_size": c["world_size"],
                "payload_mb": c["payload_kb"] / 1024 if size else c["payload_mb"],
                **size,
                "profile": c["profile"],
                "value": value,
                "op": op,
                "bound": bound,
                "met": _met(value, op, bound),
                "spread": list(quartiles) if quartiles else None,
            }
        )

    lo, hi = SMALL_TARGET_KB
    for c in small:
        if not lo <= c["payload_kb"] <= hi:
            continue
        for name, bound in (("vargather:auto", 1.15), (CHANGING_VARIANT, 1.15)):
            entry = c["forward"].get(name)
            if entry is None:
                continue
            if "floor_median_ratio" in entry:  # against the direct sends
                add(
                    c,
                    f"small {_short(name)} / {FLOOR_VARIANT}",
                    entry["floor_median_ratio"],
                    "<=",
                    bound,
                    entry.get("floor_quartile_ratios"),
                )
            else:
                add(
                    c,
                    f"small {_short(name)} / limit",
                    entry["median_ratio"],
                    "<=",
                    bound,
                    entry.get("quartile_ratios"),
                )
    for c in peers:
        up = c.get("speedup_vs_fastest_peer")
        if up is not None:
            add(
                c,
                "fastest peer / auto (speed-up)",
                up["median"],
                ">=",
                1.5,
                (up["q1"], up["q3"]),
            )
    for c in family:
        for op, g in c["collectives"].items():
            for known, label, bound in (
                ("unknown", "", FAMILY_TARGET),
                ("known", "+sizes", FAMILY_TARGET),
                ("changing", "~changing", FAMILY_CHANGING_TARGET),
            ):
                r = g["ratios"].get(known)
                if r is None:
                    continue
                base = g["known_baseline"] if known == "known" else g["baseline"]
                add(
                    c,
                    f"family {op}{label} / {base}",
                    r["median"],
                    "<=",
                    bound,
                    (r["q1"], r["q3"]),
                )
    for c in coalesced:
        f = c.get("forward", {})
        if "coalesced" not in f:
            continue
        add(c, "coalesced / limit", f["coalesced"]["median_ratio"], "<=", 1.3)
        if "separate" in f:
            ratio = f["coalesced"]["median_ratio"] / f["separate"]["median_ratio"]
            add(c, "coalesced / separate", ratio, "<", 1.0)

    for c in cells:
        fwd = c["forward"].get("vargather:auto")
        bwd = c["backward"].get("vargather:auto")
        skewed = c["profile"] not in ("even", "mild")
        if fwd is not None:
            bound = 1.15 * (c["floor"] if skewed else 1.0)
            name = "forward auto / limit" + (" (<= 1.15 x floor)" if skewed else "")
            add(c, name, fwd["median_ratio"], "<=", bound, fwd.get("quartile_ratios"))
            seed = c["forward"].get("seed")
            if skewed and seed is not None:
                add(
                    c,
                    "seed / auto (speed-up)",
                    seed["median_ratio"] / fwd["median_ratio"],
                    ">=",
                    2.5,
                )
            if fwd.get("peak_extra_bytes") is not None:
                add(
                    c,
                    "forward auto memory / output",
                    fwd["peak_extra_bytes"] / c["output_bytes"],
                    "<=",
                    2.0,
                )
        if bwd is not None:
            add(
                c,
                "backward auto / limit",
                bwd["median_ratio"],
                "<=",
                1.3,
                bwd.get("quartile_ratios"),
            )
            if bwd.get("peak_extra_bytes") is not None:
                add(
                    c,
                    "backward auto memory / output",
                    bwd["peak_extra_bytes"] / c["output_bytes"],
                    "<=",
                    2.0,
                )
    return out

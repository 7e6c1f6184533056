"""The bench's plot (matplotlib, Agg): ratio to the limit against payload, per part.

Where it sits: the parent side, beside ``_tables``; pure function of the records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch

    _State: TypeAlias = tuple[torch.Tensor, torch.Tensor] | None
    """A variant's untimed state: the backward's ``(x, out)``, nothing for the others."""
from ._tables import _columns, _short


def plot(
    cells: Sequence[dict[str, Any]],
    path: str,
    small: Sequence[dict[str, Any]] = (),
    coalesced: Sequence[dict[str, Any]] = (),
    peers: Sequence[dict[str, Any]] = (),
    family: Sequence[dict[str, Any]] = (),
    mpi: Sequence[dict[str, Any]] = (),
) -> None:
    """One panel per (direction, world size) and profile: ratio to the limit vs payload;
    then per world size the small-payload sweep and the coalesced case vs total; then
    per world size one panel per family collective: its ratio to its baseline (median,
    quartiles as error bars) vs total, sizes unknown and known, per profile; then per
    world size the MPI part's two collectives, every variant's ratio to MPI's call with
    the counts exchanged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [c for c in coalesced if "forward" in c]
    names = list(
        dict.fromkeys(
            [
                *_columns(cells, "forward"),
                *_columns(cells, "backward"),
                *_columns(small, "forward"),
                *(f"coalesced: {n}" for n in _columns(done, "forward")),
                *(f"peers: {n}" for n in _columns(peers, "forward")),
            ]
        )
    )
    cmap = plt.get_cmap("tab20")  # 20 colors: the dark ones first, then the light ones
    color = {n: cmap((2 * i) % 20 if i < 10 else (2 * i + 1) % 20) for i, n in enumerate(names)}
    worlds = sorted({c["world_size"] for c in cells})
    small_worlds = sorted({c["world_size"] for c in [*small, *done, *peers]})
    profiles = list(dict.fromkeys(c["profile"] for c in cells))
    rows: list[tuple[str, int]] = [
        *((d, w) for d in ("forward", "backward") for w in worlds),
        *(("small", w) for w in small_worlds),
        *(("family", w) for w in sorted({c["world_size"] for c in family})),
        *(("mpi", w) for w in sorted({c["world_size"] for c in mpi if "collectives" in c})),
    ]
    ncols = max(len(profiles), 3 if small_worlds or family else 2 if mpi else 1)
    fig, axes = plt.subplots(
        len(rows), ncols, figsize=(4.2 * ncols, 3.2 * len(rows)), squeeze=False
    )

    def curve(ax: Any, sel: Sequence[dict[str, Any]], name: str, key: str, label: str) -> None:
        xs = [c["payload_kb"] for c in sel]
        ys = [c["forward"][name]["median_ratio"] if name in c["forward"] else math.nan for c in sel]
        style = "-" if name.startswith(("vargather", "coalesced")) else "--"
        ax.plot(
            xs,
            ys,
            style,
            marker="o",
            markersize=3,
            linewidth=2.5 if name in ("vargather:auto", "coalesced") else 1.2,
            color=color[key],
            label=label,
        )

    def finish(
        ax: Any, title: str, xlabel: str, xs: Sequence[float], first: bool, last: bool
    ) -> None:
        from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, ScalarFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(set(xs))))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", linewidth=0.3)
        if first:
            ax.set_ylabel("time / limit")
        if last:
            ax.set_xlabel(xlabel)

    for i, (direction, w) in enumerate(rows):
        for ax in axes[i]:
            ax.set_visible(False)
        last = i == len(rows) - 1 or rows[i + 1][0] != direction
        if direction == "family":
            _family_row(axes[i], [c for c in family if c["world_size"] == w], w, finish)
            continue
        if direction == "mpi":
            sel = [c for c in mpi if c["world_size"] == w and "collectives" in c]
            _mpi_row(axes[i], sel, w, finish)
            continue
        if direction == "small":
            panels = [
                (sorted((c for c in small if c["world_size"] == w), key=_kb), "small payloads"),
                (sorted((c for c in done if c["world_size"] == w), key=_kb), "coalesced (3)"),
                (sorted((c for c in peers if c["world_size"] == w), key=_kb), "peers"),
            ]
            for j, (sel, title) in enumerate(panels):
                if not sel:
                    continue
                ax = axes[i][j]
                ax.set_visible(True)
                for name in _columns(sel, "forward"):
                    key = name if j == 0 else f"{('coalesced', 'peers')[j - 1]}: {name}"
                    curve(ax, sel, name, key, _short(key))
                ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
                xs = [c["payload_kb"] for c in sel]
                finish(ax, f"{title}, W={w}", "gathered in total (KiB)", xs, j == 0, True)
            continue
        for j, prof in enumerate(profiles):
            ax = axes[i][j]
            sel = sorted(
                (c for c in cells if c["world_size"] == w and c["profile"] == prof),
                key=lambda c: c["payload_mb"],
            )
            if not sel:
                continue
            ax.set_visible(True)
            xs = [c["payload_mb"] for c in sel]
            for name in _columns(sel, direction):
                ys = [
                    c[direction][name]["median_ratio"] if name in c[direction] else math.nan
                    for c in sel
                ]
                style = "-" if name.startswith("vargather") else "--"
                width = 2.5 if name == "vargather:auto" else 1.2
                ax.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    markersize=3,
                    linewidth=width,
                    color=color[name],
                    label=_short(name),
                )
            if direction == "forward":
                ax.axhline(sel[0]["floor"], color="grey", linewidth=0.8, linestyle=":")
            finish(ax, f"{direction}, W={w}, {prof}", "payload (MB)", xs, j == 0, last)
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(
        list(handles.values()),
        list(handles.keys()),
        loc="upper center",
        ncol=min(len(handles), 8),
        fontsize=8,
    )
    legend_rows = math.ceil(len(handles) / 8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.03 * legend_rows * 4 / max(len(rows), 1)))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _kb(record: dict[str, Any]) -> float:
    return float(record["payload_kb"])


def _family_row(axes: Any, cells: Sequence[dict[str, Any]], w: int, finish: Any) -> None:
    """One panel per family collective: the median ratio to its baseline with its
    quartiles, sizes unknown (solid), known (dashed) and changing every call (dotted,
    ``all_to_all_v``), one color per profile."""
    ops = list(dict.fromkeys(op for c in cells for op in c["collectives"]))
    profiles = list(dict.fromkeys(c["profile"] for c in cells))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for j, op in enumerate(ops[: len(axes)]):
        ax = axes[j]
        ax.set_visible(True)
        xs_all: list[float] = []
        for k, prof in enumerate(profiles):
            sel = sorted(
                (c for c in cells if c["profile"] == prof and op in c["collectives"]), key=_kb
            )
            xs = [_kb(c) for c in sel]
            xs_all += xs
            for known, style in (("unknown", "-"), ("known", "--"), ("changing", ":")):
                if not sel or any(known not in c["collectives"][op]["ratios"] for c in sel):
                    continue
                r = [c["collectives"][op]["ratios"][known] for c in sel]
                ys = [e["median"] for e in r]
                lo = [y - e["q1"] for y, e in zip(ys, r, strict=True)]
                hi = [e["q3"] - y for y, e in zip(ys, r, strict=True)]
                err = [lo, hi]
                ax.errorbar(
                    xs,
                    ys,
                    yerr=err,
                    fmt=style,
                    marker="o",
                    markersize=3,
                    capsize=2,
                    linewidth=1.4,
                    color=colors[k % len(colors)],
                    label=f"family: {prof}, sizes {known}",
                )
        ax.axhline(1.15, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(1.0, color="grey", linewidth=0.5)
        finish(ax, f"{op} / its baseline, W={w}", "total (KiB)", xs_all, j == 0, True)


_MPI_ROLES = ("MPI, counts exchanged", "MPI, counts known", "vargather, validated", "gloo")
"""The MPI part's variants by position (``_mpi.GATHER_NAMES``, ``_mpi.EXCHANGE_NAMES``):
one legend entry for both collectives."""


def _mpi_row(axes: Any, cells: Sequence[dict[str, Any]], w: int, finish: Any) -> None:
    """One panel per collective of the MPI part: every variant's median ratio to MPI's
    call with the counts exchanged, quartiles as error bars, vs total."""
    ops = list(dict.fromkeys(op for c in cells for op in c["collectives"]))
    styles = ("-", "--", "-", "--")
    colors = ("tab:blue", "tab:cyan", "tab:red", "tab:green")
    for j, op in enumerate(ops[: len(axes)]):
        ax = axes[j]
        ax.set_visible(True)
        sel = sorted((c for c in cells if op in c["collectives"]), key=_kb)
        xs = [_kb(c) for c in sel]
        names = list(sel[0]["collectives"][op]["forward"])
        for k, name in enumerate(names):
            r = [c["collectives"][op]["ratios"][name] for c in sel]
            ys = [e["median"] for e in r]
            err = [
                [y - e["q1"] for y, e in zip(ys, r, strict=True)],
                [e["q3"] - y for y, e in zip(ys, r, strict=True)],
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                fmt=styles[k % len(styles)],
                marker="o",
                markersize=3,
                capsize=2,
                linewidth=2.5 if name.startswith("vargather") else 1.2,
                color=colors[k % len(colors)],
                label=f"mpi part: {_MPI_ROLES[k % len(_MPI_ROLES)]}",
            )
        ax.axhline(1.0, color="grey", linewidth=0.5)
        finish(ax, f"{op} / MPI (counts exchanged), W={w}", "total (KiB)", xs, j == 0, True)

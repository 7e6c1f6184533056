"""The conformance gate's results model and its renderings: text and JSON.

Where it sits: in the gate's engine, beneath ``engine`` (which fills a ``Report``, one
``PropertyResult`` per row) and both surfaces: the command line prints
``Report.render()`` and writes ``to_json()``; the pytest plugin turns each row into an
item's outcome. Nothing here parses text back: every line is rendered from fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from .cases import GatherCase
from .properties import BATCH

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2

REPORT_SCHEMA: Final = "vargather-check-report/1"
STATUSES: Final = ("pass", "fail", "xfail", "xpass", "unsupported", "n/a", "skipped")


@dataclass(frozen=True)
class PropertyFailure:
    """Why a property failed, on its minimal counterexample: the JSON report's
    ``failure`` (its kinds and aspects: docs/conformance.md). ``reproduction`` is the
    case in words with the ``python -m vargather repro`` command that re-runs it;
    ``tries`` how often the counterexample was run, ``failed_tries`` in how many of them
    it failed."""

    kind: str
    message: str
    case: dict[str, Any] | None = None
    reproduction: str | None = None
    shrunk: bool = True
    aspect: str | None = None
    tries: int = 1
    failed_tries: int = 1

    @property
    def flaky(self) -> bool:
        """It failed in some of its tries, not all."""
        return self.failed_tries < self.tries

    @property
    def tries_text(self) -> str:
        """``flaky: failed 2 of 3 tries``, ``failed 3 of 3 tries``, or empty (one try)."""
        if self.tries <= 1:
            return ""
        text = f"failed {self.failed_tries} of {self.tries} tries"
        return f"flaky: {text}" if self.flaky else text

    @property
    def command(self) -> str | None:
        """The shell command in ``reproduction`` that re-runs the case, if there is one."""
        for line in (self.reproduction or "").splitlines():
            head, sep, command = line.partition("reproduce: ")
            if sep and not head.strip():
                return command.strip()
        return None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        head = {k: data.pop(k) for k in ("kind", "message", "case", "reproduction")}
        return {**head, "command": self.command, **data, "flaky": self.flaky}


@dataclass(frozen=True)
class NanPayloads:
    """Results of a reduction whose NaNs' payloads differed from the oracle's, a NaN
    wherever the oracle has one, under ``--nan-payloads backend``: reported, not failed
    (``--strict`` fails them). ``cases``: how many cases; ``message`` and
    ``reproduction``: the first one's."""

    cases: int
    message: str
    reproduction: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PropertyResult:
    """One row of the table, as the JSON report's ``properties`` (its statuses:
    docs/conformance.md). ``examples`` counts the Hypothesis examples run before the
    verdict (for a failure: up to and including the first failing one), ``cases`` the
    gathers they held (an example is a batch of up to ``BATCH`` cases on one world, one
    pool round trip); ``shrink_runs`` the further examples Hypothesis ran shrinking a
    failure."""

    id: str
    title: str
    status: str
    examples: int = 0
    cases: int = 0
    shrink_runs: int = 0
    seconds: float = 0.0
    reason: str | None = None
    failure: PropertyFailure | None = None
    hint: str | None = None
    """Beside a failure: the declared-scope option that would explain it, if the
    failure looks like one (``verdict.scope_hints``); it never changes the status."""
    nan_payloads: NanPayloads | None = None
    """NaN payload differences seen and not failed (``--nan-payloads backend``)."""

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "xpass")

    def progress_line(self) -> str:
        """The property's line in plain progress output."""
        return (
            f"{self.id:<18} {_STATUS_TEXT[self.status]:<5} {self.cases:>5} cases  "
            f"{self.seconds:6.1f} s"
        )

    @staticmethod
    def from_json(data: dict[str, Any]) -> PropertyResult:
        """The inverse of ``to_json``."""
        values = _fields(PropertyResult, data)
        failure, nans = data["failure"], data.get("nan_payloads")
        values["failure"] = (
            None if failure is None else PropertyFailure(**_fields(PropertyFailure, failure))
        )
        values["nan_payloads"] = None if nans is None else NanPayloads(**nans)
        return PropertyResult(**values)

    def to_json(self, timings: bool = False) -> dict[str, Any]:
        data = _fields(self, vars(self))
        seconds = data.pop("seconds")
        for key in ("failure", "nan_payloads"):
            data[key] = None if data[key] is None else data[key].to_json()
        return {**data, "seconds": round(seconds, 3)} if timings else data


@dataclass
class Report:
    """The outcome of one check run: a header and one ``PropertyResult`` per property."""

    impl: str | None
    impl_display: str
    convention: str
    grad: str
    world_sizes: tuple[int, ...]
    max_examples: int
    seed: int
    xfails_path: str | None
    results: list[PropertyResult] = field(default_factory=list)
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    transports: tuple[str, ...] | None = None
    refused_transports: dict[str, str] = field(default_factory=dict)
    scope: dict[str, str] = field(default_factory=dict)
    """The declared scope (``--grad``, ``--dims``, ``--sizes``, ...), option -> value."""
    strict: bool = False
    call: str | None = None
    """The call template ATTR is called with (``None``: the convention's)."""
    op: str = "all_gather_v"
    batch: int = BATCH
    """Calls per example at most (the header says so)."""
    timings: bool = False

    @property
    def exit_status(self) -> int:
        failed = any(r.failed or (self.strict and r.status == "unsupported") for r in self.results)
        return EXIT_FAILED if failed else EXIT_OK

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        data = {
            "schema": REPORT_SCHEMA,
            "impl": self.impl,
            "impl_display": self.impl_display,
            "convention": self.convention,
            "call": self.call,
            "op": self.op,
            "grad": self.grad,
            "world_sizes": list(self.world_sizes),
            "max_examples": self.max_examples,
            "seed": self.seed,
            "xfails_file": self.xfails_path,
            "versions": dict(self.versions),
            "transports": None if self.transports is None else list(self.transports),
            "refused_transports": dict(self.refused_transports),
            "scope": dict(self.scope),
            "strict": self.strict,
            "properties": [r.to_json(self.timings) for r in self.results],
            "summary": self.counts(),
            "exit_status": self.exit_status,
        }
        return {**data, "seconds": round(self.seconds, 3)} if self.timings else data

    def write_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")

    def header_lines(self) -> list[str]:
        if self.convention in ("dtensor", "program"):  # a target's own rows
            convention = f"called as {self.call}"
        elif self.call is not None:
            convention = f"called as ATTR{self.call}"
        elif self.convention == "seed":
            convention = "the seed's convention ATTR(t, dim, sizes)"
        else:
            convention = "vargather's convention ATTR(x, dim, *, sizes, group, grad)"
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        extra: list[str] = []
        if self.transports is not None:
            extra.append("transports: " + ", ".join(self.transports))
            extra.extend(
                f"transport {name!r} not run: {why}"
                for name, why in self.refused_transports.items()
            )
        scope = ", ".join(f"{k} {v}" for k, v in self.scope.items()) or "no limits declared"
        return [
            f"vargather check: {self.impl_display} ({convention})",
            f"declared scope: {scope}",
            f"claimed gradient contract: {self.grad}; world sizes "
            f"{','.join(str(w) for w in self.world_sizes)}; up to {self.max_examples} "
            f"examples per property (each a batch of up to {self.batch} calls); seed {self.seed}"
            + (f"; xfails from {self.xfails_path}" if self.xfails_path else ""),
            *extra,
            versions,
        ]

    def table_lines(self) -> list[str]:
        rows = [("property", "status", "examples", "cases", "what it checks")]
        for r in self.results:
            examples = str(r.examples)
            if r.shrink_runs:
                examples += f" (+{r.shrink_runs} shrinking)"
            what = r.title if r.reason is None else f"{r.title} [{r.reason}]"
            if r.failure is not None and r.failure.flaky:
                what += f" [{r.failure.tries_text}]"
            if r.nan_payloads is not None:
                what += f" [{_nan_text(r.nan_payloads)}]"
            rows.append((r.id, _STATUS_TEXT[r.status], examples, str(r.cases), what))
        n = len(rows[0]) - 1
        widths = [max(len(row[i]) for row in rows) for i in range(n)]
        lines = []
        for i, row in enumerate(rows):
            cells = [row[j].ljust(widths[j]) for j in range(n)]
            lines.append("  ".join([*cells, row[n]]).rstrip())
            if i == 0:
                lines.append("  ".join(["-" * w for w in widths] + ["-" * 14]))
        return lines

    def failure_lines(self) -> list[str]:
        lines: list[str] = []
        for r in self.results:
            if r.failure is None:
                continue
            label = {"fail": "FAILED", "xfail": "failed as expected (xfail)"}.get(
                r.status, r.status
            )
            how = ", ".join(t for t in (r.failure.kind, r.failure.tries_text) if t)
            lines += ["", f"=== {r.id}: {label} ({how}) ==="]
            lines.extend(r.failure.message.rstrip().splitlines())
            if r.hint:
                lines.append(f"hint: {r.hint}")
            if r.failure.reproduction:
                lines.append(
                    "minimal counterexample (Hypothesis shrank it):"
                    if r.failure.shrunk
                    else "counterexample (not shrunk):"
                )
                lines.extend("  " + line for line in r.failure.reproduction.rstrip().splitlines())
            elif r.failure.case is not None:
                lines.append("counterexample: " + describe_case_dict(r.failure.case))
        for r in self.results:
            if r.nan_payloads is not None:
                lines += ["", f"=== {r.id}: {_nan_text(r.nan_payloads)} ==="]
                lines.extend(r.nan_payloads.message.rstrip().splitlines())
                if r.nan_payloads.reproduction:
                    lines.append("the first such case:")
                    lines.extend(
                        "  " + line for line in r.nan_payloads.reproduction.rstrip().splitlines()
                    )
        for r in self.results:
            if r.status == "xpass":
                lines += [
                    "",
                    f"=== {r.id}: XPASS ===\nlisted in {self.xfails_path} as expected to fail, "
                    f"but it held on {r.cases} cases: remove it from the xfails file",
                ]
        return lines

    def summary_line(self) -> str:
        c = self.counts()
        verdict = "FAILED" if self.exit_status else "PASSED"
        strict = " (--strict: a failure)" if self.strict else ""
        words = {
            "xfail": "xfailed",
            "xpass": "xpassed (strict: a failure)",
            "unsupported": f"unsupported by the backend{strict}",
            "n/a": "not applicable",
            "skipped": "skipped",
        }
        parts = [f"{c['pass']} passed", f"{c['fail']} failed"]
        parts += [f"{c[status]} {word}" for status, word in words.items() if c[status]]
        # the seconds the JSON report holds (3 decimals), so both read alike once rounded
        seconds = round(self.seconds, 3)
        return f"{verdict}: {', '.join(parts)} of {len(self.results)} properties in {seconds:.1f} s"

    def render(self) -> str:
        lines = [*self.header_lines(), "", *self.table_lines(), *self.failure_lines(), ""]
        lines.append(self.summary_line())
        return "\n".join(lines) + "\n"


_STATUS_TEXT: Final = {s: s.upper() if s in ("fail", "xpass") else s for s in STATUSES}


def _fields(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    """``data``'s entries that are fields of the dataclass ``cls``, in field order."""
    return {f.name: data[f.name] for f in fields(cls) if f.name in data}


def _nan_text(nans: NanPayloads) -> str:
    return (
        f"NaN payloads differ from the oracle's in {nans.cases} case(s), a NaN where it has "
        "one: reported, not failed (--nan-payloads backend; --strict fails them)"
    )


def describe_case_dict(case: dict[str, Any]) -> str:
    """One line for a counterexample given as plain data."""
    keys = ("world_size", "shapes", "dim", "dtype", "contract")
    head = [f"{k.replace('_', ' ')} {case[k]}" for k in keys if k in case]
    rest = [f"{k.replace('_', ' ')} {v}" for k, v in case.items() if k not in keys]
    return ", ".join(head + rest)


def case_data(case: GatherCase) -> dict[str, Any]:
    """A ``GatherCase`` as plain JSON data (the counterexample in the report)."""
    return {
        "world_size": case.group_size,
        "shapes": [list(s) for s in case.shapes],
        "sizes": list(case.sizes),
        "dim": case.dim,
        "dtype": case.dtype,
        "contract": case.contract,
        "transport": case.transport,
        "sizes_passed": case.sizes_form,
        "memory": [case.memory_of(r) for r in range(case.group_size)],
        "values": case.values,
        "upstream": case.upstream,
        "requires_grad": case.requires_grad,
        "seed": case.seed,
        "payload_bytes": list(case.shard_bytes),
        "subgroup": None if case.members is None else list(case.members),
        "world": case.world_size,
        "initialized": case.initialized,
        "repr": repr(case),
    }

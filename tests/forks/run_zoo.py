"""Run every zoo member through ``python -m vargather check`` at default settings.

``python -m tests.forks.run_zoo [--twice] [NAME ...]`` from the repository root
prints, per member, its declared scope (its call template among it), verdict (exit
status, failing rows) and wall time: the numbers docs/conformance.md records. With
``--twice`` each member runs twice with the same seed and ``identical`` says whether
the two JSON reports are byte for byte the same (they hold no timings without
``--timings``). Extra ``check``
options go after ``--``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from tests.forks import ZOO, Fork

_FLAG = {
    "grad": "--grad",
    "dims": "--dims",
    "world_sizes": "--world-sizes",
    "sizes": "--sizes",
    "returns": "--returns",
    "emulate": "--emulate",
    "call": "--call",
}


def scope_args(scope: dict[str, Any]) -> list[str]:
    """A member's declared scope as ``check`` options."""
    args: list[str] = []
    for key, value in scope.items():
        if key == "requires_init":
            if value:
                args.append("--requires-init")
            continue
        if isinstance(value, tuple):
            value = ",".join(map(str, value))
        args += [_FLAG[key], str(value)]
    return args


def run(fork: Fork, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        argv = ["--impl", fork.ref, *scope_args(fork.scope), "--no-progress", "--json", path]
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "vargather", "check", *argv, *extra],
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.monotonic() - started
        text = ""
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
    report = json.loads(text) if text else None
    rows = {p["id"]: p["status"] for p in (report or {}).get("properties", [])}
    return {
        "json": text,
        "name": fork.name,
        "scope": " ".join(scope_args(fork.scope)),
        "exit": proc.returncode,
        "failed": sorted(k for k, v in rows.items() if v == "fail"),
        "unsupported": sorted(k for k, v in rows.items() if v == "unsupported"),
        "seconds": round(seconds, 1),
        "stderr": proc.stderr[-2000:] if report is None else "",
    }


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        names, extra = argv[:i], argv[i + 1 :]
    else:
        names = argv
    twice = "--twice" in names
    names = [n for n in names if n != "--twice"]
    for fork in ZOO:
        if names and fork.name not in names:
            continue
        first = run(fork, extra)
        text = first.pop("json")
        if twice:
            second = run(fork, extra)
            first["identical"] = second.pop("json") == text
            first["seconds_second_run"] = second["seconds"]
        print(json.dumps(first), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

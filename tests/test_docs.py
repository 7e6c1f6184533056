"""The docs runner: every code block of README.md and docs/*.md that shows output is run.

The convention (the README's Development section points here):

* a ```pycon block is a doctest (``>>>`` / ``...`` lines, then the expected output;
  ``...`` in the output matches anything). Without a marker it runs in the test
  process, torch.distributed not initialized. After ``<!-- docs-run: world=W -->`` it
  runs on every rank of a W-rank gloo world (``vargather.testing.get_pool(W)``) and
  every rank's output is compared; ``compare=0`` (or ``compare=0,2``) compares those
  ranks' output only, the others run the same lines unchecked.
* a ```console block holds ``$ COMMAND`` lines, each followed by its expected output
  (stdout and stderr together, ``...`` matching anything). Only ``python`` (this
  interpreter) and ``torchrun`` (``python -m torch.distributed.run``) are run, without
  a shell, in a temporary directory, with the checkout on ``PYTHONPATH``,
  ``OMP_NUM_THREADS=1`` and a 60 s timeout. The exit status must be 0, or the one
  given by ``<!-- docs-run: exit=N -->``.
* a ```python block after ``<!-- docs-run: file=NAME.py -->`` is written to that
  temporary directory as NAME.py, for the console blocks of the same document. Every
  ```python block must parse, and one that calls ``init_process_group`` must call
  ``destroy_process_group`` in a ``finally:`` (under torchrun a script that exits
  without it can die with SIGABRT at exit, hiding the real error).
* any other block must not look like output: a line starting with ``>>>``, ``$ ``,
  ``Traceback (most recent call last)`` or ``SomethingError:`` / ``SomethingError(``
  fails the test, naming the file and line. An excerpt of a measured run that is too
  slow to run here (a whole ``check`` run) is allowed only after
  ``<!-- docs-run: excerpt: WHY -->``, the reason spelled out.

Each block is one test item, ``test_doc_block[FILE:LINE:LANG]``, LINE being the line
of the opening fence. A console block repeated word for word with the same files in a
later page runs once, in the first (``first_alike``).
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vargather.testing import get_pool

from ._docs_fns import OPTIONFLAGS, DoctestResult, PyconBlock, run_pycon

ROOT = Path(__file__).resolve().parents[1]
COMMAND_TIMEOUT = 60.0  # seconds per console command

_MARKER = re.compile(r"^\s*<!--\s*docs-run:\s*(?P<body>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_OUTPUT_LOOKING = re.compile(
    r"^\s*(?:>>>(?: |$)|\$ |Traceback \(most recent call last\)|[A-Za-z_][\w.]*Error[:(])"
)
_SHELL_TOKENS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"})
_OPTIONS_BY_LANG = {"pycon": {"world", "compare"}, "console": {"exit"}, "python": {"file"}}


@dataclass(frozen=True)
class Marker:
    line: int
    options: dict[str, str] = field(default_factory=dict)
    excerpt: str | None = None  # the reason, for an excerpt marker


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str  # the info string's first word, lowercased ("" when none)
    lines: tuple[str, ...]  # the content, the fence's indentation removed
    marker: Marker | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}:{self.lang or 'text'}"

    @property
    def source(self) -> str:
        return "".join(line + "\n" for line in self.lines)


@dataclass
class Document:
    path: str
    blocks: list[Block]
    problems: list[str]  # markers that are malformed or attached to nothing


def parse_markdown(text: str, path: str) -> Document:
    """Split ``text`` into fenced blocks, each with the docs-run marker just before it."""
    blocks: list[Block] = []
    problems: list[str] = []
    pending: Marker | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _MARKER.match(line)
        if m:
            if pending is not None:
                problems.append(f"{path}:{pending.line}: docs-run marker not followed by a block")
            pending = _parse_marker(m.group("body"), i + 1, path, problems)
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and pending is not None:
                problems.append(f"{path}:{pending.line}: docs-run marker not followed by a block")
                pending = None
            i += 1
            continue
        indent, mark = len(fence.group("indent")), fence.group("fence")
        info = fence.group("info").strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(mark[0] * len(mark)) and not stripped.strip(mark[0]):
                break
            content = lines[i]
            body.append(content[min(indent, len(content) - len(content.lstrip(" "))) :])
            i += 1
        else:
            problems.append(f"{path}:{start}: code block never closed")
        lang = info.split()[0].lower() if info else ""
        blocks.append(Block(path, start, lang, tuple(body), pending))
        pending = None
        i += 1
    if pending is not None:
        problems.append(f"{path}:{pending.line}: docs-run marker not followed by a block")
    return Document(path, blocks, problems)


def _parse_marker(body: str, line: int, path: str, problems: list[str]) -> Marker:
    if body.startswith("excerpt"):
        reason = body[len("excerpt") :].lstrip(":").strip()
        if not reason:
            problems.append(f"{path}:{line}: an excerpt marker must say why it is not run")
        return Marker(line, excerpt=reason or "?")
    options: dict[str, str] = {}
    for token in body.split():
        key, eq, value = token.partition("=")
        if not eq or not value:
            problems.append(f"{path}:{line}: docs-run option {token!r} is not KEY=VALUE")
            continue
        options[key] = value
    return Marker(line, options)


def marker_problems(block: Block) -> list[str]:
    """What is wrong with ``block``'s marker for a block of its language."""
    marker, where = block.marker, f"{block.path}:{block.line}"
    if marker is None:
        return []
    if marker.excerpt is not None:
        if block.lang in ("pycon", "console"):
            return [f"{where}: a {block.lang} block is run; it cannot be an excerpt"]
        return []
    allowed = _OPTIONS_BY_LANG.get(block.lang, set())
    problems = [
        f"{where}: option {key!r} does not apply to a {block.lang or 'plain'} block"
        f" (allowed: {sorted(allowed)})"
        for key in marker.options
        if key not in allowed
    ]
    opts = marker.options
    if "world" in opts and not (opts["world"].isdigit() and 1 <= int(opts["world"]) <= 4):
        problems.append(f"{where}: world={opts['world']} is not a world size of 1 to 4")
    if "compare" in opts:
        if "world" not in opts:
            problems.append(f"{where}: compare= needs world=")
        elif not all(
            r.isdigit() and int(r) < int(opts["world"]) for r in opts["compare"].split(",")
        ):
            problems.append(f"{where}: compare={opts['compare']} names a rank not in the world")
    if "exit" in opts and not opts["exit"].isdigit():
        problems.append(f"{where}: exit={opts['exit']} is not an exit status")
    if "file" in opts and not re.fullmatch(r"[\w-]+\.py", opts["file"]):
        problems.append(f"{where}: file={opts['file']} is not a plain NAME.py")
    return problems


def output_looking_lines(block: Block) -> list[str]:
    """The lines of ``block`` that look like a prompt, a traceback or an error."""
    return [
        f"{block.path}:{block.line + 1 + k}: {line.strip()[:100]}"
        for k, line in enumerate(block.lines)
        if _OUTPUT_LOOKING.match(line)
    ]


def python_problems(block: Block) -> list[str]:
    """A ```python block must parse; init_process_group needs a finally: destroy."""
    try:
        tree = ast.parse(block.source)
    except SyntaxError as err:
        return [f"{block.path}:{block.line + (err.lineno or 0)}: does not parse: {err.msg}"]

    def calls(node: ast.AST, name: str) -> bool:
        return any(
            isinstance(n, ast.Call)
            and (
                (isinstance(n.func, ast.Name) and n.func.id == name)
                or (isinstance(n.func, ast.Attribute) and n.func.attr == name)
            )
            for n in ast.walk(node)
        )

    if not calls(tree, "init_process_group"):
        return []
    if any(
        isinstance(n, ast.Try) and any(calls(s, "destroy_process_group") for s in n.finalbody)
        for n in ast.walk(tree)
    ):
        return []
    return [
        f"{block.path}:{block.line}: calls init_process_group without "
        "`try: ... finally: dist.destroy_process_group()` (under torchrun a script exiting "
        "without it can die with SIGABRT at exit, masking the real error)"
    ]


def doc_paths() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def load_documents() -> list[Document]:
    return [
        parse_markdown(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())
        for p in doc_paths()
    ]


DOCUMENTS = load_documents()
BLOCKS = [b for d in DOCUMENTS for b in d.blocks]


# --- running the blocks ----------------------------------------------------------------------


def _world(block: Block) -> int | None:
    world = block.marker.options.get("world") if block.marker else None
    return int(world) if world else None


def run_pycon_block(block: Block) -> list[DoctestResult]:
    """One result per rank of the block's world; one result when it has none."""
    opts = block.marker.options if block.marker else {}
    compare = opts.get("compare")
    payload = PyconBlock(
        block.source,
        block.path,
        block.line + 1,
        tuple(int(r) for r in compare.split(",")) if compare else None,
    )
    world = _world(block)
    if world is None:
        return [run_pycon(None, payload)]
    return get_pool(world).run(run_pycon, payload)


@dataclass(frozen=True)
class Command:
    line: int
    argv: list[str]
    want: str


def console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    for k, line in enumerate(block.lines):
        lineno = block.line + 1 + k
        if line.startswith("$ "):
            argv = shlex.split(line[2:])
            shell = [t for t in argv if t in _SHELL_TOKENS]
            if shell or not argv:
                raise AssertionError(
                    f"{block.path}:{lineno}: console commands are run without a shell "
                    f"(found {shell or 'nothing to run'})"
                )
            commands.append(Command(lineno, argv, ""))
        elif not commands:
            raise AssertionError(f"{block.path}:{lineno}: console block must start with `$ `")
        else:
            last = commands[-1]
            commands[-1] = Command(last.line, last.argv, last.want + line.rstrip() + "\n")
    return commands


def _program(argv: list[str], where: str) -> list[str]:
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    if argv[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    raise AssertionError(f"{where}: only `python` and `torchrun` commands are run, not {argv[0]}")


def console_key(block: Block) -> tuple[object, ...]:
    """What a console block's run depends on and checks: its document's ``file=``
    blocks, its own text (commands and expected output) and its expected exit status."""
    doc = next(d for d in DOCUMENTS if d.path == block.path)
    files = tuple(
        sorted(
            (b.marker.options["file"], b.source)
            for b in doc.blocks
            if b.marker and "file" in b.marker.options
        )
    )
    status = block.marker.options.get("exit", "0") if block.marker else "0"
    return files, block.source, status


def first_alike(block: Block) -> Block:
    """The first console block of the docs with ``block``'s ``console_key``: a block
    repeated word for word in another page (getting-started repeats the README's
    torchrun example, script included) is run once, where it first appears, as the
    same command on the same files prints the same thing (a torchrun run costs ~10
    CPU-seconds)."""
    key = console_key(block)
    return next(b for b in BLOCKS if b.lang == "console" and console_key(b) == key)


def run_console_block(block: Block, doc: Document, workdir: Path) -> None:
    """Run ``block``'s commands in ``workdir``, next to ``doc``'s file= blocks."""
    for other in doc.blocks:
        if other.marker and "file" in other.marker.options:
            (workdir / other.marker.options["file"]).write_text(other.source, encoding="utf-8")
    expected_status = int(block.marker.options.get("exit", "0")) if block.marker else 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["COLUMNS"] = "100"
    checker = doctest.OutputChecker()
    for command in console_commands(block):
        where = f"{block.path}:{command.line}"
        proc = subprocess.run(
            _program(command.argv, where),
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        got = "".join(line.rstrip() + "\n" for line in proc.stdout.splitlines())
        if not checker.check_output(command.want, got, OPTIONFLAGS):
            example = doctest.Example(shlex.join(command.argv), command.want)
            diff = checker.output_difference(example, got, OPTIONFLAGS)
            pytest.fail(f"{where}: `$ {shlex.join(command.argv)}` printed\n{diff}", False)
        assert proc.returncode == expected_status, (
            f"{where}: `$ {shlex.join(command.argv)}` exited with {proc.returncode}, "
            f"the docs say {expected_status}; it printed:\n{proc.stdout}"
        )


# --- tables ------------------------------------------------------------------------------------

_TABLE_SEPARATOR = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$")


def _table_cells(row: str) -> int:
    """The cells of a Markdown table row (escaped pipes and code spans are one cell's)."""
    text = re.sub(r"`[^`]*`", "code", row.strip().replace("\\|", ""))
    return len(text.strip("|").split("|"))


def table_problems(text: str, path: str) -> list[str]:
    """Every table of ``text`` outside code fences must be whole: a header row, its
    separator row right after it, and every row with the header's number of cells.
    A blank line inside a table ends it there, so what follows renders as plain text:
    found as a run of rows without a separator."""
    problems: list[str] = []
    fenced = False
    run: list[tuple[int, str]] = []

    def close() -> None:
        if not run:
            return
        (first, head), *rows = run
        if not rows or not _TABLE_SEPARATOR.match(rows[0][1]):
            problems.append(
                f"{path}:{first}: table rows without a header and separator row (a blank "
                f"line inside a table cuts it here): {head.strip()[:80]}"
            )
        else:
            width = _table_cells(head)
            for number, row in rows:
                if _table_cells(row) != width:
                    problems.append(
                        f"{path}:{number}: {_table_cells(row)} cells in a table whose header "
                        f"has {width}: {row.strip()[:80]}"
                    )
        run.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.lstrip().startswith("|"):
            run.append((number, line))
        else:
            close()
    close()
    return problems


@pytest.mark.parametrize("path", doc_paths(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_table_is_whole(path: Path) -> None:
    problems = table_problems(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert not problems, "\n".join(problems)


def test_a_table_cut_by_a_blank_line_is_found() -> None:
    text = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n| x | y |\n|---|---|\n| 1 |\n"
    assert table_problems(text, "t.md") == [
        "t.md:5: table rows without a header and separator row (a blank line inside a "
        "table cuts it here): | 3 | 4 |",
        "t.md:9: 1 cells in a table whose header has 2: | 1 |",
    ]


# --- what the docs say of the catalogue ------------------------------------------------------


def _table_ids(text: str, header: str) -> list[str]:
    """The backticked ids of the first column of the table whose header row starts
    with ``header`` (a cell may list several: ``forward-float``, ``forward-half``)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    ids = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        found = re.findall(r"`([^`]+)`", first)
        assert found, f"a row of the {header!r} table without a backticked id: {line[:60]}"
        ids.extend(found)
    return ids


def test_the_docs_count_and_list_the_catalogues_properties() -> None:
    from vargather.testing import property_ids

    ids = list(property_ids())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    counts = [int(n) for n in re.findall(r"its (\d+) properties", readme)]
    assert counts == [len(ids)], f"README counts {counts}, the catalogue has {len(ids)}"
    conformance = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert _table_ids(conformance, "| id | what holds |") == ids
    suite = (ROOT / "docs" / "property-suite.md").read_text(encoding="utf-8")
    assert _table_ids(suite, "| property | claim |") == ids


def test_the_family_table_lists_each_collectives_catalogue() -> None:
    from vargather.testing.catalogues import property_ids
    from vargather.testing.collectives import FAMILY

    conformance = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    listed = _table_ids(conformance, "| family id | what holds |")
    for op in FAMILY:
        assert listed == list(property_ids(op)), op


def test_the_options_table_has_one_row_per_option_of_the_schema() -> None:
    """docs/conformance.md's options table: one row for each option the command line
    takes (``vargather.testing.schema``), none for an option it does not."""
    from vargather.testing import schema

    text = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| option | default |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    flags = {m for row in rows for m in re.findall(r"`(-{1,2}[a-z][a-z-]*)", row)}
    for option in schema.on(schema.CLI):
        hits = [row for row in rows if re.search(rf"`--{re.escape(option.name)}[` ]", row)]
        assert len(hits) == 1, f"--{option.name}: {len(hits)} rows of the options table"
    documented = {f.removeprefix("--") for f in flags if f.startswith("--")}
    known = {o.name for o in schema.on(schema.CLI)} | {"config", "no-config", "list", "no-progress"}
    assert documented <= known, f"rows for options the check does not take: {documented - known}"


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[d.path for d in DOCUMENTS])
def test_doc_markers(doc: Document) -> None:
    """Every docs-run marker is well-formed and sits just before a block it applies to."""
    problems = doc.problems + [p for b in doc.blocks for p in marker_problems(b)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block(block: Block, tmp_path: Path) -> None:
    """Run a pycon or console block; any other block must not look like output."""
    assert not marker_problems(block), "\n".join(marker_problems(block))
    if block.lang == "pycon":
        results = run_pycon_block(block)
        assert all(r.attempted for r in results), f"{block.id}: no `>>>` example in the block"
        by_report: dict[str, list[int]] = {}  # ranks that failed alike, reported once
        for rank, result in enumerate(results):
            if result.failed:
                by_report.setdefault(result.report, []).append(rank)
        assert not by_report, f"{block.id}: the block's output differs:\n" + "\n".join(
            (f"[rank(s) {ranks} of {len(results)}]\n" if _world(block) else "") + report
            for report, ranks in by_report.items()
        )
        return
    if block.lang == "console":
        doc = next(d for d in DOCUMENTS if d.path == block.path)
        first = first_alike(block)
        if first is not block:  # the very same command, files and output ran there
            assert console_key(first) == console_key(block)
            return
        run_console_block(block, doc, tmp_path)
        return
    if block.lang == "python":
        problems = python_problems(block)
        assert not problems, "\n".join(problems)
    if block.marker is not None and block.marker.excerpt is not None:
        return
    looking = output_looking_lines(block)
    assert not looking, (
        "output shown in a block that no test runs (make it a ```pycon or ```console "
        "block, or mark an excerpt of a measured run with <!-- docs-run: excerpt: WHY -->):\n"
        + "\n".join(looking)
    )


def test_the_docs_run_blocks_of_every_kind() -> None:
    """The convention is in use: a world-run pycon block, a console block, a file= block."""
    kinds = {
        "pycon on a world": any(
            b.lang == "pycon" and b.marker and "world" in b.marker.options for b in BLOCKS
        ),
        "console": any(b.lang == "console" for b in BLOCKS),
        "python file=": any(
            b.lang == "python" and b.marker and "file" in b.marker.options for b in BLOCKS
        ),
    }
    assert all(kinds.values()), f"no docs block of these kinds: {kinds}"


# --- the runner's own checks can fail -------------------------------------------------------------

_SAMPLE = """\
Text.

```bash
$ python -m vargather check
```

<!-- docs-run: excerpt -->
```
Traceback (most recent call last):
```

<!-- docs-run: world=9 exit=1 -->
```pycon
>>> 1 + 1
3
```

<!-- docs-run: world=2 -->
Prose between the marker and its block.

```python
import torch.distributed as dist
dist.init_process_group("gloo")
print(dist.get_rank())
dist.destroy_process_group()
```
"""


def test_the_runner_flags_what_it_should() -> None:
    doc = parse_markdown(_SAMPLE, "sample.md")
    bash, excerpt, pycon, python = doc.blocks
    assert output_looking_lines(bash) == ["sample.md:4: $ python -m vargather check"]
    assert doc.problems == [
        "sample.md:7: an excerpt marker must say why it is not run",
        "sample.md:18: docs-run marker not followed by a block",
    ]
    assert python.marker is None
    assert marker_problems(pycon) == [
        "sample.md:13: option 'exit' does not apply to a pycon block (allowed: ['compare', "
        "'world'])",
        "sample.md:13: world=9 is not a world size of 1 to 4",
    ]
    assert "without `try: ... finally" in python_problems(python)[0]
    result = run_pycon(None, PyconBlock(pycon.source, "sample.md", pycon.line + 1, None))
    assert (result.attempted, result.failed) == (1, 1)
    assert 'File "sample.md", line 14' in result.report
    assert "Got:\n    2" in result.report
    assert excerpt.marker is not None
    assert excerpt.marker.excerpt == "?"


def test_a_console_block_that_drifted_fails(tmp_path: Path) -> None:
    doc = parse_markdown('```console\n$ python -c "print(6 * 7)"\n41\n```\n', "drift.md")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)drift\.md:2: .*Expected:\n    41"):
        run_console_block(doc.blocks[0], doc, tmp_path)

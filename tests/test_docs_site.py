"""The documentation site's API reference covers every public name, without a build.

The reference pages (``docs/api*.md``) hold one autodoc (or ``py:``) directive per
public name; this test compares those directives with the ``__all__`` of every module
``docs/conf.py`` calls public, both ways: a name added to ``__all__`` without an entry
fails here, and so does an entry for a name that is not public (a rename left behind).
The site's build (``python -m sphinx -W -n ...``, the ``docs`` CI step) checks the same
through ``docs/conf.py``'s hook, and that each entry has a docstring.

The site's other promises checked here: every page is in the table of contents,
``docs/`` stays small (at most 35 files (docs/repro's standalone scripts among them), none over 1 MB), and the README, the changelog
and the performance page stay within their line limits.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import ModuleType

from ._by_path import import_path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_PAGES = sorted(DOCS.glob("api*.md"))

_DIRECTIVE = re.compile(
    r"^\.\. (?:auto(?:function|class|exception|data)|py:(?:function|class|data|exception))"
    r"::\s+(?P<name>[\w.]+)\s*$",
    re.MULTILINE,
)


def load_conf() -> ModuleType:
    """docs/conf.py as a module (it imports no Sphinx at its top level)."""
    return import_path("_vargather_docs_conf", DOCS / "conf.py")


def entries(text: str) -> list[str]:
    """The names that a reference page's ``eval-rst`` blocks document."""
    blocks = re.findall(r"^```\{eval-rst\}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    return [m.group("name") for block in blocks for m in _DIRECTIVE.finditer(block)]


def documented_names() -> list[str]:
    return [name for page in API_PAGES for name in entries(page.read_text(encoding="utf-8"))]


def test_the_public_modules_include_vargather_and_its_testing_kit() -> None:
    conf = load_conf()
    assert {"vargather", "vargather.testing"} <= set(conf.PUBLIC_MODULES)
    public = conf.public_names()
    assert "vargather.all_gather_v" in public
    assert "vargather.testing.get_pool" in public


def test_every_public_name_has_one_entry_in_the_api_pages() -> None:
    public = load_conf().public_names()
    listed = documented_names()
    missing = sorted(set(public) - set(listed))
    assert not missing, f"public names without an entry in docs/api*.md: {missing}"
    extra = sorted(set(listed) - set(public))
    assert not extra, f"entries in docs/api*.md for names not in any __all__: {extra}"
    twice = sorted(name for name, n in Counter(listed).items() if n > 1)
    assert not twice, f"names with more than one entry in docs/api*.md: {twice}"


def test_the_check_flags_a_missing_entry_and_an_empty_docstring() -> None:
    """The build's hook (docs/conf.py) can fail: what it reports for a public name that
    lost its entry, and for an entry whose docstring is empty."""
    conf = load_conf()
    public = ["vargather.a", "vargather.b", "vargather.c"]
    assert conf.missing_entries(public, {"vargather.a": True, "vargather.b": False}) == [
        "vargather.b has an entry in the API pages but no docstring",
        "vargather.c is public (in __all__) but has no entry in the API pages",
    ]
    assert conf.missing_entries(public, dict.fromkeys(public, True)) == []


def test_inline_code_links_by_qualified_name_and_by_an_unambiguous_bare_name() -> None:
    """docs/conf.py's ``api_targets``: what inline code links into the reference. A bare
    name links when one public name with an entry ends with it and it is not generic."""
    conf = load_conf()
    entries = {
        "vargather.all_gather_v": ("api", "vargather.all_gather_v"),
        "vargather.compat.all_gather": ("api", "vargather.compat.all_gather"),
        "vargather.testing.GatherCase": ("api-testing", "vargather.testing.GatherCase"),
        "vargather.Layout": ("api", "vargather.Layout"),
        "vargather.oracle.Layout": ("api", "vargather.oracle.Layout"),
    }
    public = [*entries, "vargather.testing.strategies.GatherCase", "vargather.no_entry"]
    assert conf.api_targets(public, entries) == {
        "vargather.all_gather_v": "vargather.all_gather_v",
        "all_gather_v": "vargather.all_gather_v",
        "vargather.compat.all_gather": "vargather.compat.all_gather",  # bare: generic
        "vargather.testing.GatherCase": "vargather.testing.GatherCase",
        "GatherCase": "vargather.testing.GatherCase",  # one entry, re-exported twice
        "vargather.Layout": "vargather.Layout",  # bare: two entries
        "vargather.oracle.Layout": "vargather.oracle.Layout",
    }


def test_the_entry_parser_reads_directives_in_rst_blocks_only() -> None:
    text = (
        "Prose naming .. autofunction:: vargather.not_this\n\n"
        "```{eval-rst}\n.. autofunction:: vargather.all_gather_v\n\n"
        ".. autodata:: vargather.CONTRACTS\n   :no-value:\n```\n\n"
        "```text\n.. autoclass:: vargather.nor_this\n```\n"
    )
    assert entries(text) == ["vargather.all_gather_v", "vargather.CONTRACTS"]


def test_every_page_is_in_the_table_of_contents() -> None:
    """Sphinx warns about a page outside every toctree; this names it without a build."""
    pages = {p.stem for p in DOCS.glob("*.md")}
    listed = set()
    for page in DOCS.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```\{toctree\}\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            for line in block.splitlines():
                if line.strip() and not line.startswith(":"):
                    # an entry is NAME, or TITLE <NAME>
                    listed.add(re.sub(r"^.*<(.+)>$", r"\1", line.strip()))
    assert pages - {"index"} <= listed, f"pages in no toctree: {sorted(pages - {'index'} - listed)}"
    assert listed <= pages, f"toctree entries without a page: {sorted(listed - pages)}"


def test_docs_stays_small() -> None:
    files = [
        p
        for p in DOCS.rglob("*")
        if p.is_file()
        and "_build" not in p.relative_to(DOCS).parts
        and "__pycache__" not in p.parts
    ]
    assert len(files) <= 35, f"docs/ holds {len(files)} files (at most 35)"
    big = [
        f"{p.relative_to(ROOT)} ({p.stat().st_size} B)" for p in files if p.stat().st_size > 2**20
    ]
    assert not big, f"files over 1 MB in docs/: {big}"


def test_the_read_in_ten_minutes_docs_stay_short() -> None:
    """The README, the changelog and the performance page keep the lengths issue 33
    set them (a user reads them in minutes; history lives in git)."""
    limits = {"README.md": 250, "CHANGELOG.md": 150, "docs/performance.md": 330}
    over = {
        name: n
        for name, limit in limits.items()
        if (n := len((ROOT / name).read_text(encoding="utf-8").splitlines())) > limit
    }
    assert not over, f"over their line limits {limits}: {over}"

"""The documentation site as a reader sees it: every built page rendered in headless
Chromium, at 1280 px and at a phone's 390 px.

The ``browser`` CI step (``scripts/ci_steps.sh browser``, after the ``docs`` step that
builds ``docs/_build/html``) runs this file; the README's test command leaves it out
(the ``browser`` marker, deselected by pyproject's ``addopts``). Run it alone with::

    python -m pytest -p no:xdist -m browser tests/test_docs_browser.py

It needs the ``browser`` extra (Playwright, which drives the browser) and a Chromium
(Debian's ``chromium`` package at ``/usr/bin/chromium``, or the executable named by
``VARGATHER_CHROMIUM``); Playwright never downloads a browser here. Without either it
skips with the reason, unless ``VARGATHER_REQUIRE_BROWSER=1`` (CI sets it), where the
skip is a failure. It reuses the build in ``docs/_build/html`` and builds it (the
``docs`` step's command) only when it is missing or older than a source under
``docs/`` or ``vargather/``.

Every HTML file of the build is served over HTTP on 127.0.0.1 and loaded once per
width; a page fails on

* text the theme or Sphinx shows as an error or a warning: docutils' system messages
  and problematic nodes, a stylesheet's ``::before``/``::after`` text saying ERROR or
  WARNING (furo's box over a ``{contents}`` directive), a Pygments lexing-error token;
* an element or a run of text reaching past the viewport's edges that is not inside a
  scrollable code block, table wrapper or math wrapper (furo's drawers, off-canvas
  by design, excepted);
* an image that did not load, a console error, an uncaught exception, a failed
  request or an HTTP error answer;
* a link, image or script of the site whose target is not a file of the build, or
  whose ``#anchor`` is not an ``id`` of the target page.

Screenshots of the index, the API reference and the performance page (every page
with ``VARGATHER_SCREENSHOT_PAGES=all``), full length, at both widths, go to
``VARGATHER_SCREENSHOTS`` (default ``docs/_build/screenshots``, which git ignores); CI
uploads them. The checks run on a synthetic page first
(``test_the_checks_catch_what_they_look_for``), so that each can be seen to fail.
"""

from __future__ import annotations

import contextlib
import functools
import html.parser
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pytest

from ._by_path import import_path

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Route

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BUILD = DOCS / "_build" / "html"
BUILD_COMMAND = [
    sys.executable,
    *("-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"),
    str(DOCS),
    str(BUILD),
]
WIDTHS = (1280, 390)
HEIGHT = 900
SCREENSHOT_PAGES = ("index", "api", "performance")
STALL_MS = 180_000
# Debian's Chromium refuses connections in a closed network unless its background
# traffic (component updates, sync, field trials) is off; none of it concerns a page.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# What one page shows, gathered in the page: run after its `load` event.
COLLECT_JS = r"""
() => {
  const vw = document.documentElement.clientWidth;
  const SCROLLERS = "pre, div.highlight, .table-wrapper, .math-wrapper";
  const describe = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (typeof el.className === "string" && el.className.trim())
      s += "." + el.className.trim().split(/\s+/).join(".");
    const text = (el.textContent || "").replace(/\s+/g, " ").trim().slice(0, 60);
    return text ? `${s} "${text}"` : s;
  };
  const scrolls = (el) => {
    const o = getComputedStyle(el).overflowX;
    return (o === "auto" || o === "scroll") && el.matches(SCROLLERS);
  };
  // furo's navigation and contents drawers: fixed, and wholly outside the viewport
  // until their button opens them
  const offCanvas = (el) => {
    if (getComputedStyle(el).position !== "fixed") return false;
    const r = el.getBoundingClientRect();
    return r.right <= 0 || r.left >= vw;
  };
  // screen-reader text (furo's .visually-hidden) is clipped to a 1 px box
  const visible = (el) => {
    const st = getComputedStyle(el);
    if (st.visibility === "hidden" || st.display === "none") return false;
    const r = el.getBoundingClientRect();
    return !(st.overflow === "hidden" && r.width <= 1 && r.height <= 1);
  };
  const past = (r) => r.width > 0 && r.height > 0 && (r.right > vw + 1 || r.left < -1);
  const overflow = [];
  const walk = (el) => {
    if (!visible(el) || offCanvas(el)) return;
    const r = el.getBoundingClientRect();
    if (past(r)) {
      overflow.push(`${describe(el)}: x ${Math.round(r.left)}..${Math.round(r.right)}`);
      return;
    }
    if (scrolls(el)) return;
    for (const node of el.childNodes) {
      if (node.nodeType === Node.TEXT_NODE && node.textContent.trim()) {
        const range = document.createRange();
        range.selectNodeContents(node);
        const t = range.getBoundingClientRect();
        if (past(t)) {
          const text = node.textContent.replace(/\s+/g, " ").trim().slice(0, 60);
          overflow.push(`text "${text}" in ${describe(el)}: x ${Math.round(t.left)}..${Math.round(t.right)}`);
        }
      } else if (node.nodeType === Node.ELEMENT_NODE) {
        walk(node);
      }
    }
  };
  walk(document.body);

  const errors = [];
  for (const el of document.querySelectorAll(
      ".system-message, .system-messages, .problematic, .highlight .err")) {
    if (visible(el)) errors.push(`${describe(el)}`);
  }
  for (const el of document.body.querySelectorAll("*")) {
    for (const pseudo of ["::before", "::after"]) {
      const content = getComputedStyle(el, pseudo).content;
      if (content && /\b(ERROR|WARNING)\b/i.test(content) && visible(el)) {
        errors.push(`${describe(el)}${pseudo}: ${content.slice(0, 120)}`);
      }
    }
  }

  const images = [];
  for (const img of document.images) {
    if (!img.complete || img.naturalWidth === 0) images.push(img.currentSrc || img.src);
  }
  const links = [];
  for (const a of document.querySelectorAll("a[href]")) links.push(a.href);
  for (const el of document.querySelectorAll("img[src], script[src]")) links.push(el.src);
  for (const el of document.querySelectorAll("link[href]")) links.push(el.href);
  return {overflow, errors, images, links};
}
"""


@dataclass
class PageReport:
    """What one page showed at one width."""

    page: str
    width: int
    overflow: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<{self.page} at {self.width} px>"


# --- where the browser comes from --------------------------------------------------------------


def _unavailable(reason: str) -> None:
    if os.environ.get("VARGATHER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"VARGATHER_REQUIRE_BROWSER=1, but {reason}", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str | None:
    """The Chromium to drive: ``VARGATHER_CHROMIUM``, else Debian's, else one on PATH."""
    named = os.environ.get("VARGATHER_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    return shutil.which("chromium")


# --- the site: built, served --------------------------------------------------------------------


def _newest_source() -> float:
    sources = [
        p
        for base in (DOCS, ROOT / "vargather")
        for p in base.rglob("*")
        if p.is_file() and "_build" not in p.parts and "__pycache__" not in p.parts
    ]
    return max(p.stat().st_mtime for p in sources)


def conf_newer(stamp: Path) -> bool:
    return (DOCS / "conf.py").stat().st_mtime > stamp.stat().st_mtime


def _terminal(config: pytest.Config, line: str) -> None:
    """A line on the terminal, past pytest's capture (the step's log keeps the times)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="module")
def site(request: pytest.FixtureRequest) -> Path:
    """``docs/_build/html``, built first if missing or older than its sources."""
    stamp = BUILD / ".buildinfo"
    if stamp.is_file() and stamp.stat().st_mtime >= _newest_source():
        _terminal(request.config, f"browser: reusing the site built in {BUILD.relative_to(ROOT)}")
        return BUILD
    # Sphinx rebuilds what changed, but not for a change of conf.py's code (its hooks):
    # then every page is written afresh (-E)
    fresh = ["-E"] if not stamp.is_file() or conf_newer(stamp) else []
    start = time.monotonic()
    built = subprocess.run(
        [*BUILD_COMMAND, *fresh], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, f"the site does not build:\n{built.stdout}\n{built.stderr}"
    _terminal(
        request.config,
        f"browser: built the site into {BUILD.relative_to(ROOT)} in "
        f"{time.monotonic() - start:.1f} s{' (afresh: conf.py changed)' if fresh else ''}",
    )
    return BUILD


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """``directory`` served over HTTP on 127.0.0.1: its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def built_pages(site: Path) -> list[str]:
    """Every HTML file of the build, relative to it (the theme's assets excepted)."""
    return sorted(
        p.relative_to(site).as_posix()
        for p in site.rglob("*.html")
        if p.relative_to(site).parts[0] != "_static"
    )


# --- one page after another, in the browser ---------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable(
            "Playwright is not installed (the browser extra: "
            "pip install -c constraints.txt -e '.[browser]')"
        )
    path = chromium_path()
    if path is None:
        _unavailable("no Chromium: apt-get install chromium, or VARGATHER_CHROMIUM=PATH")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def visit(
    browser: Browser,
    base: str,
    pages: list[str],
    width: int,
    screenshots: Path | None = None,
    shoot: tuple[str, ...] = (),
) -> list[PageReport]:
    """Load each page at ``width`` and report what it shows. A request that leaves
    ``base`` is refused and reported: the site must be whole without the network.
    Full-length screenshots of the pages whose stem is in ``shoot`` (or every page,
    with ``"all"``) go to ``screenshots``."""
    context = browser.new_context(viewport={"width": width, "height": HEIGHT})
    # a guard against a page that hangs, not a time limit on a page: each takes a second
    # or two, but a machine shared with a test suite can stall for tens of seconds
    context.set_default_timeout(STALL_MS)
    seen: list[str] = []

    def refuse(route: Route) -> None:
        seen.append(f"request outside the site: {route.request.url}")
        route.abort()

    context.route(lambda url: not url.startswith(base), refuse)
    tab = context.new_page()
    tab.on(
        "console",
        lambda m: seen.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    tab.on("pageerror", lambda e: seen.append(f"uncaught exception: {e}"))
    tab.on("requestfailed", lambda r: seen.append(f"request failed: {r.url} ({r.failure})"))
    tab.on(
        "response", lambda r: seen.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None
    )
    reports = []
    try:
        for name in pages:
            seen.clear()
            tab.goto(base + name, wait_until="load")
            shown = tab.evaluate(COLLECT_JS)
            reports.append(
                PageReport(
                    page=name,
                    width=width,
                    overflow=shown["overflow"],
                    errors=shown["errors"],
                    console=list(seen),
                    images=shown["images"],
                    links=shown["links"],
                )
            )
            stem = name.removesuffix(".html")
            if screenshots is not None and ("all" in shoot or stem in shoot):
                screenshots.mkdir(parents=True, exist_ok=True)
                shot = screenshots / f"{stem.replace('/', '__')}-{width}.png"
                tab.screenshot(path=shot, full_page=True)
    finally:
        context.close()
    return reports


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is not None and (key == "id" or (tag == "a" and key == "name")):
                self.ids.add(value)


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    parser = _Anchors()
    parser.feed(page.read_text(encoding="utf-8"))
    return frozenset(parser.ids)


def broken_links(site: Path, base: str, reports: list[PageReport]) -> list[str]:
    """Every link, image, script and stylesheet of ``reports`` that points into the site
    at a file the build lacks, or at an ``#anchor`` its target page lacks."""
    broken = set()
    for report in reports:
        for url in report.links:
            if not url.startswith(base):
                continue  # another site, mailto:, javascript: (not followed: no network)
            parts = urlsplit(url)
            path = unquote(parts.path).removeprefix(urlsplit(base).path)
            target = site / path
            if not path or path.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                broken.add(f"{report.page}: {url} (no {target.relative_to(site)} in the build)")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and unquote(parts.fragment) not in anchors(target)
            ):
                broken.add(f"{report.page}: {url} (no id {parts.fragment!r} in {path})")
    return sorted(broken)


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    with serve(site) as base:
        yield base


@pytest.fixture(scope="module")
def reports(
    request: pytest.FixtureRequest, browser: Browser, site: Path, served: str
) -> dict[int, list[PageReport]]:
    """Every built page, at every width (loaded once: pytest keeps a module fixture's
    error too, so a page that never loads fails each test without another try)."""
    pages = built_pages(site)
    shots = Path(os.environ.get("VARGATHER_SCREENSHOTS") or DOCS / "_build" / "screenshots")
    shoot = tuple(
        os.environ.get("VARGATHER_SCREENSHOT_PAGES", ",".join(SCREENSHOT_PAGES)).split(",")
    )
    start = time.monotonic()
    seen = {width: visit(browser, served, pages, width, shots, shoot) for width in WIDTHS}
    _terminal(
        request.config,
        f"browser: {len(pages)} pages at {' and '.join(map(str, WIDTHS))} px in "
        f"{time.monotonic() - start:.1f} s; screenshots in {shots}",
    )
    return seen


def _listing(found: list[str]) -> str:
    return "\n  ".join(["", *found])


# --- the tests ---------------------------------------------------------------------------------


def test_the_checks_catch_what_they_look_for(browser: Browser, tmp_path: Path) -> None:
    """A synthetic page with one of each defect, and the layouts that are fine beside
    them: every check flags its defect and nothing else."""
    (tmp_path / "other.html").write_text('<p id="here">x</p>', encoding="utf-8")
    (tmp_path / "index.html").write_text(SYNTHETIC, encoding="utf-8")
    with serve(tmp_path) as base:
        [report] = visit(browser, base, ["index.html"], 390)
        broken = broken_links(tmp_path, base, [report])
    assert [o.split(" ")[0] for o in report.overflow] == ["table#wide", "text"], report.overflow
    assert "section#long" in report.overflow[1], report.overflow
    assert len(report.errors) == 3, report.errors
    assert any(
        e.startswith("div.contents") and '::before: "ERROR: a table of contents' in e
        for e in report.errors
    ), report.errors
    assert any(e.startswith("div.system-message") for e in report.errors), report.errors
    assert any(e.startswith("span.problematic") for e in report.errors), report.errors
    assert report.images == [f"{base}missing.png"], report.images
    assert any("console error: boom" in c for c in report.console), report.console
    assert any("uncaught exception" in c and "bang" in c for c in report.console), report.console
    assert any(c.startswith("HTTP 404") and "missing.png" in c for c in report.console)
    assert any(
        "request outside the site: https://example.invalid/x.js" in c for c in report.console
    )
    assert broken == [
        f"index.html: {base}missing.html (no missing.html in the build)",
        f"index.html: {base}missing.png (no missing.png in the build)",
        f"index.html: {base}other.html#gone (no id 'gone' in other.html)",
    ], broken


SYNTHETIC = (
    """<!doctype html>
<html><head><meta name="viewport" content="width=device-width">
<style>
  body { margin: 0; }
  .contents::before { content: "ERROR: a table of contents is unnecessary"; }
  .drawer { position: fixed; top: 0; left: -20em; width: 15em; }
  .table-wrapper, div.highlight { overflow-x: auto; }
  pre { overflow: auto; }
</style>
<script src="https://example.invalid/x.js"></script>
</head><body>
<div class="drawer"><p>off-canvas navigation, opened by a button</p></div>
<span style="position: absolute; left: 380px; width: 1px; height: 1px; overflow: hidden;
  clip: rect(0, 0, 0, 0); white-space: nowrap">a screen reader's label, clipped</span>
<div class="content" style="overflow-x: auto">
<div class="contents"><p>contents</p></div>
<div class="system-message"><p>Unknown directive type</p></div>
<p><span class="problematic">`broken`_</span></p>
<table id="wide"><tr><td style="min-width: 1200px">wide</td></tr></table>
<div class="table-wrapper"><table><tr><td style="min-width: 1200px">wrapped</td></tr></table></div>
<div class="highlight"><pre>a_code_line_far_longer_than_a_phone_is_wide_"""
    + "x" * 200
    + """</pre></div>
<section id="long" style="white-space: nowrap">a line of prose that does not wrap at all and runs past the edge of a phone screen</section>
<img src="missing.png" alt="a plot">
<a href="other.html#here">fine</a> <a href="other.html#gone">gone</a> <a href="missing.html">missing</a>
<a href="https://example.invalid/">another site</a>
</div>
<script>console.error("boom");</script>
<script>throw new Error("bang");</script>
</body></html>
"""
)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_shows_an_error_or_a_warning(
    reports: dict[int, list[PageReport]], width: int
) -> None:
    found = [f"{r.page}: {e}" for r in reports[width] for e in r.errors]
    if found:
        pytest.fail(f"error or warning text shown at {width} px:{_listing(found)}", pytrace=False)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_is_wider_than_the_viewport(
    reports: dict[int, list[PageReport]], width: int
) -> None:
    found = [f"{r.page}: {o}" for r in reports[width] for o in r.overflow]
    if found:
        pytest.fail(
            f"past the edge of a {width} px viewport, outside a scrollable code block or "
            f"table wrapper:{_listing(found)}",
            pytrace=False,
        )


@pytest.mark.parametrize("width", WIDTHS)
def test_images_load_and_the_console_stays_clean(
    reports: dict[int, list[PageReport]], width: int
) -> None:
    found = [f"{r.page}: image did not load: {i}" for r in reports[width] for i in r.images]
    found += [f"{r.page}: {c}" for r in reports[width] for c in r.console]
    if found:
        pytest.fail(f"at {width} px:{_listing(found)}", pytrace=False)


def test_internal_links_and_anchors_resolve(
    reports: dict[int, list[PageReport]], site: Path, served: str
) -> None:
    broken = broken_links(site, served, reports[WIDTHS[0]])
    if broken:
        pytest.fail(f"links into the site that lead nowhere:{_listing(broken)}", pytrace=False)


_ARTICLE = re.compile(r"<article\b.*?</article>", re.S)
_NOT_LINKED_HERE = re.compile(r"<(h[1-6]|figcaption|caption)\b.*?</\1>", re.S)
_CODE = re.compile(
    r'(?:<a [^>]*href="(?P<href>[^"]*)"[^>]*>)?'
    r'<code class="docutils literal notranslate"><span class="pre">(?P<text>[\w.]+)(?:\(\))?</span></code>'
)


def test_public_names_in_the_guides_link_into_the_api_reference(site: Path) -> None:
    """Inline code that is exactly a public name (docs/conf.py's ``api_targets``) is a
    link to the name's entry on every page but the reference's own (headings and
    captions aside): the build's ``doctree-resolved`` hook makes the links."""
    conf = import_path("_vargather_docs_conf", DOCS / "conf.py")
    entries = {
        anchor: (page.stem, anchor)
        for page in site.glob("api*.html")
        for anchor in re.findall(r'<dt class="sig[^"]*" id="(vargather[\w.]*)"', page.read_text())
    }
    targets = conf.api_targets(conf.public_names(), entries)
    assert "all_gather_v" in targets, "the API reference has no entry for all_gather_v"
    unlinked, wrong, linked = [], [], 0
    for page in sorted(site.glob("*.html")):
        if page.stem.startswith("api") or page.stem in ("genindex", "search"):
            continue
        text = page.read_text(encoding="utf-8")
        article = _NOT_LINKED_HERE.sub("", "".join(_ARTICLE.findall(text)))
        for match in _CODE.finditer(article):
            name = targets.get(match["text"])
            if name is None:
                continue
            expected = "{}.html#{}".format(*entries[name])
            if match["href"] is None:
                unlinked.append(f"{page.name}: {match['text']}")
            elif match["href"] != expected:
                wrong.append(f"{page.name}: {match['text']} -> {match['href']} (not {expected})")
            else:
                linked += 1
    assert not unlinked, f"public names not linked to their entries:{_listing(unlinked)}"
    assert not wrong, f"public names linked elsewhere:{_listing(wrong)}"
    assert linked, "no page links a public name into the API reference"

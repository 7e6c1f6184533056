"""Sphinx configuration of vargather's documentation site.

Build it (after ``pip install -c constraints.txt -e ".[docs]"``)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The pages are Markdown (myst-parser), the theme is furo, the API reference comes from
the docstrings (autodoc, Google-style sections through napoleon). The reference pages
list every public name of the modules in ``PUBLIC_MODULES`` with one autodoc
directive each; ``_check_public_names`` turns a public name without an entry, or with
an empty docstring, into a warning, which ``-W`` makes a failed build
(``tests/test_docs_site.py`` checks the same lists without building).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Iterable
from typing import Any

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import vargather  # noqa: E402  # after the path: the checkout's package, not another

project = "vargather"
author = "the vargather authors"
copyright = "the vargather authors, MIT licence"  # Sphinx's own name
release = vargather.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"vargather {release}"
# A few additions to furo's stylesheet (what the browser test found at a phone's width).
html_static_path = ["_static"]
html_css_files = ["vargather.css"]

# Markdown: heading anchors for links like ``conformance.md#the-family---op``.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc and napoleon: Google-style ``Args:`` / ``Returns:`` / ``Raises:`` sections.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
# Every public function states its shapes and its gradient in sections of these names.
napoleon_custom_sections = ["Shapes", "Gradient"]

# Nitpicky mode (-n) resolves every cross-reference. Names of torch, of the standard
# library's typing helpers and the package's private aliases have no page here (no
# intersphinx: the build must not need the network), so they are not references.
nitpick_ignore_regex = [
    ("py:.*", r"torch(\..*)?"),
    ("py:.*", r"(typing|typing_extensions|collections\.abc|datetime|enum|types)\..*"),
    ("py:.*", r"hypothesis(\..*)?"),
    ("py:.*", r"(numpy|np|pytest|_pytest)(\..*)?"),
    ("py:.*", r"vargather\.(\w+\.)*_\w+.*"),
    ("py:.*", r"_\w+.*"),
    ("py:.*", r"(Literal|Final|Any|Callable|Sequence|Mapping|Iterator|Iterable|TypeVar)"),
    ("py:.*", r"(T|P|R|Self|NoneType|Ellipsis|ellipsis)"),
    ("py:.*", r"(ProcessGroup|DeviceMesh|Tensor|dtype|device|timedelta|SearchStrategy)"),
    ("py:.*", r"(Sizes|SplitSizes|GroupLike|Timeout|MeshDim|Shapes|DimArg|SizesArg)"),
    # The type variables of ``RankPool.run`` and two records the kit returns but does
    # not export (their fields are described where they are returned).
    ("py:.*", r"vargather\.testing\.pool(_types)?\.[PR]"),
    ("py:.*", r"vargather\.testing\.(family\.FamilyFailure|cases\.Expected)"),
    # ``Property.catalogue``'s protocol, imported for typing only (``catalogues``).
    ("py:.*", r"Catalogue"),
]

# --- every public name has an entry -----------------------------------------------------------

#: The modules whose ``__all__`` the API reference must cover, name by name.
PUBLIC_MODULES = (
    "vargather",
    "vargather.oracle",
    "vargather.compat",
    "vargather.testing.strategies",
    "vargather.testing",
)


def public_names(modules: Iterable[str] = PUBLIC_MODULES) -> list[str]:
    """Every public name, qualified: ``vargather.all_gather_v``, ..."""
    return [f"{m}.{name}" for m in modules for name in importlib.import_module(m).__all__]


def missing_entries(public: Iterable[str], documented: dict[str, bool]) -> list[str]:
    """What is wrong with the reference: a public name without an entry, an entry with
    an empty docstring. ``documented`` maps each name autodoc rendered to whether its
    docstring had any text."""
    problems = []
    for name in public:
        if name not in documented:
            problems.append(f"{name} is public (in __all__) but has no entry in the API pages")
        elif not documented[name]:
            problems.append(f"{name} has an entry in the API pages but no docstring")
    return problems


def _record(app: Any, domain: str, objtype: str, content: Any) -> None:
    """Note each Python object description and whether its own text (not its members')
    says anything: autodoc's entries and hand-written ones alike."""
    from sphinx import addnodes

    if domain != "py":
        return
    signature = content.parent[0]
    module, fullname = signature.get("module"), signature.get("fullname")
    if not fullname:
        return
    name = f"{module}.{fullname}" if module else fullname
    text = "".join(c.astext() for c in content.children if not isinstance(c, addnodes.desc))
    documented = app.env.__dict__.setdefault("vargather_documented", {})
    documented[name] = (app.env.docname, bool(text.strip()))


def _purge(app: Any, env: Any, docname: str) -> None:
    documented = env.__dict__.get("vargather_documented", {})
    for name in [n for n, (doc, _) in documented.items() if doc == docname]:
        del documented[name]


def _check_public_names(app: Any, env: Any) -> None:
    from sphinx.util import logging

    logger = logging.getLogger("vargather.docs")
    documented = {n: has for n, (_, has) in env.__dict__.get("vargather_documented", {}).items()}
    for problem in missing_entries(public_names(), documented):
        logger.warning(problem)


def _drop_type_docstrings(
    app: Any, what: str, name: str, obj: object, options: Any, lines: list[str]
) -> None:
    """A constant (a ``str``, a ``tuple``, an ``Implementation``) has no docstring of its
    own: autodoc would show its type's. Its entry's text is the directive's content."""
    if what not in ("data", "attribute") or not lines:
        return
    own = inspect.getdoc(type(obj))
    if own and "\n".join(lines).strip() == own.strip():
        lines.clear()


# --- inline code naming a public object links to its entry ------------------------------------

#: Public names whose bare form in a page means something else as often as the object:
#: the seed's ``all_gather`` (torch's collective), ``exists``, ``expected``, ``dtypes``.
#: Written qualified (``vargather.compat.all_gather``) they still link.
GENERIC_NAMES = frozenset({"all_gather", "exists", "expected", "dtypes"})


def api_targets(public: Iterable[str], entries: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The inline code that links into the reference, mapped to the entry's qualified name:
    every public name with an entry (``entries``: qualified name to page and anchor),
    qualified, and bare where exactly one public name with an entry has that last part
    and it is not in ``GENERIC_NAMES``. ``name()`` links as ``name`` does."""
    qualified = sorted(name for name in public if name in entries)
    by_last: dict[str, set[str]] = {}
    for name in qualified:
        by_last.setdefault(name.rsplit(".", 1)[1], set()).add(
            entries[name][0] + "#" + entries[name][1]
        )
    targets = {name: name for name in qualified}
    for name in qualified:
        last = name.rsplit(".", 1)[1]
        if last not in GENERIC_NAMES and len(by_last[last]) == 1:
            targets.setdefault(last, name)
    return targets


def _link_api_names(app: Any, doctree: Any, docname: str) -> None:
    """Inline code that is exactly a public name (``all_gather_v``, ``GatherResult``,
    ``vargather.testing.get_pool()``) becomes a link to its entry in the API reference,
    on every page; not in headings, signatures, existing links, or the entry's own text."""
    from docutils import nodes
    from sphinx import addnodes

    py = app.env.get_domain("py")
    entries = {name: (obj.docname, obj.node_id) for name, obj in py.objects.items()}
    targets = api_targets(public_names(), entries)
    skip = (nodes.reference, nodes.title, nodes.caption, addnodes.desc_signature)
    for literal in list(doctree.findall(nodes.literal)):
        name = targets.get(literal.astext().strip().removesuffix("()"))
        if name is None:
            continue
        page, anchor = entries[name]
        parent, inside_own_entry, blocked = literal.parent, False, False
        while parent is not None:
            blocked = blocked or isinstance(parent, skip)
            if isinstance(parent, addnodes.desc) and any(
                anchor in sig.get("ids", []) for sig in parent.children[:1]
            ):
                inside_own_entry = True
            parent = parent.parent
        if blocked or inside_own_entry:
            continue
        uri = app.builder.get_relative_uri(docname, page) + "#" + anchor
        link = nodes.reference("", "", internal=True, refuri=uri, reftitle=name)
        literal.replace_self(link)
        link.append(literal)


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", _drop_type_docstrings)
    app.connect("object-description-transform", _record)
    app.connect("env-purge-doc", _purge)
    app.connect("env-check-consistency", _check_public_names)
    app.connect("doctree-resolved", _link_api_names)
    return {"parallel_read_safe": False}

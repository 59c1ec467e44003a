"""The documentation site (docs/, Sphinx + myst-nb) builds offline with warnings as errors, every page is in
a table of contents, every tutorial page shows its figure inline, and no page loads anything from a network.

One build per test session (the ``site`` fixture of tests/conftest.py, 3.5 min on a quiet 2-core machine, 10 at load 10: it
executes every tutorial as a notebook); the tutorials' tests then read the numbers of those executions.
"""
from __future__ import annotations

import glob
import os
import pickle
import re

import pytest

import tutorial_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TUTORIALS = sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(ROOT, "tutorials", "t[0-9][0-9]_*.py")))

# what a page loads (not the links a reader may follow): script/img/iframe/source src, link href, CSS url()
_LOADS = re.compile(r"<(?:script|img|iframe|source|audio|video|embed)\b[^>]*?\bsrc=[\"']([^\"']+)"
                    r"|<link\b[^>]*?\bhref=[\"']([^\"']+)|url\(\s*[\"']?([^\"')]+)|@import\s+[\"']([^\"']+)", re.I)


def remote_loads(text: str) -> list[str]:
    """The addresses in an HTML or CSS text that a browser would fetch from a network."""
    found = [next(g for g in m.groups() if g) for m in _LOADS.finditer(text)]
    return [u for u in found if re.match(r"(?:https?:)?//", u.strip(), re.I)]


def _saves_results(name: str) -> bool:
    with open(os.path.join(ROOT, "tutorials", f"{name}.py"), encoding="utf-8") as f:
        return "save_results(" in f.read()


def _reached(includes: dict, root: str) -> set:
    """The pages reachable from ``root`` through the toctrees (``includes``: page -> the pages it lists)."""
    reached, todo = set(), [root]
    while todo:
        doc = todo.pop()
        if doc not in reached:
            reached.add(doc)
            todo.extend(includes.get(doc, []))
    return reached


def _html(site, docname: str) -> str:
    with open(os.path.join(site.html, f"{docname}.html"), encoding="utf-8") as f:
        return f.read()


def test_the_site_builds_offline_with_warnings_as_errors(site):
    assert site.returncode == 0, site.log[-8000:]
    assert os.path.isfile(os.path.join(site.html, "index.html"))


def test_every_page_of_docs_is_in_a_table_of_contents(site):
    """Every .md / .rst file under docs/ and every tutorial is a page of the site, reachable from the root
    page through the toctrees (read from the build's environment, independently of Sphinx's warning)."""
    with open(os.path.join(site.doctrees, "environment.pickle"), "rb") as f:
        env = pickle.load(f)
    sources = set()
    for path in glob.glob(os.path.join(DOCS, "**", "*"), recursive=True):
        rel = os.path.relpath(path, DOCS)
        if rel.split(os.sep)[0] in ("_build", "_ext") or not rel.endswith((".md", ".rst")):
            continue
        sources.add(os.path.splitext(rel)[0].replace(os.sep, "/"))
    sources |= {f"tutorials/{name}" for name in TUTORIALS}
    assert sources - set(env.found_docs) == set()          # no page left out of the build
    assert set(env.found_docs) - _reached(env.toctree_includes, env.config.root_doc) == set()
    # the check itself: without the tutorials' index, its pages are found unlisted
    includes = {k: v for k, v in env.toctree_includes.items() if k != "tutorials/index"}
    assert {f"tutorials/{name}" for name in TUTORIALS} <= set(env.found_docs) - _reached(includes, env.config.root_doc)


@pytest.mark.parametrize("name", TUTORIALS)
def test_each_tutorial_page_shows_its_figure_inline(site, name):
    """The executed notebook's figure is in the page (an <img> of a PNG in the site's _images), and the
    execution wrote the tutorial's figure and numbers into REFOPT_TUTORIAL_OUT, which the tutorials' tests
    read instead of running the tutorial again."""
    if not _saves_results(name):
        pytest.skip(f"tutorials/{name}.py saves no results (save_results): not a notebook tutorial of the "
                    f"tutorial contract, no inline figure expected")
    assert site.returncode == 0, site.log[-4000:]
    page = _html(site, f"tutorials/{name}")
    cells = page.split('class="cell_output')[1:]
    images = [src for cell in cells for src in re.findall(r"<img\b[^>]*?\bsrc=\"([^\"]+)\"", cell)]
    assert images, f"no inline image in the executed tutorials/{name}.html"
    for src in images:
        path = os.path.normpath(os.path.join(site.html, "tutorials", src))
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC, src
    for ext in ("png", "json"):
        assert os.path.isfile(os.path.join(site.tutorial_out, f"{name}.{ext}"))
    assert tutorial_runs.run(name, "/nonexistent")[0] == site.tutorial_out


def test_no_page_loads_anything_from_a_network(site):
    assert site.returncode == 0, site.log[-4000:]
    files = glob.glob(os.path.join(site.html, "**", "*.html"), recursive=True)
    files += glob.glob(os.path.join(site.html, "_static", "**", "*.css"), recursive=True)
    remote = {}
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            urls = remote_loads(f.read())
        if urls:
            remote[os.path.relpath(path, site.html)] = urls
    assert remote == {}
    # the check itself finds a CDN script, a protocol-relative stylesheet and a CSS font, not a plain link
    sample = ('<script src="https://cdn.example/mathjax.js"></script><link rel="stylesheet" href="//x.example/a.css">'
              '<style>@font-face{src:url("https://f.example/a.woff")}</style><a href="https://example.org">x</a>')
    assert remote_loads(sample) == ["https://cdn.example/mathjax.js", "//x.example/a.css", "https://f.example/a.woff"]


def test_math_renders_with_the_packaged_mathjax(site):
    """A page with math loads MathJax from the site's own _static folder, and the file is there."""
    assert site.returncode == 0, site.log[-4000:]
    page = _html(site, "conventions")
    assert 'class="math' in page or "\\(" in page
    srcs = re.findall(r"<script\b[^>]*?\bsrc=\"([^\"]*mathjax[^\"]*)\"", page, re.I)
    assert srcs and all(not re.match(r"(?:https?:)?//", s) for s in srcs)
    for s in srcs:
        assert os.path.isfile(os.path.normpath(os.path.join(site.html, s.split("?")[0])))

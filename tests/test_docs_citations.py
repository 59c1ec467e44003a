"""Docs and docstrings cite only what a user has, and say what they cite."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _shipped_text():
    files = [*ROOT.glob("refopt/**/*.py"), *ROOT.glob("models/*.py"), *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]
    for f in files:
        yield f.relative_to(ROOT).as_posix(), f.read_text(encoding="utf-8")


def test_no_citation_of_unshipped_files():
    bad = [rel for rel, text in _shipped_text() if "STYLE.md" in text or "../seeds" in text]
    assert bad == []


def test_the_source_documents_are_explained_once():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    seeds = (ROOT / "docs/reference/SOURCES.md").read_text(encoding="utf-8")
    for text in (readme, seeds):
        assert re.search(r"blog post", text) and re.search(r"(not|never) a random seed", " ".join(text.split()))


def test_the_site_states_the_default_compare_run_time():
    page = " ".join((ROOT / "docs/compare.md").read_text(encoding="utf-8").split())
    assert "COMPARE_TIME" not in page
    assert re.search(r"default `refopt compare` .{0,80}takes about \d+ min", page)


def test_bfloat16_unit_roundoff_is_2_to_the_minus_8():
    torch = pytest.importorskip("torch")
    u = torch.finfo(torch.bfloat16).eps / 2          # eps = 2^-7 (7 stored bits), u = eps / 2
    assert u == 2.0 ** -8
    for rel in ("docs/crosscheck.md", "refopt/conventions/_spec.py"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert "2^-9" not in text and "2^-8" in text, rel

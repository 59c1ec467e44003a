"""Sphinx helpers of refopt's documentation site (loaded by docs/conf.py).

- :func:`read_percent`: a tutorial's jupytext percent file as a notebook for myst-nb, marked as Python (the
  code cells get Python highlighting before they are executed, and when execution is off).
- :func:`plain_text_docstrings`: a docstring that is not valid reStructuredText (many of refopt's are
  written as plain text: ``|g|`` for a norm, indented continuation lines) is shown as it is written, in a
  literal block, instead of being misread (``|g|`` as a substitution) and failing the ``-W`` build. A valid
  one renders as reStructuredText (roles, lists, ``.. math::``). :data:`PLAIN` collects the names of the
  docstrings shown as plain text (``REFOPT_DOCS_PLAIN_LIST=FILE`` writes them to FILE at the end).
"""
from __future__ import annotations

import os
import re

import docutils.core
import docutils.utils
import jupytext

#: the objects whose docstring is shown as plain text (not valid reStructuredText)
PLAIN: list[str] = []

_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`([^`]*)`")


def read_percent(text: str, **kwargs):
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
    nb.metadata.setdefault("language_info", {"name": "python", "pygments_lexer": "ipython3"})
    return nb


def _rst_problems(text: str) -> list[str]:
    """The docutils warnings and errors of ``text`` parsed as a standalone reStructuredText fragment (Sphinx's
    roles and directives replaced by neutral markup first, since plain docutils does not know them)."""
    text = _ROLE.sub(r"``\1``", text)
    text = re.sub(r"^(\s*)\.\. (math|code-block|note|warning|seealso|versionadded|autoclass|data)::",
                  r"\1.. container::", text, flags=re.M)
    settings = {"report_level": 5, "halt_level": 5, "warning_stream": False, "file_insertion_enabled": False,
                "raw_enabled": False}
    doctree = docutils.core.publish_doctree(text, settings_overrides=settings)
    # (a transform's message, e.g. an undefined substitution, leaves a "problematic" node in the text)
    return [m.astext() for m in doctree.findall(lambda n: n.tagname in ("system_message", "problematic"))
            if m.tagname == "problematic" or m["level"] >= 2]


def plain_text_docstrings(app, what, name, obj, options, lines):
    if not lines or not _rst_problems("\n".join(lines)):
        return
    PLAIN.append(name)
    body = [("    " + line) if line.strip() else "" for line in lines]
    lines[:] = ["::", "", *body, ""]


def _write_plain(app, exc):
    path = os.environ.get("REFOPT_DOCS_PLAIN_LIST")
    if path and exc is None:
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(sorted(set(PLAIN))) + "\n")


def setup(app):
    # after napoleon (registered when its extension loaded), so the check sees the final reStructuredText
    app.connect("autodoc-process-docstring", plain_text_docstrings, priority=900)
    app.connect("build-finished", _write_plain)
    return {"parallel_read_safe": False}

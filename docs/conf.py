"""Sphinx configuration of refopt's documentation site.

Build it (offline, warnings as errors) from the repository root after ``pip install ".[docs]"``::

    sphinx-build -W -b html docs docs/_build/html

The tutorials (``tutorials/tNN_name.py``, jupytext percent files) are copied into ``docs/tutorials/`` when
the build starts and executed as notebooks by myst-nb; each writes its figure and numbers into
``$REFOPT_TUTORIAL_OUT`` (default: ``_tutorial_out`` in the output folder). ``REFOPT_DOCS_EXECUTE`` chooses
myst-nb's execution mode: ``force`` (default: every tutorial runs), ``cache`` or ``off`` (pages without
outputs, for editing the prose).
"""
from __future__ import annotations

import os
import shutil
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)

# autodoc and the notebooks' kernel import this checkout's refopt (also when it is not installed)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(DOCS, "_ext"))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
# the notebooks' figures inline (the kernel inherits this; an MPLBACKEND=Agg of the caller would hide them)
os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"


def _copy_tutorials() -> list[str]:
    """Copy tutorials/t*.py into docs/tutorials/ (git-ignored copies; a file is rewritten only when it
    changed, so that an incremental build re-reads only the edited tutorials); remove stale copies."""
    src_dir, dst_dir = os.path.join(ROOT, "tutorials"), os.path.join(DOCS, "tutorials")
    names = sorted(f for f in os.listdir(src_dir) if f.startswith("t") and f[1:3].isdigit() and f.endswith(".py"))
    for f in os.listdir(dst_dir):
        if f.startswith("t") and f[1:3].isdigit() and f.endswith(".py") and f not in names:
            os.remove(os.path.join(dst_dir, f))
    for f in names:
        src, dst = os.path.join(src_dir, f), os.path.join(dst_dir, f)
        with open(src, "rb") as a:
            new = a.read()
        old = None
        if os.path.isfile(dst):
            with open(dst, "rb") as b:
                old = b.read()
        if new != old:
            shutil.copyfile(src, dst)
    return names


TUTORIALS = _copy_tutorials()

project = "refopt"
author = "the refopt developers"
copyright = "the refopt developers"
release = version = "0.1.0"

extensions = [
    "myst_nb",                      # MyST markdown pages and notebooks (executed at build time)
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",          # the docstrings' "Args:" / "Returns:" / "Raises:" sections
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",       # MathJax 3 copied into _static: the pages render math without a network
    "refopt_docs",                  # docs/_ext: the tutorials' reader, plain-text docstrings shown verbatim
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".py": "myst-nb"}
# the tutorials are jupytext percent files: myst-nb reads them as notebooks through jupytext
nb_custom_formats = {".py": ["refopt_docs.read_percent", {}]}
exclude_patterns = ["_build", "_ext", "factories", "conf.py", "**/.ipynb_checkpoints", "jupyter_execute"]

nb_execution_mode = os.environ.get("REFOPT_DOCS_EXECUTE", "force")
nb_execution_timeout = 600                  # seconds per cell (a hung cell fails the build)
nb_execution_raise_on_error = True          # a failing tutorial fails the build
nb_execution_show_tb = True
nb_execution_in_temp = False                # each tutorial runs in docs/tutorials/ (refopt via PYTHONPATH)
nb_kernel_rgx_aliases = {".*": "python3"}   # every notebook runs on the build's own Python
nb_merge_streams = True

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# MathJax's context menu can switch on speech output, whose language data it would fetch from a CDN: off
mathjax3_config = {"options": {"enableMenu": False}}

autodoc_mock_imports = ["torch", "jax", "jaxlib", "optax", "schedulefree", "numba_cuda"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "none"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = "refopt"
html_static_path: list = []
html_theme_options = {"description": "a golden reference for neural-network optimizers", "fixed_sidebar": True}


def _tutorial_out(app):
    # the tutorials' figures and numbers (tests/test_docs_site.py sets the folder; default: next to the HTML)
    os.environ.setdefault("REFOPT_TUTORIAL_OUT", os.path.join(app.outdir, "_tutorial_out"))


def setup(app):
    app.connect("builder-inited", _tutorial_out)

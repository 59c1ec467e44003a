"""The single build of the documentation site in a test session (``sphinx-build -W -b html docs OUT``).

The build executes every tutorial as a notebook with ``REFOPT_TUTORIAL_OUT`` set to a folder of the session,
so each tutorial writes its figure and its numbers (``<name>.png``, ``<name>.json``) there; after a build that
passed, :mod:`tutorial_runs` reads those numbers instead of running the tutorials again. ``tests/conftest.py``
runs the site's tests first, so the build comes before the tutorials' tests.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: what the build needs (the ``docs`` extra)
NEEDS = ("sphinx", "myst_nb", "myst_parser", "jupytext", "nbconvert", "ipykernel")


def missing() -> list[str]:
    """The packages of the ``docs`` extra that are not installed."""
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


@dataclass
class Build:
    html: str            # the built site
    doctrees: str        # Sphinx's environment and doctrees
    tutorial_out: str    # each executed tutorial's <name>.png and <name>.json
    returncode: int
    log: str             # sphinx-build's stdout and stderr
    seconds: float


def build(tmp_root: str) -> Build:
    """Run ``sphinx-build -W -b html docs`` into ``tmp_root`` (every tutorial executed, offline) and return
    the outcome; a failed build is returned, not raised, so that each test can say what it checks."""
    html, doctrees, out = (os.path.join(tmp_root, d) for d in ("html", "doctrees", "tutorials"))
    env = {**os.environ, "REFOPT_TUTORIAL_OUT": out, "REFOPT_DOCS_EXECUTE": "force"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", doctrees,
                           os.path.join(ROOT, "docs"), html], cwd=ROOT, env=env, capture_output=True, text=True)
    return Build(html, doctrees, out, proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0)

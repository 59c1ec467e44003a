"""The single execution of each tutorial in a test session, shared by the tests that assert its claims.

``run(name, tmp_root)`` executes ``tutorials/<name>.py`` once per test session with ``REFOPT_TUTORIAL_OUT``
set to a folder of its own and returns ``(folder, results)``: the tutorial writes ``<name>.png`` and
``<name>.json`` (its measured numbers, :func:`refopt.cli.output.save_results`) there. When the docs build
of this session has executed the tutorials as notebooks (the ``site`` fixture of tests/conftest.py, which
sets :data:`BUILT`), or ``REFOPT_TUTORIAL_RESULTS`` names a folder where a build wrote them, the numbers
are read from there and nothing runs again; without the ``docs`` extra each tutorial runs once as a script.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DONE: dict = {}
#: the folder where this session's docs build executed the tutorials (set by the ``site`` fixture)
BUILT: str | None = None


def run(name: str, tmp_root: str) -> tuple[str, dict]:
    if name not in _DONE:
        built = BUILT or os.environ.get("REFOPT_TUTORIAL_RESULTS")
        if built and os.path.isfile(os.path.join(built, f"{name}.json")):
            out = built
        else:
            out = os.path.join(tmp_root, name)
            env = {**os.environ, "REFOPT_TUTORIAL_OUT": out, "MPLBACKEND": "Agg"}
            proc = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", f"{name}.py")], env=env,
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"tutorials/{name}.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(os.path.join(out, f"{name}.json"), encoding="utf-8") as f:
            _DONE[name] = (out, json.load(f))
    return _DONE[name]

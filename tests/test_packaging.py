"""refopt.models imports from an editable checkout and from an installed copy, pyproject lists every
package, and a user's models.py does not break refopt.

The installed-copy test builds a wheel of a copy of the sources (``pip wheel --no-deps
--no-build-isolation``: no network, about 10-20 s) and imports from the unpacked wheel, which is what
``pip install`` puts into site-packages for a pure-Python package.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "raise ImportError('this is the user\\'s own models.py, not refopt\\'s')\n"


def _run(code: str, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_checkout_maps_refopt_models_onto_the_models_folder():
    """The editable install's package map (README), not a shim: refopt/ has no models/ of its own."""
    assert not (ROOT / "refopt" / "models").exists()
    import refopt.models
    import refopt.models.gpt
    import refopt.models.mlp
    import refopt.models.symmetries

    assert Path(refopt.models.mlp.__file__).resolve() == ROOT / "models" / "mlp.py"
    assert Path(refopt.models.gpt.__file__).resolve() == ROOT / "models" / "gpt.py"
    assert refopt.models.symmetries.GPTConfig is refopt.models.gpt.GPTConfig
    assert refopt.models.__doc__ == (ROOT / "models" / "__init__.py").read_text().split('"""')[1]


def test_a_users_models_py_does_not_break_refopt(tmp_path):
    (tmp_path / "models.py").write_text(HOSTILE)
    code = ("import argparse, numpy as np, refopt, refopt.models.mlp, refopt.models.gpt, refopt.models.symmetries\n"
            "from refopt.cli.tasks import MLPTask\n"
            "task = MLPTask(argparse.Namespace(batch_size=64, hidden=[8]), np.float32)\n"
            "print(task.init_params(0)['layers'][0]['w'].shape)\n"
            "import models\n")
    r = _run(code, tmp_path, ROOT)
    assert r.stdout.strip() == "(64, 8)", r.stderr[-2000:]    # the CLI's tasks import refopt.models
    assert "the user's own models.py" in r.stderr, r.stderr    # the user's module is theirs, untouched


def test_installed_copy_ships_refopt_models_and_no_top_level_models(tmp_path):
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("refopt", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = glob.glob(str(tmp_path / "dist" / "*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        init = z.read("refopt/models/__init__.py")
        z.extractall(tmp_path / "site")
    assert not [n for n in names if n.startswith("models/")]
    for f in ("__init__", "mlp", "gpt", "data", "symmetries"):
        assert f"refopt/models/{f}.py" in names
    assert init == (ROOT / "models" / "__init__.py").read_bytes()       # the folder itself, not the shim
    # import from the unpacked wheel in a directory with a user's models.py, the checkout out of sight
    work = tmp_path / "course"
    work.mkdir()
    (work / "models.py").write_text(HOSTILE)
    code = ("import refopt.models.mlp as m, refopt.models.symmetries, refopt.models.gpt, numpy as np\n"
            "print(m.__file__)\n"
            "print(m.init(0, [4, 3, 2])['layers'][1]['w'].shape)\n")
    r = _run(code, work, tmp_path / "site")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0].startswith(str(tmp_path / "site" / "refopt" / "models"))
    assert r.stdout.splitlines()[1] == "(3, 2)"


def test_pyproject_lists_every_package():
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "refopt").rglob("__init__.py")}
    assert listed == found | {"refopt.models"}


def test_no_exec_in_the_library():
    """refopt runs no source text of its own: every module is imported (AST scan of refopt/ and models/)."""
    import ast
    hits = [f"{p.relative_to(ROOT)}:{n.lineno}" for d in ("refopt", "models") for p in (ROOT / d).rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("exec", "eval")]
    assert hits == []


def _top_level_models_imports(source: str) -> list[int]:
    """Line numbers of ``import models...`` / ``from models... import`` in ``source``."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name == "models" or a.name.startswith("models.")
                                                for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None and (
                node.module == "models" or node.module.startswith("models.")):
            lines.append(node.lineno)
    return lines


def test_refopt_never_imports_the_checkout_only_top_level_models():
    """Installed, the models are refopt.models; a top-level ``models`` exists only in a checkout (where the
    tests run), so an import of it inside refopt works here and fails for every pip user (refopt.testing's
    GPT property imports the GPT: it must use refopt.models). Negative control: the check finds such an import in a sample source."""
    found = {str(p.relative_to(ROOT)): _top_level_models_imports(p.read_text(encoding="utf-8"))
             for p in (ROOT / "refopt").rglob("*.py")}
    assert not {k: v for k, v in found.items() if v}
    assert _top_level_models_imports("def f():\n    from models import gpt\n    import models.mlp\n") == [2, 3]
    assert _top_level_models_imports("from refopt.models import gpt\nfrom .models import x\n") == []

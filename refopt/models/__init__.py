"""``refopt.models`` in a source checkout: a shim onto the repository's top-level ``models/`` folder.

The reference models (the MLP, the GPT, their data sets and symmetry helpers) live in the top-level
``models/`` folder of the repository. An installed refopt ships that folder as the package
``refopt.models`` (``[tool.setuptools.package-dir]`` in pyproject.toml maps ``refopt.models`` to
``models``), and this file is not installed. In a checkout (``python -m pytest`` at the repository root
imports the source ``refopt/``, where no such mapping exists), this shim makes ``refopt.models`` the same
package: it sets the package's search path to ``models/`` and runs ``models/__init__.py`` here, so
``import refopt.models.mlp`` loads ``models/mlp.py`` in both cases. Import the models as
``refopt.models`` only: a top-level ``models`` package would clash with any ``models.py`` of the user.
"""
import os as _os

__path__ = [_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))),
                          "models")]
_init = _os.path.join(__path__[0], "__init__.py")
with open(_init, encoding="utf-8") as _f:
    exec(compile(_f.read(), _init, "exec"))   # models/__init__.py, as the installed package runs it
del _init, _f

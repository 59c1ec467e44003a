"""Test-session fixtures shared by several test modules."""
from __future__ import annotations

import os

import pytest

import docs_site
import tutorial_runs


def pytest_configure(config):
    """The checkout's ``refopt/`` comes first on the path of ``python -m pytest``; its ``refopt.models``
    (the top-level ``models/`` folder) is there only through an editable install's package map."""
    import importlib.util

    if importlib.util.find_spec("refopt.models") is None:
        raise pytest.UsageError(
            "refopt.models is not found: the tests import the checkout, which needs an editable install "
            '(pip install -e ".[test]", README, "The two commands")')


def pytest_collection_modifyitems(session, config, items):
    """The documentation site's tests first: their one build executes every tutorial, whose numbers the
    tutorials' tests then read (tests/docs_site.py, tests/tutorial_runs.py)."""
    first = [i for i in items if os.path.basename(str(i.fspath)) == "test_docs_site.py"]
    if first:
        items[:] = first + [i for i in items if i not in first]


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The site built once in this session (skipped with the reason when the ``docs`` extra is missing);
    after a build that passed, the tutorials' tests use its executions (:data:`tutorial_runs.BUILT`)."""
    lacking = docs_site.missing()
    if lacking:
        pytest.skip(f"the docs extra is not installed (no {', '.join(lacking)}): pip install \".[docs]\"")
    b = docs_site.build(str(tmp_path_factory.mktemp("site")))
    if b.returncode == 0:
        tutorial_runs.BUILT = b.tutorial_out
    return b

"""Shared by the peer cross-check tests: run presets and assert their status with a useful message, load a
factory file of docs/factories."""
import importlib.util
import pathlib

from refopt.crosscheck.presets import MISCONFIGURED, PRESETS
from refopt.crosscheck.run import run_preset, table

FACTORIES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "factories"


def presets(peer, misconfigured=False, gaps=False, family=None):
    """The table's rows of ``peer`` (its wrong rows with ``misconfigured``), of one rule ``family`` if given."""
    pool = MISCONFIGURED if misconfigured else PRESETS
    return [p for p in pool if p.peer == peer and (gaps or not p.gap) and (family is None or p.family == family)]


def load_factory(name):
    """The module docs/factories/<name>.py (the factories ``refopt crosscheck --impl`` is shown with)."""
    spec = importlib.util.spec_from_file_location(f"{name}_factory", FACTORIES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ids(ps):
    return [p.name for p in ps]


def meaningful(preset, problem: str) -> str:
    """``problem``, or the preset's first problem where the row is not meaningful on it (a rule that needs the
    loss value has none on the stream)."""
    return preset.problems[0] if preset.problems and problem not in preset.problems else problem


def assert_passes(preset, problem="stream", dtype="float64", steps=50):
    r = run_preset(preset, meaningful(preset, problem), steps, dtype)
    assert r.status == "pass", table([r])
    return r


def assert_caught(preset, problem="stream", dtype="float64", steps=50, factor=10.0):
    """The wrong preset fails, and by a margin: the gated figure exceeds its tolerance ``factor`` times."""
    r = run_preset(preset, meaningful(preset, problem), steps, dtype)
    assert r.status == "caught", table([r])
    worst = max((getattr(r, f"{k}_rel") or 0.0) / v for k, v in r.tol.items())
    assert worst > factor, table([r])
    return r

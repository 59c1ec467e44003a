"""Shared by the peer cross-check tests: run presets and assert their status with a useful message."""
from refopt.crosscheck.presets import MISCONFIGURED, PRESETS
from refopt.crosscheck.run import run_preset, table


def presets(peer, misconfigured=False, gaps=False):
    pool = MISCONFIGURED if misconfigured else PRESETS
    return [p for p in pool if p.peer == peer and (gaps or not p.gap)]


def ids(ps):
    return [p.name for p in ps]


def assert_passes(preset, problem="stream", dtype="float64", steps=50):
    r = run_preset(preset, problem, steps, dtype)
    assert r.status == "pass", table([r])
    return r


def assert_caught(preset, problem="stream", dtype="float64", steps=50, factor=10.0):
    """The wrong preset fails, and by a margin: the gated figure exceeds its tolerance ``factor`` times."""
    r = run_preset(preset, problem, steps, dtype)
    assert r.status == "caught", table([r])
    worst = max((getattr(r, f"{k}_rel") or 0.0) / v for k, v in r.tol.items())
    assert worst > factor, table([r])
    return r

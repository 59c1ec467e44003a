"""Covariant (post 000, eq. (elr-u)): plain-numpy oracle, PITFALLS B11, eq. (phi), norms, validation."""
import math

import numpy as np
import pytest

import refopt
from refopt.rules.adam import Adam, AdamW
from refopt.rules.covariant import Covariant
from refopt.rules.hyperball import Hyperball
from refopt.rules.sgd import SGD
from test_hyperball import AdamOracle, SGDOracle, grad_seq, rel_err, tree_params


def fro(a):
    return np.sqrt(np.sum(a * a))


def covariant_oracle(w, u, lr, norm=fro):
    """w - lr ||w|| u/||u||, no step when either norm is 0."""
    nw, nu = norm(w), norm(u)
    return w if nw == 0 or nu == 0 else w - lr * nw * u / nu


def run(rule, x, grads):
    state = refopt.init(rule, x)
    for g in grads:
        x, state = refopt.update(rule, state, x, g)
    return x, state


# ---- oracle, float64, multi-step -------------------------------------------------------------------

def maxabs(a):
    return float(np.max(np.abs(a))) if a.size else 0.0


CONFIGS = [
    ("sgd", lambda: SGD(lr=50.0), lambda: SGDOracle(), 0.05, "fro", fro, None),
    ("sgd_nesterov_l2_sched", lambda: SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
     lambda: SGDOracle(0.9, 0.0, True, 0.01), 0.1, "fro", fro, lambda t: 1.0 / t),
    ("adam_rms", lambda: Adam(beta2=0.99, weight_decay=1e-3), lambda: AdamOracle(0.9, 0.99, 1e-8, 1e-3), 0.02,
     "rms", lambda a: fro(a) / math.sqrt(a.size), None),
    ("adam_maxabs", lambda: Adam(), lambda: AdamOracle(), 0.03, maxabs, maxabs, None),
]


@pytest.mark.parametrize("name,make_base,make_oracle,lr,norm,onorm,schedule", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_oracle_float64(name, make_base, make_oracle, lr, norm, onorm, schedule):
    params = tree_params()
    grads = grad_seq(params, 12)
    rule = Covariant(make_base(), lr=lr, norm=norm, schedule=schedule)
    x, _ = run(rule, params, grads)
    oracle = make_oracle()
    ws = {p: a.copy() for p, a in zip(refopt.tree.paths(params), refopt.tree.leaves(params))}
    for t, g in enumerate(grads, start=1):
        lr_t = lr * (schedule(t) if schedule else 1.0)
        for p, gl in zip(refopt.tree.paths(g), refopt.tree.leaves(g)):
            ws[p] = covariant_oracle(ws[p], oracle.direction(p, ws[p], gl, t), lr_t, onorm)
    for p, a in zip(refopt.tree.paths(x), refopt.tree.leaves(x)):
        assert rel_err(a, ws[p]) <= 1e-12, p


def test_relative_step_is_exactly_the_elr():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 4))
    rule = Covariant(Adam(), lr=0.07)
    state = refopt.init(rule, w)
    for _ in range(5):
        x, state = refopt.update(rule, state, w, rng.standard_normal((5, 4)))
        assert abs(np.linalg.norm(x - w) / np.linalg.norm(w) - 0.07) <= 1e-14
        w = x


def test_fro_and_rms_give_the_same_step():
    params, grads = tree_params(), grad_seq(tree_params(), 5)
    a, _ = run(Covariant(Adam(), lr=0.05, norm="fro"), params, grads)
    b, _ = run(Covariant(Adam(), lr=0.05, norm="rms"), params, grads)
    for u, v in zip(refopt.tree.leaves(a), refopt.tree.leaves(b)):
        assert rel_err(u, v) <= 1e-14


def test_direction_is_norm_w_times_unit_u():
    rng = np.random.default_rng(4)
    w, g = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    rule = Covariant(SGD(momentum=0.5), lr=0.1)
    u, _ = refopt.direction(rule, refopt.init(rule, w), w, g)
    np.testing.assert_allclose(u, np.linalg.norm(w) * g / np.linalg.norm(g), rtol=1e-14)


def test_hyperball_over_covariant_equals_hyperball_over_the_base():
    params, grads = tree_params(), grad_seq(tree_params(), 6)
    a, _ = run(Hyperball(Covariant(Adam(), lr=0.3), lr=0.05), params, grads)
    b, _ = run(Hyperball(Adam(), lr=0.05), params, grads)
    for u, v in zip(refopt.tree.leaves(a), refopt.tree.leaves(b)):
        assert rel_err(u, v) <= 1e-13


# ---- PITFALLS B11 ----------------------------------------------------------------------------------

def test_b11_c_exact_values():
    w, u = np.diag([3.0, 4.0]), np.array([[1.0, 1.0], [0.0, 0.0]])
    rule = Covariant(SGD(), lr=0.1)
    out, _ = refopt.update(rule, refopt.init(rule, w), w, u)
    np.testing.assert_allclose(out, [[2.6464466094, -0.3535533906], [0.0, 4.0]], rtol=0, atol=5e-11)
    assert abs(np.linalg.norm(out - w) / np.linalg.norm(w) - 0.1) <= 1e-16


def test_b11_a_zero_weight_never_moves_and_stays_finite():
    w = np.zeros((2, 2))
    rule = Covariant(SGD(momentum=0.9), lr=0.1)
    state = refopt.init(rule, w)
    x = w
    for _ in range(3):
        x, state = refopt.update(rule, state, x, np.ones((2, 2)))
    assert np.array_equal(x, w)
    np.testing.assert_allclose(state.leaves.base.b, np.full((2, 2), 2.71), rtol=1e-15)  # the base advanced


def test_b11_b_zero_direction_is_no_step():
    w = np.diag([3.0, 4.0])
    rule = Covariant(Adam(), lr=0.1)
    out, _ = refopt.update(rule, refopt.init(rule, w), w, np.zeros((2, 2)))
    assert np.array_equal(out, w)
    u, _ = refopt.direction(rule, refopt.init(rule, w), w, np.zeros((2, 2)))
    assert np.array_equal(u, np.zeros((2, 2)))


# ---- eq. (phi): phi(c1 w, c2 g) = c1 phi(w, g) -------------------------------------------------------

def _phi_bases():
    bases = {
        "sgd": lambda: SGD(),
        "sgd_momentum_nesterov": lambda: SGD(momentum=0.9, nesterov=True),
        "adam_eps_tiny": lambda: Adam(eps=1e-300),     # eps must be > 0; 1e-300 is invisible next to |g| >= 1e-6
    }
    try:
        from refopt.rules.muon import Muon
        bases["muon_svd"] = lambda: Muon(msign="svd")
        bases["muon_ns"] = lambda: Muon()              # eps_mode 'none': Newton-Schulz is scale invariant
    except ImportError:
        pass
    return bases


PHI_BASES = _phi_bases()


@pytest.mark.parametrize("base", sorted(PHI_BASES))
def test_eq_phi_covariance(base):
    """The trajectory from (c1 w, c2 g_1..k) is c1 times the one from (w, g_1..k), for c1, c2 log-uniform in
    [1e-6, 1e6]: refopt.testing's parameter_scale_covariance (the property users run on their own code),
    its error measured on the motion (the steps themselves, phi), not just the endpoints."""
    from refopt.testing import make_adapter
    from refopt.testing.properties import parameter_scale_covariance

    rule = Covariant(PHI_BASES[base](), lr=0.1)
    tol = 1e-10 if base.startswith("muon") else 1e-12
    out = parameter_scale_covariance(make_adapter(rule), max_examples=15, rtol=tol, scales=(1e-6, 1e6),
                                     matrix_only=base.startswith("muon"))
    assert out.holds, out.describe() + f" counterexample: {out.counterexample}"


def test_eq_phi_fails_for_adam_with_a_visible_eps():
    """The property can fail: Adam's default eps breaks gradient-scale invariance (a shrunk counterexample)."""
    from refopt.testing import make_adapter
    from refopt.testing.properties import parameter_scale_covariance

    out = parameter_scale_covariance(make_adapter(Covariant(Adam(eps=1e-8), lr=0.1)), max_examples=15, rtol=1e-12,
                                     scales=(1e-6, 1e6))
    assert out.holds is False and out.err > 100 * 1e-12 and out.counterexample   # shrunk to c1 = c2 = e


# ---- dtypes ---------------------------------------------------------------------------------------

def test_float32_stays_float32():
    params = tree_params(dtype=np.float32)
    x, state = run(Covariant(Adam(), lr=0.05), params, grad_seq(params, 5))
    assert all(a.dtype == np.float32 for a in refopt.tree.leaves(x))
    assert all(a.dtype == np.float32 for a in refopt.tree.leaves(state.leaves))
    ref, _ = run(Covariant(Adam(), lr=0.05), tree_params(), grad_seq(tree_params(), 5))
    for u, v in zip(refopt.tree.leaves(x), refopt.tree.leaves(ref)):
        assert rel_err(u.astype(np.float64), v) <= 1e-5


# ---- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(base=SGD(), lr=-1.0), "lr"),
    (dict(base=SGD(), lr=0.1, norm="l1"), "norm"),
    (dict(base=SGD(), lr=0.1, norm=3), "norm"),
    (dict(base=SGD(), lr=0.1, norm=lambda a: float(np.sum(a * a))), "homogeneous"),
    (dict(base=SGD(), lr=0.1, norm=lambda a: math.sqrt(float(np.sum(a * a)) + 1e-12)), "homogeneous"),
    (dict(base=SGD(), lr=0.1, norm=lambda a: -fro(a)), "norm"),
    (dict(base=SGD(), lr=0.1, norm=lambda a: a.reshape(7)), "probe"),
    (dict(base=AdamW(), lr=0.1), "weight_decay"),
    (dict(base=Adam(schedule=lambda t: 0.5), lr=0.1), "schedule"),
    (dict(base=None, lr=0.1), "base"),
])
def test_bad_hyperparameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Covariant(**kwargs)


def test_a_norm_that_goes_negative_is_reported_with_the_path():
    rule = Covariant(SGD(), lr=0.1, norm=lambda a: float(np.sum(a)))    # linear: passes the probe
    params = {"layer": {"w": -np.ones((2, 2))}}
    with pytest.raises(ValueError, match=r"layer\.w"):
        refopt.update(rule, refopt.init(rule, params), params, {"layer": {"w": np.ones((2, 2))}})


def test_covariant_muon_matches_oracle_on_the_muon_direction():
    muon = pytest.importorskip("refopt.rules.muon")
    base = muon.Muon(momentum=0.9)
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 6))
    gs = [rng.standard_normal((4, 6)) for _ in range(6)]
    rule = Covariant(base, lr=0.03, schedule=lambda t: 1.0 / t)
    x, state = run(rule, w, gs)
    ref, bstate = w.copy(), refopt.init(base, w)
    for t, g in enumerate(gs, start=1):
        u, bstate = refopt.direction(base, bstate, ref, g)        # Muon's own direction, tested in test_muon
        ref = covariant_oracle(ref, u, 0.03 / t)
    assert rel_err(x, ref) <= 1e-12


# --- edge cases: tiny directions, non-finite parameters -------------------------------------------------

@pytest.mark.parametrize("dtype,tiny", [(np.float64, 1e-310), (np.float32, 1e-42)])
@pytest.mark.parametrize("norm", ["fro", "rms", lambda a: float(np.max(np.abs(a)))])
def test_tiny_subnormal_direction_gives_relative_step(dtype, tiny, norm):
    # lr*||W||/||u|| overflows (float64; float32 once cast): taken naively it gives [-inf, nan, nan, -inf]
    W = np.ones((2, 2), dtype)
    g = np.diag([tiny, tiny]).astype(dtype)
    assert g[0, 0] != 0
    rule = Covariant(SGD(), lr=0.01, norm=norm)
    nrm = {"fro": fro, "rms": lambda a: fro(a) / 2.0}.get(norm, norm) if isinstance(norm, str) else norm
    v = g.astype(np.float64) / tiny                       # exactly diag(1, 1) scaled: u/||u|| = v/||v||
    v = v / np.max(np.abs(v))
    expect = covariant_oracle(W.astype(np.float64), v, 0.01, nrm)
    x, _ = refopt.update(rule, refopt.init(rule, W), W, g)
    assert x.dtype == dtype and np.isfinite(x).all()
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(x, expect, rtol=tol)
    assert rel_err(x.astype(np.float64) - W, expect - W) < 1e-5
    u, _ = refopt.direction(rule, refopt.init(rule, W), W, g)   # ||W|| u/||u||
    np.testing.assert_allclose(u, nrm(W.astype(np.float64)) * v / nrm(v), rtol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("norm", ["fro", "rms"])
def test_nonfinite_params_raise_naming_path(dtype, bad, norm):
    rule = Covariant(SGD(), lr=0.01, norm=norm)
    params = {"enc": [np.ones((2, 2), dtype)]}
    state = refopt.init(rule, params)
    params["enc"][0][0, 0] = bad
    with pytest.raises(FloatingPointError, match=r"weights at enc\[0\]"):
        refopt.update(rule, state, params, {"enc": [np.ones((2, 2), dtype)]})
    with pytest.raises(FloatingPointError, match=r"weights at enc\[0\]"):
        refopt.direction(rule, state, params, {"enc": [np.ones((2, 2), dtype)]})

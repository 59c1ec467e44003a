"""Hyperball (MuonH / AdamH): plain-numpy oracles, PITFALLS B11, the radius invariant, validation.

The oracles below (base directions of torch SGD and Adam, and the Hyperball step) are written from the
equations (post 000, post 002, CONVENTIONS.md 1.1, 1.2, 6), independently of refopt's kernels; the
Covariant and averaging tests reuse the two base oracles.
"""
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import refopt
from refopt.rules.adam import Adam, AdamW
from refopt.rules.hyperball import Hyperball, fro_norm
from refopt.rules.sgd import SGD


# ---- independent oracles ---------------------------------------------------------------------------

class SGDOracle:
    """torch.optim.SGD direction: b_1 = g_1, b_t = mu b + (1 - tau) g; u = g + mu b (nesterov) or b."""

    def __init__(self, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        self.mu, self.tau, self.nesterov, self.wd = momentum, dampening, nesterov, weight_decay
        self.b = {}

    def direction(self, key, x, g, t):
        g = g + self.wd * x
        if self.mu == 0:
            return g
        b = g.copy() if t == 1 else self.mu * self.b[key] + (1 - self.tau) * g
        self.b[key] = b
        return g + self.mu * b if self.nesterov else b


class AdamOracle:
    """Adam direction (eps after sqrt of the bias-corrected v): mhat / (sqrt(vhat) + eps), L2 in g."""

    def __init__(self, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        self.b1, self.b2, self.eps, self.wd = beta1, beta2, eps, weight_decay
        self.m, self.v = {}, {}

    def direction(self, key, x, g, t):
        g = g + self.wd * x
        self.m[key] = self.b1 * self.m.get(key, 0.0) + (1 - self.b1) * g
        self.v[key] = self.b2 * self.v.get(key, 0.0) + (1 - self.b2) * g * g
        mhat = self.m[key] / (1 - self.b1 ** t)
        vhat = self.v[key] / (1 - self.b2 ** t)
        return mhat / (np.sqrt(vhat) + self.eps)


def hyperball_oracle(w, u, R, lr):
    """R * N(w - lr R N(u)), N(0) = 0, norms by numpy in float64."""
    nu = np.sqrt(np.sum(u * u))
    y = w - lr * R * u / nu if nu > 0 else w
    ny = np.sqrt(np.sum(y * y))
    return R * y / ny if ny > 0 else y


def tree_params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((4, 3)).astype(dtype), "b": [rng.standard_normal(5).astype(dtype),
                                                                  rng.standard_normal((2, 3, 2)).astype(dtype)]}


def grad_seq(params, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [refopt.tree.tree_map(lambda a: rng.standard_normal(a.shape).astype(a.dtype), params)
            for _ in range(steps)]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ---- oracle, float64, multi-step -------------------------------------------------------------------

def sched(t):
    return 1.0 / math.sqrt(t)


CONFIGS = [
    ("sgd", lambda: SGD(lr=123.0), lambda: SGDOracle(), 0.05, None, None),
    ("sgd_nesterov_l2", lambda: SGD(momentum=0.9, nesterov=True, weight_decay=0.01),
     lambda: SGDOracle(0.9, 0, True, 0.01),
     0.1, None, sched),
    ("sgd_dampening", lambda: SGD(momentum=0.8, dampening=0.3), lambda: SGDOracle(0.8, 0.3), 0.02, 2.0, None),
    ("adam", lambda: Adam(lr=7.0, beta2=0.99), lambda: AdamOracle(0.9, 0.99), 0.03, None, sched),
    ("adamw_wd0", lambda: AdamW(beta1=0.8, weight_decay=0.0), lambda: AdamOracle(0.8, 0.999), 0.05, 3.0, None),
]


@pytest.mark.parametrize("name,make_base,make_oracle,lr,radius,schedule", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_oracle_float64(name, make_base, make_oracle, lr, radius, schedule):
    params = tree_params()
    grads = grad_seq(params, 12)
    rule = Hyperball(make_base(), lr=lr, radius=radius, schedule=schedule)
    state = refopt.init(rule, params)
    oracle = make_oracle()
    ws = {p: a.copy() for p, a in zip(refopt.tree.paths(params), refopt.tree.leaves(params))}
    R = {p: (radius if radius is not None else np.linalg.norm(a.ravel())) for p, a in ws.items()}
    x = params
    for t, g in enumerate(grads, start=1):
        x, state = refopt.update(rule, state, x, g)
        lr_t = lr * (schedule(t) if schedule else 1.0)
        for p, gl in zip(refopt.tree.paths(g), refopt.tree.leaves(g)):
            ws[p] = hyperball_oracle(ws[p], oracle.direction(p, ws[p], gl, t), R[p], lr_t)
    for p, a in zip(refopt.tree.paths(x), refopt.tree.leaves(x)):
        assert rel_err(a, ws[p]) <= 1e-12, p
        assert abs(fro_norm(a) - R[p]) <= 1e-13 * R[p]


def test_muonh_matches_oracle_on_the_muon_direction():
    muon = pytest.importorskip("refopt.rules.muon")
    base = muon.Muon(momentum=0.9, msign="svd")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4))
    gs = [rng.standard_normal((6, 4)) for _ in range(6)]
    rule = Hyperball(base, lr=0.02)
    state, bstate = refopt.init(rule, w), refopt.init(base, w)
    x, ref, R = w, w.copy(), np.linalg.norm(w)
    for g in gs:
        x, state = refopt.update(rule, state, x, g)
        u, bstate = refopt.direction(base, bstate, ref, g)       # Muon's own direction, tested in test_muon
        ref = hyperball_oracle(ref, u, R, 0.02)
    assert rel_err(x, ref) <= 1e-12


# ---- PITFALLS B11 ----------------------------------------------------------------------------------

def one_step(rule, w, u):
    """One Hyperball step of ``rule`` (over plain SGD, so u = g) from w."""
    return refopt.update(rule, refopt.init(rule, w), w, u)[0]


def test_b11_c_exact_values():
    w, u = np.diag([3.0, 4.0]), np.array([[1.0, 1.0], [0.0, 0.0]])
    out = one_step(Hyperball(SGD(), lr=0.1), w, u)
    np.testing.assert_allclose(out, [[2.7514252633, -0.3675780676], [0.0, 4.1586711080]], rtol=0, atol=5e-11)
    assert abs(np.linalg.norm(out) - 5.0) <= 1e-15 * 5.0


def test_b11_a_zero_weight_with_lr_zero_is_unchanged():
    w = np.zeros((2, 2))
    out = one_step(Hyperball(SGD(), lr=0.0, radius=2.0), w, np.ones((2, 2)))
    assert np.array_equal(out, w)


def test_zero_weight_with_a_radius_lands_on_the_sphere():
    out = one_step(Hyperball(SGD(), lr=0.1, radius=2.0), np.zeros((2, 2)), np.ones((2, 2)))
    np.testing.assert_allclose(out, -np.ones((2, 2)), rtol=1e-15)     # -R N(u) = -2 * ones / 2


def test_zero_weight_without_radius_is_refused_at_init():
    with pytest.raises(ValueError, match=r"b\[0\].*all zero"):
        refopt.init(Hyperball(SGD(), lr=0.1), {"a": np.ones(3), "b": [np.zeros((2, 2))]})


def test_b11_b_zero_direction_leaves_w_unchanged():
    w = np.diag([3.0, 4.0])
    out = one_step(Hyperball(SGD(), lr=0.1), w, np.zeros((2, 2)))
    assert np.array_equal(out, w)


def test_zero_direction_projects_an_off_sphere_start():
    w = np.diag([3.0, 4.0])                                   # ||w|| = 5, radius 10: R N(w) = 2 w
    out = one_step(Hyperball(SGD(), lr=0.1, radius=10.0), w, np.zeros((2, 2)))
    np.testing.assert_allclose(out, 2 * w, rtol=1e-15)


def test_step_through_the_origin_is_finite_and_recovers():
    w = np.diag([3.0, 4.0])
    rule = Hyperball(SGD(), lr=1.0)                           # y = W - 1 * 5 * W/5 = 0
    state = refopt.init(rule, w)
    x, state = refopt.update(rule, state, w, w.copy())
    assert np.all(np.isfinite(x)) and not np.any(x)
    x, state = refopt.update(rule, state, x, np.ones((2, 2)))
    np.testing.assert_allclose(x, -2.5 * np.ones((2, 2)), rtol=1e-15)  # 5 * N(-ones)


# ---- the radius ----------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 31), lr=st.floats(1e-4, 2.0), base=st.sampled_from(["sgd", "adam"]),
       shape=st.sampled_from([(7,), (5, 3), (2, 3, 4)]), scale=st.floats(1e-3, 1e3))
def test_norm_stays_R_after_100_steps(seed, lr, base, shape, scale):
    rng = np.random.default_rng(seed)
    w = scale * rng.standard_normal(shape)
    R = np.linalg.norm(w)
    rule = Hyperball(SGD(momentum=0.9) if base == "sgd" else Adam(), lr=lr)
    state = refopt.init(rule, w)
    for _ in range(100):
        w, state = refopt.update_(rule, state, w, rng.standard_normal(shape))
    assert abs(np.linalg.norm(w) - R) <= 1e-12 * R


def test_radius_is_kept_in_the_state_not_reread_from_w():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4))
    R = np.linalg.norm(w)
    rule = Hyperball(SGD(), lr=0.1)
    state = refopt.init(rule, w)
    assert abs(float(state.leaves.radius) - R) <= 1e-15 * R
    x, state = refopt.update(rule, state, w, rng.standard_normal((3, 4)))
    x = 3.0 * x                                               # someone rescales the weights between steps
    x, state = refopt.update(rule, state, x, rng.standard_normal((3, 4)))
    assert abs(np.linalg.norm(x) - R) <= 1e-14 * R            # projected back to R, not 3R


def test_state_round_trip_through_npz_resumes_bit_for_bit():
    """R is an array in the state, so an npz checkpoint carries it (PITFALLS B11, dion PR #71)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4))
    gs = [rng.standard_normal((3, 4)) for _ in range(6)]
    rule = Hyperball(Adam(), lr=0.1)
    x, state = w, refopt.init(rule, w)
    for g in gs[:3]:
        x, state = refopt.update(rule, state, x, g)
    leaves, _, treedef = refopt.tree.flatten(state.leaves)
    buf = io.BytesIO()
    np.savez(buf, x=x, *leaves)
    buf.seek(0)
    z = np.load(buf)
    x2 = z["x"]
    loaded = [z[f"arr_{i}"] for i in range(len(leaves))]
    state2 = refopt.OptState(state.t, state.glob, refopt.tree.unflatten(treedef, loaded))
    assert float(state2.leaves.radius) == float(state.leaves.radius)
    assert abs(float(state2.leaves.radius) - np.linalg.norm(w)) <= 1e-15 * np.linalg.norm(w)
    for g in gs[3:]:
        x, state = refopt.update(rule, state, x, g)
        x2, state2 = refopt.update(rule, state2, x2, g)
    assert np.array_equal(x, x2)


def test_scale_covariance_of_the_trajectory():
    """Hyperball is covariant too: (c1 W, c2 g) gives c1 times the trajectory (default radius)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 4))
    gs = [rng.standard_normal((4, 4)) for _ in range(5)]
    c1, c2 = 1e-3, 1e5
    rule = Hyperball(SGD(momentum=0.9), lr=0.1)
    a, sa = w, refopt.init(rule, w)
    b, sb = c1 * w, refopt.init(rule, c1 * w)
    for g in gs:
        a, sa = refopt.update(rule, sa, a, g)
        b, sb = refopt.update(rule, sb, b, c2 * g)
    assert rel_err(b, c1 * a) <= 1e-13


# ---- dtypes, purity ------------------------------------------------------------------------------

def test_float32_stays_float32_and_on_the_sphere():
    params = tree_params(dtype=np.float32)
    rule = Hyperball(Adam(), lr=0.05)
    state = refopt.init(rule, params)
    R = {p: np.linalg.norm(a.astype(np.float64)) for p, a in zip(refopt.tree.paths(params), refopt.tree.leaves(params))}
    x = params
    for g in grad_seq(params, 20):
        x, state = refopt.update(rule, state, x, g)
    for p, a in zip(refopt.tree.paths(x), refopt.tree.leaves(x)):
        assert a.dtype == np.float32
        assert abs(np.linalg.norm(a.astype(np.float64)) - R[p]) <= 1e-6 * R[p]
    assert all(a.dtype == np.float32 for a in refopt.tree.leaves(state.leaves))


def test_update_and_update_inplace_are_bit_identical_and_pure():
    params = tree_params()
    grads = grad_seq(params, 4)
    rule = Hyperball(SGD(momentum=0.9, nesterov=True), lr=0.05)
    s1 = refopt.init(rule, params)
    frozen = refopt.tree.copy(params)
    x1 = params
    for g in grads:
        x1, s1 = refopt.update(rule, s1, x1, g)
    for a, b in zip(refopt.tree.leaves(params), refopt.tree.leaves(frozen)):
        assert np.array_equal(a, b)
    x2 = refopt.tree.copy(params)
    s2 = refopt.init(rule, x2)
    for g in grads:
        x2, s2 = refopt.update_(rule, s2, x2, g)
    for a, b in zip(refopt.tree.leaves((x1, s1.leaves)), refopt.tree.leaves((x2, s2.leaves))):
        assert np.array_equal(a, b)


# ---- the norm helper ------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 1e-200, 1e200, 1e-310])
def test_fro_norm_is_scale_safe(scale):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(50_000)                           # several blocks
    expected = math.sqrt(math.fsum(a * a))
    got = fro_norm(scale * a)
    assert abs(got - scale * expected) <= (1e-14 if scale >= 1e-300 else 1e-9) * scale * expected
    assert fro_norm(np.zeros((3, 0))) == 0.0 and fro_norm(np.zeros(5)) == 0.0


def test_fro_norm_float32_accumulates_in_float64():
    a = np.full(2 ** 20, 0.1, np.float32)                     # float32 accumulation would drift
    expected = math.sqrt(2 ** 20) * float(np.float32(0.1))
    assert abs(fro_norm(a) - expected) <= 1e-13 * expected


# ---- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(base=SGD(), lr=-0.1), "lr"),
    (dict(base=SGD(), lr=0.1, radius=0.0), "radius"),
    (dict(base=SGD(), lr=0.1, radius=float("nan")), "radius"),
    (dict(base="sgd", lr=0.1), "base"),
    (dict(base=AdamW(weight_decay=0.01), lr=0.1), "weight_decay"),
    (dict(base=AdamW(weight_decay=0.01, wd_mode="independent"), lr=0.1), "weight_decay"),
    (dict(base=SGD(schedule=lambda t: 1.0), lr=0.1), "schedule"),
    (dict(base=SGD(), lr=0.1, schedule=3.0), "schedule"),
])
def test_bad_hyperparameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Hyperball(**kwargs)


def test_base_without_direction_raises():
    from refopt.rules.averaging import EMA
    with pytest.raises(ValueError, match="no additive direction"):
        Hyperball(EMA(SGD(), 0.9), lr=0.1)


def test_muon_with_decoupled_weight_decay_is_refused():
    muon = pytest.importorskip("refopt.rules.muon")
    with pytest.raises(ValueError, match="weight_decay"):
        Hyperball(muon.Muon(weight_decay=0.1), lr=0.02)
    with pytest.raises(ValueError, match=r"w.*shape"):         # the base still restricts the leaves
        refopt.init(Hyperball(muon.Muon(), lr=0.02), {"w": np.ones(3)})


def test_nested_base_rules_are_checked_too():
    from refopt.rules.covariant import Covariant
    from refopt.rules.partition import Partition, matrix_labels
    with pytest.raises(ValueError, match="AdamW.*weight_decay"):
        Hyperball(Partition(rules={"hidden": SGD(), "other": AdamW(weight_decay=0.1)}, labels=matrix_labels), lr=0.1)
    with pytest.raises(ValueError, match="Covariant.*schedule"):
        Hyperball(Covariant(SGD(), lr=0.1, schedule=lambda t: 1.0), lr=0.1)


# --- edge cases: tiny / huge directions, non-finite parameters, NaN-propagating norm -------------------

def _unit_dir(g):
    """g / ||g||_F computed without overflow (divide by max|g| first), in float64."""
    v = g.astype(np.float64) / np.max(np.abs(g.astype(np.float64)))
    return v / np.sqrt(np.sum(v * v))


@pytest.mark.parametrize("dtype,tiny", [(np.float64, 1e-310), (np.float32, 1e-42),
                                        (np.float32, 3e38)])     # huge u: the factor would be subnormal
def test_tiny_subnormal_direction_gives_relative_step(dtype, tiny):
    # lr*R/||u|| overflows (float64; float32 once cast): the step must be finite, not nan
    W = np.ones((2, 2), dtype)
    g = np.diag([tiny, tiny]).astype(dtype)
    assert g[0, 0] != 0
    rule = Hyperball(SGD(), lr=0.5)
    x, _ = refopt.update(rule, refopt.init(rule, W), W, g)
    R = 2.0
    y = W.astype(np.float64) - 0.5 * R * _unit_dir(g)
    expect = R * y / np.sqrt(np.sum(y * y))
    assert x.dtype == dtype and np.isfinite(x).all()
    np.testing.assert_allclose(x, expect, rtol=1e-6 if dtype == np.float32 else 1e-13)


def test_fro_norm_propagates_nan_and_inf():
    assert math.isnan(fro_norm(np.full((2, 3), np.nan)))
    assert math.isnan(fro_norm(np.array([np.inf, np.nan])))
    assert math.isnan(fro_norm(np.array([1e300, np.nan], np.float64)))
    assert fro_norm(np.array([np.inf, 1.0])) == math.inf
    assert math.isnan(fro_norm(np.array([np.nan, 1.0], np.float32)))


def test_fro_norm_block_sums_overflowing_together():
    # every block's sum of squares is finite but their total overflows (exact fsum raised OverflowError)
    from refopt.linalg.norms import NORM_BLOCK
    a = np.full(2 * NORM_BLOCK, 1e152)
    assert fro_norm(a) == pytest.approx(1e152 * math.sqrt(2 * NORM_BLOCK), rel=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("radius", [None, 1.0])
def test_nonfinite_params_at_init_raise_naming_path(dtype, bad, radius):
    W = np.ones((2, 2), dtype)
    W[0, 1] = bad
    with pytest.raises(ValueError, match=r"layer\.w.*nan or inf"):
        refopt.init(Hyperball(SGD(), lr=0.1, radius=radius), {"layer": {"w": W}})


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_params_during_step_raise_naming_path(dtype, bad):
    rule = Hyperball(SGD(), lr=0.1)
    params = {"w": np.ones((2, 2), dtype)}
    state = refopt.init(rule, params)
    params["w"][1, 0] = bad
    with pytest.raises(FloatingPointError, match=r"weights at w"):
        refopt.update(rule, state, params, {"w": np.ones((2, 2), dtype)})
    with pytest.raises(FloatingPointError, match=r"weights at w"):   # zero direction: no step, still checked
        refopt.update(rule, state, params, {"w": np.zeros((2, 2), dtype)})

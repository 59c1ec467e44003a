"""COCOB-Backprop written from Orabona & Tommasi (2017), Algorithm 2, entry by entry in plain Python floats, on a
two-leaf tree over four steps, in optax's conventions (L_0 = eps, lr and L2 decay on the gradient); the fused
multiply-adds of jitted optax from exact rational arithmetic, bit for bit; negative controls: the running maximum
of |g| dropped, the alpha floor dropped, the reward not clipped, eps in the denominator, lr on the step, and a
numpy implementation without the alpha floor named by the diagnosis."""
import math
from fractions import Fraction

import numpy as np
import pytest

import refopt
from refopt.crosscheck.plugin import check_impl
from refopt.rules.cocob import COCOB, COCOBState
from tree_steps import run


def _tree(seed=3, steps=4):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) for k, v in x0.items()} for _ in range(steps)]
    return x0, gs


def _fma(a, b, d):
    """a * b + d rounded once (exact rationals, one rounding to float64)."""
    return float(Fraction(a) * Fraction(b) + Fraction(d))


def algorithm2(x0, gs, lr, alpha, eps, wd, bug=None, fused=None):
    """Algorithm 2 on each entry: the paper's (negative) subgradient is -lr (g + wd x); L_0 = eps (optax's).
    ``fused`` None: w_{t+1} as the paper writes it; False / True: optax's x + (-x + w_{t+1}) with every product
    rounded / the multiply-adds rounded once (as XLA compiles optax's jitted step). Returns the params and the
    state {theta, scale, abs_sum, reward} per leaf."""
    out, state = {}, {}
    for k, w1 in x0.items():
        n = w1.size
        w = w1.ravel().tolist()
        L = [0.0 if bug == "eps denominator" else eps] * n
        G, R, theta = [0.0] * n, [0.0] * n, [0.0] * n
        for g in gs:
            gk = g[k].ravel().tolist()
            for i in range(n):
                x = w[i]
                u = (_fma(wd, x, gk[i]) if fused else gk[i] + wd * x) if wd else gk[i]
                neg = -(u if bug == "lr on step" else lr * u)        # the paper's g_{t,i}
                L[i] = max(eps, abs(neg)) if bug == "no max" else max(L[i], abs(neg))
                G[i] = G[i] + abs(neg)
                r = _fma(neg, x - w1.flat[i], R[i]) if fused else R[i] + (x - w1.flat[i]) * neg
                R[i] = r if bug == "unclipped" else max(r, 0.0)
                theta[i] = _fma(-lr, u, theta[i]) if fused else theta[i] + neg
                m = G[i] + L[i] if bug == "no floor" else max(G[i] + L[i], alpha * L[i])
                den = L[i] * m + (eps if bug == "eps denominator" else 0.0)
                frac = theta[i] / den
                bet = lr * frac * (L[i] + R[i]) if bug == "lr on step" else frac * (L[i] + R[i])
                nxt = _fma(frac, L[i] + R[i], w1.flat[i]) if fused else w1.flat[i] + bet
                w[i] = nxt if fused is None else x + (nxt - x)
        shape = w1.shape
        out[k] = np.array(w).reshape(shape)
        state[k] = {f: np.array(v).reshape(shape) for f, v in
                    (("theta", theta), ("scale", L), ("abs_sum", G), ("reward", R))}
    return out, state


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


KW = dict(lr=0.5, alpha=20.0, eps=1e-3, wd=0.05)


def _rule(**kw):
    return COCOB(lr=KW["lr"], alpha=KW["alpha"], eps=KW["eps"], weight_decay=KW["wd"], **kw)


@pytest.mark.parametrize("fma", [True, False])
def test_cocob_four_steps_from_algorithm_2(fma):
    x0, gs = _tree()
    x, s = run(_rule(fma=fma), x0, gs)
    want, st = algorithm2(x0, gs, **KW)
    for k in x0:
        np.testing.assert_allclose(x[k], want[k], rtol=1e-14, atol=1e-15)
        for f in ("theta", "scale", "abs_sum", "reward"):
            np.testing.assert_allclose(getattr(s.leaves[k], f), st[k][f], rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(s.leaves[k].x0, x0[k])
    assert any(np.any(s.leaves[k].reward > 0) for k in x0)          # the reward's clip is exercised both ways
    assert any(np.any(s.leaves[k].reward == 0) for k in x0)
    # negative controls, each far beyond the tolerance above
    for bug in ("no max", "no floor", "unclipped", "eps denominator", "lr on step"):
        assert _gap(algorithm2(x0, gs, **KW, bug=bug)[0], x) > 1e-6, bug


def test_cocob_fused_multiply_adds_bit_for_bit():
    """fma=True rounds u = g + wd x, Reward - g~ (x - x_1), theta - lr u and x_1 + q (L + Reward) once each (what
    jax.jit makes of optax's step); fma=False rounds every product. Both bit for bit against exact rationals."""
    x0, gs = _tree(5, steps=6)
    for fused in (True, False):
        x, s = run(_rule(fma=fused), x0, gs)
        want, st = algorithm2(x0, gs, **KW, fused=fused)
        for k in x0:
            np.testing.assert_array_equal(x[k], want[k])
            np.testing.assert_array_equal(s.leaves[k].theta, st[k]["theta"])
            np.testing.assert_array_equal(s.leaves[k].reward, st[k]["reward"])
    # the two roundings differ (by ulps), and the unfused reference is not the fused one
    a, _ = run(_rule(fma=True), x0, gs)
    b, _ = run(_rule(fma=False), x0, gs)
    assert 0 < _gap(a, b) < 1e-13


def test_cocob_first_step_and_zero_gradients():
    """Step 1 (Reward = 0): x_2 = x_1 - sign(g) / alpha for |lr g| > eps; an entry whose gradients are 0 stays
    at x_1 (L = eps keeps the denominator positive: no 0/0)."""
    x0 = np.array([0.3, -1.2, 2.0, 0.7])
    g = np.array([2.0, -0.5, 0.0, 1e-12])
    rule = COCOB(alpha=50.0, eps=1e-8)
    x, s = refopt.update(rule, refopt.init(rule, x0), x0, g)
    np.testing.assert_allclose(x[:2], x0[:2] - np.sign(g[:2]) / 50.0, rtol=1e-15)
    assert x[2] == x0[2]
    np.testing.assert_allclose(x[3], x0[3] - 1e-12 / (50.0 * 1e-8), rtol=1e-14)   # |g| < eps: L stays eps
    np.testing.assert_array_equal(s.leaves.scale, [2.0, 0.5, 1e-8, 1e-8])
    for _ in range(3):
        x, s = refopt.update(rule, s, x, np.zeros(4))
    assert np.all(np.isfinite(x)) and x[2] == x0[2]


def test_cocob_lr_is_a_scale_of_the_gradient():
    """The bet has degree 0 in the gradient (L2 decay included, as lr scales g + wd x): lr changes the step only
    against eps. Negative control: with eps above the scaled gradients it does change the step."""
    x0, gs = _tree(7)
    a, _ = run(COCOB(lr=1.0, eps=1e-100, weight_decay=0.1), x0, gs)
    b, _ = run(COCOB(lr=3.0, eps=1e-100, weight_decay=0.1), x0, gs)
    assert _gap(a, b) < 1e-13
    c, _ = run(COCOB(lr=1e-3, eps=1e-2), x0, gs)
    d, _ = run(COCOB(lr=1.0, eps=1e-2), x0, gs)
    assert _gap(c, d) > 1e-3


def test_cocob_float32_stays_float32():
    x0, gs = _tree()
    x32 = {k: v.astype(np.float32) for k, v in x0.items()}
    g32 = [{k: v.astype(np.float32) for k, v in g.items()} for g in gs]
    x, s = run(_rule(), x32, g32)
    want, _ = algorithm2(x0, gs, **KW)
    for k in x0:
        assert x[k].dtype == np.float32
        assert all(a.dtype == np.float32 for a in s.leaves[k])
        np.testing.assert_allclose(x[k], want[k], rtol=2e-5, atol=2e-6)


def test_cocob_has_no_additive_direction():
    x = np.ones(3)
    rule = COCOB()
    with pytest.raises(NotImplementedError):
        refopt.direction(rule, refopt.init(rule, x), x, x)


def test_cocob_bad_input():
    for bad in (dict(lr=-1.0), dict(lr=math.inf), dict(alpha=0.0), dict(alpha=-1.0), dict(eps=0.0),
                dict(eps=-1e-8), dict(weight_decay=-0.1), dict(fma=1), dict(alpha=True), dict(schedule=3)):
        with pytest.raises(ValueError):
            COCOB(**bad)
    # eps max(eps, alpha eps) underflows in float32 (not in float64): refused at init
    with pytest.raises(ValueError, match="eps"):
        refopt.init(COCOB(eps=1e-30), np.ones(2, np.float32))
    assert isinstance(refopt.init(COCOB(eps=1e-30), np.ones(2)).leaves, COCOBState)


def test_cocob_like_optax():
    like = refopt.like
    assert like("optax.contrib.cocob") == COCOB()
    assert like("optax.contrib.cocob", learning_rate=0.5, alpha=50.0, eps=1e-6, weight_decay=0.01) == \
        COCOB(lr=0.5, alpha=50.0, eps=1e-6, weight_decay=0.01)
    with pytest.raises(ValueError, match="learning_rate.*schedule"):
        like("optax.contrib.cocob", learning_rate=lambda c: 0.1)
    with pytest.raises(ValueError, match="eps.*eps > 0"):
        like("optax.contrib.cocob", eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        like("optax.contrib.cocob", weight_decay=lambda c: 0.1)
    with pytest.raises(ValueError, match="mask.*Partition"):
        like("optax.contrib.cocob", mask=lambda p: p)
    with pytest.raises(ValueError, match="no argument 'momentum'"):
        like("optax.contrib.cocob", momentum=0.9)


class NumpyCOCOB:
    """COCOB-Backprop in numpy over a list of arrays (every product rounded), with one planted bug."""

    def __init__(self, alpha=20.0, eps=1e-6, bug=None):
        self.alpha, self.eps, self.bug = alpha, eps, bug

    def init(self, params):
        z = [np.zeros_like(x) for x in params]
        return {"x0": [x.copy() for x in params], "L": [np.full_like(x, self.eps) for x in params],
                "G": list(z), "R": list(z), "theta": list(z)}

    def step(self, s, params, grads):
        out, state = [], {k: [] for k in s}
        for x, g, x0, L, G, R, th in zip(params, grads, s["x0"], s["L"], s["G"], s["R"], s["theta"]):
            L, G = np.maximum(L, np.abs(g)), G + np.abs(g)
            R, th = np.maximum(R - g * (x - x0), 0.0), th - g
            m = G + L if self.bug == "no floor" else np.maximum(G + L, self.alpha * L)
            out.append(x0 + th / (L * m) * (L + R))
            for k, v in (("x0", x0), ("L", L), ("G", G), ("R", R), ("theta", th)):
                state[k].append(v)
        return out, state


def test_a_cocob_without_the_alpha_floor_is_named():
    rule = "COCOB(alpha=20.0, eps=1e-6, fma=False)"
    r = check_impl(NumpyCOCOB(bug="no floor"), rule, framework="numpy", steps=10, problems=("stream", "quadratic"))
    assert not r.agree and r.best.name == "no alpha floor" and r.best.reproduces, r.report()
    # negative control: the same implementation with the floor agrees
    assert check_impl(NumpyCOCOB(), rule, framework="numpy", steps=10, problems=("stream", "quadratic")).agree

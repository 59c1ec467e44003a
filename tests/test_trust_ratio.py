"""LARS (You et al. 2017, Algorithm 1) and LAMB (You et al. 2020, Algorithm 2) in optax's forms, against
references written from the papers' equations here, closed forms (the relative step of LARS without momentum
is lr * trust_coefficient exactly) and negative controls: the paper's LARS denominator ||g|| + wd ||x||, the
ratio of the momentum (Covariant's order), LAMB's decay after the ratio, no step at a zero norm."""
import numpy as np
import pytest

import refopt
from tree_steps import run


def _norm(a):
    return float(np.sqrt(np.sum(a * a)))


def lars_reference(x0, gs, lr, mu, wd, eta, eps, nesterov=False, paper_ratio=False, momentum_first=False):
    x, b = x0.copy(), 0 * x0
    for g in gs:
        u = g + wd * x
        if momentum_first:
            b = mu * b + u
            x = x - lr * eta * _norm(x) / _norm(b) * b
            continue
        den = _norm(g) + wd * _norm(x) if paper_ratio else _norm(u) + eps
        r = 1.0 if _norm(x) == 0 or _norm(u) == 0 else eta * _norm(x) / den
        b = mu * b + lr * r * u
        x = x - (lr * r * u + mu * b if nesterov else b)
    return x


def lamb_reference(x0, gs, lr, b1, b2, eps, eps_root, wd, decay_after=False):
    x, m, v = x0.copy(), 0 * x0, 0 * x0
    for t, g in enumerate(gs, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        a = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t) + eps_root) + eps)
        if decay_after:
            x = x - lr * (_norm(x) / _norm(a) * a + wd * x)
            continue
        u = a + wd * x
        r = 1.0 if _norm(x) == 0 or _norm(u) == 0 else _norm(x) / _norm(u)
        x = x - lr * r * u
    return x


def _problem(seed=5, steps=7):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((4, 3)), "b": np.zeros(3)}          # a zero-initialised bias
    gs = [{"w": rng.standard_normal((4, 3)), "b": 3 * rng.standard_normal(3)} for _ in range(steps)]
    return x0, gs


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_from_the_algorithm(nesterov):
    x0, gs = _problem()
    kw = dict(lr=0.1, mu=0.8, wd=0.01, eta=0.02, eps=1e-3)
    rule = refopt.LARS(lr=0.1, momentum=0.8, weight_decay=0.01, trust_coefficient=0.02, eps=1e-3, nesterov=nesterov)
    x, _ = run(rule, x0, gs)
    for k in ("w", "b"):
        want = lars_reference(x0[k], [g[k] for g in gs], **kw, nesterov=nesterov)
        np.testing.assert_allclose(x[k], want, rtol=1e-13, atol=1e-16)
    # negative controls: the paper's denominator, the ratio of the momentum, another Nesterov setting
    w = [g["w"] for g in gs]
    want = lars_reference(x0["w"], w, **kw, nesterov=nesterov)
    for wrong in (dict(paper_ratio=True), dict(momentum_first=True), dict(nesterov=not nesterov)):
        assert np.max(np.abs(lars_reference(x0["w"], w, **{**kw, "nesterov": nesterov, **wrong}) - want)) > 1e-6


def test_lars_without_momentum_has_relative_step_lr_times_eta():
    """b = r u with r = eta ||x||/||u||: ||x_t - x_{t-1}|| / ||x_{t-1}|| = lr eta whatever g (closed form)."""
    rng = np.random.default_rng(1)
    rule = refopt.LARS(lr=0.5, momentum=0.0, trust_coefficient=0.04)
    x = {"w": rng.standard_normal((5, 2))}
    s = refopt.init(rule, x)
    for scale in (1e-3, 1.0, 1e4):
        g = {"w": scale * rng.standard_normal((5, 2))}
        x1, s = refopt.update(rule, s, x, g)
        assert abs(_norm(x1["w"] - x["w"]) / _norm(x["w"]) - 0.02) < 1e-14
        x = x1


def test_a_zero_bias_moves_by_minus_lr_u_as_in_optax():
    x0, gs = _problem(steps=1)
    x, _ = run(refopt.LARS(lr=0.1, momentum=0.9), x0, gs)
    np.testing.assert_array_equal(x["b"], -0.1 * gs[0]["b"])                  # ratio 1 at ||x|| = 0
    x, _ = run(refopt.LAMB(lr=0.1), x0, gs)
    np.testing.assert_allclose(x["b"], -0.1 * gs[0]["b"] / (np.abs(gs[0]["b"]) + 1e-6), rtol=1e-15)
    # Covariant (the ELR form) makes no step there: the atlas entry trust-ratio-zero-norm
    x, _ = run(refopt.Covariant(refopt.Adam(eps=1e-6), lr=0.1), x0, gs)
    np.testing.assert_array_equal(x["b"], 0.0)


def test_lamb_from_the_algorithm():
    x0, gs = _problem()
    kw = dict(lr=0.01, b1=0.8, b2=0.95, eps=1e-4, eps_root=1e-8, wd=0.05)
    rule = refopt.LAMB(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-4, eps_root=1e-8, weight_decay=0.05)
    x, s = run(rule, x0, gs)
    for k in ("w", "b"):
        want = lamb_reference(x0[k], [g[k] for g in gs], **kw)
        np.testing.assert_allclose(x[k], want, rtol=1e-13, atol=1e-16)
    w = [g["w"] for g in gs]
    assert np.max(np.abs(lamb_reference(x0["w"], w, **kw, decay_after=True) - x["w"])) > 1e-6
    assert np.max(np.abs(lamb_reference(x0["w"], w, **{**kw, "wd": 0.0}) - x["w"])) > 1e-6


def test_lamb_without_decay_is_covariant_adam_on_non_zero_arrays():
    rng = np.random.default_rng(2)
    x0 = {"w": rng.standard_normal((3, 3)), "b": rng.standard_normal(3)}
    gs = [{"w": rng.standard_normal((3, 3)), "b": rng.standard_normal(3)} for _ in range(5)]
    a, _ = run(refopt.LAMB(lr=0.02, eps=1e-6), x0, gs)
    b, _ = run(refopt.Covariant(refopt.Adam(eps=1e-6), lr=0.02), x0, gs)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-14)


def test_like_the_optax_calls_and_what_is_refused():
    assert refopt.like("optax.lars", learning_rate=0.1) == refopt.LARS(lr=0.1, momentum=0.9, trust_coefficient=1e-3)
    assert refopt.like("optax.lamb", learning_rate=0.01, weight_decay=0.1) == refopt.LAMB(lr=0.01, weight_decay=0.1)
    for peer, bad, word in (("optax.lars", dict(weight_decay_mask=False), "Partition"),
                            ("optax.lars", dict(trust_ratio_mask=lambda p: p), "Partition"),
                            ("optax.lamb", dict(mask=lambda p: p), "Partition"),
                            ("optax.lamb", dict(learning_rate=lambda t: 0.1), "constant")):
        with pytest.raises(ValueError, match=word):
            refopt.like(peer, **{"learning_rate": 0.1, **bad})


def test_bad_hyperparameters_and_a_mismatched_state():
    for bad in (dict(lr=-1.0), dict(momentum=1.0), dict(weight_decay=-1.0), dict(trust_coefficient=0.0),
                dict(eps=-1.0), dict(nesterov=1)):
        with pytest.raises(ValueError):
            refopt.LARS(**bad)
    for bad in (dict(beta1=1.0), dict(beta2=-0.1), dict(eps=-1.0), dict(eps=0.0, eps_root=0.0),
                dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            refopt.LAMB(**bad)
    rule = refopt.LARS(lr=0.1)
    x = {"w": np.ones((2, 2))}
    s = refopt.init(rule, x)
    bad_state = s._replace(leaves={"w": s.leaves["w"]._replace(b=np.zeros(3))})
    with pytest.raises(ValueError, match="w"):
        refopt.update(rule, bad_state, x, {"w": np.ones((2, 2))})
    with pytest.raises(NotImplementedError):
        refopt.direction(rule, s, x, {"w": np.ones((2, 2))})      # b holds lr-scaled steps


def test_float32_stays_float32():
    rule = refopt.LAMB(lr=0.01, weight_decay=0.01)
    x = {"w": np.ones((2, 3), np.float32)}
    x1, s = refopt.update(rule, refopt.init(rule, x), x, {"w": np.full((2, 3), 0.5, np.float32)})
    assert x1["w"].dtype == np.float32 and s.leaves["w"].m.dtype == np.float32


def test_fromage_from_the_algorithm_and_its_norm_preservation():
    """Bernstein et al. (2020), Algorithm 1: x_t = (x - lr ||x||/||g|| g)/sqrt(1 + lr^2); for g orthogonal to
    x the norm is kept exactly (closed form); negative control: without the shrink it grows by sqrt(1 + lr^2)."""
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((4, 5))
    gs = [rng.standard_normal((4, 5)) for _ in range(6)]
    lr, n0 = 0.3, 0.5
    rule = refopt.Fromage(lr=lr, min_norm=n0)
    x, s = {"w": x0}, refopt.init(rule, {"w": x0})
    want = x0.copy()
    for g in gs:
        x, s = refopt.update(rule, s, x, {"w": g})
        want = (want - lr * max(_norm(want), n0) / max(_norm(g), n0) * g) / np.sqrt(1 + lr * lr)
    np.testing.assert_allclose(x["w"], want, rtol=1e-14)
    g = rng.standard_normal((4, 5))
    g -= np.sum(g * x0) / np.sum(x0 * x0) * x0                                   # g orthogonal to x
    x1, _ = refopt.update(refopt.Fromage(lr=lr, min_norm=0.0), refopt.init(rule, {"w": x0}), {"w": x0}, {"w": g})
    assert abs(_norm(x1["w"]) / _norm(x0) - 1) < 1e-14
    no_shrink = x0 - lr * _norm(x0) / _norm(g) * g
    assert abs(_norm(no_shrink) / _norm(x0) - np.sqrt(1 + lr * lr)) < 1e-14      # the wrong variant grows
    with pytest.raises(ValueError):
        refopt.Fromage(min_norm=-1.0)
    assert refopt.like("optax.fromage", learning_rate=0.3) == refopt.Fromage(lr=0.3, min_norm=1e-6)

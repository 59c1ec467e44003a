"""Adan written from Xie et al. (2022), Algorithm 1, in optax's beta convention, on two steps with different
gradients; negative controls: a first-step difference g_1 - 0, the paper's proximal decay."""
import numpy as np
import pytest

import refopt


def two_steps(x0, g1, g2, lr, b1, b2, b3, eps, er, wd, first_diff_zero=True, proximal=False):
    x, m, v, n, prev = x0.copy(), 0 * x0, 0 * x0, 0 * x0, 0 * x0
    for t, g in ((1, g1), (2, g2)):
        d = 0 * g if (t == 1 and first_diff_zero) else g - prev
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * d
        n = b3 * n + (1 - b3) * (g + (1 - b2) * d) ** 2
        u = (m / (1 - b1 ** t) + (1 - b2) * v / (1 - b2 ** t)) / (np.sqrt(n / (1 - b3 ** t) + er) + eps)
        x = (x - lr * u) / (1 + lr * wd) if proximal else x - lr * (u + wd * x)
        prev = g
    return x


def test_adan_two_steps_from_the_algorithm():
    rng = np.random.default_rng(11)
    x0, g1, g2 = (rng.standard_normal(6) for _ in range(3))
    kw = dict(lr=0.05, b1=0.9, b2=0.8, b3=0.95, eps=1e-6, er=1e-8, wd=0.1)
    rule = refopt.Adan(lr=0.05, beta1=0.9, beta2=0.8, beta3=0.95, eps=1e-6, eps_root=1e-8, weight_decay=0.1)
    x, s = x0, refopt.init(rule, x0)
    for g in (g1, g2):
        x, s = refopt.update(rule, s, x, g)
    np.testing.assert_allclose(x, two_steps(x0, g1, g2, **kw), rtol=1e-14, atol=1e-15)
    np.testing.assert_array_equal(s.leaves.prev, g2)
    assert np.max(np.abs(two_steps(x0, g1, g2, **kw, first_diff_zero=False) - x)) > 1e-3
    assert np.max(np.abs(two_steps(x0, g1, g2, **kw, proximal=True) - x)) > 1e-5


def test_adan_bad_input():
    for bad in (dict(beta3=1.0), dict(eps=0.0), dict(eps_root=-1.0), dict(weight_decay=-0.1)):
        with pytest.raises(ValueError):
            refopt.Adan(**bad)
    with pytest.raises(ValueError, match="mask"):
        refopt.like("optax.adan", learning_rate=0.1, mask=lambda p: p)
    assert refopt.like("optax.adan", learning_rate=0.1) == refopt.Adan(lr=0.1)

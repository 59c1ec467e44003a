"""Adadelta against closed forms: with rho = 0 and a constant gradient the update is g sqrt(1 - q^t), q = g^2 /
(g^2 + eps) (E[dx^2]_t = dx_t^2, so dx_t^2 = q (dx_{t-1}^2 + eps), a geometric series with eps q / (1 - q) = g^2);
for any rho the first update is sqrt(eps) g / sqrt((1 - rho) g^2 + eps). Negative controls: eps outside the
square roots, the ratio inverted, a missing L2 term."""
import numpy as np
import pytest

import refopt


def _run(rule, x0, g, steps):
    x, s = x0, refopt.init(rule, x0)
    for _ in range(steps):
        x, s = refopt.update(rule, s, x, g)
    return x, s


def test_adadelta_rho_zero_matches_its_closed_form():
    rng = np.random.default_rng(5)
    x0, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    lr, eps, T = 0.7, 1e-2, 15
    x, s = _run(refopt.Adadelta(lr=lr, rho=0.0, eps=eps), x0, g, T)
    q = g * g / (g * g + eps)
    t = np.arange(1, T + 1)[:, None, None]
    want = x0 - lr * np.sum(g * np.sqrt(1 - q ** t), axis=0)
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(s.leaves.edx2, g * g * (1 - q ** T), rtol=1e-13)
    np.testing.assert_allclose(s.leaves.eg2, g * g, rtol=1e-15)
    # negative control: eps outside the square roots ((sqrt(D) + eps) / (|g| + eps) g) is far from the result
    xo, d = x0.copy(), np.zeros_like(g)
    for _ in range(T):
        dx = (np.sqrt(d) + eps) / (np.abs(g) + eps) * g
        d, xo = dx * dx, xo - lr * dx
    assert np.max(np.abs(xo - x)) > 1e-2


@pytest.mark.parametrize("rho", [0.5, 0.9, 0.99])
def test_adadelta_first_step_and_l2(rho):
    rng = np.random.default_rng(6)
    x0, g = rng.standard_normal(6), rng.standard_normal(6)
    eps, wd = 1e-3, 0.1
    x, _ = _run(refopt.Adadelta(lr=1.0, rho=rho, eps=eps, weight_decay=wd), x0, g, 1)
    ge = g + wd * x0
    want = x0 - np.sqrt(eps) * ge / np.sqrt((1 - rho) * ge * ge + eps)
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-15)
    # negative controls: the ratio inverted, the L2 term missing
    inv = x0 - np.sqrt((1 - rho) * ge * ge + eps) / np.sqrt(eps) * ge
    no_l2 = x0 - np.sqrt(eps) * g / np.sqrt((1 - rho) * g * g + eps)
    assert np.max(np.abs(inv - x)) > 1e-1 and np.max(np.abs(no_l2 - x)) > 1e-4


def test_adadelta_bad_input():
    for bad in (dict(lr=-1.0), dict(rho=1.0), dict(rho=-0.1), dict(eps=0.0), dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            refopt.Adadelta(**bad)
    with pytest.raises(ValueError, match="learning_rate=None"):
        refopt.like("optax.adadelta")
    with pytest.raises(ValueError, match="mask"):
        refopt.like("optax.adadelta", learning_rate=1.0, weight_decay_mask=lambda p: p)
    with pytest.raises(ValueError, match="maximize"):
        refopt.like("torch.optim.Adadelta", maximize=True)
    assert refopt.like("optax.adadelta", learning_rate=1.0) == refopt.like("torch.optim.Adadelta") == refopt.Adadelta()

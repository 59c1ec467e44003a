"""Adamax against its closed form under a constant gradient: m_t = (1 - beta1^t) g and u_t = |g| + eps, so
each step is lr g / (|g| + eps) (the bias correction cancels exactly), and with a decoupled decay
x_t = a x_{t-1} - lr r with a = 1 - lr wd: x_T = a^T x_0 - lr r (1 - a^T)/(1 - a). Negative controls: without
the bias correction, and with the decay as L2, the result is far off."""
import numpy as np
import pytest

import refopt


def _run(rule, x0, g, steps):
    x, s = x0, refopt.init(rule, x0)
    for _ in range(steps):
        x, s = refopt.update(rule, s, x, g)
    return x, s


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamax_matches_its_closed_form_under_a_constant_gradient(wd):
    rng = np.random.default_rng(5)
    x0, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    lr, b1, b2, eps, T = 0.05, 0.8, 0.95, 1e-2, 25
    rule = refopt.Adamax(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, decoupled_weight_decay=True)
    x, s = _run(rule, x0, g, T)
    r, a = g / (np.abs(g) + eps), 1 - lr * wd
    want = x0 - T * lr * r if wd == 0 else a ** T * x0 - lr * r * (1 - a ** T) / (1 - a)
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(s.leaves.u, np.abs(g) + eps, rtol=1e-15)
    np.testing.assert_allclose(s.leaves.m, (1 - b1 ** T) * g, rtol=1e-12)
    # negative controls: no bias correction (each step lr (1 - beta1^t) r), the decay as L2 in g
    if wd == 0:
        no_bc = x0 - lr * r * sum(1 - b1 ** t for t in range(1, T + 1))
        assert np.max(np.abs(no_bc - x)) > 1e-2
    else:
        l2, _ = _run(refopt.Adamax(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd), x0, g, T)
        assert np.max(np.abs(l2 - want)) > 1e-3


def test_adamax_rejects_bad_hyperparameters_and_peer_arguments():
    for bad in (dict(lr=-1.0), dict(beta1=1.0), dict(beta2=-0.1), dict(eps=0.0), dict(weight_decay=-1.0),
                dict(decoupled_weight_decay=1)):
        with pytest.raises(ValueError):
            refopt.Adamax(**bad)
    with pytest.raises(ValueError, match="mask"):
        refopt.like("optax.adamaxw", learning_rate=0.1, mask=lambda p: p)
    assert refopt.like("optax.adamaxw", learning_rate=0.1) == refopt.Adamax(
        lr=0.1, weight_decay=1e-4, decoupled_weight_decay=True)
    assert refopt.like("torch.optim.Adamax", betas=(0.8, 0.9), weight_decay=0.1) == refopt.Adamax(
        beta1=0.8, beta2=0.9, weight_decay=0.1)

"""ACProp written from Zhuang et al. (2021) in optax.contrib.acprop's conventions, on three steps with different
gradients; negative controls: the synchronous update (this step's s), the paper's deviation from the updated m."""
import numpy as np
import pytest

import refopt


def three_steps(x0, gs, lr, b1, b2, eps, er, wd, sync=False, updated_m=False):
    """g / (sqrt(s_{t-1} / (1 - b2^(t-1))) + eps) with s_hat_0 = 1; s the EMA of (g - m_{t-1})^2 + er."""
    x, m, s = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for t, g in enumerate(gs, start=1):
        m_t = b1 * m + (1 - b1) * g
        s_t = b2 * s + (1 - b2) * (g - (m_t if updated_m else m)) ** 2 + er
        if sync:
            den = np.sqrt(s_t / (1 - b2 ** t)) + eps
        else:
            den = (1.0 + eps) if t == 1 else np.sqrt(s / (1 - b2 ** (t - 1))) + eps
        x = x - lr * (g / den + wd * x)
        m, s = m_t, s_t
    return x, m, s


KW = dict(lr=0.05, b1=0.8, b2=0.95, eps=1e-6, er=1e-10, wd=0.1)


def _rule():
    return refopt.ACProp(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6, eps_root=1e-10, weight_decay=0.1)


def test_acprop_three_steps_from_the_algorithm():
    rng = np.random.default_rng(5)
    x0, *gs = (rng.standard_normal(7) for _ in range(4))
    rule = _rule()
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    want, m, v = three_steps(x0, gs, **KW)
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s.leaves.m, m, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s.leaves.s, v, rtol=1e-14, atol=1e-15)
    # negative controls: the synchronous update and the paper's deviation from m_t differ clearly
    assert np.max(np.abs(three_steps(x0, gs, **KW, sync=True)[0] - x)) > 1e-3
    assert np.max(np.abs(three_steps(x0, gs, **KW, updated_m=True)[0] - x)) > 1e-3


def test_acprop_first_step_is_the_gradient_over_one_plus_eps():
    x0, g = np.array([1.0, -2.0, 0.5]), np.array([0.3, 0.0, -4.0])
    rule = refopt.ACProp(lr=0.1, eps=1e-3)
    x, _ = refopt.update(rule, refopt.init(rule, x0), x0, g)
    np.testing.assert_allclose(x, x0 - 0.1 * g / (1.0 + 1e-3), rtol=1e-15)


def test_acprop_bad_input():
    for bad in (dict(lr=-1.0), dict(beta1=1.0), dict(beta2=-0.1), dict(eps=0.0), dict(eps_root=-1.0),
                dict(weight_decay=-0.1), dict(schedule=3)):
        with pytest.raises(ValueError):
            refopt.ACProp(**bad)


def test_acprop_like():
    assert refopt.like("optax.contrib.acprop", learning_rate=0.1) == refopt.ACProp(lr=0.1)
    assert refopt.like("optax.contrib.acprop", learning_rate=0.05, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10,
                       weight_decay=0.1) == _rule()
    with pytest.raises(ValueError, match="mask"):
        refopt.like("optax.contrib.acprop", learning_rate=0.1, mask=lambda p: p)
    with pytest.raises(ValueError, match="weight_decay"):
        refopt.like("optax.contrib.acprop", learning_rate=0.1, weight_decay=lambda t: 0.1)
    with pytest.raises(ValueError, match="eps"):
        refopt.like("optax.contrib.acprop", learning_rate=0.1, eps=0.0)
    with pytest.raises(ValueError, match="learning_rate"):
        refopt.like("optax.contrib.acprop", b1=0.9)
    with pytest.raises(ValueError, match="nesterov"):
        refopt.like("optax.contrib.acprop", learning_rate=0.1, nesterov=True)

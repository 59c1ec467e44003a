"""Signum, AdaBelief and Yogi against closed forms written from their papers' equations (no refopt code), each
with the negative control it must catch: Signum's sign after the momentum, AdaBelief's deviation from the
updated m, Yogi's additive sign step."""
import numpy as np
import pytest

import refopt


def _run(rule, x0, gs):
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    return x, s


def test_signum_takes_the_sign_of_the_momentum_not_of_the_gradient():
    # g_1 = a, g_2 = -a/2: m_2 = (1 - beta)(beta a - a/2) has the sign of a for beta = 0.9, signSGD the opposite
    a = np.array([1.0, -2.0, 3.0, 0.0])
    lr, beta = 0.1, 0.9
    x, s = _run(refopt.Signum(lr=lr, beta=beta), np.zeros(4), [a, -a / 2])
    np.testing.assert_array_equal(x, -lr * np.sign(a) * 2)
    np.testing.assert_allclose(s.leaves.m, (1 - beta) * (beta * a - a / 2), rtol=1e-15)
    xs, _ = _run(refopt.Signum(lr=lr, beta=0.0), np.zeros(4), [a, -a / 2])
    np.testing.assert_array_equal(xs, np.zeros(4))                      # signSGD: +sign then -sign
    # negative control: the EMA of signs (sign first) gives a smaller second step
    sign_first = -lr * ((1 - beta) * np.sign(a) + (beta * (1 - beta) * np.sign(a) - (1 - beta) * np.sign(a)))
    assert np.max(np.abs(sign_first - x)) > 0.1


def test_adabelief_constant_gradient_closed_form():
    # m_t = (1 - b1^t) g, so g - m_t = b1^t g, m_hat_t = g, and s_t = sum_k b2^(t-k) ((1-b2) b1^(2k) g^2 + eps_root)
    rng = np.random.default_rng(8)
    x0, g = rng.standard_normal(5), rng.standard_normal(5)
    lr, b1, b2, eps, eps_root, T = 0.01, 0.8, 0.95, 1e-8, 1e-10, 10
    x, s = _run(refopt.AdaBelief(lr=lr, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root), x0, [g] * T)

    def final(dev_power):
        xe, st = x0.copy(), np.zeros_like(g)
        for t in range(1, T + 1):
            st = b2 * st + (1 - b2) * (b1 ** dev_power(t) * g) ** 2 + eps_root
            xe = xe - lr * g / (np.sqrt(st / (1 - b2 ** t)) + eps)
        return xe, st

    want, s_want = final(lambda t: t)
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(s.leaves.s, s_want, rtol=1e-13)
    assert np.max(np.abs(final(lambda t: t - 1)[0] - x)) > 1e-3        # deviation from m_{t-1}


def test_yogi_constant_gradient_closed_form():
    # v_0 = 1e-6 < g^2: while v < g^2 each step adds (1 - b2) g^2, so v_t = v_0 + t (1 - b2) g^2 (t <= 5 here)
    g = np.array([0.5, -1.5, 2.0])
    lr, b1, b2, eps, v0, T = 0.01, 0.9, 0.9, 1e-3, 1e-6, 5
    x, s = _run(refopt.Yogi(lr=lr, beta1=b1, beta2=b2, eps=eps), np.zeros(3), [g] * T)
    t = np.arange(1, T + 1)[:, None]
    m = b1 ** t * v0 + (1 - b1 ** t) * g
    v = v0 + t * (1 - b2) * g * g
    want = -lr * np.sum((m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), axis=0)
    np.testing.assert_allclose(x, want, rtol=1e-13)
    np.testing.assert_allclose(s.leaves.v, v[-1], rtol=1e-14)
    v_adam = b2 ** t * v0 + (1 - b2 ** t) * g * g                       # negative control: Adam's v
    adam = -lr * np.sum((m / (1 - b1 ** t)) / (np.sqrt(v_adam / (1 - b2 ** t)) + eps), axis=0)
    assert np.max(np.abs(adam - x)) > 1e-3


def test_bad_input():
    for make, bad in ((refopt.Signum, dict(beta=1.0)), (refopt.Signum, dict(lr=-1.0)),
                      (refopt.AdaBelief, dict(eps=0.0)), (refopt.AdaBelief, dict(eps_root=-1.0)),
                      (refopt.AdaBelief, dict(beta2=1.0)), (refopt.Yogi, dict(eps=0.0)),
                      (refopt.Yogi, dict(initial_accumulator_value=-1.0)), (refopt.Yogi, dict(beta1=-0.1))):
        with pytest.raises(ValueError):
            make(**bad)
    with pytest.raises(ValueError, match="accumulator_dtype"):
        refopt.like("optax.signum", learning_rate=0.1, accumulator_dtype="bfloat16")
    assert refopt.like("optax.sign_sgd", learning_rate=0.1) == refopt.Signum(lr=0.1, beta=0.0)
    assert refopt.like("optax.yogi", learning_rate=0.1) == refopt.Yogi(lr=0.1)
    assert refopt.like("optax.adabelief", learning_rate=0.1, nesterov=True) == refopt.AdaBelief(lr=0.1, nesterov=True)

"""RMSprop's optax options (eps inside the square root, the start value v_0, the bias correction, Nesterov)
against closed forms under a constant gradient: v_t = alpha^t v_0 + (1 - alpha^t) g^2, and with the bias
correction and centering the variance is alpha^t v_0 / (1 - alpha^t). Negative controls: each option dropped."""
import numpy as np
import pytest

import refopt


def _run(rule, x0, g, steps):
    x, s = x0, refopt.init(rule, x0)
    for _ in range(steps):
        x, s = refopt.update(rule, s, x, g)
    return x, s


def closed_form(x0, g, T, lr, alpha, eps, v0, bc, centered, mu, nesterov, inside):
    x, b = x0.copy(), np.zeros_like(g)
    for t in range(1, T + 1):
        c = 1 - alpha ** t if bc else 1.0
        v = (alpha ** t * v0 + (1 - alpha ** t) * g * g) / c
        if centered:
            v = v - ((1 - alpha ** t) * g / c) ** 2
        r = g / (np.sqrt(v + eps) if inside else np.sqrt(v) + eps)
        b = mu * b + r
        x = x - lr * ((r + mu * b if nesterov else b) if mu else r)
    return x


BASE = dict(lr=0.05, alpha=0.8, eps=1e-3, v0=0.2, bc=True, centered=False, mu=0.9, nesterov=True, inside=True)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_optax_options_match_the_closed_form(centered):
    rng = np.random.default_rng(7)
    x0, g = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    k = {**BASE, "centered": centered}
    rule = refopt.RMSprop(lr=k["lr"], alpha=k["alpha"], eps=k["eps"], initial_scale=k["v0"], bias_correction=True,
                          centered=centered, momentum=k["mu"], nesterov=True, eps_mode="inside")
    x, s = _run(rule, x0, g, 12)
    np.testing.assert_allclose(x, closed_form(x0, g, 12, **k), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(s.leaves.v, 0.8 ** 12 * 0.2 + (1 - 0.8 ** 12) * g * g, rtol=1e-14)
    for drop in (dict(bc=False), dict(v0=0.0), dict(nesterov=False), dict(inside=False)):
        assert np.max(np.abs(closed_form(x0, g, 12, **{**k, **drop}) - x)) > 1e-3, drop


def test_rmsprop_optax_mapping_and_bad_input():
    assert refopt.like("optax.rmsprop", learning_rate=0.1, nesterov=True) == refopt.RMSprop(
        lr=0.1, alpha=0.9, eps_mode="inside")          # optax ignores nesterov without momentum
    assert refopt.like("optax.rmsprop", learning_rate=0.1, decay=0.99, eps_in_sqrt=False) == refopt.RMSprop(lr=0.1)
    for bad in (dict(nesterov=True), dict(eps_mode="sqrt"), dict(initial_scale=-1.0), dict(bias_correction=1)):
        with pytest.raises(ValueError):
            refopt.RMSprop(**bad)
    with pytest.raises(ValueError, match="learning_rate"):
        refopt.like("optax.rmsprop")

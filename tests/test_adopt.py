"""ADOPT written from Taniguchi et al. (2024) on three steps with different gradients: the first step only fills
v, then g is divided by the previous v, clipped at (t - 1)^(1/4) and averaged; negative controls: Adam's order
(v_t holding g_t divides g_t) and the clip read at t^(1/4)."""
import numpy as np
import pytest

import refopt


def three_steps(x0, gs, lr, b1, b2, eps, clip=True, nesterov=False, adam_order=False, clip_shift=1):
    x, m, v = x0.copy(), 0 * x0, gs[0] ** 2
    for t, g in enumerate(gs[1:], start=2):
        v_new = b2 * v + (1 - b2) * g ** 2
        a = g / np.maximum(np.sqrt(v_new if adam_order else v), eps)
        if clip:
            a = np.clip(a, -(t - clip_shift) ** 0.25, (t - clip_shift) ** 0.25)
        m = b1 * m + (1 - b1) * a
        x = x - lr * (b1 * m + (1 - b1) * a if nesterov else m)
        v = v_new
    return x, m, v


@pytest.mark.parametrize("nesterov", [False, True])
def test_adopt_three_steps_from_the_algorithm(nesterov):
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal(8)
    gs = [rng.standard_normal(8) * s for s in (0.1, 3.0, 1.0)]    # a small first g: the clip binds at t = 2
    rule = refopt.ADOPT(lr=0.05, beta1=0.8, beta2=0.9, eps=1e-6, nesterov=nesterov)
    x, s = x0, refopt.init(rule, x0)
    x, s = refopt.update(rule, s, x, gs[0])
    np.testing.assert_array_equal(x, x0)                  # the first step leaves x
    np.testing.assert_array_equal(s.leaves.v, gs[0] ** 2)
    for g in gs[1:]:
        x, s = refopt.update(rule, s, x, g)
    kw = dict(lr=0.05, b1=0.8, b2=0.9, eps=1e-6, nesterov=nesterov)
    want, m, v = three_steps(x0, gs, **kw)
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s.leaves.m, m, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(s.leaves.v, v, rtol=1e-14, atol=1e-15)
    assert np.max(np.abs(three_steps(x0, gs, **kw, adam_order=True)[0] - x)) > 1e-5
    assert np.max(np.abs(three_steps(x0, gs, **kw, clip_shift=0)[0] - x)) > 1e-5
    assert np.max(np.abs(three_steps(x0, gs, **kw, clip=False)[0] - x)) > 1e-5


def test_adopt_converges_for_any_beta2():
    """The paper's claim on its own counterexample's spirit: with beta2 small (0.5), where Adam's m/sqrt(v)
    is biased, ADOPT still drives a noisy quadratic's mean to its minimum."""
    rng = np.random.default_rng(0)
    rule = refopt.ADOPT(lr=1e-2, beta1=0.9, beta2=0.5)
    x = np.full(4, 2.0)
    s = refopt.init(rule, x)
    for _ in range(3000):
        x, s = refopt.update(rule, s, x, x + 0.1 * rng.standard_normal(4))
    assert np.max(np.abs(x)) < 0.1


def test_adopt_bad_input():
    for bad in (dict(beta2=1.0), dict(eps=0.0), dict(clip_exponent=-0.5), dict(clip=1), dict(lr=-1.0)):
        with pytest.raises(ValueError):
            refopt.ADOPT(**bad)
    with pytest.raises(ValueError, match="clip-value function"):
        refopt.like("optax.contrib.adopt", learning_rate=0.1, clip_value_fn=lambda c: c ** 0.5)
    with pytest.raises(ValueError, match="mu_dtype"):
        refopt.like("optax.contrib.adopt", learning_rate=0.1, mu_dtype="bfloat16")
    assert refopt.like("optax.contrib.adopt", learning_rate=0.1, use_clipping=False) == refopt.ADOPT(lr=0.1,
                                                                                                    clip=False)

"""MADGRAD written from Defazio & Jelassi (2021), Algorithm 1, in optax's conventions, on three steps with different
gradients; negative controls: the counter from 0 (sqrt(k) in place of sqrt(k + 1)), lambda without the sqrt, the
paper's lambda (no eps on the lr), lambda in float64."""
import numpy as np
import pytest

import refopt


def three_steps(x0, gs, lr, mom, eps, wd, counter=1, sqrt=True, eps_in_lr=True, f32=True):
    x, s, nu = x0.copy(), 0 * x0, 0 * x0
    for k, g in enumerate(gs):
        g = g + wd * x
        root = np.sqrt(k + counter) if sqrt else 1.0
        base = lr + eps if eps_in_lr else lr
        lam = float(np.float32(base) * np.float32(root)) if f32 else base * root
        s, nu = s + lam * g, nu + lam * g * g
        z = x0 - s / (np.cbrt(nu) + eps)
        x = (1 - mom) * z + mom * x
    return x, s, nu


def test_madgrad_three_steps_from_the_algorithm():
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal(6)
    gs = [rng.standard_normal(6) for _ in range(3)]
    kw = dict(lr=0.05, mom=0.8, eps=1e-3, wd=0.1)
    rule = refopt.MADGRAD(lr=0.05, momentum=0.8, eps=1e-3, weight_decay=0.1)
    x, st = x0, refopt.init(rule, x0)
    for g in gs:
        x, st = refopt.update(rule, st, x, g)
    want, s, nu = three_steps(x0, gs, **kw)
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(st.leaves.s, s, rtol=1e-14)
    np.testing.assert_allclose(st.leaves.nu, nu, rtol=1e-14)
    np.testing.assert_array_equal(st.leaves.x0, x0)
    # negative controls, each far beyond the rtol above
    for wrong in (dict(counter=0), dict(sqrt=False), dict(eps_in_lr=False)):
        assert np.max(np.abs(three_steps(x0, gs, **kw, **wrong)[0] - x)) > 1e-4, wrong
    assert np.max(np.abs(three_steps(x0, gs, **kw, f32=False)[0] - x)) > 1e-10


def test_madgrad_paper_switches_and_momentum_zero():
    rng = np.random.default_rng(8)
    x0 = rng.standard_normal(5)
    gs = [rng.standard_normal(5) for _ in range(3)]
    rule = refopt.MADGRAD(lr=0.02, momentum=0.0, eps=1e-4, eps_in_lr=False, lam_dtype="float64")
    x, st = x0, refopt.init(rule, x0)
    for g in gs:
        x, st = refopt.update(rule, st, x, g)
    want = three_steps(x0, gs, lr=0.02, mom=0.0, eps=1e-4, wd=0.0, eps_in_lr=False, f32=False)[0]
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-15)
    # momentum 0: x is the dual-averaging point z itself
    s = sum(0.02 * np.sqrt(k + 1) * g for k, g in enumerate(gs))
    nu = sum(0.02 * np.sqrt(k + 1) * g * g for k, g in enumerate(gs))
    np.testing.assert_allclose(x, x0 - s / (np.cbrt(nu) + 1e-4), rtol=1e-14)


def test_madgrad_has_no_additive_direction():
    x = np.ones(3)
    rule = refopt.MADGRAD()
    with pytest.raises(NotImplementedError):
        refopt.direction(rule, refopt.init(rule, x), x, x)


def test_madgrad_bad_input():
    for bad in (dict(lr=-1.0), dict(momentum=1.0), dict(momentum=-0.1), dict(eps=0.0), dict(weight_decay=-0.1),
                dict(eps_in_lr=1), dict(lam_dtype="float16"), dict(schedule=3)):
        with pytest.raises(ValueError):
            refopt.MADGRAD(**bad)
    assert refopt.like("optax.contrib.madgrad", learning_rate=0.1) == refopt.MADGRAD(lr=0.1)
    assert refopt.like("optax.contrib.madgrad", learning_rate=0.01, momentum=0.8, eps=1e-5, weight_decay=0.01) == \
        refopt.MADGRAD(lr=0.01, momentum=0.8, eps=1e-5, weight_decay=0.01)
    with pytest.raises(ValueError, match="learning_rate.*schedule"):
        refopt.like("optax.contrib.madgrad", learning_rate=lambda c: 0.1)
    with pytest.raises(ValueError, match="eps.*eps > 0"):
        refopt.like("optax.contrib.madgrad", learning_rate=0.1, eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        refopt.like("optax.contrib.madgrad", learning_rate=0.1, weight_decay=lambda c: 0.1)
    with pytest.raises(ValueError, match="needs the argument"):
        refopt.like("optax.contrib.madgrad", momentum=0.5)
    with pytest.raises(ValueError, match="no argument 'mask'"):
        refopt.like("optax.contrib.madgrad", learning_rate=0.1, mask=None)

"""SM3 (Anil et al. 2019, Algorithm 2, SM3-II) in optax's form against a reference written from the paper here:
nu_t(j) = min over the covers of mu_{t-1} + g_t(j)^2, mu_t(r) = max of nu_t over the cover r; the bound nu_t >=
the per-entry sum of squares (the paper's claim); negative controls: Adagrad's full sum, the momentum without
(1 - b); the covers' state in checkpoints and its validation."""
import numpy as np
import pytest

import refopt


def reference(x0, gs, lr, b, eps, full=False, sum_momentum=False):
    x, m = x0.copy(), 0 * x0
    rows, cols, acc = np.zeros(x0.shape[0]), np.zeros(x0.shape[1]), 0 * x0
    for g in gs:
        if full:
            nu = acc = acc + g * g
        else:
            nu = np.minimum(rows[:, None], cols[None, :]) + g * g
            rows, cols = nu.max(axis=1), nu.max(axis=0)
        u = np.where(nu > 0, g / np.sqrt(nu + eps), 0.0)
        m = b * m + (1.0 if sum_momentum else 1 - b) * u
        x = x - lr * m
    return x, nu


def test_sm3_from_the_algorithm_and_the_bound():
    rng = np.random.default_rng(7)
    x0 = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    gs = [{"w": rng.standard_normal((4, 3)) * (1 + np.arange(3)), "b": rng.standard_normal(3)} for _ in range(6)]
    rule = refopt.SM3(lr=0.05, momentum=0.5)
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    w = [g["w"] for g in gs]
    want, nu = reference(x0["w"], w, 0.05, 0.5, 1e-8)
    np.testing.assert_allclose(x["w"], want, rtol=1e-13)
    assert s.leaves["w"].v.shape == (7,)                                      # 4 rows + 3 columns
    np.testing.assert_allclose(s.leaves["w"].v, np.concatenate([nu.max(axis=1), nu.max(axis=0)]), rtol=1e-14)
    assert np.all(nu >= sum(g * g for g in w) - 1e-12)                        # the covers bound the sum of squares
    b = [g["b"] for g in gs]                                                 # a vector keeps the full sum
    acc = np.cumsum([g * g for g in b], axis=0)
    mb = 0 * b[0]
    xb = x0["b"].copy()
    for g, a in zip(b, acc):
        mb = 0.5 * mb + 0.5 * g / np.sqrt(a + 1e-8)
        xb = xb - 0.05 * mb
    np.testing.assert_allclose(x["b"], xb, rtol=1e-13)
    for wrong in (dict(full=True), dict(sum_momentum=True)):
        assert np.max(np.abs(reference(x0["w"], w, 0.05, 0.5, 1e-8, **wrong)[0] - want)) > 1e-6


def test_sm3_covers_checkpoint_bad_input_and_like(tmp_path):
    rule = refopt.SM3(lr=0.01)
    x = {"w": np.ones((2, 3, 4))}
    x1, s = refopt.update(rule, refopt.init(rule, x), x, {"w": np.arange(24.0).reshape(2, 3, 4)})
    assert s.leaves["w"].v.shape == (9,)
    path = str(tmp_path / "ck.npz")
    refopt.save(path, x1, s, rule)
    ck = refopt.load(path)
    g = {"w": np.full((2, 3, 4), -0.25)}
    a, _ = refopt.update(rule, s, x1, g)
    b, _ = refopt.update(ck.rule, ck.state, ck.params, g)
    np.testing.assert_array_equal(a["w"], b["w"])                             # resumes bit for bit
    for bad in (dict(lr=-1.0), dict(momentum=1.0), dict(eps=-1.0)):
        with pytest.raises(ValueError):
            refopt.SM3(**bad)
    bad_state = s._replace(leaves={"w": s.leaves["w"]._replace(v=np.zeros(24))})
    with pytest.raises(ValueError, match="w"):
        refopt.update(rule, bad_state, x1, g)
    assert refopt.like("optax.sm3", learning_rate=0.1) == refopt.SM3(lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="constant"):
        refopt.like("optax.sm3", learning_rate=lambda t: 0.1)

"""NovoGrad written from Ginsburg et al. (2019), Algorithm 1 (optax's form): one second moment per leaf, a 0-d
state that the golden files, checkpoints and the cross-check carry like any other. Negative controls: v_1 as an
EMA from 0, the momentum with (1 - b1), per-entry moments."""
import numpy as np
import pytest

import refopt


def reference(x0, gs, lr, b1, b2, eps, wd, v1_whole=True, ema_momentum=False):
    x, m, v = x0.copy(), 0 * x0, 0.0
    for t, g in enumerate(gs, start=1):
        n2 = float(np.sum(g * g))
        v = n2 if (t == 1 and v1_whole) else b2 * v + (1 - b2) * n2
        u = g / (np.sqrt(v) + eps) + wd * x
        m = u if t == 1 and not ema_momentum else b1 * m + ((1 - b1) if ema_momentum else 1) * u
        x = x - lr * m
    return x, v


def test_novograd_from_the_algorithm():
    rng = np.random.default_rng(13)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    gs = [{"w": rng.standard_normal((3, 4)), "b": 10 * rng.standard_normal(4)} for _ in range(6)]
    kw = dict(lr=0.05, b1=0.8, b2=0.5, eps=1e-6, wd=0.01)
    rule = refopt.NovoGrad(lr=0.05, beta1=0.8, beta2=0.5, eps=1e-6, weight_decay=0.01)
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    for k in ("w", "b"):
        want, v = reference(x0[k], [g[k] for g in gs], **kw)
        np.testing.assert_allclose(x[k], want, rtol=1e-13)
        assert s.leaves[k].v.shape == () and abs(float(s.leaves[k].v) - v) <= 1e-13 * v
        assert np.max(np.abs(reference(x0[k], [g[k] for g in gs], **kw, v1_whole=False)[0] - want)) > 1e-3
        assert np.max(np.abs(reference(x0[k], [g[k] for g in gs], **kw, ema_momentum=True)[0] - want)) > 1e-3


def test_novograd_zero_d_state_in_checkpoint_and_bad_input(tmp_path):
    rule = refopt.NovoGrad(lr=0.01)
    x = {"w": np.ones((2, 2))}
    x1, s = refopt.update(rule, refopt.init(rule, x), x, {"w": np.full((2, 2), 0.5)})
    path = str(tmp_path / "ck.npz")
    refopt.save(path, x1, s, rule)
    ck = refopt.load(path)
    assert ck.state.leaves["w"].v.shape == () and float(ck.state.leaves["w"].v) == float(s.leaves["w"].v)
    g = {"w": np.full((2, 2), -0.25)}
    a, _ = refopt.update(rule, s, x1, g)
    b, _ = refopt.update(ck.rule, ck.state, ck.params, g)                      # resumes bit for bit
    np.testing.assert_array_equal(a["w"], b["w"])
    for bad in (dict(beta1=1.0), dict(eps=0.0), dict(eps_root=-1.0), dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            refopt.NovoGrad(**bad)
    bad_state = s._replace(leaves={"w": s.leaves["w"]._replace(v=np.zeros(2))})
    with pytest.raises(ValueError, match="w"):
        refopt.update(rule, bad_state, x1, {"w": np.ones((2, 2))})

"""D-Adaptation Adam written from the paper's Adam version (Defazio & Mishchenko 2023) in the packages' form, on
a two-leaf tree over four steps: one d over the whole tree, kept in OptState.glob, the inner product read from
the previous s and v; negative controls: d per leaf, this step's s and v in the inner product, no bias
correction, no growth bound. The rule-wide state is validated, checkpointed and resumed bit for bit."""
import math

import numpy as np
import pytest

import refopt
from refopt import checkpoint
from refopt.rules.dadapt_adam import DAdaptAdamGlobal
from tree_steps import run


def _tree(seed=3):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) + 0.5 * v for k, v in x0.items()} for _ in range(4)]
    return x0, gs


def dadapt(x0, gs, lr=1.0, b1=0.9, b2=0.999, eps=1e-8, d0=1e-6, growth=math.inf, wd=0.0, decoupled=False,
           bc=False, new_s=False, per_leaf=False):
    """The algorithm over a dict of arrays, in plain Python floats per entry."""
    if per_leaf:
        return {k: dadapt({k: x0[k]}, [{k: g[k]} for g in gs], lr, b1, b2, eps, d0, growth, wd, decoupled, bc,
                          new_s)[k] for k in x0}
    sb2 = math.sqrt(b2)
    keys = list(x0)
    x = {k: x0[k].ravel().tolist() for k in keys}
    m = {k: [0.0] * len(x[k]) for k in keys}
    v = {k: [0.0] * len(x[k]) for k in keys}
    s = {k: [0.0] * len(x[k]) for k in keys}
    d, r = d0, 0.0
    for t, g in enumerate(gs, 1):
        a = {k: [gi + (0.0 if decoupled else wd * xi) for gi, xi in zip(g[k].ravel(), x[k])] for k in keys}
        dlr = d * lr * (math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bc else 1.0)
        s_old, v_old = s, v
        m = {k: [b1 * mi + (1 - b1) * dlr * ai for mi, ai in zip(m[k], a[k])] for k in keys}
        v = {k: [b2 * vi + (1 - b2) * ai * ai for vi, ai in zip(v[k], a[k])] for k in keys}
        s = {k: [sb2 * si + (1 - sb2) * dlr * ai for si, ai in zip(s[k], a[k])] for k in keys}
        rs, rv = (s, v) if new_s else (s_old, v_old)
        inner = sum(ai * si / (math.sqrt(vi) + eps) for k in keys for ai, si, vi in zip(a[k], rs[k], rv[k]))
        r = sb2 * r + (1 - sb2) * dlr * inner
        d_hat = r / ((1 - sb2) * sum(abs(si) for k in keys for si in s[k]))
        for k in keys:
            x[k] = [xi - mi / (math.sqrt(vi) + eps) - (dlr * wd * xi if decoupled else 0.0)
                    for xi, mi, vi in zip(x[k], m[k], v[k])]
        d = max(d, min(d_hat, d * growth))
    return {k: np.array(x[k]).reshape(x0[k].shape) for k in keys}


def _close(a, b, tol=1e-13):
    return all(np.allclose(a[k], b[k], rtol=tol, atol=0) for k in a)


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]) / np.abs(a[k]))) for k in a)


KW = dict(lr=2.0, b1=0.8, b2=0.99, eps=1e-3, d0=1e-2, wd=0.05)
RULE = dict(lr=2.0, beta1=0.8, beta2=0.99, eps=1e-3, d0=1e-2, weight_decay=0.05)


@pytest.mark.parametrize("extra, rule_extra", [
    ({}, {}),
    (dict(bc=True, growth=1.5), dict(bias_correction=True, growth_rate=1.5)),
    (dict(decoupled=True, bc=True), dict(decoupled=True, bias_correction=True)),
])
def test_four_steps_from_the_algorithm(extra, rule_extra):
    x0, gs = _tree()
    x, s = run(refopt.DAdaptAdam(**RULE, **rule_extra), x0, gs)
    assert _close(x, dadapt(x0, gs, **KW, **extra))
    assert isinstance(s.glob, DAdaptAdamGlobal) and s.glob.d > 1e-2          # the estimate grew


def test_negative_controls_are_caught():
    x0, gs = _tree()
    x, _ = run(refopt.DAdaptAdam(**RULE, bias_correction=True, growth_rate=1.2), x0, gs)
    assert _close(x, dadapt(x0, gs, **KW, bc=True, growth=1.2))
    for wrong in (dict(bc=True, growth=1.2, per_leaf=True), dict(bc=True, growth=1.2, new_s=True),
                  dict(growth=1.2), dict(bc=True)):
        assert _gap(x, dadapt(x0, gs, **KW, **wrong)) > 1e-6


def test_growth_rate_bounds_the_estimate():
    x0, gs = _tree(5)
    rule = refopt.DAdaptAdam(d0=1e-3, growth_rate=1.01)
    s = refopt.init(rule, x0)
    d = [s.glob.d]
    for g in gs:
        x0, s = refopt.update(rule, s, x0, g)
        d.append(s.glob.d)
    assert all(b <= a * 1.01 * (1 + 1e-15) for a, b in zip(d, d[1:])) and d[-1] > d[0]


def test_zero_lr_moves_nothing_and_zero_gradients_keep_d():
    x0, gs = _tree()
    rule = refopt.DAdaptAdam(schedule=lambda t: 0.0 if t == 1 else 1.0)
    x1, s1 = refopt.update(rule, refopt.init(rule, x0), x0, gs[0])
    assert all(np.array_equal(x1[k], x0[k]) for k in x0) and s1.glob == DAdaptAdamGlobal(1e-6, 0.0)
    assert all(not s.m.any() for s in refopt.tree.leaves(s1.leaves, is_leaf=lambda n: hasattr(n, "_fields")))
    rule = refopt.DAdaptAdam()
    zero = {k: np.zeros_like(v) for k, v in x0.items()}
    x1, s1 = refopt.update(rule, refopt.init(rule, x0), x0, zero)
    assert s1.glob == DAdaptAdamGlobal(1e-6, 0.0) and all(np.array_equal(x1[k], x0[k]) for k in x0)


def test_float32_stays_float32():
    x0, gs = _tree()
    x32 = {k: v.astype(np.float32) for k, v in x0.items()}
    rule = refopt.DAdaptAdam(d0=1e-2, bias_correction=True)
    x, s = run(rule, x32, [{k: v.astype(np.float32) for k, v in g.items()} for g in gs])
    assert all(v.dtype == np.float32 for v in x.values())
    want = dadapt(x0, gs, d0=1e-2, bc=True)
    assert all(np.allclose(x[k], want[k], rtol=1e-4) for k in x)


def test_global_state_checkpoint_resume_bit_identical(tmp_path):
    rule = refopt.DAdaptAdam(d0=1e-3, growth_rate=1.2, bias_correction=True)
    x0, gs = _tree(11)
    x, s = run(rule, x0, gs[:3])
    path = str(tmp_path / "ck")
    checkpoint.save(path, x, s, rule)
    x2, s2, rule2 = checkpoint.load(path)[:3]
    assert s2.glob == s.glob and type(s2.glob) is DAdaptAdamGlobal
    xa, sa = refopt.update(rule, s, x, gs[3])
    xb, sb = refopt.update(rule2, s2, x2, gs[3])
    assert all(np.array_equal(xa[k], xb[k]) for k in xa) and sa.glob == sb.glob


def test_bad_global_state_and_hyperparameters():
    rule = refopt.DAdaptAdam()
    x0, gs = _tree()
    s = refopt.init(rule, x0)
    for bad in (DAdaptAdamGlobal(0.0, 0.0), DAdaptAdamGlobal(-1e-6, 0.0), DAdaptAdamGlobal(1e-6, math.inf),
                (1e-6, 0.0), None):
        before = {k: v.copy() for k, v in x0.items()}
        with pytest.raises(ValueError, match="global state"):
            refopt.update_(rule, s._replace(glob=bad), x0, gs[0])
        assert all(np.array_equal(before[k], x0[k]) for k in x0)    # nothing written
    for bad in (dict(beta1=1.0), dict(beta2=-0.1), dict(eps=0.0), dict(d0=0.0), dict(growth_rate=0.5),
                dict(weight_decay=-1.0), dict(decoupled=1), dict(bias_correction="yes"), dict(lr=-1.0)):
        with pytest.raises(ValueError):
            refopt.DAdaptAdam(**bad)


def test_like_the_two_packages():
    assert refopt.like("optax.contrib.dadapt_adamw", betas=[0.95, 0.99], estim_lr0=1e-4, weight_decay=0.1) == \
        refopt.DAdaptAdam(beta1=0.95, beta2=0.99, d0=1e-4, weight_decay=0.1, decoupled=True, bias_correction=True)
    assert refopt.like("dadaptation.DAdaptAdam", weight_decay=0.1, growth_rate=2.0, log_every=10) == \
        refopt.DAdaptAdam(weight_decay=0.1, growth_rate=2.0)
    assert refopt.like("dadaptation.DAdaptAdam", decouple=True, use_bias_correction=True) == \
        refopt.DAdaptAdam(decoupled=True, bias_correction=True)
    for peer, kw, what in (("dadaptation.DAdaptAdam", dict(fsdp_in_use=True), "fsdp_in_use"),
                           ("dadaptation.DAdaptAdam", dict(lr=0.0), "lr > 0"),
                           ("optax.contrib.dadapt_adamw", dict(learning_rate=lambda k: 1.0), "schedule"),
                           ("optax.contrib.dadapt_adamw", dict(betas=(0.9,)), "betas")):
        with pytest.raises(ValueError, match=what):
            refopt.like(peer, **kw)

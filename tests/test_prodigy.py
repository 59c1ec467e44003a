"""Prodigy written from the paper's Adam version (Mishchenko & Defazio 2024, Algorithm 3) in the packages'
scaling, on a two-leaf tree over four steps: one d over the whole tree, kept in OptState.glob; negative
controls: d per leaf, eps times d_t (the paper's) in place of d_{t+1}, no bias correction. The rule-wide state is
validated, checkpointed and resumed bit for bit; pytorch_optimizer's L2 decay is a no-op."""
import math

import numpy as np
import pytest

import refopt
from refopt import checkpoint
from refopt.rules.prodigy import ProdigyGlobal
from tree_steps import run


def _tree(seed=3):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) + 0.5 * v for k, v in x0.items()} for _ in range(4)]
    return x0, gs


def prodigy(x0, gs, lr=1.0, b1=0.9, b2=0.999, b3=None, eps=1e-8, d0=1e-6, coef=1.0, growth=math.inf, wd=0.0,
            decoupled=True, bc=False, safeguard=False, eps_current=False, per_leaf=False):
    """The algorithm over a dict of arrays, in plain Python floats per entry."""
    if per_leaf:
        return {k: prodigy({k: x0[k]}, [{k: g[k]} for g in gs], lr, b1, b2, b3, eps, d0, coef, growth, wd,
                           decoupled, bc, safeguard, eps_current)[k] for k in x0}
    b3 = math.sqrt(b2) if b3 is None else b3
    keys = list(x0)
    x = {k: x0[k].ravel().tolist() for k in keys}
    start = {k: list(v) for k, v in x.items()}
    m = {k: [0.0] * len(x[k]) for k in keys}
    v = {k: [0.0] * len(x[k]) for k in keys}
    s = {k: [0.0] * len(x[k]) for k in keys}
    d, d_max, r = d0, d0, 0.0
    for t, g in enumerate(gs, 1):
        a = {k: [gi + (0.0 if decoupled else wd * xi) for gi, xi in zip(g[k].ravel(), x[k])] for k in keys}
        dlr = d * lr * (math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bc else 1.0)
        r = b3 * r + (d / d0) * dlr * sum(ai * (si - xi) for k in keys
                                          for ai, si, xi in zip(a[k], start[k], x[k]))
        w = (d / d0) * (d if safeguard else dlr)
        s = {k: [b3 * si + w * ai for si, ai in zip(s[k], a[k])] for k in keys}
        l1 = sum(abs(si) for k in keys for si in s[k])
        d_hat = coef * r / l1
        d_new = max(d, d_hat) if d == d0 else d
        d_max = max(d_max, d_hat)
        d_new = min(d_max, d_new * growth)
        e = eps * (d if eps_current else d_new)
        for k in keys:
            m[k] = [b1 * mi + (1 - b1) * d * ai for mi, ai in zip(m[k], a[k])]
            v[k] = [b2 * vi + (1 - b2) * (d * ai) ** 2 for vi, ai in zip(v[k], a[k])]
            x[k] = [xi - dlr * (mi / (math.sqrt(vi) + e) + (wd * xi if decoupled else 0.0))
                    for xi, mi, vi in zip(x[k], m[k], v[k])]
        d = d_new
    return {k: np.array(x[k]).reshape(x0[k].shape) for k in keys}


def _close(a, b, tol=1e-13):
    return all(np.allclose(a[k], b[k], rtol=tol, atol=0) for k in a)


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]) / np.abs(a[k]))) for k in a)


KW = dict(lr=2.0, b1=0.8, b2=0.99, b3=0.95, eps=1e-3, d0=1e-2, coef=0.9, wd=0.05)
RULE = dict(lr=2.0, beta1=0.8, beta2=0.99, beta3=0.95, eps=1e-3, d0=1e-2, d_coef=0.9, weight_decay=0.05)


@pytest.mark.parametrize("extra, rule_extra", [
    ({}, {}),
    (dict(bc=True, growth=1.5), dict(bias_correction=True, growth_rate=1.5)),
    (dict(decoupled=False, safeguard=True), dict(decoupled=False, safeguard_warmup=True)),
    (dict(eps_current=True), dict(eps_at="current")),
])
def test_four_steps_from_the_algorithm(extra, rule_extra):
    x0, gs = _tree()
    x, s = run(refopt.Prodigy(**RULE, **rule_extra), x0, gs)
    assert _close(x, prodigy(x0, gs, **KW, **extra))
    assert isinstance(s.glob, ProdigyGlobal) and s.glob.d > 1e-2          # the estimate grew


def test_negative_controls_are_caught():
    x0, gs = _tree()
    x, _ = run(refopt.Prodigy(**RULE, bias_correction=True), x0, gs)
    assert _close(x, prodigy(x0, gs, **KW, bc=True))
    for wrong in (dict(bc=True, per_leaf=True), dict(bc=True, eps_current=True), dict()):
        assert _gap(x, prodigy(x0, gs, **KW, **wrong)) > 1e-6


def test_growth_rate_bounds_the_estimate():
    x0, gs = _tree(5)
    rule = refopt.Prodigy(d0=1e-3, growth_rate=1.01)
    s = refopt.init(rule, x0)
    d = [s.glob.d]
    for g in gs:
        x0, s = refopt.update(rule, s, x0, g)
        d.append(s.glob.d)
    # the first move off d_0 goes to hat d; from then on d grows by at most the factor 1.01 a step
    assert d[:3] == [1e-3, 1e-3, 1e-3] and d[3] > 1.01e-3
    assert d[3] < d[4] <= d[3] * 1.01 * (1 + 1e-15) < s.glob.d_max


def test_zero_lr_moves_nothing_and_zero_gradients_keep_d():
    x0, gs = _tree()
    rule = refopt.Prodigy(schedule=lambda t: 0.0 if t == 1 else 1.0)
    x1, s1 = refopt.update(rule, refopt.init(rule, x0), x0, gs[0])
    assert all(np.array_equal(x1[k], x0[k]) for k in x0) and s1.glob == ProdigyGlobal(1e-6, 1e-6, 0.0)
    assert all(not s.m.any() for s in refopt.tree.leaves(s1.leaves, is_leaf=lambda n: hasattr(n, "_fields")))
    rule = refopt.Prodigy()
    zero = {k: np.zeros_like(v) for k, v in x0.items()}
    x1, s1 = refopt.update(rule, refopt.init(rule, x0), x0, zero)
    assert s1.glob.d == 1e-6 and all(np.array_equal(x1[k], x0[k]) for k in x0) and np.isfinite(s1.glob.numerator)


def test_float32_stays_float32():
    x0, gs = _tree()
    x32 = {k: v.astype(np.float32) for k, v in x0.items()}
    rule = refopt.Prodigy(d0=1e-2, bias_correction=True)
    x, s = run(rule, x32, [{k: v.astype(np.float32) for k, v in g.items()} for g in gs])
    assert all(v.dtype == np.float32 for v in x.values())
    want = prodigy(x0, gs, d0=1e-2, bc=True)
    assert all(np.allclose(x[k], want[k], rtol=1e-4) for k in x)


def test_global_state_checkpoint_resume_bit_identical(tmp_path):
    rule = refopt.Prodigy(d0=1e-3, growth_rate=1.2, bias_correction=True)
    x0, gs = _tree(11)
    x, s = run(rule, x0, gs[:3])
    path = str(tmp_path / "ck")
    checkpoint.save(path, x, s, rule)
    x2, s2, rule2 = checkpoint.load(path)[:3]
    assert s2.glob == s.glob and type(s2.glob) is ProdigyGlobal
    xa, sa = refopt.update(rule, s, x, gs[3])
    xb, sb = refopt.update(rule2, s2, x2, gs[3])
    assert all(np.array_equal(xa[k], xb[k]) for k in xa) and sa.glob == sb.glob


def test_bad_global_state_and_hyperparameters():
    rule = refopt.Prodigy()
    x0, gs = _tree()
    s = refopt.init(rule, x0)
    for bad in (ProdigyGlobal(0.0, 0.0, 0.0), ProdigyGlobal(1e-6, 1e-7, 0.0), ProdigyGlobal(1e-6, 1e-6, math.nan),
                (1e-6, 1e-6, 0.0), None):
        before = {k: v.copy() for k, v in x0.items()}
        with pytest.raises(ValueError, match="global state"):
            refopt.update_(rule, s._replace(glob=bad), x0, gs[0])
        assert all(np.array_equal(before[k], x0[k]) for k in x0)    # nothing written
    for bad in (dict(beta1=1.0), dict(beta3=-0.1), dict(eps=0.0), dict(d0=0.0), dict(d_coef=0.0),
                dict(growth_rate=0.5), dict(weight_decay=-1.0), dict(eps_at="paper"), dict(decoupled=1)):
        with pytest.raises(ValueError):
            refopt.Prodigy(**bad)


def test_like_the_three_packages():
    assert refopt.like("optax.contrib.prodigy", betas=[0.95, 0.99], estim_lr0=1e-4) == refopt.Prodigy(
        beta1=0.95, beta2=0.99, d0=1e-4, bias_correction=True)
    assert refopt.like("prodigyopt.Prodigy", decouple=False, weight_decay=0.1, growth_rate=2.0) == refopt.Prodigy(
        decoupled=False, weight_decay=0.1, growth_rate=2.0)
    # pytorch_optimizer adds the L2 term to p.grad after every sum has read it: the step has no decay
    assert refopt.like("pytorch_optimizer.Prodigy", weight_decay=0.1, weight_decouple=False) == refopt.Prodigy()
    for peer, kw, what in (("prodigyopt.Prodigy", dict(slice_p=2), "slice_p"),
                           ("prodigyopt.Prodigy", dict(fsdp_in_use=True), "fsdp_in_use"),
                           ("pytorch_optimizer.Prodigy", dict(eps=None), "atan2"),
                           ("pytorch_optimizer.Prodigy", dict(fixed_decay=True), "fixed_decay"),
                           ("optax.contrib.prodigy", dict(betas=(0.9,)), "betas")):
        with pytest.raises(ValueError, match=what):
            refopt.like(peer, **kw)


def test_pytorch_optimizer_coupled_decay_is_a_no_op():
    """The peer itself: weight_decouple=False with weight_decay 0.1 steps exactly as weight_decay 0."""
    torch = pytest.importorskip("torch")
    po = pytest.importorskip("pytorch_optimizer")
    x0, gs = _tree()

    def peer_run(**kw):
        p = [torch.tensor(x0["w"]), torch.tensor(x0["b"])]
        opt = po.Prodigy(p, foreach=False, **kw)
        for g in gs:
            p[0].grad, p[1].grad = torch.tensor(g["w"]), torch.tensor(g["b"])
            opt.step()
        return [q.detach().numpy() for q in p]

    a, b = peer_run(weight_decay=0.1, weight_decouple=False), peer_run()
    assert all(np.array_equal(u, w) for u, w in zip(a, b))
    c = peer_run(weight_decay=0.1)                           # decoupled decay does move it
    assert not np.array_equal(a[0], c[0])

"""DoG and DoWG written from their papers' algorithms on a two-leaf tree over three steps: one step size from the
whole tree's distance and gradient sums, kept in OptState.glob; negative controls: a step size per leaf and
DoG's unweighted sum in DoWG. The rule-wide state is validated, checkpointed and resumed bit for bit."""
import math

import numpy as np
import pytest

import refopt
from refopt import checkpoint
from refopt.rules.dog import DoGGlobal, DoWGGlobal
from tree_steps import run


def _tree(seed=2):
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) for k, v in x0.items()} for _ in range(3)]
    return x0, gs


def _n2(tree):
    return sum(float(np.sum(a ** 2)) for a in tree.values())


def dog(x0, gs, lr, r_eps, eps, wd, per_leaf=False):
    if per_leaf:   # each array its own DoG (the layer-wise form)
        return {k: dog({k: x0[k]}, [{k: g[k]} for g in gs], lr, r_eps, eps, wd)[k] for k in x0}
    x, r, G = {k: v.copy() for k, v in x0.items()}, r_eps, 0.0
    for g in gs:
        a = {k: g[k] + wd * x[k] for k in x}
        r = max(r, math.sqrt(_n2({k: x[k] - x0[k] for k in x})))
        G += _n2(a)
        eta = r / math.sqrt(G + eps)
        x = {k: x[k] - lr * eta * a[k] for k in x}
    return x


def dowg(x0, gs, lr, r2, eps, wd, unweighted=False):
    x, v = {k: a.copy() for k, a in x0.items()}, 0.0
    for g in gs:
        a = {k: g[k] + wd * x[k] for k in x}
        r2 = max(r2, _n2({k: x[k] - x0[k] for k in x}))
        v += _n2(a) * (1.0 if unweighted else r2)
        eta = r2 / (math.sqrt(v) + eps)
        x = {k: x[k] - lr * eta * a[k] for k in x}
    return x


def _close(a, b, tol=1e-14):
    return all(np.allclose(a[k], b[k], rtol=tol, atol=tol) for k in a)


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_dog_three_steps_from_the_algorithm():
    x0, gs = _tree()
    x, s = run(refopt.DoG(lr=3.0, init_step="distance", init_value=0.1, eps=1e-6, weight_decay=0.05), x0, gs)
    want = dog(x0, gs, 3.0, 0.1, 1e-6, 0.05)
    assert _close(x, want)
    assert isinstance(s.glob, DoGGlobal) and s.glob.max_dist > 0.1
    assert _gap(dog(x0, gs, 3.0, 0.1, 1e-6, 0.05, per_leaf=True), x) > 1e-3


def test_dog_heuristic_and_learning_rate_starts():
    x0, gs = _tree(4)
    norm0 = math.sqrt(_n2(x0))
    x, _ = run(refopt.DoG(), x0, gs)
    assert _close(x, dog(x0, gs, 1.0, 1e-6 * (1 + norm0), 1e-8, 0.0))
    # init_step='learning_rate': the first step is x - 0.01 g, then r_0 = 0 and the estimate
    rule = refopt.DoG(init_step="learning_rate", init_value=1e-2)
    x1, s = refopt.update(rule, refopt.init(rule, x0), x0, gs[0])
    assert _close(x1, {k: x0[k] - 1e-2 * gs[0][k] for k in x0})
    assert s.glob == DoGGlobal(0.0, _n2(gs[0]))


def test_dowg_three_steps_from_the_algorithm():
    x0, gs = _tree(7)
    x, s = run(refopt.DoWG(lr=3.0, init_sq_dist=1e-2, eps=1e-6, weight_decay=0.01), x0, gs)
    assert _close(x, dowg(x0, gs, 3.0, 1e-2, 1e-6, 0.01))
    assert s.glob.sq_dist > 1e-2
    assert isinstance(s.glob, DoWGGlobal)
    assert _gap(dowg(x0, gs, 3.0, 1e-2, 1e-6, 0.01, unweighted=True), x) > 1e-3
    x, _ = run(refopt.DoWG(), x0, gs)                   # rbar_0^2 = eps by default
    assert _close(x, dowg(x0, gs, 1.0, 1e-4, 1e-4, 0.0))


def test_the_step_size_is_one_number_over_the_tree_and_scale_free():
    """x - eta g with eta ~ 1/||g||: scaling every gradient by c leaves the trajectory (eps -> 0)."""
    x0, gs = _tree(9)
    rule = refopt.DoG(init_step="distance", init_value=0.1, eps=1e-30)
    a, _ = run(rule, x0, gs)
    b, _ = run(rule, x0, [{k: 1e3 * v for k, v in g.items()} for g in gs])
    assert _close(a, b, 1e-12)


@pytest.mark.parametrize("make", [lambda: refopt.DoG(init_step="distance", init_value=0.1),
                                  lambda: refopt.DoWG(init_sq_dist=1e-2)])
def test_global_state_checkpoint_resume_bit_identical(make, tmp_path):
    rule = make()
    x0, gs = _tree(11)
    x, s = run(rule, x0, gs[:2])
    path = str(tmp_path / "ck")
    checkpoint.save(path, x, s, rule)
    x2, s2, rule2 = checkpoint.load(path)[:3]
    assert s2.glob == s.glob and type(s2.glob) is type(s.glob)
    xa, sa = refopt.update(rule, s, x, gs[2])
    xb, sb = refopt.update(rule2, s2, x2, gs[2])
    assert all(np.array_equal(xa[k], xb[k]) for k in xa) and sa.glob == sb.glob


def test_bad_global_state_and_hyperparameters():
    rule = refopt.DoG()
    x0, gs = _tree()
    s = refopt.init(rule, x0)
    for bad in (DoGGlobal(-1.0, 0.0), DoGGlobal(float("nan"), 0.0), (0.0, 0.0), None):
        before = {k: v.copy() for k, v in x0.items()}
        with pytest.raises(ValueError, match="global state"):
            refopt.update_(rule, s._replace(glob=bad), x0, gs[0])
        assert all(np.array_equal(before[k], x0[k]) for k in x0)    # nothing written
    for bad in (dict(init_step="auto"), dict(init_value=0.0), dict(eps=0.0), dict(weight_decay=-1.0)):
        with pytest.raises(ValueError):
            refopt.DoG(**bad)
    with pytest.raises(ValueError):
        refopt.DoWG(init_sq_dist=0.0)
    with pytest.raises(ValueError, match="init_step"):
        refopt.like("optax.contrib.dog", init_step=("auto", 1.0))
    assert refopt.like("optax.contrib.dog", init_step=["distance", 0.5]) == refopt.DoG(init_step="distance",
                                                                                       init_value=0.5)
    assert refopt.like("optax.contrib.dowg", weight_decay=0.1) == refopt.DoWG(weight_decay=0.1)


def test_dog_inside_partition_estimates_per_group():
    """optax.multi_transform gives each group its own DoG: refopt.Partition does the same."""
    x0, gs = _tree(13)
    inner = refopt.DoG(init_step="distance", init_value=0.1)
    rule = refopt.Partition({"w": inner, "b": inner}, lambda path, x: path)
    x, s = run(rule, x0, gs)
    assert _close(x, dog(x0, gs, 1.0, 0.1, 1e-8, 0.0, per_leaf=True))

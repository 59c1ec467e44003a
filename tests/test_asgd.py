"""ASGD against its definition: the step sizes lr/(1 + lambd lr (t-1))^alpha with the shrinkage, and the
average, which is the uniform mean of the iterates x_{t0+2} .. x_T (mu_t = 1/max(1, t - 1 - t0)); eval_params
returns it. Negative controls: the average from one step earlier, the step size counted from t."""
import numpy as np
import pytest

import refopt


def test_asgd_iterates_and_their_average():
    rng = np.random.default_rng(12)
    x0 = rng.standard_normal(5)
    gs = [rng.standard_normal(5) for _ in range(12)]
    lr, lambd, alpha, t0, wd = 0.05, 0.3, 0.6, 2.0, 0.01
    rule = refopt.ASGD(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=wd)
    x, s = x0, refopt.init(rule, x0)
    np.testing.assert_array_equal(refopt.eval_params(rule, s, x0), x0)        # before any step: x_0
    for g in gs:
        x, s = refopt.update(rule, s, x, g)

    def iterates(shift=0):
        xs, xe = [], x0.copy()
        for t, g in enumerate(gs, start=1):
            eta = lr / (1 + lambd * lr * (t - 1 + shift)) ** alpha
            xe = (1 - lambd * eta) * xe - eta * (g + wd * xe)
            xs.append(xe)
        return xs

    xs = iterates()
    np.testing.assert_allclose(x, xs[-1], rtol=1e-14)
    avg = refopt.eval_params(rule, s, x)
    np.testing.assert_allclose(avg, np.mean(xs[3:], axis=0), rtol=1e-13)      # x_4 .. x_12 (t0 + 2 = 4)
    assert avg is not s.leaves.ax                                              # a fresh copy
    assert np.max(np.abs(np.mean(xs[2:], axis=0) - avg)) > 1e-4                # from x_3
    assert np.max(np.abs(iterates(shift=1)[-1] - x)) > 1e-4                    # eta counted from t


def test_asgd_bad_input():
    for bad in (dict(lr=0.0), dict(lambd=-1.0), dict(alpha=-0.5), dict(t0=-1.0), dict(weight_decay=-1.0),
                dict(t0=float("nan"))):
        with pytest.raises(ValueError):
            refopt.ASGD(**bad)
    assert refopt.like("torch.optim.ASGD", lr=0.1, t0=5) == refopt.ASGD(lr=0.1, t0=5)
    with pytest.raises(ValueError, match="maximize"):
        refopt.like("torch.optim.ASGD", maximize=True)

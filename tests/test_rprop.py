"""Rprop against closed forms: under a constant gradient the step size grows as lr eta_plus^(t-1) up to its
bound, torch moves by it at every step and optax one step late; under a gradient whose sign alternates the
step size shrinks on every flip and the entry moves only every other step (iRprop-). Negative controls: weight
backtracking, the optax lag, the bounds ignored."""
import numpy as np
import pytest

import refopt


def _run(rule, x0, gs):
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    return x, s


@pytest.mark.parametrize("form", ["torch", "optax"])
def test_rprop_constant_gradient(form):
    g, x0, T = np.array([0.3, -2.0, 1e-8]), np.zeros(3), 12
    lr, eta, smax = 0.01, 1.3, 0.05
    x, s = _run(refopt.Rprop(lr=lr, eta_plus=eta, step_size_max=smax, form=form), x0, [g] * T)
    sizes = np.minimum(lr * eta ** np.arange(T), smax)
    moved = sizes.sum() if form == "torch" else sizes[:-1].sum()
    np.testing.assert_allclose(x, -np.sign(g) * moved, rtol=1e-14)
    np.testing.assert_allclose(s.leaves.step_size, sizes[-1], rtol=1e-14)
    other = sizes[:-1].sum() if form == "torch" else sizes.sum()
    assert np.max(np.abs(x + np.sign(g) * other)) > 1e-3                       # the lag (or its absence)
    free = lr * eta ** np.arange(T)                                            # the bound ignored
    assert np.max(np.abs(x + np.sign(g) * (free.sum() if form == "torch" else free[:-1].sum()))) > 1e-2


def test_rprop_alternating_sign_torch():
    # g_t = (-1)^(t+1) h: step 1 moves -sign(h) lr; step 2 flips: s = lr eta_minus, no move, g' = 0; step 3: p = 0,
    # moves -sign(h) s; step 4 flips again: s eta_minus, no move; ...
    h, lr, em, T = np.array([1.0, -0.5]), 0.1, 0.5, 6
    x, s = _run(refopt.Rprop(lr=lr, eta_minus=em), np.zeros(2), [h * (-1) ** t for t in range(T)])
    want = -np.sign(h) * (lr + lr * em + lr * em ** 2)                         # steps 1, 3, 5
    np.testing.assert_allclose(x, want, rtol=1e-15)
    np.testing.assert_allclose(s.leaves.step_size, lr * em ** 3, rtol=1e-15)
    np.testing.assert_array_equal(s.leaves.prev, 0.0)                          # step 6 flipped
    backtrack = -np.sign(h) * lr + np.sign(h) * lr                             # a backtrack undoes step 1 at step 2
    assert np.max(np.abs(want - backtrack)) > 1e-2


def test_rprop_bad_input():
    for bad in (dict(lr=0.0), dict(eta_minus=1.0), dict(eta_minus=0.0), dict(eta_plus=1.0),
                dict(step_size_min=-1.0), dict(step_size_min=1.0, step_size_max=0.5), dict(form="jax")):
        with pytest.raises(ValueError):
            refopt.Rprop(**bad)
    assert refopt.like("torch.optim.Rprop", lr=0.1, etas=(0.3, 1.5), step_sizes=(1e-4, 1.0)) == refopt.Rprop(
        lr=0.1, eta_minus=0.3, eta_plus=1.5, step_size_min=1e-4, step_size_max=1.0)
    assert refopt.like("optax.rprop", learning_rate=0.1).form == "optax"
    with pytest.raises(ValueError, match="maximize"):
        refopt.like("torch.optim.Rprop", maximize=True)

"""Adagrad against its closed form under a constant gradient (the sum is s_0 + t g^2), with the negative
controls the closed form must catch (eps on the other side of the square root, no lr decay)."""
import numpy as np
import pytest

import refopt


def closed_form(x0, g, steps, lr, lr_decay, s0, eps, inside):
    """x_T = x_0 - sum_t lr/(1 + (t-1) lr_decay) g / d_t, d_t = sqrt(s0 + t g^2) + eps (torch) or
    sqrt(s0 + t g^2 + eps) (optax), written from the definition with t = 1 .. T."""
    x = x0.copy()
    for t in range(1, steps + 1):
        s = s0 + t * g * g
        d = np.sqrt(s + eps) if inside else np.sqrt(s) + eps
        x = x - lr / (1 + (t - 1) * lr_decay) * g / d
    return x


@pytest.mark.parametrize("inside", [False, True])
def test_adagrad_matches_its_closed_form_under_a_constant_gradient(inside):
    rng = np.random.default_rng(3)
    x0, g = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    kw = dict(lr=0.2, lr_decay=0.05, s0=0.3, eps=1e-2)
    rule = refopt.Adagrad(lr=kw["lr"], lr_decay=kw["lr_decay"], initial_accumulator_value=kw["s0"], eps=kw["eps"],
                          eps_mode="inside" if inside else "outside")
    x, s = x0, refopt.init(rule, x0)
    for _ in range(20):
        x, s = refopt.update(rule, s, x, g)
    want = closed_form(x0, g, 20, inside=inside, **kw)
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(s.leaves.sum, kw["s0"] + 20 * g * g, rtol=1e-14)
    # negative controls: the other eps convention, and the lr not decayed, are far from the result
    assert np.max(np.abs(closed_form(x0, g, 20, inside=not inside, **kw) - x)) > 1e-4
    assert np.max(np.abs(closed_form(x0, g, 20, inside=inside, **{**kw, "lr_decay": 0.0}) - x)) > 1e-2


def test_adagrad_rejects_bad_hyperparameters_and_peer_arguments():
    for bad in (dict(lr=-1.0), dict(lr_decay=-0.1), dict(eps=0.0), dict(initial_accumulator_value=-1.0),
                dict(eps_mode="both")):
        with pytest.raises(ValueError):
            refopt.Adagrad(**bad)
    with pytest.raises(ValueError, match="maximize"):
        refopt.like("torch.optim.Adagrad", maximize=True)
    with pytest.raises(ValueError, match="eps"):
        refopt.like("optax.adagrad", learning_rate=0.1, eps=0.0)
    assert refopt.like("optax.adagrad", learning_rate=0.1) == refopt.Adagrad(
        lr=0.1, initial_accumulator_value=0.1, eps=1e-7, eps_mode="inside")

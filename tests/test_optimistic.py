"""Optimistic gradient descent: the update written from its definition on an arbitrary gradient sequence, and
the theory it exists for: on the bilinear game min_x max_y x y, simultaneous gradient descent-ascent spirals
out (|z| grows by sqrt(1 + lr^2) per step) while the optimistic step converges (Daskalakis et al. 2018).
Negative controls: g_0 = 0 at the first step, plain GDA."""
import numpy as np
import pytest

import refopt


def test_optimistic_update_from_its_definition():
    rng = np.random.default_rng(10)
    gs = [rng.standard_normal(4) for _ in range(5)]
    lr, a, b = 0.1, 0.7, 0.4
    rule = refopt.OptimisticGradientDescent(lr=lr, alpha=a, beta=b)
    x, s = np.zeros(4), refopt.init(rule, np.zeros(4))
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    prev = [gs[0]] + gs[:-1]
    want = -lr * sum((a + b) * g - b * p for g, p in zip(gs, prev))
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-16)
    zero_first = -lr * sum((a + b) * g - b * p for g, p in zip(gs, [np.zeros(4)] + gs[:-1]))
    assert np.max(np.abs(zero_first - x)) > 1e-3


def _game(rule, steps):
    z = np.array([1.0, 1.0])                        # (x, y) of f(x, y) = x y; descent on x, ascent on y
    s = refopt.init(rule, z)
    for _ in range(steps):
        z, s = refopt.update(rule, s, z, np.array([z[1], -z[0]]))
    return np.linalg.norm(z)


def test_optimism_converges_on_the_bilinear_game_where_gda_cycles_out():
    lr = 0.1
    assert _game(refopt.OptimisticGradientDescent(lr=lr), 2000) < 1e-3            # rate ~ 1 - lr^2/2 per step
    gda = _game(refopt.SGD(lr=lr), 500)
    np.testing.assert_allclose(gda, np.sqrt(2) * (1 + lr ** 2) ** 250, rtol=1e-10)   # closed form of GDA
    assert gda > 10


def test_optimistic_bad_input():
    for bad in (dict(lr=-1.0), dict(alpha=-0.1), dict(beta=-1.0), dict(schedule=3)):
        with pytest.raises(ValueError):
            refopt.OptimisticGradientDescent(**bad)
    with pytest.raises(ValueError, match="constant"):
        refopt.like("optax.optimistic_gradient_descent", learning_rate=0.1, beta=lambda t: 1.0)


def _adam_reference(x0, gs, lr, optimism, b1, b2, eps, eps_root, nesterov, first_zero=False):
    """Daskalakis et al. (2018), Algorithm 1 with optax's Adam direction: x -= (lr + o) u_t - o u_{t-1}."""
    x, m, v, prev = x0.copy(), 0 * x0, 0 * x0, None
    for t, g in enumerate(gs, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mh = b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t) if nesterov else m / (1 - b1 ** t)
        u = mh / (np.sqrt(v / (1 - b2 ** t) + eps_root) + eps)
        if prev is None:
            prev = 0 * u if first_zero else u
        x = x - ((lr + optimism) * u - optimism * prev)
        prev = u
    return x


@pytest.mark.parametrize("nesterov", [True, False])
def test_optimistic_adam_from_the_algorithm(nesterov):
    import refopt
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((3, 4))
    gs = [rng.standard_normal((3, 4)) for _ in range(6)]
    rule = refopt.OptimisticAdam(lr=0.01, optimism=0.005, beta1=0.8, beta2=0.95, eps=1e-6, eps_root=1e-10,
                                 nesterov=nesterov)
    x, s = {"w": x0}, refopt.init(rule, {"w": x0})
    for g in gs:
        x, s = refopt.update(rule, s, x, {"w": g})
    kw = dict(lr=0.01, optimism=0.005, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10, nesterov=nesterov)
    want = _adam_reference(x0, gs, **kw)
    np.testing.assert_allclose(x["w"], want, rtol=1e-13)
    for wrong in (dict(first_zero=True), dict(nesterov=not nesterov), dict(optimism=0.0)):
        assert np.max(np.abs(_adam_reference(x0, gs, **{**kw, **wrong}) - want)) > 1e-6
    assert refopt.like("optax.optimistic_adam", learning_rate=0.01) == refopt.OptimisticAdam(lr=0.01)
    for bad in (dict(optimism=-1.0), dict(beta1=1.0), dict(eps=0.0, eps_root=0.0), dict(nesterov=None)):
        with pytest.raises(ValueError):
            refopt.OptimisticAdam(**bad)
    with pytest.raises(ValueError, match="dtype"):
        refopt.like("optax.optimistic_adam", learning_rate=0.01, mu_dtype="bfloat16")

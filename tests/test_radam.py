"""RAdam against its closed form under a constant gradient (m_hat = g, v_hat = g^2, so the rectified step is
r_t g sqrt(1 - b2^t) / (sqrt(1 - b2^t) |g| + eps) in torch's form and r_t g / (|g| + eps) in optax's), with
rho_t and r_t written from Liu et al. (2020), eqs. (6)-(7) and Algorithm 2. Negative controls: the paper's
threshold 4 (one more rectified step), the other eps placement, no rectification."""
import numpy as np
import pytest

import refopt


def closed_form(x0, g, T, lr, b2, eps, corrected, threshold=5.0, rect=True):
    rho_inf = 2 / (1 - b2) - 1
    x = x0.copy()
    for t in range(1, T + 1):
        rho = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        if rho > threshold:
            r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)) if rect else 1.0
            c = np.sqrt(1 - b2 ** t)
            u = r * g / (np.abs(g) + eps) if corrected else r * g * c / (c * np.abs(g) + eps)
        else:
            u = g
        x = x - lr * u
    return x


@pytest.mark.parametrize("corrected", [False, True])
def test_radam_matches_its_closed_form_under_a_constant_gradient(corrected):
    rng = np.random.default_rng(9)
    x0, g = rng.standard_normal((3, 3)), 0.1 * rng.standard_normal((3, 3))
    lr, b2, eps, T = 0.01, 0.9, 1e-2, 12          # b2 0.9: rho_5 = 4.58 in (4, 5], rho_6 = 5.39
    rule = refopt.RAdam(lr=lr, beta1=0.8, beta2=b2, eps=eps, eps_mode="corrected" if corrected else "uncorrected")
    x, s = x0, refopt.init(rule, x0)
    for _ in range(T):
        x, s = refopt.update(rule, s, x, g)
    kw = dict(lr=lr, b2=b2, eps=eps)
    np.testing.assert_allclose(x, closed_form(x0, g, T, corrected=corrected, **kw), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(s.leaves.v, (1 - b2 ** T) * g * g, rtol=1e-13)
    for wrong in (dict(threshold=4.0), dict(corrected=not corrected), dict(rect=False)):
        assert np.max(np.abs(closed_form(x0, g, T, **{**kw, "corrected": corrected, **wrong}) - x)) > 1e-5, wrong


def test_radam_decoupled_decay_and_bad_input():
    x0, g = np.array([1.0, -2.0]), np.array([0.3, 0.1])
    rule = refopt.RAdam(lr=0.1, weight_decay=0.5, decoupled_weight_decay=True)
    x, _ = refopt.update(rule, refopt.init(rule, x0), x0, g)
    np.testing.assert_allclose(x, (1 - 0.05) * x0 - 0.1 * g, rtol=1e-15)     # step 1: the momentum step
    for bad in (dict(threshold=4.0), dict(eps=0.0), dict(eps_mode="both"), dict(beta2=1.0), dict(weight_decay=-1)):
        with pytest.raises(ValueError):
            refopt.RAdam(**bad)
    assert refopt.RAdam(eps=0.0, eps_root=1e-16).eps == 0.0
    assert refopt.like("torch.optim.RAdam", lr=0.1, decoupled_weight_decay=True, weight_decay=0.1) == refopt.RAdam(
        lr=0.1, weight_decay=0.1, decoupled_weight_decay=True)
    assert refopt.like("optax.radam", learning_rate=0.1, threshold=6.0).eps_mode == "corrected"
    with pytest.raises(ValueError, match="maximize"):
        refopt.like("torch.optim.RAdam", maximize=True)

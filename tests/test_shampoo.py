"""Shampoo written from Gupta et al. 2018 (Algorithm 2) in numpy with scipy's Schur-based fractional matrix power
(independent of refopt's eigendecomposition) on matrices, vectors (full-matrix AdaGrad) and an order-3 tensor;
closed forms (a constant diagonal gradient: x_ii moves by lr d_i / sqrt(eps + t d_i^2); a scalar is SGD); exact
rotation equivariance, rectangular arrays included; negative controls (the power -1/4 on a tensor, statistics of
the raw gradient, eps relative to the largest eigenvalue, the momentum of the gradients); bad input; the mapping of
pytorch_optimizer.Shampoo and its rows."""
import numpy as np
import pytest
import scipy.linalg

import refopt
from refopt.rules.shampoo import Shampoo, inverse_root
from tree_steps import last_params, run

NEEDS_PEER = "peer pytorch_optimizer not installed: pip install -e .[peers]"


def _frac(H, p):
    return np.real(scipy.linalg.fractional_matrix_power(H, -1.0 / p))


def algorithm(x0, gs, lr, eps):
    """The paper's Shampoo on one order-k array: H_i = eps I + sum_s G_(i) G_(i)^T, the step
    G x_1 H_1^(-1/2k) ... x_k H_k^(-1/2k)."""
    x, k = x0.copy(), x0.ndim
    H = [eps * np.eye(n) for n in x0.shape]
    for g in gs:
        u = g
        for i, n in enumerate(x0.shape):
            gi = np.moveaxis(g, i, 0).reshape(n, -1)
            H[i] = H[i] + gi @ gi.T
            u = np.moveaxis(np.einsum("ij,j...->i...", _frac(H[i], 2 * k), np.moveaxis(u, i, 0)), 0, i)
        x = x - lr * u
    return x


def _stream(shape, steps=6, seed=4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(steps)]


@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (2, 7), (5,), (3, 2, 4)])
def test_shampoo_matches_the_paper(shape):
    rule = Shampoo(lr=0.01, eps=1e-3)
    x0, gs = _stream(shape)
    x, st = run(rule, x0, gs)
    np.testing.assert_allclose(x, algorithm(x0, gs, 0.01, 1e-3), rtol=1e-11, atol=1e-14)
    assert [h.shape for h in st.leaves.H] == [(n, n) for n in shape]


def test_a_constant_diagonal_gradient_and_a_scalar():
    d = np.array([2.0, -1.0, 0.5])
    x0 = np.random.default_rng(0).standard_normal((3, 3))
    x, _ = run(Shampoo(lr=0.1, eps=1e-2), x0, [np.diag(d)] * 5)
    want = x0.copy()
    for t in range(1, 6):
        want[np.diag_indices(3)] -= 0.1 * d / np.sqrt(1e-2 + t * d * d)
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-15)
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(x[off], x0[off], rtol=0, atol=1e-15)
    s, _ = run(Shampoo(lr=0.1, momentum=0.5), np.array(2.0), [np.array(1.0), np.array(3.0)])
    np.testing.assert_allclose(s, 2.0 - 0.1 * 1.0 - 0.1 * (3.0 + 0.5 * (1.0 - 3.0)), rtol=1e-15)


@pytest.mark.parametrize("shape", [(5, 5), (6, 2)])
def test_rotations_are_followed(shape):
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((shape[0],) * 2))
    V, _ = np.linalg.qr(rng.standard_normal((shape[1],) * 2))
    x0, gs = _stream(shape)
    rule = Shampoo(lr=0.01, momentum=0.5, eps=1e-3, weight_decay=0.01, precondition_frequency=2)
    a, _ = run(rule, x0, gs)
    b, _ = run(rule, U @ x0 @ V.T, [U @ g @ V.T for g in gs])
    np.testing.assert_allclose(b, U @ a @ V.T, rtol=0, atol=1e-12)


def test_momentum_mixes_the_previous_preconditioned_update():
    """Two steps on a vector: b_1 = H_1^(-1/2) g_1, hat g_2 = g_2 + mu (b_1 - g_2); the oracle's momentum of the
    gradients (negative control) differs."""
    from refopt.conventions.shampoo import ShampooOracle
    g1, g2 = np.array([1.0, 2.0]), np.array([-1.0, 0.5])
    rule = Shampoo(lr=0.1, momentum=0.9, eps=1e-2)
    H1 = 1e-2 * np.eye(2) + np.outer(g1, g1)
    b1 = _frac(H1, 2) @ g1
    gh = g2 + 0.9 * (b1 - g2)
    H2 = H1 + np.outer(gh, gh)
    want = np.zeros(2) - 0.1 * b1 - 0.1 * _frac(H2, 2) @ gh
    x, _ = run(rule, np.zeros(2), [g1, g2])
    np.testing.assert_allclose(x, want, rtol=0, atol=1e-13)      # |x| <= 0.15; H_1 has condition number 500
    y = last_params(ShampooOracle(rule, momentum_of="grad"), np.zeros(2), [g1, g2])
    assert np.abs(y - want).max() > 1e-2


@pytest.mark.parametrize("switch", [dict(power="quarter"), dict(stats="raw"), dict(eps_at="relative"),
                                    dict(momentum_of="grad")])
def test_each_convention_changes_the_trajectory(switch):
    from refopt.conventions.shampoo import ShampooOracle
    from refopt.testing.adapters import RuleAdapter
    rule = Shampoo(lr=0.01, momentum=0.5, weight_decay=0.01, eps=1e-3)
    x0, gs = _stream((3, 2, 4), steps=8)
    ours = last_params(RuleAdapter(rule), x0, gs)
    np.testing.assert_allclose(last_params(ShampooOracle(rule), x0, gs), ours, rtol=0, atol=1e-12)
    assert np.abs(last_params(ShampooOracle(rule, **switch), x0, gs) - ours).max() > 1e-5


def test_precondition_frequency_keeps_the_last_roots():
    rule = Shampoo(lr=0.01, precondition_frequency=3)
    x0, gs = _stream((4, 3), steps=4)
    _, s = run(rule, x0, gs[:3])
    H1 = [1e-6 * np.eye(n) for n in (4, 3)]
    g = gs[0]
    H1 = [H1[0] + g @ g.T, H1[1] + g.T @ g]
    np.testing.assert_allclose(s.leaves.root[0], _frac(H1[0], 4), rtol=1e-9)
    _, s = run(rule, x0, gs)          # t = 4: recomputed
    np.testing.assert_allclose(s.leaves.root[1], _frac(s.leaves.H[1], 4), rtol=1e-9)


def test_inverse_root_and_bad_input():
    A = np.array([[4.0, 1.0], [1.0, 3.0]])
    np.testing.assert_allclose(inverse_root(A, 2, 1e-6) @ inverse_root(A, 2, 1e-6) @ A, np.eye(2), atol=1e-14)
    # an eigenvalue rounding pushed below eps is raised to eps, its exact lower bound
    np.testing.assert_allclose(inverse_root(np.diag([1.0, -1e-13]), 4, 1e-8), np.diag([1.0, 1e2]), rtol=1e-14)
    with pytest.raises(ValueError, match="floor"):
        inverse_root(A, 4, 0.0)
    for kw, match in [(dict(lr=-1.0), "lr"), (dict(momentum=1.0), "momentum"), (dict(eps=0.0), "eps"),
                      (dict(weight_decay=-1.0), "weight_decay"), (dict(decoupled=1), "decoupled"),
                      (dict(precondition_frequency=0), "precondition_frequency"),
                      (dict(precondition_frequency=True), "precondition_frequency"), (dict(schedule="x"), "schedule")]:
        with pytest.raises(ValueError, match=match):
            Shampoo(**kw)


def test_float32_stays_float32_and_direction():
    x0 = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    x, s = run(Shampoo(lr=0.01), x0, [np.ones_like(x0)] * 2)
    assert x.dtype == np.float32 and all(a.dtype == np.float32 for a in s.leaves.root + s.leaves.H)
    rule = Shampoo(lr=0.01, momentum=0.5)
    x0 = x0.astype(np.float64)
    st = refopt.init(rule, x0)
    g = np.random.default_rng(1).standard_normal((4, 3))
    u, _ = refopt.direction(rule, st, x0, g)
    new, _ = refopt.update(rule, st, x0, g)
    np.testing.assert_allclose(new, x0 - 0.01 * u, rtol=1e-15, atol=1e-17)


class NumpyShampoo:
    """Shampoo (momentum 0) on a list of arrays in numpy with one planted bug: 'relative eps' (H_0 = 0, the root of
    H + eps lambda_max(H) I, Anil et al.'s ridge)."""

    def __init__(self, lr=0.01, eps=1e-3, bug=None):
        self.lr, self.eps, self.bug = lr, eps, bug

    def init(self, params):
        e = 0.0 if self.bug == "relative eps" else self.eps
        return [[e * np.eye(n) for n in x.shape] for x in params]

    def step(self, s, params, grads):
        out, new = [], []
        for x, g, H in zip(params, grads, s):
            k, u, Hn = x.ndim, g, []
            for i, n in enumerate(x.shape):
                gi = np.moveaxis(g, i, 0).reshape(n, -1)
                h = H[i] + gi @ gi.T
                Hn.append(h)
                M = h + self.eps * np.linalg.eigvalsh(h)[-1] * np.eye(n) if self.bug == "relative eps" else h
                u = np.moveaxis(np.tensordot(_frac(M, 2 * k), u, axes=([1], [i])), 0, i)
            out.append(x - self.lr * u)
            new.append(Hn)
        return out, new


def test_a_shampoo_with_a_relative_eps_is_named():
    from refopt.crosscheck.plugin import check_impl
    rule = "Shampoo(lr=0.01, eps=0.001)"
    ok = check_impl(NumpyShampoo(), rule, framework="numpy", steps=10, problems=("stream",))
    assert ok.agree, ok.report()
    r = check_impl(NumpyShampoo(bug="relative eps"), rule, framework="numpy", steps=10, problems=("stream",))
    assert not r.agree and r.best.name == "eps relative to the largest eigenvalue" and r.best.reproduces, r.report()


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def test_like_pytorch_optimizer_shampoo():
    assert refopt.like("pytorch_optimizer.Shampoo") == Shampoo(max_precond_dim=None)     # the package: every axis
    assert refopt.like("pytorch_optimizer.Shampoo", lr=0.01, momentum=0.9, weight_decay=0.1, weight_decouple=True,
                       matrix_eps=1e-4) == Shampoo(lr=0.01, momentum=0.9, eps=1e-4, weight_decay=0.1, decoupled=True,
                                                   max_precond_dim=None)
    for kw, match in [(dict(preconditioning_compute_steps=2), "preconditioning_compute_steps"),
                      (dict(fixed_decay=True), "fixed_decay"), (dict(matrix_eps=0.0), "matrix_eps"),
                      (dict(maximize=True), "maximize")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.Shampoo", **kw)


@pytest.mark.parametrize("kw, problems", [(dict(lr=0.01), ("stream", "mlp")),
                                          (dict(lr=0.01, momentum=0.9, weight_decay=0.01, matrix_eps=1e-4),
                                           ("stream", "gpt"))])
def test_pytorch_optimizer_shampoo_agrees(kw, problems):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    import pytorch_optimizer
    from refopt.crosscheck.plugin import check_impl
    r = check_impl(pytorch_optimizer.Shampoo, refopt.like("pytorch_optimizer.Shampoo", **kw), kwargs=kw,
                   framework="torch", problems=problems, diagnose=False)
    assert r.agree and all(p.params_rel <= 1e-8 for p in r.problems), r.report()


def _shampoo_presets(misconfigured=False):
    from crosscheck_helpers import presets
    return presets("pytorch_optimizer", misconfigured, family="shampoo")


@pytest.mark.parametrize("preset", _shampoo_presets(), ids=[p.name for p in _shampoo_presets()])
def test_pytorch_optimizer_shampoo_rows_agree(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_passes
    assert_passes(preset)
    assert_passes(preset, problem="gpt")


@pytest.mark.parametrize("preset", _shampoo_presets(True), ids=[p.name for p in _shampoo_presets(True)])
def test_pytorch_optimizer_shampoo_wrong_rows_are_caught(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_caught
    assert_caught(preset)


def test_max_precond_dim_leaves_long_axes_unpreconditioned():
    """A 7 x 3 matrix with max_precond_dim 4: only the 3-axis has a statistic, k = 1, so the step is
    hat g R^(-1/2) -- Shampoo of the rows, as for a stack of vectors."""
    x0, gs = _stream((7, 3), steps=4)
    x, s = run(Shampoo(lr=0.01, max_precond_dim=4), x0, gs)
    assert [h.shape for h in s.leaves.H] == [(3, 3)]
    R, want = 1e-6 * np.eye(3), x0.copy()
    for g in gs:
        R = R + g.T @ g
        want = want - 0.01 * g @ _frac(R, 2)
    np.testing.assert_allclose(x, want, rtol=1e-11, atol=1e-14)
    big, _ = run(Shampoo(lr=0.01, max_precond_dim=2), np.zeros(5), [np.ones(5)])
    np.testing.assert_array_equal(big, -0.01 * np.ones(5))          # no axis preconditioned: SGD

"""Dion written from Ahn et al. 2025 (Algorithm 1, centralized) in numpy on the paper's m x n matrix; its closed
forms (no package ships Dion): at full rank the error feedback leaves M_t = mu B_t; on a rank-1 first gradient
the update is the exact msign, Muon's step; Q_t has unit columns; the signs of the QR cancel; negative controls
(no error feedback, Q not normalised, Q not refreshed, a rank-1 gradient of another rank); bad input."""
import numpy as np
import pytest

import refopt
from refopt.rules.dion import Dion, initial_q
from tree_steps import run


def algorithm(x0, gs, q0, lr, mu, eps, wd, bug=None):
    """The paper's Dion on one refopt (fan_in, fan_out) array W: the paper's matrix is W^T (m = fan_out,
    n = fan_in); B = M + G; P = qr(B Q); R = B^T P; M = B - (1 - mu) P R^T; Q = R / colnorm(R);
    W^T = (1 - lr wd) W^T - lr sqrt(m/n) P Q^T."""
    X, M, Q = x0.T.copy(), np.zeros_like(x0.T), q0.copy()
    m, n = X.shape
    for g in gs:
        B = M + g.T
        P = np.linalg.qr(B @ Q)[0]
        R = B.T @ P
        M = mu * B if bug == "no feedback" else B - (1 - mu) * P @ R.T
        Qn = R if bug == "no normalisation" else R / (np.sqrt((R ** 2).sum(axis=0)) + eps)
        if bug != "no refresh":
            Q = Qn
        X = (1 - lr * wd) * X - lr * np.sqrt(m / n) * P @ Qn.T
    return X.T, M.T, Q


def _stream(shape, steps=6, seed=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(steps)]


@pytest.mark.parametrize("shape, rank", [((6, 4), 2), ((3, 7), 1), ((5, 5), None), ((4, 6), 3)])
def test_dion_six_steps_from_the_paper(shape, rank):
    x0, gs = _stream(shape)
    rule = Dion(lr=0.03, momentum=0.9, rank=rank, eps=1e-8, weight_decay=0.1, seed=3)
    q0 = initial_q(shape, rank, 3, "w", np.float64)
    want, M, Q = algorithm(x0, gs, q0, 0.03, 0.9, 1e-8, 0.1)
    x, s = run(rule, {"w": x0}, [{"w": g} for g in gs])
    np.testing.assert_allclose(x["w"], want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(s.leaves["w"].M, M, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(s.leaves["w"].Q, Q, rtol=1e-12, atol=1e-14)
    r = min(shape) if rank is None else rank
    assert s.leaves["w"].Q.shape == (shape[0], r)


@pytest.mark.parametrize("bug", ["no feedback", "no normalisation", "no refresh"])
def test_dion_oracle_negative_controls(bug):
    x0, gs = _stream((6, 4))
    q0 = initial_q((6, 4), 2, 0, "w", np.float64)
    x, _ = run(Dion(lr=0.03, momentum=0.9, rank=2), {"w": x0}, [{"w": g} for g in gs])
    wrong, _, _ = algorithm(x0, gs, q0, 0.03, 0.9, 1e-8, 0.0, bug=bug)
    assert np.max(np.abs(x["w"] - wrong)) > 1e-6 * np.max(np.abs(x["w"] - x0))


@pytest.mark.parametrize("shape", [(6, 4), (3, 5)])
def test_full_rank_error_feedback_is_momentum_and_q_has_unit_columns(shape):
    """At r = min(m, n), P_t spans the range of B_t, so P R^T = P P^T B = B and M_t = mu B_t; with eps 1e-300
    (below any rounding of a column norm of order 1) every column of Q_t has norm 1."""
    x0, gs = _stream(shape, steps=4)
    rule = Dion(lr=0.02, momentum=0.8, eps=1e-300)
    x, s = {"w": x0}, refopt.init(rule, {"w": x0})
    M = np.zeros(shape)
    for g in gs:
        B = M + g
        x, s = refopt.update(rule, s, x, {"w": g})
        M = 0.8 * B
        np.testing.assert_allclose(s.leaves["w"].M, M, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.linalg.norm(s.leaves["w"].Q, axis=0), 1.0, rtol=1e-14)


def test_rank_one_gradient_gives_the_exact_msign():
    """G_1 = a b^T at rank 1: P_1 = +-b/|b|, Q_1 = +-a/|a|, so P Q^T = msign(G_1) and the first step is Muon's
    with the exact polar factor and the spectral scale, whatever Q_0. (At a higher rank the QR's other columns
    span rounding noise, which eps keeps small.)"""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(5), rng.standard_normal(3)
    x0, g = {"w": rng.standard_normal((5, 3))}, {"w": np.outer(a, b)}
    want, _ = refopt.update(refopt.Muon(lr=0.02, momentum=0.0, nesterov=False, msign="svd"),
                            refopt.init(refopt.Muon(lr=0.02), x0), x0, g)
    for seed in (0, 7, 11):
        rule = Dion(lr=0.02, rank=1, seed=seed, eps=1e-300)
        x, _ = refopt.update(rule, refopt.init(rule, x0), x0, g)
        np.testing.assert_allclose(x["w"], want["w"], rtol=1e-12, atol=1e-14)
    # negative control: a rank-2 gradient is not approximated by a rank-1 update
    g2 = {"w": np.outer(a, b) + np.outer(rng.standard_normal(5), rng.standard_normal(3))}
    want2, _ = refopt.update(refopt.Muon(lr=0.02, momentum=0.0, nesterov=False, msign="svd"),
                             refopt.init(refopt.Muon(lr=0.02), x0), x0, g2)
    x2, _ = refopt.update(Dion(lr=0.02, rank=1), refopt.init(Dion(lr=0.02, rank=1), x0), x0, g2)
    assert np.max(np.abs(x2["w"] - want2["w"])) > 1e-4


def test_dion_gradient_scale_invariance_and_float32():
    x0, gs = _stream((4, 6), steps=3)
    rule = Dion(lr=0.02, rank=2, eps=1e-30)
    x1, _ = run(rule, {"w": x0}, [{"w": g} for g in gs])
    x2, _ = run(rule, {"w": x0}, [{"w": 1e3 * g} for g in gs])
    np.testing.assert_allclose(x1["w"], x2["w"], rtol=1e-12, atol=1e-14)
    x32, s32 = run(rule, {"w": x0.astype(np.float32)}, [{"w": g.astype(np.float32)} for g in gs])
    assert x32["w"].dtype == s32.leaves["w"].M.dtype == s32.leaves["w"].Q.dtype == np.float32
    np.testing.assert_allclose(x32["w"], x1["w"], rtol=1e-4, atol=1e-5)


def test_initial_q_is_per_path_and_seeded():
    a = initial_q((6, 4), 2, 0, "w", np.float64)
    assert a.shape == (6, 2) and np.allclose(np.linalg.norm(a, axis=0), 1.0)
    assert np.array_equal(a, initial_q((6, 4), 2, 0, "w", np.float64))
    assert not np.allclose(a, initial_q((6, 4), 2, 0, "v", np.float64))
    assert not np.allclose(a, initial_q((6, 4), 2, 1, "w", np.float64))


@pytest.mark.parametrize("kw, match", [(dict(rank=0), "rank"), (dict(rank=1.5), "rank"), (dict(eps=-1.0), "eps"),
                                       (dict(eps=0.0), "eps"),
                                       (dict(momentum=1.0), "momentum"), (dict(lr=-1.0), "lr"),
                                       (dict(scale="x"), "scale"), (dict(seed=-1), "seed"),
                                       (dict(weight_decay=-0.1), "weight_decay")])
def test_dion_bad_hyperparameters_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        Dion(**kw)


def test_dion_refuses_vectors_naming_the_path():
    with pytest.raises(ValueError, match=r"Dion takes matrices .* at b has shape \(3,\)"):
        refopt.init(Dion(), {"w": np.ones((2, 3)), "b": np.ones(3)})


class NumpyDion:
    """Dion in numpy over a list of (fan_in, fan_out) arrays, Q_0 from refopt's draw, with one planted bug."""

    def __init__(self, lr=0.02, mu=0.9, rank=2, bug=None):
        self.lr, self.mu, self.rank, self.bug = lr, mu, rank, bug

    def init(self, params):
        return {"M": [np.zeros_like(x) for x in params],
                "Q": [initial_q(x.shape, self.rank, 0, f"[{i}]", x.dtype) for i, x in enumerate(params)]}

    def step(self, s, params, grads):
        out, new = [], {"M": [], "Q": []}
        for x, g, M, Q in zip(params, grads, s["M"], s["Q"]):
            B = (M + g).T
            P = np.linalg.qr(B @ Q)[0]
            R = B.T @ P
            M = self.mu * B if self.bug == "no feedback" else B - (1 - self.mu) * P @ R.T
            Q = R / (np.linalg.norm(R, axis=0) + 1e-8)
            out.append(x - self.lr * np.sqrt(B.shape[0] / B.shape[1]) * (P @ Q.T).T)
            new["M"].append(M.T)
            new["Q"].append(Q)
        return out, new


def test_a_dion_without_error_feedback_is_named():
    from refopt.crosscheck.plugin import check_impl
    rule = "Dion(lr=0.02, momentum=0.9, rank=2)"
    r = check_impl(NumpyDion(bug="no feedback"), rule, framework="numpy", steps=10, problems=("stream", "quadratic"))
    assert not r.agree and r.best.name == "no error feedback" and r.best.reproduces, r.report()
    assert check_impl(NumpyDion(), rule, framework="numpy", steps=10, problems=("stream", "quadratic")).agree


def test_dion_integer_like_rank_and_seed_and_huge_gradients():
    r = Dion(rank=np.int64(2), seed=np.int64(3))
    assert (r.rank, r.seed) == (2, 3) and type(r.rank) is int and type(r.seed) is int
    x0 = {"w": np.ones((3, 4))}
    s = refopt.init(r, x0)
    with pytest.raises(FloatingPointError, match="w"):
        refopt.update(r, s, x0, {"w": np.full((3, 4), 1e300)})
    assert np.array_equal(x0["w"], np.ones((3, 4))) and not np.any(s.leaves["w"].M)

"""SOAP written from Vyas et al. 2024 in numpy (numpy's eigh and QR, on shapes whose factors have distinct
eigenvalues, where the basis is unique up to signs) over several steps and refreshes; closed forms (a vector is
Adam with the first step skipped; a constant diagonal gradient is Adam on the diagonal and leaves the rest);
rotation equivariance where the eigenvalues are distinct; the canonical eigenbasis (independent of the basis the
solver returns, stable under rounding, exact unit vectors on zero rows); negative controls (m in the eigenbasis,
v not permuted, the decay before the step, no first-step skip, the basis recomputed by eigh); bad input; the
mapping of pytorch_optimizer.SOAP and the package through docs/factories/soap.py."""

import numpy as np
import pytest

import refopt
from refopt.linalg.eigen import eigh_descending
from refopt.rules.soap import SOAP, refresh_basis
from tree_steps import last_params, run

NEEDS_PEER = "peer pytorch_optimizer not installed: pip install -e .[peers]"


def _eig_desc(A):
    return np.linalg.eigh(A)[1][:, ::-1]


def _power(A, Q):
    P = A @ Q
    order = np.argsort(-np.diag(Q.T @ P), kind="stable")
    return np.linalg.qr(P[:, order])[0], order


def algorithm(x0, gs, lr, b1, b2, sb, eps, wd, freq):
    """The paper's SOAP on one m x n matrix: t = 1 sets L = (1 - sb) G G^T, R = (1 - sb) G^T G and their
    eigenbases (descending); then per step G' = QL^T G QR, m = b1 m + (1 - b1) G, v = b2 v + (1 - b2) G'^2,
    N = QL [(QL^T m QR) / (sqrt(v) + eps)] QR^T, x = (x - lr sqrt(1 - b2^k) / (1 - b1^k) N)(1 - lr wd), k = t - 1,
    the factors' EMA with G, and every freq-th k one power iteration + QR per side, v's rows / columns reordered."""
    x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for t, g in enumerate(gs, 1):
        if t == 1:
            L, R = (1 - sb) * g @ g.T, (1 - sb) * g.T @ g
            QL, QR = _eig_desc(L), _eig_desc(R)
            continue
        k = t - 1
        gp = QL.T @ g @ QR
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * gp ** 2
        N = QL @ ((QL.T @ m @ QR) / (np.sqrt(v) + eps)) @ QR.T
        x = (x - lr * np.sqrt(1 - b2 ** k) / (1 - b1 ** k) * N) * (1 - lr * wd)
        L, R = sb * L + (1 - sb) * g @ g.T, sb * R + (1 - sb) * g.T @ g
        if k % freq == 0:
            QL, rows = _power(L, QL)
            QR, cols = _power(R, QR)
            v = v[rows][:, cols]
    return x, m, v


def _stream(shape, steps=9, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(steps)]


@pytest.mark.parametrize("shape", [(4, 4), (5, 4), (3, 4)])
@pytest.mark.parametrize("kw", [dict(), dict(lr=0.01, beta1=0.9, beta2=0.99, shampoo_beta=0.8, weight_decay=0.1,
                                             precondition_frequency=3, eps=1e-6)])
def test_soap_matches_the_paper(shape, kw):
    rule = SOAP(**kw)
    x0, gs = _stream(shape)
    sb = rule.beta2 if rule.shampoo_beta is None else rule.shampoo_beta
    want, m, v = algorithm(x0, gs, rule.lr, rule.beta1, rule.beta2, sb, rule.eps, rule.weight_decay,
                           rule.precondition_frequency)
    x, st = run(rule, {"w": x0}, [{"w": g} for g in gs])
    np.testing.assert_allclose(x["w"], want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(st.leaves["w"].m, m, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(st.leaves["w"].v, v, rtol=1e-10, atol=1e-16)


def test_the_paper_algorithm_catches_a_wrong_refresh():
    """Negative control of the oracle above: without the v reordering it parts from the rule."""
    rule = SOAP(lr=0.01, precondition_frequency=2)
    x0, gs = _stream((4, 4))
    x, _ = run(rule, {"w": x0}, [{"w": g} for g in gs])
    keep = SOAP(lr=0.01, precondition_frequency=100)
    x_keep, _ = run(keep, {"w": x0}, [{"w": g} for g in gs])
    want, _, _ = algorithm(x0, gs, 0.01, 0.95, 0.95, 0.95, 1e-8, 0.01, 2)
    assert np.abs(x["w"] - want).max() < 1e-13 < 1e-6 < np.abs(x_keep["w"] - want).max()


def test_a_vector_is_adam_with_the_first_step_skipped():
    rule = SOAP(lr=0.02, beta1=0.9, beta2=0.99, weight_decay=0.1)
    x0, gs = _stream((7,))
    x, m, v = x0.copy(), np.zeros(7), np.zeros(7)
    for t, g in enumerate(gs[1:], 2):
        k = t - 1
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        x = (x - 0.02 * np.sqrt(1 - 0.99 ** k) / (1 - 0.9 ** k) * m / (np.sqrt(v) + 1e-8)) * (1 - 0.02 * 0.1)
    got, st = run(rule, x0, gs)
    np.testing.assert_allclose(got, x, rtol=1e-14, atol=1e-16)
    assert st.leaves.GG == () and st.leaves.Q == ()
    x1, _ = run(rule, x0, gs[:1])
    np.testing.assert_array_equal(x1, x0)        # the first step only builds the factors


def test_a_constant_diagonal_gradient_is_adam_on_the_diagonal():
    d = np.array([3.0, -1.0, 2.0, 0.5])
    x0 = np.random.default_rng(0).standard_normal((4, 4))
    rule = SOAP(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.0, precondition_frequency=2)
    x, st = run(rule, x0, [np.diag(d)] * 8)
    want = x0.copy()
    for k in range(1, 8):
        mk, vk = (1 - 0.9 ** k) * d, (1 - 0.99 ** k) * d * d
        want[np.diag_indices(4)] -= 0.01 * np.sqrt(1 - 0.99 ** k) / (1 - 0.9 ** k) * mk / (np.sqrt(vk) + 1e-8)
    np.testing.assert_allclose(x, want, rtol=1e-14, atol=1e-16)
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_array_equal(x[off], x0[off])
    # the basis is the unit vectors in descending order of d^2, every sign +
    np.testing.assert_array_equal(st.leaves.Q[0], np.eye(4)[:, np.argsort(-d * d)])


def test_rotations_are_followed_where_the_eigenvalues_are_distinct():
    rng = np.random.default_rng(5)
    U, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    V, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    x0, gs = _stream((5, 5))
    rule = SOAP(lr=0.01, precondition_frequency=3)
    a, _ = run(rule, x0, gs)
    b, _ = run(rule, U @ x0 @ V.T, [U @ g @ V.T for g in gs])
    np.testing.assert_allclose(b, U @ a @ V.T, rtol=0, atol=1e-12)
    # a tall gradient's first left factor has a repeated zero eigenvalue: its canonical basis is not rotated
    x0, gs = _stream((6, 2))
    U, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    a, _ = run(rule, x0, gs)
    b, _ = run(rule, U @ x0, [U @ g for g in gs])
    assert np.abs(b - U @ a).max() > 1e-3


# ---- the canonical eigenbasis ---------------------------------------------------------------------------
def _with_basis(w, V):
    return (V * w) @ V.T


def test_eigh_descending_is_an_eigenbasis_in_descending_order():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((7, 3))
    A = G @ G.T
    w, Q = eigh_descending(A)
    assert np.all(np.diff(w) <= 1e-14) and w.dtype == np.float64
    np.testing.assert_allclose(Q.T @ Q, np.eye(7), atol=1e-14)
    np.testing.assert_allclose(A @ Q, Q * w, atol=1e-13)
    w32, Q32 = eigh_descending(A.astype(np.float32))
    assert w32.dtype == Q32.dtype == np.float32


def test_the_basis_of_a_repeated_eigenvalue_does_not_depend_on_the_solver():
    """Two eigenbases of one matrix (rotated inside the 3-dimensional eigenspace of 1) give one canonical basis;
    numpy's eigh on the two roundings of the matrix does not (negative control)."""
    rng = np.random.default_rng(1)
    V, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    R, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    W = V.copy()
    W[:, 1:4] = V[:, 1:4] @ R
    w = np.array([5.0, 1.0, 1.0, 1.0, 0.25, 0.0])
    A, B = _with_basis(w, V), _with_basis(w, W)
    assert np.abs(A - B).max() < 1e-14
    _, QA = eigh_descending(A)
    _, QB = eigh_descending(B)
    np.testing.assert_allclose(QA, QB, atol=1e-12)
    # a rank-deficient G G^T and the same product summed in the other order (another BLAS's rounding): the same
    # canonical basis, not the same raw basis of the 5-dimensional null space
    G = rng.standard_normal((8, 3))
    A1 = G @ G.T
    A2 = G[:, ::-1] @ G[:, ::-1].T
    assert 0 < np.abs(A1 - A2).max() < 1e-15
    np.testing.assert_allclose(eigh_descending(A1)[1], eigh_descending(A2)[1], atol=1e-10)
    raw1, raw2 = np.linalg.eigh(A1)[1][:, :5], np.linalg.eigh(A2)[1][:, :5]
    assert np.abs(np.abs(raw1.T @ raw2) - np.eye(5)).max() > 1e-3


def test_zero_rows_get_unit_vectors_last():
    rng = np.random.default_rng(2)
    G = rng.standard_normal((6, 4))
    G[[1, 4]] = 0.0
    A = G @ G.T
    w, Q = eigh_descending(A)
    np.testing.assert_array_equal(Q[:, 4], np.eye(6)[:, 1])
    np.testing.assert_array_equal(Q[:, 5], np.eye(6)[:, 4])
    assert np.all(Q[[1, 4], :4] == 0) and np.all(w[4:] == 0)
    Qn, order = refresh_basis(A, Q)
    np.testing.assert_array_equal(Qn[:, 4:], Q[:, 4:])
    np.testing.assert_array_equal(order[4:], [4, 5])


def test_refresh_of_an_eigenbasis_sorts_it():
    rng = np.random.default_rng(3)
    V, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    w = np.array([4.0, 3.0, 2.0, 1.0, 0.5])
    A = _with_basis(w, V)
    perm = np.array([2, 0, 4, 1, 3])
    Qn, order = refresh_basis(A, -V[:, perm])
    np.testing.assert_array_equal(order, np.argsort(perm))
    D = Qn.T @ A @ Qn
    np.testing.assert_allclose(np.diag(D), w, rtol=1e-13)
    assert np.abs(D - np.diag(np.diag(D))).max() < 1e-13


def test_eigh_descending_refuses_bad_matrices():
    with pytest.raises(ValueError, match="square"):
        eigh_descending(np.ones((2, 3)))
    with pytest.raises(ValueError, match="finite"):
        eigh_descending(np.array([[1.0, np.nan], [np.nan, 1.0]]))


# ---- negative controls, dtypes, bad input ---------------------------------------------------------------
@pytest.mark.parametrize("switch", [dict(m_basis="eigen"), dict(permute_v=False), dict(decay="before"),
                                    dict(first="step"), dict(refresh="eigh")])
def test_each_convention_changes_the_trajectory(switch):
    from refopt.conventions.soap import SOAPOracle
    from refopt.testing.adapters import RuleAdapter
    rule = SOAP(lr=0.01, beta1=0.9, weight_decay=0.1, precondition_frequency=2)
    x0, gs = _stream((6, 4), steps=10)
    ours = last_params(RuleAdapter(rule), x0, gs)
    np.testing.assert_allclose(last_params(SOAPOracle(rule), x0, gs), ours, rtol=0, atol=1e-12)
    assert np.abs(last_params(SOAPOracle(rule, **switch), x0, gs) - ours).max() > 1e-5


def test_soap_float32_stays_float32_and_direction():
    rule = SOAP(lr=0.01, precondition_frequency=2)
    x0 = {"w": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
          "b": np.zeros(3, np.float32)}
    g = {k: np.ones_like(v) for k, v in x0.items()}
    x, st = run(rule, x0, [g, g, g])
    assert x["w"].dtype == np.float32 and all(a.dtype == np.float32 for a in st.leaves["w"].Q)
    rule64 = SOAP(lr=0.01, weight_decay=0.0)
    x0 = np.random.default_rng(1).standard_normal((4, 3))
    s = refopt.init(rule64, x0)
    u, s1 = refopt.direction(rule64, s, x0, np.ones((4, 3)))
    np.testing.assert_array_equal(u, 0.0)        # t = 1 builds the factors only
    g2 = np.random.default_rng(2).standard_normal((4, 3))
    u, _ = refopt.direction(rule64, s1, x0, g2)
    new, _ = refopt.update(rule64, s1, x0, g2)
    np.testing.assert_allclose(new, x0 - 0.01 * u, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("kw, match", [
    (dict(lr=-1.0), "lr"), (dict(beta1=1.0), "beta1"), (dict(beta2=-0.1), "beta2"),
    (dict(shampoo_beta=1.0), "shampoo_beta"), (dict(eps=0.0), "eps"), (dict(weight_decay=-1.0), "weight_decay"),
    (dict(precondition_frequency=0), "precondition_frequency"),
    (dict(precondition_frequency=True), "precondition_frequency"),
    (dict(precondition_frequency=2.0), "precondition_frequency"), (dict(max_precond_dim=0), "max_precond_dim"),
    (dict(precondition_1d=1), "precondition_1d"), (dict(bias_correction="yes"), "bias_correction"),
    (dict(schedule=3), "schedule")])
def test_soap_bad_hyperparameters_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        SOAP(**kw)


def test_max_precond_dim_and_precondition_1d_choose_the_axes():
    rule = SOAP(max_precond_dim=4, precondition_1d=True)
    s = refopt.init(rule, {"w": np.zeros((6, 3)), "b": np.zeros(3), "big": np.zeros(9)})
    assert [a.shape for a in s.leaves["w"].GG] == [(3, 3)]
    assert [a.shape for a in s.leaves["b"].GG] == [(3, 3)] and s.leaves["big"].GG == ()


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def _factory():
    from crosscheck_helpers import load_factory
    return load_factory("soap")


def test_like_pytorch_optimizer_soap():
    r = refopt.like("pytorch_optimizer.SOAP", lr=0.01, betas=(0.9, 0.99), shampoo_beta=0.8, weight_decay=0.1,
                    precondition_frequency=4, max_precondition_dim=64, precondition_1d=True, correct_bias=False,
                    eps=1e-7)
    assert r == SOAP(lr=0.01, beta1=0.9, beta2=0.99, shampoo_beta=0.8, weight_decay=0.1, precondition_frequency=4,
                     max_precond_dim=64, precondition_1d=True, bias_correction=False, eps=1e-7)
    assert refopt.like("pytorch_optimizer.SOAP") == SOAP()
    for kw, match in [(dict(merge_dims=True), "merge_dims"), (dict(normalize_gradient=True), "normalize_gradient"),
                      (dict(data_format="channels_last"), "data_format"), (dict(eps=0.0), "eps"),
                      (dict(maximize=True), "maximize"), (dict(precondition_frequency=0), "precondition_frequency")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.SOAP", **kw)


_ROWS = [dict(lr=0.01, betas=(0.9, 0.99), shampoo_beta=0.9, weight_decay=0.05, precondition_frequency=4, eps=1e-7),
         dict(lr=3e-3)]


@pytest.mark.parametrize("kw", _ROWS)
def test_pytorch_optimizer_soap_agrees_through_the_factory(kw):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from refopt.crosscheck.plugin import check_impl
    rule = refopt.like("pytorch_optimizer.SOAP", **kw)
    r = check_impl(_factory().soap, rule, kwargs=kw, framework="torch", problems=("stream", "mlp"), diagnose=False)
    assert r.agree, r.report()
    assert r.problems[0].tier == "exact" and r.problems[0].params_rel <= 1e-12, r.report()
    assert r.problems[1].params_rel <= 1e-8, r.report()


def test_pytorch_optimizer_soap_as_shipped_parts_on_rectangular_arrays():
    """The package's own eigenbasis of the repeated zero eigenvalue: caught on the stream at the second step;
    a 0.1 decay left out is caught through the factory (negative controls)."""
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from refopt.crosscheck.plugin import check_impl
    f = _factory()
    rule = refopt.like("pytorch_optimizer.SOAP", lr=3e-3)
    r = check_impl(f.soap_as_shipped, rule, kwargs=dict(lr=3e-3), framework="torch", problems=("stream",),
                   diagnose=False)
    assert not r.agree and r.problems[0].params_rel > 1e-4, r.report()
    r = check_impl(f.soap, refopt.like("pytorch_optimizer.SOAP", lr=0.01, weight_decay=0.0),
                   kwargs=dict(lr=0.01, weight_decay=0.1), framework="torch", problems=("stream",), diagnose=False)
    assert not r.agree, r.report()
    import torch
    with pytest.raises(ValueError, match="merge_dims"):
        f.soap([torch.zeros(3, 2, dtype=torch.float64)], merge_dims=True)
    from refopt.conventions.soap import pytorch_optimizer_soap
    with pytest.raises(ValueError, match="linear_algebra"):
        pytorch_optimizer_soap([torch.zeros(3, 2, dtype=torch.float64)], linear_algebra="lapack")


class NumpySOAP:
    """SOAP on a list of matrices and vectors in numpy (refopt's canonical eigenbasis and refresh; a vector takes
    Adam with the first step skipped), with one planted bug: 'decay before' (x (1 - lr wd) - step N)."""

    def __init__(self, lr=0.01, b=0.95, wd=0.1, eps=1e-8, freq=3, bug=None):
        self.lr, self.b, self.wd, self.eps, self.freq, self.bug = lr, b, wd, eps, freq, bug

    def init(self, params):
        n = len(params)
        return {"t": 0, "m": [np.zeros_like(x) for x in params], "v": [np.zeros_like(x) for x in params],
                "L": [None] * n, "R": [None] * n, "QL": [None] * n, "QR": [None] * n}

    def step(self, s, params, grads):
        b, t = self.b, s["t"] + 1
        s = {k: (list(v) if isinstance(v, list) else v) for k, v in s.items()}
        s["t"], out = t, []
        for i, (x, g) in enumerate(zip(params, grads)):
            if x.ndim == 1:            # vectors: Adam with the first step skipped
                x, g = x[None, :], g[None, :]
                s["QL"][i], s["QR"][i] = np.eye(1), np.eye(x.shape[1])
            if t == 1:
                if params[i].ndim == 2:
                    s["L"][i], s["R"][i] = (1 - b) * g @ g.T, (1 - b) * g.T @ g
                    s["QL"][i], s["QR"][i] = eigh_descending(s["L"][i])[1], eigh_descending(s["R"][i])[1]
                out.append(params[i].copy())
                continue
            QL, QR, k = s["QL"][i], s["QR"][i], t - 1
            gp = QL.T @ g @ QR
            m = b * s["m"][i].reshape(x.shape) + (1 - b) * g
            v = b * s["v"][i].reshape(x.shape) + (1 - b) * gp * gp
            s["m"][i], s["v"][i] = m.reshape(params[i].shape), v.reshape(params[i].shape)
            N = QL @ ((QL.T @ m @ QR) / (np.sqrt(v) + self.eps)) @ QR.T
            step = self.lr * np.sqrt(1 - b ** k) / (1 - b ** k)
            keep = 1 - self.lr * self.wd
            new = keep * x - step * N if self.bug == "decay before" else keep * (x - step * N)
            out.append(new if params[i].ndim == 2 else new[0])
            if params[i].ndim == 1:
                continue
            s["L"][i], s["R"][i] = b * s["L"][i] + (1 - b) * g @ g.T, b * s["R"][i] + (1 - b) * g.T @ g
            if k % self.freq == 0:
                s["QL"][i], rows = refresh_basis(s["L"][i], QL)
                s["QR"][i], cols = refresh_basis(s["R"][i], QR)
                s["v"][i] = s["v"][i][rows][:, cols]
        return out, s


def test_a_soap_decaying_before_the_step_is_named():
    from refopt.crosscheck.plugin import check_impl
    rule = "SOAP(lr=0.01, weight_decay=0.1, precondition_frequency=3)"
    ok = check_impl(NumpySOAP(), rule, framework="numpy", steps=10, problems=("stream",))
    assert ok.agree, ok.report()
    r = check_impl(NumpySOAP(bug="decay before"), rule, framework="numpy", steps=10, problems=("stream",))
    assert not r.agree and r.best.name == "decay before the step" and r.best.reproduces, r.report()


def _soap_presets(misconfigured=False):
    from crosscheck_helpers import presets
    return presets("pytorch_optimizer", misconfigured, family="soap")


@pytest.mark.parametrize("preset", _soap_presets(), ids=[p.name for p in _soap_presets()])
def test_pytorch_optimizer_soap_rows_agree(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_passes
    assert assert_passes(preset).params_rel <= 1e-12
    assert_passes(preset, problem="gpt")


@pytest.mark.parametrize("preset", _soap_presets(True), ids=[p.name for p in _soap_presets(True)])
def test_pytorch_optimizer_soap_wrong_rows_are_caught(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_caught
    assert_caught(preset)


@pytest.mark.parametrize("make", [lambda: SOAP(lr=0.01, precondition_frequency=1),
                                  lambda: refopt.Shampoo(lr=0.01)])
def test_scalars_and_empty_arrays_step(make):
    """A 0-d array takes Adam (SOAP) / SGD (Shampoo) without factors; an empty axis has an empty factor."""
    rule = make()
    p = {"a": np.zeros((0, 3)), "s": np.array(1.5), "m": np.ones((3, 2))}
    s = refopt.init(rule, p)
    for t in range(3):
        p, s = refopt.update(rule, s, p, {"a": np.zeros((0, 3)), "s": np.array(0.5), "m": np.full((3, 2), t + 1.0)})
    assert p["s"].shape == () and p["a"].shape == (0, 3) and np.isfinite(p["m"]).all() and p["s"] < 1.5


@pytest.mark.parametrize("make", [lambda: SOAP(lr=0.01), lambda: refopt.Shampoo(lr=0.01)])
def test_a_gradient_whose_factors_overflow_raises_before_writing(make):
    """|g| below the square bound of one entry, but its 4096 squares summed in a factor overflow float64: a
    FloatingPointError naming the leaf, and update_ leaves params and state as they were."""
    rule = make()
    p = {"w": np.ones((64, 64))}
    s = refopt.init(rule, p)
    before = [a.copy() for a in refopt.tree.flatten(s.leaves)[0]]
    with pytest.raises(FloatingPointError, match="gradient at w"):
        refopt.update_(rule, s, p, {"w": np.full((64, 64), 5e153)})
    assert np.all(p["w"] == 1.0)
    assert all(np.array_equal(a, b) for a, b in zip(refopt.tree.flatten(s.leaves)[0], before))
    p, _ = refopt.update_(rule, s, p, {"w": np.ones((64, 64))})      # the state is still usable
    assert np.isfinite(p["w"]).all()


@pytest.mark.parametrize("rule", ["SOAP(lr=0.01)", "Shampoo(lr=0.01)",
                                  "Partition(rules={'a': SOAP(), 'b': Adam()}, labels=at_least_2d_labels)"])
def test_float32_cross_checks_of_soap_and_shampoo_are_refused(rule):
    from refopt.crosscheck.plugin import check_impl
    with pytest.raises(ValueError, match="float64 only"):
        check_impl(NumpySOAP(), rule, framework="numpy", steps=3, problems=("stream",), dtype="float32")


def test_numpy_integers_and_bad_like_arguments():
    assert SOAP(precondition_frequency=np.int64(3), max_precond_dim=np.int32(8)).precondition_frequency == 3
    assert type(SOAP(precondition_frequency=np.int64(3)).precondition_frequency) is int
    for kw, match in [(dict(eps="x"), "eps"), (dict(correct_bias=0), "correct_bias"), (dict(lr="1e-3"), "lr"),
                      (dict(shampoo_beta=1.5), "shampoo_beta"), (dict(data_format="NCHW"), "data_format")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.SOAP", **kw)
    for kw, match in [(dict(momentum="0.5"), "momentum"), (dict(weight_decouple="yes"), "weight_decouple")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.Shampoo", **kw)

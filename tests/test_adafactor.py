"""Adafactor written from Shazeer & Stern (2018), Algorithms 4 and 5 (factored second moment R, C of a matrix,
V = R C / 1^T R, update clipping by RMS(U)/d, relative step max(eps2, RMS(x)) rho_t), in each peer's placement of
eps1 and of the step size. Negative controls: the other eps placement, no relative step, an unfactored V, a
permutation of the entries. Bad input, a mismatched factor, a checkpoint of the factored state."""
import numpy as np
import pytest

import refopt
from refopt.conventions import like
from tree_steps import run


def paper_matrix(x0, gs, *, lr, tau=-0.8, eps1=None, eps2=1e-3, d=1.0, wd=0.0, eps_add=False, relative=True,
                 factored=True, m_beta=None):
    """The paper's algorithm on one matrix X (n x m), rows i and columns j of refopt's array, in float64.
    eps_add: eps1 added to G^2 (the paper's, optax) or clamping 1^T R / n and V (torch); relative: rho_t =
    min(lr, 1/sqrt t) (the paper with lr = 1e-2, torch) or lr (optax)."""
    eps1 = np.finfo(np.float64).eps if eps1 is None else eps1
    x = x0.astype(np.float64).copy()
    n, m = x.shape
    R, C, V, M = np.zeros(n), np.zeros(m), np.zeros((n, m)), np.zeros((n, m))
    for t, g in enumerate(gs, start=1):
        b2 = 1.0 - t ** tau
        G2 = g * g + (eps1 if eps_add else 0.0)
        if factored:
            R = b2 * R + (1 - b2) * G2.sum(axis=1) / m        # the paper's sums, as means (1/m, 1/n)
            C = b2 * C + (1 - b2) * G2.sum(axis=0) / n
            denom = R.sum() / n if eps_add else max(R.sum() / n, eps1)
            Vt = np.outer(R, C) / denom
        else:
            V = b2 * V + (1 - b2) * G2
            Vt = V
        if not eps_add:
            Vt = np.maximum(Vt, eps1 ** 2)
        U = g / np.sqrt(Vt)
        U = U / max(1.0, np.sqrt(np.mean(U ** 2)) / d)
        scale = max(eps2, np.sqrt(np.mean(x ** 2)))
        rho = min(lr, 1 / np.sqrt(t)) if relative else lr
        if relative:                      # torch
            x = x * (1 - lr * wd) - scale * rho * U
        else:                             # optax
            u = scale * rho * U
            if m_beta is not None:
                M = m_beta * M + (1 - m_beta) * u
                u = M
            x = x - (u + wd * x)
    return x, R, C, V


@pytest.fixture
def stream():
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((4, 6))
    return x0, [rng.standard_normal((4, 6)) * (1 + 0.1 * t) for t in range(12)]


def _far(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_torch_form_from_the_paper(stream):
    x0, gs = stream
    rule = refopt.Adafactor(lr=0.3, beta2_decay=-0.7, eps2=1e-2, d=1.2, weight_decay=0.05)
    x, s = run(rule, x0, gs)
    want, R, C, _ = paper_matrix(x0, gs, lr=0.3, tau=-0.7, eps2=1e-2, d=1.2, wd=0.05)
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(s.leaves.v_row[:, 0], R, rtol=1e-13)     # keepdims (n, 1): the rows' factor
    np.testing.assert_allclose(s.leaves.v_col[0, :], C, rtol=1e-13)     # (1, m): the columns' factor
    assert s.leaves.v.size == 0
    # lr = 0.3 > 1/sqrt(t) from t = 12: the relative step shows; the other eps placement shows at g ~ 1e-8
    assert _far(paper_matrix(x0, gs, lr=0.3, tau=-0.7, eps2=1e-2, d=1.2, wd=0.05, relative=False)[0], want) > 1e-4
    assert _far(paper_matrix(x0, gs, lr=0.3, tau=-0.7, eps2=1e-2, d=1.2, wd=0.05, factored=False)[0], want) > 1e-3
    tiny = [1e-8 * g for g in gs]
    xt, _ = run(refopt.Adafactor(lr=0.01, d=None), x0, tiny)
    np.testing.assert_allclose(xt, paper_matrix(x0, tiny, lr=0.01, d=np.inf)[0], rtol=1e-12)
    assert _far(paper_matrix(x0, tiny, lr=0.01, d=np.inf, eps_add=True, eps1=1e-30)[0], xt) > 1e-4


def test_optax_form_from_the_paper(stream):
    x0, gs = stream
    rule = refopt.Adafactor(lr=0.02, beta2_decay=-0.8, eps1=1e-30, d=1.0, weight_decay=1e-3, beta1=0.9,
                            momentum_dtype="float64", min_dim_size_to_factor=4, form="optax")
    x, s = run(rule, x0, gs)
    want, R, C, _ = paper_matrix(x0, gs, lr=0.02, eps1=1e-30, wd=1e-3, eps_add=True, relative=False, m_beta=0.9)
    # optax evaluates beta2_t in float32: a relative 6e-8 in the moments, far below the controls below
    np.testing.assert_allclose(x, want, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(s.leaves.v_row, R, rtol=1e-6)   # (4, 6): optax's v_row reduces the largest axis
    np.testing.assert_allclose(s.leaves.v_col, C, rtol=1e-6)   # (the columns): the paper's R, shape (4,)
    assert s.leaves.v_row.shape == (4,) and s.leaves.v_col.shape == (6,)
    xt, st = run(rule, x0.T.copy(), [g.T.copy() for g in gs])  # (6, 4): now v_row is the columns' factor
    np.testing.assert_allclose(st.leaves.v_row, R, rtol=1e-6)
    np.testing.assert_allclose(xt, want.T, rtol=1e-7, atol=1e-9)
    assert _far(paper_matrix(x0, gs, lr=0.02, eps1=1e-30, wd=1e-3, eps_add=True, relative=False)[0], want) > 1e-3
    # the default min_dim_size_to_factor=128 of optax keeps this matrix unfactored
    x128, s128 = run(refopt.Adafactor(lr=0.02, eps1=1e-30, min_dim_size_to_factor=128, form="optax"), x0, gs)
    np.testing.assert_allclose(x128, paper_matrix(x0, gs, lr=0.02, eps1=1e-30, eps_add=True, relative=False,
                                                  factored=False)[0], rtol=1e-7, atol=1e-9)
    assert s128.leaves.v.shape == (4, 6) and s128.leaves.v_row.size == 0


def test_vectors_zero_d_and_filters():
    rng = np.random.default_rng(3)
    x0 = {"b": rng.standard_normal(5), "s": np.array(0.7), "k": rng.standard_normal((3, 2, 4, 5))}
    gs = [{k: rng.standard_normal(np.shape(v)) for k, v in x0.items()} for _ in range(4)]
    for form in ("torch", "optax"):
        rule = refopt.Adafactor(lr=0.01, form=form, eps1=1e-30 if form == "optax" else None)
        x, s = run(rule, x0, gs)
        assert s.leaves["b"].v.shape == (5,) and s.leaves["s"].v.shape == ()
        assert np.all(np.isfinite(x["k"])) and np.isfinite(x["s"])
        # a vector: V is the EMA of g^2 itself (no factors)
        want = paper_matrix(x0["b"][None, :], [g["b"][None, :] for g in gs], lr=0.01, factored=False,
                            eps_add=form == "optax", eps1=1e-30 if form == "optax" else None,
                            relative=form == "torch")[0][0]
        np.testing.assert_allclose(x["b"], want, rtol=1e-7)
    # torch factors the last two axes of its (out, in, kh, kw) layout: refopt's kernel axes 0, 1
    s = refopt.init(refopt.Adafactor(), x0)
    assert s.leaves["k"].v_row.shape == (1, 2, 4, 5) and s.leaves["k"].v_col.shape == (3, 1, 4, 5)
    s = refopt.init(refopt.Adafactor(form="optax", min_dim_size_to_factor=1), x0)     # the two largest: 5, 4
    assert s.leaves["k"].v_row.shape == (3, 2, 4) and s.leaves["k"].v_col.shape == (3, 2, 5)


def test_the_factored_step_is_not_permutation_equivariant(stream):
    x0, gs = stream
    p = np.random.default_rng(0).permutation(x0.size)
    perm = lambda a: a.reshape(-1)[p].reshape(a.shape)        # noqa: E731
    for rule, equivariant in ((refopt.Adafactor(lr=0.05), False), (refopt.Adafactor(lr=0.05, factored=False), True)):
        a, _ = run(rule, x0, gs)
        b, _ = run(rule, perm(x0), [perm(g) for g in gs])
        assert (_far(b, perm(a)) < 1e-13) == equivariant
    # rows and columns permuted separately: the factors commute with them
    pr, pc = np.random.default_rng(1).permutation(4), np.random.default_rng(2).permutation(6)
    a, _ = run(refopt.Adafactor(lr=0.05), x0, gs)
    b, _ = run(refopt.Adafactor(lr=0.05), x0[pr][:, pc], [g[pr][:, pc] for g in gs])
    assert _far(b, a[pr][:, pc]) < 1e-13


def test_like_maps_each_peers_arguments():
    assert like("torch.optim.Adafactor") == refopt.Adafactor()
    assert like("torch.optim.Adafactor", lr=0.1, eps=(1e-20, 1e-2), d=2.0) == \
        refopt.Adafactor(lr=0.1, eps1=1e-20, eps2=1e-2, d=2.0)
    assert like("optax.adafactor") == refopt.Adafactor(lr=1.0, eps1=1e-30, min_dim_size_to_factor=128, form="optax")
    assert like("optax.adafactor", learning_rate=0.1, momentum=0.9) == refopt.Adafactor(
        lr=0.1, eps1=1e-30, min_dim_size_to_factor=128, beta1=0.9, momentum_dtype="float32", form="optax")
    assert like("optax.adafactor", learning_rate=0.1, momentum=0.9, dtype_momentum=np.float64).momentum_dtype == \
        "float64"
    for peer, kw, word in (("torch.optim.Adafactor", dict(maximize=True), "maximize"),
                           ("torch.optim.Adafactor", dict(d=0.5), "d"),
                           ("optax.adafactor", dict(learning_rate=lambda c: 0.1), "learning_rate"),
                           ("optax.adafactor", dict(weight_decay_rate=lambda c: 0.1), "weight_decay_rate"),
                           ("optax.adafactor", dict(weight_decay_mask={"w": True}), "weight_decay_mask"),
                           ("optax.adafactor", dict(momentum=0.9, dtype_momentum="bfloat16"), "dtype_momentum")):
        with pytest.raises(ValueError, match=word):
            like(peer, **kw)


def test_bad_input_and_a_mismatched_factor():
    for bad in (dict(lr=-1.0), dict(beta2_decay=0.5), dict(eps1=0.0), dict(eps2=-1.0), dict(d=0.0),
                dict(weight_decay=-0.1), dict(factored=1), dict(multiply_by_parameter_scale=None),
                dict(min_dim_size_to_factor=-1), dict(min_dim_size_to_factor=2.0), dict(decay_offset=1.5),
                dict(beta1=0.9), dict(beta1=1.0, form="optax"), dict(momentum_dtype="float32", form="optax"),
                dict(beta1=0.5, momentum_dtype="bfloat16", form="optax"), dict(form="paper"),
                dict(schedule=3)):
        with pytest.raises(ValueError):
            refopt.Adafactor(**bad)
    rule = refopt.Adafactor(decay_offset=2)         # t - offset < 1 at the first step: refused, never NaN
    x = {"w": np.ones((2, 3))}
    with pytest.raises(ValueError, match="decay_offset"):
        refopt.update(rule, refopt.init(rule, x), x, {"w": np.ones((2, 3))})
    rule = refopt.Adafactor()
    s = refopt.init(rule, x)
    bad = s._replace(leaves={"w": s.leaves["w"]._replace(v_row=np.zeros((1, 3)))})   # the wrong axis kept
    with pytest.raises(ValueError, match="w"):
        refopt.update(rule, bad, x, {"w": np.ones((2, 3))})


@pytest.mark.parametrize("rule", [refopt.Adafactor(lr=0.05),
                                  refopt.Adafactor(lr=0.05, beta1=0.9, momentum_dtype="float32",
                                                   min_dim_size_to_factor=2, form="optax")])
def test_checkpoint_of_the_factored_state_resumes_bit_for_bit(tmp_path, rule):
    rng = np.random.default_rng(5)
    x = {"w": rng.standard_normal((3, 5)), "b": rng.standard_normal(5)}
    s = refopt.init(rule, x)
    for _ in range(3):
        x, s = refopt.update(rule, s, x, {k: rng.standard_normal(v.shape) for k, v in x.items()})
    path = str(tmp_path / "ck.npz")
    refopt.save(path, x, s, rule)
    ck = refopt.load(path)
    assert ck.rule == rule and ck.state.t == s.t
    for k in ("v_row", "v_col", "v", "m"):
        np.testing.assert_array_equal(getattr(ck.state.leaves["w"], k), getattr(s.leaves["w"], k))
        assert getattr(ck.state.leaves["w"], k).dtype == getattr(s.leaves["w"], k).dtype
    g = {k: rng.standard_normal(v.shape) for k, v in x.items()}
    a, _ = refopt.update(rule, s, x, g)
    b, _ = refopt.update(ck.rule, ck.state, ck.params, g)
    for k in x:
        np.testing.assert_array_equal(a[k], b[k])


def test_float32_stays_float32_and_float32_momentum_in_float64():
    x = {"w": np.ones((3, 4), np.float32)}
    for rule in (refopt.Adafactor(), refopt.Adafactor(form="optax", eps1=1e-30, min_dim_size_to_factor=1)):
        y, s = refopt.update(rule, refopt.init(rule, x), x, {"w": np.full((3, 4), 0.5, np.float32)})
        assert y["w"].dtype == np.float32 and s.leaves["w"].v_row.dtype == np.float32
    rule = refopt.Adafactor(form="optax", beta1=0.9, momentum_dtype="float32")
    s = refopt.init(rule, {"w": np.ones(3)})
    assert s.leaves["w"].m.dtype == np.float32


@pytest.mark.parametrize("peer", ["torch", "optax"])
def test_filters_three_d_and_zero_d_leaves_reproduce_the_peer(peer):
    """Beyond the problems' matrices and vectors: a (kh, kw, in, out) filter (torch factors its kernel axes in
    its (out, in, kh, kw) layout, optax the two largest axes), a 3-D array and a 0-d one, with the state."""
    pytest.importorskip("torch" if peer == "torch" else "optax")
    from refopt.crosscheck.run import figures, refopt_trajectory, trajectory
    from refopt.testing.adapters import OptaxAdapter, TorchAdapter

    rng = np.random.default_rng(0)
    leaves = [rng.standard_normal((3, 2, 4, 5)), rng.standard_normal((2, 6, 3)), np.array(0.5), rng.standard_normal(4)]
    gs = [[rng.standard_normal(np.shape(a)) for a in leaves] for _ in range(10)]
    if peer == "torch":
        import torch
        rule, adapter = like("torch.optim.Adafactor"), TorchAdapter(torch.optim.Adafactor, {})
        state = {"v_row": "col_var", "v_col": "row_var"}
    else:
        import optax
        kw = dict(learning_rate=0.01, min_dim_size_to_factor=1)
        rule, adapter = like("optax.adafactor", **kw), OptaxAdapter(optax.adafactor, kw)
        state = {"v_row": "v_row", "v_col": "v_col", "v": "v"}
    ref, _ = refopt_trajectory(rule, leaves, gs, 10, tuple(state))
    other, _ = trajectory(adapter, leaves, gs, state=state)
    f = figures(ref, other, leaves)
    assert f.max("params_rel") <= 1e-12
    assert set(f.state_rel) == set(state) and max(float(v.max()) for v in f.state_rel.values()) <= 1e-12

"""autograd-lite: every primitive against central finite differences (dot-product test, float64), the
PITFALLS.md cases B18, B19, B21, dtype rules, deep graphs and error messages."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import refopt.autograd as ag
from refopt.autograd import Node, check_grads, check_grads_per_leaf, grad, value_and_grad
from autograd_references import (causal_softmax_reference, causal_softmax_vjp_reference, rms_norm_reference,
                                 rms_norm_vjp_reference, swiglu_reference, swiglu_vjp_reference)

RTOL = 1e-6


def _rng(seed=0):
    return np.random.default_rng(seed)


def contract(op, seed=1):
    """Scalar test function sum(u * op(**params)) with a fixed random cotangent u."""
    cache = {}

    def f(p):
        y = op(**p)
        if "u" not in cache:
            cache["u"] = _rng(seed).standard_normal(np.shape(ag.value(y)))
        return ag.sum(y * cache["u"])

    return f


def assert_vjp(op, params, seed=0):
    err = check_grads(contract(op, seed + 1), params, seed=seed)
    assert err <= RTOL
    return err


# ---- binary ops with broadcasting ------------------------------------------------------------------
@settings(max_examples=25, deadline=None, derandomize=True)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
       op=st.sampled_from(["add", "sub", "mul", "div"]), seed=st.integers(0, 2**16))
def test_binary_ops_broadcast_fd(shapes, op, seed):
    sa, sb = shapes.input_shapes
    r = _rng(seed)
    a = np.asarray(r.standard_normal(sa))
    b = np.asarray(r.uniform(0.5, 2.0, sb) * r.choice([-1, 1], sb))  # away from 0 for div
    fn = getattr(ag, op)
    assert_vjp(lambda a, b: fn(a, b), {"a": a, "b": b}, seed)
    _, g = value_and_grad(contract(lambda a, b: fn(a, b)))({"a": a, "b": b})
    assert g["a"].shape == np.shape(a) and g["b"].shape == np.shape(b)


def test_operators_match_functions_and_constants():
    r = _rng(3)
    a, b = r.standard_normal((2, 3)), r.uniform(1, 2, (3,))
    f = lambda p: ag.sum((2.0 * p["a"] - p["b"] / 3.0 + 1.0 - p["a"] * p["b"] + 1.0 / p["b"] - (-p["a"])) ** 2)
    assert_vjp(lambda a, b: (2.0 * a - b / 3.0 + 1.0 - a * b + 1.0 / b - (-a)) ** 2, {"a": a, "b": b})
    v, _ = value_and_grad(f)({"a": a, "b": b})
    expect = np.sum((2.0 * a - b / 3.0 + 1.0 - a * b + 1.0 / b + a) ** 2)
    assert np.isclose(v, expect, rtol=1e-14)


def test_b19_broadcast_bias_grad_exact():
    X = np.arange(12).reshape(3, 4) / 10
    b = np.array([0.5, -1.0, 0.25, 2.0])
    g = grad(lambda p: 0.5 * ag.sum((X + p["b"]) ** 2))({"b": b})["b"]
    assert g.shape == (4,)
    np.testing.assert_allclose(g, [2.7, -1.5, 2.55, 8.1], rtol=1e-14)
    # a (B,1,T,1) mask-like operand is reduced with keepdims over the broadcast axes
    m = _rng(1).standard_normal((2, 1, 3, 1))
    x = _rng(2).standard_normal((2, 4, 3, 5))
    gm = grad(lambda p: ag.sum(p["m"] * x))({"m": m})["m"]
    assert gm.shape == (2, 1, 3, 1)
    np.testing.assert_allclose(gm, x.sum(axis=(1, 3), keepdims=True), rtol=1e-13)


# ---- matmul ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,)), ((1, 3, 4), (2, 4, 2)),
                                   ((3, 4), (2, 4, 5)), ((2, 2, 3, 4), (2, 1, 4, 3))])
def test_matmul_fd(sa, sb):
    r = _rng(len(sa) * 10 + len(sb))
    assert_vjp(lambda a, b: a @ b, {"a": r.standard_normal(sa), "b": r.standard_normal(sb)})


def test_matmul_with_constant_operand():
    r = _rng(4)
    x = r.standard_normal((5, 3))
    w = r.standard_normal((3, 2))
    g = grad(lambda p: ag.sum(x @ p["w"]))({"w": w})["w"]
    np.testing.assert_allclose(g, x.sum(0)[:, None] * np.ones((1, 2)), rtol=1e-14)
    g2 = grad(lambda p: ag.sum(p["w"].T @ x.T))({"w": w})["w"]
    np.testing.assert_allclose(g2, g, rtol=1e-14)


# ---- reductions and shapes ---------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("red", ["sum", "mean"])
def test_reductions_fd(axis, keepdims, red):
    x = _rng(5).standard_normal((2, 3, 4))
    fn = getattr(ag, red)
    assert_vjp(lambda x: fn(x, axis=axis, keepdims=keepdims), {"x": x})
    # the exact gradient of mean is 1/n per element
    if red == "mean" and axis is None:
        np.testing.assert_array_equal(grad(lambda p: ag.mean(p["x"]))({"x": x})["x"], np.full(x.shape, 1 / 24))


def test_reshape_transpose_methods_fd():
    x = _rng(6).standard_normal((2, 3, 4))
    assert_vjp(lambda x: x.reshape(4, 6).T.reshape(6, 2, 2).transpose(1, 0, 2).sum(axis=1, keepdims=True), {"x": x})
    assert_vjp(lambda x: ag.transpose(x, (2, 0, 1)) * ag.reshape(x, (4, 2, 3)), {"x": x})
    assert_vjp(lambda x: x.mean(axis=-1), {"x": x})


# ---- indexing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("idx", [np.s_[1:, ::2], np.s_[0], np.s_[..., 1], np.s_[:, None, 2],
                                 np.array([1, 1, 2, 1]), (np.array([0, 0, 2]), np.array([1, 1, 3])),
                                 np.array([[2, 2], [0, 2]])])
def test_getitem_fd(idx):
    x = _rng(7).standard_normal((3, 4))
    assert_vjp(lambda x: x[idx], {"x": x})


def test_getitem_repeated_indices_accumulate():
    x = np.arange(4.0)
    g = grad(lambda p: ag.sum(p["x"][np.array([1, 1, 2, 1])]))({"x": x})["x"]
    np.testing.assert_array_equal(g, [0.0, 3.0, 1.0, 0.0])
    mask = np.array([True, False, True, True])
    g = grad(lambda p: ag.sum(p["x"][mask] * 2.0))({"x": x})["x"]
    np.testing.assert_array_equal(g, [2.0, 0.0, 2.0, 2.0])


def test_embedding_repeated_ids_fd_and_exact():
    r = _rng(8)
    E = r.standard_normal((5, 3))
    ids = np.array([[1, 1, 2], [1, 4, 4]])
    assert_vjp(lambda E: ag.embedding(E, ids), {"E": E})
    g = grad(lambda p: ag.sum(ag.embedding(p["E"], ids)))({"E": E})["E"]
    np.testing.assert_array_equal(g, np.array([0, 3, 1, 0, 2])[:, None] * np.ones((1, 3)))
    with pytest.raises(ValueError, match="ids must lie"):
        ag.embedding(E, np.array([5]))


# ---- pointwise ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "tanh", "sigmoid", "relu", "silu", "gelu"])
def test_pointwise_fd(name):
    r = _rng(9)
    x = r.standard_normal((3, 5)) * 2
    if name in ("log", "sqrt"):
        x = np.abs(x) + 0.1
    if name == "relu":
        x = np.where(np.abs(x) < 0.05, 0.5, x)  # keep away from the kink
    assert_vjp(lambda x: getattr(ag, name)(x), {"x": x})


def test_pointwise_values():
    from scipy.stats import norm
    x = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(ag.gelu(x), x * norm.cdf(x), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(ag.silu(x), x / (1 + np.exp(-x)), rtol=1e-14)
    np.testing.assert_array_equal(grad(lambda p: ag.sum(ag.relu(p["x"])))({"x": np.array([-1.0, 0.0, 2.0])})["x"],
                                  [0.0, 0.0, 1.0])  # relu'(0) = 0


def test_power_fd():
    x = np.abs(_rng(10).standard_normal(6)) + 0.5
    assert_vjp(lambda x: x ** 3 + x ** 0.5 + x ** -1.5, {"x": x})


# ---- fused softmax family -----------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_log_softmax_fd(axis):
    z = _rng(11).standard_normal((3, 4, 5)) * 3
    assert_vjp(lambda z: ag.softmax(z, axis=axis), {"z": z})
    assert_vjp(lambda z: ag.log_softmax(z, axis=axis), {"z": z})
    np.testing.assert_allclose(np.exp(ag.log_softmax(z, axis)), ag.softmax(z, axis), rtol=1e-14)


@pytest.mark.parametrize("ignore", [None, -1, 2])
def test_cross_entropy_fd_and_value(ignore):
    r = _rng(12)
    z = r.standard_normal((2, 5, 4)) * 2
    t = r.integers(0, 4, (2, 5))
    t[0, 0] = 2
    if ignore == -1:
        t[1, :2] = -1
    assert check_grads(lambda p: ag.cross_entropy(p["z"], t, ignore_index=ignore), {"z": z}) <= RTOL
    keep = np.ones(t.shape, bool) if ignore is None else t != ignore
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expect = -np.mean(np.take_along_axis(logp, np.where(keep, t, 0)[..., None], -1)[..., 0][keep])
    np.testing.assert_allclose(ag.cross_entropy(z, t, ignore_index=ignore), expect, rtol=1e-13)


def test_cross_entropy_errors():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"lie in \[0, 4\)"):
        ag.cross_entropy(z, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="integers"):
        ag.cross_entropy(z, np.array([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        ag.cross_entropy(z, np.array([0, 1]))
    with pytest.raises(ValueError, match="ignore_index"):
        ag.cross_entropy(z, np.array([-1, -1, -1]), ignore_index=-1)


def test_b21_huge_logits():
    z32 = np.array([[1e8, 1e8]], np.float32)
    loss = ag.cross_entropy(z32, np.array([1]))
    assert loss.dtype == np.float32 and loss == np.float32(0.6931472)
    v, g = value_and_grad(lambda p: ag.cross_entropy(p, np.array([1])))(z32)
    assert g.dtype == np.float32 and v == np.float32(np.log(2))
    z = np.array([[-431.0, 279.0, 427.0]])
    v, g = value_and_grad(lambda p: ag.cross_entropy(p, np.array([0])))(z)
    assert v == 858.0
    np.testing.assert_allclose(g[0], [-1.0, 5.301718666092324e-65, 1.0], rtol=1e-13, atol=0)
    s = ag.softmax(np.array([-1047.0, -981.0, 1891.0]))
    np.testing.assert_array_equal(s, [0.0, 0.0, 1.0])
    assert np.all(np.isfinite(ag.log_softmax(np.array([-1047.0, -981.0, 1891.0]))))


def test_softmax_fully_masked_row_is_not_nan():
    """Row 0 is fully masked: softmax gives zeros (PyTorch _safe_softmax convention), log_softmax -inf,
    the VJP through such a row is zero, and no RuntimeWarning (0/0, log 0, inf - inf) is emitted."""
    z = np.array([[-np.inf, -np.inf], [0.0, -np.inf], [1.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ag.softmax(z)
        ly = ag.log_softmax(z)
        u = np.array([[3.0, -2.0], [0.5, 1.5], [1.0, 2.0]])
        _, g = value_and_grad(lambda p: ag.sum(ag.softmax(p) * u))(z)
        y32 = ag.softmax(z.astype(np.float32))
    np.testing.assert_array_equal(y, [[0.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    np.testing.assert_array_equal(ly[0], [-np.inf, -np.inf])
    np.testing.assert_array_equal(ly[1], [0.0, -np.inf])
    np.testing.assert_allclose(ly[2], [-np.log(2.0)] * 2, rtol=1e-15)
    # dy/dz = diag(y) - y y^T (oracle): zero on the masked row and the one-hot row, +-0.25 * (u0 - u1) else
    np.testing.assert_array_equal(g[:2], np.zeros((2, 2)))
    np.testing.assert_allclose(g[2], [0.25 * (1.0 - 2.0), 0.25 * (2.0 - 1.0)], rtol=1e-15)
    assert y32.dtype == np.float32 and np.array_equal(y32, y.astype(np.float32))


def test_softmax_unmasked_path_unchanged():
    """The guard must not alter ordinary rows: compare with a plain-numpy oracle."""
    z = _rng(5).standard_normal((4, 6)) * 10
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(ag.softmax(z), e / e.sum(-1, keepdims=True), rtol=1e-15, atol=0)
    np.testing.assert_allclose(ag.log_softmax(z), (z - z.max(-1, keepdims=True)) - np.log(e.sum(-1, keepdims=True)),
                               rtol=1e-14, atol=0)


# ---- rms_norm, attention --------------------------------------------------------------------------------
@pytest.mark.parametrize("with_gain", [True, False])
@pytest.mark.parametrize("eps", [1e-6, 0.0, 0.3])
def test_rms_norm_fd_and_value(with_gain, eps):
    r = _rng(13)
    x = r.standard_normal((2, 3, 5))
    p = {"x": x, "g": r.uniform(0.5, 1.5, 5)} if with_gain else {"x": x}
    assert_vjp(lambda x, g=None: ag.rms_norm(x, g, eps=eps), p)
    y = ag.rms_norm(x, p.get("g"), eps=eps)
    expect = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * p.get("g", 1.0)
    np.testing.assert_allclose(y, expect, rtol=1e-14)
    with pytest.raises(ValueError, match="gain shape"):
        ag.rms_norm(x, np.ones(4))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_fd(causal):
    r = _rng(14)
    q, k, v = (r.standard_normal((2, 3, 4, 5)) for _ in range(3))
    assert_vjp(lambda q, k, v: ag.attention(q, k, v, causal=causal), {"q": q, "k": k, "v": v})


def test_attention_equals_composed_reference():
    r = _rng(15)
    q, k, v = (r.standard_normal((2, 2, 5, 3)) for _ in range(3))
    S = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    S = np.where(np.triu(np.ones((5, 5), bool), 1), -np.inf, S)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    np.testing.assert_allclose(ag.attention(q, k, v), P @ v, rtol=1e-13)


def test_b24_mask_by_selection_exact():
    """T=2, S = [[-2e4, 0], [-2e4, -2e4+1]] given directly as q k^T with scale 1, V = I."""
    q = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])               # (1,1,2,2)
    k = np.array([[[[-2e4, -2e4], [0.0, -2e4 + 1]]]])         # k^T columns give S
    v = np.eye(2)[None, None]
    out = ag.attention(q, k, v, scale=1.0)
    np.testing.assert_array_equal(out[0, 0, 0], [1.0, 0.0])    # a -1e4 fill would give [0, 1]
    np.testing.assert_allclose(out[0, 0, 1], [0.2689414213699951, 0.7310585786300049], rtol=1e-15)
    g = grad(lambda p: ag.sum(ag.attention(p["q"], p["k"], p["v"], scale=1.0)[..., 0, :]))(
        {"q": q, "k": k, "v": v})
    assert np.all(g["k"][..., 1, :] == 0) and np.all(g["v"][..., 1, :] == 0)


# ---- tape: B18, idempotence, aliasing, depth -------------------------------------------------------------
def test_b18_diamond_and_idempotent():
    def f(p):
        a, b = p["a"], p["b"]
        c = a + b
        d = a * b
        e = c + d
        return e + c * d

    p = {"a": np.array(2.0), "b": np.array(3.0)}
    vg = value_and_grad(f)
    for _ in range(3):
        v, g = vg(p)
        assert v == 41.0 and g["a"] == 25.0 and g["b"] == 19.0
    h = grad(lambda p: (p["a"] + p["b"]) * p["d"])
    for _ in range(3):
        g = h({"a": np.array(3.0), "b": np.array(2.0), "d": np.array(1.0)})
        assert (g["a"], g["b"], g["d"]) == (1.0, 1.0, 5.0)


def test_fanout_grads_do_not_alias():
    p = {"a": np.ones(3), "b": np.ones(3)}
    g = grad(lambda p: ag.sum(p["a"] + p["b"]))(p)
    assert not np.shares_memory(g["a"], g["b"])
    g["a"] += 1
    np.testing.assert_array_equal(g["b"], np.ones(3))
    # a value consumed several times: x used by add (cotangent passed through) and by mul
    x = np.array([1.0, 2.0])
    g = grad(lambda p: ag.sum((p + p) * p + p))(x)
    np.testing.assert_array_equal(g, 4 * x + 1)


def test_deep_chain_5000_iterative():
    def f(x):
        for _ in range(5000):
            x = x * 1.0001 + 0.0
        return ag.sum(x)

    g = grad(f)(np.ones(2))
    np.testing.assert_allclose(g, 1.0001 ** 5000, rtol=1e-12)


# ---- dtypes ----------------------------------------------------------------------------------------------
def test_float32_stays_float32():
    r = _rng(16)
    p = {"w": r.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
    x = r.standard_normal((5, 4))  # float64 data
    t = np.array([0, 1, 2, 1, 0])

    def f(p):
        h = ag.gelu(x @ p["w"] + p["b"]) * np.float64(0.5) + 1.5
        h = ag.rms_norm(h, None) / 2.0 - np.array(0.1)
        return ag.cross_entropy(ag.tanh(h) * 3.0, t)

    v, g = value_and_grad(f)(p)
    assert np.asarray(v).dtype == np.float32
    assert g["w"].dtype == np.float32 and g["b"].dtype == np.float32


def test_mixed_precision_leaves_get_their_own_dtype():
    p = {"a": np.ones(2, np.float32), "b": np.ones(2, np.float64)}
    g = grad(lambda p: ag.sum(p["a"] * p["b"]))(p)
    assert g["a"].dtype == np.float32 and g["b"].dtype == np.float64


# ---- API and errors --------------------------------------------------------------------------------------
def test_unused_leaf_gets_zeros_and_structure_kept():
    p = {"layers": [{"w": np.ones((2, 2))}, {"w": np.ones(3)}], "t": (np.ones(1),)}
    g = grad(lambda p: ag.sum(p["layers"][0]["w"] * 2.0))(p)
    assert isinstance(g["layers"], list) and isinstance(g["t"], tuple)
    np.testing.assert_array_equal(g["layers"][0]["w"], np.full((2, 2), 2.0))
    np.testing.assert_array_equal(g["layers"][1]["w"], np.zeros(3))


def test_errors():
    with pytest.raises(ValueError, match="scalar"):
        value_and_grad(lambda p: p * 2.0)(np.ones(3))
    with pytest.raises(TypeError, match="layers\\[0\\].w"):
        grad(lambda p: ag.sum(p["layers"][0]["w"]))({"layers": [{"w": np.ones(2, int)}]})
    with pytest.raises(TypeError, match="truth value"):
        grad(lambda p: ag.sum(p) if p else 0.0)(np.ones(2))


@pytest.mark.parametrize("out, exc", [(None, TypeError), ("abc", TypeError), ([1.0], TypeError),
                                      ((1.0,), TypeError), ({"loss": 1.0}, TypeError), (True, TypeError),
                                      (np.array(["a"]), TypeError), (np.ones(2), ValueError)])
def test_non_scalar_output_raises(out, exc):
    p = {"w": np.ones(3)}
    with pytest.raises(exc, match="f must return a scalar"):
        value_and_grad(lambda p: out)(p)
    with pytest.raises(exc, match="f must return a scalar"):
        grad(lambda p: out)(p)


def test_non_scalar_node_output_raises():
    with pytest.raises(ValueError, match=r"f must return a scalar.*shape \(2, 3\)"):
        value_and_grad(lambda p: p["w"] * 2.0)({"w": np.ones((2, 3))})


@pytest.mark.parametrize("f", [
    lambda p: float(np.sum(p["w"].value ** 2)),            # python float from .value
    lambda p: np.sum(p["w"].value ** 2),                   # numpy scalar from .value
    lambda p: np.array([np.sum(p["w"].value)]),            # size-1 ndarray
    lambda p: 3,                                           # constant int
])
def test_detached_output_raises(f):
    with pytest.raises(ValueError, match="does not depend on params.*\\.value or numpy"):
        value_and_grad(f)({"w": np.arange(3.0), "b": np.ones(2)})


def test_size1_node_output_and_partially_unused_params():
    """A (1, 1) node is a scalar; a leaf that does not reach the output gets exact zeros (kept)."""
    w = np.array([1.0, -2.0, 3.0])
    v, g = value_and_grad(lambda p: ag.reshape(ag.sum(p["w"] ** 2), (1, 1)))({"w": w, "unused": np.ones(2)})
    assert v == 14.0 and np.ndim(v) == 0
    np.testing.assert_array_equal(g["w"], 2 * w)
    np.testing.assert_array_equal(g["unused"], np.zeros(2))


def test_plain_arrays_match_traced_values():
    r = _rng(17)
    x, w = r.standard_normal((3, 4)), r.standard_normal((4, 2))
    f = lambda p: ag.sum(ag.log_softmax(ag.tanh(p["x"] @ p["w"]), axis=0) ** 2)
    plain = f({"x": x, "w": w})
    assert isinstance(plain, np.ndarray) or np.isscalar(plain)
    v, _ = value_and_grad(f)({"x": x, "w": w})
    assert v == plain


def test_check_grads_catches_a_wrong_vjp():
    def bad_square(x):  # VJP off by a factor 1.01
        if not isinstance(x, Node):
            return x ** 2
        return Node(x.value ** 2, (x,), lambda g: (g * 2.02 * x.value,))

    p = {"layers": [{"w": np.array([0.3, -1.2])}], "ok": np.array([1.0, 2.0])}
    f = lambda p: ag.sum(bad_square(p["layers"][0]["w"])) + ag.sum(p["ok"] ** 2)
    with pytest.raises(AssertionError, match=r"layers\[0\]\.w"):
        check_grads(f, p)
    errs = check_grads_per_leaf(f, p, rtol=np.inf)
    assert errs["ok"] < 1e-8 and errs["layers[0].w"] > 1e-3


# ---- fused kernels (numba) against their NumPy references, float32 and float64 -----------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_match_references(dtype):
    from refopt.fast import autograd_kernels as K
    r = _rng(20)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    S = (r.standard_normal((3, 2, 6, 6)) * 4).astype(dtype)
    P = K.causal_softmax_(S.copy(), 0.3)
    assert P.dtype == dtype
    np.testing.assert_allclose(P, causal_softmax_reference(S, 0.3), rtol=tol, atol=tol)
    assert np.all(P[..., np.triu(np.ones((6, 6), bool), 1)] == 0)
    dP = r.standard_normal(S.shape).astype(dtype)
    dS = K.causal_softmax_vjp_(P, dP.copy(), 0.3)
    np.testing.assert_allclose(dS, causal_softmax_vjp_reference(P, dP, 0.3), rtol=tol, atol=tol)
    x, gn = r.standard_normal((2, 3, 8)).astype(dtype), r.uniform(0.5, 1.5, 8).astype(dtype)
    out, ref = K.rms_norm(x, gn, 1e-6), rms_norm_reference(x, gn, 1e-6)
    for a_, b_ in zip(out, ref):
        np.testing.assert_allclose(a_, b_, rtol=tol, atol=tol)
    assert out[0].dtype == dtype
    gx = r.standard_normal(x.shape).astype(dtype)
    dx = K.rms_norm_vjp(gx, gn, out[1], out[2])
    assert dx.dtype == dtype
    np.testing.assert_allclose(dx, rms_norm_vjp_reference(gx, gn, ref[1], ref[2]), rtol=tol, atol=tol)
    a = np.concatenate([r.standard_normal(20) * 3, [-1e4, -100.0, 0.0, 100.0, 1e4]]).astype(dtype)
    u = r.standard_normal(a.shape).astype(dtype)
    h, s = K.swiglu(a, u)
    hr, sr = swiglu_reference(a, u)
    assert h.dtype == dtype and np.all(np.isfinite(h))
    np.testing.assert_allclose(h, hr, rtol=tol * 10, atol=tol)
    g = r.standard_normal(a.shape).astype(dtype)
    for x, y in zip(K.swiglu_vjp(g, a, u, s), swiglu_vjp_reference(g, a, u, sr)):
        assert x.dtype == dtype
        np.testing.assert_allclose(x, y, rtol=tol * 10, atol=tol)


def test_swiglu_fd_and_value():
    r = _rng(21)
    a, u = r.standard_normal((3, 4)) * 2, r.standard_normal((3, 4))
    assert_vjp(lambda a, u: ag.swiglu(a, u), {"a": a, "u": u})
    np.testing.assert_allclose(ag.swiglu(a, u), ag.silu(a) * u, rtol=1e-14)
    with pytest.raises(ValueError, match="same shape"):
        ag.swiglu(a, u[:, :2])

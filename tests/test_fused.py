"""The GPT's fused path (packed GEMMs, numba kernels) against the unfused reference composition of
elementary primitives (``gpt.loss(..., fused=False)``): losses and every leaf's gradient on every
configuration, float64 within 1e-12 and float32 within 1e-5 (relative to the leaf's largest entry);
the fused primitives against finite differences; results independent of the numba thread count;
negative controls (a wrong VJP the comparison must catch); inputs never mutated; error messages."""
import itertools

import numpy as np
import pytest

import refopt
import refopt.autograd as ag
from refopt.models import gpt
from refopt.autograd import check_grads, value_and_grad
from refopt.fast import autograd_kernels

TOL = {np.float64: 1e-12, np.float32: 1e-5}


def tiny(**kw):
    base = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=12, init_std=0.3)
    base.update(kw)
    return gpt.GPTConfig(**base)


def params_for(cfg, dtype, seed=0):
    """init, then gains drawn in [0.5, 1.5] so that their gradients are tested away from 1."""
    p = gpt.init(cfg, seed, dtype)
    r = np.random.default_rng(seed + 100)
    leaves, _, td = refopt.tree.flatten(p)
    return refopt.tree.unflatten(td, [r.uniform(0.5, 1.5, x.shape).astype(dtype) if x.ndim == 1 else x
                                      for x in leaves])


def batch(cfg, B=3, T=None, seed=1):
    r = np.random.default_rng(seed)
    T = cfg.block_size if T is None else T
    return r.integers(0, cfg.vocab_size, (B, T)), r.integers(0, cfg.vocab_size, (B, T))


def fused_vs_reference(cfg, dtype, ignore_index=None, T=None):
    """(relative loss difference, {leaf path: max|g_fused - g_ref| / max|g_ref|}) of one batch."""
    p = params_for(cfg, dtype)
    x, y = batch(cfg, T=T)
    if ignore_index is not None:
        y[0, :2] = ignore_index
    vf, gf = value_and_grad(lambda p: gpt.loss(p, x, y, cfg, ignore_index, fused=True))(p)
    vr, gr = value_and_grad(lambda p: gpt.loss(p, x, y, cfg, ignore_index, fused=False))(p)
    assert np.asarray(vf).dtype == dtype and np.asarray(vr).dtype == dtype
    lf, paths, _ = refopt.tree.flatten(gf)
    lr = refopt.tree.leaves(gr)
    errs = {}
    for path, a, b in zip(paths, lf, lr):
        assert a.dtype == dtype and a.shape == b.shape
        errs[path] = float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))
    return abs(float(vf) - float(vr)) / abs(float(vr)), errs


CASES = [dict(ffn=f, tie_head=t, qk_norm=q)
         for f, t, q in itertools.product(gpt.FFN_KINDS, (True, False), (False, True))]
CASES += [dict(qk_norm=True, qk_norm_gain=False), dict(init="mup", ffn="reglu", qk_norm=True)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_fused_matches_reference_every_config(kw, dtype):
    dloss, errs = fused_vs_reference(tiny(**kw), dtype)
    assert dloss <= TOL[dtype]
    assert len(errs) == len(refopt.tree.leaves(gpt.init(tiny(**kw))))
    worst = max(errs, key=errs.get)
    assert errs[worst] <= TOL[dtype], (worst, errs[worst])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_fused_matches_reference_short_sequence_and_ignore_index(dtype):
    dloss, errs = fused_vs_reference(tiny(qk_norm=True, tie_head=False), dtype, ignore_index=-1, T=5)
    assert dloss <= TOL[dtype] and max(errs.values()) <= TOL[dtype]


def test_fused_matches_reference_default_width():
    """The default model's shapes (C = 128, 4 heads, F = 352, T = 64) on a short float64 run."""
    cfg = gpt.GPTConfig(vocab_size=23, n_layer=1, qk_norm=True)
    dloss, errs = fused_vs_reference(cfg, np.float64)
    assert dloss <= 1e-12 and max(errs.values()) <= 1e-12


# ---- negative controls: a deliberately wrong fused VJP must fail the comparison ------------------------
def test_negative_control_wrong_swiglu_vjp(monkeypatch):
    def wrong(g, z, sig, dz, one):  # drops the a (1 - sigma(a)) term of silu'
        F = g.shape[1]
        dz[:, :F] = g * z[:, F:] * sig
        dz[:, F:] = g * z[:, :F] * sig

    monkeypatch.setattr(autograd_kernels, "_swiglu_bwd", wrong)
    _, errs = fused_vs_reference(tiny(), np.float64)
    assert max(errs.values()) > 1e-3


def test_negative_control_wrong_softmax_vjp(monkeypatch):
    def wrong(P, dP, scale):  # forgets to subtract <dP, P>
        dP *= scale * P
        return dP

    monkeypatch.setattr(autograd_kernels, "causal_softmax_vjp_par_", wrong)
    _, errs = fused_vs_reference(tiny(), np.float64)
    assert max(errs.values()) > 1e-3


# ---- fused primitives against finite differences (float64) ------------------------------------------
def contract(op, shape_seed=7):
    cache = {}

    def f(p):
        y = op(**p)
        if "u" not in cache:
            cache["u"] = np.random.default_rng(shape_seed).standard_normal(np.shape(ag.value(y)))
        return ag.sum(y * cache["u"])

    return f


@pytest.mark.parametrize("qk_norm,with_gains", [(False, False), (True, False), (True, True)])
def test_self_attention_fd(qk_norm, with_gains):
    r = np.random.default_rng(3)
    B, T, H, hs = 2, 5, 2, 3
    p = {"qkv": r.standard_normal((B, T, 3 * H * hs))}
    if with_gains:
        p.update(q_gain=r.uniform(0.5, 1.5, hs), k_gain=r.uniform(0.5, 1.5, hs))
    op = lambda qkv, q_gain=None, k_gain=None: ag.self_attention(qkv, H, q_gain, k_gain, qk_norm, 1e-6)  # noqa: E731
    assert check_grads(contract(op), p, seed=1) <= 1e-6


@pytest.mark.parametrize("kind", ["swiglu", "reglu", "gelu"])
def test_ffn_activation_fd_and_value(kind):
    r = np.random.default_rng(4)
    z = r.standard_normal((3, 4, 10)) * 2
    z[np.abs(z) < 1e-3] = 0.5                       # keep relu away from its kink
    assert check_grads(contract(lambda z: ag.ffn_activation(z, kind)), {"z": z}, seed=2) <= 1e-6
    a, u = z[..., :5], z[..., 5:]
    want = {"swiglu": ag.silu(a) * u, "reglu": ag.relu(a) * u, "gelu": ag.gelu(z)}[kind]
    np.testing.assert_allclose(ag.ffn_activation(z, kind), want, rtol=1e-14, atol=1e-15)


def test_swiglu_extreme_gates_are_finite():
    z = np.array([[-1e4, -100.0, 0.0, 100.0, 1e4, 1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)
    with np.errstate(all="raise"):  # exp(-a) may overflow to inf (sigma = 0 exactly), with no warning
        h = ag.ffn_activation(z, "swiglu")
    assert np.all(np.isfinite(h)) and h[0, 0] == 0 and h[0, 4] == 1e4


def test_rms_norm_zero_row_eps0_is_nan_not_an_exception():
    """IEEE division in the kernels (error_model='numpy'): eps = 0 and an all-zero row give the documented
    NaN (0 * inf), the other rows their exact values; numba's default error model raised ZeroDivisionError."""
    x = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], np.float32)
    y = ag.rms_norm(x, np.ones(3, np.float32), eps=0.0)
    assert np.isnan(y[0]).all()
    np.testing.assert_array_equal(y[1], (x[1] * (1 / np.sqrt(25.0 / 3))).astype(np.float32))  # r in float64


def test_linear_concat_fd_and_value():
    r = np.random.default_rng(5)
    p = {"x": r.standard_normal((2, 3, 4)), "w1": r.standard_normal((4, 2)), "w2": r.standard_normal((4, 5))}
    op = lambda x, w1, w2: ag.linear_concat(x, [w1, w2])  # noqa: E731
    assert check_grads(contract(op), p, seed=3) <= 1e-6
    np.testing.assert_array_equal(op(**p), np.concatenate([p["x"] @ p["w1"], p["x"] @ p["w2"]], axis=-1))


def test_residual_linear_fd_value_and_no_mutation():
    r = np.random.default_rng(6)
    p = {"x": r.standard_normal((2, 3, 5)), "h": r.standard_normal((2, 3, 4)), "w": r.standard_normal((4, 5))}
    before = {k: v.copy() for k, v in p.items()}
    assert check_grads(contract(ag.residual_linear), p, seed=4) <= 1e-6
    np.testing.assert_array_equal(ag.residual_linear(**p), p["x"] + (p["h"].reshape(6, 4) @ p["w"]).reshape(2, 3, 5))
    for k in p:
        np.testing.assert_array_equal(p[k], before[k])
    f32 = {k: v.astype(np.float32) for k, v in p.items()}
    assert ag.residual_linear(**f32).dtype == np.float32


def test_negative_control_wrong_residual_vjp(monkeypatch):
    """A residual_linear whose VJP drops the residual path (dx = 0): the comparison must catch it."""
    cfg = tiny()
    real = ag.residual_linear

    def wrong(x, h, w):
        out = real(x, h, w)
        return ag.Node(out.value, out.parents, lambda g: (np.zeros_like(g),) + tuple(out.vjp(g)[1:]))

    monkeypatch.setattr(ag, "residual_linear", wrong)
    _, errs = fused_vs_reference(cfg, np.float64)
    assert max(errs.values()) > 1e-3


# ---- determinism, dtypes, no mutation ------------------------------------------------------------------
_THREADS_SCRIPT = """
import sys, numba, numpy as np
sys.path[:0] = [{root!r}]
import refopt
from refopt.autograd import value_and_grad
from refopt.fast import autograd_kernels
from models import gpt
autograd_kernels.parallel_builds = True
cfg = gpt.GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, ffn_hidden=24, init_std=0.3,
                    qk_norm=True)
p = gpt.init(cfg, 0, np.float32)
r = np.random.default_rng(1)
x, y = r.integers(0, 11, (8, 16)), r.integers(0, 11, (8, 16))
out = {{}}
for n in (1, numba.config.NUMBA_NUM_THREADS):
    numba.set_num_threads(n)
    v, g = value_and_grad(lambda p: gpt.loss(p, x, y, cfg))(p)
    leaves, paths, _ = refopt.tree.flatten(g)
    out.update({{f"{{n}}:{{k}}": a for k, a in zip(paths, leaves)}}, **{{f"{{n}}:loss": np.asarray(v)}})
np.savez({path!r}, **out)
"""


def test_parallel_build_same_bits_for_any_thread_count(tmp_path, monkeypatch):
    """The kernels' parallel builds (in a subprocess with two numba threads), run on 1 and on 2 threads, give
    the bits of the serial builds in this process (the same matrix products in both)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = str(tmp_path / "g.npz")
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT.format(root=root, path=path)], env=env, check=True,
                   timeout=600)
    got = np.load(path)
    monkeypatch.setattr(autograd_kernels, "parallel_builds", False)
    cfg = gpt.GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, ffn_hidden=24, init_std=0.3,
                        qk_norm=True)
    p = gpt.init(cfg, 0, np.float32)
    r = np.random.default_rng(1)
    x, y = r.integers(0, 11, (8, 16)), r.integers(0, 11, (8, 16))
    v, g = value_and_grad(lambda p: gpt.loss(p, x, y, cfg))(p)
    leaves, paths, _ = refopt.tree.flatten(g)
    for n in (1, 2):
        assert got[f"{n}:loss"] == v
        for k, a in zip(paths, leaves):
            np.testing.assert_array_equal(got[f"{n}:{k}"], a, err_msg=f"{n} threads, {k}")


def test_fused_primitives_do_not_mutate_inputs():
    r = np.random.default_rng(6)
    qkv = ag.Node(r.standard_normal((2, 4, 12)).astype(np.float32))
    z = ag.Node(r.standard_normal((3, 8)).astype(np.float32))
    before = qkv.value.copy(), z.value.copy()
    for out in (ag.self_attention(qkv, 2, qk_norm=True), ag.ffn_activation(z, "swiglu"),
                ag.ffn_activation(z, "reglu"), ag.ffn_activation(z, "gelu")):
        assert out.value.dtype == np.float32
        g = np.ones_like(out.value)
        assert all(c is None or c.dtype == np.float32 for c in out.vjp(g))
        np.testing.assert_array_equal(g, 1)
    np.testing.assert_array_equal(qkv.value, before[0])
    np.testing.assert_array_equal(z.value, before[1])


def test_apply_check_false_same_logits_and_plain_equals_traced():
    cfg = tiny(qk_norm=True)
    p = params_for(cfg, np.float32)
    x, y = batch(cfg)
    np.testing.assert_array_equal(gpt.apply(p, x, cfg), gpt.apply(p, x, cfg, check=False))
    assert value_and_grad(lambda p: gpt.loss(p, x, y, cfg))(p)[0] == gpt.loss(p, x, y, cfg)
    bad = dict(p, wpe=p["wpe"][:, :3])
    with pytest.raises(ValueError, match="wpe"):
        gpt.apply(bad, x, cfg)


def test_errors():
    z = np.zeros((2, 3, 12))
    with pytest.raises(ValueError, match="n_head"):
        ag.self_attention(z, 5)
    with pytest.raises(ValueError, match="q_gain"):
        ag.self_attention(z, 2, q_gain=np.ones(3), qk_norm=True)
    with pytest.raises(ValueError, match="eps"):
        ag.self_attention(z, 2, qk_norm=True, eps=-1.0)
    with pytest.raises(ValueError, match="kind"):
        ag.ffn_activation(z, "relu")
    with pytest.raises(ValueError, match="even"):
        ag.ffn_activation(np.zeros((2, 5)), "swiglu")
    with pytest.raises(ValueError, match="residual_linear"):
        ag.residual_linear(np.zeros((2, 5)), np.zeros((2, 4)), np.zeros((4, 6)))
    with pytest.raises(ValueError, match="residual_linear"):
        ag.residual_linear(np.zeros((2, 5), np.float32), np.zeros((2, 4)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match="linear_concat"):
        ag.linear_concat(np.zeros((2, 4)), [np.zeros((4, 2)), np.zeros((3, 2))])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neg_gate_is_numpy_negative_bitwise(dtype):
    """SwiGLU's -a (the input of NumPy's exp) from the serial and the parallel build: the bits of
    ``np.negative`` on the gate half of z, signed zeros, infinities and NaNs (sign flipped) included.
    Negative control: the up half's negation differs, so a kernel reading the wrong half would fail."""
    r = np.random.default_rng(9)
    z = r.standard_normal((37, 10)).astype(dtype)
    z[0, :5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    want = np.negative(z[:, :5])
    for build in (autograd_kernels._neg_gate.serial, autograd_kernels._neg_gate.parallel):
        out = np.empty((37, 5), dtype)
        build(z, out)
        assert out.tobytes() == want.tobytes()
    assert np.negative(z[:, 5:]).tobytes() != want.tobytes()

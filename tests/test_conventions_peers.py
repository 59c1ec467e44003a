"""The peer conventions added on the one-definition rules layer (AMSGrad in torch's and optax's forms,
torch's NAdam momentum decay, Lion, clipping by the global norm, Muon's 4-D conv scale, torch's
AveragedModel EMA), each against its peer over 50 steps of a noisy quadratic: float64 within 1e-12
(relative, params and state), float32 within 2e-5, and a deliberately wrong variant that the comparison
catches. Skipped (with the reason) when the peer is not installed."""
import math

import numpy as np
import pytest

import refopt

STEPS = 50
TOL = {"float64": 1e-12, "float32": 2e-5}


def _problem(dtype, seed=0):
    """x0 (a 5x4 matrix and a 4-vector), and g(t, xs) = a*(x - c) + noise_t elementwise (the gradient feeds
    back on the params, so a wrong convention moves the trajectory)."""
    rng = np.random.default_rng(seed)
    shapes = [(5, 4), (4,)]
    x0 = [rng.standard_normal(s).astype(dtype) for s in shapes]
    a = [rng.uniform(0.5, 2.0, s).astype(dtype) for s in shapes]
    c = [rng.standard_normal(s).astype(dtype) for s in shapes]
    noise = [[rng.standard_normal(s).astype(dtype) * dtype(0.3) for s in shapes] for _ in range(STEPS)]

    def grad(t, xs):
        return [ai * (x - ci) + n for ai, x, ci, n in zip(a, xs, c, noise[t - 1])]
    return x0, grad


def _refopt_run(rule, dtype, seed=0):
    x0, grad = _problem(np.dtype(dtype).type, seed)
    xs, s = [x.copy() for x in x0], refopt.init(rule, [x.copy() for x in x0])
    for t in range(1, STEPS + 1):
        xs, s = refopt.update(rule, s, xs, grad(t, xs))
    return xs, s


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _close(mine, theirs, dtype):
    worst = max(_rel(m, p) for m, p in zip(mine, theirs))
    assert worst <= TOL[dtype], f"relative difference {worst:.3g} > {TOL[dtype]}"
    return worst


# --- torch ----------------------------------------------------------------------------------------

def _torch_run(make_opt, dtype, clip=None, seed=0, state_keys=()):
    torch = pytest.importorskip("torch", reason="peer torch not installed: pip install torch==2.13.0")
    x0, grad = _problem(np.dtype(dtype).type, seed)
    tdt = getattr(torch, dtype)
    old = torch.get_default_dtype()
    torch.set_default_dtype(tdt)   # torch.optim.NAdam keeps mu_product in the default dtype
    try:
        ps = [torch.nn.Parameter(torch.tensor(x)) for x in x0]
        opt = make_opt(torch, ps)
        for t in range(1, STEPS + 1):
            gs = grad(t, [p.detach().numpy().copy() for p in ps])
            for p, g in zip(ps, gs):
                p.grad = torch.tensor(g)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(ps, clip)
            opt.step()
    finally:
        torch.set_default_dtype(old)
    xs = [p.detach().numpy().copy() for p in ps]
    states = {k: [opt.state[p][k].detach().numpy().copy() for p in ps] for k in state_keys}
    return xs, states


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_amsgrad_as_torch(cls, dtype):
    rule = getattr(refopt, cls)(lr=0.05, weight_decay=0.1, amsgrad=True)
    xs, s = _refopt_run(rule, dtype)
    txs, st = _torch_run(lambda torch, ps: getattr(torch.optim, cls)(ps, lr=0.05, weight_decay=0.1, amsgrad=True),
                         dtype, state_keys=("exp_avg", "exp_avg_sq", "max_exp_avg_sq"))
    _close(xs, txs, dtype)
    _close([leaf.v_max for leaf in s.leaves], st["max_exp_avg_sq"], dtype)
    _close([leaf.m for leaf in s.leaves], st["exp_avg"], dtype)
    if dtype == "float64":   # negative controls: plain Adam, and optax's bias-corrected maximum
        for wrong in (getattr(refopt, cls)(lr=0.05, weight_decay=0.1),
                      getattr(refopt, cls)(lr=0.05, weight_decay=0.1, amsgrad="bias_corrected")):
            assert max(_rel(a, b) for a, b in zip(_refopt_run(wrong, dtype)[0], txs)) > 1e3 * TOL[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("decoupled", [False, True])
def test_nadam_momentum_decay_as_torch(decoupled, dtype):
    cls = refopt.AdamW if decoupled else refopt.Adam
    rule = cls(lr=0.02, weight_decay=0.05, nesterov=True, momentum_decay=4e-3)
    xs, s = _refopt_run(rule, dtype)
    txs, st = _torch_run(lambda torch, ps: torch.optim.NAdam(ps, lr=0.02, weight_decay=0.05, momentum_decay=4e-3,
                                                             decoupled_weight_decay=decoupled),
                         dtype, state_keys=("exp_avg", "exp_avg_sq"))
    _close(xs, txs, dtype)
    _close([leaf.v for leaf in s.leaves], st["exp_avg_sq"], dtype)
    assert isinstance(s.glob, tuple) and 0 < s.glob.mu_product < 0.9 ** STEPS
    if dtype == "float64":   # negative control: optax's constant-beta1 NAdam differs steadily
        wrong = cls(lr=0.02, weight_decay=0.05, nesterov=True)
        assert max(_rel(a, b) for a, b in zip(_refopt_run(wrong, dtype)[0], txs)) > 1e3 * TOL[dtype]


def test_nadam_momentum_decay_to_infinity_is_optax_form():
    a, _ = _refopt_run(refopt.Adam(lr=0.02, nesterov=True, momentum_decay=1e6), "float64")
    b, _ = _refopt_run(refopt.Adam(lr=0.02, nesterov=True), "float64")
    _close(a, b, "float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_clip_by_global_norm_as_torch(eps, dtype):
    rule = refopt.ClipByGlobalNorm(refopt.Adam(lr=0.05), max_norm=1.0, eps=eps)
    xs, _ = _refopt_run(rule, dtype)
    txs, _ = _torch_run(lambda torch, ps: torch.optim.Adam(ps, lr=0.05), dtype, clip=1.0)
    if eps == 1e-6:
        _close(xs, txs, dtype)
    elif dtype == "float64":   # negative control: without torch's +1e-6 the clipped steps differ
        assert max(_rel(a, b) for a, b in zip(xs, txs)) > 100 * TOL[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ema_after_first_step_as_torch_averaged_model(dtype):
    torch = pytest.importorskip("torch", reason="peer torch not installed: pip install torch==2.13.0")
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    rule = refopt.EMA(refopt.SGD(lr=0.05, momentum=0.9), decay=0.9, debias=False, start="after_first_step")
    xs, s = _refopt_run(rule, dtype)
    mine = refopt.eval_params(rule, s, xs)
    x0, grad = _problem(np.dtype(dtype).type)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(x)) for x in x0])
    avg = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for t in range(1, STEPS + 1):
        for p, g in zip(model, grad(t, [p.detach().numpy().copy() for p in model])):
            p.grad = torch.tensor(g)
        opt.step()
        avg.update_parameters(model)
    theirs = [p.detach().numpy() for p in avg.module]
    _close(mine, theirs, dtype)
    if dtype == "float64":   # negative controls: the two other EMA conventions
        for other in (refopt.EMA(refopt.SGD(lr=0.05, momentum=0.9), decay=0.9),
                      refopt.EMA(refopt.SGD(lr=0.05, momentum=0.9), decay=0.9, debias=False, start="x0")):
            xo, so = _refopt_run(other, dtype)
            assert max(_rel(a, b) for a, b in zip(refopt.eval_params(other, so, xo), theirs)) > 1e3 * TOL[dtype]


# --- optax ----------------------------------------------------------------------------------------

def _optax_run(make_tx, dtype, seed=0):
    optax = pytest.importorskip("optax", reason="peer optax not installed: pip install optax")
    import jax
    import jax.numpy as jnp

    x0, grad = _problem(np.dtype(dtype).type, seed)
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)     # scoped: restored below (float32 inputs stay float32)
    try:
        tx = make_tx(optax)
        params = [jnp.asarray(x) for x in x0]
        state = tx.init(params)
        for t in range(1, STEPS + 1):
            gs = [jnp.asarray(g) for g in grad(t, [np.asarray(p) for p in params])]
            updates, state = tx.update(gs, state, params)
            params = optax.apply_updates(params, updates)
        out = [np.asarray(p) for p in params]
    finally:
        jax.config.update("jax_enable_x64", old)
    assert all(o.dtype == np.dtype(dtype) for o in out)
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_amsgrad_bias_corrected_as_optax(dtype):
    xs, _ = _refopt_run(refopt.Adam(lr=0.05, amsgrad="bias_corrected"), dtype)
    theirs = _optax_run(lambda optax: optax.amsgrad(0.05), dtype)
    _close(xs, theirs, dtype)
    if dtype == "float64":   # negative control: torch's form remembers the raw maximum
        wrong, _ = _refopt_run(refopt.Adam(lr=0.05, amsgrad=True), dtype)
        assert max(_rel(a, b) for a, b in zip(wrong, theirs)) > 1e3 * TOL[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("wd", [0.0, 1e-3, 0.3])
def test_lion_as_optax(wd, dtype):
    xs, _ = _refopt_run(refopt.Lion(lr=0.01, weight_decay=wd), dtype)
    theirs = _optax_run(lambda optax: optax.lion(0.01, weight_decay=wd), dtype)
    _close(xs, theirs, dtype)
    if dtype == "float64":   # negative control: swapped betas
        wrong, _ = _refopt_run(refopt.Lion(lr=0.01, beta1=0.99, beta2=0.9, weight_decay=wd), dtype)
        assert max(_rel(a, b) for a, b in zip(wrong, theirs)) > 1e3 * TOL[dtype]


def test_lion_default_weight_decay_differs_from_optax():
    # optax.lion defaults to weight_decay=1e-3, refopt's Lion to 0 (documented)
    assert refopt.Lion().weight_decay == 0.0
    xs, _ = _refopt_run(refopt.Lion(lr=0.01, weight_decay=1e-3), "float64")
    _close(xs, _optax_run(lambda optax: optax.lion(0.01), "float64"), "float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_clip_by_global_norm_as_optax(dtype):
    xs, _ = _refopt_run(refopt.ClipByGlobalNorm(refopt.Adam(lr=0.05), max_norm=1.0), dtype)
    theirs = _optax_run(lambda optax: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05)), dtype)
    _close(xs, theirs, dtype)
    if dtype == "float64":   # negative control: no clipping
        wrong, _ = _refopt_run(refopt.Adam(lr=0.05), dtype)
        assert max(_rel(a, b) for a, b in zip(wrong, theirs)) > 1e3 * TOL[dtype]


# --- Muon's 4-D scale against a float64 restatement of KellerJordan's code --------------------------

def _kj_scale_from_torch_shape(out_, in_, kh, kw):
    """KellerJordan/Muon (muon.py, muon_update): for a 4-D torch (out, in, kh, kw) update it scales by
    max(1, grad.size(-2) / grad.size(-1))**0.5 of the *4-D* tensor, i.e. max(1, kh/kw)**0.5."""
    shape = (out_, in_, kh, kw)
    return max(1.0, shape[-2] / shape[-1]) ** 0.5


@pytest.mark.parametrize("shape", [(3, 3, 4, 8), (5, 3, 2, 6), (1, 7, 3, 3), (3, 5, 4, 2), (7, 1, 2, 40)])
def test_muon_jordan_4d_scale_matches_kellerjordan(shape):
    kh, kw, fi, fo = shape
    want = _kj_scale_from_torch_shape(fo, fi, kh, kw)
    assert refopt.rules.muon.muon_scale(shape, "jordan_4d") == want
    flat = refopt.rules.muon.muon_scale(shape, "jordan")    # the flattened (kh*kw*fi, fo) scale differs
    if kh > kw:          # the scale of the flattened (kh*kw*fi, fo) view is another number
        assert flat != want
    # a whole Muon step with the 4-D scale, against the same step with scale 'none' times the 4-D scale
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)
    a, _ = refopt.update(refopt.Muon(lr=0.1, scale="jordan_4d", msign="svd"),
                         refopt.init(refopt.Muon(lr=0.1, scale="jordan_4d", msign="svd"), x), x, g)
    b, _ = refopt.update(refopt.Muon(lr=0.1 * want, scale="none", msign="svd"),
                         refopt.init(refopt.Muon(lr=0.1, scale="none", msign="svd"), x), x, g)
    np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)


def test_muon_jordan_4d_on_2d_is_jordan_and_other_ndims_raise():
    assert refopt.rules.muon.muon_scale((3, 12), "jordan_4d") == refopt.rules.muon.muon_scale((3, 12), "jordan")
    with pytest.raises(ValueError, match="2-D or 4-D"):
        refopt.rules.muon.muon_scale((2, 3, 4), "jordan_4d")
    with pytest.raises(ValueError, match="2-D or 4-D"):
        refopt.init(refopt.Muon(scale="jordan_4d"), np.ones((2, 3, 4)))


# --- construction errors --------------------------------------------------------------------------

@pytest.mark.parametrize("make, match", [
    (lambda: refopt.Adam(amsgrad="yes"), "amsgrad"),
    (lambda: refopt.Adam(amsgrad=True, nesterov=True), "amsgrad and nesterov"),
    (lambda: refopt.Adam(momentum_decay=4e-3), "needs nesterov"),
    (lambda: refopt.Adam(nesterov=True, momentum_decay=0.0), "momentum_decay"),
    (lambda: refopt.Lion(beta1=1.0), "beta1"),
    (lambda: refopt.Lion(weight_decay=-1), "weight_decay"),
    (lambda: refopt.ClipByGlobalNorm(refopt.SGD(), max_norm=0.0), "max_norm"),
    (lambda: refopt.ClipByGlobalNorm(refopt.SGD(), eps=-1e-6), "eps"),
    (lambda: refopt.ClipByGlobalNorm("sgd"), "base must be a refopt rule"),
    (lambda: refopt.EMA(refopt.SGD(), start="after_first_step"), "needs debias=False"),
    (lambda: refopt.EMA(refopt.SGD(), debias=False, start="later"), "start"),
    (lambda: refopt.Muon(msign_backend="tpu"), "msign_backend"),
])
def test_bad_hyperparameters_raise_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_clip_does_not_write_the_callers_gradients_and_clips_exactly():
    g = [np.full((2, 2), 3.0), np.full(3, 4.0)]          # global norm sqrt(36 + 48) = sqrt(84)
    keep = [a.copy() for a in g]
    rule = refopt.ClipByGlobalNorm(refopt.SGD(lr=1.0), max_norm=2.0)
    x = [np.zeros((2, 2)), np.zeros(3)]
    y, _ = refopt.update_(rule, refopt.init(rule, x), x, g)
    assert all(np.array_equal(a, b) for a, b in zip(g, keep))
    c = 2.0 / math.sqrt(84.0)
    np.testing.assert_allclose(y[0], -3.0 * c, rtol=1e-15)
    np.testing.assert_allclose(y[1], -4.0 * c, rtol=1e-15)
    assert math.hypot(*(np.linalg.norm(a) for a in y)) == pytest.approx(2.0, rel=1e-15)
    # below max_norm: untouched
    x = [np.zeros((2, 2)), np.zeros(3)]
    y2, _ = refopt.update(rule, refopt.init(rule, x), x, [a * 0.01 for a in g])
    assert np.array_equal(y2[0], -0.03 * np.ones((2, 2)))


def test_clip_inside_a_partition_clips_each_group_by_its_own_norm():
    rule = refopt.Partition(rules={"a": refopt.ClipByGlobalNorm(refopt.SGD(lr=1.0), max_norm=1.0),
                                   "b": refopt.SGD(lr=1.0)}, labels={"p": "a", "q": "b"})
    x = {"p": np.zeros(4), "q": np.zeros(4)}
    g = {"p": np.full(4, 2.0), "q": np.full(4, 2.0)}      # ||g_p|| = 4
    y, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    np.testing.assert_allclose(y["p"], -0.5, rtol=1e-15)
    assert np.array_equal(y["q"], -2.0 * np.ones(4))

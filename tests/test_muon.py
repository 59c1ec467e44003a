"""Muon: an independent plain-numpy oracle, PITFALLS B07/B08, the peer presets and the error paths."""
import itertools
import math
import threading
from dataclasses import dataclass

import numpy as np
import pytest

import refopt
from oracles import muon_reference
from refopt.rules.muon import Muon, matrix_shape, muon_scale

JORDAN = (3.4445, -4.7750, 2.0315)


# ---- the oracle: written from the equations in the brief / CONVENTIONS, not from refopt ---------------
def o_ns(M, rows, eps=0.0, mode="none"):
    tall = M.shape[0] > M.shape[1]
    X = M.T if tall else M
    n = np.sqrt(np.sum(X * X))
    if n == 0 and mode == "none":
        return np.zeros_like(M)
    X = X / {"none": n, "add": n + eps, "clamp": max(n, eps)}[mode]
    for a, b, c in rows:
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if tall else X


def o_svd(M):
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    r = int(np.sum(s > max(M.shape) * np.finfo(float).eps * s[0])) if s[0] > 0 else 0
    return U[:, :r] @ Vt[:r]


def o_scale(fan_in, fan_out, kind):
    return {"spectral": np.sqrt(fan_out / fan_in), "jordan": np.sqrt(max(1.0, fan_out / fan_in)),
            "rms_match": 0.2 * np.sqrt(max(fan_in, fan_out)), "none": 1.0}[kind]


def oracle_muon(x, grads, lr=0.1, mu=0.9, nesterov=True, method="ns", rows=(JORDAN,) * 5, scale="spectral",
                wd=0.0, wd_mode="decoupled", bias_corrected=False, eps=0.0, eps_mode="none", sched=None):
    """Multi-step Muon in float64; returns the list of iterates and the final momentum."""
    shape = x.shape
    fi, fo = int(np.prod(shape[:-1])), shape[-1]
    m = np.zeros_like(x)
    xs = []
    for t, g in enumerate(grads, start=1):
        gamma = 1.0 if sched is None else sched(t)
        m = mu * m + (1 - mu) * g
        if not bias_corrected:
            M = (1 - mu) * g + mu * m if nesterov else m
        elif nesterov:
            M = mu * m / (1 - mu ** (t + 1)) + (1 - mu) * g / (1 - mu ** t)
        else:
            M = m / (1 - mu ** t)
        M2 = M.reshape(fi, fo)
        O = (o_ns(M2, rows, eps, eps_mode) if method == "ns" else o_svd(M2)).reshape(shape)
        rate = lr * gamma if wd_mode == "decoupled" else gamma
        x = x * (1 - rate * wd) - lr * gamma * o_scale(fi, fo, scale) * O
        xs.append(x)
    return xs, m


def run(rule, x, grads, inplace=False):
    state = refopt.init(rule, x)
    xs = []
    for g in grads:
        x, state = (refopt.update_ if inplace else refopt.update)(rule, state, x, g)
        xs.append(x.copy())
    return xs, state


def data(shape, steps=4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype), [rng.standard_normal(shape).astype(dtype) for _ in range(steps)]


def close(a, b, rel=1e-12):
    scale = max(np.abs(b).max(), 1e-300)
    assert np.abs(a - b).max() <= rel * scale, np.abs(a - b).max() / scale


# ---- multi-step oracle, every mode -------------------------------------------------------------------
CONFIGS = list(itertools.product(["spectral", "jordan", "rms_match", "none"], [True, False],
                                 ["decoupled", "independent"], ["standard", "bias_corrected"]))


@pytest.mark.parametrize("scale,nesterov,wd_mode,nmode", CONFIGS)
@pytest.mark.parametrize("shape", [(6, 4), (3, 8)])
def test_oracle_all_modes(scale, nesterov, wd_mode, nmode, shape):
    x, grads = data(shape, steps=5)
    sched = (lambda t: 1.0 / t)
    rule = Muon(lr=0.07, momentum=0.9, nesterov=nesterov, scale=scale, weight_decay=0.3, wd_mode=wd_mode,
                nesterov_mode=nmode, schedule=sched)
    got, _ = run(rule, x, grads)
    want, _ = oracle_muon(x, grads, lr=0.07, mu=0.9, nesterov=nesterov, scale=scale, wd=0.3, wd_mode=wd_mode,
                          bias_corrected=nmode == "bias_corrected", sched=sched)
    for a, b in zip(got, want):
        close(a, b)


@pytest.mark.parametrize("kw,okw", [
    ({"msign": "svd"}, {"method": "svd"}),
    ({"ns_coeffs": "classic", "ns_steps": 9}, {"rows": ((1.875, -1.25, 0.375),) * 9}),
    ({"ns_coeffs": [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)], "ns_steps": 3},
     {"rows": ((3.0, -3.2, 1.2), (2.0, -1.5, 0.5), (2.0, -1.5, 0.5))}),
    ({"eps_mode": "add", "norm_eps": 1e-2}, {"eps": 1e-2, "eps_mode": "add"}),
    ({"eps_mode": "clamp", "norm_eps": 5.0}, {"eps": 5.0, "eps_mode": "clamp"}),
])
def test_oracle_msign_options(kw, okw):
    x, grads = data((5, 7), steps=4, seed=1)
    got, _ = run(Muon(lr=0.05, momentum=0.8, **kw), x, grads)
    want, _ = oracle_muon(x, grads, lr=0.05, mu=0.8, **okw)
    for a, b in zip(got, want):
        close(a, b)


def test_oracle_conv_shaped_parameter_and_momentum_state():
    x, grads = data((3, 3, 2, 5), steps=3, seed=2)      # HWIO: fan_in = 18, fan_out = 5
    got, state = run(Muon(lr=0.05, scale="rms_match", weight_decay=0.1), x, grads)
    want, m = oracle_muon(x, grads, lr=0.05, mu=0.95, scale="rms_match", wd=0.1)
    assert got[-1].shape == x.shape
    close(got[-1], want[-1])
    close(state.leaves.m, m)


def test_update_and_update_inplace_are_bit_identical_and_match_the_numpy_twin():
    x, grads = data((6, 4), steps=3, seed=3)
    rule = Muon(lr=0.1, weight_decay=0.1)
    a, _ = run(rule, x, grads)
    b, _ = run(rule, x.copy(), grads, inplace=True)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    xr, mr = muon_reference(x, grads[0], np.zeros_like(x), 1, rule)
    assert np.array_equal(a[0], xr)


# ---- PITFALLS B08: Muon is not SGD -------------------------------------------------------------------------
def test_muon_step_is_not_sgd():
    x, (g,) = data((8, 5), steps=1, seed=4)
    lr = 0.1
    rule = Muon(lr=lr, momentum=0.0, nesterov=False, scale="none")
    x1, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    step = x - x1
    sgd = lr * g
    assert np.abs(step - sgd).max() > 0.1 * np.abs(sgd).max()
    sv = np.linalg.svd(step / lr, compute_uv=False)        # NS5 singular values, in the B08 band
    assert 0.5 < sv.min() and sv.max() < 1.25
    # the same with the exact msign: every singular value of the step is lr
    rule = Muon(lr=lr, momentum=0.0, nesterov=False, scale="none", msign="svd")
    x1, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    np.testing.assert_allclose(np.linalg.svd(x - x1, compute_uv=False), lr, rtol=1e-12)


def test_direction_includes_the_scale_and_excludes_decay():
    x, (g,) = data((4, 9), steps=1, seed=5)
    rule = Muon(lr=0.3, msign="svd", scale="spectral", weight_decay=0.5)
    u, _ = refopt.direction(rule, refopt.init(rule, x), x, g)
    np.testing.assert_allclose(np.linalg.svd(u, compute_uv=False), math.sqrt(9 / 4), rtol=1e-12)
    x1, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    close(x1, x * (1 - 0.3 * 0.5) - 0.3 * u)


# ---- PITFALLS B07: scales from the flattened shape -----------------------------------------------------------
# The B07 shapes are torch's (out, in, kh, kw); in refopt's x @ W layout the same kernel is (kh, kw, in, out).
B07 = [((64, 1, 3, 3), 2.6667, 1.6), ((8, 4, 3, 3), 1.0, 1.2), ((192, 3, 16, 16), 1.0, 5.5426), ((32, 8), 2.0, 1.1314)]


@pytest.mark.parametrize("torch_shape,jordan,rms", B07)
def test_b07_scale_table(torch_shape, jordan, rms):
    ours = tuple(torch_shape[2:]) + (torch_shape[1], torch_shape[0])
    assert round(muon_scale(ours, "jordan"), 4) == jordan
    assert round(muon_scale(ours, "rms_match"), 4) == rms
    out, rest = torch_shape[0], int(np.prod(torch_shape[1:]))
    assert matrix_shape(ours) == (rest, out)
    assert muon_scale(ours, "spectral") == pytest.approx(math.sqrt(out / rest), rel=1e-15)
    assert muon_scale(ours, "none") == 1.0


def test_b07_update_keeps_the_shape_and_uses_the_flat_view():
    x, (g,) = data((3, 3, 1, 64), steps=1, seed=6)
    rule = Muon(lr=0.01, momentum=0.0, nesterov=False, scale="jordan", msign="svd")
    x1, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    assert x1.shape == x.shape
    sv = np.linalg.svd((x - x1).reshape(9, 64), compute_uv=False)
    np.testing.assert_allclose(sv, 0.01 * 64 / 24, rtol=1e-12)   # sqrt(64/9) = 8/3


# ---- reproducing the peers ----------------------------------------------------------------------------------
def torch_muon_oracle(W, grads, lr, wd, mu, eps, adjust):
    """torch.optim.Muon (CONVENTIONS 1.3) on a torch (out, in) array, float64, no bf16."""
    B = np.zeros_like(W)
    A_, B_ = W.shape
    for g in grads:
        B = B + (1 - mu) * (g - B)                  # lerp(B, g, 1 - mu)
        U = g + mu * (B - g)                        # lerp(g, B, mu)
        O = o_ns(U, (JORDAN,) * 5, eps, "clamp")
        W = W * (1 - lr * wd)
        adj = math.sqrt(max(1, A_ / B_)) if adjust == "original" else 0.2 * math.sqrt(max(A_, B_))
        W = W - lr * adj * O
    return W


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("torch_shape", [(8, 3), (3, 8)])
def test_like_torch_on_transposed_arrays(adjust, torch_shape):
    W, grads = data(torch_shape, steps=4, seed=7)
    want = torch_muon_oracle(W, grads, 0.02, 0.1, 0.95, 1e-7, adjust)
    rule = Muon.like_torch(lr=0.02, adjust_lr_fn=adjust)
    got, _ = run(rule, np.ascontiguousarray(W.T), [np.ascontiguousarray(g.T) for g in grads])
    close(got[-1].T, want, rel=1e-11)          # lerp vs EMA forms round differently


def optax_muon_oracle(W, grads, lr, beta, eps, wd):
    """optax.contrib.muon's Muon branch (CONVENTIONS 2.4) on an optax (in, out) array."""
    m = np.zeros_like(W)
    fan_in, fan_out = W.shape
    for count, g in enumerate(grads):
        t = count + 1
        m = beta * m + (1 - beta) * g
        Mh = beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta ** t)
        O = o_ns(Mh, (JORDAN,) * 5, eps, "add")
        upd = math.sqrt(max(1, fan_out / fan_in)) * O + wd * W
        W = W - lr * upd
    return W


@pytest.mark.parametrize("shape", [(8, 3), (3, 8)])
def test_like_optax_on_the_same_layout(shape):
    W, grads = data(shape, steps=4, seed=8)
    want = optax_muon_oracle(W, grads, 0.03, 0.95, 1e-8, 0.01)
    got, _ = run(Muon.like_optax(0.03, weight_decay=0.01), W, grads)
    close(got[-1], want, rel=1e-11)
    assert Muon.like_optax(0.1, ns_coeffs="dion").ns_coeffs == "you"


def test_moonlight_sgd_sum_momentum_has_the_same_direction():
    x, grads = data((4, 6), steps=4, seed=9)
    mu = 0.95
    b = np.zeros_like(x)
    rule = Muon(lr=0.1, momentum=mu, scale="none", msign="svd")
    state = refopt.init(rule, x)
    for g in grads:
        b = mu * b + g
        u, state = refopt.direction(rule, state, x, g)
        close(u, o_svd(g + mu * b), rel=1e-12)


# ---- dtypes, errors ----------------------------------------------------------------------------------------
def test_float32_stays_float32():
    x, grads = data((6, 4), steps=3, seed=10, dtype=np.float32)
    for kw in [{}, {"msign": "svd"}, {"nesterov_mode": "bias_corrected", "weight_decay": 0.1}]:
        rule = Muon(lr=0.05, **kw)
        got, state = run(rule, x, grads)
        assert got[-1].dtype == np.float32 and state.leaves.m.dtype == np.float32
        want, _ = run(rule, x.astype(np.float64), [g.astype(np.float64) for g in grads])
        np.testing.assert_allclose(got[-1], want[-1], atol=1e-5)


def test_one_dimensional_parameter_error_names_the_path_and_partition():
    params = {"layers": [{"w": np.ones((3, 4)), "b": np.ones(4)}]}
    with pytest.raises(ValueError, match=r"layers\[0\]\.b.*Partition"):
        refopt.init(Muon(), params)
    with pytest.raises(ValueError, match="Partition"):
        refopt.init(Muon(), np.ones(()))


def test_zero_gradient_gives_a_finite_step():
    x = np.ones((3, 5))
    for kw in [{}, {"msign": "svd"}, {"eps_mode": "add", "norm_eps": 1e-7}]:
        rule = Muon(lr=0.1, weight_decay=0.1, **kw)
        x1, _ = refopt.update(rule, refopt.init(rule, x), x, np.zeros_like(x))
        np.testing.assert_array_equal(x1, x * (1 - 0.1 * 0.1))


@pytest.mark.parametrize("kw", [
    {"lr": -1.0}, {"momentum": 1.0}, {"nesterov": 1}, {"msign": "qr"}, {"ns_coeffs": "bogus"},
    {"ns_coeffs": (1.0, 2.0)}, {"ns_steps": 0}, {"ns_steps": 100}, {"ns_steps": 2.0}, {"scale": "mup"},
    {"weight_decay": -0.1}, {"wd_mode": "l2"}, {"wd_mode": "independent", "weight_decay": 2.0},
    {"nesterov_mode": "nadam"}, {"eps_mode": "add"}, {"norm_eps": 1e-7}, {"norm_factor": 0.9},
    {"schedule": 3}])
def test_bad_hyperparameters(kw):
    with pytest.raises(ValueError):
        Muon(**kw)


def test_list_coefficients_are_stored_as_tuples():
    rule = Muon(ns_coeffs=[[3.0, -3.2, 1.2], [2.0, -1.5, 0.5]])
    assert rule.ns_coeffs == ((3.0, -3.2, 1.2), (2.0, -1.5, 0.5))
    hash(rule)


# ---- many matrices in one step: the momenta, msign of all of them on parallel threads, then the writes ----
def _tree(seed, dtype=np.float64):
    """Several matrices (three of one shape, so that a mix-up of the results keeps the shapes) and grads."""
    rng = np.random.default_rng(seed)
    shapes = {"a": (6, 4), "b": (6, 4), "c": (6, 4), "d": (3, 9), "e": (2, 3, 5)}
    x = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()} for _ in range(3)]
    return x, grads


def _run_tree(rule, x, grads, inplace):
    state = refopt.init(rule, x)
    xs = []
    for g in grads:
        x, state = (refopt.update_ if inplace else refopt.update)(rule, state, x, g)
        xs.append({k: v.copy() for k, v in x.items()})
    return xs, state


@pytest.mark.parametrize("chunk", [None, 60])   # 60 elements: chunks [a, b], [c, d], [e] (24, 24, 24, 27, 30)
@pytest.mark.parametrize("inplace", [False, True])
def test_many_leaves_match_the_oracle_leaf_by_leaf(inplace, chunk, monkeypatch):
    if chunk is not None:
        import refopt.fast.walk as fast_walk

        monkeypatch.setattr(fast_walk, "CHUNK_ELEMENTS", chunk)
    x, grads = _tree(4)
    rule = Muon(lr=0.05, momentum=0.9, weight_decay=0.2, schedule=lambda t: 1.0 / t)
    got, state = _run_tree(rule, {k: v.copy() for k, v in x.items()}, grads, inplace)
    for k in x:
        want, m = oracle_muon(x[k], [g[k] for g in grads], lr=0.05, mu=0.9, wd=0.2, sched=lambda t: 1.0 / t)
        for a, b in zip(got, want):
            close(a[k], b)
        close(state.leaves[k].m, m)


def test_many_leaves_equal_the_leaf_by_leaf_step_bitwise():
    """The pooled path (several leaves) against single-leaf trees (the per-leaf path), with one BLAS thread
    on both sides, so each Newton-Schulz runs the same products in the same order."""
    from threadpoolctl import threadpool_limits

    x, grads = _tree(5, np.float32)
    rule = Muon(lr=0.05, weight_decay=0.1)
    with threadpool_limits(limits=1, user_api="blas"):
        got, _ = _run_tree(rule, dict(x), grads, False)
        for k in x:
            alone, _ = run(rule, x[k], [g[k] for g in grads])
            assert all(np.array_equal(a[k], b) for a, b in zip(got, alone)), k


def test_many_leaves_results_in_the_wrong_order_are_caught(monkeypatch):
    """Negative control: a newton_schulz_many that returns the results of same-shaped matrices swapped (the
    mix-up a sort by cost could make) fails the leaf-by-leaf oracle comparison above."""
    import refopt.fast.walk as fast_walk

    real = fast_walk.newton_schulz_many

    def swapped(Gs, *a, **k):
        out = real(Gs, *a, **k)
        out[0], out[1] = out[1], out[0]
        return out

    monkeypatch.setattr(fast_walk, "newton_schulz_many", swapped)
    with pytest.raises(AssertionError):
        test_many_leaves_match_the_oracle_leaf_by_leaf(False, None, monkeypatch)


@pytest.mark.parametrize("inplace", [False, True])
def test_many_leaves_write_nothing_when_newton_schulz_fails(monkeypatch, inplace):
    import refopt.linalg._msign as ms

    x, grads = _tree(6)
    rule = Muon(lr=0.05)
    state = refopt.init(rule, x)
    x, state = refopt.update_(rule, state, x, grads[0])
    before_x = {k: v.copy() for k, v in x.items()}
    before_m = {k: s.m.copy() for k, s in state.leaves.items()}
    real, calls = ms.newton_schulz, []

    def fails_on_the_third(G, *a, **k):
        calls.append(G.shape)
        if len(calls) == 3:
            raise FloatingPointError("Newton-Schulz produced nan or inf (test)")
        return real(G, *a, **k)

    monkeypatch.setattr(ms, "newton_schulz", fails_on_the_third)
    with pytest.raises(FloatingPointError):
        (refopt.update_ if inplace else refopt.update)(rule, state, x, grads[1])
    assert len(calls) == 5
    assert all(np.array_equal(x[k], before_x[k]) for k in x)
    assert all(np.array_equal(state.leaves[k].m, before_m[k]) for k in x)


@dataclass(frozen=True)
class _ClampedMuon(Muon):
    """A user's variant changing the per-leaf step (the step clamped to [-1, 1] after Muon's)."""

    def update_leaf(self, ctx, s, x, g, path):
        x, s = super().update_leaf(ctx, s, x, g, path)
        np.clip(x, -1.0, 1.0, out=x)
        return x, s


def _clamped_oracle(rule, x, grads):
    """Per leaf: one-leaf trees (a single matrix always steps through update_leaf)."""
    out = {}
    for k in x:
        xk, s = x[k].copy(), refopt.init(rule, x[k])
        for g in grads:
            xk, s = refopt.update(rule, s, xk, g[k])
        out[k] = xk
    return out


def _subclass_keeps_its_step(inplace):
    x, grads = _tree(8)
    x = {k: 3.0 * v for k, v in x.items()}     # many entries beyond [-1, 1]: the clamp matters
    rule = _ClampedMuon(lr=0.5)
    want = _clamped_oracle(rule, x, grads)
    got, _ = _run_tree(rule, {k: v.copy() for k, v in x.items()}, grads, inplace)
    assert all(np.array_equal(got[-1][k], want[k]) for k in x)
    assert max(np.abs(v).max() for v in got[-1].values()) <= 1.0


@pytest.mark.parametrize("inplace", [False, True])
def test_many_leaves_keep_a_subclass_update_leaf(inplace, monkeypatch):
    """A subclass overriding update_leaf is stepped through it with several matrices too (as ElementwiseRule,
    Partition and ClipByGlobalNorm do), not by the batched passes, which would bypass it. Negative
    control: without the override check the batched passes step the plain Muon and the test fails."""
    _subclass_keeps_its_step(inplace)
    import refopt.fast.walk as fast_walk

    monkeypatch.setattr(fast_walk, "overrides", lambda *a: False)
    with pytest.raises(AssertionError):
        _subclass_keeps_its_step(inplace)


# ---- the BLAS thread count and the pool of newton_schulz_many ---------------------------------------------
def _blas_counts():
    from threadpoolctl import threadpool_info

    return [m["num_threads"] for m in threadpool_info() if m["user_api"] == "blas"]


@pytest.mark.parametrize("inplace", [False, True])
def test_many_leaves_restore_the_blas_threads_after_newton_schulz_fails(monkeypatch, inplace):
    """The step sets the BLAS to one thread while its matrices run on the pool; a Newton-Schulz failure
    (raised in a pool thread) leaves the count as it found it. Negative control: a pool that never
    restores it is caught."""
    from threadpoolctl import threadpool_limits

    import refopt.linalg._msign as ms

    x, grads = _tree(9)
    rule = Muon(lr=0.05)
    real = ms.newton_schulz

    def fails(G, *a, **k):
        if G.shape == (3, 9):
            raise FloatingPointError("Newton-Schulz produced nan or inf (test)")
        return real(G, *a, **k)

    monkeypatch.setattr(ms, "newton_schulz", fails)
    # the pool's threadpoolctl controller knows the libraries loaded when it was made; a fresh one also
    # knows MKL when an earlier test loaded it (refopt.fast.blas), as _blas_counts does
    monkeypatch.setattr(ms._Pool, "controller", None)
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(_blas_counts()) == {2}
        with pytest.raises(FloatingPointError):
            (refopt.update_ if inplace else refopt.update)(rule, refopt.init(rule, x), x, grads[0])
        assert set(_blas_counts()) == {2}
        monkeypatch.setattr(ms._Pool, "leave", classmethod(lambda cls: None))   # negative control
        try:
            with pytest.raises(FloatingPointError):
                refopt.update(rule, refopt.init(rule, x), x, grads[0])
            assert set(_blas_counts()) == {1}
        finally:
            monkeypatch.undo()
            ms._Pool.users, ms._Pool.limiter = 0, None    # the broken pool's bookkeeping, undone


@dataclass(frozen=True)
class _MeetingMuon(Muon):
    """Muon whose whole-tree pre-pass waits until two calls reach it: two threads step at the same time."""

    def prepare(self, ctx, ss, xs, gs, paths):
        try:
            _MEETING.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        return super().prepare(ctx, ss, xs, gs, paths)


_MEETING = threading.Barrier(2)


def test_many_leaves_from_two_threads_share_the_pool():
    """The pure update from two threads at once, on trees of 2 and 3 matrices with a 3-thread BLAS (so
    the calls want pools of different sizes): each thread gets the single-threaded results, nothing
    raises, and the BLAS count is restored at the end (two calls each saving and restoring it could
    leave it at 1; one resizing the pool under the other raised 'cannot schedule new futures after
    shutdown')."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(10)
    trees = [{f"w{i}": rng.standard_normal((5, 4)) for i in range(n)} for n in (2, 3)]
    rule, steps = _MeetingMuon(lr=0.05), 60
    with threadpool_limits(limits=1, user_api="blas"):
        want = []
        for p in trees:
            s = refopt.init(Muon(lr=0.05), p)
            want.append([refopt.update(Muon(lr=0.05), s, p, {k: v * (t + 1) for k, v in p.items()})[0]
                         for t in range(steps)])
    got, errors = [[], []], []

    def work(j):
        p = trees[j]
        s = refopt.init(rule, p)
        try:
            for t in range(steps):
                got[j].append(refopt.update(rule, s, p, {k: v * (t + 1) for k, v in p.items()})[0])
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)
            _MEETING.abort()

    _MEETING.reset()
    with threadpool_limits(limits=3, user_api="blas"):
        threads = [threading.Thread(target=work, args=(j,)) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert set(_blas_counts()) == {3}
    for j in range(2):
        for a, b in zip(got[j], want[j]):
            assert all(np.array_equal(a[k], b[k]) for k in a), j


def _child_step(conn, x, g):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        rule = Muon(lr=0.05)
        out, _ = refopt.update(rule, refopt.init(rule, x), x, g)
        conn.send((out, _blas_counts()))
    conn.close()


def test_many_leaves_in_a_forked_child():
    """A child forked after the parent's pool has threads makes its own pool: its step equals the
    parent's, and its BLAS count is restored after the step."""
    import multiprocessing as mp

    from threadpoolctl import threadpool_limits

    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork on this platform")
    x, grads = _tree(11)
    rule = Muon(lr=0.05)
    with threadpool_limits(limits=2, user_api="blas"):
        want, _ = refopt.update(rule, refopt.init(rule, x), x, grads[0])   # the parent's pool now has threads
        ctx = mp.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child_step, args=(send, x, grads[0]))
        child.start()
        ok = recv.poll(60)
        got, counts = recv.recv() if ok else (None, None)
        child.join(5)
        if child.is_alive():
            child.kill()
    assert ok, "the forked child's step did not finish"
    assert child.exitcode == 0
    assert set(counts) == {2}
    assert all(np.array_equal(got[k], want[k]) for k in x)


def test_many_leaves_step_while_the_interpreter_exits(monkeypatch):
    """A training loop in a thread that outlives the main thread (or a step in an atexit handler) runs
    after concurrent.futures refuses new work ('cannot schedule new futures after interpreter
    shutdown'): the matrices then run in the calling thread, with the same results. Negative control: a
    pool that only submits raises there."""
    import concurrent.futures.thread as cft

    import refopt.linalg._msign as ms

    from threadpoolctl import threadpool_limits

    x, grads = _tree(12)
    rule = Muon(lr=0.05)
    with threadpool_limits(limits=2, user_api="blas"):   # the pool in use, whatever the machine
        want, _ = refopt.update(rule, refopt.init(rule, x), x, grads[0])
        monkeypatch.setattr(cft, "_shutdown", True)    # what threading's exit hook sets for the whole process
        got, _ = refopt.update(rule, refopt.init(rule, x), x, grads[0])
        assert all(np.array_equal(got[k], want[k]) for k in x)
        assert set(_blas_counts()) == {2}
        monkeypatch.setattr(ms._Pool, "run",
                            classmethod(lambda cls, fn, jobs: [cls.executor.submit(fn, *j) for j in jobs]))
        with pytest.raises(RuntimeError, match="interpreter shutdown"):
            refopt.update(rule, refopt.init(rule, x), x, grads[0])


def test_many_leaves_do_not_depend_on_the_blas_thread_count(monkeypatch):
    """The pooled step at a 2-thread BLAS equals the leaf-by-leaf step at one BLAS thread, bit for bit, for a
    float64 300 x 300 matrix (whose products OpenBLAS 0.3.31 rounds differently with 2 threads on SkylakeX:
    the 'same results as one by one' holds for a single-threaded BLAS only). Negative control, where this
    machine's BLAS rounds so: a pool that keeps the BLAS's threads is caught."""
    import types

    from threadpoolctl import threadpool_limits

    import refopt.linalg._msign as ms

    rng = np.random.default_rng(13)
    x = {"big": rng.standard_normal((300, 300)), "small": rng.standard_normal((40, 30))}
    g = {k: rng.standard_normal(v.shape) for k, v in x.items()}
    rule = Muon(lr=0.05)

    def alone(threads):
        with threadpool_limits(limits=threads, user_api="blas"):
            return {k: refopt.update(rule, refopt.init(rule, x[k]), x[k], g[k])[0] for k in x}

    want = alone(1)
    with threadpool_limits(limits=2, user_api="blas"):
        got, _ = refopt.update(rule, refopt.init(rule, x), x, g)
    assert all(np.array_equal(got[k], want[k]) for k in x)
    if not np.array_equal(alone(2)["big"], want["big"]):   # this BLAS rounds differently with 2 threads
        with threadpool_limits(limits=2, user_api="blas"):
            ms._Pool.enter(1)   # the controller made
            monkeypatch.setattr(type(ms._Pool.controller), "limit",
                                lambda self, **k: types.SimpleNamespace(restore_original_limits=lambda: None))
            bad, _ = refopt.update(rule, refopt.init(rule, x), x, g)
        assert not np.array_equal(bad["big"], want["big"])


def test_many_leaves_extra_memory_is_bounded_by_the_chunk(monkeypatch):
    """update_ of 24 matrices of 64 x 64 (float64, 768 KiB in all) in chunks of two matrices allocates at
    its peak (tracemalloc sees numpy's buffers) a fraction of the tree more than the leaf-by-leaf step
    (whose walk packs the small gradients: about one copy of the tree); negative control: one chunk for the whole tree
    (copies of every momentum, input and result at once) is caught."""
    import tracemalloc

    import refopt.fast.walk as fast_walk

    rng = np.random.default_rng(9)
    x = {f"w{i}": rng.standard_normal((64, 64)) for i in range(24)}
    g = {k: rng.standard_normal(v.shape) for k, v in x.items()}
    tree_bytes = sum(v.nbytes for v in x.values())
    rule = Muon(lr=0.01)

    def peak():
        params, state = {k: v.copy() for k, v in x.items()}, refopt.init(rule, x)
        refopt.update_(rule, state, params, g)     # warm: compiled kernels, the walk's caches
        params, state = {k: v.copy() for k, v in x.items()}, refopt.init(rule, x)
        tracemalloc.start()
        refopt.update_(rule, state, params, g)
        p = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return p

    monkeypatch.setattr(fast_walk, "CHUNK_ELEMENTS", 2 * 64 * 64)
    chunked = peak()
    monkeypatch.setattr(fast_walk, "CHUNK_ELEMENTS", 1 << 30)
    whole = peak()
    monkeypatch.setattr(fast_walk, "_BATCHED", [b for b in fast_walk._BATCHED if b[0] is not Muon])
    leaf_by_leaf = peak()
    # a chunk: copies of m, M_t and O_t of two matrices, and the Newton-Schulz buffers of two threads
    assert chunked < leaf_by_leaf + 0.75 * tree_bytes
    assert whole > leaf_by_leaf + 2 * tree_bytes

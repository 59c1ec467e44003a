"""MARS written from Yuan et al. 2024 (Algorithms 1-2, the approximate form) entry by entry in plain Python
floats, on a two-leaf tree where the clip acts on some steps and not on others; closed forms (gamma = 0 without
the clip is AdamW; MARS-Lion moves every entry by lr; a clipped first step); negative controls (no clip, v of the
raw gradient, g_prev holding c, k without beta1 / (1 - beta1), the other first step); bad input; the mapping of
pytorch_optimizer.MARS and its rows against the installed package."""
import math

import numpy as np
import pytest

import refopt
from refopt.rules.mars import MARS
from tree_steps import run


def _tree(seed=4, steps=6, scale=(0.05, 3.0)):
    """Two leaves; the gradients alternate between small (||c|| < 1: no clip) and large (clipped) steps."""
    rng = np.random.default_rng(seed)
    x0 = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    gs = [{k: rng.standard_normal(v.shape) * scale[t % 2] for k, v in x0.items()} for t in range(steps)]
    return x0, gs


def algorithm(x0, gs, lr, beta1, beta2, gamma, eps, wd, max_norm=1.0, kind="adamw", raw=False, eps_root=0.0,
              first="zero", bug=None, eps_max=False):
    """The paper's MARS per entry in Python floats: c = g + gamma beta1/(1 - beta1) (g - g_prev), clipped to
    max_norm by the array's norm, then AdamW (m_hat / (sqrt(v_hat) + eps), or pytorch_optimizer's raw form)
    or sign(m); decoupled decay. Returns params and {m, v, g_prev} per leaf, and whether the clip acted."""
    out, state, clipped = {}, {}, []
    for key, x_init in x0.items():
        n = x_init.size
        x = x_init.ravel().tolist()
        m, v, gp = [0.0] * n, [0.0] * n, [0.0] * n
        for t, g_tree in enumerate(gs, start=1):
            g = g_tree[key].ravel().tolist()
            k = gamma if bug == "k gamma" else gamma * beta1 / (1.0 - beta1)
            if t == 1 and first == "g1":
                k = 0.0
            c = [g[i] + k * (g[i] - gp[i]) for i in range(n)]
            norm = math.sqrt(sum(ci * ci for ci in c))
            if max_norm is not None and norm > max_norm and bug != "no clip":
                c = [ci * max_norm / norm for ci in c]
                clipped.append(True)
            else:
                clipped.append(False)
            gp = list(c) if bug == "keep c" else list(g)
            lr_t = lr
            for i in range(n):
                m[i] = beta1 * m[i] + (1.0 - beta1) * c[i]
                if kind == "lion":
                    u = (m[i] > 0) - (m[i] < 0)
                else:
                    sq = g[i] if bug == "v of g" else c[i]
                    v[i] = beta2 * v[i] + (1.0 - beta2) * sq * sq
                    bc1, bc2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
                    if raw:
                        den = (math.sqrt(v[i] + eps_root) + eps) / math.sqrt(bc2)
                    elif eps_max:
                        den = max(math.sqrt(v[i] / bc2 + eps_root), eps)
                    else:
                        den = math.sqrt(v[i] / bc2 + eps_root) + eps
                    u = m[i] / bc1 / den
                x[i] = x[i] - lr_t * (u + wd * x[i])
        shape = x_init.shape
        out[key] = np.array(x).reshape(shape)
        state[key] = {f: np.array(a).reshape(shape) for f, a in (("m", m), ("v", v), ("g_prev", gp))}
    return out, state, clipped


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


KW = dict(lr=0.01, beta1=0.9, beta2=0.95, gamma=0.2, eps=1e-6, wd=0.05)


def _rule(**kw):
    base = dict(lr=KW["lr"], beta1=KW["beta1"], beta2=KW["beta2"], gamma=KW["gamma"], eps=KW["eps"],
                weight_decay=KW["wd"])
    return MARS(**{**base, **kw})


@pytest.mark.parametrize("kind", ["adamw", "lion"])
@pytest.mark.parametrize("first", ["zero", "g1"])
def test_mars_six_steps_from_the_paper(kind, first):
    x0, gs = _tree()
    x, s = run(_rule(kind=kind, first_step=first), x0, gs)
    want, st, clipped = algorithm(x0, gs, **KW, kind=kind, first=first)
    assert any(clipped) and not all(clipped)                         # the clip acts on some steps only
    for k in x0:
        np.testing.assert_allclose(x[k], want[k], rtol=1e-14, atol=1e-15)
        for f in ("m", "v", "g_prev"):
            np.testing.assert_allclose(getattr(s.leaves[k], f), st[k][f], rtol=1e-14, atol=1e-15)
    bugs = ["no clip", "keep c", "k gamma"] + (["v of g"] if kind == "adamw" else [])
    for bug in bugs:                                                   # negative controls
        assert _gap(algorithm(x0, gs, **KW, kind=kind, first=first, bug=bug)[0], x) > 1e-6, bug
    other = "g1" if first == "zero" else "zero"
    assert _gap(algorithm(x0, gs, **KW, kind=kind, first=other)[0], x) > 1e-6


def test_mars_raw_eps_form_is_pytorch_optimizers_denominator():
    x0, gs = _tree(7)
    x, _ = run(_rule(eps_form="raw", eps_root=1e-15), x0, gs)
    want, _, _ = algorithm(x0, gs, **KW, raw=True, eps_root=1e-15)
    np.testing.assert_allclose(x["w"], want["w"], rtol=1e-14)
    assert _gap(algorithm(x0, gs, **KW)[0], x) > 1e-6          # the paper's form differs


def test_mars_heavyball_forms_previous_c_and_max_eps():
    """previous='c': c_t = g_t + k (g_t - c_{t-1}); eps_form='max': max(sqrt(v_hat), eps) (heavyball's)."""
    x0, gs = _tree(8)
    x, s = run(_rule(previous="c", eps_form="max", max_norm=None), x0, gs)
    want, st, _ = algorithm(x0, gs, **KW, bug="keep c", eps_max=True, max_norm=None)
    for k in x0:
        np.testing.assert_allclose(x[k], want[k], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(s.leaves[k].g_prev, st[k]["g_prev"], rtol=1e-14, atol=1e-15)
    assert _gap(algorithm(x0, gs, **KW, eps_max=True, max_norm=None)[0], x) > 1e-6      # g_{t-1}: differs
    assert _gap(algorithm(x0, gs, **KW, bug="keep c", max_norm=None)[0], x) > 1e-9      # sqrt(v_hat) + eps


def test_mars_without_correction_and_clip_is_adamw():
    """gamma = 0 and max_norm=None: c_t = g_t, so MARS-AdamW is AdamW (m_hat / (sqrt(v_hat) + eps), decoupled
    decay lr lambda); the same rule with the clip is not (the gradients' norms exceed 1)."""
    x0, gs = _tree(2, scale=(2.0, 3.0))
    x, _ = run(_rule(gamma=0.0, max_norm=None), x0, gs)
    adamw = refopt.AdamW(lr=KW["lr"], beta1=KW["beta1"], beta2=KW["beta2"], eps=KW["eps"], weight_decay=KW["wd"])
    y, _ = run(adamw, x0, gs)
    for k in x0:
        np.testing.assert_allclose(x[k], y[k], rtol=1e-14, atol=1e-16)
    z, _ = run(_rule(gamma=0.0), x0, gs)
    assert _gap(z, y) > 1e-6


def test_mars_lion_moves_each_entry_by_lr_and_first_step_clip():
    """MARS-Lion without decay: |x_t - x_{t-1}| = lr wherever m != 0. Step 1 with g_0 = 0: c_1 = (1 + k) g_1;
    with ||c_1|| > 1 the stored m_1 = (1 - beta1) c_1 / ||c_1|| has norm 1 - beta1."""
    x0 = np.array([0.5, -1.0, 2.0, 0.0])
    g = np.array([3.0, -4.0, 1.0, 2.0])
    rule = MARS(lr=0.01, kind="lion", gamma=0.1, beta1=0.9)
    x, s = refopt.update(rule, refopt.init(rule, x0), x0, g)
    np.testing.assert_allclose(np.abs(x - x0), np.full(4, 0.01), rtol=1e-14)   # x +- lr rounds once
    k = 0.1 * 0.9 / 0.1
    c = (1 + k) * g
    np.testing.assert_allclose(s.leaves.m, 0.1 * c / np.linalg.norm(c), rtol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(s.leaves.m), 0.1, rtol=1e-15)
    np.testing.assert_array_equal(s.leaves.g_prev, g)
    np.testing.assert_array_equal(s.leaves.v, 0.0)


def test_mars_float32_stays_float32():
    x0, gs = _tree()
    x32 = {k: v.astype(np.float32) for k, v in x0.items()}
    g32 = [{k: v.astype(np.float32) for k, v in g.items()} for g in gs]
    x, s = run(_rule(), x32, g32)
    assert all(x[k].dtype == np.float32 and s.leaves[k].m.dtype == np.float32 for k in x)
    want, _, _ = algorithm(x0, gs, **KW)
    np.testing.assert_allclose(x["w"], want["w"], rtol=2e-5, atol=1e-6)


def test_mars_direction_under_cautious_and_partition():
    """MARS has an additive direction (Cautious wraps it) and steps inside a Partition as alone."""
    x0, gs = _tree()
    x, _ = run(refopt.Partition(rules={"hidden": _rule(), "other": MARS(lr=0.02, gamma=0.0, max_norm=None)},
                                labels=refopt.matrix_labels), x0, gs)
    a, _ = run(_rule(), {"w": x0["w"]}, [{"w": g["w"]} for g in gs])
    b, _ = run(MARS(lr=0.02, gamma=0.0, max_norm=None), {"b": x0["b"]}, [{"b": g["b"]} for g in gs])
    np.testing.assert_array_equal(x["w"], a["w"])
    np.testing.assert_array_equal(x["b"], b["b"])
    c, _ = run(refopt.Cautious(MARS(gamma=0.2), lr=0.01), x0, gs)
    assert all(np.all(np.isfinite(c[k])) for k in c) and _gap(c, x0) > 0


@pytest.mark.parametrize("kw, match", [
    (dict(lr=-1.0), "lr"), (dict(beta1=1.0), "beta1"), (dict(beta2=-0.1), "beta2"), (dict(gamma=-0.5), "gamma"),
    (dict(eps=0.0), "eps"), (dict(eps_root=-1.0), "eps_root"), (dict(weight_decay=-1.0), "weight_decay"),
    (dict(max_norm=0.0), "max_norm"), (dict(kind="shampoo"), "kind"), (dict(eps_form="torch"), "eps_form"),
    (dict(first_step="x0"), "first_step"), (dict(previous="m"), "previous"), (dict(schedule=3), "schedule")])
def test_mars_bad_hyperparameters_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        MARS(**kw)


def test_mars_non_finite_correction_raises_before_writing():
    """k |g - g_prev| overflowing float64 (gamma huge) is named, with every array left as it was."""
    rule = MARS(gamma=1e300, kind="lion")
    x0 = {"a": np.ones(3), "b": np.ones(2)}
    s = refopt.init(rule, x0)
    x, s = refopt.update_(rule, s, x0, {"a": np.ones(3), "b": np.ones(2)})
    before = ({k: v.copy() for k, v in x.items()}, {k: s.leaves[k].m.copy() for k in x})
    with pytest.raises(FloatingPointError, match=r"at b.*not finite"):
        refopt.update_(rule, s, x, {"a": np.ones(3), "b": np.array([-1e10, 1.0])})
    for k in x:
        np.testing.assert_array_equal(x[k], before[0][k])
        np.testing.assert_array_equal(s.leaves[k].m, before[1][k])


def test_like_pytorch_optimizer_mars():
    r = refopt.like("pytorch_optimizer.MARS", lr=2e-3, gamma=0.1, lr_1d=5e-3, weight_decay_1d=0.01)
    assert isinstance(r, refopt.Partition) and r.labels is refopt.rules.partition.at_least_2d_labels
    h, o = r.rules["hidden"], r.rules["other"]
    assert (h.gamma, h.max_norm, h.eps_form, h.eps_root, h.kind) == (0.1, 1.0, "raw", 1e-15, "adamw")
    assert (o.gamma, o.max_norm, o.beta1, o.beta2, o.weight_decay) == (0.0, None, 0.9, 0.95, 0.01)
    assert o.lr == 2e-3 * (5e-3 / 2e-3)
    assert refopt.like("pytorch_optimizer.MARS", optimize_1d=True, mars_type="lion") == \
        MARS(kind="lion", eps_form="raw", eps_root=1e-15)
    c = refopt.like("pytorch_optimizer.MARS", optimize_1d=True, cautious=True, weight_decay=0.1)
    assert isinstance(c, refopt.Cautious) and c.weight_decay == 0.1 and c.base.weight_decay == 0
    for kw, what in ((dict(mars_type="shampoo"), "bfloat16"), (dict(ams_bound=True), "AMSGrad"),
                     (dict(mars_type="lion", cautious=True), "rescale"), (dict(weight_decay=0.1, fixed_decay=True),
                                                                          "fixed_decay"),
                     (dict(weight_decay=0.1, weight_decouple=False), "L2"), (dict(betas=(0.9, 1.0)), "betas")):
        with pytest.raises(ValueError, match=what):
            refopt.like("pytorch_optimizer.MARS", **kw)


def test_like_heavyball_adamw_mars():
    """heavyball 3.2.1 calls mars_correction(g, old_g, beta1, gamma) as (g, old_g, mars_gamma, beta1): its factor
    beta1 gamma / (1 - gamma) is refopt's k = gamma' beta1 / (1 - beta1) at gamma' = gamma (1 - beta1) / (1 - gamma)."""
    from refopt.conventions.mars import HEAVYBALL, heavyball_gamma
    r = refopt.like("heavyball.AdamW", lr=5e-3, betas=(0.95, 0.98), mars=True, mars_gamma=0.05, eps=1e-6,
                    weight_decay=0.05, storage_dtype="float64")
    assert (r.max_norm, r.eps_form, r.previous, r.eps_root) == (None, "max", "c", 0.0)
    assert math.isclose(r.gamma * r.beta1 / (1 - r.beta1), 0.95 * 0.05 / (1 - 0.05), rel_tol=1e-15)
    assert r.gamma == heavyball_gamma(0.05, 0.95)
    assert math.isclose(HEAVYBALL.match(r)["mars_gamma"], 0.05, rel_tol=1e-14)
    for kw, what in ((dict(mars=False), "mars=True"), (dict(mars=True), "storage_dtype"),
                     (dict(mars=True, storage_dtype="float64", caution=True), "compares the update with c_t"),
                     (dict(mars=True, storage_dtype="float64", mars_gamma=1.0), r"\[0, 1\)"),
                     (dict(mars=True, storage_dtype="float64", warmup_steps=10), "warmup_steps")):
        with pytest.raises(ValueError, match=what):
            refopt.like("heavyball.AdamW", **kw)


def _mars_presets(misconfigured=False, peer="pytorch_optimizer"):
    from crosscheck_helpers import presets
    return [p for p in presets(peer, misconfigured) if p.family == "mars"]


@pytest.mark.parametrize("preset", _mars_presets(), ids=[p.name for p in _mars_presets()])
def test_pytorch_optimizer_mars_rows_agree(preset):
    pytest.importorskip("pytorch_optimizer", reason="peer pytorch_optimizer not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_passes
    r = assert_passes(preset)
    assert r.params_rel <= 1e-12 and r.state_rel <= 1e-12
    assert_passes(preset, "mlp")
    assert_passes(preset, dtype="float32")


@pytest.mark.parametrize("preset", _mars_presets(True), ids=[p.name for p in _mars_presets(True)])
def test_pytorch_optimizer_mars_wrong_row_is_caught(preset):
    pytest.importorskip("pytorch_optimizer", reason="peer pytorch_optimizer not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_caught
    assert_caught(preset)


class NumpyMARS:
    """MARS-AdamW in numpy over a list of arrays (the paper's denominator), with one planted bug."""

    def __init__(self, lr=0.01, beta1=0.9, beta2=0.95, gamma=0.2, eps=1e-6, bug=None):
        self.lr, self.b1, self.b2, self.gamma, self.eps, self.bug = lr, beta1, beta2, gamma, eps, bug

    def init(self, params):
        return {"t": 0, "m": [np.zeros_like(x) for x in params], "v": [np.zeros_like(x) for x in params],
                "g_prev": [np.zeros_like(x) for x in params]}

    def step(self, s, params, grads):
        t, b1, b2 = s["t"] + 1, self.b1, self.b2
        out, new = [], {"t": t, "m": [], "v": [], "g_prev": []}
        for x, g, m, v, gp in zip(params, grads, s["m"], s["v"], s["g_prev"]):
            c = g + self.gamma * b1 / (1 - b1) * (g - gp)
            n = np.linalg.norm(c)
            if n > 1 and self.bug != "no clip":
                c = c / n
            m = b1 * m + (1 - b1) * c
            sq = g if self.bug == "v of g" else c
            v = b2 * v + (1 - b2) * sq * sq
            out.append(x - self.lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + self.eps))
            for k, a in (("m", m), ("v", v), ("g_prev", g)):
                new[k].append(a)
        return out, new


@pytest.mark.parametrize("bug, name", [("no clip", "no clip"), ("v of g", "v of the raw gradient")])
def test_a_wrong_mars_is_named(bug, name):
    from refopt.crosscheck.plugin import check_impl
    rule = "MARS(lr=0.01, beta1=0.9, beta2=0.95, gamma=0.2, eps=1e-6)"
    r = check_impl(NumpyMARS(bug=bug), rule, framework="numpy", steps=10, problems=("stream", "quadratic"))
    assert not r.agree and r.best.name == name and r.best.reproduces, r.report()
    # negative control: the same implementation without the bug agrees
    assert check_impl(NumpyMARS(), rule, framework="numpy", steps=10, problems=("stream", "quadratic")).agree


_HEAVYBALL_ROWS, _HEAVYBALL_WRONG = _mars_presets(peer="heavyball"), _mars_presets(True, "heavyball")


@pytest.mark.parametrize("preset", _HEAVYBALL_ROWS, ids=[p.name for p in _HEAVYBALL_ROWS])
def test_heavyball_mars_rows_agree(preset):
    """float64 only: with storage_dtype='float64' heavyball keeps float32 params' state in float64 (5.8e-5 from
    a float32 refopt run after 50 steps, measured), so a float32 comparison is not like for like."""
    pytest.importorskip("heavyball", reason="peer heavyball not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_passes
    assert assert_passes(preset).params_rel <= 1e-12
    assert_passes(preset, "mlp")


@pytest.mark.parametrize("preset", _HEAVYBALL_WRONG, ids=[p.name for p in _HEAVYBALL_WRONG])
def test_heavyball_mars_with_the_papers_factor_is_caught(preset):
    pytest.importorskip("heavyball", reason="peer heavyball not installed: pip install -e .[peers]")
    from crosscheck_helpers import assert_caught
    assert_caught(preset)

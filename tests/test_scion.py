"""Scion written from Pethick et al. 2025 in numpy (numpy's SVD polar factor for the spectral oracle): the first
steps of uScion for each oracle, the Frank-Wolfe step's closed form on a constant gradient (x_t = c^t x_0 + (1 -
c^t) (-rho lmo(g)), c = 1 - lr), torch's two lerp forms; negative controls (the momentum weighing the average, no
spectral shape scale, the transposed layout, the decay after the step); bad input; the mapping of
pytorch_optimizer.SCION and its rows through docs/factories/scion.py."""

import numpy as np
import pytest

import refopt
from refopt.rules.scion import Scion
from tree_steps import last_params, run

NEEDS_PEER = "peer pytorch_optimizer not installed: pip install -e .[peers]"


def _polar(M):
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt


def _stream(shape, steps=6, seed=7):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) for _ in range(steps)]


def algorithm(x0, gs, lr, alpha, rho, wd, kind):
    """uScion from the paper on one array: d = (1 - alpha) d + alpha g, x = (1 - lr wd) x - lr rho lmo(d)."""
    x, d = x0.copy(), np.zeros_like(x0)
    for g in gs:
        d = (1 - alpha) * d + alpha * g
        if kind == "spectral":
            u = _polar(d) * np.sqrt(x0.shape[1] / x0.shape[0])
        elif kind == "sign":
            u = np.sign(d) / x0.shape[0]
        else:
            u = d / (np.sqrt(np.mean(d * d)) + 1e-8)
        x = (1 - lr * wd) * x - lr * rho * u
    return x


@pytest.mark.parametrize("shape, lmo, kind", [((6, 3), "auto", "spectral"), ((3, 7), "spectral", "spectral"),
                                              ((4, 5), "sign", "sign"), ((9,), "auto", "bias_rms")])
def test_uscion_matches_the_paper(shape, lmo, kind):
    rule = Scion(lr=0.02, momentum=0.3, scale=2.0, weight_decay=0.1, lmo=lmo, msign="svd")
    x0, gs = _stream(shape)
    x, s = run(rule, x0, gs)
    np.testing.assert_allclose(x, algorithm(x0, gs, 0.02, 0.3, 2.0, 0.1, kind), rtol=1e-13, atol=1e-15)


def test_the_frank_wolfe_step_closed_form():
    """momentum 1 (d = g) and a constant g: x_t = c^t x_0 - (1 - c^t) rho s polar(g), c = 1 - lr, the vertex of
    the ball of radius rho the iterates converge to."""
    x0, (g,) = _stream((5, 3), steps=1)
    rule = Scion(lr=0.1, momentum=1.0, scale=3.0, constraint=True, msign="svd")
    x, _ = run(rule, x0, [g] * 7)
    c = 0.9 ** 7
    np.testing.assert_allclose(x, c * x0 - (1 - c) * 3.0 * np.sqrt(3 / 5) * _polar(g), rtol=1e-13, atol=1e-15)


def test_torchs_two_lerp_forms():
    """alpha < 0.5: d + alpha (g - d); alpha >= 0.5: g - (1 - alpha)(g - d) -- bit for bit."""
    x0, gs = _stream((4,), steps=2)
    for alpha in (0.3, 0.7):
        d = np.zeros(4)
        for g in gs:
            d = d + alpha * (g - d) if alpha < 0.5 else g - (g - d) * (1 - alpha)
        _, s = run(Scion(lr=0.01, momentum=alpha), x0, gs)
        np.testing.assert_array_equal(s.leaves.d, d)


@pytest.mark.parametrize("switch", [dict(alpha_of="old"), dict(shape_scale=False), dict(layout="transposed"),
                                    dict(decay="after")])
def test_each_convention_changes_the_trajectory(switch):
    from refopt.conventions.scion import ScionOracle
    from refopt.testing.adapters import RuleAdapter
    rule = Scion(lr=0.02, momentum=0.3, scale=2.0, weight_decay=0.1)
    x0, gs = _stream((6, 3), steps=8)
    ours = last_params(RuleAdapter(rule), x0, gs)
    np.testing.assert_allclose(last_params(ScionOracle(rule), x0, gs), ours, rtol=0, atol=1e-13)
    assert np.abs(last_params(ScionOracle(rule, **switch), x0, gs) - ours).max() > 1e-4


def test_scion_bad_input():
    for kw, match in [(dict(lr=-1.0), "lr"), (dict(momentum=0.0), "momentum"), (dict(momentum=1.5), "momentum"),
                      (dict(scale=0.0), "scale"), (dict(constraint=True, weight_decay=0.1), "weight_decay"),
                      (dict(lmo="col"), "lmo"), (dict(spectral_scale="x"), "spectral_scale"),
                      (dict(eps=0.0), "eps"), (dict(ns_steps=0), "ns_steps"), (dict(max_scale=1), "max_scale")]:
        with pytest.raises(ValueError, match=match):
            Scion(**kw)
    with pytest.raises(ValueError, match=r"'sign' oracle takes matrices; the parameter at b"):
        refopt.init(Scion(lmo="sign"), {"b": np.zeros(3)})
    with pytest.raises(ValueError, match=r"'bias_rms' oracle takes 0-D and 1-D arrays; the parameter at w"):
        refopt.init(Scion(lmo="bias_rms"), {"w": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="conv"):
        refopt.init(Scion(), {"conv": np.zeros((3, 3, 2, 4))})


def test_direction_and_float32():
    rule = Scion(lr=0.02, momentum=0.5, scale=2.0)
    x0 = np.random.default_rng(0).standard_normal((4, 3))
    g = np.random.default_rng(1).standard_normal((4, 3))
    s = refopt.init(rule, x0)
    u, _ = refopt.direction(rule, s, x0, g)
    new, _ = refopt.update(rule, s, x0, g)
    np.testing.assert_allclose(new, x0 - 0.02 * u, rtol=1e-15, atol=1e-17)
    x, s = run(rule, x0.astype(np.float32), [g.astype(np.float32)] * 3)
    assert x.dtype == s.leaves.d.dtype == np.float32


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def _factory():
    from crosscheck_helpers import load_factory
    return load_factory("scion")


def test_like_pytorch_optimizer_scion():
    assert refopt.like("pytorch_optimizer.SCION") == Scion()
    assert refopt.like("pytorch_optimizer.SCION", norm_type=2, norm_kwargs=dict(normalize=False, num_steps=6)) \
        == Scion(lmo="spectral", spectral_scale="fan_out", ns_steps=6)
    assert refopt.like("pytorch_optimizer.SCION", norm_type=4, norm_kwargs=dict(zero_init=True)) == Scion(lmo="sign")
    # the package ignores weight_decay with constraint=True
    assert refopt.like("pytorch_optimizer.SCION", constraint=True, weight_decay=0.1) == Scion(constraint=True)
    for kw, match in [(dict(norm_type=3), "norm_type"), (dict(norm_type=6), "norm_type"),
                      (dict(weight_decouple=False), "weight_decouple"), (dict(momentum=0.0), "momentum"),
                      (dict(norm_type=2, norm_kwargs=dict(eps=1.0)), "norm_kwargs"), (dict(maximize=True), "maximize")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.SCION", **kw)


def test_pytorch_optimizer_scion_through_the_factory_and_as_shipped():
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from refopt.crosscheck.plugin import check_impl
    f = _factory()
    kw = dict(lr=0.02, momentum=0.3, scale=2.0, weight_decay=0.1)
    rule = refopt.like("pytorch_optimizer.SCION", **kw)
    r = check_impl(f.scion, rule, kwargs=kw, framework="torch", problems=("stream", "gpt"), diagnose=False)
    assert r.agree and all(p.tier == "exact" and p.params_rel <= 1e-12 for p in r.problems), r.report()
    # the package as it ships: bfloat16 Newton-Schulz, the tier torch.optim.Muon has (update 4.9e-2 <= 0.06)
    r = check_impl(f.scion_bfloat16, rule, kwargs=kw, framework="torch", problems=("stream",), diagnose=False)
    assert r.agree and r.problems[0].tier.startswith("bfloat16") and r.problems[0].params_rel > 1e-6, r.report()
    # that tier is not granted to the float64 iteration: a 2 % lr error is caught there
    r = check_impl(f.scion, rule, kwargs={**kw, "lr": 0.0204}, framework="torch", problems=("stream",),
                   diagnose=False)
    assert not r.agree, r.report()
    import pytorch_optimizer.optimizer.scion as module
    from pytorch_optimizer.optimizer.utils.matrix import zero_power_via_newton_schulz_5
    assert module.zero_power_via_newton_schulz_5 is zero_power_via_newton_schulz_5     # restored after the steps


class NumpyScion:
    """uScion (auto oracles, exact msign) over a list of arrays in numpy, with one planted bug: 'momentum of the
    average' (d = m d + (1 - m) g with the package's momentum m, the usual convention)."""

    def __init__(self, lr=0.02, m=0.3, rho=2.0, bug=None):
        self.lr, self.m, self.rho, self.bug = lr, m, rho, bug

    def init(self, params):
        return [np.zeros_like(x) for x in params]

    def step(self, s, params, grads):
        a = 1 - self.m if self.bug == "momentum of the average" else self.m
        out, new = [], []
        for x, g, d in zip(params, grads, s):
            d = (1 - a) * d + a * g
            if d.ndim == 2:
                u = _polar(d) * np.sqrt(d.shape[1] / d.shape[0])
            else:
                u = d / (np.sqrt(np.mean(d * d)) + 1e-8)
            out.append(x - self.lr * self.rho * u)
            new.append(d)
        return out, new


def test_a_scion_with_the_usual_momentum_is_named():
    from refopt.crosscheck.plugin import check_impl
    rule = "Scion(lr=0.02, momentum=0.3, scale=2.0, msign='svd')"
    ok = check_impl(NumpyScion(), rule, framework="numpy", steps=10, problems=("stream",))
    assert ok.agree, ok.report()
    r = check_impl(NumpyScion(bug="momentum of the average"), rule, framework="numpy", steps=10, problems=("stream",))
    assert not r.agree and r.best.name == "momentum weighs the average" and r.best.reproduces, r.report()


def _scion_presets(misconfigured=False):
    from crosscheck_helpers import presets
    return presets("pytorch_optimizer", misconfigured, family="scion")


@pytest.mark.parametrize("preset", _scion_presets(), ids=[p.name for p in _scion_presets()])
def test_pytorch_optimizer_scion_rows_agree(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_passes
    assert assert_passes(preset).params_rel <= 1e-12


@pytest.mark.parametrize("preset", _scion_presets(True), ids=[p.name for p in _scion_presets(True)])
def test_pytorch_optimizer_scion_wrong_rows_are_caught(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_caught
    assert_caught(preset)

"""Polyak SGD, Momo and MomoAdam, the rules that take the loss value (``value=``): closed forms of the first
step, the paper's algorithms restated here over a two-leaf quadratic, the inputs' validation (a missing,
unexpected or non-finite value raises before anything is written), the rule-wide state checkpointed and
resumed bit for bit, the value passed through wrappers and a Partition, and the cross-check against optax
with the loss recorded along the run (skipped on the stream, which has no loss). Negative controls: a step per
array, optax's decay form, optax's scaled Polyak step."""
import math

import numpy as np
import pytest

import refopt
from crosscheck_helpers import assert_caught, assert_passes, ids, presets
from refopt import checkpoint
from refopt.rules.polyak import MomoGlobal

H = {"w": np.linspace(0.5, 3.0, 12).reshape(3, 4), "b": np.linspace(0.2, 1.0, 5)}


def _x0(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}


def loss_and_grad(x, f0=0.0):
    """f = f0 + 1/2 sum h x^2 over both leaves, g = h x."""
    f = f0 + 0.5 * sum(float(np.sum(H[k] * x[k] ** 2)) for k in x)
    return f, {k: H[k] * x[k] for k in x}


def run(rule, x, steps, f0=0.0, inplace=False):
    s = refopt.init(rule, x)
    for _ in range(steps):
        f, g = loss_and_grad(x, f0)
        x, s = (refopt.update_ if inplace else refopt.update)(rule, s, x, g, value=f)
    return x, s


def _n2(t):
    return sum(float(np.sum(a * a)) for a in t.values())


def _dot(a, b):
    return sum(float(np.sum(a[k] * b[k])) for k in a)


def _gap(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


# ---- the algorithms, restated from the papers --------------------------------------------------------------
def polyak(x, steps, lr=1.0, max_lr=1.0, f_min=0.0, eps=0.0, plus=False, per_leaf=False, f0=0.0):
    for _ in range(steps):
        f, g = loss_and_grad(x, f0)
        gap = max(f - f_min, 0.0) if plus else f - f_min
        if per_leaf:
            s = {k: min(gap / (float(np.sum(g[k] ** 2)) + eps), max_lr) for k in x}
        else:
            s = dict.fromkeys(x, min(gap / (_n2(g) + eps), max_lr))
        x = {k: x[k] - lr * s[k] * g[k] for k in x}
    return x


def momo(x, steps, lr=1.0, beta=0.9, lb=0.0, wd=0.0, adapt=False, form="prox", f0=0.0):
    fbar = gam = 0.0
    d = {k: np.zeros_like(v) for k, v in x.items()}
    lb0 = lb
    for t in range(1, steps + 1):
        f, g = loss_and_grad(x, f0)
        b = 0.0 if t == 1 else beta
        fbar, gam = b * fbar + (1 - b) * f, b * gam + (1 - b) * _dot(g, x)
        d = {k: b * d[k] + (1 - b) * g[k] for k in x}
        c = 1 + lr * wd
        if adapt:
            cap = c * (fbar - gam) + _dot(d, x)
            if cap < c * lb:
                lb = max(cap / (2 * c), lb0)
        tau = min(lr, max(c * (fbar - lb - gam) + _dot(d, x), 0.0) / _n2(d))
        if adapt:
            lb = max(fbar + _dot(d, x) - gam - tau * _n2(d) / 2, lb0)
        if form == "prox":
            x = {k: (x[k] - tau * d[k]) / c for k in x}
        else:
            x = {k: x[k] / c - tau * d[k] for k in x}
    return x


def momo_adam(x, steps, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    fbar = gam = 0.0
    m = {k: np.zeros_like(v) for k, v in x.items()}
    v = {k: np.zeros_like(a) for k, a in x.items()}
    for t in range(1, steps + 1):
        f, g = loss_and_grad(x)
        fbar, gam = b1 * fbar + (1 - b1) * f, b1 * gam + (1 - b1) * _dot(g, x)
        m = {k: b1 * m[k] + (1 - b1) * g[k] for k in x}
        v = {k: b2 * v[k] + (1 - b2) * g[k] ** 2 for k in x}
        D = {k: np.sqrt(v[k] / (1 - b2 ** t)) + eps for k in x}
        rho, c = 1 - b1 ** t, 1 + lr * wd
        u = {k: m[k] / D[k] for k in x}
        tau = min(lr / rho, max(c * (fbar - gam) + _dot(m, x), 0.0) / _dot(m, u))
        x = {k: (x[k] - tau * u[k]) / c for k in x}
    return x


# ---- closed forms ------------------------------------------------------------------------------------------
def test_polyak_first_step_on_a_quadratic_with_h_one_halves_x():
    """f = 1/2 ||x||^2, f* = 0: s = f / ||g||^2 = 1/2 exactly, so x_1 = x_0 / 2 (and Momo's first step, d = g,
    is the same Polyak step capped at lr)."""
    x0 = np.array([3.0, -1.0, 0.5])
    f = 0.5 * float(x0 @ x0)
    for rule in (refopt.PolyakSGD(), refopt.Momo(), refopt.Momo(lr=0.2)):
        x1, _ = refopt.update(rule, refopt.init(rule, x0), x0, x0.copy(), value=f)
        want = x0 - min(0.5, rule.lr) * x0
        assert np.array_equal(x1, want), (rule, x1, want)


def test_polyak_zero_gradient_is_no_step():
    x0 = np.array([1.0, 2.0])
    rule = refopt.PolyakSGD()
    x1, _ = refopt.update(rule, refopt.init(rule, x0), x0, np.zeros(2), value=3.0)
    assert np.array_equal(x1, x0)
    rule = refopt.Momo()
    x1, _ = refopt.update(rule, refopt.init(rule, x0), x0, np.zeros(2), value=3.0)
    assert np.array_equal(x1, x0)


@pytest.mark.parametrize("kw", [dict(), dict(max_lr=0.3, f_min=0.1, eps=1e-3), dict(lr=0.5, f_min=2.0, plus=True)])
def test_polyak_from_the_algorithm(kw):
    x0 = _x0(1)
    rkw = dict(kw)
    if rkw.pop("plus", False):
        rkw["variant"] = "sps+"
    x, _ = run(refopt.PolyakSGD(**rkw), x0, 15, f0=0.05)
    want = polyak(x0, 15, f0=0.05, **kw)
    assert _gap(x, want) <= 1e-14 * max(1.0, max(float(np.max(np.abs(v))) for v in want.values()))
    assert _gap(polyak(x0, 15, f0=0.05, per_leaf=True, **kw), x) > 1e-3     # negative control: a step per array


@pytest.mark.parametrize("kw", [dict(), dict(lr=0.5, beta=0.8, wd=0.05), dict(wd=0.05, adapt=True, lb=0.01),
                                dict(wd=0.1, form="x")])
def test_momo_from_the_algorithm(kw):
    x0 = _x0(2)
    rkw = {{"wd": "weight_decay", "adapt": "adapt_lower_bound", "lb": "lower_bound", "form": "decay_form"}.get(k, k): v
           for k, v in kw.items()}
    x, s = run(refopt.Momo(**rkw), x0, 15, f0=0.3)
    want = momo(x0, 15, f0=0.3, **kw)
    assert _gap(x, want) <= 1e-13
    assert isinstance(s.glob, MomoGlobal) and s.glob.f_avg > 0.3
    if kw.get("wd"):       # negative control: the other decay form
        other = "x" if kw.get("form", "prox") == "prox" else "prox"
        assert _gap(momo(x0, 15, f0=0.3, **{**kw, "form": other}), x) > 1e-4


def test_momo_adam_from_the_algorithm():
    x0 = _x0(3)
    x, _ = run(refopt.MomoAdam(lr=0.05, weight_decay=0.1), x0, 20)
    want = momo_adam(x0, 20, lr=0.05, wd=0.1)
    assert _gap(x, want) <= 1e-13
    assert _gap(momo_adam(x0, 20, lr=0.05, wd=0.1, b2=0.99), x) > 1e-6     # negative control: another beta2


def test_the_lower_bound_moves_only_when_adapted_and_never_below_its_start():
    _, s = run(refopt.Momo(adapt_lower_bound=True, lower_bound=0.1), _x0(4), 30, f0=0.3)
    assert s.glob.lb > 0.1
    _, s = run(refopt.Momo(lower_bound=0.1), _x0(4), 30, f0=0.3)
    assert s.glob.lb == 0.1


# ---- the API: inputs, purity, in place, the fast walk, checkpoints -----------------------------------------
@pytest.mark.parametrize("make", [lambda: refopt.PolyakSGD(), lambda: refopt.Momo(weight_decay=0.1),
                                  lambda: refopt.MomoAdam(adapt_lower_bound=True)])
def test_update_and_update_in_place_and_reading_path_bit_identical(make):
    rule, x0 = make(), _x0(5)
    a, sa = run(rule, {k: v.copy() for k, v in x0.items()}, 6)
    b, sb = run(rule, {k: v.copy() for k, v in x0.items()}, 6, inplace=True)
    with refopt.fast.reading_path():
        c, sc = run(rule, {k: v.copy() for k, v in x0.items()}, 6)
    for k in a:
        assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k])
    assert sa.glob == sb.glob == sc.glob


def test_missing_unexpected_and_bad_values_raise_before_writing():
    rule, x = refopt.Momo(), _x0(6)
    s = refopt.init(rule, x)
    _, g = loss_and_grad(x)
    before = {k: v.copy() for k, v in x.items()}
    with pytest.raises(TypeError, match="needs the input value="):
        refopt.update_(rule, s, x, g)
    with pytest.raises(TypeError, match="takes no input 'closure'"):
        refopt.update_(rule, s, x, g, value=1.0, closure=lambda: 1.0)
    with pytest.raises(FloatingPointError, match="value = nan is not finite"):
        refopt.update_(rule, s, x, g, value=float("nan"))
    for bad in (True, np.ones(2), "1.0", None):
        with pytest.raises(TypeError):
            refopt.update_(rule, s, x, g, value=bad)
    assert all(np.array_equal(before[k], x[k]) for k in x)       # nothing written
    adam = refopt.Adam()
    with pytest.raises(TypeError, match="Adam takes no input 'value' \\(it takes the gradients only"):
        refopt.update(adam, refopt.init(adam, x), x, g, value=1.0)
    # a 0-d array and a numpy scalar are real numbers
    for ok in (np.float32(1.5), np.array(1.5), 2):
        refopt.update(rule, s, x, g, value=ok)


def test_direction_takes_the_value_and_matches_the_step():
    rule, x = refopt.Momo(lr=0.5), _x0(7)
    s = refopt.init(rule, x)
    f, g = loss_and_grad(x)
    u, _ = refopt.direction(rule, s, x, g, value=f)
    x1, _ = refopt.update(rule, s, x, g, value=f)
    assert _gap(x1, {k: x[k] - 0.5 * u[k] for k in x}) <= 1e-15


def test_rule_wide_state_checkpoint_resume_bit_identical(tmp_path):
    rule = refopt.MomoAdam(lr=0.05, weight_decay=0.1, adapt_lower_bound=True)
    x, s = run(rule, _x0(8), 4)
    path = str(tmp_path / "ck")
    checkpoint.save(path, x, s, rule)
    x2, s2, rule2 = checkpoint.load(path)[:3]
    assert s2.glob == s.glob and type(s2.glob) is MomoGlobal
    f, g = loss_and_grad(x)
    xa, sa = refopt.update(rule, s, x, g, value=f)
    xb, sb = refopt.update(rule2, s2, x2, g, value=f)
    assert all(np.array_equal(xa[k], xb[k]) for k in xa) and sa.glob == sb.glob


def test_bad_global_state_and_hyperparameters():
    rule, x = refopt.Momo(), _x0(9)
    s = refopt.init(rule, x)
    f, g = loss_and_grad(x)
    for bad in (MomoGlobal(float("nan"), 0.0, 0.0), (0.0, 0.0, 0.0), None):
        with pytest.raises(ValueError, match="global state"):
            refopt.update(rule, s._replace(glob=bad), x, g, value=f)
    for make, kw in [(refopt.PolyakSGD, dict(max_lr=0.0)), (refopt.PolyakSGD, dict(variant="sps++")),
                     (refopt.PolyakSGD, dict(eps=-1.0)), (refopt.PolyakSGD, dict(f_min=math.inf)),
                     (refopt.Momo, dict(beta=1.0)), (refopt.Momo, dict(decay_form="l2")),
                     (refopt.Momo, dict(adapt_lower_bound=1)), (refopt.MomoAdam, dict(eps=0.0)),
                     (refopt.MomoAdam, dict(beta2=-0.1)), (refopt.Momo, dict(weight_decay=-0.1))]:
        with pytest.raises(ValueError):
            make(**kw)


def test_wrappers_and_partition_pass_the_value_on():
    """ClipByGlobalNorm(Momo) is Momo on the clipped gradients; a Partition gives each group's Momo the value
    (each group its own step size, as optax's multi_transform)."""
    x0 = _x0(10)
    clip = refopt.ClipByGlobalNorm(refopt.Momo(), max_norm=1e6)
    a, _ = run(clip, x0, 5)
    b, _ = run(refopt.Momo(), x0, 5)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    part = refopt.Partition({"w": refopt.Momo(), "b": refopt.PolyakSGD()}, lambda path, x: path)
    assert part.inputs == ("value",)
    x, s = run(part, x0, 3)
    assert isinstance(s.glob["w"], MomoGlobal) and s.glob["b"] is None
    assert _gap(x, b) > 1e-6


def test_the_loss_scaled_with_the_gradients_leaves_an_uncapped_polyak_step():
    """The invariance properties hand a rule that takes the loss a drawn value per step, scaled by c with the
    gradients: with a cap that never binds the Polyak step is invariant; with one that always binds it is plain
    SGD (negative control)."""
    from refopt.testing.adapters import RuleAdapter
    from refopt.testing.properties import gradient_scale_invariance

    assert gradient_scale_invariance(RuleAdapter(refopt.PolyakSGD(max_lr=1e9)), max_examples=6, rtol=1e-10).holds
    assert gradient_scale_invariance(RuleAdapter(refopt.PolyakSGD(max_lr=1e-9)), max_examples=6).holds is False


# ---- the cross-check: the loss recorded along the run and handed to optax ----------------------------------
def test_the_problems_with_a_loss_carry_its_value():
    from refopt.crosscheck.problems import make_problem

    for name in ("quadratic", "mlp", "gpt"):
        prob = make_problem(name)
        g = prob.grad(prob.leaves, 1)
        assert prob.inputs == ("value", "closure") and math.isfinite(g.inputs["value"]) and g.inputs["value"] > 0
    # the value is the loss the gradient belongs to: a central difference (exact on a quadratic up to rounding)
    q = make_problem("quadratic")
    g = q.grad(q.leaves, 1)
    v = [np.random.default_rng(1).standard_normal(x.shape) for x in q.leaves]
    e = 1e-3
    fp = q.grad([x + e * d for x, d in zip(q.leaves, v)], 1).inputs["value"]
    fm = q.grad([x - e * d for x, d in zip(q.leaves, v)], 1).inputs["value"]
    slope = sum(float(np.sum(gi * d)) for gi, d in zip(g, v))
    assert abs((fp - fm) / (2 * e) - slope) <= 1e-9 * abs(slope)
    assert make_problem("stream").inputs == () and make_problem("stream").grad(None, 1).inputs == {}


def test_a_stream_run_is_skipped_with_the_reason():
    from refopt.crosscheck.presets import PRESETS
    from refopt.crosscheck.run import run_preset

    p = next(p for p in PRESETS if p.name == "optax.contrib.momo")
    r = run_preset(p, "stream")
    assert r.status == "skip" and "stream" in r.message


def test_crosscheck_against_optax_and_its_diagnosis():
    pytest.importorskip("optax", reason="peer optax not installed: pip install jax==0.10.2 jaxlib==0.10.2 "
                                        "optax==0.2.8")
    import optax

    from refopt.crosscheck.plugin import check_impl

    r = check_impl(optax.contrib.momo, 'like("optax.contrib.momo", weight_decay=0.05)', {"weight_decay": 0.05},
                   steps=30, problems=("stream", "quadratic", "mlp"))
    assert r.exit_code == 0 and [p for p, _ in r.skipped] == ["stream"], r.report()
    # negative controls: the paper's proximal decay against optax's, optax's scaled Polyak step
    r = check_impl(optax.contrib.momo, "Momo(weight_decay=0.05)", {"weight_decay": 0.05}, steps=30,
                   problems=("quadratic",))
    assert r.exit_code == 1 and "weight decay as x" in r.diagnosis_line(), r.report()
    r = check_impl(optax.polyak_sgd, "PolyakSGD(lr=0.5, max_lr=100)", {"scaling": 0.5, "max_learning_rate": 100.0},
                   steps=20, problems=("quadratic",))
    assert r.exit_code == 1 and "Polyak step of the scaled update" in r.diagnosis_line(), r.report()
    with pytest.raises(ValueError, match="scaling=0.5 cannot be reproduced"):
        refopt.like("optax.polyak_sgd", scaling=0.5)


# ---- the authors' momo-opt (torch): the paper's proximal decay ---------------------------------------------
MOMO_OPT = presets("momo")
MOMO_OPT_WRONG = presets("momo", misconfigured=True)
NEEDS_MOMO = "peer momo-opt not installed: pip install torch==2.13.0 && pip install momo-opt==0.1.0"


@pytest.mark.parametrize("preset", MOMO_OPT, ids=ids(MOMO_OPT))
@pytest.mark.parametrize("problem,dtype", [("quadratic", "float64"), ("gpt", "float64"), ("mlp", "float32")])
def test_the_authors_momo_opt_agrees(preset, problem, dtype):
    pytest.importorskip("momo", reason=NEEDS_MOMO)
    assert_passes(preset, problem, dtype)


@pytest.mark.parametrize("preset", MOMO_OPT_WRONG, ids=ids(MOMO_OPT_WRONG))
def test_momo_opt_wrong_presets_are_caught(preset):
    pytest.importorskip("momo", reason=NEEDS_MOMO)
    assert_caught(preset, "mlp", factor=100.0)


def test_momo_opt_through_the_torch_closure_and_the_diagnosis():
    """The torch convention: the loss reaches the package's step(closure) (a closure returning it); divide=False
    against the proximal rule is named as AdamW's decay."""
    pytest.importorskip("momo", reason=NEEDS_MOMO)
    import momo

    from refopt.crosscheck.plugin import check_impl

    r = check_impl(momo.Momo, 'like("momo.Momo", weight_decay=0.05)', {"weight_decay": 0.05}, steps=30,
                   problems=("quadratic", "mlp"))
    assert r.exit_code == 0, r.report()
    r = check_impl(momo.MomoAdam, "MomoAdam(weight_decay=0.05)", {"weight_decay": 0.05, "divide": False}, steps=30,
                   problems=("quadratic",))
    assert r.exit_code == 1 and "weight decay as adamw" in r.diagnosis_line(), r.report()

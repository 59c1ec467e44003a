"""Weight averaging (post 004, eq. (2)): PITFALLS B16, untouched trajectory, plain-numpy oracles."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import refopt
from refopt.rules.adam import Adam
from refopt.rules.averaging import EMA, Average
from refopt.rules.hyperball import Hyperball
from refopt.rules.sgd import SGD
from test_hyperball import AdamOracle, SGDOracle, grad_seq, rel_err, tree_params


def feed(rule, x0, values):
    """Drive a scalar parameter through ``values`` (SGD(lr=1) with g = x - v lands exactly on v) and
    return the evaluation weights after each step."""
    x = np.array([x0])
    state = refopt.init(rule, x)
    out = []
    for v in values:
        x, state = refopt.update(rule, state, x, x - v)
        assert x[0] == v
        out.append(float(refopt.eval_params(rule, state, x)[0]))
    return out


# ---- PITFALLS B16 ----------------------------------------------------------------------------------

def test_b16_uniform_average_is_the_mean_with_1_over_t():
    assert feed(Average(SGD(lr=1.0)), 10.0, [10.0, 10.0, 4.0]) == [10.0, 10.0, 8.0]   # not 8.5 (1/(t+1))


def test_b16_debiased_ema():
    got = feed(EMA(SGD(lr=1.0), decay=0.9), 10.0, [10.0, 10.0, 4.0])
    assert got == [10.0, 10.0, 7.7859778597785985]
    assert got[0] != 5.2631578947368425                      # the off-by-one debias of nanochat #818


def test_b16_param_init_ema():
    assert feed(EMA(SGD(lr=1.0), decay=0.9, debias=False), 10.0, [10.0, 10.0, 4.0]) == [10.0, 10.0, 9.4]


def test_param_init_ema_starts_from_the_initial_params():
    """debias=False starts from x_0 (timm ModelEmaV2); from x_0 = 0 it is the raw zero-init EMA row."""
    got = feed(EMA(SGD(lr=1.0), decay=0.9, debias=False), 0.0, [10.0, 10.0, 4.0])
    np.testing.assert_allclose(got, [1.0, 1.9, 2.11], rtol=1e-15)


def test_eval_before_any_step_is_the_initial_params():
    for rule in (Average(SGD()), EMA(Adam(), 0.99), EMA(Adam(), 0.99, debias=False)):
        p = tree_params()
        e = refopt.eval_params(rule, refopt.init(rule, p), p)
        for a, b in zip(refopt.tree.leaves(e), refopt.tree.leaves(p)):
            assert np.array_equal(a, b)


# ---- the trajectory is the base's, bit for bit -------------------------------------------------------

@pytest.mark.parametrize("make", [lambda b: Average(b), lambda b: EMA(b, 0.9), lambda b: EMA(b, 0.5, debias=False)],
                         ids=["average", "ema", "ema_param_init"])
@pytest.mark.parametrize("base", [SGD(lr=0.1, momentum=0.9, nesterov=True), Adam(lr=0.05, weight_decay=0.01),
                                  Hyperball(Adam(), lr=0.05)], ids=["sgd", "adam", "adamh"])
@pytest.mark.parametrize("inplace", [False, True], ids=["update", "update_"])
def test_trajectory_untouched(make, base, inplace):
    step = refopt.update_ if inplace else refopt.update
    params = tree_params()
    grads = grad_seq(params, 6)
    rule = make(base)
    xa, sa = refopt.tree.copy(params), refopt.init(base, params)
    xb, sb = refopt.tree.copy(params), refopt.init(rule, params)
    for g in grads:
        xa, sa = step(base, sa, xa, g)
        xb, sb = step(rule, sb, xb, g)
    for a, b in zip(refopt.tree.leaves(xa), refopt.tree.leaves(xb)):
        assert np.array_equal(a, b)
    base_state_b = refopt.tree.tree_map(lambda s: s.base, sb.leaves, is_leaf=lambda n: hasattr(n, "mu"))
    for a, b in zip(refopt.tree.leaves(sa.leaves), refopt.tree.leaves(base_state_b)):
        assert np.array_equal(a, b)


# ---- oracle, float64, multi-step -------------------------------------------------------------------

def iterates(oracle, lr, params, grads):
    """x_0, x_1, ... of x <- x - lr u per leaf path, from an independent base oracle."""
    xs = {p: [a.copy()] for p, a in zip(refopt.tree.paths(params), refopt.tree.leaves(params))}
    for t, g in enumerate(grads, start=1):
        for p, gl in zip(refopt.tree.paths(g), refopt.tree.leaves(g)):
            x = xs[p][-1]
            xs[p].append(x - lr * oracle.direction(p, x, gl, t))
    return xs


def uniform_oracle(seq, t):
    return sum(seq[1:t + 1]) / t


def ema_debiased_oracle(seq, t, b):
    return sum((1 - b) * b ** (t - k) * seq[k] for k in range(1, t + 1)) / (1 - b ** t)


def ema_param_init_oracle(seq, t, b):
    return b ** t * seq[0] + sum((1 - b) * b ** (t - k) * seq[k] for k in range(1, t + 1))


@pytest.mark.parametrize("kind", ["average", "ema", "ema_param_init"])
@pytest.mark.parametrize("base", ["sgd", "adam"])
def test_matches_oracle_float64(kind, base):
    params = tree_params()
    grads = grad_seq(params, 10)
    if base == "sgd":
        b, o, lr = SGD(lr=0.1, momentum=0.9, dampening=0.1), SGDOracle(0.9, 0.1), 0.1
    else:
        b, o, lr = Adam(lr=0.05, beta1=0.8, weight_decay=0.01), AdamOracle(0.8, 0.999, 1e-8, 0.01), 0.05
    rule, avg = {"average": (Average(b), uniform_oracle),
                 "ema": (EMA(b, 0.7), lambda s, t: ema_debiased_oracle(s, t, 0.7)),
                 "ema_param_init": (EMA(b, 0.7, debias=False), lambda s, t: ema_param_init_oracle(s, t, 0.7))}[kind]
    xs = iterates(o, lr, params, grads)
    x, state = params, refopt.init(rule, params)
    for t, g in enumerate(grads, start=1):
        x, state = refopt.update(rule, state, x, g)
        e = refopt.eval_params(rule, state, x)
        for p, a in zip(refopt.tree.paths(e), refopt.tree.leaves(e)):
            assert rel_err(a, avg(xs[p], t)) <= 1e-12, (p, t)


@settings(max_examples=20, deadline=None)
@given(decay=st.floats(0.0, 0.999), seed=st.integers(0, 2 ** 31), steps=st.integers(1, 30))
def test_debiased_ema_weights_sum_to_one(decay, seed, steps):
    """Constant iterates give back the constant: the debiased weights sum to 1 at every t."""
    c = np.random.default_rng(seed).standard_normal(4)
    rule = EMA(SGD(lr=0.0), decay)
    x, state = c.copy(), refopt.init(EMA(SGD(lr=0.0), decay), c)
    for _ in range(steps):
        x, state = refopt.update(rule, state, x, np.ones(4))
    np.testing.assert_allclose(refopt.eval_params(rule, state, x), c, rtol=1e-14)


# ---- composition ----------------------------------------------------------------------------------

def test_average_of_an_ema_averages_the_ema():
    """Averaging a rule with its own evaluation weights averages those (x_t := base.eval_leaf)."""
    base = EMA(SGD(lr=1.0), 0.5)
    rule = Average(base)
    values = [4.0, 8.0, 2.0, 6.0]
    ema = feed(base, 0.0, values)
    got = feed(rule, 0.0, values)
    np.testing.assert_allclose(got, np.cumsum(ema) / np.arange(1, 5), rtol=1e-15)


# ---- eval params, dtypes --------------------------------------------------------------------------

def test_eval_params_are_copies():
    params = tree_params()
    rule = EMA(Adam(), 0.9)
    x, state = refopt.update(rule, refopt.init(rule, params), params, grad_seq(params, 1)[0])
    e = refopt.eval_params(rule, state, x)
    e["a"][...] = 123.0
    assert not np.any(refopt.eval_params(rule, state, x)["a"] == 123.0)


def test_float32_stays_float32():
    params = tree_params(dtype=np.float32)
    for rule in (Average(Adam()), EMA(SGD(momentum=0.9), 0.99)):
        x, state = params, refopt.init(rule, params)
        for g in grad_seq(params, 4):
            x, state = refopt.update(rule, state, x, g)
        e = refopt.eval_params(rule, state, x)
        assert all(a.dtype == np.float32 for a in refopt.tree.leaves((x, e, state.leaves)))


# ---- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make,match", [
    (lambda: Average("sgd"), "base"),
    (lambda: EMA(None, 0.9), "base"),
    (lambda: EMA(SGD(), 1.0), "decay"),
    (lambda: EMA(SGD(), -0.1), "decay"),
    (lambda: EMA(SGD(), 0.9, debias="yes"), "debias"),
])
def test_bad_hyperparameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_averaging_has_no_direction():
    rule = Average(SGD())
    w = np.ones(3)
    with pytest.raises(NotImplementedError):
        refopt.direction(rule, refopt.init(rule, w), w, w)


def test_average_of_schedule_free_averages_its_evaluation_weights():
    sf = pytest.importorskip("refopt.rules.schedule_free")
    base = sf.ScheduleFreeSGD(lr=0.1)
    rule = Average(base)
    params = tree_params()
    xa, sa = params, refopt.init(base, params)
    xb, sb = params, refopt.init(rule, params)
    evals = []
    for t, g in enumerate(grad_seq(params, 5), start=1):
        xa, sa = refopt.update(base, sa, xa, g)
        xb, sb = refopt.update(rule, sb, xb, g)
        evals.append(refopt.eval_params(base, sa, xa))
        for a, b in zip(refopt.tree.leaves(xa), refopt.tree.leaves(xb)):
            assert np.array_equal(a, b)                        # the trajectory is Schedule-Free's
        mean = [sum(e) / t for e in zip(*(refopt.tree.leaves(v) for v in evals))]
        for a, m in zip(refopt.tree.leaves(refopt.eval_params(rule, sb, xb)), mean):
            assert rel_err(a, m) <= 1e-13

"""SGD, Adam and AdamW against an independent plain-numpy oracle, and PITFALLS B01, B02, B05, B06, B26.

The oracle below is written from the equations of torch.optim.SGD / Adam / AdamW (CONVENTIONS.md 1.1,
1.2) and the rules' docstrings, in torch's operation order:

* SGD:   g <- g + lambda*x;  b_1 = g_1, b_t = mu*b + (1-tau)*g;  u = g + mu*b (nesterov) or b;
         x <- x - (lr*gamma_t)*u.
* Adam:  g <- g + lambda*x (Adam's L2);  x <- x*(1 - lr*gamma_t*lambda) ('decoupled') or
         x*(1 - gamma_t*lambda) ('independent') first;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*(g*g);
         denom = sqrt(v)/sqrt(1-b2^t) + eps;  x <- x - (lr*gamma_t/(1-b1^t)) * (m/denom)   (torch addcdiv).

Scalars (bias corrections, lr*gamma_t, 1-beta, decay factor) are computed in Python float64 and then cast
to the array dtype, so the float32 oracle runs in float32 throughout (B01, B26).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refopt.core import direction, init, update, update_
from refopt.core import OptState
from refopt.rules.adam import Adam, AdamW
from refopt.rules.sgd import SGD

REL = 1e-13


# ------------------------------------------------------------------------------------------ oracle

class OracleSGD:
    def __init__(self, x, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, schedule=None):
        self.x = np.array(x, copy=True)
        self.lr, self.mu, self.tau, self.nest, self.wd = lr, momentum, dampening, nesterov, weight_decay
        self.sched, self.t, self.b = schedule, 0, None

    def step(self, g):
        self.t += 1
        d = self.x.dtype.type
        gamma = 1.0 if self.sched is None else float(self.sched(self.t))
        g = g + d(self.wd) * self.x
        if self.mu != 0:
            if self.b is None:
                self.b = g.copy()
            else:
                self.b = d(self.mu) * self.b + d(1.0 - self.tau) * g
            u = g + d(self.mu) * self.b if self.nest else self.b
        else:
            u = g
        self.x = self.x - d(self.lr * gamma) * u
        return u


class OracleAdam:
    def __init__(self, x, lr, b1=0.9, b2=0.999, eps=1e-8, l2=0.0, wd=0.0, mode=None, schedule=None):
        self.x = np.array(x, copy=True)
        self.m = np.zeros_like(self.x)
        self.v = np.zeros_like(self.x)
        self.lr, self.b1, self.b2, self.eps, self.l2, self.wd, self.mode = lr, b1, b2, eps, l2, wd, mode
        self.sched, self.t = schedule, 0

    def _moments(self, g):
        """Advance t, m, v (L2 in g); return (t, dtype, lr_t, g, x after the decoupled/independent decay)."""
        self.t += 1
        t, d = self.t, self.x.dtype.type
        gamma = 1.0 if self.sched is None else float(self.sched(t))
        lr_t = self.lr * gamma
        x = self.x
        if self.l2:
            g = g + d(self.l2) * x
        if self.mode == "decoupled":
            x = x * d(1.0 - lr_t * self.wd)
        elif self.mode == "independent":
            x = x * d(1.0 - gamma * self.wd)
        self.m = d(self.b1) * self.m + d(1.0 - self.b1) * g
        self.v = d(self.b2) * self.v + d(1.0 - self.b2) * (g * g)
        return t, d, lr_t, g, x

    def step(self, g):
        t, d, lr_t, g, x = self._moments(g)
        bc1, bc2 = 1.0 - self.b1 ** t, 1.0 - self.b2 ** t
        denom = np.sqrt(self.v) / d(math.sqrt(bc2)) + d(self.eps)
        self.x = x - d(lr_t / bc1) * (self.m / denom)
        # the direction u = mhat / (sqrt(vhat) + eps)
        return (self.m / d(bc1)) / (np.sqrt(self.v / d(bc2)) + d(self.eps))


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def cosine(t):  # a schedule: warmup from 0, then cosine decay (t = 1, 2, ...)
    return min(1.0, (t - 1) / 3) * 0.5 * (1 + math.cos(math.pi * min(t, 20) / 20))


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.1, weight_decay=0.05),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, schedule=cosine),
]

ADAM_CONFIGS = [  # (rule kwargs, oracle kwargs)
    (dict(cls=Adam, lr=0.01), dict(lr=0.01)),
    (dict(cls=Adam, lr=0.01, beta1=0.5, beta2=0.9, eps=1e-3), dict(lr=0.01, b1=0.5, b2=0.9, eps=1e-3)),
    (dict(cls=Adam, lr=0.01, weight_decay=0.1), dict(lr=0.01, l2=0.1)),
    (dict(cls=Adam, lr=0.01, beta1=0.0, weight_decay=0.1, schedule=cosine),
     dict(lr=0.01, b1=0.0, l2=0.1, schedule=cosine)),
    (dict(cls=AdamW, lr=0.01), dict(lr=0.01, wd=0.01, mode="decoupled")),
    (dict(cls=AdamW, lr=0.02, weight_decay=0.3, schedule=cosine),
     dict(lr=0.02, wd=0.3, mode="decoupled", schedule=cosine)),
    (dict(cls=AdamW, lr=0.01, weight_decay=0.05, wd_mode="independent"),
     dict(lr=0.01, wd=0.05, mode="independent")),
    (dict(cls=AdamW, lr=0.01, weight_decay=0.05, wd_mode="independent", schedule=cosine),
     dict(lr=0.01, wd=0.05, mode="independent", schedule=cosine)),
]


def make_rule(kw):
    kw = dict(kw)
    return kw.pop("cls")(**kw)


def trajectory(seed, shape=(4, 5), steps=12, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(dtype)
    # gradients of mixed scales, including some tiny ones near eps
    grads = [(rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 1, shape)).astype(dtype)
             for _ in range(steps)]
    return x0, grads


# ------------------------------------------------------------------------------------------ float64

@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=lambda c: "-".join(f"{k}" for k in c if k != "lr") or "plain")
def test_sgd_matches_oracle_float64(cfg):
    x0, grads = trajectory(1)
    rule, orc = SGD(**cfg), OracleSGD(x0, **cfg)
    x, s = x0.copy(), init(SGD(**cfg), x0)
    for t, g in enumerate(grads, 1):
        x, s = update(rule, s, x, g)
        orc.step(g)
        assert s.t == t
        assert rel_err(x, orc.x) <= REL
        if cfg.get("momentum", 0):
            assert rel_err(s.leaves.b, orc.b) <= REL


@pytest.mark.parametrize("cfg", ADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_adam_matches_oracle_float64(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(2)
    rule, orc = make_rule(rkw), OracleAdam(x0, **okw)
    x, s = x0.copy(), init(rule, x0)
    for t, g in enumerate(grads, 1):
        x, s = update(rule, s, x, g)
        orc.step(g)
        assert s.t == t
        assert rel_err(x, orc.x) <= REL
        assert rel_err(s.leaves.m, orc.m) <= REL
        assert rel_err(s.leaves.v, orc.v) <= REL


def test_sgd_first_buffer_is_g_undampened():
    # torch: b_1 = g_1 (no dampening on step 1); b_2 = mu*b_1 + (1-tau)*g_2
    rule = SGD(lr=1.0, momentum=0.5, dampening=0.5)
    x, s = update(rule, init(rule, np.zeros(1)), np.zeros(1), np.array([4.0]))
    assert s.leaves.b[0] == 4.0 and x[0] == -4.0
    x, s = update(rule, s, x, np.array([2.0]))
    assert s.leaves.b[0] == 0.5 * 4.0 + 0.5 * 2.0 and x[0] == -4.0 - 3.0


def test_sgd_nesterov_closed_form():
    rule = SGD(lr=0.1, momentum=0.9, nesterov=True)
    x, s = update(rule, init(rule, np.ones(1)), np.ones(1), np.array([1.0]))
    assert x[0] == pytest.approx(1 - 0.1 * (1 + 0.9 * 1), rel=1e-15)


def test_adam_first_step_is_lr_sign():
    # at t = 1, mhat = g and vhat = g^2, so the step is lr * g/(|g| + eps)
    rule = Adam(lr=0.1)
    g = np.array([3.0, -0.5, 2e-3])
    x, _ = update(rule, init(rule, np.zeros(3)), np.zeros(3), g)
    np.testing.assert_allclose(x, -0.1 * g / (np.abs(g) + 1e-8), rtol=1e-14)


# ------------------------------------------------------------------------------------------ float32 (B26)

@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=lambda c: "-".join(f"{k}" for k in c if k != "lr") or "plain")
def test_sgd_float32_bitwise_float32_oracle(cfg):
    x0, grads = trajectory(3, dtype=np.float32)
    rule, orc = SGD(**cfg), OracleSGD(x0, **cfg)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        x, s = update(rule, s, x, g)
        orc.step(g)
        assert x.dtype == np.float32 and orc.x.dtype == np.float32
        assert all(a.dtype == np.float32 for a in s.leaves)
        np.testing.assert_array_equal(x, orc.x)


@pytest.mark.parametrize("cfg", ADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_adam_float32_bitwise_float32_oracle_and_close_to_float64(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(4, dtype=np.float32)
    rule = make_rule(rkw)
    orc32 = OracleAdam(x0, **okw)
    orc64 = OracleAdam(x0.astype(np.float64), **okw)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        x, s = update(rule, s, x, g)
        orc32.step(g)
        orc64.step(g.astype(np.float64))
        assert x.dtype == np.float32 and orc32.x.dtype == np.float32
        assert s.leaves.m.dtype == np.float32 and s.leaves.v.dtype == np.float32
        # same float32 operations with float32-cast scalars -> same bits (any float64 scalar sneaking into
        # the kernel arithmetic would change some roundings)
        np.testing.assert_array_equal(x, orc32.x)
        np.testing.assert_array_equal(s.leaves.m, orc32.m)
        np.testing.assert_array_equal(s.leaves.v, orc32.v)
    # B26: documented tolerance against float64 about 1e-6 relative (absolute for values near 0)
    np.testing.assert_allclose(x, orc64.x, rtol=2e-6, atol=2e-7)


def test_float32_scalar_hyperparameter_cast_first_step():
    # B01/B26: 1-beta2 and sqrt(1-beta2^t) both from float64; mixing float32 1-0.999f (=0.0009999871) with
    # a float64 bias correction would make the first step 1.0000064*lr instead of lr.
    rule = Adam(lr=1e-3)
    x, _ = update(rule, init(rule, np.zeros(4, np.float32)), np.zeros(4, np.float32), np.ones(4, np.float32))
    assert x.dtype == np.float32
    np.testing.assert_allclose(x.astype(np.float64), -1e-3, rtol=3e-7)


# ------------------------------------------------------------------------------------------ B01

def _b01_run(dtype, steps=1000):
    rule = Adam(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
    x = np.zeros((), dtype)
    s = init(rule, x)
    g = np.full((), 0.1, dtype)
    prev = None
    for _ in range(steps):
        prev = x
        x, s = update(rule, s, x, g)
    return x, prev, s


def test_b01_integer_step_p1000_float64():
    x, prev, s = _b01_run(np.float64)
    assert s.t == 1000 and type(s.t) is int
    assert abs(float(x) - (-0.9999998999999979)) <= REL
    assert float(prev - x) == pytest.approx(9.999999e-4, rel=1e-6)
    # far from the frozen-counter (t stuck at 256) value -0.7959005208050013
    assert abs(float(x) + 0.7959005208050013) > 0.2


def test_b01_float32_mode_keeps_float64_bias_correction():
    x, prev, s = _b01_run(np.float32)
    assert x.dtype == np.float32 and type(s.t) is int and s.t == 1000
    assert float(x) == pytest.approx(-0.9999998999999979, rel=2e-5)
    assert float(prev) - float(x) == pytest.approx(9.999999e-4, rel=1e-3)  # frozen counter: 5.98e-4


def test_b01_counter_keeps_counting_past_float32_precision():
    # a float32 counter would stop at 2**24; t is a Python int and keeps counting exactly
    rule = AdamW(lr=1e-3)
    x = np.ones(3, np.float32)
    s0 = init(rule, x)
    s = OptState(2 ** 24, s0.glob, s0.leaves)
    for k in range(1, 3):
        x, s = update(rule, s, x, np.ones(3, np.float32))
        assert s.t == 2 ** 24 + k and type(s.t) is int
    assert np.all(np.isfinite(x))


def test_b01_float32_counter_side_facts():
    f = np.float32
    assert f(2 ** 24) + f(1) == f(2 ** 24)
    assert f(1) - f(0.999) == pytest.approx(0.0009999871, abs=1e-10)
    assert f(1) - f(0.999) != f(0.001)

    def bf16(v):  # round-to-nearest-even to bfloat16, returned as float32
        b = np.array([v], np.float32).view(np.uint32)
        b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return float(b.view(np.float32)[0])

    assert bf16(0.999) == 1.0 and bf16(257.0) == 256.0
    assert 1 - bf16(0.999) ** 5 == 0.0  # 1 - beta2^t = 0 in bf16: the NaN of B01


def test_first_update_uses_t_1():
    # burn #834: a 0-based step gives 1 - beta^0 = 0 and NaN. Here t=1 at the first update.
    rule = Adam(lr=0.5)
    x, s = update(rule, init(rule, np.zeros(2)), np.zeros(2), np.array([1.0, -2.0]))
    assert s.t == 1 and np.all(np.isfinite(x))
    np.testing.assert_allclose(x, [-0.5, 0.5], rtol=1e-7)


# ------------------------------------------------------------------------------------------ B02

def _adam_steps(g, steps, **kw):
    rule = Adam(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, **kw)
    x = np.zeros(1)
    s = init(rule, x)
    xs = [x]
    for _ in range(steps):
        x, s = update(rule, s, x, np.array([g]))
        xs.append(x)
    return np.array([float(v[0]) for v in xs])


def test_b02_eps_after_sqrt_tiny_gradient():
    xs = _adam_steps(1e-8, 3)
    np.testing.assert_allclose(-np.diff(xs), 5.0e-4, rtol=1e-12)
    assert xs[-1] == pytest.approx(-1.5e-3, rel=1e-12)
    # the eps-hat (folded) form gives p3 = -1.2535358402830757e-4 and first step 3.0653430031715525e-05
    assert abs(xs[-1] - (-1.2535358402830757e-4)) > 1e-3


def test_b02_g_1e_6_and_g_1():
    xs = _adam_steps(1e-6, 1)
    assert -xs[1] == pytest.approx(9.900990099009903e-4, rel=1e-13)  # eps-hat form: 7.59746926647958e-4
    xs = _adam_steps(1.0, 3)
    # at g = 1 both placements agree to 3e-10: the step is lr*1/(1+eps)
    np.testing.assert_allclose(-np.diff(xs), 1e-3 / (1 + 1e-8), rtol=1e-13)


def _eps_hat_step(g, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    # the TensorFlow form, written here only to show the test separates the two conventions
    m = v = 0.0
    for k in range(1, t + 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
    lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    return lr_t * m / (math.sqrt(v) + eps)


def test_b02_eps_hat_form_differs():
    assert _eps_hat_step(1e-8, 1) == pytest.approx(3.0653430031715525e-05, rel=1e-12)
    assert _eps_hat_step(1e-6, 1) == pytest.approx(7.59746926647958e-4, rel=1e-12)
    assert -_adam_steps(1e-8, 1)[1] == pytest.approx(5e-4, rel=1e-12)


# ------------------------------------------------------------------------------------------ B05

def _b05(rule):
    x = np.ones(1)
    s = init(rule, x)
    x1, s = update(rule, s, x, np.array([0.5]))
    x2, s = update(rule, s, x1, np.array([-0.25]))
    return float(x1[0]), float(x2[0])


def test_b05_decoupled_uses_pre_update_theta():
    x1, x2 = _b05(AdamW(lr=0.1, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8))
    assert x1 == pytest.approx(1 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8), rel=1e-15)
    assert x1 == pytest.approx(0.890000002, rel=1e-12)
    assert x2 == pytest.approx(0.8544662986878463, rel=1e-13)
    # decaying after the step would give 0.89100000198 and 0.8557226357009678
    assert abs(x2 - 0.8557226357009678) > 1e-3


@pytest.mark.parametrize("lr_peak", [1e-3, 2e-3, 0.1])
def test_b05_independent_decay_factor_ignores_peak_lr(lr_peak):
    # g = 0 keeps m = 0, so the step is the decay alone: x1 = (1 - eta*lambda_ind) * x0
    rule = AdamW(lr=lr_peak, weight_decay=1e-4, wd_mode="independent", schedule=lambda t: 0.5)
    x, _ = update(rule, init(rule, np.ones(2)), np.ones(2), np.zeros(2))
    np.testing.assert_array_equal(x, 1 - 0.5 * 1e-4)
    assert x[0] == 0.99995


@pytest.mark.parametrize("lr_peak,factor", [(1e-3, 0.99995), (2e-3, 0.9999)])
def test_b05_decoupled_decay_factor_scales_with_peak_lr(lr_peak, factor):
    rule = AdamW(lr=lr_peak, weight_decay=0.1, wd_mode="decoupled", schedule=lambda t: 0.5)
    x, _ = update(rule, init(rule, np.ones(2)), np.ones(2), np.zeros(2))
    np.testing.assert_allclose(x, factor, rtol=1e-15)


def test_b05_mapping_wd_torch_equals_lambda_ind_over_lr_peak():
    x0, grads = trajectory(7, steps=6)
    lam_ind, lr_peak = 1e-3, 2e-2
    a = AdamW(lr=lr_peak, weight_decay=lam_ind, wd_mode="independent", schedule=cosine)
    b = AdamW(lr=lr_peak, weight_decay=lam_ind / lr_peak, wd_mode="decoupled", schedule=cosine)
    xa, sa, xb, sb = x0, init(a, x0), x0, init(b, x0)
    for g in grads:
        xa, sa = update(a, sa, xa, g)
        xb, sb = update(b, sb, xb, g)
    np.testing.assert_allclose(xa, xb, rtol=1e-13)


def test_b05_independent_with_schedule_trajectory_differs_from_decoupled():
    # same lambda, lr != 1: the two modes must give different numbers
    x0, grads = trajectory(8, steps=4)
    a = AdamW(lr=0.05, weight_decay=0.1, wd_mode="independent")
    b = AdamW(lr=0.05, weight_decay=0.1, wd_mode="decoupled")
    xa, _ = update(a, init(a, x0), x0, grads[0])
    xb, _ = update(b, init(b, x0), x0, grads[0])
    np.testing.assert_allclose(xa - xb, -(0.1 - 0.005) * x0, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------------------------ B06

@pytest.mark.parametrize("rule", [Adam(lr=0.0), AdamW(lr=0.0), AdamW(lr=0.0, wd_mode="independent", weight_decay=0),
                                  Adam(lr=1e-320), AdamW(lr=1e-320, weight_decay=0.1),
                                  Adam(lr=1.0, schedule=lambda t: 0.0)],
                         ids=["adam0", "adamw0", "adamw_ind0", "adam_subnormal", "adamw_subnormal", "sched0"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_b06_zero_or_subnormal_lr_leaves_params(rule, dtype):
    p = np.array([1.0, 2.0], dtype)
    g = np.array([0.0, 1.0], dtype)
    x, s = update(rule, init(rule, p), p, g)
    assert np.all(np.isfinite(x)) and x.dtype == dtype
    np.testing.assert_array_equal(x, [1.0, 2.0])
    assert np.all(np.isfinite(s.leaves.m)) and np.all(np.isfinite(s.leaves.v))
    x2, _ = update_(rule, init(rule, p.copy()), p.copy(), g)
    np.testing.assert_array_equal(x2, [1.0, 2.0])


def test_b06_zero_gradient_zero_state_no_nan_in_direction():
    rule = Adam(lr=0.0)
    u, _ = direction(rule, init(rule, np.ones(3)), np.ones(3), np.zeros(3))
    np.testing.assert_array_equal(u, 0.0)


# ------------------------------------------------------------------------------------------ direction

@pytest.mark.parametrize("cfg", ADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_adam_direction_matches_oracle_u(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(9, steps=4)
    rule = make_rule(rkw)
    orc = OracleAdam(x0, **okw)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        xc = x.copy()
        u, s_dir = direction(rule, s, x, g)
        u_orc = orc.step(g)
        np.testing.assert_array_equal(x, xc)  # params untouched
        assert u.dtype == x.dtype and u.shape == x.shape
        assert rel_err(u, u_orc) <= REL
        assert s_dir.t == s.t + 1
        x, s = update(rule, s, x, g)
        np.testing.assert_array_equal(s_dir.leaves.m, s.leaves.m)
        np.testing.assert_array_equal(s_dir.leaves.v, s.leaves.v)


@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=lambda c: "-".join(f"{k}" for k in c if k != "lr") or "plain")
def test_sgd_direction_matches_oracle_u(cfg):
    x0, grads = trajectory(10, steps=4)
    rule = SGD(**cfg)
    orc = OracleSGD(x0, **cfg)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        xc = x.copy()
        u, _ = direction(rule, s, x, g)
        u_orc = orc.step(g)
        np.testing.assert_array_equal(x, xc)
        assert rel_err(u, u_orc) <= REL
        x, s = update(rule, s, x, g)


def test_step_equals_x_minus_lr_gamma_u():
    # a rule of the form x <- x - lr*gamma_t*u (no decoupled decay): Adam with L2 and a schedule
    rule = Adam(lr=0.03, weight_decay=0.1, schedule=lambda t: 0.25 * t)
    x0, grads = trajectory(11, steps=3)
    x, s = x0, init(rule, x0)
    for t, g in enumerate(grads, 1):
        u, _ = direction(rule, s, x, g)
        xn, s = update(rule, s, x, g)
        np.testing.assert_allclose(xn, x - 0.03 * 0.25 * t * u, rtol=1e-13, atol=1e-16)
        x = xn


# ------------------------------------------------------------------------------------------ layouts

@pytest.mark.parametrize("rule", [Adam(lr=0.1), AdamW(lr=0.1), SGD(lr=0.1, momentum=0.9)], ids=["adam", "adamw", "sgd"])
def test_fortran_ordered_params_update_and_direction(rule):
    # a transposed (Fortran-ordered) parameter must give the same numbers as its C-ordered copy.
    # the hazard: zeros_like and empty_like keep F order, and .reshape(-1) of an F-ordered array is a copy,
    # so a kernel writing through it would lose its writes (state and direction's output).
    rng = np.random.default_rng(12)
    xc = rng.standard_normal((3, 4))
    xf = np.asfortranarray(xc)
    grads = [rng.standard_normal((3, 4)) for _ in range(3)]
    sc, sf, a, b = init(rule, xc), init(rule, xf), xc, xf
    for g in grads:
        ua, _ = direction(rule, sc, a, g)
        ub, _ = direction(rule, sf, b, g)
        np.testing.assert_array_equal(ua, ub)
        a, sc = update(rule, sc, a, g)
        b, sf = update(rule, sf, b, g)
        np.testing.assert_array_equal(a, b)


def test_non_contiguous_grad_and_param_views():
    rule = Adam(lr=0.1)
    rng = np.random.default_rng(13)
    big_x, big_g = rng.standard_normal((6, 8)), rng.standard_normal((6, 8))
    xv, gv = big_x[::2, 1::3], big_g[::2, 1::3]
    x1, _ = update(rule, init(rule, xv), xv, gv)
    x2, _ = update(rule, init(rule, xv.copy()), xv.copy(), gv.copy())
    np.testing.assert_array_equal(x1, x2)


# ------------------------------------------------------------------------------------------ property

@settings(max_examples=40, deadline=None)
@given(lr=st.floats(0.0, 1.0), b1=st.floats(0.0, 0.99), b2=st.floats(0.0, 0.9999), eps=st.floats(1e-12, 1e-1),
       wd=st.floats(0.0, 1.0), kind=st.sampled_from(["adam", "decoupled", "independent"]),
       seed=st.integers(0, 2 ** 16))
def test_adam_property_random_hyperparameters(lr, b1, b2, eps, wd, kind, seed):
    x0, grads = trajectory(seed, shape=(7,), steps=4)
    if kind == "adam":
        rule, orc = Adam(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd), \
            OracleAdam(x0, lr, b1, b2, eps, l2=wd)
    else:
        rule, orc = AdamW(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, wd_mode=kind), \
            OracleAdam(x0, lr, b1, b2, eps, wd=wd, mode=kind)
    x, s = x0, init(rule, x0)
    for g in grads:
        x, s = update(rule, s, x, g)
        orc.step(g)
    np.testing.assert_allclose(x, orc.x, rtol=1e-12, atol=1e-14)


@settings(max_examples=40, deadline=None)
@given(lr=st.floats(0.0, 1.0), mu=st.floats(0.0, 0.99), tau=st.floats(0.0, 0.99), wd=st.floats(0.0, 1.0),
       nesterov=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_sgd_property_random_hyperparameters(lr, mu, tau, wd, nesterov, seed):
    if nesterov:
        mu, tau = max(mu, 0.1), 0.0
    x0, grads = trajectory(seed, shape=(7,), steps=4)
    kw = dict(lr=lr, momentum=mu, dampening=tau, nesterov=nesterov, weight_decay=wd)
    rule, orc = SGD(**kw), OracleSGD(x0, **kw)
    x, s = x0, init(rule, x0)
    for g in grads:
        x, s = update(rule, s, x, g)
        orc.step(g)
    np.testing.assert_allclose(x, orc.x, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("rule", [Adam(lr=0.1), SGD(lr=0.1, momentum=0.9)], ids=["adam", "sgd"])
def test_state_arrays_in_fortran_order_still_update(rule):
    # a state whose arrays are not C-contiguous (e.g. rebuilt from a checkpoint by the user) must either
    # give the same numbers in the pure update or be rejected; it must never be silently left unchanged
    # (the kernels' reshape(-1) of a non-C array is a copy, so writes into it would be lost).
    rng = np.random.default_rng(14)
    x0 = rng.standard_normal((3, 4))
    g1, g2 = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x1, s1 = update(rule, init(rule, x0), x0, g1)
    s1f = OptState(s1.t, s1.glob, type(s1.leaves)(*[np.asfortranarray(a) for a in s1.leaves]))
    x2, s2 = update(rule, s1, x1, g2)
    try:
        x2f, s2f = update(rule, s1f, x1, g2)
    except ValueError:
        return
    np.testing.assert_array_equal(x2f, x2)
    for a, b in zip(s2f.leaves, s2.leaves):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------ NAdam (nesterov=True)
# An independent oracle in optax's form (``optax.nadam`` = ``scale_by_adam(nesterov=True)``, CONVENTIONS.md
# 2.3), written with optax's divisions rather than refopt's precomputed coefficients:
#   mhat = b1 * (m_t / (1 - b1^(t+1))) + (1 - b1) * (g_t / (1 - b1^t));   no extra beta2 factor on vhat;
#   u = mhat / (sqrt(v_t)/sqrt(1 - b2^t) + eps);   x <- x * decay - lr_t * u.

class OracleNAdam(OracleAdam):
    def step(self, g):
        t, d, lr_t, g, x = self._moments(g)
        mhat = d(self.b1) * (self.m / d(1.0 - self.b1 ** (t + 1))) + d(1.0 - self.b1) * (g / d(1.0 - self.b1 ** t))
        u = mhat / (np.sqrt(self.v) / d(math.sqrt(1.0 - self.b2 ** t)) + d(self.eps))
        self.x = x - d(lr_t) * u
        return u


NADAM_CONFIGS = [  # (rule kwargs, oracle kwargs)
    (dict(cls=Adam, lr=0.01, nesterov=True), dict(lr=0.01)),
    (dict(cls=Adam, lr=0.01, beta1=0.5, beta2=0.9, eps=1e-3, weight_decay=0.1, schedule=cosine, nesterov=True),
     dict(lr=0.01, b1=0.5, b2=0.9, eps=1e-3, l2=0.1, schedule=cosine)),
    (dict(cls=AdamW, lr=0.03, beta1=0.8, beta2=0.95, weight_decay=0.1, nesterov=True),
     dict(lr=0.03, b1=0.8, b2=0.95, wd=0.1, mode="decoupled")),
    (dict(cls=AdamW, lr=0.01, weight_decay=0.05, wd_mode="independent", schedule=cosine, nesterov=True),
     dict(lr=0.01, wd=0.05, mode="independent", schedule=cosine)),
]


@pytest.mark.parametrize("cfg", NADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_nadam_matches_oracle_float64(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(12, steps=20)
    rule, orc = make_rule(rkw), OracleNAdam(x0, **okw)
    x, s = x0.copy(), init(rule, x0)
    for t, g in enumerate(grads, 1):
        x, s = update(rule, s, x, g)
        orc.step(g)
        assert rel_err(x, orc.x) <= REL
        assert rel_err(s.leaves.m, orc.m) <= REL
        assert rel_err(s.leaves.v, orc.v) <= REL


@pytest.mark.parametrize("cfg", NADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_nadam_float32_close_to_float32_and_float64_oracles(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(13, steps=20, dtype=np.float32)
    rule = make_rule(rkw)
    orc32, orc64 = OracleNAdam(x0, **okw), OracleNAdam(x0.astype(np.float64), **okw)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        x, s = update(rule, s, x, g)
        orc32.step(g)
        orc64.step(g.astype(np.float64))
        assert x.dtype == np.float32 and orc32.x.dtype == np.float32
        assert s.leaves.m.dtype == np.float32 and s.leaves.v.dtype == np.float32
        # the step differs from the oracle's division order by float32 rounding only (a few ulps, 6e-8 each;
        # through Adam's L2 term that reaches the moments too)
        np.testing.assert_allclose(x, orc32.x, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(s.leaves.m, orc32.m, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(s.leaves.v, orc32.v, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(x, orc64.x, rtol=2e-6, atol=2e-7)


def test_nadam_first_step_closed_form():
    # t = 1: m_1 = (1-b1) g, so mhat = b1 (1-b1) g / (1-b1^2) + g = (1 + b1/(1+b1)) g; vhat = g^2:
    # the step is lr * (1 + b1/(1+b1)) * g/(|g| + eps) (1.47368... lr for b1 = 0.9; Adam's is lr)
    rule = Adam(lr=0.1, nesterov=True)
    g = np.array([3.0, -0.5, 2e-3])
    x, _ = update(rule, init(rule, np.zeros(3)), np.zeros(3), g)
    np.testing.assert_allclose(x, -0.1 * (1 + 0.9 / 1.9) * g / (np.abs(g) + 1e-8), rtol=1e-14)


def test_nadam_second_step_hand_computed():
    # g = 1 then 2, b1 = 0.5, b2 = 0.5, eps = 0, lr = 1: m_2 = 0.5*0.5 + 0.5*2 = 1.25, v_2 = 0.5*0.5 + 0.5*4 = 2.25,
    # mhat_2 = 0.5*1.25/(1-0.125) + 0.5*2/(1-0.25) = 0.714285... + 1.333... = 2.047619..., vhat = 2.25/0.75 = 3
    rule = Adam(lr=1.0, beta1=0.5, beta2=0.5, eps=1e-300, nesterov=True)
    x, s = update(rule, init(rule, np.zeros(1)), np.zeros(1), np.array([1.0]))
    x1 = x.copy()
    x, s = update(rule, s, x, np.array([2.0]))
    mhat2 = 0.5 * 1.25 / 0.875 + 0.5 * 2.0 / 0.75
    assert x[0] - x1[0] == pytest.approx(-mhat2 / math.sqrt(3.0), rel=1e-14)


@pytest.mark.parametrize("cfg", NADAM_CONFIGS, ids=lambda c: str(c[1]))
def test_nadam_direction_matches_oracle_u(cfg):
    rkw, okw = cfg
    x0, grads = trajectory(14, steps=4)
    rule, orc = make_rule(rkw), OracleNAdam(x0, **okw)
    x, s = x0.copy(), init(rule, x0)
    for g in grads:
        xc = x.copy()
        u, s_dir = direction(rule, s, x, g)
        u_orc = orc.step(g)
        np.testing.assert_array_equal(x, xc)
        assert rel_err(u, u_orc) <= REL
        x, s = update(rule, s, x, g)
        np.testing.assert_array_equal(s_dir.leaves.m, s.leaves.m)


def test_nesterov_false_is_bit_identical_to_plain_adam_and_nesterov_must_be_bool():
    x0, grads = trajectory(15, steps=5)
    a, b = Adam(lr=0.01, weight_decay=0.1), Adam(lr=0.01, weight_decay=0.1, nesterov=False)
    n = Adam(lr=0.01, weight_decay=0.1, nesterov=True)
    xa, sa, xb, sb, xn, sn = x0, init(a, x0), x0, init(b, x0), x0, init(n, x0)
    for g in grads:
        xa, sa = update(a, sa, xa, g)
        xb, sb = update(b, sb, xb, g)
        xn, sn = update(n, sn, xn, g)
    np.testing.assert_array_equal(xa, xb)
    assert rel_err(xn, xa) > 1e-6                       # the option does something
    with pytest.raises(ValueError, match="nesterov"):
        Adam(nesterov=1)
    with pytest.raises(ValueError, match="nesterov"):
        AdamW(nesterov="yes")

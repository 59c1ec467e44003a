"""Schedule-Free SGD / AdamW against an independent plain-numpy oracle of the facebookresearch reference
classes (SGDScheduleFreeReference, AdamWScheduleFreeReference at HEAD), plus PITFALLS B12, B14/B15."""
import math

import numpy as np
import pytest

from refopt import tree as T
from refopt.core import OptState, eval_params, init, update, update_
from refopt.rules import schedule_free as sfmod
from refopt.rules.schedule_free import SFGlobal, ScheduleFreeAdamW, ScheduleFreeSGD
from refopt.schedules import WSD


# --- the oracle: the reference algorithms restated with a param-group dict, float64 ------------------

class OracleSF:
    """Plain-numpy Schedule-Free; ``kind`` 'sgd' or 'adamw'. Holds the "group" and per-param z, x, y, v."""

    def __init__(self, params, kind, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                 warmup_steps=0, r=0.0, weight_lr_power=2.0, decay_at_z=False):
        self.kind, self.lr, self.b1, self.b2, self.eps = kind, lr, beta1, beta2, eps
        self.wd, self.W, self.r, self.wlp, self.dz = weight_decay, warmup_steps, r, weight_lr_power, decay_at_z
        self.k, self.weight_sum, self.lr_max = 0, 0.0, -1.0
        self.z = [p.copy() for p in params]
        self.x = [p.copy() for p in params]
        self.y = [p.copy() for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads, group_lr=None):
        """One step; ``group_lr`` plays the part of a torch LR scheduler overwriting group['lr']."""
        base = self.lr if group_lr is None else group_lr
        k = self.k
        sched = (k + 1) / self.W if k < self.W else 1.0
        lr = base * sched
        self.lr_max = max(lr, self.lr_max)
        weight = (k + 1) ** self.r * self.lr_max ** self.wlp
        self.weight_sum += weight
        try:
            c = weight / self.weight_sum
        except ZeroDivisionError:
            c = 0.0
        bc2 = 1 - self.b2 ** (k + 1)
        for i, g in enumerate(grads):
            z, x, y = self.z[i], self.x[i], self.y[i]
            if self.kind == "sgd":
                if self.wd != 0:
                    g = g + self.wd * y
                z = z - lr * g
            else:
                if self.wd != 0:
                    z = z - (lr * self.wd) * (z if self.dz else y)
                self.v[i] = self.v[i] * self.b2 + (1 - self.b2) * g * g
                z = z + (-lr) * g / (np.sqrt(self.v[i] / bc2) + self.eps)
            x = x * (1 - c) + c * z
            y = x * self.b1 + (1 - self.b1) * z
            self.z[i], self.x[i], self.y[i] = z, x, y
        self.k = k + 1
        return c


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def quad_grads(ys, mats, noise):
    return [y @ m + n for y, m, n in zip(ys, mats, noise)]


def problem(seed=0, steps=50):
    rng = np.random.default_rng(seed)
    shapes = [(4, 3), (5,)]
    params = [rng.standard_normal(s) for s in shapes]
    mats = []
    for s in shapes:
        a = rng.standard_normal((s[-1], s[-1]))
        mats.append(a @ a.T / s[-1] + 0.1 * np.eye(s[-1]))
    noise = [[0.3 * rng.standard_normal(s) for s in shapes] for _ in range(steps)]
    return params, mats, noise


SGD_CONFIGS = [dict(lr=0.1, beta=0.9, warmup_steps=10, r=0.5, weight_lr_power=2.0, weight_decay=0.01),
               dict(lr=0.05, beta=0.6, warmup_steps=0, r=2.0, weight_lr_power=1.0, weight_decay=0.0)]
ADAMW_CONFIGS = [dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, warmup_steps=10, r=0.5, weight_decay=0.1),
                 dict(lr=0.02, beta1=0.7, beta2=0.95, eps=1e-6, warmup_steps=3, r=1.0, weight_lr_power=0.0,
                      weight_decay=0.2, decay_at_z=True)]


def run_both(rule, oracle_kw, kind, steps=50, schedule_vals=None):
    params, mats, noise = problem(steps=steps)
    tree = {"w": params[0], "b": params[1]}
    state = init(rule, tree)
    oracle = OracleSF([p.copy() for p in params], kind, **oracle_kw)
    y = tree
    for t in range(1, steps + 1):
        g = quad_grads([y["w"], y["b"]], mats, noise[t - 1])
        og = quad_grads(oracle.y, mats, noise[t - 1])
        lr = None if schedule_vals is None else oracle_kw["lr"] * schedule_vals(t)
        oracle.step(og, group_lr=lr)
        y, state = update(rule, state, y, {"w": g[0], "b": g[1]})
    return y, state, oracle


@pytest.mark.parametrize("cfg", SGD_CONFIGS)
def test_sgd_matches_oracle(cfg):
    okw = dict(cfg)
    okw["beta1"] = okw.pop("beta")
    y, state, o = run_both(ScheduleFreeSGD(**cfg), okw, "sgd")
    ex = eval_params(ScheduleFreeSGD(**cfg), state, y)
    for name, i in (("w", 0), ("b", 1)):
        assert rel(y[name], o.y[i]) <= 1e-12
        assert rel(ex[name], o.x[i]) <= 1e-12
        assert rel(state.leaves[name].z, o.z[i]) <= 1e-12
    assert state.t == 50 and state.glob.k == o.k == 50
    assert state.glob.weight_sum == pytest.approx(o.weight_sum, rel=1e-14)
    assert state.glob.lr_max == o.lr_max


@pytest.mark.parametrize("cfg", ADAMW_CONFIGS)
def test_adamw_matches_oracle(cfg):
    y, state, o = run_both(ScheduleFreeAdamW(**cfg), dict(cfg), "adamw")
    ex = eval_params(ScheduleFreeAdamW(**cfg), state, y)
    for name, i in (("w", 0), ("b", 1)):
        assert rel(y[name], o.y[i]) <= 1e-12
        assert rel(ex[name], o.x[i]) <= 1e-12
        assert rel(state.leaves[name].z, o.z[i]) <= 1e-12
        assert rel(state.leaves[name].v, o.v[i]) <= 1e-12
    assert state.glob.weight_sum == pytest.approx(o.weight_sum, rel=1e-14)


def test_schedule_acts_as_group_lr():
    sched = WSD(3, 20, 50)
    y, state, o = run_both(ScheduleFreeAdamW(lr=0.05, warmup_steps=5, weight_decay=0.1, schedule=sched),
                           dict(lr=0.05, warmup_steps=5, weight_decay=0.1), "adamw", schedule_vals=sched)
    assert rel(y["w"], o.y[0]) <= 1e-12 and rel(state.leaves["b"].x, o.x[1]) <= 1e-12
    assert state.glob.weight_sum == pytest.approx(o.weight_sum, rel=1e-14)


# --- PITFALLS B12: lr = 0 on the first step -----------------------------------------------------------

def test_b12_lr_zero_first_step():
    sched = lambda t: [0.0, 1.0, 1.0][t - 1]
    rule = ScheduleFreeSGD(lr=0.1, beta=0.9, r=0, weight_lr_power=2, schedule=sched)
    y = np.array([1.0, -2.0])
    state = init(rule, y)
    cs, ys, xs = [], [], []
    for t in range(1, 4):
        ctx, _ = rule.context(t, state.glob)
        cs.append(ctx.c)
        y, state = update(rule, state, y, y.copy())             # gradient of |w|^2/2 at y
        ys.append(y.copy())
        xs.append(eval_params(rule, state, y).copy())
    assert cs == [0.0, 1.0, 0.5]
    np.testing.assert_array_equal(ys[0], [1.0, -2.0])
    np.testing.assert_array_equal(xs[0], [1.0, -2.0])
    np.testing.assert_allclose(ys[1], [0.9, -1.8], rtol=1e-15)
    np.testing.assert_allclose(xs[1], [0.9, -1.8], rtol=1e-15)
    np.testing.assert_allclose(ys[2], [0.8505, -1.701], rtol=1e-15)
    np.testing.assert_allclose(xs[2], [0.855, -1.71], rtol=1e-15)


@pytest.mark.parametrize("rule", [ScheduleFreeSGD(lr=0.0), ScheduleFreeAdamW(lr=0.0, weight_decay=0.1),
                                  ScheduleFreeAdamW(lr=0.0, weight_lr_power=0.0),
                                  ScheduleFreeSGD(lr=0.1, schedule=lambda t: 0.0, r=1.0)])
def test_lr_zero_throughout_is_a_noop(rule):
    y0 = np.array([1.0, -2.0, 0.0])
    y, state = y0.copy(), init(rule, y0)
    for _ in range(3):
        y, state = update(rule, state, y, np.array([1.0, 0.0, -3.0]))
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(eval_params(rule, state, y), y0)
    assert all(math.isfinite(v) for v in state.glob[1:])


# --- PITFALLS B14 / B15: eval params, round trips, checkpoints ----------------------------------------

def b15_run(dtype=np.float64, steps=3):
    rule = ScheduleFreeAdamW(lr=0.1, weight_decay=0.5)
    y = np.array([1.0, -2.0], dtype)
    state = init(rule, y)
    for _ in range(steps):
        y, state = update(rule, state, y, y.copy())
    return rule, y, state


def test_b14_b15_eval_params_values():
    rule, y, state = b15_run()
    x = eval_params(rule, state, y)
    np.testing.assert_allclose(x, [0.718271796617511, -1.617800380987452], rtol=1e-14)
    assert not np.array_equal(x, y)                   # training params are y, evaluation params are x
    assert np.array_equal(x, state.leaves.x)          # the stored x itself, not recomputed
    assert not x.flags.writeable                      # a view that cannot corrupt the state


def test_b14_eval_train_eval_bit_identical():
    rule, y, state = b15_run()
    y_before = y.copy()
    x1 = eval_params(rule, state, y).copy()
    # "train": keep stepping from y (the params were never replaced by x)
    x2 = eval_params(rule, state, y)
    assert np.array_equal(x1, x2) and np.array_equal(y, y_before)
    y_a, s_a = update(rule, state, y, y.copy())
    _ = eval_params(rule, state, y)                   # an eval in between changes nothing
    y_b, s_b = update(rule, state, y, y.copy())
    assert np.array_equal(y_a, y_b) and np.array_equal(s_a.leaves.x, s_b.leaves.x)


def test_b14_recomputed_x_is_not_exact_in_float32():
    rng = np.random.default_rng(0)
    for dtype, bound in ((np.float64, 1e-15), (np.float32, 1e-6)):
        rule = ScheduleFreeAdamW(lr=0.1, weight_decay=0.5)
        y = rng.standard_normal(1000).astype(dtype)
        state = init(rule, y)
        for _ in range(20):
            y, state = update(rule, state, y, (y + rng.standard_normal(1000)).astype(dtype))
        x = eval_params(rule, state, y)
        rec = (y - dtype(0.1) * state.leaves.z) / dtype(0.9)
        err = np.max(np.abs(rec - x)) / np.max(np.abs(x))
        assert err < bound
        if dtype == np.float32:
            assert err > 1e-8                          # why refopt stores x instead of recomputing it


def _to_checkpoint(state):
    """What a checkpoint keeps: arrays copied, global state as plain JSON numbers."""
    return {k: np.array(v) for k, v in state.leaves._asdict().items()}, list(state.glob), state.t


@pytest.mark.parametrize("rule", [ScheduleFreeSGD(lr=0.1, warmup_steps=3, r=1.0, weight_decay=0.01),
                                  ScheduleFreeAdamW(lr=0.05, warmup_steps=3, weight_decay=0.1)])
def test_checkpoint_resume_bit_identical(rule):
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(6) for _ in range(8)]
    y = rng.standard_normal(6)
    state = init(rule, y)
    ys = []
    for t in range(8):
        y, state = update(rule, state, y, grads[t])
        ys.append(y)
        if t == 3:
            arrays, glob, tt = _to_checkpoint(state)
            saved_y = y.copy()
    resumed = OptState(tt, SFGlobal(*glob), type(state.leaves)(**arrays))
    y2 = saved_y
    for t in range(4, 8):
        y2, resumed = update(rule, resumed, y2, grads[t])
    assert np.array_equal(y2, ys[-1]) and np.array_equal(resumed.leaves.x, state.leaves.x)
    assert tuple(resumed.glob) == tuple(state.glob)
    # a plain list as global state (as read back from JSON) is accepted too
    ctx_a, g_a = rule.context(5, SFGlobal(*glob))
    ctx_b, g_b = rule.context(5, list(glob))
    assert ctx_a == ctx_b and g_a == g_b


# --- dtypes, in-place, kernels ------------------------------------------------------------------------

@pytest.mark.parametrize("rule", [ScheduleFreeSGD(lr=0.1, weight_decay=0.01, warmup_steps=2),
                                  ScheduleFreeAdamW(lr=0.05, weight_decay=0.1, warmup_steps=2)])
def test_float32_stays_float32_and_tracks_float64(rule):
    rng = np.random.default_rng(2)
    y64 = rng.standard_normal((3, 4))
    y32 = y64.astype(np.float32)
    s64, s32 = init(rule, y64), init(rule, y32)
    for _ in range(10):
        g = rng.standard_normal((3, 4))
        y64, s64 = update(rule, s64, y64, g)
        y32, s32 = update(rule, s32, y32, g.astype(np.float32))
    assert y32.dtype == np.float32 and eval_params(rule, s32, y32).dtype == np.float32
    assert all(a.dtype == np.float32 for a in s32.leaves)
    assert rel(y32.astype(np.float64), y64) < 1e-5


@pytest.mark.parametrize("rule", [ScheduleFreeSGD(lr=0.1, weight_decay=0.01, r=0.5),
                                  ScheduleFreeAdamW(lr=0.05, weight_decay=0.1, decay_at_z=True)])
def test_update_inplace_and_pure_agree_and_grads_untouched(rule):
    rng = np.random.default_rng(3)
    y = rng.standard_normal(7)
    ya, sa = y.copy(), init(rule, y)
    yb, sb = y.copy(), init(rule, y)
    for _ in range(5):
        g = rng.standard_normal(7)
        g.flags.writeable = False
        ya, sa = update(rule, sa, ya, g)
        yb_obj = yb
        yb, sb = update_(rule, sb, yb, g)
        assert yb is yb_obj
    assert np.array_equal(ya, yb) and all(np.array_equal(a, b) for a, b in zip(sa.leaves, sb.leaves))


def test_kernels_match_numpy_twins_serial_and_parallel():
    rng = np.random.default_rng(4)
    n = 70_000                                         # above PARALLEL_MIN_SIZE
    for rule in (ScheduleFreeSGD(lr=0.1, weight_decay=0.01), ScheduleFreeAdamW(lr=0.05, weight_decay=0.1)):
        y, g = rng.standard_normal(n), rng.standard_normal(n)
        s = init(rule, y).leaves
        s = type(s)(*(a + 0.1 * rng.standard_normal(n) if i < 2 else np.abs(a + rng.standard_normal(n))
                      for i, a in enumerate(s)))
        ctx, _ = rule.context(2, SFGlobal(1, 0.01, 0.1))
        if isinstance(rule, ScheduleFreeSGD):
            want = sfmod.sf_sgd_reference(y, g, s.z, s.x, ctx, rule)
        else:
            want = sfmod.sf_adamw_reference(y, g, s.z, s.x, s.v, ctx, rule)
        outs = []
        for small in (False, True):
            yy, ss = y.copy(), T.copy(s)
            if small:   # force the serial kernel by stepping in chunks below the threshold
                for lo in range(0, n, 10_000):
                    sl = slice(lo, lo + 10_000)
                    part = type(ss)(*(a[sl] for a in ss))
                    rule.update_leaf(ctx, part, yy[sl], g[sl], "p")
            else:
                rule.update_leaf(ctx, ss, yy, g, "p")
            outs.append((yy, ss))
            assert np.array_equal(yy, want[0]) and np.array_equal(ss.z, want[1]) and np.array_equal(ss.x, want[2])
        assert np.array_equal(outs[0][0], outs[1][0])


@pytest.mark.parametrize("make", [
    lambda: ScheduleFreeSGD(lr=-1.0), lambda: ScheduleFreeSGD(beta=0.0), lambda: ScheduleFreeSGD(beta=1.0),
    lambda: ScheduleFreeSGD(warmup_steps=-1), lambda: ScheduleFreeSGD(warmup_steps=2.5),
    lambda: ScheduleFreeSGD(r=-0.5), lambda: ScheduleFreeSGD(weight_lr_power=float("nan")),
    lambda: ScheduleFreeSGD(weight_decay=-1e-3), lambda: ScheduleFreeSGD(schedule=3),
    lambda: ScheduleFreeAdamW(beta1=1.5), lambda: ScheduleFreeAdamW(beta2=1.0), lambda: ScheduleFreeAdamW(eps=0.0),
    lambda: ScheduleFreeAdamW(decay_at_z=1), lambda: ScheduleFreeAdamW(lr=float("inf")),
])
def test_bad_hyperparameters_raise(make):
    with pytest.raises(ValueError):
        make()


def test_init_state_and_defaults():
    y = np.arange(6.0).reshape(2, 3)
    s = init(ScheduleFreeAdamW(), y)
    assert s.glob == SFGlobal(0, 0.0, -1.0)
    assert np.array_equal(s.leaves.z, y) and np.array_equal(s.leaves.x, y) and not np.any(s.leaves.v)
    assert s.leaves.z is not y and s.leaves.x is not s.leaves.z
    assert np.array_equal(eval_params(ScheduleFreeAdamW(), s, y), y)   # before any step, x = y0
    d = ScheduleFreeAdamW()
    assert (d.lr, d.beta1, d.beta2, d.eps, d.warmup_steps, d.r, d.weight_lr_power, d.weight_decay) == \
        (0.0025, 0.9, 0.999, 1e-8, 0, 0.0, 2.0, 0.0)
    assert (ScheduleFreeSGD().lr, ScheduleFreeSGD().beta) == (1.0, 0.9)

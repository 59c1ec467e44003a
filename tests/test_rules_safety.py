"""The rules layer cannot corrupt memory or hide a bad number: foreign states are rejected for every catalog
rule (in a subprocess, since before this layer they could crash the interpreter), every step scalar is cast
to the array dtype with a check before anything is written, a gradient whose square overflows a
second-moment rule is reported, parallel and serial kernels agree bit for bit, and a new rule is one small
definition."""
import json
import os
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import pytest

import refopt
from refopt import kernels
from refopt import tree as T
from refopt.core import ArraySpec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_FOREIGN = textwrap.dedent(r"""
    import json, sys, warnings
    import numpy as np
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    warnings.simplefilter("ignore")
    import refopt
    from refopt import tree as T
    from catalog import all_cases

    def grow(params):   # every leaf gets more elements (first axis x3), same ndim and dtype
        return T.tree_map(lambda a: np.concatenate([a, a, a], axis=0) if a.ndim else a, params)

    out = {}
    for case in all_cases():
        rule, small = case.make_rule(), case.make_params(np.float64, 0)
        big = grow(small)
        other = refopt.Adam() if not isinstance(rule, refopt.Adam) else refopt.SGD(momentum=0.9)
        foreign = {"made for bigger params": (refopt.init(rule, big), small),
                   "made for smaller params": (refopt.init(rule, small), big)}
        try:
            foreign["made by another rule"] = (refopt.init(other, small), small)
        except ValueError:
            pass
        def same_layout(a, b):   # a state that fits exactly (e.g. SGD's size-0 buffer) may be accepted
            la, _, da = T.flatten(a.leaves)
            lb, _, db = T.flatten(b.leaves)
            return da == db and all(type(x) is type(y) and getattr(x, "shape", x) == getattr(y, "shape", y)
                                    for x, y in zip(la, lb))

        for what, (state, params) in foreign.items():
            fits = same_layout(state, refopt.init(rule, params))
            for fn in ("update", "update_"):
                p = T.copy(params)
                before = T.copy(p)
                try:
                    getattr(refopt, fn)(rule, state, p, T.tree_map(np.ones_like, p))
                    res = "raised" if fits else "accepted"
                except (ValueError, TypeError) as e:
                    unchanged = all(np.array_equal(a, b) for a, b in zip(T.leaves(p), T.leaves(before)))
                    res = "raised" if unchanged else "raised after writing"
                out[f"{case.name} / {what} / {fn}"] = res
    # a leaf that init_leaf refuses (all zero under Hyperball) with a state made for a 64-element leaf: the
    # size check must run here too (without it, update_ would write past the end)
    hb = refopt.Hyperball(refopt.SGD(momentum=0.9), lr=0.1)
    st = refopt.init(hb, np.ones(64))
    for fn in ("update", "update_"):
        try:
            getattr(refopt, fn)(hb, st, np.zeros(4), np.ones(4))
            out["hyperball zero leaf / " + fn] = "accepted"
        except ValueError:
            out["hyperball zero leaf / " + fn] = "raised"
    mu = refopt.Muon()
    st = refopt.init(mu, np.ones((8, 8)))
    for fn in ("update", "update_"):
        try:
            getattr(refopt, fn)(mu, st, np.ones(4), np.ones(4))
            out["muon 1-D leaf / " + fn] = "accepted"
        except ValueError:
            out["muon 1-D leaf / " + fn] = "raised"
    print(json.dumps(out))
""")


def test_foreign_states_are_rejected_for_every_catalog_rule_before_writing():
    r = subprocess.run([sys.executable, "-c", _FOREIGN, HERE, ROOT], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, f"the interpreter died (status {r.returncode}):\n{r.stderr[-3000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res) > 200
    bad = {k: v for k, v in res.items() if v != "raised"}
    assert not bad, bad


def test_the_state_check_propagates_the_rules_exceptions():
    @dataclass(frozen=True)
    class Picky(refopt.SGD):
        def leaf_spec(self, x, path):
            raise RuntimeError("picky")

    with pytest.raises(RuntimeError, match="picky"):
        refopt.init(Picky(lr=0.1), np.ones(3))


def test_kernels_refuse_arrays_of_other_sizes_before_running():
    k = refopt.rules.adam._ADAM
    rule = refopt.Adam()
    c, _ = rule.context(1, None)
    x = np.ones(8)
    bad_state = refopt.rules.adam.AdamState(np.zeros(8), np.zeros(3))
    with pytest.raises(ValueError, match=r"state\.v is float64 of 3 elements, expected float64 of 8"):
        k.step(x, np.ones(8), bad_state, c)
    with pytest.raises(ValueError, match="g is float64 of 2 elements"):
        k.step(x, np.ones(2), refopt.rules.adam.AdamState(np.zeros(8), np.zeros(8)), c)
    with pytest.raises(ValueError, match="float32"):
        k.step(x, np.ones(8), refopt.rules.adam.AdamState(np.zeros(8, np.float32), np.zeros(8)), c)
    ro = np.ones(8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        k.step(ro, np.ones(8), refopt.rules.adam.AdamState(np.zeros(8), np.zeros(8)), c)
    assert np.array_equal(x, np.ones(8))


# --- every step scalar through one checked cast ---------------------------------------------------

def _nothing_written(rule, x, g, match, exc=ValueError):
    s = refopt.init(rule, x)
    xs, ss = T.copy(x), T.copy(s)
    with pytest.raises(exc, match=match):
        refopt.update_(rule, s, x, g)
    assert all(np.array_equal(a, b) for a, b in zip(T.leaves(x), T.leaves(xs)))
    assert all(np.array_equal(a, b) for a, b in zip(T.leaves(s), T.leaves(ss)) if isinstance(a, np.ndarray))
    with pytest.raises(exc, match=match):
        refopt.update(rule, s, x, g)


@pytest.mark.parametrize("rule, match", [
    (refopt.Muon(lr=1e39), "lr"),
    (refopt.Covariant(refopt.SGD(), lr=1e39), "lr_t"),
    (refopt.Hyperball(refopt.SGD(), lr=1e39), "lr_t"),
    (refopt.ScheduleFreeSGD(lr=1e39), "lr"),
    (refopt.ScheduleFreeAdamW(lr=1e39), "lr"),
    (refopt.SGD(lr=1e39), "lr_t"),
    (refopt.Adam(lr=1e39), "lr_t|step"),
    (refopt.Lion(lr=1e39), "lr_t"),
    (refopt.SGD(lr=0.1, weight_decay=1e39), "weight_decay"),
    (refopt.Adam(lr=0.1, weight_decay=1e39), "l2"),
    (refopt.ScheduleFreeSGD(lr=0.1, weight_decay=1e39), "weight_decay"),
    (refopt.ScheduleFreeAdamW(lr=0.1, eps=1e-50), "eps"),
    (refopt.Adam(lr=0.1, eps=1e-50), "eps"),
    (refopt.Partition(rules={"hidden": refopt.Muon(lr=1e39), "other": refopt.AdamW(lr=0.1)},
                      labels=refopt.matrix_labels), "lr"),
])
def test_step_scalars_that_do_not_fit_float32_raise_before_anything_is_written(rule, match):
    rng = np.random.default_rng(0)
    x = {"a": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    if isinstance(rule, refopt.Muon):
        x = {"a": x["a"], "b": rng.standard_normal((3, 5)).astype(np.float32)}
    g = T.tree_map(lambda a: np.ones_like(a), x)
    _nothing_written(rule, x, g, match)


def test_a_zero_schedule_stays_legal_in_float32():
    rule = refopt.SGD(lr=0.1, schedule=lambda t: 0.0)
    x = np.ones(3, np.float32)
    y, _ = refopt.update(rule, refopt.init(rule, x), x, x)
    assert np.array_equal(y, x) and y.dtype == np.float32


@pytest.mark.parametrize("rule", [refopt.Adam(), refopt.AdamW(amsgrad=True), refopt.ScheduleFreeAdamW(),
                                  refopt.Hyperball(refopt.Adam(), lr=0.1),
                                  refopt.Partition(rules={"hidden": refopt.Adam()}, labels=lambda p, a: "hidden")])
def test_a_gradient_whose_square_overflows_is_reported_before_writing(rule):
    x = np.ones(5, np.float32)
    g = np.ones(5, np.float32)
    g[3] = 1e30                     # finite in float32, but g**2 = 1e60 is not
    _nothing_written(rule, x, g, r"gradient at <root> has \|g\| = 1e\+30, whose square overflows float32",
                     FloatingPointError)
    y, _ = refopt.update(rule, refopt.init(rule, x.astype(np.float64)), x.astype(np.float64), g.astype(np.float64))
    assert np.isfinite(y).all()     # float64 holds the square


def test_non_second_moment_rules_take_large_finite_gradients():
    x, g = np.ones(3, np.float32), np.full(3, 1e30, np.float32)
    for rule in (refopt.SGD(lr=1e-30), refopt.Lion(lr=0.1), refopt.ClipByGlobalNorm(refopt.Adam(), max_norm=1.0)):
        y, s = refopt.update(rule, refopt.init(rule, x), x, g)
        assert np.isfinite(y).all() and all(np.isfinite(a).all() for a in T.leaves(s) if isinstance(a, np.ndarray))


def test_check_finite_false_skips_the_gradient_pass():
    x, g = np.ones(3), np.array([1.0, np.nan, 1.0])
    y, _ = refopt.update_(refopt.SGD(lr=0.1), refopt.init(refopt.SGD(lr=0.1), x), x, g, check_finite=False)
    assert np.isnan(y[1])


# --- parallel and serial loops agree bit for bit, state included ------------------------------------

def _catalog():
    sys.path.insert(0, HERE)
    from catalog import all_cases
    return all_cases()


@pytest.mark.parametrize("case", _catalog(), ids=lambda c: c.name)
def test_parallel_and_serial_kernels_agree_bit_for_bit(case, monkeypatch):
    rule = case.make_rule()
    params = T.tree_map(lambda a: np.tile(a, (1,) * (a.ndim - 1) + (max(1, 70_000 // a.size + 1),)) if a.ndim
                        else a, case.make_params(np.float64, 0))
    rng = np.random.default_rng(3)
    grads = [T.tree_map(lambda a: rng.standard_normal(a.shape), params) for _ in range(2)]
    outs = []
    for threshold in (0, 1 << 40):
        monkeypatch.setattr(kernels, "PARALLEL_MIN_SIZE", threshold)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", refopt.RefoptWarning)
            x, s = T.copy(params), refopt.init(rule, params)
        for g in grads:
            x, s = refopt.update(rule, s, x, g)
        outs.append((T.leaves(x), [a for a in T.leaves(s.leaves) if isinstance(a, np.ndarray)]))
    for a, b in zip(outs[0][0] + outs[0][1], outs[1][0] + outs[1][1]):
        assert np.array_equal(a, b)


# --- what update reports ------------------------------------------------------------------------

def test_info_reports_the_lr_each_group_applied():
    sched = refopt.schedules.warmup_cosine(2, 10)
    rule = refopt.Partition(rules={"hidden": refopt.Muon(lr=0.02, schedule=sched),
                                   "other": refopt.AdamW(lr=3e-3, schedule=sched)}, labels=refopt.matrix_labels)
    x = {"w": np.ones((3, 4)), "b": np.ones(4)}
    s = refopt.init(rule, x)
    for t in (1, 2, 3):
        info = {}
        x, s = refopt.update_(rule, s, x, T.tree_map(np.ones_like, x), info=info)
        assert info["t"] == t and info["lr"] == {"hidden": 0.02 * sched(t), "other": 3e-3 * sched(t)}
    sf = refopt.ScheduleFreeAdamW(lr=0.1, warmup_steps=4)
    info = {}
    refopt.update(sf, refopt.init(sf, np.ones(2)), np.ones(2), np.ones(2), info=info)
    assert info["lr"] == {"all": 0.1 * 1 / 4}
    cov = refopt.Covariant(refopt.Adam(lr=5.0), lr=0.01)
    info = {}
    refopt.update(cov, refopt.init(cov, np.ones(2)), np.ones(2), np.ones(2), info=info)
    assert info["lr"] == {"all": 0.01}     # the wrapper's lr, not its base's


def test_partition_warns_when_a_rule_gets_no_parameter():
    rule = refopt.Partition(rules={"hidden": refopt.Muon(), "other": refopt.AdamW()},
                            labels=lambda p, a: "other")
    with pytest.warns(refopt.RefoptWarning, match="'hidden', so its rule Muon never runs"):
        refopt.init(rule, {"w": np.ones((3, 3))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", refopt.RefoptWarning)      # users can make it an error
        with pytest.raises(refopt.RefoptWarning):
            refopt.init(rule, {"w": np.ones((3, 3))})


def test_mlp_labels_passed_uncalled_says_what_to_do():
    pytest.importorskip("refopt.models.mlp")
    rule = refopt.Partition(rules={"hidden": refopt.Muon(), "other": refopt.AdamW()}, labels=refopt.mlp_labels)
    with pytest.raises(TypeError, match=r"labels=refopt.mlp_labels\(params\)"):
        refopt.init(rule, {"w": np.ones((3, 3))})


def test_the_readme_mlp_gives_muon_a_matrix_in_the_api_as_in_the_cli():
    from refopt.models import mlp
    params = mlp.init(0, [64, 128, 10])
    labels = refopt.mlp_labels(params)
    assert [layer["w"] for layer in labels["layers"]] == ["hidden", "other"]
    from refopt.cli.tasks import MLPTask
    assert MLPTask.labels(type("T", (), {"mlp": mlp})(), params) == labels


# --- a new rule is one small definition -----------------------------------------------------------

class _SignState(NamedTuple):
    m: np.ndarray


class _SignContext(NamedTuple):
    lr_t: float
    decay: float
    step: float
    u_scale: float
    beta: float
    omb: float


@numba.njit
def _signum(x, g, s, i, c):
    m = c.beta * s.m[i] + c.omb * g
    s.m[i] = m
    return np.sign(m)


_SIGNUM = kernels.Elementwise(_signum, "test_signum")


@dataclass(frozen=True)
class Signum(refopt.rules.ElementwiseRule):
    """Signum (Bernstein et al. 2018): m_t = beta m_{t-1} + (1 - beta) g_t; x_t = x_{t-1} - lr sign(m_t)."""

    lr: float = 0.01
    beta: float = 0.9
    schedule: object = None
    State = _SignState

    def context(self, t, glob):
        lr_t = refopt.rules.base.lr_at(self, t)
        return _SignContext(lr_t, 1.0, lr_t, 1.0, self.beta, 1.0 - self.beta), glob

    def kernel(self):
        return _SIGNUM


def test_a_new_rule_in_a_few_lines_runs_every_path():
    rule = Signum(lr=0.1)
    x = {"w": np.array([[1.0, -2.0], [0.5, 3.0]]), "b": np.array([0.0, 1.0], np.float32)}
    g = {"w": np.array([[1.0, -1.0], [-2.0, 0.0]]), "b": np.array([3.0, -3.0], np.float32)}
    s = refopt.init(rule, x)
    y, s1 = refopt.update(rule, s, x, g)
    np.testing.assert_array_equal(y["w"], x["w"] - 0.1 * np.sign(g["w"]))
    assert y["b"].dtype == np.float32
    y2, s2 = refopt.update_(rule, refopt.init(rule, T.copy(x)), T.copy(x), g)
    assert all(np.array_equal(a, b) for a, b in zip(T.leaves(y), T.leaves(y2)))
    u, _ = refopt.direction(rule, s, x, g)
    np.testing.assert_array_equal(u["w"], np.sign(g["w"]))
    with pytest.raises(ValueError, match="state array at b"):
        refopt.update(rule, s1._replace(leaves={"w": s1.leaves["w"], "b": _SignState(np.zeros(3, np.float32))}),
                      x, g)


def test_decoupled_decay_under_any_field_name_is_rejected_by_direction_wrappers():
    @dataclass(frozen=True)
    class ShrinkingSignum(Signum):
        shrink: float = 0.1

        def decoupled_decay(self):
            return self.shrink > 0

    with pytest.raises(ValueError, match="acting on the weights"):
        refopt.Hyperball(ShrinkingSignum(), lr=0.1)
    refopt.Hyperball(ShrinkingSignum(shrink=0.0), lr=0.1)
    for base in (refopt.AdamW(weight_decay=0.1), refopt.Lion(weight_decay=0.1), refopt.Muon(weight_decay=0.1)):
        with pytest.raises(ValueError, match="acting on the weights"):
            refopt.Covariant(base)


def test_state_spec_is_the_documented_shape():
    spec = refopt.Hyperball(refopt.Adam(), lr=0.1).leaf_spec(np.ones((2, 3), np.float32), "w")
    assert spec.radius.shape == () and spec.radius.dtype == np.float32
    assert isinstance(spec.base.m, ArraySpec) and spec.base.m.shape == (2, 3)


def test_average_of_equal_iterates_is_only_close():
    """The docstring's claim as reworded: ((t-1) mu + x)/t is not exact in floating point; each step adds at
    most a few units of roundoff (here after 50 steps: at most 50 ulps, and not 0)."""
    rule = refopt.Average(refopt.SGD(lr=0.0))
    x = np.random.default_rng(0).standard_normal(1000)
    s = refopt.init(rule, x)
    for _ in range(50):
        x, s = refopt.update(rule, s, x, np.ones_like(x))
    mu = refopt.eval_params(rule, s, x)
    ulps = np.abs(mu - x) / np.spacing(np.abs(x))
    assert 0 < np.max(ulps) <= 50


# ---- an infinite parameter without weight decay (torch's convention: no 0 * x term) ----------------------
_INF_X = np.array([np.inf, -np.inf, 1.0, -2.0])
_INF_G = [np.array([1.0, -1.0, 0.5, 0.25]), np.array([-0.5, 2.0, 0.25, 1.0]), np.array([0.125, 0.5, -1.0, 0.5])]


def _torch_run(make):
    torch = pytest.importorskip("torch")
    x = torch.tensor(_INF_X, requires_grad=True)
    opt = make(torch.optim, [x])
    for g in _INF_G:
        x.grad = torch.tensor(g)
        opt.step()
    state = opt.state[x]
    return x.detach().numpy(), {k: v.numpy() for k, v in state.items() if k != "step"}


@pytest.mark.parametrize("rule, make, names", [
    (refopt.SGD(lr=0.1), lambda o, p: o.SGD(p, lr=0.1), {}),
    (refopt.SGD(lr=0.1, momentum=0.9), lambda o, p: o.SGD(p, lr=0.1, momentum=0.9), {"b": "momentum_buffer"}),
    (refopt.SGD(lr=0.1, momentum=0.9, nesterov=True), lambda o, p: o.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
     {"b": "momentum_buffer"}),
    (refopt.Adam(lr=0.01), lambda o, p: o.Adam(p, lr=0.01), {"m": "exp_avg", "v": "exp_avg_sq"}),
    (refopt.AdamW(lr=0.01, weight_decay=0.0), lambda o, p: o.AdamW(p, lr=0.01, weight_decay=0.0),
     {"m": "exp_avg", "v": "exp_avg_sq"}),
], ids=["sgd", "sgd_momentum", "sgd_nesterov", "adam", "adamw_wd0"])
def test_an_infinite_param_stays_infinite_and_the_state_finite_without_weight_decay(rule, make, names):
    """x = +-inf with weight decay 0: torch adds no lambda*x term, so x stays +-inf and the moments stay
    finite; refopt (pure and in-place) must give the same, not 0 * inf = NaN in the state."""
    want_x, want_state = _torch_run(make)
    assert np.array_equal(want_x[:2], _INF_X[:2])
    x, state = _INF_X.copy(), refopt.init(rule, _INF_X)
    x_, state_ = _INF_X.copy(), refopt.init(rule, _INF_X)
    for g in _INF_G:
        x, state = refopt.update(rule, state, x, g)
        x_, state_ = refopt.update_(rule, state_, x_, g)
    np.testing.assert_array_equal(x, x_)
    np.testing.assert_array_equal(x[:2], _INF_X[:2])
    np.testing.assert_allclose(x[2:], want_x[2:], rtol=1e-15, atol=0)
    for field, peer in names.items():
        got = getattr(state.leaves, field)
        assert np.isfinite(got).all(), f"{field} = {got}"
        np.testing.assert_allclose(got, want_state[peer], rtol=1e-15, atol=0)


def test_an_unconditional_decay_term_is_what_the_test_catches():
    """Negative control: the arithmetic g + 0 * x (a decay term added even when the decay is 0) makes the
    moment NaN at an infinite x."""
    with np.errstate(invalid="ignore"):
        m = 0.9 * 0.0 + 0.1 * (1.0 + 0.0 * _INF_X[0])
    assert not np.isfinite(m)

"""The optimizer API (refopt.core) on SGD / Adam / AdamW: purity, in-place twin, trees, errors, validation."""
import dataclasses
import math
from typing import NamedTuple

import numpy as np
import pytest

import refopt
from refopt import tree as T
from refopt.core import OptState, direction, eval_params, init, update, update_
from refopt.rules.adam import Adam, AdamW
from refopt.rules.sgd import SGD

RULES = {
    "sgd": lambda: SGD(lr=0.05),
    "sgd_l2": lambda: SGD(lr=0.05, weight_decay=0.01),
    "sgd_mom_damp": lambda: SGD(lr=0.05, momentum=0.9, dampening=0.2, weight_decay=1e-3),
    "sgd_nesterov": lambda: SGD(lr=0.05, momentum=0.9, nesterov=True, schedule=lambda t: 1.0 / t),
    "adam": lambda: Adam(lr=0.01),
    "adam_l2_sched": lambda: Adam(lr=0.01, weight_decay=0.05, schedule=lambda t: min(1.0, t / 3)),
    "adamw": lambda: AdamW(lr=0.01, weight_decay=0.1),
    "adamw_ind": lambda: AdamW(lr=0.01, weight_decay=0.01, wd_mode="independent", schedule=lambda t: 0.9 ** t),
}


class Layer(NamedTuple):
    w: np.ndarray
    b: np.ndarray


def params_tree(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return {"layers": [Layer(rng.standard_normal((4, 3)).astype(dtype), rng.standard_normal(3).astype(dtype)),
                       Layer(rng.standard_normal((3, 2)).astype(dtype), rng.standard_normal(2).astype(dtype))],
            "scale": (rng.standard_normal(()).astype(dtype),), "frozen": None}


def grads_like(params, seed):
    rng = np.random.default_rng(seed)
    return T.tree_map(lambda a: rng.standard_normal(a.shape).astype(a.dtype), params)


def all_arrays(*trees):
    out = []
    for tr in trees:
        out += [a for a in T.leaves(tr) if isinstance(a, np.ndarray)]
    return out


def bits_equal(a, b):
    la, lb = T.leaves(a), T.leaves(b)
    assert T.structure(a) == T.structure(b)
    for x, y in zip(la, lb):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        else:
            assert x == y


ids = list(RULES)


# ------------------------------------------------------------------------------------------ purity

@pytest.mark.parametrize("name", ids)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_is_pure_with_read_only_inputs(name, dtype):
    rule = RULES[name]()
    params = params_tree(dtype)
    state = init(rule, params)
    params, state = update(rule, state, params, grads_like(params, 1))  # non-trivial state
    grads = grads_like(params, 2)
    copies = T.copy((params, state.leaves, grads))
    for a in all_arrays(params, state.leaves, grads):
        a.flags.writeable = False
    new_p, new_s = update(rule, state, params, grads)
    bits_equal((params, state.leaves, grads), copies)
    assert state.t == 1 and new_s.t == 2
    # new arrays, none shared with the inputs
    ins = {id(a) for a in all_arrays(params, state.leaves, grads)}
    assert not ins & {id(a) for a in all_arrays(new_p, new_s.leaves)}
    assert not np.array_equal(T.leaves(new_p)[0], T.leaves(params)[0])


@pytest.mark.parametrize("name", ids)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_direction_is_pure_with_read_only_inputs(name, dtype):
    # the kernels write x in a branch that direction never takes; numba refuses to compile a kernel that
    # writes a read-only array, so direction() must run on read-only params without a TypingError.
    rule = RULES[name]()
    params = params_tree(dtype)
    state = init(rule, params)
    params, state = update(rule, state, params, grads_like(params, 1))
    grads = grads_like(params, 2)
    u_ref, s_ref = direction(rule, state, T.copy(params), grads)
    copies = T.copy((params, state.leaves, grads))
    for a in all_arrays(params, state.leaves, grads):
        a.flags.writeable = False
    u, new_s = direction(rule, state, params, grads)
    bits_equal((params, state.leaves, grads), copies)
    bits_equal(u, u_ref)
    bits_equal(new_s.leaves, s_ref.leaves)
    ins = {id(a) for a in all_arrays(params, state.leaves, grads)}
    assert not ins & {id(a) for a in all_arrays(new_s.leaves, u)}


@pytest.mark.parametrize("name", ids)
def test_init_does_not_touch_params(name):
    params = params_tree()
    for a in all_arrays(params):
        a.flags.writeable = False
    state = init(RULES[name](), params)
    assert state.t == 0 and type(state.t) is int
    assert T.structure(state.leaves, is_leaf=lambda n: hasattr(n, "_fields") and not isinstance(n, Layer)) \
        == T.structure(params)


# ------------------------------------------------------------------------------------------ update_ twin

@pytest.mark.parametrize("name", ids)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_and_update_inplace_bit_identical(name, dtype):
    rule = RULES[name]()
    p_pure = params_tree(dtype)
    p_inpl = T.copy(p_pure)
    s_pure, s_inpl = init(rule, p_pure), init(rule, p_inpl)
    for k in range(5):
        g = grads_like(p_pure, 10 + k)
        p_pure, s_pure = update(rule, s_pure, p_pure, g)
        p_inpl, s_inpl = update_(rule, s_inpl, p_inpl, g)
        bits_equal(p_pure, p_inpl)
        bits_equal(s_pure.leaves, s_inpl.leaves)
        assert s_pure.t == s_inpl.t == k + 1
        assert T.leaves(p_pure)[0].dtype == dtype


@pytest.mark.parametrize("name", ids)
def test_update_inplace_returns_the_given_arrays(name):
    rule = RULES[name]()
    params = params_tree()
    state = init(rule, params)
    before = T.copy(params)
    p_ids = [id(a) for a in T.leaves(params)]
    s_ids = [id(a) for a in all_arrays(state.leaves)]
    new_p, new_s = update_(rule, state, params, grads_like(params, 3))
    assert [id(a) for a in T.leaves(new_p)] == p_ids
    assert [id(a) for a in all_arrays(new_s.leaves)] == s_ids
    assert new_s.t == 1
    # and it did write them
    assert not np.array_equal(T.leaves(params)[0], T.leaves(before)[0])


@pytest.mark.parametrize("name", ["sgd_mom_damp", "adam", "adamw"])
def test_update_inplace_rejects_read_only(name):
    rule = RULES[name]()
    params = params_tree()
    state = init(rule, params)
    grads = grads_like(params, 4)
    before = T.copy((params, state.leaves))
    params["layers"][1].w.flags.writeable = False
    with pytest.raises(ValueError, match=r"layers\[1\]\.w"):
        update_(rule, state, params, grads)
    bits_equal((params, state.leaves), before)  # nothing written, not even the earlier leaves
    params["layers"][1].w.flags.writeable = True
    all_arrays(state.leaves)[-1].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        update_(rule, state, params, grads)
    bits_equal((params, state.leaves), before)


def test_update_inplace_rejects_non_contiguous_param():
    rule = Adam(lr=0.1)
    x = np.zeros((4, 6))[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        update_(rule, init(rule, x), x, np.ones_like(x))


# ------------------------------------------------------------------------------------------ trees

@pytest.mark.parametrize("name", ids)
def test_tree_equals_single_bare_array(name):
    rule = RULES[name]()
    params = params_tree()
    s_tree = init(rule, params)
    singles = [(x, init(rule, x)) for x in T.leaves(params)]
    for k in range(3):
        grads = grads_like(params, 20 + k)
        params, s_tree = update(rule, s_tree, params, grads)
        singles = [update(rule, s, x, g) for (x, s), g in zip(singles, T.leaves(grads))]
        for a, (b, sb) in zip(T.leaves(params), singles):
            assert a.tobytes() == b.tobytes()
            assert sb.t == s_tree.t == k + 1
    # a bare ndarray is a tree of one leaf: its state's leaves is the per-array NamedTuple itself
    x = np.ones(3)
    assert type(init(rule, x).leaves).__name__.endswith("State")


def test_dict_order_does_not_matter():
    rule = Adam(lr=0.1)
    a = {"x": np.ones(2), "y": np.full(3, 2.0)}
    b = {"y": np.full(3, 2.0), "x": np.ones(2)}
    ga = {"x": np.array([1.0, -1.0]), "y": np.array([0.5, 0.0, 3.0])}
    gb = {"y": ga["y"], "x": ga["x"]}
    pa, _ = update(rule, init(rule, a), a, ga)
    pb, _ = update(rule, init(rule, b), b, gb)
    for k in "xy":
        np.testing.assert_array_equal(pa[k], pb[k])


def test_leaf_path_in_mismatch_errors():
    rule = Adam(lr=0.1)
    params = params_tree()
    state = init(rule, params)
    good = grads_like(params, 5)
    bad_shape = T.copy(good)
    bad_shape["layers"][1] = Layer(np.zeros((2, 3)), bad_shape["layers"][1].b)
    bad_dtype = T.copy(good)
    bad_dtype["layers"][1] = Layer(bad_dtype["layers"][1].w.astype(np.float32), bad_dtype["layers"][1].b)
    bad_struct = T.copy(good)
    bad_struct["layers"][1] = Layer([bad_struct["layers"][1].w], bad_struct["layers"][1].b)
    for fn in (update, update_, direction):
        for g in (bad_shape, bad_dtype, bad_struct):
            with pytest.raises(ValueError, match=r"layers\[1\]\.w"):
                fn(rule, state, params, g)
    with pytest.raises(ValueError, match="layers"):
        update(rule, state, params, {**good, "layers": good["layers"][:1]})
    with pytest.raises(ValueError, match="Layer vs tuple"):
        update(rule, state, params, {**good, "layers": [good["layers"][0], tuple(good["layers"][1])]})


def test_state_of_other_params_rejected():
    rule = Adam(lr=0.1)
    with pytest.raises(ValueError, match="state"):
        update(rule, init(rule, {"a": np.zeros(2), "b": np.zeros(2)}), {"a": np.zeros(2)}, {"a": np.ones(2)})
    with pytest.raises(TypeError):
        update(rule, (0, None, None), {"a": np.zeros(2)}, {"a": np.ones(2)})


def test_state_nested_deeper_than_params_rejected_clearly():
    # a ValueError naming the leaf, not the list [AdamState] handed to the rule as if it were the leaf
    # state (an AttributeError "'list' object has no attribute 'm'" from inside the rule).
    rule = Adam(lr=0.1)
    s_other = init(rule, {"a": [np.zeros(2)]})
    with pytest.raises(ValueError, match=r"\ba\b"):
        update(rule, s_other, {"a": np.zeros(2)}, {"a": np.ones(2)})


# ------------------------------------------------------------------------------------------ non-finite

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["sgd_mom_damp", "adam", "adamw_ind"])
def test_non_finite_gradient_raises_and_writes_nothing(name, bad):
    rule = RULES[name]()
    params = params_tree()
    state = init(rule, params)
    params, state = update_(rule, state, params, grads_like(params, 6))
    grads = grads_like(params, 7)
    grads["layers"][1].b[1] = bad
    before = T.copy((params, state.leaves))
    for fn in (update, update_, direction):
        with pytest.raises(FloatingPointError, match=r"layers\[1\]\.b"):
            fn(rule, state, params, grads)
        bits_equal((params, state.leaves), before)


def test_check_finite_false_lets_nan_through():
    rule = Adam(lr=0.1)
    x = np.ones(3)
    g = np.array([1.0, np.nan, 1.0])
    x, s = update_(rule, init(rule, x), x, g, check_finite=False)
    assert np.isnan(x[1]) and np.isfinite(x[0]) and s.t == 1


# ------------------------------------------------------------------------------------------ validation

INVALID = [
    (SGD, dict(lr=-1e-3), "lr"),
    (SGD, dict(lr=math.nan), "lr"),
    (SGD, dict(lr=math.inf), "lr"),
    (SGD, dict(lr="0.1"), "lr"),
    (SGD, dict(momentum=1.0), "momentum"),
    (SGD, dict(momentum=-0.1), "momentum"),
    (SGD, dict(momentum=0.9, dampening=1.0), "dampening"),
    (SGD, dict(weight_decay=-1.0), "weight_decay"),
    (SGD, dict(nesterov=True), "nesterov"),
    (SGD, dict(nesterov=True, momentum=0.9, dampening=0.1), "nesterov"),
    (SGD, dict(schedule=3.0), "schedule"),
    (Adam, dict(lr=-1.0), "lr"),
    (Adam, dict(lr=math.nan), "lr"),
    (Adam, dict(beta1=1.0), "beta1"),
    (Adam, dict(beta1=-0.1), "beta1"),
    (Adam, dict(beta2=1.0), "beta2"),
    (Adam, dict(beta2=1.5), "beta2"),
    (Adam, dict(beta2=math.nan), "beta2"),
    (Adam, dict(eps=0.0), "eps"),
    (Adam, dict(eps=-1e-8), "eps"),
    (Adam, dict(eps=math.inf), "eps"),
    (Adam, dict(weight_decay=-0.1), "weight_decay"),
    (AdamW, dict(wd_mode="coupled"), "wd_mode"),
    (AdamW, dict(wd_mode="independent", weight_decay=2.0), "weight_decay"),
    (AdamW, dict(weight_decay=math.nan), "weight_decay"),
    (AdamW, dict(beta1=True), "beta1"),
]


@pytest.mark.parametrize("cls,kw,field", INVALID, ids=[f"{c.__name__}-{k}" for c, k, _ in INVALID])
def test_invalid_hyperparameters(cls, kw, field):
    with pytest.raises(ValueError, match=field):
        cls(**kw)


def test_valid_edge_hyperparameters():
    SGD(lr=0.0, momentum=0.0, dampening=0.0)
    Adam(lr=0.0, beta1=0.0, beta2=0.0, eps=1e-300)
    AdamW(weight_decay=0.0, wd_mode="independent")
    AdamW(weight_decay=1.0, wd_mode="independent")


def test_rules_are_frozen():
    r = AdamW(lr=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.lr = 0.2
    assert r.hyperparameters()["lr"] == 0.1 and r.hyperparameters()["wd_mode"] == "decoupled"


def test_torch_defaults():
    assert (SGD().lr, SGD().momentum, SGD().dampening, SGD().nesterov, SGD().weight_decay) == (1e-3, 0, 0, False, 0)
    a, w = Adam(), AdamW()
    assert (a.lr, a.beta1, a.beta2, a.eps, a.weight_decay) == (1e-3, 0.9, 0.999, 1e-8, 0.0)
    assert (w.weight_decay, w.wd_mode) == (0.01, "decoupled")


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_schedule_value_raises_at_update(bad):
    rule = Adam(lr=0.1, schedule=lambda t: bad if t == 2 else 1.0)
    x = np.ones(2)
    x, s = update(rule, init(rule, x), x, np.ones(2))
    with pytest.raises(ValueError, match="schedule"):
        update(rule, s, x, np.ones(2))


def test_schedule_sees_t_starting_at_1():
    seen = []
    rule = SGD(lr=1.0, schedule=lambda t: seen.append(t) or 1.0)
    x, s = np.zeros(1), init(rule, np.zeros(1))
    for _ in range(3):
        x, s = update(rule, s, x, np.ones(1))
    assert seen == [1, 2, 3] and s.t == 3 and x[0] == -3.0


# ------------------------------------------------------------------------------------------ misc API

@pytest.mark.parametrize("name", ids)
def test_eval_params_of_plain_rule_is_params(name):
    rule = RULES[name]()
    params = params_tree()
    state = init(rule, params)
    params, state = update(rule, state, params, grads_like(params, 8))
    ev = eval_params(rule, state, params)
    assert T.structure(ev) == T.structure(params)
    assert all(a is b for a, b in zip(T.leaves(ev), T.leaves(params)))


@pytest.mark.parametrize("name", ids)
def test_state_counts_updates(name):
    rule = RULES[name]()
    x = np.ones(3)
    s = init(rule, x)
    assert isinstance(s, OptState) and s.t == 0
    for k in range(1, 4):
        x, s = update(rule, s, x, np.ones(3))
        assert s.t == k and type(s.t) is int
    _, s2 = direction(rule, s, x, np.ones(3))
    assert s2.t == 4 and s.t == 3


def test_direction_does_not_advance_callers_state():
    rule = Adam(lr=0.1)
    x = np.ones(3)
    s = init(rule, x)
    u1, s1 = direction(rule, s, x, np.ones(3))
    u2, _ = direction(rule, s, x, np.ones(3))
    np.testing.assert_array_equal(u1, u2)
    assert not s.leaves.m.any() and s1.leaves.m.any()


def test_state_dtypes_follow_params():
    params = {"a": np.zeros(3, np.float32), "b": np.zeros(2, np.float64)}
    for rule in (SGD(lr=0.1, momentum=0.9), Adam(), AdamW()):
        s = init(rule, params)
        for key in params:
            for arr in s.leaves[key]:
                assert arr.dtype == params[key].dtype and arr.shape == params[key].shape
        new_p, s = update(rule, s, params, {k: np.ones_like(v) for k, v in params.items()})
        assert new_p["a"].dtype == np.float32 and new_p["b"].dtype == np.float64
        assert all(arr.dtype == np.float32 for arr in s.leaves["a"])


def test_integer_params_rejected():
    with pytest.raises(TypeError, match="int64"):
        init(Adam(), {"w": np.zeros(3, np.int64)})


# ---- the state must belong to the params and the rule (a kernel would otherwise index past an array) ----

def test_state_for_smaller_params_is_rejected_before_any_kernel_runs():
    r = refopt.Adam()
    s = refopt.init(r, {"a": np.ones(2)})
    with pytest.raises(ValueError, match=r"state array at a is float64 \(2,\), expected float64 \(100,\)"):
        refopt.update(r, s, {"a": np.ones(100)}, {"a": np.ones(100)})


def test_swapped_leaf_shapes_are_rejected():
    r = refopt.Adam()
    s = refopt.init(r, {"a": np.ones(3), "b": np.ones(5)})
    with pytest.raises(ValueError, match="state array at a"):
        refopt.update_(r, s, {"a": np.ones(5), "b": np.ones(3)}, {"a": np.ones(5), "b": np.ones(3)})


def test_state_of_a_rule_without_momentum_is_rejected_by_a_rule_with_momentum():
    x, g = np.ones(3), np.ones(3)
    s = refopt.init(refopt.SGD(lr=0.1), x)  # no momentum: a size-0 buffer
    with pytest.raises(ValueError, match=r"expected float64 \(3,\)"):
        refopt.update(refopt.SGD(lr=0.1, momentum=0.9), s, x, g)


def test_state_of_another_rule_or_dtype_is_rejected():
    x, g = np.ones((3, 2)), np.ones((3, 2))
    with pytest.raises(ValueError, match="not the state Muon makes"):
        refopt.update(refopt.Muon(lr=0.1), refopt.init(refopt.Adam(), x), x, g)
    s32 = refopt.init(refopt.Adam(), x.astype(np.float32))
    with pytest.raises(ValueError, match="expected float64"):
        refopt.update(refopt.Adam(), s32, x, g)


@pytest.mark.parametrize("t", [2.5, -1, "abc", True])
def test_bad_step_count_is_rejected(t):
    x = np.ones(2)
    s = refopt.init(refopt.Adam(), x)._replace(t=t)
    with pytest.raises(ValueError, match="state.t must be an int >= 0"):
        refopt.update(refopt.Adam(), s, x, x)


def test_zero_d_params_keep_their_shape():
    x = np.array(1.5)
    for rule in (refopt.Adam(lr=0.1), refopt.EMA(refopt.SGD(lr=0.1), decay=0.9), refopt.ScheduleFreeSGD(lr=0.1)):
        s = refopt.init(rule, x)
        assert all(a.shape in ((), (0,)) for a in refopt.tree.leaves(s.leaves) if isinstance(a, np.ndarray))
        x1, s1 = refopt.update(rule, s, x, np.array(0.5))
        assert x1.shape == () and refopt.eval_params(rule, s1, x1).shape == ()


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble, np.dtype(">f8")])
def test_unsupported_float_dtypes_are_rejected_at_init(dtype):
    if np.dtype(dtype) == np.float64:  # platforms where longdouble is float64
        pytest.skip("longdouble is float64 here")
    with pytest.raises(TypeError, match="float32 or float64"):
        refopt.init(refopt.SGD(lr=0.1), np.ones(3, dtype=dtype))


def test_update_inplace_rejects_aliased_params():
    w = np.ones((2, 2))
    params = {"a": w, "b": w}
    s = refopt.init(refopt.SGD(lr=0.1), params)
    with pytest.raises(ValueError, match="params a and b share memory"):
        refopt.update_(refopt.SGD(lr=0.1), s, params, {"a": np.ones((2, 2)), "b": np.ones((2, 2))})
    assert (w == 1).all()
    halves = np.ones(4)
    with pytest.raises(ValueError, match="share memory"):
        refopt.update_(refopt.SGD(lr=0.1), refopt.init(refopt.SGD(lr=0.1), [halves[:3], halves[2:]]),
                       [halves[:3], halves[2:]], [np.ones(3), np.ones(2)])
    # disjoint views of one buffer are fine
    p2 = [halves[:2], halves[2:]]
    refopt.update_(refopt.SGD(lr=0.1), refopt.init(refopt.SGD(lr=0.1), p2), p2, [np.ones(2), np.ones(2)])
    assert np.allclose(halves, 0.9)


def test_hyperparameters_that_do_not_fit_float32_are_rejected():
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="eps = 1e-50 is 0 in float32"):
        refopt.update(refopt.Adam(eps=1e-50), refopt.init(refopt.Adam(eps=1e-50), x), x, x)
    big = refopt.SGD(lr=0.1, schedule=lambda t: 1e300)
    with pytest.raises(ValueError, match="is not finite in float32"):
        refopt.update(big, refopt.init(big, x), x, x)
    # the same hyperparameters are fine in float64
    x64 = np.ones(3)
    y, _ = refopt.update(refopt.Adam(eps=1e-50), refopt.init(refopt.Adam(eps=1e-50), x64), x64, x64)
    assert np.isfinite(y).all()


def test_numpy_scalar_hyperparameters_are_accepted_and_bools_rejected():
    assert refopt.Adam(lr=np.float32(0.5)).lr == np.float32(0.5)
    refopt.SGD(lr=np.int64(1), momentum=np.float64(0.5))
    with pytest.raises(ValueError, match="lr must be a finite number"):
        refopt.SGD(lr=True)
    with pytest.raises(ValueError, match="nesterov must be True or False"):
        refopt.SGD(lr=0.1, momentum=0.9, nesterov="yes")


def test_a_state_for_other_dict_keys_names_the_keys():
    """A key added to (or renamed in) the params after init: the error names the keys on each side at
    the path where they differ (it showed only the expected container); nothing is written."""
    r = refopt.Adam(lr=0.01)
    s = refopt.init(r, {"a": np.ones(3), "b": {"x": np.ones(2)}})
    p = {"a": np.ones(3), "b": {"x": np.ones(2)}, "c": np.ones(2)}
    before = {k: np.copy(v) for k, v in (("a", p["a"]), ("c", p["c"]))}
    with pytest.raises(ValueError, match=r"at <root>: keys differ \(only in params: \['c'\], only in state\.leaves: \[\]\)"):
        refopt.update_(r, s, p, {"a": np.ones(3), "b": {"x": np.ones(2)}, "c": np.ones(2)})
    np.testing.assert_array_equal(p["a"], before["a"])
    np.testing.assert_array_equal(p["c"], before["c"])
    q = {"a": np.ones(3), "b": {"y": np.ones(2)}}
    with pytest.raises(ValueError, match=r"at b: keys differ \(only in params: \['y'\], only in state\.leaves: \['x'\]\)"):
        refopt.update(r, s, q, q)

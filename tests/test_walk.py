"""The fast tree walk (:mod:`refopt.fast.walk`): many small leaves stepped in one compiled call, validation cached against
the identity and layout of the params and state, the gradient check in one pass per packed buffer.

What must hold whatever the walk caches: the same bits as stepping each leaf alone (and as the equations,
through the independent oracles), update and update_ bit-identical, the same bits on 1 and 2 threads,
every error still raised before anything is written, and no allocation proportional to the params in an
in-place step."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import refopt
from refopt.core import cast_context
from refopt.fast.many import StepMany
from refopt.kernels import PARALLEL_MIN_SIZE
from oracles import adam_reference, sgd_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(seed=0, n_small=60, big=True, dtypes=(np.float32, np.float64)):
    """Small leaves of assorted shapes (0-d, empty, 1-d, 2-d) in two dtypes, and one leaf above the
    packing threshold."""
    rng = np.random.default_rng(seed)
    shapes = [(), (0,), (1,), (7,), (3, 5), (17, 4), (100,), (2, 3, 4)]
    params = {}
    for i in range(n_small):
        dt = dtypes[i % len(dtypes)]
        params[f"s{i:03d}"] = np.asarray(rng.standard_normal(shapes[i % len(shapes)]), dtype=dt)
    if big:
        params["big"] = rng.standard_normal(PARALLEL_MIN_SIZE + 3).astype(dtypes[0])
    return params


def _grads(params, seed):
    rng = np.random.default_rng(seed)
    return {k: np.asarray(0.1 * rng.standard_normal(v.shape), dtype=v.dtype) for k, v in params.items()}


def _copy(tree):
    return {k: v.copy() for k, v in tree.items()}


RULES = {
    "adam": refopt.Adam(lr=1e-2),
    "adamw": refopt.AdamW(lr=1e-2, weight_decay=0.1),
    "amsgrad": refopt.Adam(lr=1e-2, amsgrad=True),
    "nadam": refopt.Adam(lr=1e-2, nesterov=True),
    "sgd": refopt.SGD(lr=1e-2),
    "sgd_nesterov": refopt.SGD(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "lion": refopt.Lion(lr=1e-3, weight_decay=0.1),
    "partition": refopt.Partition({"a": refopt.AdamW(lr=1e-2, weight_decay=0.1), "b": refopt.SGD(lr=1e-2, momentum=0.9)},
                                  lambda path, x: "a" if x.ndim != 1 else "b"),
    "clip": refopt.ClipByGlobalNorm(refopt.Adam(lr=1e-2), max_norm=0.5),
}


def _leafwise(rule, params, steps):
    """Each leaf stepped alone by the rule's single-array kernel (``Elementwise.step``), from the hooks."""
    out = {}
    for k, x0 in params.items():
        x = x0.copy()
        s = rule.init_leaf(x, k)
        for t in range(1, steps + 1):
            g = _grads(params, t)[k]
            ctx, _ = rule.context(t, None)
            rule.kernel().step(x, g, rule.kernel_state(s), cast_context(ctx, x.dtype, "rule"))
        out[k] = x
    return out


@pytest.mark.parametrize("name", ["adam", "adamw", "amsgrad", "nadam", "sgd", "sgd_nesterov", "lion"])
def test_packed_walk_matches_each_leaf_alone_bitwise(name):
    rule, params = RULES[name], _tree()
    x, s = _copy(params), refopt.init(rule, params)
    for t in range(1, 4):
        x, s = refopt.update_(rule, s, x, _grads(params, t))
    want = _leafwise(rule, params, 3)
    for k in params:
        assert np.array_equal(x[k], want[k]), k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_walk_matches_the_oracles(dtype):
    """Adam and SGD with momentum over 300 small leaves against the plain-numpy oracles (tests/oracles.py):
    a gradient or a state paired with the wrong leaf would be off by O(1)."""
    params = _tree(seed=3, n_small=300, big=False, dtypes=(dtype,))
    tol = 1e-5 if dtype == np.float32 else 1e-13
    adam, sgd = refopt.Adam(lr=1e-2), refopt.SGD(lr=1e-2, momentum=0.9, dampening=0.1)
    xa, sa = _copy(params), refopt.init(adam, params)
    xs, ss = _copy(params), refopt.init(sgd, params)
    ref = {k: (v.copy(), np.zeros_like(v), np.zeros_like(v), v.copy(), np.zeros_like(v)) for k, v in params.items()}
    for t in range(1, 4):
        g = _grads(params, t)
        xa, sa = refopt.update_(adam, sa, xa, g)
        xs, ss = refopt.update_(sgd, ss, xs, g)
        for k, (x, m, v, y, b) in ref.items():
            x, m, v = adam_reference(x, g[k], m, v, t, adam)
            y, b = sgd_reference(y, g[k], b, t, sgd)
            ref[k] = (x, m, v, y, b)
    for k, (x, _, _, y, _) in ref.items():
        np.testing.assert_allclose(xa[k], x, rtol=tol, atol=tol, err_msg=k)
        np.testing.assert_allclose(xs[k], y, rtol=tol, atol=tol, err_msg=k)


def test_negative_control_shifted_packing_is_caught():
    """The comparison above catches a packing off by one element: StepMany with every gradient start
    shifted by one gives different params than the leafwise kernel."""
    rule = refopt.Adam(lr=1e-2)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(5).astype(np.float32) for _ in range(4)]
    g = rng.standard_normal(21).astype(np.float32)
    starts = [0, 5, 10, 15]
    good, bad = [x.copy() for x in xs], [x.copy() for x in xs]
    c = cast_context(rule.context(1, None)[0], np.float32, "Adam")
    for arrays, st in ((good, starts), (bad, [o + 1 for o in starts])):
        states = [rule.init_leaf(x, "") for x in arrays]
        StepMany(rule.kernel(), arrays, g, st, states)(c)
    assert not all(np.array_equal(a, b) for a, b in zip(good, bad))
    for x, o, want in zip(xs, starts, good):
        x = x.copy()
        rule.kernel().step(x, g[o:o + 5], rule.init_leaf(x, ""), c)
        assert np.array_equal(x, want)


@pytest.mark.parametrize("name", sorted(RULES))
def test_update_and_update_are_bit_identical(name):
    rule, params = RULES[name], _tree(seed=1)
    xp, sp = params, refopt.init(rule, params)
    xi, si = _copy(params), refopt.init(rule, params)
    frozen = _copy(params)
    for t in range(1, 4):
        g = _grads(params, t)
        xp, sp = refopt.update(rule, sp, xp, g)
        xi, si = refopt.update_(rule, si, xi, g)
    for k in params:
        assert np.array_equal(xp[k], xi[k]), k
        assert np.array_equal(params[k], frozen[k]), k          # the pure API wrote nothing
    for a, b in zip(refopt.tree.leaves(sp.leaves), refopt.tree.leaves(si.leaves)):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)


def test_pure_update_never_writes_its_inputs_even_when_fed_back():
    rule, params = refopt.AdamW(lr=1e-2, weight_decay=0.1), _tree(seed=2)
    s0 = refopt.init(rule, params)
    x1, s1 = refopt.update(rule, s0, params, _grads(params, 1))
    keep_x, keep_m = _copy(x1), [s.m.copy() for s in refopt.tree.leaves(s1.leaves, is_leaf=lambda n: hasattr(n, "m"))]
    x2, s2 = refopt.update(rule, s1, x1, _grads(params, 2))
    for k in params:
        assert np.array_equal(x1[k], keep_x[k]) and x2[k] is not x1[k]
    for a, b in zip(keep_m, [s.m for s in refopt.tree.leaves(s1.leaves, is_leaf=lambda n: hasattr(n, "m"))]):
        assert np.array_equal(a, b)


_THREADS_SCRIPT = r"""
import hashlib, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import refopt
rng = np.random.default_rng(0)
params = {f"p{i:04d}": rng.standard_normal(100).astype(np.float32) for i in range(1000)}
params["big"] = rng.standard_normal(200_000).astype(np.float32)
out = {}
for name, rule in [("adamw", refopt.AdamW(lr=1e-2, weight_decay=0.1)), ("sgd", refopt.SGD(lr=1e-2, momentum=0.9))]:
    x, s = {k: v.copy() for k, v in params.items()}, None
    s = refopt.init(rule, x)
    xp, sp = params, refopt.init(rule, params)
    for t in range(3):
        g = {k: (0.1 * np.random.default_rng(t).standard_normal(v.shape)).astype(v.dtype) for k, v in params.items()}
        x, s = refopt.update_(rule, s, x, g)
        xp, sp = refopt.update(rule, sp, xp, g)
    h = hashlib.sha256()
    for k in sorted(x):
        assert np.array_equal(x[k], xp[k])
        h.update(x[k].tobytes())
    out[name] = h.hexdigest()
print(json.dumps(out))
"""


def test_same_bits_on_one_and_two_threads():
    """1000 leaves of 100 (stepped across threads) and one large leaf: the same bits with 1 and 2 numba
    threads, in separate processes (the thread count is fixed per process)."""
    runs = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, ROOT], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]


# --- what the cache must not hide --------------------------------------------------------------------

def _trained(rule=None, steps=2):
    rule = rule or refopt.Adam(lr=1e-2)
    params = _tree(seed=4, big=True, dtypes=(np.float32,))
    x, s = _copy(params), refopt.init(rule, params)
    for t in range(1, steps + 1):
        x, s = refopt.update_(rule, s, x, _grads(params, t))
    return rule, x, s


def _snapshot(x, s):
    return [a.copy() for a in list(x.values()) + [v for v in refopt.tree.leaves(s.leaves) if isinstance(v, np.ndarray)]]


def _unchanged(before, x, s):
    after = list(x.values()) + [v for v in refopt.tree.leaves(s.leaves) if isinstance(v, np.ndarray)]
    return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after))


@pytest.mark.parametrize("where", ["s005", "s013", "big"])
def test_nan_gradient_after_cached_steps_raises_and_writes_nothing(where):
    rule, x, s = _trained()
    g = _grads(x, 9)
    g[where].reshape(-1)[-1] = np.nan
    before = _snapshot(x, s)
    with pytest.raises(FloatingPointError, match=where):
        refopt.update_(rule, s, x, g)
    assert _unchanged(before, x, s)


def test_gradient_too_large_for_the_second_moment_names_the_leaf():
    rule, x, s = _trained()
    g = _grads(x, 9)
    g["s007"].reshape(-1)[0] = 1e30       # finite, but its square overflows float32
    before = _snapshot(x, s)
    with pytest.raises(FloatingPointError, match="s007"):
        refopt.update_(rule, s, x, g)
    assert _unchanged(before, x, s)
    refopt.update_(refopt.SGD(lr=1e-3), refopt.init(refopt.SGD(lr=1e-3), x), x, g)   # SGD does not square g


def test_read_only_params_after_cached_steps_raise():
    rule, x, s = _trained()
    x["s003"].flags.writeable = False
    before = _snapshot(x, s)
    with pytest.raises(ValueError, match="s003.*read-only|read-only.*s003"):
        refopt.update_(rule, s, x, _grads(x, 9))
    assert _unchanged(before, x, s)


def test_a_replaced_params_leaf_is_checked_against_the_state():
    rule, x, s = _trained()
    x["s006"] = np.zeros((4, 4), np.float32)              # another shape than the state was made for
    with pytest.raises(ValueError, match="s006"):
        refopt.update_(rule, s, x, _grads(x, 9))


def test_a_params_leaf_reshaped_in_place_is_checked_against_the_state():
    rule, x, s = _trained()
    x["s004"].shape = (5, 3)                              # (3, 5) reshaped in place: same object, same size
    with pytest.raises(ValueError, match="s004"):
        refopt.update_(rule, s, x, _grads(x, 9))


def test_a_state_array_swapped_for_a_wrong_one_is_caught():
    rule, x, s = _trained()
    bad = s.leaves["s005"]._replace(m=np.zeros(3, np.float32))
    leaves = dict(s.leaves, s005=bad)
    with pytest.raises(ValueError, match="s005"):
        refopt.update_(rule, refopt.OptState(s.t, s.glob, leaves), x, _grads(x, 9))


def test_grads_of_another_shape_or_dtype_are_caught_after_cached_steps():
    rule, x, s = _trained()
    g = _grads(x, 9)
    g["s002"] = g["s002"].astype(np.float64)
    with pytest.raises(ValueError, match="s002"):
        refopt.update_(rule, s, x, g)
    g = _grads(x, 9)
    g["s011"] = g["s011"].reshape(-1)[:1]
    with pytest.raises(ValueError, match="s011"):
        refopt.update_(rule, s, x, g)
    g = _grads(x, 9)
    del g["s001"]
    with pytest.raises(ValueError, match="s001"):
        refopt.update_(rule, s, x, g)


def test_the_same_gradient_object_with_new_values_is_read_anew():
    """The gradients are copied into the packed buffer every step: nothing depends on their identity."""
    rule = refopt.SGD(lr=1.0)
    x = {f"p{i}": np.zeros(3) for i in range(5)}
    g = {k: np.ones(3) for k in x}
    s = refopt.init(rule, x)
    x, s = refopt.update_(rule, s, x, g)
    for v in g.values():
        v[:] = 2.0
    x, s = refopt.update_(rule, s, x, g)
    assert all(np.array_equal(v, np.full(3, -3.0)) for v in x.values())


def test_one_rule_alternating_between_two_trees():
    """The cache holds one tree per rule: alternating trees must still give each its own exact steps."""
    rule = refopt.Adam(lr=1e-2)
    pa, pb = _tree(seed=5, big=False), _tree(seed=6, n_small=30, big=False)
    xa, sa = _copy(pa), refopt.init(rule, pa)
    xb, sb = _copy(pb), refopt.init(rule, pb)
    for t in range(1, 4):
        xa, sa = refopt.update_(rule, sa, xa, _grads(pa, t))
        xb, sb = refopt.update_(rule, sb, xb, _grads(pb, t))
    for p, got in ((pa, xa), (pb, xb)):
        ref = refopt.Adam(lr=1e-2)
        x, s = _copy(p), refopt.init(ref, p)
        for t in range(1, 4):
            x, s = refopt.update(ref, s, x, _grads(p, t))
        assert all(np.array_equal(got[k], x[k]) for k in p)


def test_params_sharing_memory_are_rejected():
    rule = refopt.Adam()
    base = np.zeros(10, np.float32)
    x = {"a": base[:6], "b": base[4:]}
    with pytest.raises(ValueError, match="share memory"):
        refopt.update_(rule, refopt.init(rule, x), x, {"a": np.ones(6, np.float32), "b": np.ones(6, np.float32)})


def test_update_returns_the_callers_containers_in_place():
    rule, x, s = _trained()
    x2, s2 = refopt.update_(rule, s, x, _grads(x, 9))
    assert x2 is x and s2.leaves is s.leaves and s2.t == s.t + 1


# --- allocation ---------------------------------------------------------------------------------------

def _peak_bytes(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak - base


@pytest.mark.parametrize("layout", ["many", "one"])
def test_in_place_step_allocates_nothing_proportional_to_the_params(layout):
    """numpy reports its array allocations to tracemalloc. After the warm-up steps, an in-place AdamW step
    over 2000 leaves of 1000 float32 (8 MB of params) or one leaf of 400k peaks below 64 KiB plus 256 bytes
    per leaf (the walk's Python bookkeeping: lists and shape tuples, independent of the leaves' sizes); the
    pure update, the negative control, allocates at least the params and both moments."""
    if layout == "many":
        params = {f"p{i:04d}": np.full(1000, 0.5, np.float32) for i in range(2000)}
    else:
        params = {"w": np.full(400_000, 0.5, np.float32)}
    grads = {k: np.full(v.shape, 1e-2, np.float32) for k, v in params.items()}
    nbytes = sum(v.nbytes for v in params.values())
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.1)
    box = [params, refopt.init(rule, params)]

    def step_():
        box[0], box[1] = refopt.update_(rule, box[1], box[0], grads)
    step_()
    step_()
    assert _peak_bytes(step_) < 64 * 1024 + 256 * len(params)
    pure = refopt.AdamW(lr=1e-3, weight_decay=0.1)
    pbox = [{k: v.copy() for k, v in params.items()}, None]
    pbox[1] = refopt.init(pure, pbox[0])
    assert _peak_bytes(lambda: refopt.update(pure, pbox[1], pbox[0], grads)) >= 3 * nbytes


def test_any_bad_many_matches_count_bad_across_chunk_boundaries():
    """The whole-tree check reads in chunks of COUNT_CHUNK elements (one compiled call): bad elements at
    both sides of a chunk boundary, in empty and tiny arrays and with per-array bounds, are all found."""
    from refopt.fast.many import any_bad_many
    from refopt.kernels import COUNT_CHUNK, count_bad

    rng = np.random.default_rng(0)
    sizes = (0, 1, 5, COUNT_CHUNK, COUNT_CHUNK + 1, 3 * COUNT_CHUNK + 7, 3 * COUNT_CHUNK + 7, 2 * COUNT_CHUNK)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    arrays[3][COUNT_CHUNK - 1] = np.nan
    arrays[4][COUNT_CHUNK] = np.inf
    arrays[5][3 * COUNT_CHUNK + 6] = -1e20          # the last element of the last, partial chunk
    arrays[6][2 * COUNT_CHUNK] = -np.inf
    bounds = [np.inf, np.inf, 1.0, np.inf, np.inf, 1e19, np.inf, 1e19]
    want = [count_bad(a, b) > 0 for a, b in zip(arrays, bounds)]
    assert any_bad_many(arrays, bounds) == want
    assert want[3:7] == [True, True, True, True] and want[7] is False and want[0] is False
    assert want[2] == bool((abs(arrays[2]) >= 1.0).any())
    # negative control: without its last element the array is clean
    assert any_bad_many([arrays[5][:-1]], [1e19]) == [False]
    # the kernel reads each chunk as four quarters and a tail: a bad element at any of their edges is found
    for n in (3, 7, 4097, 1001):
        q = n // 4
        for i in sorted({0, q - 1, q, 2 * q - 1, 2 * q, 3 * q - 1, 3 * q, 4 * q - 1, n - 1} - {-1}):
            a = np.zeros(n, np.float64)
            a[i] = np.nan
            assert any_bad_many([a], [np.inf]) == [True], (n, i)
        assert any_bad_many([np.zeros(n)], [np.inf]) == [False]


def test_whole_tree_checks_name_the_first_bad_leaf_in_tree_order():
    """The gradient checks of update/update_ (packed buffers), direction and ClipByGlobalNorm, and the
    weight check of Hyperball, read the tree in one pass per dtype and name the first bad leaf in tree
    order, not in dtype-group order; nothing is written. Negative control: the group order names 'c' (the
    float32 group comes first)."""
    from refopt.kernels import bad_leaves

    def tree(a, b, c):
        return {"a": np.full(3, a, np.float32), "b": np.full(4, b, np.float64), "c": np.full(5, c, np.float32)}

    arrays = list(tree(1.0, np.nan, np.inf).values())
    assert bad_leaves(arrays, [np.inf] * 3) == [1, 2]
    assert bad_leaves(list(tree(1.0, 2.0, 3.0).values()), [np.inf, np.inf, 2.5]) == [2]
    assert bad_leaves(list(tree(1.0, 2.0, 3.0).values()), [np.inf] * 3) == []
    params, grads = tree(1.0, 1.0, 1.0), tree(0.1, np.nan, np.inf)
    for rule, call in ((refopt.Adam(lr=1e-3), refopt.direction), (refopt.Adam(lr=1e-3), refopt.update_),
                       (refopt.Adam(lr=1e-3), refopt.update),
                       (refopt.ClipByGlobalNorm(refopt.SGD(lr=0.1), max_norm=1.0), refopt.update_)):
        state = refopt.init(rule, params)
        before = [v.copy() for v in params.values()]
        with pytest.raises(FloatingPointError, match=r"at b\b"):
            call(rule, state, params, grads)
        assert all(np.array_equal(v, w) for v, w in zip(params.values(), before))
    rule = refopt.Hyperball(refopt.Muon(lr=0.02), lr=0.02)
    params = {"a": np.ones((3, 3), np.float32), "b": np.ones((4, 4)), "c": np.ones((3, 3), np.float32)}
    state = refopt.init(rule, params)
    params["b"][0, 0], params["c"][0, 0] = np.nan, np.inf
    g = {k: np.full_like(v, 0.1) for k, v in params.items()}
    with pytest.raises(FloatingPointError, match=r"weights at b hold nan"):
        refopt.update(rule, state, params, g)

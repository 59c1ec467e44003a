"""The speed layer (:mod:`refopt.fast`) changes no bit.

Every rule configuration of the catalog, in float32 and float64, stepped with ``update`` and with
``update_`` by the fast walk (:mod:`refopt.fast.walk`: identity cache, packed gradients, batched steps)
and by the reading path (:mod:`refopt.core`'s plain walk, ``refopt.fast.reading_path()``), must give the
same params, states and evaluation weights, bit for bit. Four steps reach every stage of the fast walk: the
first call validates everything, the second reuses what it validated, the third steps the packed leaves
in one compiled call. A tree with leaves above :data:`refopt.kernels.PARALLEL_MIN_SIZE` covers the
unpacked leaves and the parallel loops. Matrix products run on one BLAS thread, so that Muon's matrices
orthogonalised together round as each one alone (``refopt.fast.walk._muon_leaves``).

Negative control: a fast walk whose batched elementwise step is off by one ulp in one leaf is caught.
Bad input (a nan gradient, a read-only or aliased array, a mismatched tree, a stale state) is refused by
both walks with the same error, before anything is written.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import refopt
import refopt.fast.walk as fast_walk
from catalog import all_cases
from refopt import tree as T
from refopt.kernels import PARALLEL_MIN_SIZE

CASES = all_cases()
DTYPES = [np.float32, np.float64]
STEPS = 4


def _grads(params, k):
    rng = np.random.default_rng(500 + k)
    return T.tree_map(lambda a: rng.standard_normal(a.shape).astype(a.dtype), params)


def _trajectory(rule, params, inplace: bool) -> list:
    """The bytes of params, state arrays and evaluation weights after each of STEPS steps."""
    params = T.copy(params)
    state = refopt.init(rule, params)
    step = refopt.update_ if inplace else refopt.update
    out = []
    for k in range(STEPS):
        params, state = step(rule, state, params, _grads(params, k))
        arrays = [*T.leaves(params), *T.leaves(state.leaves), *T.leaves(refopt.eval_params(rule, state, params))]
        out.append((state.t, repr(state.glob), [(a.dtype.str, a.shape, a.tobytes()) for a in arrays
                                                 if isinstance(a, np.ndarray)]))
    return out


def _both_ways(rule, params, inplace: bool):
    with threadpool_limits(limits=1, user_api="blas"):
        fast = _trajectory(rule, params, inplace)
        with refopt.fast.reading_path():
            assert refopt.core.fast_step is None
            plain = _trajectory(rule, params, inplace)
    assert refopt.core.fast_step is fast_walk.step
    return fast, plain


def _first_difference(fast, plain) -> str | None:
    for k, ((tf, gf, af), (tp, gp, ap)) in enumerate(zip(fast, plain)):
        if (tf, gf) != (tp, gp):
            return f"step {k + 1}: t or global state differ ({gf} vs {gp})"
        for j, (a, b) in enumerate(zip(af, ap)):
            if a != b:
                return f"step {k + 1}: array {j} differs"
    return None


@pytest.mark.parametrize("inplace", [False, True], ids=["update", "update_"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fast_walk_and_reading_path_give_the_same_bits(case, dtype, inplace):
    fast, plain = _both_ways(case.make_rule(), case.make_params(dtype, 0), inplace)
    assert _first_difference(fast, plain) is None, _first_difference(fast, plain)


def _large_tree(dtype):
    rng = np.random.default_rng(3)
    n = int(np.sqrt(PARALLEL_MIN_SIZE))   # n x n = PARALLEL_MIN_SIZE elements: not packed, parallel loops
    return {"big": rng.standard_normal((n, n)).astype(dtype), "big2": rng.standard_normal((n + 1, n)).astype(dtype),
            "w": rng.standard_normal((8, 5)).astype(dtype), "b": rng.standard_normal(5).astype(dtype)}


LARGE_RULES = {
    "adamw": lambda: refopt.AdamW(lr=1e-2, weight_decay=0.1),
    "sgd_nesterov": lambda: refopt.SGD(lr=1e-2, momentum=0.9, nesterov=True),
    "muon_adamw": lambda: refopt.Partition({"hidden": refopt.Muon(lr=0.02), "other": refopt.AdamW(lr=1e-2)},
                                           labels=refopt.matrix_labels),
    "clipped_lion": lambda: refopt.ClipByGlobalNorm(refopt.Lion(lr=1e-3), max_norm=1.0),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["update", "update_"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(LARGE_RULES))
def test_fast_walk_and_reading_path_agree_on_large_leaves(name, dtype, inplace):
    fast, plain = _both_ways(LARGE_RULES[name](), _large_tree(dtype), inplace)
    assert _first_difference(fast, plain) is None, _first_difference(fast, plain)


def test_a_batched_step_one_ulp_off_is_caught(monkeypatch):
    """Negative control: the elementwise batch of the fast walk nudged by one ulp in its first leaf."""
    exact = fast_walk._elementwise_leaves

    def off_by_one_ulp(rule, casts, ss, xs, gs, paths, walk):
        out_x, out_s = exact(rule, casts, ss, xs, gs, paths, walk)
        x = out_x[0].reshape(-1)
        x[0] = np.nextafter(x[0], np.inf)
        return out_x, out_s

    monkeypatch.setattr(fast_walk, "_BATCHED", [(c, h, off_by_one_ulp if f is exact else f)
                                                for c, h, f in fast_walk._BATCHED])
    fast, plain = _both_ways(refopt.Adam(lr=1e-3), _large_tree(np.float64), inplace=True)
    assert _first_difference(fast, plain) == "step 1: array 0 differs"


def _bad_calls():
    """(name, call) pairs: each call makes its own inputs and must raise before writing anything."""
    rng = np.random.default_rng(7)

    def fresh():
        p = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
        return p, T.tree_map(lambda a: rng.standard_normal(a.shape), p)

    def nan_grad(rule):
        p, g = fresh()
        g["b"][1] = np.nan
        return rule, refopt.init(rule, p), p, g

    def read_only(rule):
        p, g = fresh()
        p["w"].flags.writeable = False
        return rule, refopt.init(rule, p), p, g

    def aliased(rule):
        p, g = fresh()
        p["b2"], g["b2"] = p["b"][:], g["b"].copy()
        return rule, refopt.init(rule, p), p, g

    def other_shape(rule):
        p, g = fresh()
        g["w"] = g["w"].T.copy()
        return rule, refopt.init(rule, p), p, g

    def stale(rule):
        p, g = fresh()
        state = refopt.init(rule, p)
        refopt.update_(rule, state, p, g)
        return rule, state, p, g

    return [("nan_grad", nan_grad), ("read_only", read_only), ("aliased", aliased), ("other_shape", other_shape),
            ("stale", stale)]


@pytest.mark.parametrize("name, make", _bad_calls(), ids=[n for n, _ in _bad_calls()])
def test_the_reading_path_refuses_what_the_fast_walk_refuses(name, make):
    """The plain walk raises the same error with the same message, and writes nothing, in each case."""
    messages = []
    for plain in (False, True):
        with refopt.fast.reading_path() if plain else contextlib.nullcontext():
            rule, state, params, grads = make(refopt.AdamW(lr=1e-2, weight_decay=0.1))
            before = [a.copy() for a in [*T.leaves(params), *T.leaves(state.leaves)]]
            with pytest.raises((ValueError, FloatingPointError)) as err:
                refopt.update_(rule, state, params, grads)
        after = [*T.leaves(params), *T.leaves(state.leaves)]
        assert all(np.array_equal(a, b) for a, b in zip(before, after)), f"{name}: something was written"
        messages.append((type(err.value), str(err.value)))
    assert messages[0] == messages[1]

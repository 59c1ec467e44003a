"""Generic tests run on every rule configuration of the catalog (``tests/catalog.py``: the ``examples`` of the conventions files).

For each :class:`catalog.Case`:

* purity: ``refopt.update`` / ``direction`` / ``eval_params`` with read-only params, grads and state leave
  them untouched, and the new arrays share no memory with them;
* dtype: float32 in gives float32 params, float32 floating state arrays and float32 eval params (float64
  likewise);
* ``update`` and ``update_`` are bit-identical over 5 steps (params, state, eval params);
* tree vs single leaf: optimizing each leaf alone as a bare ndarray gives the same bits as the tree (the
  rule for a bare leaf is ``case.extra["leaf_rule"](path, x)`` when the rule depends on the path, e.g. a
  Partition with a labels tree; the rule itself otherwise);
* checkpoint resume: 3 steps, save, load, 3 more steps equals 6 uninterrupted steps bit for bit (float32
  and float64), with the rule rebuilt from the checkpoint whenever it is serializable;
* convergence: on f(x) = 1/2 sum_i a_i (x_i - x*_i)^2, a_i ~ U[0.5, 2], the loss at the evaluation
  weights after ``case.quad_steps`` steps is below 1e-2 times the initial loss (skipped, with the case's
  note, when ``case.converges`` is False).
"""
from __future__ import annotations

import numpy as np
import pytest

import refopt
from catalog import all_cases
from refopt import checkpoint as ck

CASES = all_cases()
DTYPES = [np.float32, np.float64]


def _cases():
    return pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])


def _grads(params, k, scale=1.0):
    rng = np.random.default_rng(1000 + k)
    return refopt.tree.tree_map(lambda a: (scale * rng.standard_normal(a.shape)).astype(a.dtype), params)


def _arrays(tree):
    return [a for a in refopt.tree.leaves(tree) if isinstance(a, np.ndarray)]


def _snapshot(tree):
    return [(a.dtype, a.shape, a.tobytes()) for a in _arrays(tree)]


def assert_identical(a, b, what=""):
    """Same structure, same leaf types, bitwise-equal arrays, equal Python scalars."""
    la, pa, da = refopt.tree.flatten(a)
    lb, pb, db = refopt.tree.flatten(b)
    assert pa == pb and da == db, f"{what}: trees differ"
    for x, y, p in zip(la, lb, pa):
        assert type(x) is type(y), f"{what} {p}: {type(x).__name__} vs {type(y).__name__}"
        if isinstance(x, (np.ndarray, np.generic)):
            assert x.dtype == y.dtype and np.shape(x) == np.shape(y), f"{what} {p}"
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), f"{what} {p}: values differ"
        else:
            assert x == y or (x != x and y != y), f"{what} {p}: {x!r} vs {y!r}"


def _run(rule, params, state, steps, start=0, inplace=False):
    step = refopt.update_ if inplace else refopt.update
    for k in range(start, start + steps):
        params, state = step(rule, state, params, _grads(params, k))
    return params, state


def _has_direction(rule, params):
    try:
        refopt.direction(rule, refopt.init(rule, params), params, _grads(params, 0))
    except NotImplementedError:
        return False
    return True


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_purity_with_read_only_inputs(case, dtype):
    rule = case.make_rule()
    p0 = case.make_params(dtype, 0)
    p, s = _run(rule, p0, refopt.init(rule, p0), 2)         # a state with non-trivial contents
    g = _grads(p, 7)
    for a in _arrays(p) + _arrays(s) + _arrays(g):
        a.flags.writeable = False
    before = [_snapshot(t) for t in (p, s, g)]
    p2, s2 = refopt.update(rule, s, p, g)
    refopt.eval_params(rule, s, p)
    assert [_snapshot(t) for t in (p, s, g)] == before, "an input array was changed"
    for new in _arrays(p2) + _arrays(s2):
        assert new.flags.writeable, "update returned a read-only array"
        for old in _arrays(p) + _arrays(s) + _arrays(g):
            assert not np.shares_memory(new, old), "update returned an array aliasing an input"
    refopt.update_(rule, s2, p2, g)   # the outputs are usable in place


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_direction_purity_with_read_only_inputs(case, dtype):
    """refopt.direction is documented pure like update: read-only params, grads and state must work."""
    rule = case.make_rule()
    p0 = case.make_params(dtype, 0)
    if not _has_direction(rule, p0):
        pytest.skip(f"{type(rule).__name__} has no additive direction")
    p, s = _run(rule, p0, refopt.init(rule, p0), 2)
    g = _grads(p, 7)
    for a in _arrays(p) + _arrays(s) + _arrays(g):
        a.flags.writeable = False
    before = [_snapshot(t) for t in (p, s, g)]
    u, s2 = refopt.direction(rule, s, p, g)
    assert [_snapshot(t) for t in (p, s, g)] == before, "an input array was changed"
    for new in _arrays(u) + _arrays(s2):
        for old in _arrays(p) + _arrays(s) + _arrays(g):
            assert not np.shares_memory(new, old), "direction returned an array aliasing an input"


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_preserved(case, dtype):
    rule = case.make_rule()
    p0 = case.make_params(dtype, 0)
    p, s = _run(rule, p0, refopt.init(rule, p0), 3)
    for tree, what in ((p, "params"), (s, "state"), (refopt.eval_params(rule, s, p), "eval params")):
        for a in _arrays(tree):
            if a.dtype.kind in "fc":
                assert a.dtype == dtype, f"{what} array of dtype {a.dtype} for {np.dtype(dtype)} params"
    assert all(a.dtype == dtype for a in _arrays(p))


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_update_and_update_inplace_bit_identical(case, dtype):
    rule = case.make_rule()
    p0 = case.make_params(dtype, 0)
    pa, sa = _run(rule, p0, refopt.init(rule, p0), 5)
    p1 = refopt.tree.copy(p0)
    pb, sb = _run(rule, p1, refopt.init(rule, p1), 5, inplace=True)
    assert_identical(pa, pb, "params")
    assert_identical(sa, sb, "state")
    assert_identical(refopt.eval_params(rule, sa, pa), refopt.eval_params(rule, sb, pb), "eval params")
    assert all(x is y for x, y in zip(refopt.tree.leaves(pb), refopt.tree.leaves(p1))), \
        "update_ must return the caller's arrays"


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_equals_single_leaves(case, dtype):
    if "not_leafwise" in case.extra:
        pytest.skip(case.extra["not_leafwise"])
    rule = case.make_rule()
    leaf_rule = case.extra.get("leaf_rule", lambda path, x: rule)
    p0 = case.make_params(dtype, 0)
    p, s = _run(rule, p0, refopt.init(rule, p0), 4)
    ev = refopt.tree.leaves(refopt.eval_params(rule, s, p))
    xs0, paths, _ = refopt.tree.flatten(p0)
    grads = [refopt.tree.leaves(_grads(p0, k)) for k in range(4)]
    for i, (x, path) in enumerate(zip(xs0, paths)):
        r = leaf_rule(path, x)
        xi, si = x, refopt.init(r, x)
        for k in range(4):
            xi, si = refopt.update(r, si, xi, grads[k][i])
        assert np.asarray(xi).tobytes() == refopt.tree.leaves(p)[i].tobytes(), f"params at {path}"
        assert np.asarray(refopt.eval_params(r, si, xi)).tobytes() == np.asarray(ev[i]).tobytes(), \
            f"eval params at {path}"


@_cases()
@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpoint_resume_bit_identical(case, dtype, tmp_path):
    rule = case.make_rule()
    p0 = case.make_params(dtype, 0)
    p6, s6 = _run(rule, p0, refopt.init(rule, p0), 6)
    p3, s3 = _run(rule, p0, refopt.init(rule, p0), 3)
    f = tmp_path / "ck.npz"
    try:
        ck.rule_to_json(rule)
        serializable = True
    except ck.CheckpointError:
        serializable = False
    if serializable:
        ck.save(f, p3, s3, rule, step=3)
        c = ck.load(f)
        assert c.rule == rule and type(c.rule) is type(rule)
    else:   # a user function inside the rule: save refuses it, rule=None works
        with pytest.raises(ck.CheckpointError, match="cannot serialize"):
            ck.save(f, p3, s3, rule)
        ck.save(f, p3, s3, None, step=3)
        c = ck.load(f, rule=rule)
    assert c.metadata == {"step": 3}
    assert_identical(c.params, p3, "loaded params")
    assert_identical(c.state, s3, "loaded state")
    q, r = _run(c.rule, c.params, c.state, 3, start=3, inplace=True)
    assert_identical(q, p6, "resumed params")
    assert_identical(r, s6, "resumed state")
    assert_identical(refopt.eval_params(c.rule, r, q), refopt.eval_params(rule, s6, p6), "resumed eval params")


@_cases()
def test_converges_on_a_quadratic(case):
    if not case.converges:
        pytest.skip(case.note or "case marked as not converging")
    rule = case.make_rule()
    p = case.make_params(np.float64, 0)
    rng = np.random.default_rng(42)
    a = refopt.tree.tree_map(lambda x: rng.uniform(0.5, 2.0, x.shape), p)
    xstar = refopt.tree.tree_map(lambda x: rng.standard_normal(x.shape), p)

    def loss(x):
        return sum(0.5 * float(np.sum(ai * (xi - si) ** 2)) for xi, ai, si in
                   zip(refopt.tree.leaves(x), refopt.tree.leaves(a), refopt.tree.leaves(xstar)))

    f0 = loss(p)
    s = refopt.init(rule, p)
    for _ in range(case.quad_steps):
        g = refopt.tree.tree_map(lambda x, ai, si: ai * (x - si), p, a, xstar)
        p, s = refopt.update_(rule, s, p, g)
    f = loss(refopt.eval_params(rule, s, p))
    assert f < 1e-2 * f0, f"loss {f:.3e} after {case.quad_steps} steps, initial {f0:.3e}"

"""The fast tree walk (:mod:`refopt.fast.walk`) between calls: what a demanding user can do, and what must hold.

Each test states the guarantee the walk must keep (the project's rules: update_ refuses read-only or
non-contiguous arrays with a ValueError, nothing is written before an error, the state is exactly what the
rule makes for the params, the pure API returns states that pass validation, no memory held for a model the
user dropped beyond the rule's last tree). Each is a way a walk that caches what it validated can go wrong."""
from __future__ import annotations

import gc
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest

import refopt
import refopt.fast.walk as fast_walk
from refopt.core import Rule
from refopt.kernels import PARALLEL_MIN_SIZE


def _adam_tree(big=False):
    params = {"a": np.linspace(-1.0, 1.0, 5), "b": np.linspace(0.5, 2.0, 6).reshape(2, 3)}
    if big:
        params["big"] = np.linspace(-1.0, 1.0, PARALLEL_MIN_SIZE + 3)
    grads = {k: np.full(v.shape, 0.1) for k, v in params.items()}
    return params, grads


def _stepped(rule, params, grads):
    """A state after one in-place step, so that the walk has cached this tree."""
    state = refopt.init(rule, params)
    params, state = refopt.update_(rule, state, params, grads)
    return params, state


def _snapshot(params, state):
    return {k: v.copy() for k, v in params.items()}, {k: [a.copy() for a in s] for k, s in state.leaves.items()}


def _unchanged(params, state, snap):
    xs, ss = snap
    return all(np.array_equal(params[k], xs[k]) for k in xs) and \
        all(np.array_equal(a, b) for k in ss for a, b in zip(state.leaves[k], ss[k]))


# --- arrays changed in place between two calls: still refused, before anything is written -----------------

def test_a_state_array_made_read_only_after_cached_steps_is_refused():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    params, state = _stepped(rule, params, grads)
    state.leaves["a"].m.flags.writeable = False
    snap = _snapshot(params, state)
    with pytest.raises(ValueError, match="read-only"):
        refopt.update_(rule, state, params, grads)
    assert _unchanged(params, state, snap)


def test_negative_control_a_state_array_read_only_from_the_start_is_refused():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    state = refopt.init(rule, params)
    state.leaves["a"].m.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        refopt.update_(rule, state, params, grads)


def test_an_error_on_a_large_leaf_writes_nothing_to_the_small_ones():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree(big=True)
    params, state = _stepped(rule, params, grads)
    state.leaves["big"].v.flags.writeable = False
    snap = _snapshot(params, state)
    with pytest.raises(ValueError):
        refopt.update_(rule, state, params, grads)
    assert _unchanged(params, state, snap)


def test_a_state_array_retyped_in_place_is_caught():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    params, state = _stepped(rule, params, grads)
    state.leaves["a"].v.dtype = np.float32        # 5 float64 -> 10 float32 over the same bytes
    with pytest.raises(ValueError, match="state array at a"):
        refopt.update_(rule, state, params, grads)


def test_a_state_array_reshaped_in_place_is_caught():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    params, state = _stepped(rule, params, grads)
    state.leaves["b"].m.shape = (3, 2)
    with pytest.raises(ValueError, match="state array at b"):
        refopt.update_(rule, state, params, grads)


def test_negative_control_a_state_array_reshaped_before_any_step_is_caught():
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    state = refopt.init(rule, params)
    state.leaves["b"].m.shape = (3, 2)
    with pytest.raises(ValueError, match="state array at b"):
        refopt.update_(rule, state, params, grads)


def test_a_params_leaf_made_non_contiguous_in_place_is_refused():
    rule = refopt.SGD(lr=0.1)
    params = {"a": np.arange(6.0)}
    grads = {"a": np.ones(6)}
    params, state = _stepped(rule, params, grads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # setting strides is deprecated, still allowed
        params["a"].strides = (0,)
    assert not params["a"].flags.c_contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        refopt.update_(rule, state, params, grads)


# --- the pure update returns a state the rule would make ---------------------------------------------------

def test_pure_update_of_empty_leaves_returns_a_valid_state():
    rule = refopt.SGD(lr=0.1)
    params = {"a": np.zeros((0, 3))}
    state = refopt.init(rule, params)
    new_params, new_state = refopt.update(rule, state, params, {"a": np.zeros((0, 3))})
    assert new_state.leaves["a"].b.shape == (0,)
    refopt.eval_params(rule, new_state, new_params)           # validates the state in full


# --- memory -----------------------------------------------------------------------------------------------

def test_a_dropped_model_is_freed_with_its_rule_or_at_the_rule_s_next_tree():
    """By design (as torch.optim holds its params), the walk keeps the last tree a rule stepped; it is freed
    when the rule is dropped, or when the rule steps another tree."""
    rule = refopt.Adam(lr=0.1)
    params, grads = _adam_tree()
    params, state = _stepped(rule, params, grads)
    alive = [weakref.ref(params["a"]), weakref.ref(state.leaves["a"].m)]
    del params, state
    gc.collect()
    assert all(r() is not None for r in alive)            # held by the rule's cache
    other, g2 = _adam_tree()
    _stepped(rule, other, g2)
    gc.collect()
    assert all(r() is None for r in alive)
    params, state = _stepped(rule, *_adam_tree())
    alive = [weakref.ref(params["a"])]
    del params, state, rule
    gc.collect()
    assert all(r() is None for r in alive)


def test_rules_made_fresh_each_step_do_not_keep_old_trees_alive():
    params = {"a": np.ones(100)}
    state = refopt.init(refopt.Adam(lr=0.1), params)
    alive = []
    for _ in range(20):
        params, state = refopt.update(refopt.Adam(lr=0.1), state, params, {"a": np.ones(100)})
        alive.append(weakref.ref(params["a"]))
    gc.collect()
    assert sum(r() is not None for r in alive[:-1]) == 0


# --- ndarray subclasses ------------------------------------------------------------------------------------

_MATRIX_SCRIPT = r"""
import warnings
import numpy as np
import refopt
warnings.simplefilter("ignore", PendingDeprecationWarning)
rule, ref_rule = refopt.Adam(lr=0.1), refopt.Adam(lr=0.1)
x0 = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
try:
    params = {"a": np.matrix(x0)}
    state = refopt.init(rule, params)
    ref, ref_state = {"a": x0.copy()}, refopt.init(ref_rule, {"a": x0.copy()})
    for t in range(1, 4):
        g = np.linspace(0.1, 0.6, 6).reshape(2, 3) * t
        params, state = refopt.update_(rule, state, params, {"a": g})
        ref, ref_state = refopt.update_(ref_rule, ref_state, ref, {"a": g})
        assert np.array_equal(np.asarray(params["a"]), ref["a"]), (t, params["a"], ref["a"])
    new, _ = refopt.update(rule, state, params, {"a": g})
except (TypeError, ValueError) as e:   # refusing np.matrix with a clear error is fine too
    assert "matrix" in str(e) or "ndarray" in str(e), e
print("done")
"""


def test_matrix_params_are_stepped_like_ndarrays_or_refused():
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", _MATRIX_SCRIPT], cwd=root, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=root))
    assert run.returncode == 0 and "done" in run.stdout, run.stderr[-2000:]


# --- a user-defined rule (only init_leaf and update_leaf) --------------------------------------------------

class _MState(NamedTuple):
    m: np.ndarray


@dataclass(frozen=True)
class _PromotingMomentum(Rule):
    """A plugin author's slip: np.float64(0.1) * g promotes a float32 state to float64 (NEP 50), and the
    rule returns a new state object holding it."""

    def init_leaf(self, x, path):
        return _MState(np.zeros_like(x))

    def update_leaf(self, ctx, s, x, g, path):
        m = 0.9 * s.m + np.float64(0.1) * g
        x -= (0.1 * m).astype(x.dtype)
        return x, _MState(m)


def test_a_state_of_the_wrong_dtype_returned_by_a_user_rule_is_caught_at_the_next_call():
    rule = _PromotingMomentum()
    params, grads = {"a": np.ones(4, np.float32)}, {"a": np.ones(4, np.float32)}
    params, state = refopt.update_(rule, refopt.init(rule, params), params, grads)
    assert state.leaves["a"].m.dtype == np.float64          # the slip happened
    with pytest.raises(ValueError, match="state array at a is float64"):
        refopt.update_(rule, state, params, grads)


def test_negative_control_the_same_state_from_a_fresh_rule_object_is_caught():
    rule = _PromotingMomentum()
    params, grads = {"a": np.ones(4, np.float32)}, {"a": np.ones(4, np.float32)}
    params, state = refopt.update_(rule, refopt.init(rule, params), params, grads)
    with pytest.raises(ValueError, match="state array at a is float64"):
        refopt.update_(_PromotingMomentum(), state, params, grads)


# --- state arrays shared between leaves --------------------------------------------------------------------

def test_state_arrays_shared_between_leaves_are_refused_by_update_():
    rule = refopt.Adam(lr=1e-2)
    n = 40000                                     # each below the packing threshold, together above it
    params = {"a": np.linspace(-1.0, 1.0, n), "b": np.linspace(1.0, -1.0, n)}
    state = refopt.init(rule, params)
    state = refopt.OptState(state.t, state.glob, {"a": state.leaves["a"], "b": state.leaves["a"]})
    grads = {"a": np.full(n, 0.1), "b": np.linspace(-0.3, 0.3, n)}
    with pytest.raises(ValueError, match="share memory"):
        refopt.update_(rule, state, params, grads)


def test_negative_control_params_sharing_memory_are_refused_by_update_():
    rule = refopt.Adam(lr=1e-2)
    w = np.linspace(-1.0, 1.0, 8)
    params = {"a": w[:5], "b": w[3:]}
    state = refopt.init(rule, params)
    with pytest.raises(ValueError, match="share memory"):
        refopt.update_(rule, state, params, {"a": np.ones(5), "b": np.ones(5)})


# --- 0-d leaves under ClipByGlobalNorm -----------------------------------------------------------------------

@pytest.mark.parametrize("how", ["direction", "ema_update"])
def test_clip_by_global_norm_with_a_0d_leaf(how):
    clip = refopt.ClipByGlobalNorm(refopt.Adam(lr=1e-2), max_norm=0.5)
    rule = clip if how == "direction" else refopt.EMA(clip, decay=0.9)
    params = {"a": np.asarray(1.0), "b": np.ones(3)}
    grads = {"a": np.asarray(2.0), "b": np.ones(3)}             # global norm 2.65 > 0.5: clipped
    state = refopt.init(rule, params)
    out, _ = (refopt.direction if how == "direction" else refopt.update)(rule, state, params, grads)
    assert out["a"].shape == ()


# --- the pure API from two threads ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _MeetingAdam(refopt.Adam):
    """Adam whose whole-tree pre-pass (the documented ``prepare`` hook) waits until two calls reach it: a
    deterministic stand-in for two threads being scheduled in the middle of a step."""

    def prepare(self, ctx, ss, xs, gs, paths):
        try:
            _MEETING.wait(timeout=5)
        except threading.BrokenBarrierError:      # a walk that serializes its calls is fine too
            pass
        return gs


_MEETING = threading.Barrier(2)


def test_pure_update_from_two_threads_on_the_same_inputs():
    rule = _MeetingAdam(lr=1e-2)
    rng = np.random.default_rng(0)
    params = {f"k{i}": rng.standard_normal(50) for i in range(4)}
    state = refopt.init(rule, params)
    grads = [{k: rng.standard_normal(50) for k in params} for _ in range(2)]
    _MEETING.reset()
    threading.Thread(target=_MEETING.wait, kwargs={"timeout": 5}).start()
    params, state = refopt.update_(rule, state, params, grads[0])     # a training step: the walk caches these
    expected = [refopt.update(refopt.Adam(lr=1e-2), state, params, g)[0] for g in grads]
    got = [None, None]

    def step(j):
        got[j] = refopt.update(rule, state, params, grads[j])[0]

    threads = [threading.Thread(target=step, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j in range(2):
        for k in params:
            assert np.array_equal(got[j][k], expected[j][k]), (j, k)


# --- a rule's prepare hook returning gradients of another dtype or size -----------------------------------------

@dataclass(frozen=True)
class _PromotingPrepare(refopt.Adam):
    """A plugin author's slip in the whole-tree pre-pass: np.float64 * float32 array is float64 (NEP 50)."""

    def prepare(self, ctx, ss, xs, gs, paths):
        return [g * np.float64(0.5) for g in gs]


def test_prepare_returning_float64_for_a_float32_leaf_is_refused():
    rule = _PromotingPrepare(lr=1e-2)
    params = {"a": np.ones(4, np.float32)}
    with pytest.raises(ValueError, match="float64"):
        refopt.update_(rule, refopt.init(rule, params), params, {"a": np.ones(4, np.float32)})


# --- paths named in messages -------------------------------------------------------------------------------------

def test_paths_of_trees_with_equal_comparing_keys():
    from refopt import tree as T
    assert T.flatten({1: np.ones(1)})[1] == ["[1]"]
    assert T.flatten({True: np.ones(1)})[1] == ["[True]"]


# --- a user's subclass of a built-in rule overriding update_leaf ----------------------------------------------

@dataclass(frozen=True)
class _AdamFrozenVectors(refopt.Adam):
    """Adam that leaves the 1-D arrays alone: a user's per-leaf override of the documented hook."""

    def update_leaf(self, ctx, s, x, g, path):
        if x.ndim == 1:
            return x, s
        return super().update_leaf(ctx, s, x, g, path)


@pytest.mark.parametrize("api", ["update_", "update"])
def test_a_subclass_overriding_update_leaf_is_honoured_for_small_leaves(api):
    rule = _AdamFrozenVectors(lr=1e-2)
    params = {"w": np.ones((3, 3)), "b": np.ones(3)}
    state = refopt.init(rule, params)
    new, _ = getattr(refopt, api)(rule, state, params, {"w": np.ones((3, 3)), "b": np.ones(3)})
    assert np.array_equal(new["b"], np.ones(3))
    assert not np.array_equal(new["w"], np.ones((3, 3)))      # negative control: the matrix is stepped


def test_update_with_a_state_it_already_advanced_in_place_raises():
    """update_ writes the arrays of the state it is handed but cannot change its t (an immutable OptState):
    a loop that drops the returned state would redo step 1's bias corrections forever. The walk knows the
    objects it advanced and refuses them with their old t, before writing anything; the rebound state, a
    retry after an error, and the pure update of one state twice stay legal."""
    rule = refopt.Adam(lr=1e-2)
    params = {"a": np.ones(5), "b": np.full((3, 2), 2.0)}
    grads = {"a": np.full(5, 0.5), "b": np.full((3, 2), -1.0)}
    state = refopt.init(rule, params)
    params, new = refopt.update_(rule, state, params, grads)
    assert new.t == 1 and state.t == 0
    before = [v.copy() for v in params.values()] + [a.copy() for a in refopt.tree.leaves(new.leaves)]
    with pytest.raises(ValueError, match=r"rebind.*params, state = refopt.update_"):
        refopt.update_(rule, state, params, grads)            # the stale t = 0
    after = list(params.values()) + list(refopt.tree.leaves(new.leaves))
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    bad = {"a": np.full(5, np.nan), "b": grads["b"]}
    with pytest.raises(FloatingPointError):
        refopt.update_(rule, new, params, bad)
    params, new2 = refopt.update_(rule, new, params, grads)   # the retry with the same (rebound) state
    assert new2.t == 2
    # negative control: the pure update may be called on one state as often as one likes
    pure = refopt.Adam(lr=1e-2)
    s = refopt.init(pure, params)
    p1, _ = refopt.update(pure, s, params, grads)
    p2, _ = refopt.update(pure, s, params, grads)
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)


@pytest.mark.parametrize("make", [lambda: refopt.SGD(lr=0.1, momentum=0.9), lambda: refopt.Adam(lr=1e-2),
                                  lambda: refopt.Muon(lr=0.02)])
def test_a_gradient_sharing_memory_with_the_params_is_read_as_handed(make, monkeypatch):
    """A gradient that overlaps an array update_ writes is read as the caller handed it, as the pure update
    reads it: update_ == update bit for bit. Here the gradient of the large leaf w (2**17 elements: not
    packed, read in place) is the params' buffer shifted by one element (g[i] = w[i - 1], written just
    before), and the gradient of leaf b is the params of leaf a (written before b by a rule that reads
    each gradient in place as it steps its leaf). Negative control: without Walk.grad's copy they differ
    (for Muon, whose step reads every gradient before writing, with the leaf-by-leaf step)."""
    rng = np.random.default_rng(0)
    n = 1 << 17
    buf = rng.standard_normal(n + 1)
    small = rng.standard_normal(12)
    params = {"a": small.reshape(3, 4), "b": rng.standard_normal((3, 4)), "w": buf[1:].reshape(n // 256, 256)}
    grads = {"a": rng.standard_normal((3, 4)), "b": small.reshape(3, 4), "w": buf[:n].reshape(n // 256, 256)}
    keep = {k: v.copy() for k, v in params.items()}

    def both():
        rule = make()
        state = refopt.init(rule, params)
        want, _ = refopt.update(rule, state, params, grads)
        want = {k: v.copy() for k, v in want.items()}
        got, _ = refopt.update_(rule, state, params, grads)
        diff = max(float(np.max(np.abs(want[k] - got[k]))) for k in want)
        for k, v in keep.items():
            params[k][...] = v
        return diff

    assert both() == 0.0
    monkeypatch.setattr(fast_walk.Walk, "grad", lambda self, g: g)
    if isinstance(make(), refopt.Muon):
        # Muon's step reads every gradient of a chunk of leaves (its momentum pass) before it writes any of
        # them, so within one chunk it needs no copy; across chunks (a later chunk reads its gradients
        # after an earlier one wrote) and in the leaf-by-leaf step (the base class's) it does
        assert both() == 0.0
        monkeypatch.undo()
        monkeypatch.setattr(fast_walk, "CHUNK_ELEMENTS", 12)    # chunks: [a], [b], [w]
        assert both() == 0.0
        monkeypatch.setattr(fast_walk.Walk, "grad", lambda self, g: g)
        assert both() > 0.0
        monkeypatch.undo()
        monkeypatch.setattr(fast_walk.Walk, "grad", lambda self, g: g)
        monkeypatch.setattr(fast_walk, "_BATCHED", [b for b in fast_walk._BATCHED if b[0] is not refopt.Muon])
    assert both() > 0.0


def test_a_gradient_sharing_memory_with_another_groups_params_is_read_as_handed(monkeypatch):
    """In a Partition the groups are stepped one after the other, and an elementwise rule steps its small
    leaves before its large ones: a gradient overlapping params that an earlier group (or the small leaves)
    write is still read as handed. update_ == update bit for bit. Here leaf a's params are the first 12
    elements of a buffer that is also the whole gradient of the large leaf b and the gradient of the small
    Muon leaf c. Negative control: without Walk.grad's copy they differ."""
    rng = np.random.default_rng(1)
    n = 1 << 17
    buf = rng.standard_normal(n)
    params = {"a": buf[:12].reshape(3, 4), "b": rng.standard_normal((n // 256, 256)),
              "c": rng.standard_normal((4, 3))}
    grads = {"a": rng.standard_normal((3, 4)), "b": buf.reshape(n // 256, 256), "c": buf[:12].reshape(4, 3)}
    keep = {k: v.copy() for k, v in params.items()}
    labels = {"a": "sgd", "b": "adam", "c": "muon"}

    def diffs():
        out = []
        for rule in (refopt.Partition({"sgd": refopt.SGD(lr=0.1, momentum=0.9), "adam": refopt.Adam(lr=1e-2),
                                       "muon": refopt.Muon(lr=0.02)}, labels),
                     refopt.SGD(lr=0.1, momentum=0.9)):
            state = refopt.init(rule, params)
            want, _ = refopt.update(rule, state, params, grads)
            want = {k: v.copy() for k, v in want.items()}
            got, _ = refopt.update_(rule, state, params, grads)
            out.append(max(float(np.max(np.abs(want[k] - got[k]))) for k in want))
            for k, v in keep.items():
                params[k][...] = v
        return out

    assert diffs() == [0.0, 0.0]
    monkeypatch.setattr(fast_walk.Walk, "grad", lambda self, g: g)
    assert min(diffs()) > 0.0

r"""Invariance properties of optimizer steps, runnable on any implementation (needs hypothesis).

Each property is a function ``prop(adapter, *, max_examples=10, rtol=None, matrix_only=False, lr=None,
dtype=np.float64) -> Outcome`` that draws inputs with hypothesis (:mod:`refopt.testing.strategies`; derandomized, no
example database), runs the adapter (:mod:`refopt.testing.adapters`; params in refopt's layout) and
measures a relative error ``err``; the property holds when ``err <= rtol`` on every example
(rtol None: 1e-6 for float64 inputs, 1e-3 for float32 ones; :func:`invariants` uses 1e-5 / 1e-3: Adam's
eps = 1e-8 to 1e-6 against gradients >= 0.1 stays below 1e-5). When it
fails, hypothesis shrinks the input and the :class:`Outcome` carries the shrunk counterexample. Below
``x_t = step^t(x_0; g_1..g_t)`` is the trajectory over k = 3 steps from a fresh state on a drawn gradient
stream (open loop), ``D = max_t max|x_t - x_0|`` the size of the motion, errors are max-norm. A rule that takes
the loss value (``adapter.inputs`` holds ``'value'``: Polyak SGD, Momo) gets a drawn one per step, f_t in
[0.5, 5], transformed as a loss is: scaled by c with the gradients (gradient scale), unchanged by the
symmetries of the params (orthogonal, permutation, parameter scale); the closed loops (reparametrization, the
GPT) hand it the loss they differentiate:

``gradient_scale_invariance``  x_t(x_0; c g) = x_t(x_0; g) for c > 0 (and c f for a rule that takes the loss
    value f: the loss scaled by c); err = max|x'_t - x_t| / D.
    Adam-type rules at eps -> 0 (gradients and c g are drawn >= 0.1 in size, so eps <= 1e-6 contributes
    about 1e-6 at most), sign and msign methods, Muon, Covariant and Hyperball of such a base; not SGD, not L2 decay.
``parameter_scale_covariance`` post 000, eq. (phi): phi(c1 w, c2 g) = c1 phi(w, g); over k steps
    x'_t = c1 x_t when started from c1 x_0 and fed c2 g; err = max|x'_t - c1 x_t| / (c1 D).
    Covariant and Hyperball (eq. elr-u) of a gradient-scale-invariant base; not SGD, Adam, Muon.
``orthogonal_equivariance``    for matrices, step(U W V^T, U G V^T) = U step(W, G) V^T with U, V Haar
    orthogonal (msign(U G V^T) = U msign(G) V^T, post 003); SGD, Muon, Schedule-Free SGD, Covariant /
    Hyperball of those (Frobenius norm); not elementwise-adaptive rules (Adam, LAMB).
``permutation_equivariance``   step(P w, P g) = P step(w, g) for a permutation P of the entries of each
    array; every elementwise rule, and Covariant / Hyperball of one; not Muon.
``reparametrization_covariance``  post 000 "Reparametrization": training v = w/c on l(c v) (gradients
    c grad l(c v), closed loop on the quadratic l(w) = 1/2 sum h (w - b)^2) reproduces training w:
    c v_t = w_t; err = max|c v_t - w_t| / D. Covariant and Hyperball; not SGD (lr c^-2), Adam, Muon.
``gpt_symmetry_equivariance``  post 000 joint symmetries of the pre-norm GPT (:mod:`models.symmetries`,
    scalar c): one closed-loop step from T_c(p) equals T_c applied to the step from p (the gradient at
    T_c p is computed by refopt's autograd). Covariant and Hyperball (per-array norms); not SGD, Adam,
    Muon (their steps do not scale with the weight). Needs the ``models`` package.
``mup_step_size``              post 001/003: one step from W = 0 on a full-rank gradient has spectral norm
    ||dW||_2 = lr * sqrt(fan_out / fan_in) (refopt layout (fan_in, fan_out)); err = | ||dW||_2 /
    (lr sqrt(fan_out/fan_in)) - 1 |. Muon with exact msign and scale 'spectral'; not Newton-Schulz
    (singular values in about [0.7, 1.2]), not the 'jordan' / 'rms_match' scales, not SGD or Adam.
``averaging_identities``       post 004, eqs. (2) and (18): for a refopt ``Average`` the average is the mean
    of the iterates; for Schedule-Free (constant lr) x_t is the mean of z_1..z_t and the returned point
    is y_t = (1 - beta) z_t + beta x_t (1e-12). Needs the averaged weights: n/a for other adapters.
:func:`msign_equivariance` checks the same for a bare matrix-sign function (``refopt.msign`` or yours).
``purity``                     init and step leave their inputs untouched (bit for bit).
``determinism``                two runs from the same inputs are bit-identical.
``bit_identical_resume``       stopping after step 1, saving the state through the implementation's own
    checkpoint path (torch ``state_dict``, host copy of an optax state) and resuming gives the same
    trajectory bit for bit.

:func:`invariants` runs them all on an implementation and on the corresponding refopt rule and returns an
:class:`InvariantsReport` (a table: property, the theory's expectation for the rule
(:mod:`refopt.testing.expected`), what refopt's rule does, what the implementation does, verdict; a failure
the rule shares is a FAIL when it is more than :data:`WORSE` times the rule's own error on the same input).
Each failure's input can be saved in full (:func:`save_case`, ``save_dir``) and replayed (:func:`replay`,
``refopt invariants ... --replay FILE``). For pytest, :func:`check` and ``assert_<property>`` (one per
property, e.g. ``assert_gradient_scale_invariance(impl, kwargs)``) raise AssertionError with the
description and the counterexample.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

try:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    raise ImportError("refopt.testing.properties needs hypothesis: pip install \"refopt[testing]\"") from None

from refopt import tree as T
from refopt.testing import strategies as S
from refopt.testing.adapters import Adapter, RuleAdapter, make_adapter

__all__ = ["Outcome", "Property", "PROPERTIES", "invariants", "InvariantsReport", "run_property",
           "msign_equivariance"]

STEPS = 3


@dataclass
class Outcome:
    """holds: True / False, or None when the property does not apply (the implementation refuses the
    inputs it needs); err: the largest relative error seen; counterexample: the shrunk failing input on one
    line (full-precision scalars, small arrays in full, larger ones by shape); case: that input itself (for
    :func:`save_case` and a replay); seed: the hypothesis seed of the run (derandomized: the same arguments
    draw the same examples)."""

    property: str
    holds: bool | None
    err: float = 0.0
    counterexample: str | None = None
    note: str = ""
    by_design: bool = False   # n/a for this kind of implementation (not a refusal of the inputs): no verdict
    case: dict | None = field(default=None, repr=False)
    replay_file: str | None = None

    def describe(self) -> str:
        if self.holds is None:
            return f"n/a ({self.note})" if self.note else "n/a"
        extra = f"; {self.note}" if self.note and self.holds is False else ""
        return ("holds" if self.holds else "FAILS") + f" (err {self.err:.1e}{extra})"

    def check(self) -> "Outcome":
        """Raise AssertionError with the description and the counterexample when the property fails
        (for pytest); return self otherwise (holds, or n/a)."""
        if self.holds is False:
            where = f"; input saved to {self.replay_file}" if self.replay_file else ""
            raise AssertionError(f"{self.property} {self.describe()}: counterexample {self.counterexample}{where}")
        return self


@dataclass(frozen=True)
class Property:
    name: str
    equation: str
    source: str
    run: Callable


def _fmt(v) -> str:
    """One line: floats in full precision (repr), arrays of up to 6 entries in full, larger ones as
    <shape dtype> (the full input is what :func:`save_case` writes)."""
    if isinstance(v, np.ndarray):
        if v.size <= 6:
            return "[" + ", ".join(repr(float(a)) if v.dtype.kind == "f" else repr(a.item()) for a in v.ravel()) + "]"
        return f"<{v.shape} {v.dtype}>"
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_fmt(a) for a in v)
        return f"[{inner}]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_fmt(a)}" for k, a in v.items()) + "}"
    return repr(v)


class _Fail(AssertionError):
    pass


class _NotApplicable(Exception):
    pass


def run_property(name: str, strategy, check: Callable, max_examples: int, rtol: float, replay=None) -> Outcome:
    """Run ``check(case) -> err`` under hypothesis; shrink a case with err > rtol (or nan). ``replay``: one
    case (a saved counterexample, :func:`load_case`) checked alone instead of drawing."""
    if replay is not None:
        try:
            err = float(check(replay))
        except _NotApplicable as e:
            return Outcome(name, None, note=str(e))
        return Outcome(name, err <= rtol, err, None if err <= rtol else _fmt(replay), case=replay)
    seen = {"err": 0.0, "case": None, "na": None}

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate, Phase.shrink),
              print_blob=False)
    @given(strategy)
    def test(case):
        try:
            err = float(check(case))
        except _NotApplicable as e:
            seen["na"] = str(e)
            return
        if not err <= rtol:
            seen["case"] = case
            seen["fail_err"] = err
            raise _Fail(f"err {err:.3g} > {rtol:g}")
        seen["err"] = max(seen["err"], err)

    try:
        test()
    except _Fail:
        return Outcome(name, False, seen.get("fail_err", math.inf), _fmt(seen["case"]), case=seen["case"])
    if seen["na"] is not None and seen["err"] == 0.0:
        return Outcome(name, None, note=seen["na"])
    return Outcome(name, True, seen["err"])


# --------------------------------------------------------------------------------------------------------
def _inputs(adapter, values, t: int) -> dict:
    """The step's inputs beyond the gradients for an adapter that takes them: ``value=`` the drawn loss
    ``values[t]`` (not applicable when the case has none, or for a rule that evaluates the loss itself)."""
    if "closure" in getattr(adapter, "inputs", ()):
        raise _NotApplicable("the rule evaluates the loss at points of its own (closure=), and these cases draw "
                             "gradients, not a loss")
    if "value" not in getattr(adapter, "inputs", ()):
        return {}
    if values is None:
        raise _NotApplicable("the rule takes the loss value, and this case draws none")
    return {"value": float(values[t])}


def _traj(adapter: Adapter, x0, grads, values=None):
    s = adapter.init([np.array(a, copy=True) for a in x0])
    x = [np.array(a, copy=True) for a in x0]
    out = []
    for t, g in enumerate(grads):
        x, s = adapter.step(s, x, [np.array(a, copy=True) for a in g], **_inputs(adapter, values, t))
        x = [np.asarray(a) for a in x]
        out.append([np.array(a, copy=True) for a in x])   # an implementation may step in place
    return out


def _motion(x0, traj) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(a, np.float64))))
               for xs in traj for x, a in zip(xs, x0))


def _maxdiff(ta, tb) -> float:
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for xa, xb in zip(ta, tb) for a, b in zip(xa, xb))


def _guard(fn):
    """Turn a ValueError of refopt (an input the rule refuses) into 'not applicable'."""
    def wrapped(*a, **k):
        try:
            return fn(*a, **k)
        except (ValueError, NotImplementedError) as e:
            raise _NotApplicable(str(e).splitlines()[0][:120]) from None
    return wrapped


def _case(matrix_only, dtype, steps=STEPS, big=False):
    def build(x0, seed, logs):
        rng = np.random.default_rng(seed)
        scale = 10.0 if big else math.exp(logs)    # big: entries in [1, 100], so that c g >= 0.1 for c >= 0.1
        grads = [[S.bounded_array(rng, a.shape, dtype, scale) for a in x0] for _ in range(steps)]
        # the loss value of each step, for the rules that take one (drawn after the gradients: those stay as
        # they were drawn without it)
        return {"x0": x0, "grads": grads, "values": [float(v) for v in rng.uniform(0.5, 5.0, steps)]}
    return st.builds(build, S.pytrees(matrix_only, dtype, max_leaves=2, scales=(1e-1, 1e1)),
                     st.integers(0, 2 ** 16), st.floats(math.log(1e-1), math.log(1e1)))



def _dtype_rtol(prop):
    """``rtol=None`` (the default) becomes 1e-6 for float64 inputs and 1e-3 for float32 ones (float32's
    eps is 1.2e-7: a correct rule's rounding over a few steps reaches 1e-6), as :func:`invariants` scales
    its own default."""
    @functools.wraps(prop)
    def wrapped(adapter, *, rtol=None, dtype=np.float64, **kw):
        if rtol is None:
            rtol = 1e-6 if np.dtype(dtype) == np.float64 else 1e-3
        return prop(adapter, rtol=rtol, dtype=dtype, **kw)
    return wrapped


@_dtype_rtol
def gradient_scale_invariance(adapter, *, max_examples=10, rtol=None, matrix_only=False, dtype=np.float64,
                              scales=(1e-1, 1e1), replay=None, **_):
    def check(case):
        c = case["c"]
        vals = case.get("values")
        a = _guard(_traj)(adapter, case["x0"], case["grads"], vals)
        b = _guard(_traj)(adapter, case["x0"], [[c * g for g in gs] for gs in case["grads"]],
                          None if vals is None else [c * v for v in vals])
        return _maxdiff(a, b) / max(_motion(case["x0"], a), 1e-300)
    strat = st.builds(lambda d, c: {**d, "c": c}, _case(matrix_only, dtype, big=True), S.positive_scales(*scales))
    return run_property("gradient_scale_invariance", strat, check, max_examples, rtol, replay)


@_dtype_rtol
def parameter_scale_covariance(adapter, *, max_examples=10, rtol=None, matrix_only=False, dtype=np.float64,
                               scales=(1e-1, 1e1), replay=None, **_):
    def check(case):
        c1, c2 = case["c1"], case["c2"]
        a = _guard(_traj)(adapter, case["x0"], case["grads"], case.get("values"))
        b = _guard(_traj)(adapter, [c1 * x for x in case["x0"]], [[c2 * g for g in gs] for gs in case["grads"]],
                          case.get("values"))
        return _maxdiff([[c1 * x for x in xs] for xs in a], b) / max(c1 * _motion(case["x0"], a), 1e-300)
    strat = st.builds(lambda d, c1, c2: {**d, "c1": c1, "c2": c2}, _case(matrix_only, dtype),
                      S.positive_scales(*scales), S.positive_scales(*scales, 1.0))
    return run_property("parameter_scale_covariance", strat, check, max_examples, rtol, replay)


@_dtype_rtol
def orthogonal_equivariance(adapter, *, max_examples=10, rtol=None, dtype=np.float64, replay=None, **_):
    def rot(case, a):
        us, vs = case["U"], case["V"]
        return [(u @ x.astype(np.float64) @ v.T).astype(dtype) for x, u, v in zip(a, us, vs)]

    def check(case):
        a = _guard(_traj)(adapter, case["x0"], case["grads"], case.get("values"))
        b = _guard(_traj)(adapter, rot(case, case["x0"]), [rot(case, gs) for gs in case["grads"]], case.get("values"))
        return _maxdiff([rot(case, xs) for xs in a], b) / max(_motion(case["x0"], a), 1e-300)

    def add_uv(d, seed):
        rng = np.random.default_rng(seed)
        d["U"] = [S.haar_orthogonal(x.shape[0], rng) for x in d["x0"]]
        d["V"] = [S.haar_orthogonal(x.shape[1], rng) for x in d["x0"]]
        return d
    strat = st.builds(add_uv, _case(True, dtype), st.integers(0, 2 ** 16))
    return run_property("orthogonal_equivariance", strat, check, max_examples, rtol, replay)


@_dtype_rtol
def permutation_equivariance(adapter, *, max_examples=10, rtol=None, matrix_only=False, dtype=np.float64, replay=None, **_):
    def perm(case, a):
        return [x.reshape(-1)[p].reshape(x.shape) for x, p in zip(a, case["P"])]

    def check(case):
        a = _guard(_traj)(adapter, case["x0"], case["grads"], case.get("values"))
        b = _guard(_traj)(adapter, perm(case, case["x0"]), [perm(case, gs) for gs in case["grads"]],
                          case.get("values"))
        return _maxdiff([perm(case, xs) for xs in a], b) / max(_motion(case["x0"], a), 1e-300)

    def add_p(d, seed):
        rng = np.random.default_rng(seed)
        d["P"] = [rng.permutation(x.size) for x in d["x0"]]
        return d
    strat = st.builds(add_p, _case(matrix_only, dtype), st.integers(0, 2 ** 16))
    return run_property("permutation_equivariance", strat, check, max_examples, rtol, replay)


@_dtype_rtol
def reparametrization_covariance(adapter, *, max_examples=10, rtol=None, matrix_only=False, dtype=np.float64, replay=None, **_):
    def run(case, c):
        s = adapter.init([x / c for x in case["x0"]])
        v = [np.array(x / c) for x in case["x0"]]
        out = []
        for _ in range(STEPS):
            w = [c * x.astype(np.float64) for x in v]
            g = [(c * h * (a - b)).astype(dtype) for a, h, b in zip(w, case["h"], case["b"])]
            f = sum(0.5 * float(np.sum(h * (a - b) ** 2)) for a, h, b in zip(w, case["h"], case["b"]))
            v, s = adapter.step(s, v, g, **_inputs(adapter, [f], 0))
            v = [np.asarray(a) for a in v]
            out.append([c * a for a in v])
        return out

    def check(case):
        a = _guard(run)(case, 1.0)
        b = _guard(run)(case, case["c"])
        return _maxdiff(a, b) / max(_motion(case["x0"], a), 1e-300)

    def build(d, c, seed):
        rng = np.random.default_rng(seed)
        d["h"] = [np.exp(rng.uniform(math.log(0.1), math.log(10.0), x.shape)) for x in d["x0"]]
        d["b"] = [rng.standard_normal(x.shape) for x in d["x0"]]
        d["c"] = c
        d.pop("grads")
        return d
    strat = st.builds(build, _case(matrix_only, dtype), S.positive_scales(1e-1, 1e1), st.integers(0, 2 ** 16))
    return run_property("reparametrization_covariance", strat, check, max_examples, rtol, replay)


def _gpt_setup(seed):
    from refopt.models import gpt
    from refopt.models import symmetries as sy
    import refopt

    cfg = gpt.GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=4, ffn="reglu", ffn_hidden=6,
                        tie_head=False, init_std=0.5)
    p = gpt.init(cfg, seed, np.float64)
    rng = np.random.default_rng(seed + 1)
    leaves, paths, td = refopt.tree.flatten(p)
    leaves = [rng.uniform(0.5, 1.5, x.shape) if x.ndim == 1 else x for x in leaves]
    x = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
    y = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
    return cfg, leaves, paths, td, x, y, gpt, sy


@_dtype_rtol
def gpt_symmetry_equivariance(adapter, *, max_examples=10, rtol=None, matrix_only=False, dtype=np.float64, replay=None, **_):
    import refopt

    def check(case):
        cfg, leaves, paths, td, x, y, gpt, sy = _gpt_setup(case["seed"])
        train = [i for i, a in enumerate(leaves) if a.ndim == 2 or not matrix_only]
        vg = refopt.value_and_grad(gpt.loss)

        def one_step(full):
            f, g = vg(refopt.tree.unflatten(td, full), x, y, cfg)
            gl = refopt.tree.leaves(g)
            sub = [full[i] for i in train]
            s = adapter.init(sub)
            new, _ = adapter.step(s, sub, [gl[i] for i in train], **_inputs(adapter, [float(f)], 0))
            out = list(full)
            for i, a in zip(train, new):
                out[i] = np.asarray(a)
            return out

        def T(full):
            q = sy.transform(refopt.tree.unflatten(td, full), cfg, case["sym"], case["c"],
                             0 if sy.table(cfg)[case["sym"]].per_block else None)
            return refopt.tree.leaves(q)

        a = _guard(one_step)(leaves)
        b = _guard(one_step)(T(leaves))
        ta = T(a)
        diff = max(float(np.max(np.abs(u - v))) for u, v in zip(ta, b))
        motion = max(float(np.max(np.abs(u - v))) for u, v in zip(T(leaves), ta))
        return diff / max(motion, 1e-300)

    from refopt.models import gpt  # noqa: F401  (a clear ImportError when the models are missing)
    names = ["qk", "vo", "up_down", "attn_norm", "mlp_norm"]
    strat = st.fixed_dictionaries({"seed": st.integers(0, 100), "sym": st.sampled_from(names),
                                   "c": S.positive_scales(1e-1, 1e1)})
    return run_property("gpt_symmetry_equivariance", strat, check, max_examples, rtol, replay)


@_dtype_rtol
def mup_step_size(adapter, *, max_examples=10, rtol=None, lr=None, dtype=np.float64, replay=None, **_):
    if lr is None:
        return Outcome("mup_step_size", None, note="needs the rule's lr")

    def check(case):
        g = case["g"]
        w0 = np.zeros_like(g)
        traj = _guard(_traj)(adapter, [w0], [[g]], [1.0])
        dw = traj[0][0].astype(np.float64)
        n_in, n_out = g.shape
        return abs(float(np.linalg.norm(dw, 2)) / (lr * math.sqrt(n_out / n_in)) - 1.0)
    strat = st.fixed_dictionaries({"g": S.matrices("well", dtype)})
    return run_property("mup_step_size", strat, check, max_examples, rtol, replay)


def msign_equivariance(fn: Callable, *, max_examples=10, rtol=1e-10, kind: str | None = "well",
                       dtype=np.float64) -> Outcome:
    """For a matrix-sign function ``fn`` (e.g. ``refopt.msign``, or your Newton-Schulz):
    fn(U G V^T) = U fn(G) V^T for Haar-orthogonal U, V (post 003); err = max|lhs - rhs| / max|rhs|.
    ``kind``: the matrices drawn ('well', 'ill', 'rank_deficient' or None for all)."""
    def check(case):
        g, u, v = case["G"], case["U"], case["V"]
        lhs = np.asarray(fn((u @ g.astype(np.float64) @ v.T).astype(dtype)), np.float64)
        rhs = u @ np.asarray(fn(g), np.float64) @ v.T
        return float(np.max(np.abs(lhs - rhs))) / max(float(np.max(np.abs(rhs))), 1e-300)

    def add(g, seed):
        rng = np.random.default_rng(seed)
        return {"G": g, "U": S.haar_orthogonal(g.shape[0], rng), "V": S.haar_orthogonal(g.shape[1], rng)}
    return run_property("msign_equivariance", st.builds(add, S.matrices(kind, dtype), st.integers(0, 2 ** 16)),
                        check, max_examples, rtol)


def _bits_equal(a, b) -> bool:
    return all(np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y) for x, y in zip(a, b))


def purity(adapter, *, max_examples=5, matrix_only=False, dtype=np.float64, replay=None, **_):
    """A pure step leaves its params, gradients and state as they were (bit for bit). n/a for torch and
    jax implementations: torch optimizers update their tensors in place by design and jax arrays are
    immutable (their adapters hand them converted copies, so nothing could be observed)."""
    if getattr(adapter, "framework", None) in ("torch", "jax"):
        return Outcome("purity", None, note=f"a {adapter.framework} implementation receives converted copies "
                                            f"(torch steps in place by design; jax arrays are immutable)",
                       by_design=True)

    def state_arrays(s):
        try:
            arrays, _, _ = T.flatten(s)
        except Exception:
            return []
        return [a for a in arrays if isinstance(a, np.ndarray)]

    written: list = []   # what the last impure step wrote: "params [0]", "grads [1]", "state"

    def check(case):
        x0 = [a.copy() for a in case["x0"]]
        keep_x = [a.copy() for a in x0]
        s = _guard(adapter.init)(x0)
        before = [a.copy() for a in state_arrays(s)]
        g = [a.copy() for a in case["grads"][0]]
        keep_g = [a.copy() for a in g]
        _guard(adapter.step)(s, x0, g, **_inputs(adapter, case.get("values"), 0))
        after = state_arrays(s)
        what = [f"{name} [{i}]" for name, new, old in (("params", x0, keep_x), ("grads", g, keep_g))
                for i, (a, b) in enumerate(zip(new, old)) if not _bits_equal([a], [b])]
        if not (len(after) == len(before) and _bits_equal(after, before)):
            what.append("the state it was given")
        written[:] = what
        return math.inf if what else 0.0
    out = run_property("purity", _case(matrix_only, dtype), check, max_examples, 0.0, replay)
    if out.holds is False and written:
        out.note = "the step wrote into " + ", ".join(written)
    return out


def determinism(adapter, *, max_examples=5, matrix_only=False, dtype=np.float64, replay=None, **_):
    def check(case):
        a = _guard(_traj)(adapter, case["x0"], case["grads"], case.get("values"))
        b = _guard(_traj)(adapter, case["x0"], case["grads"], case.get("values"))
        return 0.0 if all(_bits_equal(u, v) for u, v in zip(a, b)) else math.inf
    return run_property("determinism", _case(matrix_only, dtype), check, max_examples, 0.0, replay)


def bit_identical_resume(adapter, *, max_examples=5, matrix_only=False, dtype=np.float64, replay=None, **_):
    def run(case):
        vals = case.get("values")
        straight = _traj(adapter, case["x0"], case["grads"], vals)
        s = adapter.init([a.copy() for a in case["x0"]])
        x, s = adapter.step(s, [a.copy() for a in case["x0"]], case["grads"][0], **_inputs(adapter, vals, 0))
        blob = adapter.checkpoint(s)
        s = adapter.restore(blob, x)
        out = [[np.array(a, copy=True) for a in x]]
        for t, g in enumerate(case["grads"][1:], 1):
            x, s = adapter.step(s, x, g, **_inputs(adapter, vals, t))
            out.append([np.array(a, copy=True) for a in x])
        return 0.0 if all(_bits_equal(u, v) for u, v in zip(straight, out)) else math.inf
    return run_property("bit_identical_resume", _case(matrix_only, dtype), _guard(run), max_examples, 0.0, replay)


def averaging_identities(adapter, *, max_examples=5, matrix_only=False, dtype=np.float64, replay=None, **_):
    """post 004, eq. (2) and (18), on a refopt rule that exposes its averages (n/a otherwise):
    Average: mu_t = (1 - 1/t) mu_{t-1} + (1/t) theta_t, i.e. the mean of the iterates (eq. 2, c_t = 1/t);
    Schedule-Free (constant lr, no warmup, r = 0): x_t = mean of z_1..z_t (eq. 18's mu with c = 1/t)
    and the gradient point y_t = (1 - beta) z_t + beta x_t. err: max-norm relative difference."""
    from refopt.conventions import facts
    from refopt.core import Rule
    from refopt.rules.averaging import Average

    rule = getattr(adapter, "rule", None)
    average = isinstance(rule, Average)
    if not isinstance(rule, Rule) or not facts(rule)["averaging"]:
        return Outcome("averaging_identities", None, note="needs the averaged weights of a refopt Average or "
                                                          "Schedule-Free rule")
    beta = getattr(rule, "beta", getattr(rule, "beta1", None))

    def check(case):
        s = adapter.init([a.copy() for a in case["x0"]])
        x = [a.copy() for a in case["x0"]]
        seen, err = [], 0.0
        for t, g in enumerate(case["grads"]):
            x, s = adapter.step(s, x, g, **_inputs(adapter, case.get("values"), t))
            st = adapter.state_arrays(s)
            if average:
                seen.append([np.array(a, np.float64, copy=True) for a in x])
                mean = [np.mean([v[i] for v in seen], axis=0) for i in range(len(x))]
                got = st["mu"]
            else:
                seen.append([np.array(a, np.float64, copy=True) for a in st["z"]])
                mean = [np.mean([v[i] for v in seen], axis=0) for i in range(len(x))]
                got = st["x"]
                y = [(1 - beta) * np.asarray(z, np.float64) + beta * np.asarray(a, np.float64)
                     for z, a in zip(st["z"], st["x"])]
                err = max(err, max(float(np.max(np.abs(u - np.asarray(v)))) / float(np.max(np.abs(u)))
                                   for u, v in zip(y, x)))
            err = max(err, max(float(np.max(np.abs(m - np.asarray(a)))) / float(np.max(np.abs(m)))
                               for m, a in zip(mean, got)))
        return err
    return run_property("averaging_identities", _case(matrix_only, dtype), check, max_examples,
                        1e-12 if dtype == np.float64 else 1e-5, replay)


PROPERTIES: list[Property] = [
    Property("gradient_scale_invariance", "x_t(x_0; c g) = x_t(x_0; g), c > 0", "post 000 (c2 in eq. phi)",
             gradient_scale_invariance),
    Property("parameter_scale_covariance", "phi(c1 w, c2 g) = c1 phi(w, g)", "post 000, eq. (phi)",
             parameter_scale_covariance),
    Property("orthogonal_equivariance", "step(U W V^T, U G V^T) = U step(W, G) V^T", "post 003 (msign)",
             orthogonal_equivariance),
    Property("permutation_equivariance", "step(P w, P g) = P step(w, g)", "elementwise rules",
             permutation_equivariance),
    Property("reparametrization_covariance", "training c v on l(c v) = training w on l(w)",
             "post 000, Reparametrization", reparametrization_covariance),
    Property("gpt_symmetry_equivariance", "step(T_c p) = T_c step(p) for the GPT's joint symmetries",
             "post 000, joint symmetries", gpt_symmetry_equivariance),
    Property("mup_step_size", "||dW||_2 = lr sqrt(fan_out/fan_in) (exact msign)", "post 001, post 003",
             mup_step_size),
    Property("averaging_identities", "mu_t = mean of the iterates; y = (1-beta) z + beta x",
             "post 004, eqs. (2) and (18)", averaging_identities),
    Property("purity", "inputs untouched", "refopt's pure API", purity),
    Property("determinism", "same inputs, same bits", "structural", determinism),
    Property("bit_identical_resume", "checkpoint + resume = straight run, bit for bit", "structural",
             bit_identical_resume),
]


# ---- counterexamples you can replay ------------------------------------------------------------------
def save_case(path: str, outcome: Outcome, meta: dict) -> str:
    """Write the failing input of ``outcome`` to ``path`` (.npz, every array in full precision, no pickle)
    with ``meta`` (property, dtype, rtol, matrix_only, lr, and the command that replays it) as JSON; returns
    the path. :func:`load_case` reads it back."""
    import json
    import os

    flat = {"__meta__": np.array(json.dumps({**meta, "property": outcome.property}))}

    def put(key, v):
        if isinstance(v, dict):
            for k, a in v.items():
                put(f"{key}/{k}" if key else str(k), a)
        elif isinstance(v, (list, tuple)):
            flat[f"{key}/__len__"] = np.array(len(v))
            for i, a in enumerate(v):
                put(f"{key}/{i}", a)
        else:
            flat[key] = np.asarray(v)
    put("", outcome.case)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **flat)
    return path


def load_case(path: str) -> tuple[dict, dict]:
    """(case, meta) from a file :func:`save_case` wrote; pass ``replay=case`` to the property (or use
    ``refopt invariants ... --replay FILE``)."""
    import json

    with np.load(path, allow_pickle=False) as z:
        flat = {k: z[k] for k in z.files}
    meta = json.loads(str(flat.pop("__meta__")))

    def get(key):
        if f"{key}/__len__" in flat:
            return [get(f"{key}/{i}") for i in range(int(flat[f"{key}/__len__"]))]
        a = flat[key]
        if a.ndim == 0:
            return a.item()
        return a
    tops = {k.split("/")[0] for k in flat}
    return {k: get(k) for k in sorted(tops)}, meta


# --------------------------------------------------------------------------------------------------------
@dataclass
class InvariantsReport:
    """rows: (property, expected by theory, refopt's Outcome, the implementation's Outcome, verdict, why)."""

    impl: str
    rule: str
    rtol: float
    rows: list = field(default_factory=list)
    command: str | None = None   # the command line that made the report (for the replay lines)

    @property
    def failures(self) -> list:
        return [r for r in self.rows if r[4] == "FAIL"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0

    def outcomes(self) -> dict:
        """{property: 'holds' | 'fails' | 'n/a'} of the implementation."""
        return {r[0]: _word(r[3]) for r in self.rows}

    def table(self) -> str:
        head = ["property", "theory (rule)", "refopt rule", "your code", "verdict"]
        notes: list = []

        def cell(o: Outcome) -> str:   # a long "n/a (why)" becomes "n/a [k]", the why below the table
            d = o.describe()
            if o.holds is None and o.note and len(d) > 40:
                notes.append(o.note)
                return f"n/a [{len(notes)}]"
            return d

        rows = [[r[0], {True: "holds", False: "fails", None: "-"}[r[1]], cell(r[2]), cell(r[3]), r[4]]
                for r in self.rows]
        w = [max([len(h)] + [len(x[i]) for x in rows]) for i, h in enumerate(head)]
        out = [f"implementation: {self.impl}", f"refopt rule:    {self.rule}", f"tolerance:      {self.rtol:g} "
               f"(relative)", "", "  ".join(h.ljust(x) for h, x in zip(head, w)), "  ".join("-" * x for x in w)]
        out += ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows] or ["no property was checked"]
        out += [f"[{k}] {n}" for k, n in enumerate(notes, 1)]
        out += [f"FAIL {r[0]}: {r[5]}" for r in self.rows if r[4] == "FAIL" and r[5]]
        failing = [r for r in self.rows if r[4] == "FAIL" and r[3].counterexample]
        if failing:
            out += ["", "counterexamples of the failures (your code; shrunk by hypothesis):"]
            for r in failing:
                out.append(f"  {r[0]}: {r[3].counterexample}")
                if r[3].replay_file:
                    out.append(f"    saved to {r[3].replay_file}; replay: {self.replay_command(r[3].replay_file)}")
        return "\n".join(out)

    def replay_command(self, path: str) -> str:
        """The command that replays a saved counterexample (``refopt invariants ... --replay PATH``)."""
        return (self.command or "refopt invariants --impl IMPL --rule RULE") + f" --replay {path}"

    def check(self) -> "InvariantsReport":
        """Raise AssertionError naming every FAIL row (its error and counterexample): the raising form for
        pytest. Returns self when no property fails."""
        if self.failures:
            raise AssertionError("; ".join(f"{r[0]}: {r[3].describe()}, {r[5]} (counterexample {r[3].counterexample})"
                                           for r in self.failures))
        return self


def _word(o: Outcome) -> str:
    return {True: "holds", False: "fails", None: "n/a"}[o.holds]


#: an expected failure (the rule fails too) is a FAIL when yours is this many times the rule's own error
#: on your counterexample
WORSE = 10.0


def _verdict(ref: Outcome, mine: Outcome, ref_on_mine: Outcome | None = None) -> tuple[str, str]:
    """(verdict, why). A failure the rule shares is 'expected' only when the rule's own error on the same
    input (``ref_on_mine``: the rule replayed on your counterexample) is at least 1/:data:`WORSE` of yours."""
    if mine.holds is None and mine.by_design:
        return "n/a", ""
    if ref.holds is True and mine.holds is not True:
        return "FAIL", "the refopt rule satisfies it"
    if ref.holds is True:
        return "ok", ""
    if ref.holds is False and mine.holds is False:
        if ref_on_mine is not None and ref_on_mine.holds is not None:
            own = ref_on_mine.err
            if ref_on_mine.holds or not mine.err <= WORSE * own:
                return "FAIL", (f"err {mine.err:.3g} on your counterexample, {mine.err / max(own, 1e-300):.3g}x the "
                                f"rule's own {own:.3g} there (an expected failure must stay within {WORSE:g}x)")
        return "expected", ""
    if ref.holds is False and mine.holds is True:
        return "ok (stronger)", ""
    return "-", ""


def _matrix_only(rule) -> bool:
    import refopt
    try:
        refopt.init(rule, [np.ones(3)])
    except ValueError:
        return True
    return False


def invariants(impl, rule, kwargs: dict | None = None, framework: str | None = None, layout: str | None = None,
               properties=None, max_examples: int = 8, rtol: float | None = None, dtype: str = "float64",
               name: str | None = None, save_dir: str | None = None, command: str | None = None) -> InvariantsReport:
    """Run the properties on ``impl`` and on the refopt ``rule`` (a rule or an expression) side by side.

    ``rtol`` defaults to 1e-5 (float64) / 1e-3 (float32), and to 0.06 for a Newton-Schulz (Muon) rule
    checked against a torch implementation (torch.optim.Muon's bfloat16 Newton-Schulz: the documented
    tolerance of :data:`refopt.crosscheck.presets.MUON_TORCH_BF16`). Returns an :class:`InvariantsReport`;
    its exit code is 1 when a property the refopt rule satisfies fails for the implementation, or when a
    failure the rule shares is more than :data:`WORSE` times the rule's own error on the same input.
    ``save_dir``: where the input of each FAIL is saved in full (``<property>.npz``, :func:`save_case`;
    None: not saved); ``command``: the command line shown with the replay lines.
    ``properties``: None (all of :data:`PROPERTIES`), a non-empty sequence of their names, or one name as
    a str. Raises ValueError (before running anything) for an empty selection, an unknown property name
    (the message lists the known ones) or a bad dtype; UserCodeError when the implementation raises
    outside an input it refuses."""
    from refopt.crosscheck.expr import parse_rule, to_expr
    from refopt.crosscheck.plugin import DTYPES, bf16_newton_schulz, dtype_name, select_names, tolerance_tiers
    from refopt.testing.expected import expected

    if properties is not None:
        properties = select_names("properties", properties, [p.name for p in PROPERTIES], "property")
    if isinstance(rule, str):
        rule = parse_rule(rule)
    dtype = dtype_name(dtype)
    dt = DTYPES[dtype]
    adapter = impl if isinstance(impl, Adapter) else make_adapter(impl, kwargs, framework, layout, name)
    if rule.inputs and not getattr(adapter, "inputs", ()):
        adapter.inputs = tuple(rule.inputs)   # the implementation gets what the rule takes (value=), in its convention
    if rtol is None:
        rtol = 1e-5 if dt is np.float64 else 1e-3
        if any("bfloat16" in n for n, _ in tolerance_tiers(rule, adapter.framework, bf16_newton_schulz(adapter))):
            rtol = 0.06
    ref = RuleAdapter(rule)
    mo = _matrix_only(rule)
    lr = getattr(rule, "lr", None)
    exp = expected(rule)
    try:
        rule_text = to_expr(rule)
    except ValueError:
        rule_text = repr(rule)
    report = InvariantsReport(adapter.name, rule_text, rtol, command=command)
    for prop in PROPERTIES:
        if properties is not None and prop.name not in properties:
            continue
        kw = dict(max_examples=max_examples, rtol=rtol, matrix_only=mo, lr=lr, dtype=dt)
        r = prop.run(ref, **kw)
        if r.holds is None:
            m = Outcome(prop.name, None, note="not run: n/a for the rule")
        else:
            m = prop.run(adapter, **kw)
        again = prop.run(ref, replay=m.case, **kw) if r.holds is False and m.holds is False and m.case else None
        verdict, why = _verdict(r, m, again)
        if verdict == "FAIL" and m.case is not None and save_dir is not None:
            import os
            m.replay_file = save_case(os.path.join(save_dir, f"{prop.name}.npz"), m, dict(
                dtype=dtype, rtol=rtol, matrix_only=mo, lr=lr, impl=report.impl, rule=rule_text))
        report.rows.append((prop.name, exp.get(prop.name), r, m, verdict, why))
    return report


def replay(path: str, impl, rule=None, kwargs: dict | None = None, framework: str | None = None,
           layout: str | None = None, name: str | None = None) -> tuple[Outcome, Outcome]:
    """Check the counterexample saved at ``path`` (:func:`save_case`, written by :func:`invariants` with
    ``save_dir``) again: (your implementation's Outcome, the refopt rule's) on exactly that input, with the
    saved tolerance. ``rule`` defaults to the saved rule expression."""
    from refopt.crosscheck.expr import parse_rule

    case, meta = load_case(path)
    prop = {p.name: p for p in PROPERTIES}[meta["property"]]
    rule = parse_rule(meta["rule"] if rule is None else rule) if isinstance(rule, str) or rule is None else rule
    adapter = impl if isinstance(impl, Adapter) else make_adapter(impl, kwargs, framework, layout, name)
    if rule.inputs and not getattr(adapter, "inputs", ()):
        adapter.inputs = tuple(rule.inputs)
    kw = dict(rtol=meta["rtol"], matrix_only=meta["matrix_only"], lr=meta["lr"], dtype=np.dtype(meta["dtype"]).type)
    return prop.run(adapter, replay=case, **kw), prop.run(RuleAdapter(rule), replay=case, **kw)


def check(prop: str, impl, kwargs: dict | None = None, framework: str | None = None, layout: str | None = None,
          **options) -> Outcome:
    """Run the property named ``prop`` on ``impl`` (an Adapter, or anything :func:`make_adapter` takes) and
    raise AssertionError with its description and counterexample when it fails: the raising form for
    pytest (``options``: the property's max_examples, rtol, dtype, matrix_only, lr). Returns the Outcome."""
    props = {p.name: p for p in PROPERTIES}
    if prop not in props:
        raise ValueError(f"unknown property {prop!r}; choose from {list(props)}")
    adapter = impl if isinstance(impl, Adapter) else make_adapter(impl, kwargs, framework, layout)
    return props[prop].run(adapter, **options).check()


def _asserting(p: Property):
    def assert_property(impl, kwargs: dict | None = None, framework: str | None = None, layout: str | None = None,
                        **options) -> Outcome:
        return check(p.name, impl, kwargs, framework, layout, **options)
    assert_property.__name__ = assert_property.__qualname__ = f"assert_{p.name}"
    assert_property.__doc__ = (f"{p.equation} ({p.source}): :func:`check` of ``{p.name}``; raises AssertionError "
                               f"with the description and the counterexample when it fails.")
    return assert_property


for _p in PROPERTIES:   # assert_gradient_scale_invariance, assert_purity, ...: one per property
    globals()[f"assert_{_p.name}"] = _asserting(_p)
__all__ += ["check", "replay", "save_case", "load_case"] + [f"assert_{_p.name}" for _p in PROPERTIES]


def invariants_table(*args, **kwargs) -> str:
    """:func:`invariants` (same arguments) as the printed table."""
    return invariants(*args, **kwargs).table()

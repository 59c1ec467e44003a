r"""Canonical problems: initial params and a gradient sequence, from fixed seeds.

Each problem is a flat list of named arrays (refopt's (fan_in, fan_out) layout) and a gradient function
``grad(leaves, t) -> Gradients`` (t = 1 for the first update): a list of arrays, one per leaf, whose
``inputs`` hold the step's inputs beyond the gradients (:data:`refopt.core.INPUTS`) on the problems that have a
loss (quadratic, mlp, gpt): ``value``, the loss at ``leaves`` (in float64), and ``closure``, the same step's loss
and gradients at other leaves (``closure(leaves) -> (value, Gradients)``: the same batch, evaluated afresh); the
stream has no loss (``Problem.inputs`` is empty), so a rule that needs one is skipped there with the reason.
``matrix_only=True`` keeps the 2-D leaves only (for Muon); the other leaves of the model stay frozen at their initial values.

* ``stream``: a seeded random gradient stream, independent of the params: g_t ~ N(0, s^2) per leaf with
  scales w: 1, v: 0.1, b: 1 and ``tiny``: 1e-8 (gradients of the size of Adam's eps, where the eps
  placement shows -- PITFALLS B02; for Muon below torch's 1e-7 norm clamp). Shapes w (6, 12), v (12, 6)
  (both orientations, so a transposed layout or a flipped shape scale shows), b (12,), tiny (4, 5).
* ``quadratic``: f(x) = 1/2 sum h (x - c)^2 with h log-uniform in [0.1, 10]: g = h (x - c).
* ``mlp``: ``refopt.models.mlp`` 64-16-10 (relu) on batches of 32 of scikit-learn's digits; real gradients by
  ``refopt.value_and_grad`` (batches drawn from ``default_rng(seed)``).
* ``gpt``: ``refopt.models.gpt`` with V=16, T=8, one layer, two heads, C=16 (gelu FFN, tied head) on random
  token batches (2, 8) from ``default_rng(seed)``.

Real gradients depend on the params. The cross-check is **open loop**: the gradients are computed along
refopt's trajectory and the same recorded sequence is fed to the peer (and stored in golden files). So a
difference can only come from the optimizers, never from two autograds or two models, and the peer
does not need the model in its own framework. (A closed loop would feed each side its own gradients and
amplify tiny differences through the model's curvature.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

PROBLEMS = ("stream", "quadratic", "mlp", "gpt")
#: the inputs beyond the gradients that each problem's steps carry: the loss value where it has a loss
INPUTS = {"stream": (), "quadratic": ("value", "closure"), "mlp": ("value", "closure"), "gpt": ("value", "closure")}


def lacks(rule, problem: str) -> str:
    """Why ``problem`` cannot run ``rule`` (an input the rule takes that its steps do not carry), '' if it can."""
    missing = [k for k in rule.inputs if k not in INPUTS[problem]]
    if not missing:
        return ""
    return (f"{type(rule).__name__} needs {', '.join(missing)}, which the {problem} problem does not give (it "
            f"has no loss)")


def closed_loop(rule) -> bool:
    """True for a rule that evaluates the loss at points of its own (``closure``): the cross-check then runs each
    side on its own trajectory, every evaluation on refopt's model, as the gradients recorded along refopt's run
    do not hold at the peer's points; and on one batch (``make_problem(..., full_batch=True)``): L-BFGS's pairs
    (s, y) measure curvature only when g and g_prev come from the same loss (with a new batch each step its
    two-loop recursion amplifies a difference of one ulp between two implementations 10-fold every two steps on
    the MLP)."""
    return "closure" in getattr(rule, "inputs", ())


def closure_at(grad: Callable, t: int) -> Callable:
    """Step ``t``'s closure of a gradient function ``grad(leaves, t) -> Gradients``: ``leaves -> (value,
    gradients)`` at any leaves, on step t's data."""
    def closure(leaves):
        g = grad(list(leaves), t)
        return g.inputs["value"], g

    return closure


class Gradients(list):
    """One step's gradients, a list of arrays (one per leaf), and ``inputs``, the step's inputs beyond them
    ({'value': the loss as a Python float, 'closure': the step's loss at other leaves} where the problem has a
    loss, else {})."""

    def __init__(self, arrays=(), inputs: dict | None = None):
        super().__init__(arrays)
        self.inputs = dict(inputs or {})


def step_inputs(g, names, problem: str = "") -> dict:
    """{name: value} of the inputs ``names`` that one step's gradients ``g`` (a :class:`Gradients`) carry;
    ``ValueError`` naming the problem when one is missing (the stream has no loss)."""
    have = getattr(g, "inputs", {})
    missing = [k for k in names if k not in have]
    if missing:
        where = f"the {problem} problem" if problem else "this gradient sequence"
        raise ValueError(f"{where} gives no {', '.join(missing)} (a rule that needs the loss runs on the "
                         f"problems with one: {', '.join(p for p in PROBLEMS if INPUTS[p])})")
    return {k: have[k] for k in names}


@dataclass
class Problem:
    name: str
    paths: list[str]
    leaves: list[np.ndarray]
    grad: Callable[[list[np.ndarray], int], Gradients]
    description: str
    #: the inputs beyond the gradients that every step's Gradients carry (('value',) where there is a loss)
    inputs: tuple = field(default=())


def _stream(dtype, seed, matrix_only, full_batch):
    rng = np.random.default_rng(seed)
    spec = [("w", (6, 12), 1.0), ("v", (12, 6), 0.1), ("b", (12,), 1.0), ("tiny", (4, 5), 1e-8)]
    if matrix_only:
        spec = [s for s in spec if len(s[1]) == 2]
    leaves = [rng.standard_normal(shape).astype(dtype) for _, shape, _ in spec]
    grng = np.random.default_rng(seed + 1)
    cache: list[list[np.ndarray]] = []

    def grad(_leaves, t):
        while len(cache) < t:
            cache.append([(s * grng.standard_normal(shape)).astype(dtype) for _, shape, s in spec])
        return Gradients([g.copy() for g in cache[t - 1]])

    return [n for n, _, _ in spec], leaves, grad, "seeded N(0, s^2) gradient stream, s = (1, 0.1, 1, 1e-8)"


def _quadratic(dtype, seed, matrix_only, full_batch):
    rng = np.random.default_rng(seed)
    spec = [("w", (5, 8)), ("b", (8,))]
    if matrix_only:
        spec = spec[:1]
    leaves = [rng.standard_normal(s).astype(dtype) for _, s in spec]
    h = [np.exp(rng.uniform(np.log(0.1), np.log(10.0), s)).astype(dtype) for _, s in spec]
    c = [rng.standard_normal(s).astype(dtype) for _, s in spec]

    def grad(xs, t):
        f = sum(0.5 * float(np.sum(np.asarray(hi, np.float64) * (np.asarray(x, np.float64) - ci) ** 2))
                for x, hi, ci in zip(xs, h, c))
        return Gradients([hi * (x - ci) for x, hi, ci in zip(xs, h, c)], {"value": f, "closure": closure_at(grad, t)})

    return [n for n, _ in spec], leaves, grad, "f = 1/2 sum h (x - c)^2, h log-uniform [0.1, 10]"


def _split(tree, matrix_only):
    from refopt import tree as T

    leaves, paths, td = T.flatten(tree)
    opt = [i for i, a in enumerate(leaves) if a.ndim == 2 or not matrix_only]
    return leaves, paths, td, opt


def _model_problem(loss, params, batch, matrix_only):
    import refopt
    from refopt import tree as T

    leaves, paths, td, opt = _split(params, matrix_only)
    vg = refopt.value_and_grad(loss)
    frozen = [a.copy() for a in leaves]

    def grad(xs, t):
        full = list(frozen)
        for i, x in zip(opt, xs):
            full[i] = x
        f, g = vg(T.unflatten(td, full), *batch(t))
        gl, _, _ = T.flatten(g)
        return Gradients([np.array(gl[i], dtype=leaves[i].dtype) for i in opt],
                         {"value": float(f), "closure": closure_at(grad, t)})

    return [paths[i] for i in opt], [leaves[i].copy() for i in opt], grad


def _mlp(dtype, seed, matrix_only, full_batch):
    from refopt.models import mlp
    from refopt.models.data import load_digits

    data = load_digits(dtype=dtype)
    params = mlp.init(seed, [64, 16, 10], dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    idx: list[np.ndarray] = []

    def batch(t):
        t = 1 if full_batch else t
        while len(idx) < t:
            idx.append(rng.choice(len(data.y_train), 32, replace=False))
        i = idx[t - 1]
        return data.x_train[i], data.y_train[i]

    paths, leaves, grad = _model_problem(mlp.loss, params, batch, matrix_only)
    return paths, leaves, grad, "refopt.models.mlp 64-16-10 relu, digits batches of 32"


def _gpt(dtype, seed, matrix_only, full_batch):
    from refopt.models import gpt

    cfg = gpt.GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, ffn="gelu")
    params = gpt.init(cfg, seed, dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    toks: list[np.ndarray] = []

    def batch(t):
        t = 1 if full_batch else t
        while len(toks) < t:
            toks.append(rng.integers(0, cfg.vocab_size, (2, cfg.block_size + 1)))
        b = toks[t - 1]
        return b[:, :-1], b[:, 1:], cfg

    paths, leaves, grad = _model_problem(gpt.loss, params, batch, matrix_only)
    return paths, leaves, grad, "refopt.models.gpt V=16 T=8 L=1 H=2 C=16 gelu, random tokens (2, 8)"


_MAKERS = {"stream": _stream, "quadratic": _quadratic, "mlp": _mlp, "gpt": _gpt}


def make_problem(name: str, dtype=np.float64, seed: int = 0, matrix_only: bool = False,
                 full_batch: bool = False) -> Problem:
    """The problem ``name`` (one of :data:`PROBLEMS`) in ``dtype`` from ``seed``. ``full_batch``: the MLP and the
    GPT see the first step's batch at every step (a deterministic loss, as L-BFGS assumes: the cross-check runs
    the closure rules so, :func:`closed_loop`); the other problems do not change.

    Raises: ValueError for an unknown name or dtype."""
    if name not in _MAKERS:
        raise ValueError(f"unknown problem {name!r}; choose from {list(PROBLEMS)}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    paths, leaves, grad, desc = _MAKERS[name](dtype.type, seed, matrix_only, bool(full_batch))
    if full_batch and name in ("mlp", "gpt"):
        desc += ", the first batch at every step"
    return Problem(name, paths, leaves, grad, desc, INPUTS[name])

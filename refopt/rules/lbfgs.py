r"""L-BFGS (Liu & Nocedal 1989) with the two-loop recursion and, optionally, the strong Wolfe line search
(Nocedal & Wright, *Numerical Optimization*, 2nd ed. 2006: Algorithm 7.4; Algorithms 3.5 and 3.6 with cubic
interpolation, eq. (3.59)), as torch.optim.LBFGS runs them: one step is up to ``max_iter`` inner iterations,
each of which may evaluate the loss and its gradients at new points through the step's ``closure``
(:data:`refopt.core.INPUTS`).

The algorithm works on the whole tree as one flat vector x (the leaves raveled and concatenated in the tree's
order), in the params' dtype; its history (the last ``history_size`` pairs s_i = x_{i+1} - x_i, y_i = g_{i+1} -
g_i with <y_i, s_i> > 1e-10) lives in ``OptState.glob`` (:class:`LBFGSGlobal`), checkpointed like any state.

Notation: g the gradient at x, <a, b> the dot product over the whole vector, |a|_inf = max |a_i|, |a|_1 = sum
|a_i|, f the loss."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import Rule
from refopt.rules import _checks

_LINE_SEARCHES = (None, "strong_wolfe")
#: a pair (s, y) enters the history only when <y, s> exceeds this (the curvature condition, with a margin)
CURVATURE_MIN = 1e-10


class NoState(NamedTuple):
    """L-BFGS keeps no per-array state (its history is rule-wide, :class:`LBFGSGlobal`)."""


class LBFGSGlobal(NamedTuple):
    """L-BFGS's rule-wide state. n is the number of params entries, m <= history_size the pairs kept; the arrays
    are in the params' dtype (empty, float64, before the first inner iteration).

    n_iter: inner iterations so far (0: the next one starts from d = -g); func_evals: loss evaluations so far;
    d (n,): the last direction; t: the last step length; s (m, n), y (m, n): the pairs, oldest first; rho (m,):
    1 / <y_i, s_i>; h_diag: the initial inverse Hessian gamma I, gamma = <s, y> / <y, y> of the newest pair (1
    before any); prev_grad (n,): the gradient where the last inner iteration started; prev_value: the loss
    there."""

    n_iter: int
    func_evals: int
    d: np.ndarray
    t: float
    s: np.ndarray
    y: np.ndarray
    rho: np.ndarray
    h_diag: float
    prev_grad: np.ndarray
    prev_value: float


class LBFGSContext(NamedTuple):
    lr_t: float
    x: dict           # path -> the leaf's new value (set by reduce_inputs)


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def two_loop(g: np.ndarray, s: list, y: list, rho: list, h_diag: float) -> np.ndarray:
    r"""The L-BFGS direction d = -H g (Nocedal & Wright, Algorithm 7.4) from the pairs (oldest first) and
    H_0 = h_diag I: q = -g; for i newest to oldest, a_i = rho_i <s_i, q>, q -= a_i y_i; r = h_diag q; for i
    oldest to newest, b_i = rho_i <y_i, r>, r += (a_i - b_i) s_i; d = r."""
    dt = g.dtype.type
    q = -g
    a = [0.0] * len(s)
    for i in range(len(s) - 1, -1, -1):
        a[i] = _dot(s[i], q) * rho[i]
        q = q - dt(a[i]) * y[i]
    r = q * dt(h_diag)
    for i in range(len(s)):
        b = _dot(y[i], r) * rho[i]
        r = r + dt(a[i] - b) * s[i]
    return r


def cubic_min(t1: float, f1: float, d1: float, t2: float, f2: float, d2: float, lo: float, hi: float) -> float:
    r"""The minimiser of the cubic through (t1, f1) and (t2, f2) with slopes d1, d2 (Nocedal & Wright eq. (3.59)),
    clipped to [lo, hi]; the midpoint (lo + hi) / 2 when the cubic has no real minimiser:
    e1 = d1 + d2 - 3 (f1 - f2) / (t1 - t2), e2 = sqrt(e1^2 - d1 d2),
    t = t2 - (t2 - t1) (d2 + e2 - e1) / (d2 - d1 + 2 e2) (for t1 <= t2; the points swapped otherwise)."""
    e1 = d1 + d2 - 3 * (f1 - f2) / (t1 - t2)
    sq = e1 * e1 - d1 * d2
    if sq < 0:
        return (lo + hi) / 2.0
    e2 = math.sqrt(sq)
    if t1 <= t2:
        t = t2 - (t2 - t1) * ((d2 + e2 - e1) / (d2 - d1 + 2 * e2))
    else:
        t = t1 - (t1 - t2) * ((d1 + e2 - e1) / (d1 - d2 + 2 * e2))
    return min(max(t, lo), hi)


def strong_wolfe(phi: Callable, t: float, f: float, g: np.ndarray, gtd: float, d: np.ndarray, c1: float,
                 c2: float, tolerance_change: float, max_ls: int):
    r"""A step length t along d satisfying the strong Wolfe conditions f(t) <= f + c1 t <g, d> and |<g(t), d>| <=
    c2 |<g, d>| (Nocedal & Wright, Algorithms 3.5 and 3.6), with torch.optim.LBFGS's choices. ``phi(t) -> (f(t),
    g(t))`` evaluates the loss and gradient at x + t d; ``gtd`` = <g, d> < 0; ``t`` the first trial.

    Bracketing: a trial t brackets a step (with the previous trial, 0 at first) when f(t) breaks the sufficient
    decrease condition or, from the third trial on, is not below the previous trial's loss, or when its slope
    <g(t), d> is >= 0; it is accepted when the curvature condition holds; otherwise the next trial is the cubic
    minimiser through the last two trials (:func:`cubic_min`) clipped to [t + 0.01 (t - t_prev), 10 t]. Zoom:
    the next trial is the cubic minimiser in the bracket; when it falls within 0.1 of the bracket's width of an
    end twice running, or on or beyond an end, it is moved to that distance from the nearer end. A trial that
    breaks sufficient decrease or is not below the low end (the end of lower loss) replaces the high end;
    otherwise it is accepted if the curvature condition holds, the low end becomes the high end if the slope
    points away from the high end (<g(t), d> (t_high - t_low) >= 0), and it becomes the low end. The zoom stops
    when the bracket's width times |d|_inf is below ``tolerance_change`` or after ``max_ls`` evaluations (the
    first counted; when bracketing used them all, the bracket is [0, t]). The step taken is the low end.

    Returns (f, g, t, evaluations) at the step length taken."""
    d_inf = float(np.max(np.abs(d)))
    f_new, g_new = phi(t)
    new = (t, f_new, g_new, _dot(g_new, d))
    prev = (0.0, f, g, gtd)
    evals, it, done, bracket = 1, 0, False, None
    while it < max_ls:
        t, f_new, _, gtd_new = new
        decrease = not (f_new > f + c1 * t * gtd or (it > 1 and f_new >= prev[1]))
        if decrease and abs(gtd_new) <= -c2 * gtd:
            bracket, done = [new], True
            break
        if not decrease or gtd_new >= 0:
            bracket = [prev, new]
            break
        t_next = cubic_min(prev[0], prev[1], prev[3], t, f_new, gtd_new, t + 0.01 * (t - prev[0]), t * 10)
        prev = new
        f_new, g_new = phi(t_next)
        new = (t_next, f_new, g_new, _dot(g_new, d))
        evals, it = evals + 1, it + 1
    if bracket is None:
        bracket = [(0.0, f, g, gtd), new]
    lo, hi = (0, 1) if bracket[0][1] <= bracket[-1][1] else (1, 0)
    stuck = False
    while not done and it < max_ls:
        (ta, fa, _, da), (tb, fb, _, db) = bracket
        if abs(tb - ta) * d_inf < tolerance_change:
            break
        bot, top = min(ta, tb), max(ta, tb)
        t = cubic_min(ta, fa, da, tb, fb, db, bot, top)
        margin = 0.1 * (top - bot)
        if min(top - t, t - bot) < margin:
            if stuck or t >= top or t <= bot:
                t = top - margin if abs(t - top) < abs(t - bot) else bot + margin
                stuck = False
            else:
                stuck = True
        else:
            stuck = False
        f_new, g_new = phi(t)
        new = (t, f_new, g_new, _dot(g_new, d))
        evals, it = evals + 1, it + 1
        if f_new > f + c1 * t * gtd or f_new >= bracket[lo][1]:
            bracket[hi] = new
            lo, hi = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(new[3]) <= -c2 * gtd:
                done = True
            elif new[3] * (bracket[hi][0] - bracket[lo][0]) >= 0:
                bracket[hi] = bracket[lo]
            bracket[lo] = new
    t, f_new, g_new, _ = bracket[lo]
    return f_new, g_new, t, evals


@dataclass(frozen=True)
class LBFGS(Rule):
    r"""L-BFGS with torch.optim.LBFGS's inner loop. One step from x with loss f and gradient g (the step's
    ``value`` and gradients; the ``closure`` gives them at other points):

    1. if |g|_inf <= tolerance_grad: no move (one evaluation is counted);
    2. up to ``max_iter`` inner iterations k (n counts them over all steps):

       - the direction: d = -g on the first iteration ever (the history cleared, h_diag = 1); else the pair
         s = t d (the last move), y = g - g_prev joins the history if <y, s> > 1e-10 (the oldest dropped
         beyond ``history_size``; h_diag = <y, s> / <y, y>), and d = -H g by the two-loop recursion;
       - the step length: t = lr min(1, 1 / |g|_1) on the first iteration ever, else t = lr; with
         ``line_search='strong_wolfe'`` t is then searched along d (:func:`strong_wolfe`, c1, c2, at most
         max_eval - (evaluations this step) evaluations);
       - stop before moving if <g, d> > -tolerance_change; else x = x + t d and, without a line search, f and g
         are evaluated at the new x (except on the last iteration);
       - stop after ``max_iter`` iterations, ``max_eval`` evaluations this step, |g|_inf <= tolerance_grad,
         |t d|_inf <= tolerance_change or |f - f_prev| < tolerance_change.

    Args:
      lr: >= 0, the step length (torch's ``lr``; 1.0).
      max_iter: int >= 1, inner iterations per step (20).
      max_eval: int >= 1 or None, loss evaluations per step (None: max_iter * 5 // 4, torch's default).
      tolerance_grad: >= 0 (1e-7). tolerance_change: >= 0 (1e-9).
      history_size: int >= 1, the pairs kept (100).
      line_search: None | 'strong_wolfe' (torch's ``line_search_fn``; None).
      c1, c2: the Wolfe constants, 0 < c1 < c2 < 1 (1e-4, 0.9; torch's fixed values).

    Inputs: ``value`` (the loss at x) and ``closure`` (params -> (loss, grads) at other params, the same data):
    ``refopt.update(rule, state, params, grads, value=f, closure=fn)``.
    State: :class:`LBFGSGlobal` in ``OptState.glob``; none per array. Shapes/dtypes: any float32 / float64 arrays,
    all of one dtype (the flat vector's); the dot products in that dtype.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for params of mixed dtypes or a global state
        that does not fit the params (checked before anything is written).
      TypeError: at a step, when ``value`` or ``closure`` is missing; what the closure returns is checked as
        :class:`refopt.core.Closure` says.
    """

    lr: float = 1.0
    max_iter: int = 20
    max_eval: int | None = None
    tolerance_grad: float = 1e-7
    tolerance_change: float = 1e-9
    history_size: int = 100
    line_search: str | None = None
    c1: float = 1e-4
    c2: float = 0.9

    inputs = ("value", "closure")

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.positive_int("max_iter", self.max_iter)
        if self.max_eval is not None:
            _checks.positive_int("max_eval", self.max_eval)
        _checks.nonnegative("tolerance_grad", self.tolerance_grad)
        _checks.nonnegative("tolerance_change", self.tolerance_change)
        _checks.positive_int("history_size", self.history_size)
        _checks.one_of("line_search", self.line_search, _LINE_SEARCHES)
        _checks.positive("c1", self.c1)
        if not (float(self.c1) < float(self.c2) < 1.0):
            raise ValueError(f"the Wolfe constants need 0 < c1 < c2 < 1, got c1={self.c1!r}, c2={self.c2!r}")

    @property
    def evals_per_step(self) -> int:
        """max_eval, or torch's default max_iter * 5 // 4."""
        return self.max_iter * 5 // 4 if self.max_eval is None else self.max_eval

    def init_leaf(self, x, path):
        return NoState()

    def init_global(self):
        z1, z2 = np.zeros(0), np.zeros((0, 0))
        return LBFGSGlobal(0, 0, z1, 0.0, z2, z2.copy(), z1.copy(), 1.0, z1.copy(), 0.0)

    def context(self, t, glob):
        return LBFGSContext(float(self.lr), {}), glob

    def _check_glob(self, glob, n: int, dtype) -> None:
        name = type(self).__name__
        if not isinstance(glob, LBFGSGlobal):
            raise ValueError(f"{name}: the global state must be an LBFGSGlobal made by refopt.init, got "
                             f"{type(glob).__name__}")
        if glob.n_iter == 0:
            return
        m = len(glob.rho)
        want = {"d": (n,), "prev_grad": (n,), "s": (m, n), "y": (m, n), "rho": (m,)}
        for k, shape in want.items():
            a = getattr(glob, k)
            if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype:
                got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"{name}: the global state's {k} is {got}, expected {np.dtype(dtype)} {shape} for "
                                 f"these params ({n} entries; was the state made for other params?)")
        if m > self.history_size:
            raise ValueError(f"{name}: the global state holds {m} pairs, more than history_size={self.history_size}")

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        name = type(self).__name__
        dtypes = {x.dtype for x in xs}
        if len(dtypes) > 1:
            raise ValueError(f"{name} steps all params as one vector, so they must share one dtype; got "
                             f"{sorted(str(d) for d in dtypes)}")
        dtype = xs[0].dtype if xs else np.dtype(np.float64)
        x, g = flat(xs, dtype), flat(gs, dtype)
        self._check_glob(glob, x.size, dtype)
        x, glob = self.minimize(x, g, inputs["value"], glob, flat_closure(inputs["closure"], xs))
        return ctx._replace(x=dict(zip(paths, split(x, xs)))), glob

    def minimize(self, x: np.ndarray, g: np.ndarray, f: float, glob: LBFGSGlobal, closure: Callable,
                 direction: Callable = two_loop, scaled_first_step: bool = True, scaled_h0: bool = True):
        """One step on the flat vector ``x`` (loss ``f``, gradient ``g``) with ``closure(x) -> (f, g)``: returns
        (the new x, the new global state). Writes neither ``x`` nor ``g``. ``direction(g, s, y, rho, h_diag) ->
        d`` (the two-loop recursion), ``scaled_first_step`` (t = lr min(1, 1 / |g|_1) on the first iteration) and
        ``scaled_h0`` (H_0 = <y, s> / <y, y> I) are the places an oracle or a diagnosis variant changes."""
        dt = x.dtype.type
        lr, tol_g, tol_c = float(self.lr), float(self.tolerance_grad), float(self.tolerance_change)
        max_eval = self.evals_per_step
        evals, func_evals = 1, glob.func_evals + 1
        if float(np.max(np.abs(g), initial=0.0)) <= tol_g:
            return x, glob._replace(func_evals=func_evals)
        n_iter, d, t, h_diag = glob.n_iter, glob.d, glob.t, glob.h_diag
        s, y, rho = list(glob.s), list(glob.y), [float(r) for r in glob.rho]
        prev_g, prev_f = glob.prev_grad, glob.prev_value
        for k in range(1, self.max_iter + 1):
            n_iter += 1
            if n_iter == 1:
                d, s, y, rho, h_diag = -g, [], [], [], 1.0
            else:
                yk, sk = g - prev_g, d * dt(t)
                ys = _dot(yk, sk)
                if ys > CURVATURE_MIN:
                    if len(s) == self.history_size:
                        s, y, rho = s[1:], y[1:], rho[1:]
                    s, y, rho = s + [sk], y + [yk], rho + [1.0 / ys]
                    h_diag = ys / _dot(yk, yk) if scaled_h0 else 1.0
                d = direction(g, s, y, rho, h_diag)
            prev_g, prev_f = g, f
            t = lr * min(1.0, 1.0 / float(np.sum(np.abs(g)))) if n_iter == 1 and scaled_first_step else lr
            gtd = _dot(g, d)
            if gtd > -tol_c:
                break
            if self.line_search == "strong_wolfe":
                f, g, t, used = strong_wolfe(lambda tt: closure(x + dt(tt) * d), t, f, g, gtd, d,
                                             float(self.c1), float(self.c2), tol_c, max_eval - evals)
                x = x + dt(t) * d
            else:
                x, used = x + dt(t) * d, 0
                if k != self.max_iter:
                    f, g = closure(x)
                    used = 1
            evals += used
            func_evals += used
            if k == self.max_iter or evals >= max_eval or float(np.max(np.abs(g))) <= tol_g:
                break
            if float(np.max(np.abs(d * dt(t)))) <= tol_c or abs(f - prev_f) < tol_c:
                break
        dtype = x.dtype
        stack = (lambda v: np.array(v, dtype=dtype).reshape(len(v), x.size))
        return x, LBFGSGlobal(n_iter, func_evals, d, float(t), stack(s), stack(y), np.array(rho, dtype=dtype),
                              float(h_diag), prev_g, float(prev_f))

    def update_leaf(self, ctx, s, x, g, path):
        x[...] = ctx.x[path]
        return x, s

    def lr_info(self, ctx):
        return {"all": float(ctx.lr_t)}


def flat(arrays: list, dtype) -> np.ndarray:
    """The arrays raveled and concatenated in order, as one vector of ``dtype``."""
    return np.concatenate([np.ravel(a) for a in arrays]).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def split(v: np.ndarray, like: list) -> list:
    """The vector ``v`` cut into views shaped like the arrays ``like`` (the inverse of :func:`flat`)."""
    out, k = [], 0
    for a in like:
        n = int(np.prod(np.shape(a)))
        out.append(v[k:k + n].reshape(np.shape(a)))
        k += n
    return out


def flat_closure(closure: Callable, xs: list) -> Callable:
    """``closure`` (leaves -> (f, grads), :class:`refopt.core.Closure`) on the flat vector of the leaves ``xs``."""

    def fg(v: np.ndarray):
        f, gs = closure(split(v, xs))
        return f, flat(gs, v.dtype)

    return fg

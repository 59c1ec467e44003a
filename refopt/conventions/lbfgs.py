"""L-BFGS (refopt/rules/lbfgs.py) to torch.optim.LBFGS, with and without ``line_search_fn='strong_wolfe'``: one
step is up to max_iter inner iterations on the params as one flat vector, each evaluating the loss through the
step's closure (torch's ``step(closure)``). torch's choices that the textbook leaves open: the first step length
lr min(1, 1 / |g|_1), a pair kept only when <y, s> > 1e-10, H_0 = <s, y> / <y, y> I from the newest pair, the
stopping tests (|g|_inf <= tolerance_grad, |t d|_inf <= tolerance_change, |f - f_prev| < tolerance_change,
max_eval counted per step) and the line search's trial steps and safeguards (its docstring).

The cross-check runs closed loop: each side evaluates refopt's model at its own points (the same data per step),
so a rounding difference in one evaluation moves the next trial points and is amplified by the curvature of the
loss: the tier is measured per problem (below)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import Conventions, Oracle, PeerMapping, Preset, Tol
from refopt.golden import GoldenCase
from refopt.rules.lbfgs import LBFGS, flat, flat_closure, split, two_loop


def compact_direction(g, s, y, rho, h_diag):
    r"""d = -H g with H in the compact form of Byrd, Nocedal & Schnabel (1994, "Representations of quasi-Newton
    matrices and their use in limited memory methods", Theorem 2.2, with H_0 = gamma I): with S = [s_0 .. s_{m-1}],
    Y likewise (n x m), R the upper triangle of S^T Y (R_ij = <s_i, y_j>, i <= j), D its diagonal, gamma = h_diag,

        H = gamma I + [S, gamma Y] [[R^-T (D + gamma Y^T Y) R^-1, -R^-T], [-R^-1, 0]] [S^T; gamma Y^T]

    computed with triangular solves (no inverse formed); ``rho`` is not read (it is 1 / D). The same H as the
    two-loop recursion in exact arithmetic, by another sequence of operations."""
    gamma = float(h_diag)
    if not s:
        return -gamma * g
    S, Y = np.array(s).T, np.array(y).T
    SY = S.T @ Y
    R, D = np.triu(SY), np.diag(np.diag(SY))
    a, b = S.T @ g, gamma * (Y.T @ g)
    p = np.linalg.solve(R, a)                                # R^-1 S^T g
    top = np.linalg.solve(R.T, (D + gamma * (Y.T @ Y)) @ p - b)
    bottom = -p
    return -(gamma * g + S @ top + gamma * (Y @ bottom))


class LBFGSOracle(Oracle):
    """L-BFGS on the rule's loop of inner iterations, line search (tested against the strong Wolfe conditions on
    its own) and stopping tests, with the diagnosis switches. Switches: ``compact`` True (the direction from the
    compact form of H, :func:`compact_direction`, in place of the two-loop recursion: the same H, other
    roundings, which L-BFGS amplifies to 2e-11 in 12 steps of a random stream); ``history`` (the pairs kept, in
    place of history_size); ``first_step`` False (t = lr on the first iteration, not lr min(1, 1/|g|_1)); ``h0`` False (H_0 = I, not
    <y, s> / <y, y> I); ``max_eval`` (in place of the rule's)."""

    def init_leaf(self, x, path):
        return {}

    def init(self, params):
        t, leaves = super().init(params)
        return (t, leaves, self.rule.init_global())

    def step(self, state, params, grads, value=None, closure=None):
        from dataclasses import replace

        from refopt import tree as T
        t, leaves, glob = state
        xs, gs, _, td = T.check_like(params, grads)
        sw = self.switches
        rule = replace(self.rule, history_size=sw.get("history", self.rule.history_size),
                       max_eval=sw.get("max_eval", self.rule.max_eval))
        dtype = np.result_type(*xs)
        x, g = flat(xs, dtype), flat(gs, dtype)

        def on_leaves(arrays):
            f, gl = closure(T.unflatten(td, arrays))
            return float(f), T.flatten(gl)[0]

        fg = flat_closure(on_leaves, xs)
        x, glob = rule.minimize(x, g, float(value), glob, fg,
                                direction=compact_direction if sw.get("compact") else two_loop,
                                scaled_first_step=sw.get("first_step", True), scaled_h0=sw.get("h0", True))
        return T.unflatten(td, [a.copy() for a in split(x, xs)]), (t + 1, leaves, glob)


def oracle(rule, name=None, **switches):
    return LBFGSOracle(rule, name, **switches)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "first step t = lr", "t = lr on the first iteration ever, not lr min(1, 1 / |g|_1)",
             first_step=False),
           v(rule, "H_0 = I", "the two-loop recursion from H_0 = I, not <y, s> / <y, y> I of the newest pair", h0=False)]
    if rule.max_eval is None:
        out.append(v(rule, "max_eval = max_iter", "at most max_iter evaluations a step, not torch's default "
                     "max_iter * 5 // 4", max_eval=rule.max_iter))
    return out


def facts(rule, of):
    """Scaling the loss by c scales g and y, H by 1/c and leaves d = -H g, but the first step length lr min(1,
    1/|g|_1) and the stopping tests on |g|_inf and |f - f_prev| do not scale, and |g|_inf, |g|_1 are not rotation
    invariant: only permutations of the entries (dot products, max and sum) are kept. None apply to the random
    gradient streams of the properties, which have no loss to evaluate."""
    return {"grad_scale": None, "step_scale_free": False, "orthogonal": None, "elementwise": True}

LOSS_PROBLEMS = ("quadratic", "mlp", "gpt")

#: closed loop on one batch, 50 steps, float64. Where L-BFGS converges (the MLP's and the GPT's loss reach ~1e-8)
#: a difference of one rounding in a dot product is amplified through the ill-conditioned pairs: refopt against
#: itself with its dot products summed in reverse order differs by up to 1.3e-8 (MLP), 5.5e-9 (GPT) and 2.9e-12
#: (quadratic) in params rel, and torch.optim.LBFGS differs from refopt by up to 8.2e-9, 1.9e-9 and 1.4e-12 (the
#: presets below; tests/test_lbfgs.py measures both). A wrong history size differs by 0.15 to 0.7.
CLOSED_LOOP = Tol({"params": 1e-10}, {"params": 1e-3}, by_problem={"mlp": {"params": 1e-7}, "gpt": {"params": 1e-7}})
#: float32: where the loss reaches ~1e-8 its comparisons in the line search and the stopping tests are rounding
#: noise (measured params rel 0.02 to 1.5 on the MLP and the GPT; 4e-5 on the quadratic), so float64 only
_F64 = dict(dtypes=("float64",), dtypes_why="in float32 the loss L-BFGS drives to ~1e-8 is rounding noise for its "
                                            "line search and stopping tests (params rel 0.02 to 1.5 measured)")

_LS = ("strong_wolfe",)


def _torch(lr, max_iter, max_eval, tolerance_grad, tolerance_change, history_size, line_search_fn):
    return LBFGS(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                 tolerance_change=tolerance_change, history_size=history_size, line_search=line_search_fn)


def _match(rule):
    if type(rule) is not LBFGS or rule.c1 != 1e-4 or rule.c2 != 0.9:
        return None
    return dict(lr=rule.lr, max_iter=rule.max_iter, max_eval=rule.max_eval, tolerance_grad=rule.tolerance_grad,
                tolerance_change=rule.tolerance_change, history_size=rule.history_size,
                line_search_fn=rule.line_search)


TORCH = PeerMapping("torch.optim.LBFGS", "torch", "LBFGS",
                    dict(lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                         history_size=100, line_search_fn=None), _torch, "lbfgs",
                    refuse={"line_search_fn": (lambda v: v is None or v in _LS,
                                               "torch.optim.LBFGS takes line_search_fn=None or 'strong_wolfe'")},
                    tol=CLOSED_LOOP, match=_match)

_ON_LOSS = dict(problems=LOSS_PROBLEMS, problems_why="L-BFGS evaluates the loss through the closure; the stream "
                                                     "has no loss", **_F64)
_CLOSURE = ("the closure evaluates refopt's model (one batch) at torch's params; torch calls it first, so "
            "each side starts its step from its own evaluation")

CONVENTIONS = Conventions(
    rules=(LBFGS,),
    final="x = x + t d per inner iteration, d from the two-loop recursion over the history of (s, y) pairs and "
          "t = lr or the line search's step length",
    per_step="the step lengths t and the number of inner iterations, from the loss and gradients the closure gives",
    mappings=(TORCH,),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only",
             "optax": "optax.lbfgs is not reproduced yet: its zoom line search (scale_by_zoom_linesearch) calls "
                      "value_fn inside JAX's while loop, and refopt's model, the closure of the cross-check, is "
                      "numpy"},
    presets=(
        TORCH.preset("torch.optim.LBFGS(lr,max_iter,history)", dict(lr=0.5, max_iter=5, history_size=4),
                     f"no line search: t = lr (lr min(1, 1/|g|_1) on the first iteration); {_CLOSURE}", **_ON_LOSS),
        TORCH.preset("torch.optim.LBFGS(strong_wolfe)", dict(line_search_fn="strong_wolfe", max_iter=4,
                                                              history_size=6),
                     f"the strong Wolfe line search (c1 = 1e-4, c2 = 0.9, at most max_eval evaluations a step); "
                     f"{_CLOSURE}", **_ON_LOSS),
        TORCH.preset("torch.optim.LBFGS(strong_wolfe,tolerances)",
                     dict(lr=0.8, line_search_fn="strong_wolfe", max_iter=10, max_eval=12, history_size=3,
                          tolerance_change=1e-6, tolerance_grad=1e-5),
                     "a short history (3 pairs, the oldest dropped), max_eval below torch's default and larger "
                     "tolerances: the stopping tests bind", **_ON_LOSS),
    ),
    wrong=(Preset("WRONG history: torch.optim.LBFGS(history_size=2) vs refopt LBFGS(history_size=6)", "torch",
                  "lbfgs", ("LBFGS", dict(line_search_fn="strong_wolfe", max_iter=4, history_size=2)),
                  lambda: LBFGS(line_search="strong_wolfe", max_iter=4, history_size=6),
                  "two pairs in place of six in the two-loop recursion", tol=CLOSED_LOOP,
                  expect_fail=True, **_ON_LOSS),),
    oracle=oracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("lbfgs", lambda: LBFGS(lr=0.5, max_iter=5, history_size=4),
                       "torch.optim.LBFGS(lr=0.5, max_iter=5, history_size=4), no line search", (),
                       problems=LOSS_PROBLEMS),
            GoldenCase("lbfgs_strong_wolfe", lambda: LBFGS(line_search="strong_wolfe", max_iter=4, history_size=6),
                       "torch.optim.LBFGS(line_search_fn='strong_wolfe', max_iter=4, history_size=6)", (),
                       problems=LOSS_PROBLEMS)),
    cli=(),
)

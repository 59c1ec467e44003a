"""DoG and DoWG (refopt/rules/dog.py) to optax.contrib.dog and optax.contrib.dowg: the step size is estimated from
the whole tree's distance from x_0 and gradient sums (one number each, kept in OptState.glob); optax's L2 decay
is added to g before the sums; eps inside (DoG) or after (DoWG) the square root. torch.optim ships neither."""
from __future__ import annotations

import math

import numpy as np

from refopt.conventions._spec import NO_MASK, CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, \
    scalar
from refopt.golden import GoldenCase
from refopt.rules.dog import DoG, DoWG, sum_sq
from refopt.rules.sgd import SGD


class DistanceOracle(Oracle):
    """DoG and DoWG from their docstrings; the oracle's state is (t, leaves, (r, G)). Switches: ``per_leaf``
    True estimates eta per array (each leaf its own distance and sums: the paper's layer-wise L-DoG);
    ``no_max`` True uses the current distance in place of the running maximum; ``unweighted`` True (DoWG)
    sums ||g||^2 without the weights rbar^2."""

    def init_leaf(self, x, path):
        return {"x0": np.array(x, copy=True)}

    def init(self, params):
        t, leaves = super().init(params)
        return (t, leaves, None)

    def _eta(self, t, glob, x0s, xs, gs):
        r, sw = self.rule, self.switches
        wd = r.weight_decay
        d2 = sum(sum_sq(x0.astype(np.float64) - x.astype(np.float64)) for x0, x in zip(x0s, xs))
        g2 = sum(sum_sq(g.astype(np.float64) + wd * x.astype(np.float64)) for x, g in zip(xs, gs))
        if isinstance(r, DoWG):
            r2_prev = (r.eps if r.init_sq_dist is None else r.init_sq_dist) if glob is None else glob[0]
            r2 = d2 if sw.get("no_max") and glob is not None else max(r2_prev, d2)
            v = (0.0 if glob is None else glob[1]) + (g2 if sw.get("unweighted") else r2 * g2)
            return r2 / (math.sqrt(v) + r.eps), (r2, v)
        if glob is None:
            x0n = math.sqrt(sum(sum_sq(x0) for x0 in x0s))
            r_prev = {"heuristic": r.init_value * (1 + x0n), "distance": r.init_value, "learning_rate": 0.0}[
                r.init_step]
        else:
            r_prev = glob[0]
        dist = math.sqrt(d2) if sw.get("no_max") and glob is not None else max(r_prev, math.sqrt(d2))
        G = (0.0 if glob is None else glob[1]) + g2
        if glob is None and r.init_step == "learning_rate":
            return r.init_value, (dist, G)
        return dist / math.sqrt(G + r.eps), (dist, G)

    def step(self, state, params, grads):
        from refopt import tree as T
        t, leaves, glob = state
        t += 1
        xs, gs, paths, td = T.check_like(params, grads)
        xs, gs = [np.asarray(x) for x in xs], [np.asarray(g) for g in gs]
        x0s = [s["x0"] for s in leaves]
        if self.switches.get("per_leaf"):
            globs = glob or [None] * len(xs)
            etas, new_glob = zip(*(self._eta(t, gl, [x0], [x], [g]) for gl, x0, x, g in zip(globs, x0s, xs, gs)))
            new_glob = list(new_glob)
        else:
            eta, new_glob = self._eta(t, glob, x0s, xs, gs)
            etas = [eta] * len(xs)
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        out = []
        for x, g, e in zip(xs, gs, etas):
            d = x.dtype
            a = g + scalar(self.rule.weight_decay, d) * x
            out.append(x - scalar(lr * e, d) * a)
        return T.unflatten(td, out), (t, [dict(s) for s in leaves], new_glob)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "per-array step size", "eta estimated per array (each leaf its own distance and gradient sum, "
             "layer-wise) in place of one eta over the whole tree", per_leaf=True),
           v(rule, "no running maximum", "the current distance ||x_t - x_0|| in place of its running maximum",
             no_max=True)]
    if isinstance(rule, DoWG):
        out.append(v(rule, "unweighted gradient sum", "v = sum ||g||^2 (DoG's) in place of sum rbar^2 ||g||^2",
                     unweighted=True))
    return out


def facts(rule, of):
    """eta a: eta has degree -1 in g (G or v grows as g^2), so the step has degree 0 (eps -> 0) without decay;
    Frobenius norms over the tree are orthogonally and permutation invariant."""
    return {"grad_scale": rule.weight_decay == 0, "step_scale_free": False, "orthogonal": True,
            "elementwise": True}


def _init_step(v):
    return isinstance(v, (tuple, list)) and len(v) == 2 and v[0] in ("heuristic", "distance", "learning_rate") \
        and isinstance(v[1], (int, float)) and not isinstance(v[1], bool) and v[1] > 0


def _dog(learning_rate, init_step, eps, weight_decay):
    return DoG(lr=learning_rate, init_step=init_step[0], init_value=float(init_step[1]), eps=eps,
               weight_decay=0.0 if weight_decay is None else weight_decay)


def _match_dog(rule):
    if type(rule) is not DoG or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, init_step=(rule.init_step, rule.init_value), eps=rule.eps,
                weight_decay=rule.weight_decay or None)


def _match_dowg(rule):
    if type(rule) is not DoWG or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, init_estim_sq_dist=rule.init_sq_dist, eps=rule.eps,
                weight_decay=rule.weight_decay or None)


_DECAY = (lambda v: v is None or (isinstance(v, (int, float)) and v >= 0), "weight_decay must be None or a "
                                                                             "constant >= 0")
_LR = (lambda v: not callable(v), "refopt takes a constant multiplier here (a schedule goes on the rule's "
                                  "schedule=)")

OPTAX_DOG = PeerMapping("optax.contrib.dog", "optax", "contrib.dog",
                        dict(learning_rate=1.0, init_step=("heuristic", 1e-6), eps=1e-8, weight_decay=None,
                             mask=None), _dog, "dog",
                        refuse={"init_step": (_init_step, "init_step must be ('heuristic' | 'distance' | "
                                                          "'learning_rate', a value > 0)"),
                                "mask": NO_MASK, "weight_decay": _DECAY, "learning_rate": _LR},
                        state={"x0": "init_params"}, match=_match_dog)

OPTAX_DOWG = PeerMapping("optax.contrib.dowg", "optax", "contrib.dowg",
                         dict(learning_rate=1.0, init_estim_sq_dist=None, eps=1e-4, weight_decay=None, mask=None),
                         lambda learning_rate, init_estim_sq_dist, eps, weight_decay: DoWG(
                             lr=learning_rate, init_sq_dist=init_estim_sq_dist, eps=eps,
                             weight_decay=0.0 if weight_decay is None else weight_decay),
                         "dog", refuse={"mask": NO_MASK, "weight_decay": _DECAY, "learning_rate": _LR},
                         state={"x0": "init_params"}, match=_match_dowg)

_NOT_LEAFWISE = {"not_leafwise": "the step size is one estimate over the whole tree (each leaf alone gets its own)"}

CONVENTIONS = Conventions(
    rules=(DoG, DoWG),
    final="eta_t a_t with eta_t from the whole tree's distance ||x - x_0|| and gradient sums: the running maximum, "
          "the weights of the sum (DoWG), where eps enters, or per-array estimates",
    per_step="the step size eta_t = r_t / sqrt(G_t + eps) (DoWG: rbar_t^2 / (sqrt(v_t) + eps))",
    mappings=(OPTAX_DOG, OPTAX_DOWG),
    no_peer={"torch": "torch.optim ships neither DoG nor DoWG",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX_DOG.preset("optax.contrib.dog", dict(learning_rate=1.0), "eta = max dist / sqrt(sum ||g||^2 + eps), "
                         "r_eps = 1e-6 (1 + ||x_0||)"),
        OPTAX_DOG.preset("optax.contrib.dog(distance,wd)", dict(learning_rate=0.5, init_step=("distance", 1e-3),
                                                                  eps=1e-6, weight_decay=0.01),
                         "r_eps = 1e-3, L2 decay 0.01 inside the sums, lr 0.5"),
        OPTAX_DOG.preset("optax.contrib.dog(learning_rate)", dict(learning_rate=1.0,
                                                                    init_step=("learning_rate", 1e-2)),
                         "eta_1 = 1e-2, then the estimate"),
        OPTAX_DOWG.preset("optax.contrib.dowg", dict(learning_rate=1.0), "eta = rbar^2 / (sqrt(sum rbar^2 "
                          "||g||^2) + 1e-4), rbar_0^2 = 1e-4"),
        OPTAX_DOWG.preset("optax.contrib.dowg(init,wd)", dict(learning_rate=0.5, init_estim_sq_dist=1e-3, eps=1e-6,
                                                               weight_decay=0.01), "rbar_0^2 = 1e-3, L2 0.01"),
    ),
    wrong=(Preset("WRONG step size: optax.contrib.dog vs refopt SGD", "optax", "contrib.dog",
                  ("contrib.dog", dict(learning_rate=0.5, init_step=("distance", 1e-3))), lambda: SGD(lr=1e-3),
                  "a constant lr vs the estimate r_t / sqrt(G_t + eps)", state={}, expect_fail=True),),
    oracle=DistanceOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("dog", lambda: DoG(), "optax.contrib.dog's defaults", ("x0",)),
            GoldenCase("dog_distance_wd", lambda: DoG(lr=0.5, init_step="distance", init_value=1e-3, eps=1e-6,
                                                      weight_decay=0.01),
                       "DoG r_eps = 1e-3, L2 0.01, lr 0.5", ("x0",)),
            GoldenCase("dowg", lambda: DoWG(), "optax.contrib.dowg's defaults", ("x0",))),
    examples=(Example("dog", lambda: DoG(init_step="distance", init_value=1e-2), extra=_NOT_LEAFWISE),
              Example("dog_lr_wd", lambda: DoG(init_step="learning_rate", init_value=1e-2, weight_decay=1e-3),
                      extra=_NOT_LEAFWISE),
              Example("dowg", lambda: DoWG(init_sq_dist=1e-2), extra=_NOT_LEAFWISE)),
    cli=(CliName("dog", DoG, {"mlp": 1.0, "gpt": 1.0}, "DoG (optax.contrib semantics; --lr multiplies the "
                 "estimated step): --weight-decay", {"weight_decay": "weight_decay"}),),
)

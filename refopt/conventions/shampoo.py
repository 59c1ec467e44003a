"""Shampoo (refopt/rules/shampoo.py) to pytorch_optimizer.Shampoo 4.1.0: torch's (out, in) layout (one factor per
axis, so the transposes take the same steps), the statistics from eps I, the momentum mixing g_t with the previous
preconditioned update, L2 (weight_decouple=False, the default) or decoupled decay, the inverse roots by an SVD
(refopt: an eigendecomposition; both float64, equal for a symmetric positive definite statistic).
pytorch_optimizer's ScalableShampoo (grafting, blocking, Schur-Newton roots) is not mapped. torch.optim and optax
ship no Shampoo."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (NO_MAXIMIZE, ROUNDING_GOLDEN, SHAMPOO_ROUNDING, CliName, Conventions, Example,
                                      Oracle, PeerMapping, Preset, gamma, is_number, scalar)
from refopt.golden import GoldenCase
from refopt.rules.shampoo import Shampoo


def _root(H, p, floor):
    w, V = np.linalg.eigh(H.astype(np.float64))
    return ((V * np.maximum(w, floor) ** (-1.0 / p)) @ V.T).astype(H.dtype)


class ShampooOracle(Oracle):
    """Shampoo from the rule's docstring, array by array in numpy. Switches: ``momentum_of`` 'update' (b_t the
    preconditioned update, the rule's) | 'grad' (b_t = hat g_t: the momentum of the gradients); ``power``
    'tensor' (H^(-1/2k), the rule's) | 'quarter' (H^(-1/4) whatever k); ``stats`` 'mixed' (the statistics of
    hat g, the rule's) | 'raw' (of g_t); ``eps_at`` 'init' (H_0 = eps I, the rule's) | 'relative' (H_0 = 0 and
    the root of H + eps lambda_max(H) I: a ridge relative to the largest eigenvalue)."""

    def init_leaf(self, x, path):
        at_init = self.switches.get("eps_at", "init") == "init"
        s = {"b": np.zeros_like(x)}
        for i, n in self._axes(x):
            s[f"H{i}"] = (self.rule.eps if at_init else 0.0) * np.eye(n, dtype=x.dtype)
            s[f"R{i}"] = np.zeros((n, n), x.dtype)
        return s

    def _axes(self, x):
        m = self.rule.max_precond_dim
        return [(i, n) for i, n in enumerate(x.shape) if m is None or n <= m]

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        if t == 1:
            s["b"] = g.copy()
        gh = g + scalar(r.momentum, d) * (s["b"] - g)
        if not r.decoupled and r.weight_decay:
            gh = gh + scalar(r.weight_decay, d) * x
        stats = g if sw.get("stats", "mixed") == "raw" else gh
        axes = self._axes(x)
        p = 2 * len(axes) if sw.get("power", "tensor") == "tensor" else 4
        u = gh
        for i, n in axes:
            gi = np.moveaxis(stats, i, 0).reshape(n, -1)
            s[f"H{i}"] = s[f"H{i}"] + gi @ gi.T
            if (t - 1) % r.precondition_frequency == 0:
                H, floor = s[f"H{i}"], r.eps
                if sw.get("eps_at", "init") == "relative":
                    floor = r.eps * max(float(np.linalg.eigvalsh(H.astype(np.float64))[-1]), np.finfo(np.float64).tiny)
                    H = H + floor * np.eye(n, dtype=H.dtype)
                s[f"R{i}"] = _root(H, p, floor)
            u = np.moveaxis(np.tensordot(s[f"R{i}"], u, axes=([1], [i])), 0, i)
        s["b"] = gh.copy() if sw.get("momentum_of", "update") == "grad" else u
        return u

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        keep = 1.0 - lr * r.weight_decay if r.decoupled else 1.0
        return scalar(keep, x.dtype) * x - scalar(lr, x.dtype) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "power -1/4", "every factor to the power -1/4 (the matrix case) in place of -1/(2k) for an "
             "order-k array", power="quarter"),
           v(rule, "statistics of the raw gradient", "H from g_t g_t^T in place of the momentum-mixed, decayed "
             "hat g_t", stats="raw"),
           v(rule, "eps relative to the largest eigenvalue", "the root of H + eps lambda_max(H) I with H_0 = 0 in "
             "place of H_0 = eps I", eps_at="relative")]
    if rule.momentum > 0:
        out.append(v(rule, "momentum of the gradients", "b_t = hat g_t (the mixed gradient) in place of the "
                     "preconditioned update", momentum_of="grad"))
    return out


def facts(rule, of):
    """The roots are matrix functions of the statistics, so x -> U x V^T (orthogonal U, V) rotates every factor and
    root and the step follows (``orthogonal`` True; eps I is rotation invariant). Scaling g by c scales each of
    the k roots by c^(-1/k) (eps -> 0), so the step has degree 0 in g without momentum and L2; with momentum
    hat g mixes g (degree 1) and b (degree 0)."""
    return {"grad_scale": rule.momentum == 0 and (rule.decoupled or rule.weight_decay == 0),
            "step_scale_free": False, "orthogonal": True, "elementwise": False}


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def _pytorch_optimizer(lr, momentum, weight_decay, weight_decouple, fixed_decay, preconditioning_compute_steps,
                       matrix_eps):
    return Shampoo(lr=lr, momentum=momentum, eps=matrix_eps, weight_decay=weight_decay, decoupled=weight_decouple,
                   max_precond_dim=None)


def _match(rule):
    if type(rule) is not Shampoo or rule.schedule is not None or rule.precondition_frequency != 1 \
            or rule.max_precond_dim is not None:
        return None
    return dict(lr=rule.lr, momentum=rule.momentum, weight_decay=rule.weight_decay, weight_decouple=rule.decoupled,
                fixed_decay=False, preconditioning_compute_steps=1, matrix_eps=rule.eps)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.Shampoo", "pytorch_optimizer", "Shampoo",
    dict(lr=1e-3, momentum=0.0, weight_decay=0.0, weight_decouple=False, fixed_decay=False,
         preconditioning_compute_steps=1, matrix_eps=1e-6, maximize=False),
    _pytorch_optimizer, "shampoo",
    refuse={"preconditioning_compute_steps": (lambda v: v == 1, "pytorch_optimizer first computes the roots at "
                                              "step preconditioning_compute_steps and steps by a zero preconditioner "
                                              "before it; refopt's precondition_frequency recomputes them at t = 1, "
                                              "f + 1, ..."),
            "fixed_decay": (lambda v: v is False, "fixed_decay=True decays by weight_decay without lr; refopt's "
                                                  "Shampoo decays by lr weight_decay"),
            "momentum": (lambda v: is_number(v) and 0.0 <= v < 1.0, "momentum must be a number in [0, 1)"),
            "matrix_eps": (lambda v: is_number(v) and v > 0, "refopt's Shampoo needs a number matrix_eps > 0 (the "
                                                           "statistics' start eps I)"),
            "lr": (lambda v: is_number(v) and v >= 0, "lr must be a number >= 0"),
            "weight_decay": (lambda v: is_number(v) and v >= 0, "weight_decay must be a number >= 0"),
            "weight_decouple": (lambda v: isinstance(v, bool), "weight_decouple must be True or False"),
            "maximize": NO_MAXIMIZE},
    state={"b": "momentum_buffer"}, layout="transpose", tol=SHAMPOO_ROUNDING, match=_match)

#: every row runs in float64 only; the rows with momentum skip the MLP
_FLOAT64 = dict(dtypes=("float64",), dtypes_why="in float32 one ulp of the gradients moves refopt's own Shampoo by up "
                                                "to 6.4e-3 (no momentum, the quadratic) and 0.15 (momentum, the GPT) "
                                                "in 50 steps (SHAMPOO_ROUNDING)")
_CHAOTIC = dict(problems=("stream", "quadratic", "gpt"),
                problems_why="Shampoo with momentum is chaotic on the MLP: one ulp of the gradients moves refopt's own "
                             "params by 0.75 in 50 steps",
                **_FLOAT64)


_KW = dict(lr=0.01, momentum=0.9, weight_decay=0.01, matrix_eps=1e-4)

CONVENTIONS = Conventions(
    rules=(Shampoo,),
    final="hat g_t x_1 H_1^(-1/2k) ... x_k H_k^(-1/2k): the root's power, what the statistics sum, where eps sits, "
          "what the momentum mixes",
    per_step="lr_t",
    mappings=(PYTORCH_OPTIMIZER,),
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Shampoo", dict(lr=1e-3), "the defaults: no momentum, eps 1e-6",
                                 **_FLOAT64),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Shampoo(momentum,L2,eps)", _KW,
                                 "momentum 0.9 (of the preconditioned update), L2 0.01, matrix_eps 1e-4", **_CHAOTIC),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Shampoo(decoupled)",
                                 dict(lr=0.02, momentum=0.5, weight_decay=0.1, weight_decouple=True),
                                 "momentum 0.5, decoupled decay 0.1", **_CHAOTIC)),
    wrong=(Preset("WRONG momentum: pytorch_optimizer.Shampoo(momentum=0.9) vs refopt Shampoo(momentum=0)",
                  "pytorch_optimizer", "shampoo", ("Shampoo", dict(lr=0.01, momentum=0.9)),
                  lambda: PYTORCH_OPTIMIZER.rule(lr=0.01), "the package's momentum 0.9 against none",
                  layout="transpose", expect_fail=True, tol=SHAMPOO_ROUNDING, **_CHAOTIC),),
    no_peer={"torch": "torch.optim ships no Shampoo", "optax": "optax 0.2.8 ships no Shampoo",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=ShampooOracle,
    variants=variants,
    facts=facts,
    cli=(CliName("shampoo", Shampoo, {"mlp": 0.2, "gpt": 0.2},
                 "Shampoo (Gupta et al. 2018): each axis's statistic to the power -1/(2k) on every array (vectors: "
                 "full-matrix AdaGrad); --momentum (of the preconditioned update), --eps (the statistics' eps I)",
                 {"momentum": "momentum", "eps": "eps"}),),
    golden=(GoldenCase("shampoo", lambda: Shampoo(lr=0.01), "Shampoo, the paper's (no momentum)", ("b",),
                       tolerance=ROUNDING_GOLDEN),
            GoldenCase("shampoo_pytorch_optimizer", lambda: PYTORCH_OPTIMIZER.rule(**_KW),
                       "like('pytorch_optimizer.Shampoo', lr 0.01, momentum 0.9, wd 0.01, matrix_eps 1e-4)",
                       ("b",), tolerance=ROUNDING_GOLDEN)),
    examples=(Example("shampoo", lambda: Shampoo(lr=0.3)),
              Example("shampoo_momentum", lambda: Shampoo(lr=0.02, momentum=0.5, weight_decay=0.01, decoupled=True,
                                                          precondition_frequency=3, max_precond_dim=4),
                      converges=False,
                      note="the momentum mixes the preconditioned update b (of degree 0 in g) into hat g: near the "
                           "minimum hat g -> mu b does not vanish, and the quadratic diverges (pytorch_optimizer's "
                           "form)")),
)

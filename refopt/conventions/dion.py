"""Dion (refopt/rules/dion.py). No package on the registry ships Dion (the authors' code, microsoft/dion, is
installed from GitHub only), so it is checked against its own closed forms (tests/test_dion.py): at full rank the
error feedback leaves M_t = mu B_t; on a rank-1 momentum the update is the exact msign; Q_t has unit columns."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import Conventions, Example, ShapeScaledOracle, scalar
from refopt.golden import GoldenCase
from refopt.rules.dion import Dion, initial_q


class DionOracle(ShapeScaledOracle):
    """Dion from the rule's docstring, array by array in numpy, on the paper's m x n = (fan_out, fan_in) matrix.
    Switches: ``feedback`` False (M_t = mu B_t: no error feedback); ``normalise`` False (Q_t = R_t);
    ``refresh`` False (Q stays Q_0: no warm start); ``orth`` 'qr' (the rule's) | 'none' (P_t = B_t Q_{t-1})."""

    def init_leaf(self, x, path):
        r = self.rule
        return {"M": np.zeros_like(x), "Q": initial_q(x.shape, r.rank, r.seed, path, x.dtype)}

    def unscaled(self, t, s, x, g, path):
        from refopt.rules.muon import matrix_shape

        r, d, sw = self.rule, x.dtype, self.switches
        view = matrix_shape(x.shape)
        B = (s["M"] + g).reshape(view).T
        P = B @ s["Q"]
        if sw.get("orth", "qr") == "qr":
            P = np.linalg.qr(P)[0]
        R = B.T @ P
        if sw.get("feedback", True):
            M = B - scalar(1.0 - r.momentum, d) * (P @ R.T)
        else:
            M = scalar(r.momentum, d) * B
        s["M"] = np.ascontiguousarray(M.T).reshape(x.shape)
        Q = R / (np.linalg.norm(R, axis=0, keepdims=True) + scalar(r.eps, d)) if sw.get("normalise", True) else R
        if sw.get("refresh", True):
            s["Q"] = Q
        return np.ascontiguousarray((P @ Q.T).T).reshape(x.shape)


def variants(rule):
    from refopt.conventions._variants import TransposedRule, Variant, oracle_variant as v, shape_scale_variants

    out = [Variant("layout transposed", "the rule applied to W^T: the paper's (out, in) matrix read as (in, out), "
                   "so Q is the left factor", lambda: TransposedRule(rule)),
           v(rule, "no error feedback", "M_t = mu B_t in place of B_t - (1 - mu) P_t R_t^T", feedback=False),
           v(rule, "Q not normalised", "Q_t = R_t in place of its columns divided by their norms", normalise=False),
           v(rule, "Q not refreshed", "Q stays Q_0 in place of the warm start Q_{t-1}", refresh=False),
           v(rule, "P not orthonormalised", "P_t = B_t Q_{t-1} without the QR", orth="none")]
    return out + shape_scale_variants(rule)


def facts(rule, of):
    """B_t, R_t and M_t are linear in the gradients and P_t, Q_t of degree 0 (the QR's signs cancel), so the
    step has degree 0 in g (eps -> 0); Q_0 is a fixed draw, so a rotation of the input space is not followed
    (nor a permutation of the entries)."""
    return {"grad_scale": True, "step_scale_free": False, "orthogonal": False, "elementwise": False}


_LEAFWISE = {"not_leafwise": "Q_0 is drawn from the seed and the array's path, and a bare leaf has another path"}


CONVENTIONS = Conventions(
    rules=(Dion,),
    final="P_t Q_t^T of one warm-started power iteration: the QR, the column normalisation of Q, the error "
          "feedback, the shape scale",
    per_step="lr_t",
    no_peer={"torch": "torch.optim ships no Dion", "optax": "optax 0.2.8 ships no Dion",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only",
             "pytorch_optimizer": "pytorch_optimizer 4.1.0 ships no Dion", "heavyball": "heavyball 3.2.1 ships no Dion"},
    oracle=DionOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("dion_rank2", lambda: Dion(lr=0.02, rank=2, momentum=0.9, weight_decay=0.01),
                       "Dion, rank 2, momentum 0.9, decay 0.01", ("M", "Q"), matrix_only=True),
            GoldenCase("dion_full", lambda: Dion(lr=0.02), "Dion at full rank (M_t = mu B_t)", ("M", "Q"),
                       matrix_only=True)),
    examples=(Example("dion", lambda: Dion(lr=0.02), params="matrix", converges=False,
                      note="constant lr: each step P_t Q_t^T has spectral norm about lr s, so Dion orbits the minimum",
                      extra=_LEAFWISE),
              Example("dion_rank1", lambda: Dion(lr=0.02, rank=1, weight_decay=0.01), params="matrix",
                      converges=False, note="constant lr: each rank-1 step has norm lr s, so Dion orbits the minimum",
                      extra=_LEAFWISE)),
)

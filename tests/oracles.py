"""The per-step forms of the rules' plain-numpy oracles that older tests call. The equations are written
once, in the rules' conventions files (refopt/conventions/<rule>.py, :func:`refopt.conventions.oracle`):
these functions only hand one array's state to them. sf_*_reference take the rule's own step context (lr,
c_t, bc2): they check the per-element arithmetic given the scalars; the scalars themselves are checked by
the Schedule-Free oracle of refopt/conventions/schedule_free.py."""
from __future__ import annotations

import numpy as np

from refopt.conventions import oracle
from refopt.conventions._spec import scalar


def _step(rule, t, state, x, g):
    s = dict(state)
    return oracle(rule).step_leaf(t, s, np.array(x, copy=True), np.asarray(g), "x"), s


def sgd_reference(x, g, b, t, rule):
    """torch.optim.SGD: returns (x_new, b_new)."""
    x, s = _step(rule, t, {"b": np.array(b, copy=True) if np.size(b) == np.size(x) else np.zeros_like(x)}, x, g)
    return x, s["b"]


def adam_reference(x, g, m, v, t, rule):
    """Adam / AdamW (optax's NAdam when rule.nesterov and no momentum_decay): returns (x_new, m_new, v_new)."""
    x, s = _step(rule, t, {"m": np.array(m, copy=True), "v": np.array(v, copy=True)}, x, g)
    return x, s["m"], s["v"]


def muon_reference(x, g, m, t, rule):
    """One Muon step: returns (x_new, m_new)."""
    x, s = _step(rule, t, {"m": np.array(m, copy=True)}, x, g)
    return x, s["m"]


def sf_sgd_reference(y, g, z, x, ctx, rule):
    """One Schedule-Free SGD step given the step size ctx.lr and the averaging weight ctx.c: returns
    (y_new, z_new, x_new)."""
    d = y.dtype
    if rule.weight_decay != 0:
        g = g + scalar(rule.weight_decay, d) * y
    z = z - scalar(ctx.lr, d) * g
    x = x * scalar(1.0 - ctx.c, d) + scalar(ctx.c, d) * z
    return x * scalar(rule.beta, d) + scalar(1.0 - rule.beta, d) * z, z, x


def sf_adamw_reference(y, g, z, x, v, ctx, rule):
    """One Schedule-Free AdamW step given ctx.lr, ctx.c and ctx.bc2: returns (y_new, z_new, x_new, v_new)."""
    d = y.dtype
    if rule.weight_decay != 0:
        z = z - scalar(ctx.lr * rule.weight_decay, d) * (z if rule.decay_at_z else y)
    v = v * scalar(rule.beta2, d) + scalar(1.0 - rule.beta2, d) * g * g
    z = z + scalar(-ctx.lr, d) * g / (np.sqrt(v / scalar(ctx.bc2, d)) + scalar(rule.eps, d))
    x = x * scalar(1.0 - ctx.c, d) + scalar(ctx.c, d) * z
    return x * scalar(rule.beta1, d) + scalar(1.0 - rule.beta1, d) * z, z, x, v

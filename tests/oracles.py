"""Plain-numpy oracles of the rules, written from the equations in the rules' docstrings (and the peers'
papers), not from the library's code: every scalar is computed here in float64 from the hyperparameters and
cast to the array dtype, every array operation is a numpy expression in the array dtype."""
from __future__ import annotations

import math

import numpy as np


def _gamma(rule, t):
    return 1.0 if rule.schedule is None else float(rule.schedule(t))


def sgd_reference(x, g, b, t, rule):
    """torch.optim.SGD: returns (x_new, b_new)."""
    d = x.dtype.type
    lr = d(rule.lr * _gamma(rule, t))
    g = g + d(rule.weight_decay) * x
    u = g
    if rule.momentum > 0:
        b = g.copy() if t == 1 else d(rule.momentum) * b + d(1.0 - rule.dampening) * g
        u = g + d(rule.momentum) * b if rule.nesterov else b
    return x - lr * u, b


def adam_reference(x, g, m, v, t, rule):
    """Adam / AdamW (optax's NAdam when rule.nesterov and no momentum_decay): returns (x_new, m_new, v_new)."""
    d = x.dtype.type
    gamma = _gamma(rule, t)
    lr_t = rule.lr * gamma
    decoupled = getattr(rule, "wd_mode", None)
    l2 = 0.0 if decoupled else rule.weight_decay
    decay = 1.0 if not decoupled else 1.0 - (lr_t if decoupled == "decoupled" else gamma) * rule.weight_decay
    b1, b2 = rule.beta1, rule.beta2
    g = g + d(l2) * x
    m = d(b1) * m + d(1.0 - b1) * g
    v = d(b2) * v + d(1.0 - b2) * (g * g)
    denom = np.sqrt(v) / d(math.sqrt(1.0 - b2 ** t)) + d(rule.eps)
    if rule.nesterov:
        mhat = d(b1 / (1.0 - b1 ** (t + 1))) * m + d((1.0 - b1) / (1.0 - b1 ** t)) * g
        return x * d(decay) - d(lr_t) * (mhat / denom), m, v
    return x * d(decay) - d(lr_t / (1.0 - b1 ** t)) * (m / denom), m, v


def muon_reference(x, g, m, t, rule):
    """One Muon step (EMA momentum, the Nesterov input of rule.nesterov_mode, msign, shape scale, decay):
    returns (x_new, m_new)."""
    from refopt.linalg._msign import _msign_svd, newton_schulz, ns_coefficients
    from refopt.rules.muon import matrix_shape, muon_scale

    d = x.dtype.type
    gamma = _gamma(rule, t)
    lr_t = rule.lr * gamma
    mu = rule.momentum
    decay = 1.0 - (lr_t if rule.wd_mode == "decoupled" else gamma) * rule.weight_decay
    if rule.nesterov_mode == "standard":
        w_m, w_g = (mu, 1.0 - mu) if rule.nesterov else (1.0, 0.0)
    elif rule.nesterov:
        w_m, w_g = mu / (1.0 - mu ** (t + 1)), (1.0 - mu) / (1.0 - mu ** t)
    else:
        w_m, w_g = 1.0 / (1.0 - mu ** t), 0.0
    m = d(mu) * m + d(1.0 - mu) * g
    M = (d(w_m) * m + d(w_g) * g).reshape(matrix_shape(x.shape))
    if rule.msign == "svd":
        O = _msign_svd(M, None)
    else:
        O = newton_schulz(M, ns_coefficients(rule.ns_coeffs, rule.ns_steps), rule.eps_mode, rule.norm_eps,
                          rule.norm_factor)
    step = d(lr_t * muon_scale(x.shape, rule.scale))
    return d(decay) * x - step * O.reshape(x.shape), m


def hyperball_reference(x, u, radius, lr_t):
    """One Hyperball step given the base direction u (float64 norms)."""
    d = x.dtype.type
    nu = float(np.linalg.norm(u.astype(np.float64)))
    y = x - d(lr_t * radius / nu) * u if nu > 0 else x.copy()
    ny = float(np.linalg.norm(y.astype(np.float64)))
    return d(radius / ny) * y if ny > 0 else y


def covariant_reference(x, u, lr_t):
    """One Frobenius Covariant step given the base direction u (float64 norms)."""
    nw = float(np.linalg.norm(x.astype(np.float64)))
    nu = float(np.linalg.norm(u.astype(np.float64)))
    if nw == 0.0 or nu == 0.0:
        return x.copy()
    return x - x.dtype.type(lr_t * nw / nu) * u


def average_reference(mu, x, p, q, r):
    """Eq. (2) of post 004 as (p*mu + q*x)/r in x's dtype."""
    d = x.dtype.type
    return (d(p) * mu + d(q) * x) / d(r)


def sf_sgd_reference(y, g, z, x, ctx, rule):
    """One Schedule-Free SGD step (SGDScheduleFreeReference) given the step size ctx.lr and the averaging
    weight ctx.c: returns (y_new, z_new, x_new)."""
    d = y.dtype.type
    if rule.weight_decay != 0:
        g = g + d(rule.weight_decay) * y
    z = z - d(ctx.lr) * g
    x = x * d(1.0 - ctx.c) + d(ctx.c) * z
    return x * d(rule.beta) + d(1.0 - rule.beta) * z, z, x


def sf_adamw_reference(y, g, z, x, v, ctx, rule):
    """One Schedule-Free AdamW step (AdamWScheduleFreeReference) given ctx.lr, ctx.c and ctx.bc2:
    returns (y_new, z_new, x_new, v_new)."""
    d = y.dtype.type
    if rule.weight_decay != 0:
        z = z - d(ctx.lr * rule.weight_decay) * (z if rule.decay_at_z else y)
    v = v * d(rule.beta2) + d(1.0 - rule.beta2) * g * g
    denom = np.sqrt(v / d(ctx.bc2)) + d(rule.eps)
    z = z + d(-ctx.lr) * g / denom
    x = x * d(1.0 - ctx.c) + d(ctx.c) * z
    return x * d(rule.beta1) + d(1.0 - rule.beta1) * z, z, x, v

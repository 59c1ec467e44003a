"""The arithmetic of one step of the Adam family (:mod:`refopt.rules.adam`), written once for Adam and
AdamW: the step's scalars, computed in float64 (PITFALLS B01) before the walk casts them to x's dtype, and
the per-element kernels of Adam, AMSGrad and NAdam that read them."""
from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise, bad_leaves, square_bound


class AdamContext(NamedTuple):
    """The scalars of one step (:func:`context`)."""

    lr_t: float       # lr * gamma_t
    decay: float      # multiplier of x_{t-1} from decoupled / independent weight decay (1 for none)
    step: float       # lr_t / (1 - beta1**t); NAdam: lr_t
    u_scale: float    # 1 / (1 - beta1**t); NAdam: 1
    l2: float         # L2 coefficient added to g (Adam's weight_decay; 0 for AdamW)
    beta1: float
    omb1: float       # 1 - beta1
    beta2: float
    omb2: float       # 1 - beta2
    eps: float
    sqrt_bc2: float   # sqrt(1 - beta2**t); 1 for optax's AMSGrad (its v_max is bias-corrected already)
    vmax_scale: float  # AMSGrad: v enters the maximum as v * vmax_scale (1 torch, 1/(1 - beta2**t) optax)
    c_m: float        # NAdam: coefficient of m_t in the look-ahead mhat_t
    c_g: float        # NAdam: coefficient of g_t


def context(rule, t: int, lr_t: float, decay: float, l2: float, mu_product: float | None):
    """(AdamContext of step t, mu_product): the bias corrections and, with ``rule.nesterov``, NAdam's
    coefficients c_m, c_g (the equations of :class:`refopt.rules.adam.Adam`). ``mu_product`` (torch's NAdam,
    ``rule.momentum_decay`` set; else None) is P_{t-1} = mu_1 ... mu_{t-1} and P_t is returned."""
    b1, b2 = float(rule.beta1), float(rule.beta2)
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    step, u_scale, sqrt_bc2, vmax_scale, c_m, c_g = lr_t / bc1, 1.0 / bc1, math.sqrt(bc2), 1.0, 0.0, 0.0
    if rule.amsgrad == "bias_corrected":
        sqrt_bc2, vmax_scale = 1.0, 1.0 / bc2
    if rule.nesterov:
        step, u_scale = lr_t, 1.0
        if rule.momentum_decay is None:    # optax.nadam: constant beta1
            c_m, c_g = b1 / (1.0 - b1 ** (t + 1)), (1.0 - b1) / bc1
        else:                              # torch.optim.NAdam: mu_t = beta1 (1 - 0.96**(t psi) / 2)
            psi = float(rule.momentum_decay)
            mu, mu_next = b1 * (1.0 - 0.5 * 0.96 ** (t * psi)), b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * psi))
            mu_product = mu_product * mu
            c_m, c_g = mu_next / (1.0 - mu_product * mu_next), (1.0 - mu) / (1.0 - mu_product)
    return AdamContext(lr_t, decay, step, u_scale, l2, b1, 1.0 - b1, b2, 1.0 - b2, float(rule.eps), sqrt_bc2,
                       vmax_scale, c_m, c_g), mu_product


@numba.njit
def _moments(x, g, s, i, c):
    """g_t (with L2), and m_t, v_t written into the state. The L2 term only when lambda != 0 (as torch):
    0 * x would turn an infinite parameter into NaN in m and v."""
    if c.l2 != 0:
        g = g + c.l2 * x
    m = c.beta1 * s.m[i] + c.omb1 * g
    v = c.beta2 * s.v[i] + c.omb2 * (g * g)
    s.m[i] = m
    s.v[i] = v
    return g, m, v


@numba.njit
def m_hat(m, g, c):
    """The bias-corrected first moment m_t / (1 - beta1^t), or with ``c.nesterov`` optax's look-ahead
    beta1 m_t / (1 - beta1^(t+1)) + (1 - beta1) g_t / (1 - beta1^t) in optax's order of operations (RAdam,
    AdaBelief: ``c`` has beta1, omb1, bc1, bc1_next, nesterov)."""
    if c.nesterov:
        return c.beta1 * (m / c.bc1_next) + c.omb1 * (g / c.bc1)
    return m / c.bc1


@numba.njit
def _adam(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    return m / (np.sqrt(v) / c.sqrt_bc2 + c.eps)


@numba.njit
def _amsgrad(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    v_max = max(s.v_max[i], v * c.vmax_scale)
    s.v_max[i] = v_max
    return m / (np.sqrt(v_max) / c.sqrt_bc2 + c.eps)


@numba.njit
def _nadam(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    return (c.c_m * m + c.c_g * g) / (np.sqrt(v) / c.sqrt_bc2 + c.eps)


ADAM, AMSGRAD, NADAM = Elementwise(_adam, "adam"), Elementwise(_amsgrad, "amsgrad"), Elementwise(_nadam, "nadam")


def check_l2(rule_name: str, l2: float, xs, paths) -> None:
    """L2 adds lambda*x to the gradient before it is squared: with |g| below square_bound (the walk's
    check) and lambda*|x| below it too, (g + lambda*x)**2 stays finite in v. FloatingPointError naming
    the first leaf where lambda*|x| is not, before anything is written."""
    if l2 <= 0:
        return
    bad = bad_leaves(xs, [square_bound(x.dtype) / l2 for x in xs])
    if bad:
        k = bad[0]
        big = l2 * float(np.max(np.abs(xs[k])))
        raise FloatingPointError(
            f"{rule_name}: weight_decay * |x| at {paths[k]} reaches {big:.3g}; L2 adds it to the "
            f"gradient, whose square would overflow {xs[k].dtype} in the second moment (it must stay "
            f"below {square_bound(xs[k].dtype):.3g}); lower weight_decay or use float64")

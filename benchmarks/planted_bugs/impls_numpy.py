"""Hand-written numpy optimizers (``init(params) -> state``, ``step(state, params, grads) -> (params,
state)``; lists of arrays, refopt layout) for the planted-bug trial of ``refopt crosscheck --impl``.

Each class carries exactly ONE planted bug, stated in its docstring; the ``Ok*`` classes are meant to be
correct. Steps never write the caller's arrays (new arrays are returned).
"""
from __future__ import annotations

import math

import numpy as np


# ----------------------------------------------------------------------------------------------------
# Lion
# ----------------------------------------------------------------------------------------------------

class OkLion:
    """Correct Lion (Chen et al. 2023, Alg. 2): u = sign((1-b1) g + b1 m), m = (1-b2) g + b2 m,
    x = (1 - lr wd) x - lr u."""

    def __init__(self, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
        self.lr, self.b1, self.b2, self.wd = lr, beta1, beta2, weight_decay

    def init(self, params):
        return {"m": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        new_x, new_m = [], []
        for x, g, m in zip(params, grads, state["m"]):
            u = np.sign((1 - self.b1) * g + self.b1 * m)
            new_x.append((1 - self.lr * self.wd) * x - self.lr * u)
            new_m.append((1 - self.b2) * g + self.b2 * m)
        return new_x, {"m": new_m}


class LionBetasSwapped:
    """Lion with beta1 and beta2 exchanged: the sign interpolates with beta2 and the momentum EMA uses
    beta1."""

    def __init__(self, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
        self.lr, self.b1, self.b2, self.wd = lr, beta1, beta2, weight_decay

    def init(self, params):
        return {"m": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        new_x, new_m = [], []
        for x, g, m in zip(params, grads, state["m"]):
            u = np.sign((1 - self.b2) * g + self.b2 * m)      # BUG: beta2 here ...
            new_x.append((1 - self.lr * self.wd) * x - self.lr * u)
            new_m.append((1 - self.b1) * g + self.b1 * m)     # ... and beta1 here
        return new_x, {"m": new_m}


# ----------------------------------------------------------------------------------------------------
# Adam
# ----------------------------------------------------------------------------------------------------

class AdamNoSqrt:
    """Adam that divides by vhat + eps, forgetting the square root of the second moment."""

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": [np.zeros_like(x) for x in params], "v": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        ms, vs, xs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            mhat = m / (1 - self.b1 ** t)
            vhat = v / (1 - self.b2 ** t)
            xs.append(x - self.lr * mhat / (vhat + self.eps))   # BUG: no sqrt
            ms.append(m)
            vs.append(v)
        return xs, {"t": t, "m": ms, "v": vs}


# ----------------------------------------------------------------------------------------------------
# SGD
# ----------------------------------------------------------------------------------------------------

class SGDDampeningInverted:
    """SGD with momentum and dampening that adds dampening*g to the buffer instead of (1 - dampening)*g
    (first buffer b_1 = g as torch)."""

    def __init__(self, lr=1e-3, momentum=0.9, dampening=0.0):
        self.lr, self.mu, self.tau = lr, momentum, dampening

    def init(self, params):
        return {"t": 0, "b": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        xs, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            b = g.copy() if t == 1 else self.mu * b + self.tau * g   # BUG: tau instead of 1 - tau
            xs.append(x - self.lr * b)
            bs.append(b)
        return xs, {"t": t, "b": bs}


# ----------------------------------------------------------------------------------------------------
# ClipByGlobalNorm around SGD
# ----------------------------------------------------------------------------------------------------

class ClipSquaredNormSGD:
    """Global-norm clipping whose 'norm' is the sum of squares (the square root is missing), then SGD with
    momentum."""

    def __init__(self, lr=1e-3, momentum=0.9, max_norm=1.0):
        self.lr, self.mu, self.max_norm = lr, momentum, max_norm

    def init(self, params):
        return {"t": 0, "b": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        sq = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)   # BUG: no sqrt
        c = 1.0 if sq == 0 else min(1.0, self.max_norm / sq)
        xs, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            g = g * c
            b = g.copy() if t == 1 else self.mu * b + g
            xs.append(x - self.lr * b)
            bs.append(b)
        return xs, {"t": t, "b": bs}


class OkClipSGD:
    """Correct: c = min(1, max_norm / (N + eps)) with N the global norm of all gradients, then SGD with
    momentum (b_1 = g_1, b_t = mu b + g_t)."""

    def __init__(self, lr=1e-3, momentum=0.9, max_norm=1.0, eps=0.0):
        self.lr, self.mu, self.max_norm, self.eps = lr, momentum, max_norm, eps

    def init(self, params):
        return {"t": 0, "b": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        n = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
        c = 1.0 if n + self.eps == 0 else min(1.0, self.max_norm / (n + self.eps))
        xs, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            g = g * c
            b = g.copy() if t == 1 else self.mu * b + g
            xs.append(x - self.lr * b)
            bs.append(b)
        return xs, {"t": t, "b": bs}


# ----------------------------------------------------------------------------------------------------
# RMSprop
# ----------------------------------------------------------------------------------------------------

class OkRMSprop:
    """Correct RMSprop (torch form): v EMA of g^2, centered a EMA of g, d = sqrt(v - a^2) + eps,
    momentum b = mu b + g/d, x -= lr b; L2 decay added to g."""

    def __init__(self, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
        self.lr, self.alpha, self.eps, self.wd, self.mu, self.centered = lr, alpha, eps, weight_decay, momentum, centered

    def init(self, params):
        z = lambda: [np.zeros_like(x) for x in params]  # noqa: E731
        return {"v": z(), "a": z(), "b": z()}

    def step(self, state, params, grads):
        out = {"v": [], "a": [], "b": []}
        xs = []
        for x, g, v, a, b in zip(params, grads, state["v"], state["a"], state["b"]):
            if self.wd:
                g = g + self.wd * x
            v = self.alpha * v + (1 - self.alpha) * g * g
            if self.centered:
                a = a + (1 - self.alpha) * (g - a)
                d = np.sqrt(v - a * a) + self.eps
            else:
                d = np.sqrt(v) + self.eps
            if self.mu > 0:
                b = self.mu * b + g / d
                u = b
            else:
                u = g / d
            xs.append(x - self.lr * u)
            out["v"].append(v)
            out["a"].append(a)
            out["b"].append(b)
        return xs, out


class RMSpropMomentumBeforeScaling:
    """RMSprop with momentum that accumulates the raw gradient (b = mu b + g) and divides the buffer by
    the current RMS afterwards, instead of accumulating g / d."""

    def __init__(self, lr=1e-2, alpha=0.99, eps=1e-8, momentum=0.0):
        self.lr, self.alpha, self.eps, self.mu = lr, alpha, eps, momentum

    def init(self, params):
        return {"v": [np.zeros_like(x) for x in params], "b": [np.zeros_like(x) for x in params]}

    def step(self, state, params, grads):
        xs, vs, bs = [], [], []
        for x, g, v, b in zip(params, grads, state["v"], state["b"]):
            v = self.alpha * v + (1 - self.alpha) * g * g
            b = self.mu * b + g                               # BUG: raw g into the buffer
            xs.append(x - self.lr * b / (np.sqrt(v) + self.eps))
            vs.append(v)
            bs.append(b)
        return xs, {"v": vs, "b": bs}

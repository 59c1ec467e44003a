"""Round-2 planted-bug optimizers as numpy ``init(params) -> state`` / ``step(state, params, grads) ->
(params, state)`` objects; params and grads are lists of numpy arrays in refopt's (fan_in, fan_out) layout.

Each class is written from the equations of the corresponding refopt rule docstring. Every class docstring
states in one sentence the bug planted in it (or that the implementation is meant to be correct).
"""
from __future__ import annotations

import math

import numpy as np


def _newton_schulz(G: np.ndarray, steps: int = 5) -> np.ndarray:
    """Quintic Newton-Schulz (Jordan coefficients) approximating the polar factor of a 2-D G."""
    a, b, c = 3.4445, -4.7750, 2.0315
    n = np.linalg.norm(G)
    if n == 0:
        return np.zeros_like(G)
    X = G / n
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return np.ascontiguousarray(X.T) if tall else X


# ---------------------------------------------------------------------------------------------- Schedule-Free SGD
class SFSGD:
    """Correct: Schedule-Free SGD (reference form) with warmup, polynomial weights t**r, lr_max weighting and L2 at y."""

    def __init__(self, lr=1.0, beta=0.9, warmup_steps=0, r=0.0, weight_lr_power=2.0, weight_decay=0.0):
        self.lr, self.beta, self.W, self.r = lr, beta, warmup_steps, r
        self.power, self.wd = weight_lr_power, weight_decay

    def init(self, params):
        return dict(t=0, weight_sum=0.0, lr_max=-1.0, z=[p.copy() for p in params], x=[p.copy() for p in params])

    def _weight(self, t, lr_max):
        return (t ** self.r) * (lr_max ** self.power)

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma = self.lr * (t / self.W if t <= self.W else 1.0)
        lr_max = max(state["lr_max"], gamma)
        w = self._weight(t, lr_max)
        weight_sum = state["weight_sum"] + w
        c = w / weight_sum if weight_sum != 0 else 0.0
        new_p, new_z, new_x = [], [], []
        for y, g, z, x in zip(params, grads, state["z"], state["x"]):
            if self.wd != 0:
                g = g + self.wd * y
            z = z - gamma * g
            x = x * (1 - c) + c * z
            new_z.append(z)
            new_x.append(x)
            new_p.append(self.beta * x + (1 - self.beta) * z)
        return new_p, dict(t=t, weight_sum=weight_sum, lr_max=lr_max, z=new_z, x=new_x)


class SFSGDCounter(SFSGD):
    """Bug: the polynomial averaging weight uses the 0-based step count (t-1)**r instead of t**r."""

    def step(self, state, params, grads):
        k = state["t"]                      # steps taken so far (0-based index of this step)
        t = k + 1
        gamma = self.lr * (t / self.W if t <= self.W else 1.0)
        lr_max = max(state["lr_max"], gamma)
        w = (k ** self.r) * (lr_max ** self.power)
        weight_sum = state["weight_sum"] + w
        c = w / weight_sum if weight_sum != 0 else 0.0
        new_p, new_z, new_x = [], [], []
        for y, g, z, x in zip(params, grads, state["z"], state["x"]):
            if self.wd != 0:
                g = g + self.wd * y
            z = z - gamma * g
            x = x * (1 - c) + c * z
            new_z.append(z)
            new_x.append(x)
            new_p.append(self.beta * x + (1 - self.beta) * z)
        return new_p, dict(t=t, weight_sum=weight_sum, lr_max=lr_max, z=new_z, x=new_x)


# ---------------------------------------------------------------------------------------------- Muon + Adam
class MuonAdam:
    """Correct: Muon (nesterov, rms_match scale, decoupled decay) on 2-D arrays and Adam on the others."""

    def __init__(self, lr=0.02, momentum=0.95, weight_decay=0.0, adam_lr=1e-3, adam_beta1=0.9, adam_beta2=0.999,
                 adam_eps=1e-8, ns_steps=5):
        self.lr, self.mu, self.wd, self.ns = lr, momentum, weight_decay, ns_steps
        self.alr, self.b1, self.b2, self.eps = adam_lr, adam_beta1, adam_beta2, adam_eps

    def init(self, params):
        return dict(t=0, m=[np.zeros_like(p) for p in params], v=[np.zeros_like(p) for p in params])

    def step(self, state, params, grads):
        t = state["t"] + 1
        mu, b1, b2 = self.mu, self.b1, self.b2
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            if x.ndim == 2:
                m = mu * m + (1 - mu) * g
                O = _newton_schulz((1 - mu) * g + mu * m, self.ns)
                s = 0.2 * math.sqrt(max(x.shape))
                x = (1 - self.lr * self.wd) * x - self.lr * s * O
            else:
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                x = x - self.alr / (1 - b1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** t) + self.eps)
            out.append(x)
            ms.append(m)
            vs.append(v)
        return out, dict(t=t, m=ms, v=vs)


# ---------------------------------------------------------------------------------------------- Hyperball
class HyperballNesterov:
    """Bug: the direction is normalised per column (norm over axis 0) instead of by the Frobenius norm of the whole matrix."""

    def __init__(self, lr=0.01, momentum=0.9, other_lr=0.01):
        self.lr, self.mu, self.other_lr = lr, momentum, other_lr

    def init(self, params):
        return dict(b=[None] * len(params),
                    radius=[float(np.linalg.norm(p)) if p.ndim == 2 else None for p in params])

    def step(self, state, params, grads):
        mu = self.mu
        out, bs = [], []
        for x, g, b, R in zip(params, grads, state["b"], state["radius"]):
            b = g.copy() if b is None else mu * b + g
            u = g + mu * b                                  # SGD nesterov direction
            if x.ndim == 2:                                 # Hyperball on the matrices
                nu = np.linalg.norm(u, axis=0, keepdims=True)
                nu = np.where(nu > 0, nu, 1.0)
                y = x - self.lr * R * (u / nu)
                ny = np.linalg.norm(y)
                x = R * y / ny if ny > 0 else y
            else:                                           # plain nesterov SGD on the rest
                x = x - self.other_lr * u
            out.append(x)
            bs.append(b)
        return out, dict(b=bs, radius=state["radius"])


# ---------------------------------------------------------------------------------------------- Average
class AverageAdam:
    """Bug: the running uniform average is updated with the pre-step weights x_{t-1} instead of the new iterate x_t."""

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps

    def init(self, params):
        return dict(t=0, m=[np.zeros_like(p) for p in params], v=[np.zeros_like(p) for p in params],
                    avg=[p.copy() for p in params])

    def step(self, state, params, grads):
        t = state["t"] + 1
        b1, b2 = self.b1, self.b2
        out, ms, vs, avgs = [], [], [], []
        for x, g, m, v, a in zip(params, grads, state["m"], state["v"], state["avg"]):
            a = ((t - 1) * a + x) / t
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            x = x - self.lr / (1 - b1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** t) + self.eps)
            out.append(x)
            ms.append(m)
            vs.append(v)
            avgs.append(a)
        return out, dict(t=t, m=ms, v=vs, avg=avgs)


# ---------------------------------------------------------------------------------------------- RMSprop
class RMSpropMomentum:
    """Correct: RMSprop (not centered) with L2 weight decay and a momentum buffer on g/(sqrt(v)+eps)."""

    def __init__(self, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0):
        self.lr, self.alpha, self.eps, self.wd, self.mu = lr, alpha, eps, weight_decay, momentum

    def init(self, params):
        return dict(v=[np.zeros_like(p) for p in params], b=[np.zeros_like(p) for p in params])

    def step(self, state, params, grads):
        out, vs, bs = [], [], []
        for x, g, v, b in zip(params, grads, state["v"], state["b"]):
            if self.wd != 0:
                g = g + self.wd * x
            v = self.alpha * v + (1 - self.alpha) * g * g
            b = self.mu * b + g / (np.sqrt(v) + self.eps)
            out.append(x - self.lr * b)
            vs.append(v)
            bs.append(b)
        return out, dict(v=vs, b=bs)


# ---------------------------------------------------------------------------------------------- WSD schedule
def _wsd_clamped(t, warmup, decay, total, final):
    if t <= warmup:
        return t / warmup
    if t <= total - decay:
        return 1.0
    p = min(t - (total - decay), decay) / decay
    return max(0.5 * (1.0 + math.cos(math.pi * p)), final)


class WSDMomentumSGD:
    """Bug: the cosine decay phase of WSD goes to zero and is clamped at the floor with max(., final) instead of decaying to the floor."""

    def __init__(self, lr=0.01, momentum=0.9, warmup_steps=3, decay_steps=10, total_steps=30, final=0.1):
        self.lr, self.mu = lr, momentum
        self.sched = (warmup_steps, decay_steps, total_steps, final)

    def init(self, params):
        return dict(t=0, b=[np.zeros_like(p) for p in params])

    def step(self, state, params, grads):
        t = state["t"] + 1
        lr_t = self.lr * _wsd_clamped(t, *self.sched)
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            b = g.copy() if t == 1 else self.mu * b + g
            out.append(x - lr_t * b)
            bs.append(b)
        return out, dict(t=t, b=bs)

"""Round 3 planted-bug implementations (numpy framework, (fan_in, fan_out) layout).

Each module-level object has init(params)->state and step(state, params, grads)->(params, state).
"""
import math

import numpy as np


def _z(ps):
    return [np.zeros_like(p) for p in ps]


class AdamNoVCorrection:
    """Adam(lr=0.01, beta1=0.8, beta2=0.95). BUG: the second moment v is never bias-corrected
    (only m is divided by 1 - beta1**t), so early steps are too small."""

    def __init__(self, lr=0.01, beta1=0.8, beta2=0.95, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            mhat = m / (1 - self.b1 ** t)
            out.append((x - self.lr * mhat / (np.sqrt(v) + self.eps)).astype(x.dtype))
            ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


class AdamWDecayAfterStep:
    """AdamW(lr=0.01, weight_decay=0.1). BUG: the decoupled decay multiplies the already-updated
    x_t instead of the pre-update x_{t-1} (decay applied after the Adam step: ordering)."""

    def __init__(self, lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
            x_new = x - self.lr / (1 - self.b1 ** t) * m / den
            x_new = x_new * (1 - self.lr * self.wd)
            out.append(x_new.astype(x.dtype)); ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


class SGDNesterovOldBuffer:
    """SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01). BUG: the Nesterov look-ahead
    uses the previous buffer b_{t-1} (u = g + mu*b_{t-1}) instead of the freshly updated b_t."""

    def __init__(self, lr=0.05, momentum=0.9, weight_decay=0.01):
        self.lr, self.mu, self.wd = lr, momentum, weight_decay

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            g = g + self.wd * x
            u = g + self.mu * b
            b = g.copy() if t == 1 else self.mu * b + g
            out.append((x - self.lr * u).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


class SGDNesterovCorrect:
    """SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01). CORRECT (no bug)."""

    def __init__(self, lr=0.05, momentum=0.9, weight_decay=0.01):
        self.lr, self.mu, self.wd = lr, momentum, weight_decay

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            g = g + self.wd * x
            b = g.copy() if t == 1 else self.mu * b + g
            u = g + self.mu * b
            out.append((x - self.lr * u).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


class LionUpdateMomentumFirst:
    """Lion(lr=1e-3, weight_decay=0.1). BUG: the momentum m is updated with beta2 before the sign
    is taken, so the direction interpolates g with m_t instead of m_{t-1} (ordering)."""

    def __init__(self, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.99):
        self.lr, self.wd, self.b1, self.b2 = lr, weight_decay, beta1, beta2

    def init(self, params):
        return {"m": _z(params)}

    def step(self, state, params, grads):
        out, ms = [], []
        for x, g, m in zip(params, grads, state["m"]):
            m = self.b2 * m + (1 - self.b2) * g
            u = np.sign((1 - self.b1) * g + self.b1 * m)
            out.append(((1 - self.lr * self.wd) * x - self.lr * u).astype(x.dtype)); ms.append(m)
        return out, {"m": ms}


class LionCorrect:
    """Lion(lr=1e-3, weight_decay=0.1). CORRECT (no bug)."""

    def __init__(self, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.99):
        self.lr, self.wd, self.b1, self.b2 = lr, weight_decay, beta1, beta2

    def init(self, params):
        return {"m": _z(params)}

    def step(self, state, params, grads):
        out, ms = [], []
        for x, g, m in zip(params, grads, state["m"]):
            u = np.sign((1 - self.b1) * g + self.b1 * m)
            m = self.b2 * m + (1 - self.b2) * g
            out.append(((1 - self.lr * self.wd) * x - self.lr * u).astype(x.dtype)); ms.append(m)
        return out, {"m": ms}


class RMSpropEpsInsideSqrt:
    """RMSprop(lr=0.01, alpha=0.9, momentum=0.5, eps=1e-3). BUG: eps is added inside the square root
    (sqrt(v + eps), TensorFlow-style) instead of after it (sqrt(v) + eps)."""

    def __init__(self, lr=0.01, alpha=0.9, momentum=0.5, eps=1e-3):
        self.lr, self.alpha, self.mu, self.eps = lr, alpha, momentum, eps

    def init(self, params):
        return {"v": _z(params), "b": _z(params)}

    def step(self, state, params, grads):
        out, vs, bs = [], [], []
        for x, g, v, b in zip(params, grads, state["v"], state["b"]):
            v = self.alpha * v + (1 - self.alpha) * g * g
            b = self.mu * b + g / np.sqrt(v + self.eps)
            out.append((x - self.lr * b).astype(x.dtype)); vs.append(v); bs.append(b)
        return out, {"v": vs, "b": bs}


class ClipPerParameter:
    """ClipByGlobalNorm(SGD(lr=0.05, momentum=0.9), max_norm=0.5). BUG: each gradient is clipped by its
    own Frobenius norm instead of by the global norm over all parameters (scope)."""

    def __init__(self, lr=0.05, momentum=0.9, max_norm=0.5):
        self.lr, self.mu, self.max_norm = lr, momentum, max_norm

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            n = float(np.sqrt(np.sum(np.asarray(g, np.float64) ** 2)))
            c = min(1.0, self.max_norm / n) if n > 0 else 1.0
            g = g * c
            b = g.copy() if t == 1 else self.mu * b + g
            out.append((x - self.lr * b).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


class EMADebiasOffByOne:
    """EMA(SGD(lr=0.05), decay=0.9). BUG: the debiased EMA divides by 1 - decay**(t+1) (step counter
    read before being incremented... i.e. off by one), so the average is biased toward zero.
    The params returned are the training iterate; the average is exposed via eval(state, params)."""

    def __init__(self, lr=0.05, decay=0.9):
        self.lr, self.decay = lr, decay

    def init(self, params):
        return {"t": 0, "e": _z(params), "mu": [p.copy() for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, es, mus = [], [], []
        for x, g, e in zip(params, grads, state["e"]):
            xn = (x - self.lr * g).astype(x.dtype)
            e = self.decay * e + (1 - self.decay) * xn
            mus.append((e / (1 - self.decay ** (t + 1))).astype(x.dtype))
            out.append(xn); es.append(e)
        return out, {"t": t, "e": es, "mu": mus}

    def eval(self, state, params):
        return state["mu"]


def _warmup_cosine_zero_based(t, W, T, floor):
    # BUG: 0-based warmup (t-1)/W
    if t <= W:
        return (t - 1) / W
    p = min(t - W, T - W) / (T - W)
    return floor + (1 - floor) * (1 + math.cos(math.pi * p)) / 2


class AdamWScheduleZeroBased:
    """AdamW(lr=0.01, weight_decay=0.1, schedule=warmup_cosine(3, 30, 0.1)). BUG: the warmup is 0-based,
    gamma_t = (t-1)/W, so step 1 has lr 0 and the peak is reached one step late."""

    def __init__(self, lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        lr_t = self.lr * _warmup_cosine_zero_based(t, 3, 30, 0.1)
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
            xn = (1 - lr_t * self.wd) * x - lr_t / (1 - self.b1 ** t) * m / den
            out.append(xn.astype(x.dtype)); ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


adam_no_v_correction = AdamNoVCorrection()
adamw_decay_after_step = AdamWDecayAfterStep()
sgd_nesterov_old_buffer = SGDNesterovOldBuffer()
sgd_nesterov_correct = SGDNesterovCorrect()
lion_update_momentum_first = LionUpdateMomentumFirst()
lion_correct = LionCorrect()
rmsprop_eps_inside_sqrt = RMSpropEpsInsideSqrt()
clip_per_parameter = ClipPerParameter()
ema_debias_off_by_one = EMADebiasOffByOne()
adamw_schedule_zero_based = AdamWScheduleZeroBased()

"""Round 6 of the planted-bug trial: numpy optimizers written from the papers' equations.

Each class is usable as the optimizer object itself (``Name.init(params)``, ``Name.step(state, params,
grads)``): a metaclass forwards those two attributes to a default instance built from the class-level
hyperparameters. Matrices are in refopt's (fan_in, fan_out) layout. Sixteen classes carry exactly one
bug (stated in their docstring); four are correct.
"""
import math

import numpy as np


# ---- plumbing ------------------------------------------------------------------------------------------
class _DefaultInstance(type):
    """``Cls.init`` / ``Cls.step`` are the bound methods of a default instance ``Cls()``."""

    def _default(cls):
        inst = cls.__dict__.get("_instance")
        if inst is None:
            inst = cls()
            setattr(cls, "_instance", inst)
        return inst

    @property
    def init(cls):
        return cls._default().init

    @property
    def step(cls):
        return cls._default().step


class Optimizer(metaclass=_DefaultInstance):
    """Per-parameter optimizers: subclasses give ``init_one(p)`` and ``step_one(t, s, p, g)``."""

    def init(self, params):
        return {"t": 0, "per": [self.init_one(np.asarray(p)) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        new_params, new_per = [], []
        for s, p, g in zip(state["per"], params, grads):
            p = np.asarray(p)
            g = np.asarray(g)
            s = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            x = self.step_one(t, s, p.astype(np.float64), g.astype(np.float64))
            new_params.append(np.asarray(x, dtype=np.float64).astype(p.dtype))
            new_per.append(s)
        return new_params, {"t": t, "per": new_per}

    def init_one(self, p):
        raise NotImplementedError

    def step_one(self, t, s, x, g):
        raise NotImplementedError


def fro(a):
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


# ---- schedules (1-indexed step t) ---------------------------------------------------------------------
def warmup_cosine(t, warmup, total, floor=0.0):
    if warmup > 0 and t <= warmup:
        return t / warmup
    d = total - warmup
    if d == 0:
        return 1.0
    k = min(t - warmup, d)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * k / d))


def wsd(t, warmup, decay, total, final=0.0):
    if warmup > 0 and t <= warmup:
        return t / warmup
    if t <= total - decay:
        return 1.0
    k = min(t - (total - decay), decay)
    return 1.0 - (1.0 - final) * k / decay


# ---- Newton-Schulz msign for Muon ------------------------------------------------------------------
def newton_schulz5(G, steps=5, a=3.4445, b=-4.7750, c=2.0315):
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    n = fro(X)
    if n == 0.0:
        return np.zeros_like(G)
    X = X / n
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.T if tall else X


# =========================================================================================================
# 1. SGD with Nesterov momentum
class SGDNesterovStaleBuffer(Optimizer):
    """Bug: the Nesterov look-ahead adds momentum times the previous buffer b_{t-1} instead of the updated buffer b_t."""

    lr = 0.05
    momentum = 0.9

    def init_one(self, p):
        return {"buf": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        old = s["buf"]
        buf = g.copy() if t == 1 else self.momentum * old + g
        s["buf"] = buf
        u = g + self.momentum * old          # BUG: should be g + momentum * buf
        return x - self.lr * u


# 2. Adam with warmup + cosine schedule
class AdamScheduleZeroBased(Optimizer):
    """Bug: the warmup-cosine schedule is evaluated at the 0-based step t-1, so the first step has lr 0 and the whole schedule lags by one step."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64), "v": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        k = t - 1
        gamma = (k / 5) if k < 5 else warmup_cosine(k, 5, 30, 0.1)   # BUG: 0-based step
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        s["m"], s["v"] = m, v
        bc1 = 1 - self.beta1 ** t
        bc2 = 1 - self.beta2 ** t
        return x - (self.lr * gamma / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + self.eps)


# 3. AdamW with WSD schedule
class AdamWDecayIgnoresSchedule(Optimizer):
    """Bug: the decoupled weight decay multiplies the peak lr, not the scheduled lr*gamma_t, so decay is too strong during warmup and the final decay phase."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8
    weight_decay = 0.1

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64), "v": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        gamma = wsd(t, 3, 10, 30)
        lr_t = self.lr * gamma
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        s["m"], s["v"] = m, v
        bc1 = 1 - self.beta1 ** t
        bc2 = 1 - self.beta2 ** t
        x = x * (1 - self.lr * self.weight_decay)     # BUG: should be lr_t * weight_decay
        return x - (lr_t / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + self.eps)


# 4. centered RMSprop
class RMSpropCenteredStaleMean(Optimizer):
    """Bug: the centered variance subtracts the square of the previous gradient average a_{t-1} instead of the updated a_t."""

    lr = 0.01
    alpha = 0.9
    eps = 1e-8

    def init_one(self, p):
        return {"square_avg": np.zeros_like(p, dtype=np.float64), "grad_avg": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        v = self.alpha * s["square_avg"] + (1 - self.alpha) * g * g
        a_old = s["grad_avg"]
        a = self.alpha * a_old + (1 - self.alpha) * g
        s["square_avg"], s["grad_avg"] = v, a
        w = v - a_old * a_old                          # BUG: should use a * a
        return x - self.lr * g / (np.sqrt(w) + self.eps)


# 5. Adagrad with lr decay
class AdagradLrDecayOffByOne(Optimizer):
    """Bug: the learning-rate decay divides by 1 + t*lr_decay instead of 1 + (t-1)*lr_decay (one step too much decay)."""

    lr = 0.05
    lr_decay = 0.01
    eps = 1e-10

    def init_one(self, p):
        return {"sum": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        ssum = s["sum"] + g * g
        s["sum"] = ssum
        clr = self.lr / (1 + t * self.lr_decay)       # BUG: should be (t - 1)
        return x - clr * g / (np.sqrt(ssum) + self.eps)


# 6. Adamax
class AdamaxBiasCorrectedNorm(Optimizer):
    """Bug: the infinity-norm accumulator u is bias-corrected by 1 - beta2^t like Adam's second moment, although it needs no correction."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8

    def init_one(self, p):
        return {"exp_avg": np.zeros_like(p, dtype=np.float64), "exp_inf": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        m = self.beta1 * s["exp_avg"] + (1 - self.beta1) * g
        u = np.maximum(self.beta2 * s["exp_inf"], np.abs(g) + self.eps)
        s["exp_avg"], s["exp_inf"] = m, u
        u_hat = u / (1 - self.beta2 ** t)              # BUG: no bias correction of u
        return x - (self.lr / (1 - self.beta1 ** t)) * m / u_hat


# 7. Yogi
class YogiZeroInit(Optimizer):
    """Bug: the moments m and v start at 0 instead of the initial accumulator value 1e-6."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-3

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64),      # BUG: should be full of 1e-6
                "v": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        g2 = g * g
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = s["v"] - (1 - self.beta2) * np.sign(s["v"] - g2) * g2
        s["m"], s["v"] = m, v
        m_hat = m / (1 - self.beta1 ** t)
        v_hat = v / (1 - self.beta2 ** t)
        return x - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


# 8. Lion
class LionBetasSwapped(Optimizer):
    """Bug: beta1 and beta2 are swapped: the sign is taken of the beta2-interpolation and the momentum is tracked with beta1."""

    lr = 1e-3
    beta1 = 0.9
    beta2 = 0.99
    weight_decay = 0.1

    def init_one(self, p):
        return {"exp_avg": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        m = s["exp_avg"]
        u = np.sign((1 - self.beta2) * g + self.beta2 * m)      # BUG: beta1 here
        s["exp_avg"] = (1 - self.beta1) * g + self.beta1 * m    # BUG: beta2 here
        return x * (1 - self.lr * self.weight_decay) - self.lr * u


# 9. Muon (hidden matrices) + AdamW (the rest)
class _MuonAdamWBase(Optimizer):
    muon_lr = 0.02
    momentum = 0.95
    muon_wd = 0.0
    adam_lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8
    adam_wd = 0.01

    def init_one(self, p):
        if p.ndim == 2:
            return {"kind": "muon", "momentum_buffer": np.zeros_like(p, dtype=np.float64)}
        return {"kind": "adamw", "m": np.zeros_like(p, dtype=np.float64), "v": np.zeros_like(p, dtype=np.float64)}

    def scale(self, shape):
        fan_in, fan_out = shape
        return math.sqrt(fan_out / fan_in)

    def step_one(self, t, s, x, g):
        if s["kind"] == "muon":
            mu = self.momentum
            m = mu * s["momentum_buffer"] + (1 - mu) * g
            s["momentum_buffer"] = m
            M = (1 - mu) * g + mu * m
            O = newton_schulz5(M)
            x = x * (1 - self.muon_lr * self.muon_wd)
            return x - self.muon_lr * self.scale(x.shape) * O
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        s["m"], s["v"] = m, v
        bc1 = 1 - self.beta1 ** t
        bc2 = 1 - self.beta2 ** t
        x = x * (1 - self.adam_lr * self.adam_wd)
        return x - (self.adam_lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + self.eps)


class MuonScaleTransposed(_MuonAdamWBase):
    """Bug: the spectral scale is computed as sqrt(fan_in/fan_out), reading the (fan_in, fan_out) matrix as torch's (out, in), so it is inverted for non-square matrices."""

    def scale(self, shape):
        out_dim, in_dim = shape                        # BUG: refopt's layout is (fan_in, fan_out)
        return math.sqrt(out_dim / in_dim)


# 10. LAMB
class LAMBRatioBeforeDecay(Optimizer):
    """Bug: the trust ratio ||x||/||u|| is computed from the Adam direction before the weight-decay term is added, instead of from the full update u + lambda x."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-6
    weight_decay = 0.05

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64), "v": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        s["m"], s["v"] = m, v
        adam = (m / (1 - self.beta1 ** t)) / (np.sqrt(v / (1 - self.beta2 ** t)) + self.eps)
        u = adam + self.weight_decay * x
        nx, na = fro(x), fro(adam)                     # BUG: should be the norm of u
        ratio = 1.0 if nx == 0.0 or na == 0.0 else nx / na
        return x - self.lr * ratio * u


# 11. LARS
class LARSMomentumBeforeRatio(Optimizer):
    """Bug: the momentum accumulates the raw update g + lambda x and the trust ratio and lr scale the momentum buffer, instead of accumulating the ratio-scaled steps."""

    lr = 1.0
    momentum = 0.9
    weight_decay = 1e-3
    trust_coefficient = 1e-3

    def init_one(self, p):
        return {"momentum_buffer": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        u = g + self.weight_decay * x
        nx, nu = fro(x), fro(u)
        ratio = 1.0 if nx == 0.0 or nu == 0.0 else self.trust_coefficient * nx / nu
        b = self.momentum * s["momentum_buffer"] + u       # BUG: should accumulate lr * ratio * u
        s["momentum_buffer"] = b
        return x - self.lr * ratio * b


# 12. RAdam
class RAdamThresholdFour(Optimizer):
    """Bug: the rectified step is taken when rho_t > 4 (the paper's finite-variance bound) instead of the rule's threshold rho_t > 5."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8
    threshold = 4.0                                    # BUG: should be 5.0

    def init_one(self, p):
        return {"exp_avg": np.zeros_like(p, dtype=np.float64), "exp_avg_sq": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        b1, b2 = self.beta1, self.beta2
        m = b1 * s["exp_avg"] + (1 - b1) * g
        v = b2 * s["exp_avg_sq"] + (1 - b2) * g * g
        s["exp_avg"], s["exp_avg_sq"] = m, v
        m_hat = m / (1 - b1 ** t)
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        if rho_t > self.threshold:
            r = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            u = r * m_hat * math.sqrt(1 - b2 ** t) / (np.sqrt(v) + self.eps)
        else:
            u = m_hat
        return x - self.lr * u


# 13. NovoGrad
class NovoGradFirstMomentEMA(Optimizer):
    """Bug: the layer-wise second moment starts from v_0 = 0 and takes the EMA on step 1, v_1 = (1-beta2)||g_1||^2, instead of v_1 = ||g_1||^2."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.25
    eps = 1e-6
    weight_decay = 0.01

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64), "v": 0.0}

    def step_one(self, t, s, x, g):
        n2 = fro(g) ** 2
        v = self.beta2 * s["v"] + (1 - self.beta2) * n2    # BUG: v_1 should be n2
        s["v"] = v
        u = g / (math.sqrt(v) + self.eps) + self.weight_decay * x
        m = u if t == 1 else self.beta1 * s["m"] + u
        s["m"] = m
        return x - self.lr * m


# 14. AdaBelief
class AdaBeliefStaleMoment(Optimizer):
    """Bug: the belief term (g - m)^2 uses the previous first moment m_{t-1} instead of the updated m_t."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-16
    eps_root = 1e-16

    def init_one(self, p):
        return {"m": np.zeros_like(p, dtype=np.float64), "s": np.zeros_like(p, dtype=np.float64)}

    def step_one(self, t, s, x, g):
        m_old = s["m"]
        m = self.beta1 * m_old + (1 - self.beta1) * g
        sv = self.beta2 * s["s"] + (1 - self.beta2) * (g - m_old) ** 2 + self.eps_root   # BUG: g - m
        s["m"], s["s"] = m, sv
        m_hat = m / (1 - self.beta1 ** t)
        return x - self.lr * m_hat / (np.sqrt(sv / (1 - self.beta2 ** t)) + self.eps)


# 15. Schedule-Free AdamW
class ScheduleFreeAdamWInterpolationSwapped(Optimizer):
    """Bug: the gradient point is y = (1-beta1) x + beta1 z, with beta1 weighting z instead of the average x."""

    lr = 0.01
    beta1 = 0.9
    beta2 = 0.999
    eps = 1e-8
    warmup_steps = 5
    weight_lr_power = 2.0

    def init(self, params):
        per = [{"z": np.array(p, dtype=np.float64), "x": np.array(p, dtype=np.float64),
                "v": np.zeros(np.shape(p), np.float64)} for p in params]
        return {"t": 0, "lr_max": -1.0, "weight_sum": 0.0, "per": per}

    def step(self, state, params, grads):
        t = state["t"] + 1
        warm = t / self.warmup_steps if t <= self.warmup_steps else 1.0
        lr = self.lr * warm
        lr_max = max(lr, state["lr_max"])
        weight = lr_max ** self.weight_lr_power
        weight_sum = state["weight_sum"] + weight
        c = weight / weight_sum if weight_sum != 0 else 0.0
        bc2 = 1 - self.beta2 ** t
        new_params, per = [], []
        for s, p, g in zip(state["per"], params, grads):
            g = np.asarray(g, dtype=np.float64)
            v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
            z = s["z"] - lr * g / (np.sqrt(v / bc2) + self.eps)
            x = (1 - c) * s["x"] + c * z
            y = (1 - self.beta1) * x + self.beta1 * z        # BUG: should be beta1 * x + (1 - beta1) * z
            new_params.append(y.astype(np.asarray(p).dtype))
            per.append({"z": z, "x": x, "v": v})
        return new_params, {"t": t, "lr_max": lr_max, "weight_sum": weight_sum, "per": per}


# 16. SGD with momentum under clipping by the global norm
class ClipPerTensorSGD(Optimizer):
    """Bug: each gradient is clipped by its own norm, min(1, max_norm/||g_i||), instead of all gradients by their global norm."""

    lr = 0.1
    momentum = 0.9
    max_norm = 0.1

    def init(self, params):
        return {"t": 0, "bufs": [np.zeros(np.shape(p), np.float64) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gs = []
        for g in grads:
            g = np.asarray(g, dtype=np.float64)
            n = fro(g)                                        # BUG: should be the global norm of all grads
            gs.append(g * min(1.0, self.max_norm / n) if n > 0 else g)
        new_params, bufs = [], []
        for p, g, b in zip(params, gs, state["bufs"]):
            b = g.copy() if t == 1 else self.momentum * b + g
            new_params.append((np.asarray(p, dtype=np.float64) - self.lr * b).astype(np.asarray(p).dtype))
            bufs.append(b)
        return new_params, {"t": t, "bufs": bufs}


# =========================================================================================================
# correct controls
class AdanCorrect(Optimizer):
    """correct"""

    lr = 0.01
    beta1 = 0.98
    beta2 = 0.92
    beta3 = 0.99
    eps = 1e-8
    eps_root = 1e-8
    weight_decay = 0.02

    def init_one(self, p):
        z = np.zeros_like(p, dtype=np.float64)
        return {"m": z.copy(), "v": z.copy(), "n": z.copy(), "prev_grad": z.copy()}

    def step_one(self, t, s, x, g):
        d = np.zeros_like(g) if t == 1 else g - s["prev_grad"]
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * d
        q = g + (1 - self.beta2) * d
        n = self.beta3 * s["n"] + (1 - self.beta3) * q * q
        s.update(m=m, v=v, n=n, prev_grad=g.copy())
        m_hat = m / (1 - self.beta1 ** t)
        v_hat = v / (1 - self.beta2 ** t)
        n_hat = n / (1 - self.beta3 ** t)
        u = (m_hat + (1 - self.beta2) * v_hat) / (np.sqrt(n_hat + self.eps_root) + self.eps)
        return x - self.lr * (u + self.weight_decay * x)


class RpropCorrect(Optimizer):
    """correct"""

    lr = 0.01
    eta_minus = 0.5
    eta_plus = 1.2
    step_min = 1e-6
    step_max = 50.0

    def init_one(self, p):
        return {"prev": np.zeros_like(p, dtype=np.float64), "step_size": np.full(p.shape, self.lr, np.float64)}

    def step_one(self, t, s, x, g):
        p = g * s["prev"]
        st = s["step_size"]
        factor = np.where(p > 0, self.eta_plus, np.where(p < 0, self.eta_minus, 1.0))
        st = np.clip(st * factor, self.step_min, self.step_max)
        g = np.where(p < 0, 0.0, g)
        s["prev"], s["step_size"] = g, st
        return x - np.sign(g) * st


class MuonAdamWCorrect(_MuonAdamWBase):
    """correct"""

    muon_wd = 0.1


class ScheduleFreeSGDCorrect(Optimizer):
    """correct"""

    lr = 0.1
    beta = 0.9
    warmup_steps = 5
    weight_lr_power = 2.0

    def init(self, params):
        per = [{"z": np.array(p, dtype=np.float64), "x": np.array(p, dtype=np.float64)} for p in params]
        return {"t": 0, "lr_max": -1.0, "weight_sum": 0.0, "per": per}

    def step(self, state, params, grads):
        t = state["t"] + 1
        warm = t / self.warmup_steps if t <= self.warmup_steps else 1.0
        lr = self.lr * warm
        lr_max = max(lr, state["lr_max"])
        weight = lr_max ** self.weight_lr_power
        weight_sum = state["weight_sum"] + weight
        c = weight / weight_sum if weight_sum != 0 else 0.0
        new_params, per = [], []
        for s, p, g in zip(state["per"], params, grads):
            g = np.asarray(g, dtype=np.float64)
            z = s["z"] - lr * g
            x = (1 - c) * s["x"] + c * z
            y = self.beta * x + (1 - self.beta) * z
            new_params.append(y.astype(np.asarray(p).dtype))
            per.append({"z": z, "x": x})
        return new_params, {"t": t, "lr_max": lr_max, "weight_sum": weight_sum, "per": per}

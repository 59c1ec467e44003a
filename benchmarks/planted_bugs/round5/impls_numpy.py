"""Round 5 of the planted-bug trial: numpy optimizer implementations, refopt's layout (a matrix is
(fan_in, fan_out)). Each class is usable as an object itself: ``NAME.init(params) -> state`` and
``NAME.step(state, params, grads) -> (new_params, new_state)``; the hyperparameters are the class-level
defaults (they match the rule expression of ``manifest.json``). Sixteen classes carry exactly one bug each
(their docstrings say which); four are correct implementations (false-alarm controls).
"""
from __future__ import annotations

import math

import numpy as np


# ---- plumbing ---------------------------------------------------------------------------------------------
class _DefaultInstance(type):
    """Metaclass: ``Cls.init`` / ``Cls.step`` forward to a default instance ``Cls()``, so the class object
    itself can be handed over as the optimizer."""

    def _default(cls):
        inst = cls.__dict__.get("_default_instance")
        if inst is None:
            inst = cls()
            cls._default_instance = inst
        return inst

    @property
    def init(cls):
        return cls._default().init

    @property
    def step(cls):
        return cls._default().step


class _PerArray(metaclass=_DefaultInstance):
    """An optimizer stepping each array on its own: subclasses define ``init_slot(x) -> dict`` and
    ``update_one(t, x, g, slot) -> (new_x, new_slot)``; the state is ``{"t": steps taken, "slots": [...]}``."""

    def init(self, params):
        return {"t": 0, "slots": [self.init_slot(np.asarray(p)) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        new_params, new_slots = [], []
        for p, g, slot in zip(params, grads, state["slots"]):
            p, g = np.asarray(p), np.asarray(g)
            x, slot = self.update_one(t, p, g, dict(slot))
            new_params.append(np.asarray(x).astype(p.dtype, copy=False))
            new_slots.append(slot)
        return new_params, {"t": t, "slots": new_slots}

    def init_slot(self, x):
        return {}


def _warmup_cosine(t, warmup, total, floor):
    """Linear warmup t/W for t <= W, then cosine decay to ``floor`` at step ``total`` (held after)."""
    if warmup > 0 and t <= warmup:
        return t / warmup
    decay = total - warmup
    k = t - warmup
    if k >= decay:
        return float(floor)
    return floor + (1.0 - floor) * (0.5 * (1.0 + math.cos(math.pi * (k / decay))))


def _norm(a):
    return float(np.sqrt(np.sum(np.square(a, dtype=np.float64))))


# ---- 1. Adam ----------------------------------------------------------------------------------------------
class AdamBiasAhead(_PerArray):
    """Bug: the bias corrections use beta**(t+1) instead of beta**t (the step counter is advanced once more
    before they are computed), so every correction is one step ahead."""

    lr, beta1, beta2, eps = 0.01, 0.9, 0.99, 1e-8

    def init_slot(self, x):
        return {"exp_avg": np.zeros_like(x), "exp_avg_sq": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        m = self.beta1 * s["exp_avg"] + (1 - self.beta1) * g
        v = self.beta2 * s["exp_avg_sq"] + (1 - self.beta2) * g * g
        k = t + 1
        bc1 = 1 - self.beta1 ** k
        bc2 = 1 - self.beta2 ** k
        x = x - (self.lr / bc1) * (m / (np.sqrt(v) / math.sqrt(bc2) + self.eps))
        return x, {"exp_avg": m, "exp_avg_sq": v}


# ---- 2. AdamW: the schedule does not reach the decay --------------------------------------------------
class AdamWScheduleSkipsDecay(_PerArray):
    """Bug: the warmup-cosine schedule multiplies the Adam step but the decoupled weight decay uses the peak
    lr (x *= 1 - lr*wd instead of 1 - lr*gamma_t*wd)."""

    lr, beta1, beta2, eps, weight_decay = 0.01, 0.9, 0.999, 1e-8, 0.1
    warmup, total, floor = 5, 30, 0.1

    def init_slot(self, x):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        gamma = _warmup_cosine(t, self.warmup, self.total, self.floor)
        lr_t = self.lr * gamma
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        bc1, bc2 = 1 - self.beta1 ** t, 1 - self.beta2 ** t
        decay = 1.0 - self.lr * self.weight_decay
        x = decay * x - (lr_t / bc1) * (m / (np.sqrt(v) / math.sqrt(bc2) + self.eps))
        return x, {"m": m, "v": v}


class AdamWScheduled(_PerArray):
    """Correct: AdamW (decoupled decay lr*gamma_t*wd on x_{t-1}) with a warmup-cosine schedule."""

    lr, beta1, beta2, eps, weight_decay = 0.02, 0.85, 0.999, 1e-8, 0.05
    warmup, total, floor = 5, 30, 0.1

    def init_slot(self, x):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        gamma = _warmup_cosine(t, self.warmup, self.total, self.floor)
        lr_t = self.lr * gamma
        m = self.beta1 * s["m"] + (1 - self.beta1) * g
        v = self.beta2 * s["v"] + (1 - self.beta2) * g * g
        bc1, bc2 = 1 - self.beta1 ** t, 1 - self.beta2 ** t
        decay = 1.0 - lr_t * self.weight_decay
        x = decay * x - (lr_t / bc1) * (m / (np.sqrt(v) / math.sqrt(bc2) + self.eps))
        return x, {"m": m, "v": v}


# ---- 3. SGD Nesterov --------------------------------------------------------------------------------------
class SGDNesterovStaleBuffer(_PerArray):
    """Bug: the Nesterov look-ahead uses the previous momentum buffer, u = g + mu*b_{t-1}, instead of the
    updated one, u = g + mu*b_t."""

    lr, momentum = 0.05, 0.9

    def init_slot(self, x):
        return {"momentum_buffer": None}

    def update_one(self, t, x, g, s):
        old = s["momentum_buffer"]
        if old is None:
            buf = g.copy()
            look = g
        else:
            buf = self.momentum * old + g
            look = g + self.momentum * old
        return x - self.lr * look, {"momentum_buffer": buf}


class SGDNesterovL2(_PerArray):
    """Correct: SGD with L2 decay in the gradient, momentum (b_1 = g_1) and Nesterov's look-ahead."""

    lr, momentum, weight_decay = 0.03, 0.8, 0.01

    def init_slot(self, x):
        return {"momentum_buffer": None}

    def update_one(self, t, x, g, s):
        g = g + self.weight_decay * x
        old = s["momentum_buffer"]
        buf = g.copy() if old is None else self.momentum * old + g
        return x - self.lr * (g + self.momentum * buf), {"momentum_buffer": buf}


# ---- 4. Adadelta ------------------------------------------------------------------------------------------
class AdadeltaSwappedRho(_PerArray):
    """Bug: the running average of squared updates weighs the old value by (1 - rho) and the new dx**2 by
    rho (rho and 1 - rho swapped in the E[dx^2] accumulator)."""

    lr, rho, eps = 1.0, 0.9, 1e-6

    def init_slot(self, x):
        return {"square_avg": np.zeros_like(x), "acc_delta": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        sq = self.rho * s["square_avg"] + (1 - self.rho) * g * g
        dx = np.sqrt(s["acc_delta"] + self.eps) / np.sqrt(sq + self.eps) * g
        acc = (1 - self.rho) * s["acc_delta"] + self.rho * dx * dx
        return x - self.lr * dx, {"square_avg": sq, "acc_delta": acc}


# ---- 5. RAdam ---------------------------------------------------------------------------------------------
class RAdamWarmupRawMomentum(_PerArray):
    """Bug: in the early steps where the variance is not tractable (rho_t <= 5) the step uses the raw first
    moment m_t instead of the bias-corrected m_t / (1 - beta1**t)."""

    lr, beta1, beta2, eps, threshold = 0.01, 0.9, 0.99, 1e-8, 5.0

    def init_slot(self, x):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        b1, b2 = self.beta1, self.beta2
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * b2 ** t / bc2
        if rho_t > self.threshold:
            r = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            u = (m / bc1) * (math.sqrt(bc2) / (np.sqrt(v) + self.eps)) * r
        else:
            u = m
        return x - self.lr * u, {"m": m, "v": v}


# ---- 6. Lion ----------------------------------------------------------------------------------------------
class LionUpdatedMomentumSign(_PerArray):
    """Bug: the momentum is updated first and the sign is then taken of (1 - beta1) g + beta1 m_t, i.e. the
    interpolation reads the new momentum instead of m_{t-1}."""

    lr, beta1, beta2, weight_decay = 1e-3, 0.9, 0.99, 0.1

    def init_slot(self, x):
        return {"exp_avg": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        m = self.beta2 * s["exp_avg"] + (1 - self.beta2) * g
        u = np.sign((1 - self.beta1) * g + self.beta1 * m)
        x = (1 - self.lr * self.weight_decay) * x - self.lr * u
        return x, {"exp_avg": m}


# ---- 7. LAMB ----------------------------------------------------------------------------------------------
class LAMBRatioWithoutDecay(_PerArray):
    """Bug: the trust ratio ||x|| / ||u|| is computed from the Adam direction alone, before the weight-decay
    term wd*x is added, and then applied to the direction including the decay."""

    lr, beta1, beta2, eps, weight_decay = 0.01, 0.9, 0.999, 1e-6, 0.1

    def init_slot(self, x):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        b1, b2 = self.beta1, self.beta2
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        adam = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + self.eps)
        nx, na = _norm(x), _norm(adam)
        ratio = nx / na if nx > 0 and na > 0 else 1.0
        u = adam + self.weight_decay * x
        return x - self.lr * ratio * u, {"m": m, "v": v}


# ---- 8. LARS ----------------------------------------------------------------------------------------------
class LARSGlobalTrustRatio(_PerArray):
    """Bug: the trust ratio is computed once from the norms of all parameters and all updates together
    (a global ratio) instead of per layer (per array)."""

    lr, momentum, weight_decay, trust_coefficient, eps = 0.5, 0.9, 1e-3, 0.01, 0.0

    def init_slot(self, x):
        return {"trace": np.zeros_like(x)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        xs = [np.asarray(p) for p in params]
        us = [np.asarray(g) + self.weight_decay * x for g, x in zip(grads, xs)]
        nx = math.sqrt(sum(_norm(x) ** 2 for x in xs))
        nu = math.sqrt(sum(_norm(u) ** 2 for u in us))
        ratio = 1.0 if nx == 0 or nu == 0 else self.trust_coefficient * nx / (nu + self.eps)
        new_params, new_slots = [], []
        for x, u, slot in zip(xs, us, state["slots"]):
            b = self.momentum * slot["trace"] + self.lr * ratio * u
            new_params.append((x - b).astype(x.dtype, copy=False))
            new_slots.append({"trace": b})
        return new_params, {"t": t, "slots": new_slots}


# ---- 9. Adafactor -----------------------------------------------------------------------------------------
class AdafactorSumNormalised(_PerArray):
    """Bug: the factored second moment R C / mean(R) is normalised by the sum of the row factor instead of
    its mean (R and C are kept as means), so the estimate is fan_in times too small for matrices."""

    lr, beta2_decay, eps2, d = 1e-2, -0.8, 1e-3, 1.0

    @staticmethod
    def _axes(ndim):
        # torch factors the last two axes of its (out, in, k_1, ...) layout; in refopt's
        # (k_1, ..., fan_in, fan_out) layout those are the axes below (for a matrix: a = 1, b = 0).
        perm = (ndim - 1, ndim - 2, *range(ndim - 2))
        return perm[ndim - 2], perm[ndim - 1]

    def init_slot(self, x):
        if x.ndim >= 2:
            a, b = self._axes(x.ndim)
            row = tuple(1 if i == a else n for i, n in enumerate(x.shape))
            col = tuple(1 if i == b else n for i, n in enumerate(x.shape))
            return {"row": np.zeros(row, x.dtype), "col": np.zeros(col, x.dtype)}
        return {"v": np.zeros_like(x)}

    @staticmethod
    def _lerp(a, b, w):
        if abs(w) < 0.5:
            return a + w * (b - a)
        return b - (b - a) * (1.0 - w)

    @staticmethod
    def _rms(a):
        return _norm(a) / math.sqrt(a.size) if a.size else 0.0

    def update_one(self, t, x, g, s):
        eps1 = float(np.finfo(x.dtype).eps)
        w = float(t) ** self.beta2_decay
        rho = min(self.lr, 1.0 / math.sqrt(t))
        alpha = max(self.eps2, self._rms(x)) * rho
        if x.ndim >= 2:
            a, b = self._axes(x.ndim)
            g2 = np.square(g, dtype=np.float64)
            row = self._lerp(s["row"], (np.sum(g2, axis=a, keepdims=True) / g.shape[a]).astype(x.dtype), w)
            col = self._lerp(s["col"], (np.sum(g2, axis=b, keepdims=True) / g.shape[b]).astype(x.dtype), w)
            norm = np.sum(row, axis=b, keepdims=True)
            vhat = col * row / np.maximum(norm, eps1)
            new = {"row": row, "col": col}
        else:
            v = self._lerp(s["v"], g * g, w)
            vhat = v
            new = {"v": v}
        u = g / np.sqrt(np.maximum(vhat, eps1 * eps1))
        den = max(1.0, self._rms(u) / self.d)
        return x - (alpha / den) * u, new


# ---- 10. NovoGrad -----------------------------------------------------------------------------------------
class NovoGradNoFirstStepInit(_PerArray):
    """Bug: the layer second moment starts at 0 and is averaged from the first step, v_1 = (1 - beta2)
    ||g_1||^2, instead of being initialised to v_1 = ||g_1||^2."""

    lr, beta1, beta2, eps, weight_decay = 0.01, 0.9, 0.25, 1e-6, 1e-3

    def init_slot(self, x):
        return {"m": np.zeros_like(x), "v": 0.0}

    def update_one(self, t, x, g, s):
        v = self.beta2 * s["v"] + (1 - self.beta2) * _norm(g) ** 2
        u = g / (math.sqrt(v) + self.eps) + self.weight_decay * x
        m = self.beta1 * s["m"] + u
        return x - self.lr * m, {"m": m, "v": v}


# ---- 11. AdaBelief ----------------------------------------------------------------------------------------
class AdaBeliefStaleMean(_PerArray):
    """Bug: the belief deviation is taken from the previous first moment, (g_t - m_{t-1})**2, instead of the
    updated one, (g_t - m_t)**2."""

    lr, beta1, beta2, eps, eps_root = 0.01, 0.9, 0.999, 1e-16, 1e-16

    def init_slot(self, x):
        return {"mu": np.zeros_like(x), "nu": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        b1, b2 = self.beta1, self.beta2
        dev = g - s["mu"]
        m = b1 * s["mu"] + (1 - b1) * g
        nu = b2 * s["nu"] + (1 - b2) * dev * dev + self.eps_root
        u = (m / (1 - b1 ** t)) / (np.sqrt(nu / (1 - b2 ** t)) + self.eps)
        return x - self.lr * u, {"mu": m, "nu": nu}


# ---- 12. Adan ---------------------------------------------------------------------------------------------
class AdanZeroPrevGrad(_PerArray):
    """Bug: the previous gradient is initialised to zeros, so the first gradient difference is d_1 = g_1
    instead of 0."""

    lr, beta1, beta2, beta3, eps, eps_root, weight_decay = 0.01, 0.98, 0.92, 0.99, 1e-8, 1e-8, 0.02

    def init_slot(self, x):
        z = np.zeros_like(x)
        return {"m": z, "v": z.copy(), "n": z.copy(), "prev_grad": z.copy()}

    def update_one(self, t, x, g, s):
        b1, b2, b3 = self.beta1, self.beta2, self.beta3
        diff = g - s["prev_grad"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * diff
        sq = g + (1 - b2) * diff
        n = b3 * s["n"] + (1 - b3) * sq * sq
        u = (m / (1 - b1 ** t) + (1 - b2) * (v / (1 - b2 ** t))) / (np.sqrt(n / (1 - b3 ** t) + self.eps_root)
                                                                   + self.eps)
        x = x - self.lr * (u + self.weight_decay * x)
        return x, {"m": m, "v": v, "n": n, "prev_grad": g.copy()}


# ---- 13. Rprop --------------------------------------------------------------------------------------------
class RpropKeepsFlippedGrad(_PerArray):
    """Bug: after a sign change the gradient is not set to zero, so the entry still moves on the flip and
    the next step compares its sign with the flipped gradient."""

    lr, eta_minus, eta_plus, step_min, step_max = 1e-2, 0.5, 1.2, 1e-6, 50.0

    def init_slot(self, x):
        return {"prev": np.zeros_like(x), "step_size": np.full_like(x, self.lr)}

    def update_one(self, t, x, g, s):
        p = g * s["prev"]
        factor = np.where(p > 0, self.eta_plus, np.where(p < 0, self.eta_minus, 1.0))
        st = np.clip(s["step_size"] * factor, self.step_min, self.step_max)
        return x - np.sign(g) * st, {"prev": g.copy(), "step_size": st}


# ---- 14. Clipping -----------------------------------------------------------------------------------------
class ClipPerTensorSGD(_PerArray):
    """Bug: each gradient is clipped by its own norm (per tensor) instead of by the global norm of all
    gradients together, before SGD with momentum."""

    lr, momentum, max_norm = 0.05, 0.9, 0.5

    def init_slot(self, x):
        return {"buf": None}

    def update_one(self, t, x, g, s):
        n = _norm(g)
        if n > self.max_norm:
            g = g * (self.max_norm / n)
        buf = g.copy() if s["buf"] is None else self.momentum * s["buf"] + g
        return x - self.lr * buf, {"buf": buf}


# ---- 15. Muon + AdamW -------------------------------------------------------------------------------------
class MuonScaleTransposed(_PerArray):
    """Bug: the Muon shape scale is read in torch's (out, in) convention, sqrt(shape[0]/shape[1]), on
    refopt's (fan_in, fan_out) matrices, giving sqrt(fan_in/fan_out) instead of sqrt(fan_out/fan_in)."""

    muon_lr, muon_momentum = 0.02, 0.95
    adam_lr, beta1, beta2, eps, weight_decay = 0.01, 0.9, 0.999, 1e-8, 0.01

    def init_slot(self, x):
        if x.ndim == 2:
            return {"kind": "muon", "mom": np.zeros_like(x)}
        return {"kind": "adamw", "m": np.zeros_like(x), "v": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        if s["kind"] == "muon":
            mu = self.muon_momentum
            mom = mu * s["mom"] + (1 - mu) * g
            M = mu * mom + (1 - mu) * g
            U, sv, Vt = np.linalg.svd(M, full_matrices=False)
            keep = sv > (max(M.shape) * np.finfo(M.dtype).eps * (sv[0] if sv.size else 0.0))
            O = U[:, keep] @ Vt[keep, :]      # polar factor of the non-zero singular directions
            scale = math.sqrt(x.shape[0] / x.shape[1])
            return x - self.muon_lr * scale * O, {"kind": "muon", "mom": mom}
        b1, b2 = self.beta1, self.beta2
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        x = (1 - self.adam_lr * self.weight_decay) * x - (self.adam_lr / bc1) * (
            m / (np.sqrt(v) / math.sqrt(bc2) + self.eps))
        return x, {"kind": "adamw", "m": m, "v": v}


# ---- 16. Schedule-Free SGD --------------------------------------------------------------------------------
class ScheduleFreeSGDUniformAverage(metaclass=_DefaultInstance):
    """Bug: the averaging coefficient is c_t = 1/t (a uniform average) instead of w_t / sum w with
    w_t = lr_max**2, so the steps taken during warmup get the same weight as the later ones."""

    lr, beta, warmup_steps = 0.5, 0.9, 5

    def init(self, params):
        return {"t": 0, "z": [np.array(p, copy=True) for p in params], "x": [np.array(p, copy=True) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma = self.lr * (t / self.warmup_steps if t <= self.warmup_steps else 1.0)
        c = 1.0 / t
        ys, zs, xs = [], [], []
        for y, g, z, x in zip(params, grads, state["z"], state["x"]):
            z = z - gamma * g
            x = x * (1 - c) + c * z
            ys.append((x * self.beta + (1 - self.beta) * z).astype(np.asarray(y).dtype, copy=False))
            zs.append(z)
            xs.append(x)
        return ys, {"t": t, "z": zs, "x": xs}


# ---- controls -----------------------------------------------------------------------------------------------
class RMSpropCenteredMomentum(_PerArray):
    """Correct: centered RMSprop (torch form, eps after the square root) with momentum."""

    lr, alpha, eps, momentum = 0.01, 0.9, 1e-8, 0.5

    def init_slot(self, x):
        return {"square_avg": np.zeros_like(x), "grad_avg": np.zeros_like(x), "buf": np.zeros_like(x)}

    def update_one(self, t, x, g, s):
        sq = self.alpha * s["square_avg"] + (1 - self.alpha) * g * g
        ga = s["grad_avg"] + (1 - self.alpha) * (g - s["grad_avg"])
        den = np.sqrt(sq - ga * ga) + self.eps
        buf = self.momentum * s["buf"] + g / den
        return x - self.lr * buf, {"square_avg": sq, "grad_avg": ga, "buf": buf}


class AdagradLrDecay(_PerArray):
    """Correct: Adagrad (torch form) with lr decay lr / (1 + (t - 1) lr_decay) and an initial accumulator."""

    lr, lr_decay, initial_accumulator_value, eps = 0.05, 0.01, 0.1, 1e-10

    def init_slot(self, x):
        return {"sum": np.full_like(x, self.initial_accumulator_value)}

    def update_one(self, t, x, g, s):
        clr = self.lr / (1 + (t - 1) * self.lr_decay)
        acc = s["sum"] + g * g
        return x - clr * (g / (np.sqrt(acc) + self.eps)), {"sum": acc}

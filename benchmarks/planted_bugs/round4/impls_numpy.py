"""Round 4 planted-bug implementations (numpy framework, (fan_in, fan_out) layout).

Each module-level class has __init__(**kwargs), init(params)->state and
step(state, params, grads)->(params, state). Params and grads are lists of numpy arrays; every returned
array keeps its input's dtype. Written from the rule docstrings' equations (and the papers), each buggy
class with ONE bug a developer could plausibly make; the classes marked "correct" are false-alarm
controls.
"""
import math

import numpy as np


# ------------------------------------------------------------------------------------------------
# interface: `refopt crosscheck --framework numpy --impl FILE:NAME` takes NAME itself as the object with
# init(params) and step(state, params, grads); the metaclass lets each class serve as that object by
# forwarding Class.init / Class.step / Class.eval_params to a default instance Class() (the instances keep
# no state of their own, so one shared default instance is enough).
class _ImplMeta(type):
    def _default(cls):
        inst = cls.__dict__.get("_default_instance")
        if inst is None:
            inst = cls()
            type.__setattr__(cls, "_default_instance", inst)
        return inst

    init = property(lambda cls: cls._default().init)
    step = property(lambda cls: cls._default().step)
    eval_params = property(lambda cls: cls._default().eval_params)


class _Impl(metaclass=_ImplMeta):
    pass


# ------------------------------------------------------------------------------------------------
# small shared helpers
def _z(ps):
    return [np.zeros_like(p) for p in ps]


def _fro(a):
    a = np.asarray(a, dtype=np.float64)
    m = float(np.max(np.abs(a))) if a.size else 0.0
    if m == 0.0:
        return 0.0
    return m * float(np.sqrt(np.sum((a / m) ** 2)))


def _warmup_cosine(t, warmup, total, floor=0.0):
    if t <= warmup:
        return t / warmup
    t = min(t, total)
    p = (t - warmup) / (total - warmup)
    return floor + (1.0 - floor) * (1.0 + math.cos(math.pi * p)) / 2.0


def _wsd(t, warmup, decay, total, final=0.0, kind="linear"):
    if warmup > 0 and t <= warmup:
        return t / warmup
    if t <= total - decay:
        return 1.0
    t = min(t, total)
    p = (t - (total - decay)) / decay
    if kind == "linear":
        return 1.0 - (1.0 - final) * p
    return final + (1.0 - final) * (1.0 + math.cos(math.pi * p)) / 2.0


_NS = {
    "jordan": (3.4445, -4.7750, 2.0315),
    "classic": (15.0 / 8.0, -10.0 / 8.0, 3.0 / 8.0),
}


def _msign(G, coeffs="jordan", steps=5):
    """Newton-Schulz polar factor of a 2-D array (normalised by the Frobenius norm, tall inputs transposed)."""
    a, b, c = _NS[coeffs]
    nrm = _fro(G)
    if nrm == 0.0:
        return np.zeros_like(G)
    X = G / G.dtype.type(nrm)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = np.ascontiguousarray(X)
    eye = np.eye(X.shape[0], dtype=X.dtype)
    for _ in range(steps):
        A = X @ X.T
        P = c * (A @ A) + b * A + a * eye
        X = P @ X
    return np.ascontiguousarray(X.T) if tall else X


def _fan(shape):
    return int(np.prod(shape[:-1])), int(shape[-1])


def _adam_dir(g, m, v, t, b1, b2, eps):
    """Adam's direction u = mhat / (sqrt(vhat) + eps) and the new moments."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return u, m, v


# ------------------------------------------------------------------------------------------------
# Adam / AdamW
class AdamWAmsgradStaleMax(_Impl):
    """AdamW(lr=0.02, beta1=0.85, beta2=0.98, weight_decay=0.05, amsgrad=True). BUG: the running maximum
    v_max is updated from the previous second moment v_{t-1} (max taken before v is updated), so the
    denominator lags one step behind."""

    def __init__(self, lr=0.02, beta1=0.85, beta2=0.98, eps=1e-8, weight_decay=0.05):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params), "v_max": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs, vms = [], [], [], []
        bc1, bc2 = 1 - self.b1 ** t, 1 - self.b2 ** t
        for x, g, m, v, vm in zip(params, grads, state["m"], state["v"], state["v_max"]):
            m = self.b1 * m + (1 - self.b1) * g
            vm = np.maximum(vm, v)
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(vm) / math.sqrt(bc2) + self.eps
            x_new = (1 - self.lr * self.wd) * x - (self.lr / bc1) * m / den
            out.append(x_new.astype(x.dtype)); ms.append(m); vs.append(v); vms.append(vm)
        return out, {"t": t, "m": ms, "v": vs, "v_max": vms}


class NAdamLookaheadOffByOne(_Impl):
    """Adam(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-7, nesterov=True) (optax-style NAdam). BUG: the
    look-ahead coefficient of m_t uses beta1/(1 - beta1**t) instead of beta1/(1 - beta1**(t+1))."""

    def __init__(self, lr=0.01, beta1=0.9, beta2=0.99, eps=1e-7):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        b1, b2 = self.b1, self.b2
        c_m = b1 / (1 - b1 ** t)
        c_g = (1 - b1) / (1 - b1 ** t)
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - b2 ** t) + self.eps
            out.append((x - self.lr * (c_m * m + c_g * g) / den).astype(x.dtype))
            ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


class AdamL2CosineOverTotal(_Impl):
    """Adam(lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.01, schedule=warmup_cosine(5, 30, 0.1)).
    BUG: the cosine progress after warmup is divided by the total steps T instead of the decay length
    T - W, so the schedule never reaches its floor."""

    def __init__(self, lr=0.02, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.01, warmup=5, total=30, floor=0.1):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.W, self.T, self.floor = warmup, total, floor

    def _gamma(self, t):
        if t <= self.W:
            return t / self.W
        p = min(t - self.W, self.T - self.W) / self.T
        return self.floor + (1 - self.floor) * (1 + math.cos(math.pi * p)) / 2

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        lr_t = self.lr * self._gamma(t)
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            g = g + self.wd * x
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
            out.append((x - lr_t / (1 - self.b1 ** t) * m / den).astype(x.dtype))
            ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


class AdamWIndependentDecayUnscheduled(_Impl):
    """AdamW(lr=0.01, weight_decay=0.05, wd_mode='independent', schedule=WSD(3, 10, 30)). BUG: the
    lr-independent decay multiplies x by (1 - lambda) every step, without the schedule's gamma_t."""

    def __init__(self, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma = _wsd(t, 3, 10, 30)
        lr_t = self.lr * gamma
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
            x_new = (1 - self.wd) * x - lr_t / (1 - self.b1 ** t) * m / den
            out.append(x_new.astype(x.dtype)); ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


class AdamWAmsgradBiasCorrectedOK(_Impl):
    """AdamW(lr=0.005, beta1=0.85, beta2=0.995, eps=1e-7, weight_decay=0.2, amsgrad='bias_corrected',
    schedule=LinearWarmup(5)). Correct (no bug): optax-style AMSGrad on the bias-corrected v, decoupled
    decay on the pre-update x, linear warmup t/5."""

    def __init__(self, lr=0.005, beta1=0.85, beta2=0.995, eps=1e-7, weight_decay=0.2, warmup=5):
        self.lr, self.b1, self.b2, self.eps, self.wd, self.W = lr, beta1, beta2, eps, weight_decay, warmup

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params), "v_max": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        lr_t = self.lr * (min(t, self.W) / self.W)
        out, ms, vs, vms = [], [], [], []
        for x, g, m, v, vm in zip(params, grads, state["m"], state["v"], state["v_max"]):
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            vm = np.maximum(vm, v / (1 - self.b2 ** t))
            x_new = (1 - lr_t * self.wd) * x - lr_t / (1 - self.b1 ** t) * m / (np.sqrt(vm) + self.eps)
            out.append(x_new.astype(x.dtype)); ms.append(m); vs.append(v); vms.append(vm)
        return out, {"t": t, "m": ms, "v": vs, "v_max": vms}


# ------------------------------------------------------------------------------------------------
# SGD
class SGDDampenedFirstBuffer(_Impl):
    """SGD(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02). BUG: the first momentum buffer is
    dampened too (b_1 = (1 - tau) g_1 instead of b_1 = g_1)."""

    def __init__(self, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02):
        self.lr, self.mu, self.tau, self.wd = lr, momentum, dampening, weight_decay

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            g = g + self.wd * x
            b = self.mu * b + (1 - self.tau) * g      # also at t = 1, where b = 0
            out.append((x - self.lr * b).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


class SGDNesterovDecayOutsideBuffer(_Impl):
    """SGD(lr=0.03, momentum=0.9, nesterov=True, weight_decay=0.05). BUG: the L2 term lambda*x is added
    to the Nesterov step but not to the gradient that enters the momentum buffer."""

    def __init__(self, lr=0.03, momentum=0.9, weight_decay=0.05):
        self.lr, self.mu, self.wd = lr, momentum, weight_decay

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            b = g.copy() if t == 1 else self.mu * b + g
            u = (g + self.wd * x) + self.mu * b
            out.append((x - self.lr * u).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


# ------------------------------------------------------------------------------------------------
# RMSprop
class RMSpropCenteredEpsInsideSqrt(_Impl):
    """RMSprop(lr=0.005, alpha=0.95, eps=1e-6, centered=True, momentum=0.7). BUG: eps is added inside
    the square root, sqrt(v - a**2 + eps), instead of after it."""

    def __init__(self, lr=0.005, alpha=0.95, eps=1e-6, momentum=0.7):
        self.lr, self.alpha, self.eps, self.mu = lr, alpha, eps, momentum

    def init(self, params):
        return {"t": 0, "v": _z(params), "g_avg": _z(params), "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, vs, As, bs = [], [], [], []
        for x, g, v, a, b in zip(params, grads, state["v"], state["g_avg"], state["b"]):
            v = self.alpha * v + (1 - self.alpha) * g * g
            a = a + (1 - self.alpha) * (g - a)
            d = np.sqrt(v - a * a + self.eps)
            b = self.mu * b + g / d
            out.append((x - self.lr * b).astype(x.dtype)); vs.append(v); As.append(a); bs.append(b)
        return out, {"t": t, "v": vs, "g_avg": As, "b": bs}


class RMSpropCenteredStaleAverage(_Impl):
    """RMSprop(lr=0.01, alpha=0.9, centered=True, weight_decay=0.01). BUG: the centred denominator
    subtracts the previous gradient average a_{t-1}**2 (a is updated after the denominator is formed)."""

    def __init__(self, lr=0.01, alpha=0.9, eps=1e-8, weight_decay=0.01):
        self.lr, self.alpha, self.eps, self.wd = lr, alpha, eps, weight_decay

    def init(self, params):
        return {"t": 0, "v": _z(params), "g_avg": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, vs, As = [], [], []
        for x, g, v, a in zip(params, grads, state["v"], state["g_avg"]):
            g = g + self.wd * x
            v = self.alpha * v + (1 - self.alpha) * g * g
            d = np.sqrt(np.maximum(v - a * a, 0.0)) + self.eps
            a = a + (1 - self.alpha) * (g - a)
            out.append((x - self.lr * g / d).astype(x.dtype)); vs.append(v); As.append(a)
        return out, {"t": t, "v": vs, "g_avg": As}


# ------------------------------------------------------------------------------------------------
# Lion
class LionBetasSwapped(_Impl):
    """Lion(lr=3e-4, beta1=0.95, beta2=0.98, weight_decay=0.1). BUG: beta1 and beta2 are swapped (the
    sign is taken of the beta2-interpolation and the momentum is an EMA with beta1)."""

    def __init__(self, lr=3e-4, beta1=0.95, beta2=0.98, weight_decay=0.1):
        self.lr, self.b1, self.b2, self.wd = lr, beta1, beta2, weight_decay

    def init(self, params):
        return {"t": 0, "m": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms = [], []
        for x, g, m in zip(params, grads, state["m"]):
            u = np.sign((1 - self.b2) * g + self.b2 * m)
            m = (1 - self.b1) * g + self.b1 * m
            out.append(((1 - self.lr * self.wd) * x - self.lr * u).astype(x.dtype)); ms.append(m)
        return out, {"t": t, "m": ms}


class LionWSDCosineOK(_Impl):
    """Lion(lr=5e-4, beta1=0.85, beta2=0.97, weight_decay=0.3, schedule=WSD(2, 10, 30, final=0.1,
    decay='cosine')). Correct (no bug)."""

    def __init__(self, lr=5e-4, beta1=0.85, beta2=0.97, weight_decay=0.3):
        self.lr, self.b1, self.b2, self.wd = lr, beta1, beta2, weight_decay

    def init(self, params):
        return {"t": 0, "m": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        lr_t = self.lr * _wsd(t, 2, 10, 30, final=0.1, kind="cosine")
        out, ms = [], []
        for x, g, m in zip(params, grads, state["m"]):
            u = np.sign((1 - self.b1) * g + self.b1 * m)
            m = (1 - self.b2) * g + self.b2 * m
            out.append(((1 - lr_t * self.wd) * x - lr_t * u).astype(x.dtype)); ms.append(m)
        return out, {"t": t, "m": ms}


# ------------------------------------------------------------------------------------------------
# Muon and MuonH
class _MuonBase(_Impl):
    coeffs, steps = "jordan", 5

    def __init__(self, lr=0.02, momentum=0.95, weight_decay=0.0):
        self.lr, self.mu, self.wd = lr, momentum, weight_decay

    def init(self, params):
        return {"t": 0, "m": _z(params)}

    def scale(self, shape):
        fi, fo = _fan(shape)
        return math.sqrt(fo / fi)

    def nesterov_input(self, g, m_old, m_new):
        return (1 - self.mu) * g + self.mu * m_new

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms = [], []
        for x, g, m in zip(params, grads, state["m"]):
            if x.ndim < 2:
                out.append(x.copy()); ms.append(m)
                continue
            m_new = self.mu * m + (1 - self.mu) * g
            M = self.nesterov_input(g, m, m_new)
            fi, fo = _fan(x.shape)
            O = _msign(M.reshape(fi, fo), self.coeffs, self.steps).reshape(x.shape)
            x_new = (1 - self.lr * self.wd) * x - self.lr * self.scale(x.shape) * O
            out.append(x_new.astype(x.dtype)); ms.append(m_new)
        return out, {"t": t, "m": ms}


class MuonSpectralDecayOK(_MuonBase):
    """Muon(lr=0.025, momentum=0.9, weight_decay=0.05). Correct (no bug): Nesterov EMA momentum, five
    Jordan Newton-Schulz steps, spectral scale sqrt(fan_out/fan_in), decoupled decay lr*lambda."""

    def __init__(self, lr=0.025, momentum=0.9, weight_decay=0.05):
        super().__init__(lr, momentum, weight_decay)


class MuonRmsMatchMinDim(_MuonBase):
    """Muon(lr=0.02, momentum=0.9, scale='rms_match', weight_decay=0.02). BUG: the RMS-matching scale
    is 0.2*sqrt(min(fan_in, fan_out)) instead of 0.2*sqrt(max(fan_in, fan_out))."""

    def __init__(self, lr=0.02, momentum=0.9, weight_decay=0.02):
        super().__init__(lr, momentum, weight_decay)

    def scale(self, shape):
        fi, fo = _fan(shape)
        return 0.2 * math.sqrt(min(fi, fo))


class MuonNesterovStaleMomentum(_MuonBase):
    """Muon(lr=0.03, momentum=0.85, ns_coeffs='classic', ns_steps=6, scale='jordan'). BUG: the Nesterov
    input mixes g_t with the previous momentum m_{t-1} instead of the updated m_t."""

    coeffs, steps = "classic", 6

    def __init__(self, lr=0.03, momentum=0.85):
        super().__init__(lr, momentum, 0.0)

    def scale(self, shape):
        fi, fo = _fan(shape)
        return math.sqrt(max(1.0, fo / fi))

    def nesterov_input(self, g, m_old, m_new):
        return (1 - self.mu) * g + self.mu * m_old


class MuonHColumnProjection(_Impl):
    """Hyperball(Muon(momentum=0.9), lr=0.02) (MuonH). BUG: the retraction normalises each column of y
    to norm R/sqrt(fan_out) instead of normalising the whole matrix to Frobenius norm R."""

    def __init__(self, lr=0.02, momentum=0.9):
        self.lr, self.mu = lr, momentum

    def init(self, params):
        return {"t": 0, "m": _z(params), "R": [np.array(_fro(p), dtype=p.dtype) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms = [], []
        for x, g, m, R in zip(params, grads, state["m"], state["R"]):
            if x.ndim < 2:
                out.append(x.copy()); ms.append(m)
                continue
            R = float(R)
            m = self.mu * m + (1 - self.mu) * g
            M = (1 - self.mu) * g + self.mu * m
            fi, fo = _fan(x.shape)
            O = _msign(M.reshape(fi, fo)).reshape(x.shape)
            nu = _fro(O)
            y = x - self.lr * R * (O / nu if nu > 0 else O)
            y2 = y.reshape(fi, fo)
            cols = np.sqrt(np.sum(y2 * y2, axis=0, keepdims=True))
            w = (R / math.sqrt(fo)) * y2 / np.where(cols > 0, cols, 1.0)
            out.append(w.reshape(x.shape).astype(x.dtype)); ms.append(m)
        return out, {"t": t, "m": ms, "R": state["R"]}


# ------------------------------------------------------------------------------------------------
# Hyperball(Adam), Covariant(SGD)
class HyperballAdamNoRadius(_Impl):
    """Hyperball(Adam(beta1=0.9, beta2=0.99), lr=0.05, radius=2.0) (AdamH). BUG: the tangent step is
    lr*N(u) instead of lr*R*N(u), i.e. it forgets to scale the step by the sphere's radius R.
    (A single radius for every array, so that the problems' all-zero arrays, e.g. biases, can move.)"""

    def __init__(self, lr=0.05, beta1=0.9, beta2=0.99, eps=1e-8, radius=2.0):
        self.lr, self.b1, self.b2, self.eps, self.radius = lr, beta1, beta2, eps, radius

    def init(self, params):
        def rad(p):
            return self.radius if self.radius is not None else _fro(p)
        return {"t": 0, "m": _z(params), "v": _z(params),
                "R": [np.array(rad(p), dtype=p.dtype) for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs = [], [], []
        for x, g, m, v, R in zip(params, grads, state["m"], state["v"], state["R"]):
            R = float(R)
            u, m, v = _adam_dir(g, m, v, t, self.b1, self.b2, self.eps)
            nu = _fro(u)
            y = x - self.lr * (u / nu if nu > 0 else u)
            ny = _fro(y)
            w = R * y / ny if ny > 0 else np.zeros_like(y)
            out.append(w.astype(x.dtype)); ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs, "R": state["R"]}


class CovariantSGDMixedNorms(_Impl):
    """Covariant(SGD(momentum=0.9), lr=0.02, norm='rms'). BUG: the weight's norm is the RMS norm but the
    direction's norm is the Frobenius norm, so the relative step is lr/sqrt(size) instead of lr."""

    def __init__(self, lr=0.02, momentum=0.9):
        self.lr, self.mu = lr, momentum

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            b = g.copy() if t == 1 else self.mu * b + g
            nw = _fro(x) / math.sqrt(x.size)
            nu = _fro(b)
            if nw == 0 or nu == 0:
                x_new = x.copy()
            else:
                x_new = x - (self.lr * nw / nu) * b
            out.append(x_new.astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


# ------------------------------------------------------------------------------------------------
# ClipByGlobalNorm
class ClipPerLeafSGD(_Impl):
    """ClipByGlobalNorm(SGD(lr=0.05, momentum=0.9), max_norm=1.0). BUG: each gradient array is clipped by
    its own norm instead of all arrays by their global norm."""

    def __init__(self, lr=0.05, momentum=0.9, max_norm=1.0):
        self.lr, self.mu, self.max_norm = lr, momentum, max_norm

    def init(self, params):
        return {"t": 0, "b": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, bs = [], []
        for x, g, b in zip(params, grads, state["b"]):
            n = _fro(g)
            c = min(1.0, self.max_norm / n) if n > 0 else 1.0
            g = g * g.dtype.type(c)
            b = g.copy() if t == 1 else self.mu * b + g
            out.append((x - self.lr * b).astype(x.dtype)); bs.append(b)
        return out, {"t": t, "b": bs}


class ClipGlobalAdamOK(_Impl):
    """ClipByGlobalNorm(Adam(lr=0.01, beta1=0.85, beta2=0.99), max_norm=2.0, eps=1e-6). Correct (no
    bug): torch-style global clipping factor min(1, max_norm/(N + eps)) before Adam."""

    def __init__(self, lr=0.01, beta1=0.85, beta2=0.99, eps=1e-8, max_norm=2.0, clip_eps=1e-6):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps
        self.max_norm, self.clip_eps = max_norm, clip_eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        N = math.sqrt(sum(_fro(g) ** 2 for g in grads))
        c = 1.0 if N + self.clip_eps == 0 else min(1.0, self.max_norm / (N + self.clip_eps))
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            g = g * g.dtype.type(c)
            m = self.b1 * m + (1 - self.b1) * g
            v = self.b2 * v + (1 - self.b2) * g * g
            den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
            out.append((x - self.lr / (1 - self.b1 ** t) * m / den).astype(x.dtype))
            ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


# ------------------------------------------------------------------------------------------------
# Partition
class PartitionDecayWithMuonLr(_Impl):
    """Partition({'hidden': Muon(lr=0.02, momentum=0.9), 'other': AdamW(lr=0.003, weight_decay=0.1)},
    labels=matrix_labels). BUG: the 'other' group's decoupled decay uses the Muon group's lr
    (x *= 1 - 0.02*lambda) instead of its own AdamW lr."""

    def __init__(self, muon_lr=0.02, momentum=0.9, adam_lr=0.003, weight_decay=0.1,
                 beta1=0.9, beta2=0.999, eps=1e-8):
        self.muon_lr, self.mu, self.adam_lr, self.wd = muon_lr, momentum, adam_lr, weight_decay
        self.b1, self.b2, self.eps = beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs = [], [], []
        for x, g, m, v in zip(params, grads, state["m"], state["v"]):
            if x.ndim == 2:
                m = self.mu * m + (1 - self.mu) * g
                M = (1 - self.mu) * g + self.mu * m
                fi, fo = _fan(x.shape)
                x_new = x - self.muon_lr * math.sqrt(fo / fi) * _msign(M)
            else:
                m = self.b1 * m + (1 - self.b1) * g
                v = self.b2 * v + (1 - self.b2) * g * g
                den = np.sqrt(v) / math.sqrt(1 - self.b2 ** t) + self.eps
                x_new = (1 - self.muon_lr * self.wd) * x - self.adam_lr / (1 - self.b1 ** t) * m / den
            out.append(x_new.astype(x.dtype)); ms.append(m); vs.append(v)
        return out, {"t": t, "m": ms, "v": vs}


# ------------------------------------------------------------------------------------------------
# averaging wrappers
class EMADebiasOffByOne(_Impl):
    """EMA(SGD(lr=0.05, momentum=0.9), decay=0.9). BUG: the debiasing exponent counts from 0, i.e.
    c_t = (1 - beta)/(1 - beta**(t+1)) instead of (1 - beta)/(1 - beta**t), so mu_1 != x_1."""

    def __init__(self, lr=0.05, momentum=0.9, decay=0.9):
        self.lr, self.mu, self.beta = lr, momentum, decay

    def init(self, params):
        return {"t": 0, "b": _z(params), "mu": [p.copy() for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        c = (1 - self.beta) / (1 - self.beta ** (t + 1))
        out, bs, mus = [], [], []
        for x, g, b, mu in zip(params, grads, state["b"], state["mu"]):
            b = g.copy() if t == 1 else self.mu * b + g
            x_new = (x - self.lr * b).astype(x.dtype)
            mu = ((1 - c) * mu + c * x_new).astype(x.dtype)
            out.append(x_new); bs.append(b); mus.append(mu)
        return out, {"t": t, "b": bs, "mu": mus}

    def eval_params(self, state, params):
        return [m.copy() for m in state["mu"]]


class AverageIncludesInit(_Impl):
    """Average(Adam(lr=0.01, beta1=0.8)). BUG: the uniform average includes the initial x_0
    (mu_t = (t*mu_{t-1} + x_t)/(t+1)) instead of averaging x_1..x_t."""

    def __init__(self, lr=0.01, beta1=0.8, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps

    def init(self, params):
        return {"t": 0, "m": _z(params), "v": _z(params), "mu": [p.copy() for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        out, ms, vs, mus = [], [], [], []
        for x, g, m, v, mu in zip(params, grads, state["m"], state["v"], state["mu"]):
            u, m, v = _adam_dir(g, m, v, t, self.b1, self.b2, self.eps)
            x_new = (x - self.lr * u).astype(x.dtype)
            mu = ((t * mu + x_new) / (t + 1)).astype(x.dtype)
            out.append(x_new); ms.append(m); vs.append(v); mus.append(mu)
        return out, {"t": t, "m": ms, "v": vs, "mu": mus}

    def eval_params(self, state, params):
        return [m.copy() for m in state["mu"]]


# ------------------------------------------------------------------------------------------------
# Schedule-Free
class _SFBookkeeping(_Impl):
    def _weights(self, st, t):
        warm = t / self.W if (self.W > 0 and t <= self.W) else 1.0
        gamma = self.lr * warm
        lr_max = max(st["lr_max"], gamma)
        w = (t ** self.r) * (lr_max ** self.p)
        wsum = st["weight_sum"] + w
        c = w / wsum if wsum != 0 else 0.0
        return gamma, lr_max, wsum, c


class ScheduleFreeSGDStaleAverage(_SFBookkeeping):
    """ScheduleFreeSGD(lr=0.5, beta=0.8, warmup_steps=5, r=0.5). BUG: the new params y are interpolated
    with the previous average x (y = beta*x_old + (1-beta)*z_new): x is updated after y is formed."""

    def __init__(self, lr=0.5, beta=0.8, warmup_steps=5, r=0.5, weight_lr_power=2.0):
        self.lr, self.beta, self.W, self.r, self.p = lr, beta, warmup_steps, r, weight_lr_power

    def init(self, params):
        return {"t": 0, "weight_sum": 0.0, "lr_max": -1.0,
                "z": [p.copy() for p in params], "x": [p.copy() for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma, lr_max, wsum, c = self._weights(state, t)
        out, zs, xs = [], [], []
        for y, g, z, x in zip(params, grads, state["z"], state["x"]):
            z = z - gamma * g
            y_new = self.beta * x + (1 - self.beta) * z
            x = (1 - c) * x + c * z
            out.append(y_new.astype(y.dtype)); zs.append(z.astype(y.dtype)); xs.append(x.astype(y.dtype))
        return out, {"t": t, "weight_sum": wsum, "lr_max": lr_max, "z": zs, "x": xs}

    def eval_params(self, state, params):
        return [a.copy() for a in state["x"]]


class ScheduleFreeSGDOK(_SFBookkeeping):
    """ScheduleFreeSGD(lr=0.3, beta=0.85, warmup_steps=3, r=1.0, weight_lr_power=1.0, weight_decay=0.01).
    Correct (no bug)."""

    def __init__(self, lr=0.3, beta=0.85, warmup_steps=3, r=1.0, weight_lr_power=1.0, weight_decay=0.01):
        self.lr, self.beta, self.W, self.r, self.p, self.wd = lr, beta, warmup_steps, r, weight_lr_power, weight_decay

    def init(self, params):
        return {"t": 0, "weight_sum": 0.0, "lr_max": -1.0,
                "z": [p.copy() for p in params], "x": [p.copy() for p in params]}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma, lr_max, wsum, c = self._weights(state, t)
        out, zs, xs = [], [], []
        for y, g, z, x in zip(params, grads, state["z"], state["x"]):
            g = g + self.wd * y
            z = z - gamma * g
            x = (1 - c) * x + c * z
            y_new = self.beta * x + (1 - self.beta) * z
            out.append(y_new.astype(y.dtype)); zs.append(z.astype(y.dtype)); xs.append(x.astype(y.dtype))
        return out, {"t": t, "weight_sum": wsum, "lr_max": lr_max, "z": zs, "x": xs}

    def eval_params(self, state, params):
        return [a.copy() for a in state["x"]]


class ScheduleFreeAdamWDecayAtAverage(_SFBookkeeping):
    """ScheduleFreeAdamW(lr=0.01, beta1=0.9, beta2=0.995, weight_decay=0.05, warmup_steps=4). BUG: the
    decoupled decay of z is taken at the average x instead of at the params y."""

    def __init__(self, lr=0.01, beta1=0.9, beta2=0.995, eps=1e-8, weight_decay=0.05, warmup_steps=4,
                 r=0.0, weight_lr_power=2.0):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.W, self.r, self.p = warmup_steps, r, weight_lr_power

    def init(self, params):
        return {"t": 0, "weight_sum": 0.0, "lr_max": -1.0, "z": [p.copy() for p in params],
                "x": [p.copy() for p in params], "v": _z(params)}

    def step(self, state, params, grads):
        t = state["t"] + 1
        gamma, lr_max, wsum, c = self._weights(state, t)
        bc2 = 1 - self.b2 ** t
        out, zs, xs, vs = [], [], [], []
        for y, g, z, x, v in zip(params, grads, state["z"], state["x"], state["v"]):
            z = z - (gamma * self.wd) * x
            v = self.b2 * v + (1 - self.b2) * g * g
            z = z - gamma * g / (np.sqrt(v / bc2) + self.eps)
            x = (1 - c) * x + c * z
            y_new = self.b1 * x + (1 - self.b1) * z
            out.append(y_new.astype(y.dtype)); zs.append(z.astype(y.dtype)); xs.append(x.astype(y.dtype))
            vs.append(v.astype(y.dtype))
        return out, {"t": t, "weight_sum": wsum, "lr_max": lr_max, "z": zs, "x": xs, "v": vs}

    def eval_params(self, state, params):
        return [a.copy() for a in state["x"]]

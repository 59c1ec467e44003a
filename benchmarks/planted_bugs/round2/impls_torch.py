"""Round-2 planted-bug optimizers in torch (params in torch's (out, in) layout).

Each class is written from the equations of the corresponding refopt rule docstring. Every class docstring
states in one sentence the bug planted in it (or that the implementation is meant to be correct).
"""
from __future__ import annotations

import math

import torch


# ---------------------------------------------------------------------------------------------- helpers
def _warmup_cosine(t: int, warmup: int, total: int, floor: float) -> float:
    """Linear warmup t/W to 1, then cosine decay to ``floor`` at step ``total`` (held after)."""
    if t <= warmup:
        return t / warmup if warmup > 0 else 1.0
    d = total - warmup
    if d <= 0:
        return 1.0
    p = min(t - warmup, d) / d
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def _newton_schulz(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Quintic Newton-Schulz (Jordan coefficients) approximating the polar factor of a 2-D G."""
    a, b, c = 3.4445, -4.7750, 2.0315
    n = G.norm()
    if n == 0:
        return torch.zeros_like(G)
    X = G / n
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.T if tall else X


# ---------------------------------------------------------------------------------------------- Adam
class AdamL2(torch.optim.Optimizer):
    """Correct: Adam with coupled L2 weight decay and eps after the bias-corrected square root."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2 = grp["beta1"], grp["beta2"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                g = p.grad
                if grp["weight_decay"] != 0:
                    g = g + grp["weight_decay"] * p
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(st["m"], den, value=-grp["lr"] / (1 - b1 ** t))


class AMSGradW(torch.optim.Optimizer):
    """Bug: the AMSGrad running maximum is taken over the squared gradient g_t^2 instead of the second moment v_t."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2, lr = grp["beta1"], grp["beta2"], grp["lr"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                    st["v_max"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                g = p.grad
                p.mul_(1 - lr * grp["weight_decay"])
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                torch.maximum(st["v_max"], g * g, out=st["v_max"])
                den = st["v_max"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(st["m"], den, value=-lr / (1 - b1 ** t))


class NAdamW(torch.optim.Optimizer):
    """Bug: the look-ahead coefficient of m_t uses beta1/(1 - beta1**t) instead of beta1/(1 - beta1**(t+1))."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2, lr = grp["beta1"], grp["beta2"], grp["lr"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                g = p.grad
                p.mul_(1 - lr * grp["weight_decay"])
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                c_m = b1 / (1 - b1 ** t)
                c_g = (1 - b1) / (1 - b1 ** t)
                den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(c_m * st["m"] + c_g * g, den, value=-lr)


class AdamWCosine(torch.optim.Optimizer):
    """Bug: the decoupled weight decay uses the peak lr instead of the scheduled lr * gamma_t (warmup-cosine)."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                 warmup=3, total=30, floor=0.1):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))
        self.sched = (warmup, total, floor)
        self.t = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.t += 1
        t = self.t
        gamma = _warmup_cosine(t, *self.sched)
        for grp in self.param_groups:
            b1, b2, lr = grp["beta1"], grp["beta2"], grp["lr"]
            lr_t = lr * gamma
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                g = p.grad
                p.mul_(1 - lr * grp["weight_decay"])
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(st["m"], den, value=-lr_t / (1 - b1 ** t))


# ---------------------------------------------------------------------------------------------- SGD
class SGDNesterovL2(torch.optim.Optimizer):
    """Bug: the Nesterov look-ahead adds the raw gradient instead of the L2-augmented gradient g + lambda*x."""

    def __init__(self, params, lr=0.01, momentum=0.9, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            mu, wd = grp["momentum"], grp["weight_decay"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                raw = p.grad
                g = raw + wd * p if wd != 0 else raw
                st = self.state[p]
                if "buf" not in st:
                    st["buf"] = g.clone()
                else:
                    st["buf"].mul_(mu).add_(g)
                u = raw + mu * st["buf"]
                p.add_(u, alpha=-grp["lr"])


class SGDDampened(torch.optim.Optimizer):
    """Correct: SGD with momentum, dampening (undampened first buffer) and L2 weight decay."""

    def __init__(self, params, lr=0.01, momentum=0.9, dampening=0.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            mu, tau, wd = grp["momentum"], grp["dampening"], grp["weight_decay"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if wd != 0:
                    g = g + wd * p
                st = self.state[p]
                if "buf" not in st:
                    st["buf"] = g.clone()
                else:
                    st["buf"].mul_(mu).add_(g, alpha=1 - tau)
                p.add_(st["buf"], alpha=-grp["lr"])


# ---------------------------------------------------------------------------------------------- Lion
class LionInplace(torch.optim.Optimizer):
    """Bug: the momentum is updated in place before the sign interpolation reads it, so u uses m_t instead of m_{t-1}."""

    def __init__(self, params, lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2, lr = grp["beta1"], grp["beta2"], grp["lr"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "m" not in st:
                    st["m"] = torch.zeros_like(p)
                m = st["m"]
                m.mul_(b2).add_(g, alpha=1 - b2)
                u = torch.sign(b1 * m + (1 - b1) * g)
                p.mul_(1 - lr * grp["weight_decay"])
                p.add_(u, alpha=-lr)


# ---------------------------------------------------------------------------------------------- RMSprop
class RMSpropCentered(torch.optim.Optimizer):
    """Bug: the centered variance subtracts the square of the previous gradient average a_{t-1} instead of a_t."""

    def __init__(self, params, lr=0.01, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            al, mu = grp["alpha"], grp["momentum"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if grp["weight_decay"] != 0:
                    g = g + grp["weight_decay"] * p
                st = self.state[p]
                if not st:
                    st["v"] = torch.zeros_like(p)
                    st["g_avg"] = torch.zeros_like(p)
                    st["b"] = torch.zeros_like(p)
                st["v"].mul_(al).addcmul_(g, g, value=1 - al)
                if grp["centered"]:
                    var = st["v"] - st["g_avg"] * st["g_avg"]
                    st["g_avg"].add_(g - st["g_avg"], alpha=1 - al)
                    den = var.sqrt() + grp["eps"]
                else:
                    den = st["v"].sqrt() + grp["eps"]
                if mu > 0:
                    st["b"].mul_(mu).add_(g / den)
                    p.add_(st["b"], alpha=-grp["lr"])
                else:
                    p.addcdiv_(g, den, value=-grp["lr"])


# ---------------------------------------------------------------------------------------------- clipping
class ClipAdam(torch.optim.Optimizer):
    """Bug: each gradient is clipped by its own Frobenius norm instead of by the global norm over all arrays."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, max_norm=1.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, max_norm=max_norm))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2 = grp["beta1"], grp["beta2"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                n = float(p.grad.norm())
                c = min(1.0, grp["max_norm"] / n) if n > 0 else 1.0
                g = p.grad * c
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(st["m"], den, value=-grp["lr"] / (1 - b1 ** t))


# ---------------------------------------------------------------------------------------------- Muon / Partition
class MuonWithAdamW(torch.optim.Optimizer):
    """Bug: the spectral scale is sqrt(shape[1]/shape[0]) of the torch (out, in) weight, i.e. sqrt(fan_in/fan_out), the transposed shape."""

    def __init__(self, params, lr=0.02, momentum=0.95, weight_decay=0.0, adam_lr=1e-3, adam_beta1=0.9,
                 adam_beta2=0.999, adam_eps=1e-8, ns_steps=5):
        params = list(params)
        super().__init__(params, dict(lr=lr))
        self.h = dict(mu=momentum, wd=weight_decay, alr=adam_lr, ab1=adam_beta1, ab2=adam_beta2, aeps=adam_eps,
                      ns=ns_steps)
        self.t = 0

    @torch.no_grad()
    def step(self, closure=None):
        h = self.h
        self.t += 1
        t = self.t
        for grp in self.param_groups:
            lr = grp["lr"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if p.dim() == 2:     # hidden matrix: Muon, nesterov, spectral scale
                    if not st:
                        st["m"] = torch.zeros_like(p)
                    m = st["m"]
                    m.mul_(h["mu"]).add_(g, alpha=1 - h["mu"])
                    M = (1 - h["mu"]) * g + h["mu"] * m
                    O = _newton_schulz(M, h["ns"])
                    s = math.sqrt(p.shape[1] / p.shape[0])
                    p.mul_(1 - lr * h["wd"])
                    p.add_(O, alpha=-lr * s)
                else:                # everything else: AdamW without decay
                    if not st:
                        st["m"] = torch.zeros_like(p)
                        st["v"] = torch.zeros_like(p)
                    b1, b2 = h["ab1"], h["ab2"]
                    st["m"].mul_(b1).add_(g, alpha=1 - b1)
                    st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + h["aeps"]
                    p.addcdiv_(st["m"], den, value=-h["alr"] / (1 - b1 ** t))


def PartitionAdamW(params, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.999, eps=1e-8):
    """Bug: the decay group is selected with ``p.dim() >= 1`` instead of ``p.dim() == 2``, so biases and gains are decayed too."""
    params = list(params)
    decay = [p for p in params if p.dim() >= 1]
    no_decay = [p for p in params if p.dim() < 1]
    groups = [dict(params=decay, weight_decay=weight_decay)]
    if no_decay:
        groups.append(dict(params=no_decay, weight_decay=0.0))
    return _PlainAdamW(groups, lr=lr, beta1=beta1, beta2=beta2, eps=eps)


class _PlainAdamW(torch.optim.Optimizer):
    """AdamW (decoupled decay lr*lambda on x_{t-1}) with per-group weight decay."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            b1, b2, lr = grp["beta1"], grp["beta2"], grp["lr"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p)
                    st["v"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                g = p.grad
                p.mul_(1 - lr * grp["weight_decay"])
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                den = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + grp["eps"]
                p.addcdiv_(st["m"], den, value=-lr / (1 - b1 ** t))


# ---------------------------------------------------------------------------------------------- Schedule-Free
class SFAdamW(torch.optim.Optimizer):
    """Bug: the new params y are interpolated from the average x before its update this step (x_t) instead of after (x_{t+1})."""

    def __init__(self, params, lr=0.0025, beta1=0.9, beta2=0.999, eps=1e-8, warmup_steps=0, r=0.0,
                 weight_lr_power=2.0, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, warmup_steps=warmup_steps, r=r,
                                      weight_lr_power=weight_lr_power, weight_decay=weight_decay))
        self.t = 0
        self.weight_sum = 0.0
        self.lr_max = -1.0

    @torch.no_grad()
    def step(self, closure=None):
        self.t += 1
        t = self.t
        for grp in self.param_groups:
            W = grp["warmup_steps"]
            gamma = grp["lr"] * (t / W if t <= W else 1.0)
            self.lr_max = max(self.lr_max, gamma)
            w = (t ** grp["r"]) * (self.lr_max ** grp["weight_lr_power"])
            self.weight_sum += w
            c = w / self.weight_sum if self.weight_sum != 0 else 0.0
            b1, b2 = grp["beta1"], grp["beta2"]
            bc2 = 1 - b2 ** t
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["z"] = p.detach().clone()
                    st["x"] = p.detach().clone()
                    st["v"] = torch.zeros_like(p)
                g = p.grad
                z, x, v = st["z"], st["x"], st["v"]
                if grp["weight_decay"] != 0:
                    z.sub_(p, alpha=gamma * grp["weight_decay"])
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                z.addcdiv_(g, (v / bc2).sqrt() + grp["eps"], value=-gamma)
                p.copy_(b1 * x + (1 - b1) * z)
                x.mul_(1 - c).add_(z, alpha=c)


# ---------------------------------------------------------------------------------------------- EMA
class EmaSGD(torch.optim.Optimizer):
    """Bug: the EMA debias counter is incremented once per parameter array instead of once per step."""

    def __init__(self, params, lr=0.01, momentum=0.9, decay=0.999):
        super().__init__(params, dict(lr=lr, momentum=momentum, decay=decay))
        self.t = 0

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            mu, beta = grp["momentum"], grp["decay"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "buf" not in st:
                    st["buf"] = p.grad.clone()
                    st["ema"] = torch.zeros_like(p)
                else:
                    st["buf"].mul_(mu).add_(p.grad)
                p.add_(st["buf"], alpha=-grp["lr"])
                self.t += 1
                c = (1 - beta) / (1 - beta ** self.t)
                st["ema"].mul_(1 - c).add_(p, alpha=c)


# ---------------------------------------------------------------------------------------------- Covariant
class CovariantSGD(torch.optim.Optimizer):
    """Bug: the relative step divides by the norm of the raw gradient ||g|| instead of the norm of the momentum direction ||u||."""

    def __init__(self, params, lr=1e-3, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self, closure=None):
        for grp in self.param_groups:
            mu = grp["momentum"]
            for p in grp["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "buf" not in st:
                    st["buf"] = g.clone()
                else:
                    st["buf"].mul_(mu).add_(g)
                u = st["buf"]
                nw, ng = float(p.norm()), float(g.norm())
                if nw > 0 and ng > 0:
                    p.add_(u, alpha=-grp["lr"] * nw / ng)

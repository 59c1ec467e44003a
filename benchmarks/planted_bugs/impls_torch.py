"""Hand-written torch optimizers for the planted-bug trial of ``refopt crosscheck --impl``.

Each class is written from the equations (papers / the refopt rule docstrings). The buggy ones carry
exactly ONE planted bug, stated in their docstring; the ``Ok*`` classes are meant to be correct.
Matrices are in torch layout (out, in).
"""
from __future__ import annotations

import math

import torch


# ----------------------------------------------------------------------------------------------------
# helpers (shared by several optimizers; correct)
# ----------------------------------------------------------------------------------------------------

def warmup_cosine_gamma(t: int, warmup: int, total: int, floor: float) -> float:
    """Linear warmup t/W for t <= W, then cosine from 1 to floor over the remaining T - W steps (t >= 1)."""
    if warmup > 0 and t <= warmup:
        return t / warmup
    d = total - warmup
    if d == 0:
        return 1.0
    p = min(t - warmup, d) / d
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


JORDAN = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: torch.Tensor, steps: int = 5, coeffs=JORDAN) -> torch.Tensor:
    """Orthogonalise G with the quintic Newton-Schulz iteration (Jordan et al. 2024)."""
    a, b, c = coeffs
    X = G / G.norm()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.T if tall else X


# ----------------------------------------------------------------------------------------------------
# Adam / AdamW
# ----------------------------------------------------------------------------------------------------

class OkAdam(torch.optim.Optimizer):
    """Correct Adam with L2 weight decay (Kingma & Ba; torch.optim.Adam conventions)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * p
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1 ** t
                bc2 = 1 - b2 ** t
                denom = v.sqrt() / math.sqrt(bc2) + group["eps"]
                p.addcdiv_(m, denom, value=-group["lr"] / bc1)


class AdamCounterStuck(torch.optim.Optimizer):
    """Adam whose step counter is incremented on a local copy and never written back, so the bias
    corrections always use t = 1."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                t = st["step"]
                t += 1                      # BUG: never stored back into st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1 ** t
                bc2 = 1 - b2 ** t
                denom = v.sqrt() / math.sqrt(bc2) + group["eps"]
                p.addcdiv_(m, denom, value=-group["lr"] / bc1)


class AdamL2FirstMomentOnly(torch.optim.Optimizer):
    """Adam with L2 decay where the decayed gradient g + wd*x feeds the first moment but the second
    moment is accumulated from the raw gradient g (the L2 term is missing from v)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                d_p = grad + group["weight_decay"] * p
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(d_p, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)   # BUG: raw grad, not d_p
                bc1 = 1 - b1 ** t
                bc2 = 1 - b2 ** t
                denom = (v / bc2).sqrt() + group["eps"]
                p.addcdiv_(m, denom, value=-group["lr"] / bc1)


class AdamWBetasSwapped(torch.optim.Optimizer):
    """AdamW that unpacks ``betas`` as (beta2, beta1), so the first moment decays with beta2 and the
    second with beta1 (and the bias corrections follow the swapped names)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta2, beta1 = group["betas"]   # BUG: order swapped
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                p.mul_(1 - lr * wd)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                mhat = m / (1 - beta1 ** t)
                vhat = v / (1 - beta2 ** t)
                p.addcdiv_(mhat, vhat.sqrt() + group["eps"], value=-lr)


class AdamWSecondCorrectionAhead(torch.optim.Optimizer):
    """AdamW where the shared step counter is bumped between the two bias corrections, so the second
    moment is corrected with t+1 while the first uses t."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 1
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1 ** st["step"]
                st["step"] += 1
                bc2 = 1 - b2 ** st["step"]     # BUG: counter already advanced
                p.mul_(1 - lr * wd)
                p.addcdiv_(m / bc1, (v / bc2).sqrt() + group["eps"], value=-lr)


class _ScheduledAdamWBase(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 warmup=0, total=1, floor=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      warmup=warmup, total=total, floor=floor))


class OkAdamWSchedule(_ScheduledAdamWBase):
    """Correct AdamW (decoupled decay, pre-update x) with a warmup-cosine lr computed from t = 1."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                lr_t = group["lr"] * warmup_cosine_gamma(t, group["warmup"], group["total"], group["floor"])
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
                p.mul_(1 - lr_t * group["weight_decay"])
                p.addcdiv_(m, denom, value=-lr_t / (1 - b1 ** t))


class AdamWScheduleZeroBased(_ScheduledAdamWBase):
    """AdamW with warmup-cosine whose schedule is evaluated at the 0-based step (t-1), so the first
    update has lr 0 and the whole curve lags one step."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            W, T, floor = group["warmup"], group["total"], group["floor"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                k = st["step"]                  # BUG: schedule read before the increment (0-based)
                if k < W:
                    gamma = k / W
                else:
                    gamma = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(k - W, T - W) / (T - W)))
                st["step"] += 1
                t = st["step"]
                lr_t = group["lr"] * gamma
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
                p.mul_(1 - lr_t * group["weight_decay"])
                p.addcdiv_(m, denom, value=-lr_t / (1 - b1 ** t))


class AdamWScheduleDecayPeakLr(_ScheduledAdamWBase):
    """AdamW with warmup-cosine where the Adam step uses the scheduled lr but the decoupled decay uses the
    peak lr (x *= 1 - lr*wd instead of 1 - lr*gamma_t*wd)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                lr_t = group["lr"] * warmup_cosine_gamma(t, group["warmup"], group["total"], group["floor"])
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
                p.mul_(1 - group["lr"] * group["weight_decay"])   # BUG: peak lr, not lr_t
                p.addcdiv_(m, denom, value=-lr_t / (1 - b1 ** t))


# ----------------------------------------------------------------------------------------------------
# SGD
# ----------------------------------------------------------------------------------------------------

class OkSGD(torch.optim.Optimizer):
    """Correct SGD with momentum, dampening, Nesterov and L2 decay (torch.optim.SGD conventions)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, tau = group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"] != 0:
                    g = g + group["weight_decay"] * p
                if mu != 0:
                    st = self.state[p]
                    if "momentum_buffer" not in st:
                        st["momentum_buffer"] = g.clone()
                    else:
                        st["momentum_buffer"].mul_(mu).add_(g, alpha=1 - tau)
                    b = st["momentum_buffer"]
                    g = g + mu * b if group["nesterov"] else b
                p.add_(g, alpha=-group["lr"])


class SGDNesterovOldBuffer(torch.optim.Optimizer):
    """Nesterov SGD whose look-ahead g + mu*b is formed with the buffer from the previous step (before
    b is updated with the current gradient)."""

    def __init__(self, params, lr=1e-3, momentum=0.9, nesterov=True):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                    first = True
                else:
                    first = False
                b = st["momentum_buffer"]
                update = g + mu * b             # BUG: look-ahead with b_{t-1}
                if first:
                    b.copy_(g)
                else:
                    b.mul_(mu).add_(g)
                p.add_(update, alpha=-group["lr"])


class SGDDecayOutsideMomentum(torch.optim.Optimizer):
    """SGD with momentum where the L2 term wd*x is added to the update after the momentum buffer instead
    of to the gradient that enters the buffer."""

    def __init__(self, params, lr=1e-3, momentum=0.9, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, wd = group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = g.clone()
                else:
                    st["momentum_buffer"].mul_(mu).add_(g)
                update = st["momentum_buffer"] + wd * p     # BUG: decay bypasses the momentum
                p.add_(update, alpha=-group["lr"])


# ----------------------------------------------------------------------------------------------------
# Lion
# ----------------------------------------------------------------------------------------------------

class LionDecaySign(torch.optim.Optimizer):
    """Lion whose decoupled weight decay has the wrong sign: x *= (1 + lr*wd) (weights grow)."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "exp_avg" not in st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                u = torch.sign(b1 * m + (1 - b1) * g)
                p.mul_(1 + lr * wd)            # BUG: sign of the decay
                p.add_(u, alpha=-lr)
                m.mul_(b2).add_(g, alpha=1 - b2)


class LionMomentumFirst(torch.optim.Optimizer):
    """Lion that updates the momentum m_t = b2*m + (1-b2)*g before forming the sign, so the
    interpolation uses m_t instead of m_{t-1}."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "exp_avg" not in st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                m.mul_(b2).add_(g, alpha=1 - b2)   # BUG: momentum updated first
                u = torch.sign(b1 * m + (1 - b1) * g)
                p.mul_(1 - lr * wd)
                p.add_(u, alpha=-lr)


# ----------------------------------------------------------------------------------------------------
# Muon (2-D params only; torch layout (out, in))
# ----------------------------------------------------------------------------------------------------

class _MuonBase(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                      weight_decay=weight_decay))

    # the pieces a subclass may get wrong
    def momentum_input(self, st, g, mu, nesterov):
        m = st["momentum_buffer"]
        m.mul_(mu).add_(g, alpha=1 - mu)
        return (1 - mu) * g + mu * m if nesterov else m.clone()

    def orthogonalise(self, M, steps):
        return newton_schulz(M, steps)

    def shape_scale(self, p):
        fan_out, fan_in = p.shape            # torch layout (out, in)
        return math.sqrt(fan_out / fan_in)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = torch.zeros_like(p)
                M = self.momentum_input(st, p.grad, mu, group["nesterov"])
                O = self.orthogonalise(M, group["ns_steps"])
                p.mul_(1 - lr * wd)
                p.add_(O, alpha=-lr * self.shape_scale(p))


class OkMuon(_MuonBase):
    """Correct Muon: EMA momentum, Nesterov input, Frobenius-normalised 5-step Jordan Newton-Schulz,
    spectral scale sqrt(fan_out/fan_in), decoupled decay."""


class MuonFourIterations(_MuonBase):
    """Muon whose Newton-Schulz loop runs ``range(1, ns_steps)``: one iteration fewer than asked."""

    def orthogonalise(self, M, steps):
        a, b, c = JORDAN
        X = M / M.norm()
        tall = X.shape[0] > X.shape[1]
        if tall:
            X = X.T
        for _ in range(1, steps):          # BUG: steps - 1 iterations
            A = X @ X.T
            X = a * X + (b * A + c * A @ A) @ X
        return X.T if tall else X


class MuonCoeffTypo(_MuonBase):
    """Muon with a transcription typo in the Newton-Schulz quintic coefficient c: 2.315 instead of 2.0315."""

    def orthogonalise(self, M, steps):
        return newton_schulz(M, steps, coeffs=(3.4445, -4.7750, 2.315))   # BUG: c typo


class MuonScaleFansSwapped(_MuonBase):
    """Muon that reads fan_in, fan_out = p.shape on torch's (out, in) weight, so the spectral scale is
    sqrt(fan_in/fan_out) instead of sqrt(fan_out/fan_in)."""

    def shape_scale(self, p):
        fan_in, fan_out = p.shape           # BUG: refopt layout read off a torch tensor
        return math.sqrt(fan_out / fan_in)


class MuonPlainMomentum(_MuonBase):
    """Muon accumulating heavy-ball momentum m = mu*m + g instead of the EMA m = mu*m + (1-mu)*g (the
    Nesterov mix (1-mu)*g + mu*m then weighs g differently)."""

    def momentum_input(self, st, g, mu, nesterov):
        m = st["momentum_buffer"]
        m.mul_(mu).add_(g)                  # BUG: no (1 - mu) on g
        return (1 - mu) * g + mu * m if nesterov else m.clone()


class MuonNoNormalise(_MuonBase):
    """Muon that feeds the momentum to Newton-Schulz divided by its max-abs entry instead of its Frobenius
    norm, so the singular values start outside the iteration's intended (0, 1] range."""

    def orthogonalise(self, M, steps):
        a, b, c = JORDAN
        X = M / M.abs().max()               # BUG: not the Frobenius norm
        tall = X.shape[0] > X.shape[1]
        if tall:
            X = X.T
        for _ in range(steps):
            A = X @ X.T
            X = a * X + (b * A + c * A @ A) @ X
        return X.T if tall else X


# ----------------------------------------------------------------------------------------------------
# ClipByGlobalNorm around Adam
# ----------------------------------------------------------------------------------------------------

class _ClipAdamBase(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, max_norm=1.0, clip_eps=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, max_norm=max_norm, clip_eps=clip_eps))

    def clipped_grads(self, ps, max_norm, clip_eps):
        total = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in ps))
        c = min(1.0, max_norm / (total + clip_eps)) if total + clip_eps > 0 else 1.0
        return [p.grad * c for p in ps]

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            ps = [p for p in group["params"] if p.grad is not None]
            gs = self.clipped_grads(ps, group["max_norm"], group["clip_eps"])
            for p, g in zip(ps, gs):
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
                p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1 ** t))


class OkClipAdam(_ClipAdamBase):
    """Correct: gradients scaled by min(1, max_norm/(N + eps)) with N the global norm, then Adam."""


class ClipPerTensorAdam(_ClipAdamBase):
    """'Global-norm' clipping that computes and applies the norm of each tensor separately."""

    def clipped_grads(self, ps, max_norm, clip_eps):
        out = []
        for p in ps:                        # BUG: per-tensor norm
            n = float(p.grad.norm())
            c = min(1.0, max_norm / (n + clip_eps)) if n + clip_eps > 0 else 1.0
            out.append(p.grad * c)
        return out


# ----------------------------------------------------------------------------------------------------
# RMSprop
# ----------------------------------------------------------------------------------------------------

class RMSpropCenteredStaleMean(torch.optim.Optimizer):
    """Centered RMSprop that subtracts the square of the gradient average from the previous step
    (a_{t-1}^2) instead of the updated a_t^2."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, centered=True):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, centered=centered))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            alpha, eps = group["alpha"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["square_avg"] = torch.zeros_like(p)
                    st["grad_avg"] = torch.zeros_like(p)
                v, a = st["square_avg"], st["grad_avg"]
                v.mul_(alpha).addcmul_(g, g, value=1 - alpha)
                var = v - a * a                 # BUG: a is still a_{t-1} here
                a.mul_(alpha).add_(g, alpha=1 - alpha)
                p.addcdiv_(g, var.clamp_min(0).sqrt() + eps, value=-group["lr"])


# ----------------------------------------------------------------------------------------------------
# Partition: AdamW with decay on matrices, AdamW without decay on vectors
# ----------------------------------------------------------------------------------------------------

class _SplitAdamWBase(torch.optim.Optimizer):
    """AdamW with decoupled decay ``weight_decay`` on 2-D params and no decay on the others."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def decay_of(self, p, wd):
        return wd if p.ndim == 2 else 0.0

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
                p.mul_(1 - lr * self.decay_of(p, group["weight_decay"]))
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


class OkSplitAdamW(_SplitAdamWBase):
    """Correct: decoupled decay on matrices only, plain Adam on vectors."""


class SplitAdamWDecayEverything(_SplitAdamWBase):
    """Intended matrices-only decay, but the ndim test is on the wrong object so biases and gains are
    decayed too."""

    def decay_of(self, p, wd):
        return wd if p.grad.ndim >= 1 else 0.0   # BUG: every tensor with ndim >= 1 passes

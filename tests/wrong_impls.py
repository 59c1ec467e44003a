"""Deliberately wrong optimizer implementations (torch and optax), each with one convention bug, for the
plug-in cross-check: every one must be caught and diagnosed by name (tests/test_plugin_crosscheck.py).
Also correct hand-written ones, which must pass. Written from the equations, not from the libraries."""
import math

import torch


class MyAdam(torch.optim.Optimizer):
    """Adam as torch.optim.Adam (correct), with switches for the bugs below."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decay="l2",
                 eps_inside=False, off_by_one=False, no_bias=False, eps_hat=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.opts = dict(decay=decay, eps_inside=eps_inside, off_by_one=off_by_one, no_bias=no_bias, eps_hat=eps_hat)

    @torch.no_grad()
    def step(self):
        o = self.opts
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"] + (1 if o["off_by_one"] else 0)
                if wd and o["decay"] == "l2":
                    g = g + wd * p
                if wd and o["decay"] == "decoupled":
                    p.mul_(1 - lr * wd)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = (1.0, 1.0) if o["no_bias"] else (1 - b1 ** t, 1 - b2 ** t)
                if o["eps_hat"]:
                    p.addcdiv_(m, v.sqrt().add_(eps), value=-lr * math.sqrt(bc2) / bc1)
                elif o["eps_inside"]:
                    p.addcdiv_(m, (v / bc2 + eps).sqrt(), value=-lr / bc1)
                else:
                    p.addcdiv_(m, (v.sqrt() / math.sqrt(bc2)).add_(eps), value=-lr / bc1)
                if wd and o["decay"] == "after":
                    p.mul_(1 - lr * wd)


class MySGD(torch.optim.Optimizer):
    """torch.optim.SGD (correct), with switches: dampen_first, decoupled (weight decay x(1 - lr wd))."""

    def __init__(self, params, lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
                 dampen_first=False, decoupled=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
                                      weight_decay=weight_decay))
        self.dampen_first, self.decoupled = dampen_first, decoupled

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mu, tau = group["lr"], group["momentum"], group["dampening"]
            for p in group["params"]:
                g = p.grad
                if group["weight_decay"] and self.decoupled:
                    p.mul_(1 - lr * group["weight_decay"])
                elif group["weight_decay"]:
                    g = g + group["weight_decay"] * p
                if mu:
                    st = self.state[p]
                    if "momentum_buffer" not in st:
                        b = torch.clone(g) * ((1 - tau) if self.dampen_first else 1.0)
                        st["momentum_buffer"] = b
                    else:
                        b = st["momentum_buffer"]
                        b.mul_(mu).add_(g, alpha=1 - tau)
                    u = g + mu * b if group["nesterov"] else b
                else:
                    u = g
                p.add_(u, alpha=-lr)


def adam_eps_inside(params, **kw):
    return MyAdam(params, eps_inside=True, **kw)


def adam_off_by_one(params, **kw):
    return MyAdam(params, off_by_one=True, **kw)


def adamw_decay_after(params, **kw):
    return MyAdam(params, decay="after", **kw)


def adamw_as_l2(params, **kw):
    return MyAdam(params, decay="l2", **kw)


def sgd_dampen_first(params, **kw):
    return MySGD(params, dampen_first=True, **kw)


def sgd_decoupled_decay(params, **kw):
    return MySGD(params, decoupled=True, **kw)


# ------------------------------------------------------------------------------------------------------
# optax (built from optax's own transformations, each with one convention changed)
def optax_adam_no_bias(learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        z = jax.tree_util.tree_map(jnp.zeros_like, params)
        return (z, z)

    def update(g, state, params=None):
        m, v = state
        m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
        u = jax.tree_util.tree_map(lambda a, b: -learning_rate * a / (jnp.sqrt(b) + eps), m, v)
        return u, (m, v)

    return optax.GradientTransformation(init, update)


def optax_adam_eps_hat(learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    import jax
    import jax.numpy as jnp
    import optax

    def init(params):
        z = jax.tree_util.tree_map(jnp.zeros_like, params)
        return (jnp.zeros([], jnp.int32), z, z)

    def update(g, state, params=None):
        t, m, v = state
        t = t + 1
        m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
        tf = t.astype(m[0].dtype)
        step = learning_rate * jnp.sqrt(1 - b2 ** tf) / (1 - b1 ** tf)
        u = jax.tree_util.tree_map(lambda a, b: -step * a / (jnp.sqrt(b) + eps), m, v)
        return u, (t, m, v)

    return optax.GradientTransformation(init, update)


def optax_adamw_lr_free_decay(learning_rate, weight_decay, b1=0.9, b2=0.999, eps=1e-8):
    """decay added after the learning-rate scaling: x - lr u - wd x (lr-independent)."""
    import optax
    return optax.chain(optax.scale_by_adam(b1, b2, eps), optax.scale_by_learning_rate(learning_rate),
                       optax.add_decayed_weights(-weight_decay))


def optax_adam_eps_root(learning_rate, eps):
    """eps inside the square root (optax's eps_root) in place of after it."""
    import optax
    return optax.adam(learning_rate, eps=0.0, eps_root=eps)


def optax_sgd_nesterov_missing(learning_rate, momentum):
    import optax
    return optax.sgd(learning_rate, momentum=momentum, nesterov=False)

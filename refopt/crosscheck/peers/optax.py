"""optax peer: runs ``optax.<name>(**kwargs)`` (or ``optax.contrib.<name>``) on a list of arrays.

JAX float64 is enabled in a scope (``jax.enable_x64(True)``, :func:`refopt.testing.adapters.x64_scope`)
around every JAX call of the runner, so float64 arrays stay float64 (float32 arrays stay float32) and the
global ``jax_enable_x64`` flag of the caller's process is never changed. Params are a Python list of jax arrays;
one step is ``updates, s = tx.update(g, s, params); params = optax.apply_updates(params, updates)``,
jit-compiled once per runner. State keys are optax state field names (``mu``, ``nu``, ``trace``, ``z``)
found with ``optax.tree_utils.tree_get_all_with_path``; the first match shaped like the params is used.

Special constructor ``'ema'`` (CONVENTIONS.md 2.6): optax.ema averages *updates*, refopt.EMA averages
*iterates*. The comparable pairing: run ``optax.sgd(learning_rate, momentum)`` and feed its iterates
x_t to ``optax.ema(decay, debias=True)``; the EMA output is exposed as state key ``'ema'``.

A callable constructor ``ctor(optax, **kwargs) -> GradientTransformation`` builds any other chain (the
divergence atlas's, :mod:`refopt.crosscheck.divergences`).

Adapter keyword ``float64_warmup=True`` (Schedule-Free wrappers only, never passed to optax): optax's
``warmup_steps=W`` builds ``warmup_constant_schedule``, which evaluates count/W from an int32 count in
float32 even under x64 (lr/W = 0.1 comes out as 0.099999994), a 6e-8 relative error in the early
learning rates. With ``float64_warmup`` the adapter instead passes the same warmup as a float64 schedule,
``learning_rate = lambda count: lr * min(count / W, 1)``, and ``warmup_steps=None``; the wrapper then
builds exactly what it builds for ``warmup_steps=W`` (inner ``sgd`` / ``scale_by_learning_rate`` with the
schedule, outer ``schedule_free(learning_rate=schedule)``), so its one-step lag (optax#1744) is compared
at float64 precision.
"""
from __future__ import annotations

import numpy as np

from refopt.crosscheck.peers import require


def load():
    require("jax", "optax")
    return require("optax", "optax")


def _x64():
    from refopt.testing.adapters import x64_scope
    return x64_scope(True)


def float64_warmup(lr: float, warmup_steps: int):
    """optax's ``warmup_constant_schedule(0, lr, W)`` evaluated in float64: count -> lr * min(count/W, 1)."""
    import jax.numpy as jnp

    def schedule(count):
        return lr * jnp.minimum(jnp.asarray(count, jnp.float64) / warmup_steps, 1.0)

    return schedule


def _build(optax, ctor, kw: dict):
    if callable(ctor):      # a builder optax -> GradientTransformation (the divergence atlas's chains)
        return ctor(optax, **kw)
    if ctor.startswith("chain:"):     # "chain:clip_by_global_norm+adam": a clipping stage, then an optimizer
        clip, opt = ctor[len("chain:"):].split("+")
        kw = dict(kw)
        return optax.chain(getattr(optax, clip)(kw.pop("max_norm")), _build(optax, opt, kw))
    if kw.pop("float64_warmup", False):
        kw["learning_rate"] = float64_warmup(kw["learning_rate"], kw.pop("warmup_steps"))
    obj = optax
    for part in ctor.split("."):
        obj = getattr(obj, part)
    return obj(**kw)


class OptaxRunner:
    def __init__(self, preset, leaves, dtype):
        with _x64():
            self._init(preset, leaves, dtype)

    def _init(self, preset, leaves, dtype):
        optax = load()
        import jax
        import jax.numpy as jnp

        self.jnp = jnp
        self.preset = preset
        self.params = [jnp.asarray(x) for x in leaves]
        ctor, kw = preset.peer_call
        kw = dict(kw)
        self.is_ema = ctor == "ema"
        if self.is_ema:
            decay = kw.pop("decay")
            tx = optax.sgd(**kw)
            ema = optax.ema(decay, debias=True)
            self.ema_state = ema.init(self.params)
            self.ema_value = None
        else:
            tx = _build(optax, ctor, kw)
        self.state = tx.init(self.params)
        self.sign = -1.0 if preset.negate_peer_grads else 1.0

        def step(params, state, grads):
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        self._step = jax.jit(step)
        if self.is_ema:
            self._ema = jax.jit(lambda x, s: ema.update(x, s))
        self.optax = optax

    def step(self, grads):
        with _x64():
            g = [self.jnp.asarray(self.sign * a if self.sign != 1.0 else a) for a in grads]
            self.params, self.state = self._step(self.params, self.state, g)
            if self.is_ema:
                self.ema_value, self.ema_state = self._ema(self.params, self.ema_state)

    def get_params(self):
        return [np.asarray(p) for p in self.params]

    def get_state(self):
        out = {}
        shapes = [p.shape for p in self.params]
        for field, key in self.preset.state.items():
            if key == "ema":
                out[field] = [np.asarray(a) for a in self.ema_value]
                continue
            found = None
            for _, val in self.optax.tree_utils.tree_get_all_with_path(self.state, key):
                if isinstance(val, (list, tuple)) and [getattr(a, "shape", None) for a in val] == shapes:
                    found = val
                    break
            if found is None:
                raise KeyError(f"optax state has no entry {key!r} shaped like the params")
            out[field] = [np.asarray(a) for a in found]
        return out


def make(preset, leaves, dtype):
    return OptaxRunner(preset, leaves, dtype)

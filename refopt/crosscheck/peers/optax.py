"""optax peer: ``optax.<name>(**kwargs)`` (or ``optax.contrib.<name>``) as an
:class:`~refopt.testing.adapters.OptaxAdapter` on a list of arrays.

JAX float64 is enabled in a scope (``jax.enable_x64(True)``, :func:`refopt.testing.adapters.x64_scope`)
around every JAX call of the adapter, so float64 arrays stay float64 (float32 arrays stay float32) and the
global ``jax_enable_x64`` flag of the caller's process is never changed. One step is ``updates, s =
tx.update(g, s, params); params = optax.apply_updates(params, updates)``, jit-compiled once per adapter.
State entries are named by their path in optax's state (``[0].mu``, ``z``); a preset's state key (``mu``,
``nu``, ``trace``, ``z``) is the entry of that name or the first whose path ends in it, shaped like the
params (:func:`refopt.crosscheck.run.state_entry`).

Special constructor ``'ema'`` (CONVENTIONS.md 2.6): optax.ema averages *updates*, refopt.EMA averages
*iterates*. The comparable pairing (:class:`IterateEMA`): run ``optax.sgd(learning_rate, momentum)`` and
feed its iterates x_t to ``optax.ema(decay, debias=True)``; the EMA output is the state entry ``'ema'``.

Special constructor ``'chain:<clip>+<optimizer>'``: ``optax.chain(optax.<clip>(max_norm), <optimizer>)``.
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

from refopt import tree as T
from refopt.crosscheck.peers import require
from refopt.testing.adapters import OptaxAdapter


def load():
    require("jax", "optax")
    return require("optax", "optax")


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


def preset_adapter(preset, factory=None):
    """The preset's optax call as an OptaxAdapter (the special constructors of the module docstring);
    ``factory(**kwargs)`` replaces the constructor."""
    optax = load()
    ctor, kw = preset.peer_call
    kw = dict(kw)
    name = f"optax.{ctor}" if isinstance(ctor, str) else f"optax chain {getattr(ctor, '__name__', ctor)}"
    if factory is not None:
        return OptaxAdapter(factory, kw, name=name)
    if ctor == "ema":
        return IterateEMA(kw.pop("decay"), kw)
    return OptaxAdapter(lambda: _build(optax, ctor, dict(kw)), name=name)


class IterateEMA(OptaxAdapter):
    """``optax.sgd(**sgd_kwargs)`` whose iterates x_t are fed to ``optax.ema(decay, debias=True)``; its output
    (the debiased EMA of the iterates) is the state entry ``'ema'``."""

    def __init__(self, decay: float, sgd_kwargs: dict):
        optax = load()
        super().__init__(optax.sgd, sgd_kwargs, name=f"optax.ema({decay!r}, debias=True) of optax.sgd's iterates")
        self.ema = optax.ema(decay, debias=True)
        self._ema = self.jax.jit(lambda x, s: self.ema.update(x, s))

    def init(self, params):
        inner = super().init(params)
        with self._scope():
            return inner, self.ema.init(self._to_jax(T.flatten(params)[0])), None

    def step(self, state, params, grads):
        inner, ema_state, _ = state
        new, inner = super().step(inner, params, grads)
        with self._scope():
            value, ema_state = self._ema(self._to_jax(T.flatten(new)[0]), ema_state)
        return new, (inner, ema_state, value)

    def state_arrays(self, state) -> dict:
        value = state[2]
        return {} if value is None else {"ema": [np.asarray(a) for a in value]}

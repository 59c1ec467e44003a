"""A multilayer perceptron as pure functions over a params pytree (layout x @ W, W of shape (fan_in, fan_out)).

    params = {"layers": [{"w": (fan_in, fan_out), "b": (fan_out,)}, ...]}
    h_0 = x,   h_{l+1} = act(h_l @ W_l + b_l)  (l < L-1),   logits = h_{L-1} @ W_{L-1} + b_{L-1}

Works on plain ndarrays (returns ndarrays) and under ``refopt.autograd.value_and_grad`` (returns nodes).
"""
from __future__ import annotations

import numpy as np

from refopt import autograd as ag
from refopt.labels import mlp_labels

ACTIVATIONS = {"relu": ag.relu, "tanh": ag.tanh, "gelu": ag.gelu}


def init(rng_or_seed, sizes, dtype=np.float64, gain: float | None = None, activation: str = "relu"):
    """He/LeCun-style normal init: W_l ~ N(0, gain^2 / fan_in), b_l = 0.

    ``gain`` defaults to sqrt(2) for relu and 1 for tanh and gelu (He et al. 2015, arXiv:1502.01852;
    LeCun et al. 1998). ``rng_or_seed`` is an int seed or a ``numpy.random.Generator``; the draws are
    made in float64 and cast to ``dtype``, so float32 and float64 params agree to float32 rounding.

    Shapes: sizes = [d_0, d_1, ..., d_L] gives L layers, W_l (d_l, d_{l+1}), b_l (d_{l+1},).
    Raises: ValueError for fewer than two sizes, a non-positive size, a non-floating dtype, an unknown
    activation or gain <= 0.
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes must list at least two positive layer widths, got {sizes}")
    if np.dtype(dtype).kind != "f":
        raise ValueError(f"dtype must be floating, got {np.dtype(dtype)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    if gain is None:
        gain = np.sqrt(2.0) if activation == "relu" else 1.0
    if gain <= 0:
        raise ValueError(f"gain must be > 0, got {gain}")
    rng = rng_or_seed if isinstance(rng_or_seed, np.random.Generator) else np.random.default_rng(rng_or_seed)
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * (gain / np.sqrt(fan_in))
        layers.append({"w": w.astype(dtype), "b": np.zeros(fan_out, dtype)})
    return {"layers": layers}


def apply(params, x, activation: str = "relu"):
    """Logits (N, d_L) for inputs x (N, d_0); ``activation`` between layers ('relu' default, 'tanh',
    'gelu'), none after the last. x is cast to the params' dtype (float32 params give float32 logits).

    Raises: ValueError for an unknown activation or an x whose last axis is not d_0.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
    act = ACTIVATIONS[activation]
    layers = params["layers"]
    w0 = layers[0]["w"]
    x = np.asarray(x, dtype=w0.dtype)
    if x.shape[-1] != w0.shape[0]:
        raise ValueError(f"x has {x.shape[-1]} features, the first layer expects {w0.shape[0]}")
    h = x
    for i, layer in enumerate(layers):
        h = h @ layer["w"] + layer["b"]
        if i < len(layers) - 1:
            h = act(h)
    return h


def loss(params, x, y, activation: str = "relu"):
    """Mean softmax cross-entropy of ``apply(params, x)`` against integer labels y (N,)."""
    return ag.cross_entropy(apply(params, x, activation), y)


def accuracy(params, x, y, activation: str = "relu") -> float:
    """Fraction of rows whose arg-max logit equals the label (plain arrays only)."""
    return float(np.mean(np.argmax(apply(params, x, activation), axis=-1) == np.asarray(y)))


def labels(params, first: str = "hidden", last: str = "other"):
    """The labels tree of an MLP for ``refopt.Partition(labels=...)``: :func:`refopt.mlp_labels` (see there)."""
    return mlp_labels(params, first, last)

"""Joint parameter symmetries of the pre-norm GPT (post 000, "From parameter symmetry to effective
learning rate"): rescalings of weights by c > 0 that leave the logits, hence the loss, unchanged.

A symmetry multiplies its ``up`` members by c and divides its ``down`` members by c:

    name         up (x c)                      down (/ c)                              needs
    qk           W_q (columns)                 W_k (columns)
    vo           W_v (columns)                 W_o (rows)
    up_down      W_up (columns)                W_down (rows)                           ffn swiglu / reglu
    gate_down    W_gate (columns)              W_down (rows)                           ffn reglu
    gate_up      W_gate (columns)              W_up (columns)                          ffn reglu
    attn_norm    attn_norm gain                W_q, W_k, W_v (rows)
    mlp_norm     mlp_norm gain                 W_up, W_gate (rows)                     (W_up only for gelu)
    final_norm   final_norm gain               lm_head (rows)                          untied head
    q_scale      W_q (columns)                 -                                       qk_norm
    k_scale      W_k (columns)                 -                                       qk_norm

Why they hold (x @ W layout, W of shape (fan_in, fan_out)): q k^T and P v W_o are bilinear; the GLU
(x W_up * psi(x W_gate)) W_down is bilinear in (W_up, W_down) for any psi and positively homogeneous in
W_gate when psi = ReLU (not SiLU); an RMSNorm gain feeds only the matrices that read its output; QK-norm
removes the scale of each head's q and k. The rescalings also hold per channel, and c may be a vector:
length n_embd (per channel) or n_head (per head) for the attention symmetries, ffn_hidden for the FFN
ones, n_embd for the norm gains. Exceptions: with QK-norm, ``qk``, ``q_scale`` and ``k_scale`` are exact
only per head (per-channel scaling changes each head's RMS), and ``q_scale`` / ``k_scale`` are exact
only with ``norm_eps = 0`` (with eps > 0 they hold up to O(eps / mean(q^2))).

Differentiating at c = 1 gives the gradient identity (post 000)
    sum_{w in up} <w, dL/dw>  -  sum_{w in down} <w, dL/dw>  =  0,
which :func:`gradient_identity` evaluates. Functions here never modify their inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .gpt import GPTConfig

GLU = ("swiglu", "reglu")


@dataclass(frozen=True)
class Symmetry:
    """``up`` / ``down``: (member, axis) pairs; member is a path inside a block ('attn.w_q') or a
    top-level key ('final_norm'); axis is the axis a per-channel scale runs along. ``dim`` names the
    channel count ('C' or 'F'); ``per_block`` says whether a layer index is needed."""

    name: str
    up: tuple
    down: tuple
    dim: str = "C"
    per_block: bool = True


def _table(config: GPTConfig) -> dict[str, Symmetry]:
    glu = config.ffn in GLU
    mlp_in = (("mlp.w_up", 0), ("mlp.w_gate", 0)) if glu else (("mlp.w_up", 0),)
    out = {
        "qk": Symmetry("qk", (("attn.w_q", 1),), (("attn.w_k", 1),)),
        "vo": Symmetry("vo", (("attn.w_v", 1),), (("attn.w_o", 0),)),
        "attn_norm": Symmetry("attn_norm", (("attn_norm", 0),), (("attn.w_q", 0), ("attn.w_k", 0), ("attn.w_v", 0))),
        "mlp_norm": Symmetry("mlp_norm", (("mlp_norm", 0),), mlp_in),
    }
    if glu:
        out["up_down"] = Symmetry("up_down", (("mlp.w_up", 1),), (("mlp.w_down", 0),), "F")
    if config.ffn == "reglu":
        out["gate_down"] = Symmetry("gate_down", (("mlp.w_gate", 1),), (("mlp.w_down", 0),), "F")
        out["gate_up"] = Symmetry("gate_up", (("mlp.w_gate", 1),), (("mlp.w_up", 1),), "F")
    if not config.tie_head:
        out["final_norm"] = Symmetry("final_norm", (("final_norm", 0),), (("lm_head", 0),), "C", per_block=False)
    if config.qk_norm:
        out["q_scale"] = Symmetry("q_scale", (("attn.w_q", 1),), ())
        out["k_scale"] = Symmetry("k_scale", (("attn.w_k", 1),), ())
    return out


def available(config: GPTConfig) -> list[str]:
    """Names of the symmetries that hold exactly for ``config`` (see the module table)."""
    return sorted(_table(config))


def table(config: GPTConfig) -> dict[str, Symmetry]:
    """``{name: Symmetry}`` for every symmetry that holds exactly for ``config``."""
    return _table(config)


def _path(member: str, layer: int | None) -> str:
    return member if layer is None else f"blocks[{layer}].{member}"


def members(config: GPTConfig, name: str, layer: int | None = None) -> tuple[list[str], list[str]]:
    """Leaf paths (e.g. 'blocks[0].attn.w_q') of the up and down members of symmetry ``name``."""
    sym = _lookup(config, name, layer)
    return [_path(m, layer) for m, _ in sym.up], [_path(m, layer) for m, _ in sym.down]


def _lookup(config: GPTConfig, name: str, layer: int | None) -> Symmetry:
    table = _table(config)
    if name not in table:
        raise ValueError(f"symmetry {name!r} does not hold for this config (ffn={config.ffn!r}, "
                         f"tie_head={config.tie_head}, qk_norm={config.qk_norm}); available: {sorted(table)}")
    sym = table[name]
    if sym.per_block and (layer is None or not 0 <= layer < config.n_layer):
        raise ValueError(f"symmetry {name!r} needs a layer index in [0, {config.n_layer}), got {layer!r}")
    if not sym.per_block and layer is not None:
        raise ValueError(f"symmetry {name!r} is not per block; pass layer=None")
    return sym


def _scales(config: GPTConfig, sym: Symmetry, c) -> np.ndarray:
    """c as a float64 per-channel vector (or a scalar array); raises for c <= 0 or a bad length."""
    c = np.asarray(c, dtype=np.float64)
    if c.ndim > 1 or not np.all(np.isfinite(c)) or not np.all(c > 0):
        raise ValueError("c must be a finite positive scalar or vector")
    if c.ndim == 0:
        return c
    n = config.ffn_hidden if sym.dim == "F" else config.n_embd
    attention = sym.dim == "C" and any(m.startswith("attn.") for m, _ in sym.up)
    head_only = attention and config.qk_norm and sym.name in ("qk", "q_scale", "k_scale")
    if attention and len(c) == config.n_head:
        return np.repeat(c, config.head_size)
    if len(c) == n and not head_only:
        return c
    per_head = f"{config.n_head} (per head)"
    allowed = per_head if head_only else (f"{n} or {per_head}" if attention else f"{n}")
    raise ValueError(f"symmetry {sym.name!r}: c must be a scalar or a vector of length {allowed}, got {len(c)}")


def _get(params: dict, member: str, layer: int | None):
    node = params if layer is None else params["blocks"][layer]
    for key in member.split("."):
        node = node[key]
    return node


def _set(params: dict, member: str, layer: int | None, value) -> None:
    keys = member.split(".")
    node = params if layer is None else params["blocks"][layer]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value


def _copy_containers(params):
    """New dicts / lists all the way down, sharing the (unmodified) leaf arrays."""
    if isinstance(params, dict):
        return {k: _copy_containers(v) for k, v in params.items()}
    if isinstance(params, list):
        return [_copy_containers(v) for v in params]
    return params


def _scaled(w: np.ndarray, c: np.ndarray, axis: int, power: int) -> np.ndarray:
    s = c if power == 1 else 1.0 / c
    if s.ndim == 1 and w.ndim == 2:
        s = s[:, None] if axis == 0 else s[None, :]
    return w * s.astype(w.dtype)


def _apply(params: dict, config: GPTConfig, sym: Symmetry, c, layer: int | None) -> dict:
    cv = _scales(config, sym, c)
    out = _copy_containers(params)
    for group, power in ((sym.up, 1), (sym.down, -1)):
        for member, axis in group:
            _set(out, member, layer, _scaled(_get(params, member, layer), cv, axis, power))
    return out


def rescale(params: dict, config: GPTConfig, up, down, c, layer: int | None = None, dim: str = "C") -> dict:
    """Multiply the members in ``up`` by c and divide those in ``down`` by c, with no check that this is
    a symmetry (used for negative controls). ``up`` / ``down`` are (member, axis) pairs as in
    :class:`Symmetry`; a vector c has length n_embd (dim 'C') or ffn_hidden (dim 'F'). Returns new
    params; the input is not modified."""
    return _apply(params, config, Symmetry("rescale", tuple(up), tuple(down), dim, layer is not None), c, layer)


def transform(params: dict, config: GPTConfig, name: str, c, layer: int | None = None) -> dict:
    """Apply symmetry ``name`` with scale c > 0 (scalar or per-channel / per-head vector) at ``layer``.

    Returns new params whose logits equal the input's (exactly in real arithmetic; to rounding in
    floating point). Raises ValueError for a symmetry that does not hold for ``config``, a missing or
    out-of-range layer (or a layer for ``final_norm``), or a non-positive / wrongly sized c.
    """
    return _apply(params, config, _lookup(config, name, layer), c, layer)


class Identity(NamedTuple):
    """``residual`` = sum_up <w, g_w> - sum_down <w, g_w>; ``dot_scale`` = sum over members of
    |<w, g_w>|; ``norm_scale`` = sum over members of ||w|| ||g_w|| (Cauchy-Schwarz bound)."""

    residual: float
    dot_scale: float
    norm_scale: float


def gradient_identity(params: dict, grads: dict, config: GPTConfig, name: str,
                      layer: int | None = None) -> Identity:
    """The seed-000 gradient identity of symmetry ``name`` at ``layer``: the residual is 0 at every
    point. Test it relative to ``dot_scale`` (|w1.g1| + |w2.g2|); for the QK-norm invariances, whose
    terms vanish one by one (w.g = 0), relative to ``norm_scale``. grads: the loss gradient pytree."""
    sym = _lookup(config, name, layer)
    res = dot = norm = 0.0
    for group, sign in ((sym.up, 1.0), (sym.down, -1.0)):
        for member, _ in group:
            w, g = _get(params, member, layer), _get(grads, member, layer)
            d = float(np.vdot(w, g))
            res += sign * d
            dot += abs(d)
            norm += float(np.linalg.norm(w) * np.linalg.norm(g))
    return Identity(res, dot, norm)

"""The shape of a Muon step: the (fan_in, fan_out) view of a parameter and the step multiplier s of its
shape (post 003; muP's spectral condition; Keller Jordan's, Moonlight's, torch's and optax's scales)."""
from __future__ import annotations

import math

from refopt.kernels import AXPBY, Axpby
from refopt.rules import _checks
from refopt.scalars import cast_scalar

_SCALES = ("spectral", "jordan", "jordan_4d", "rms_match", "none")


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D (fan_in, fan_out) view of a parameter in refopt's ``x @ W`` layout: the last axis is the
    output, all leading axes are flattened into the input, fan_in = prod(shape[:-1]), fan_out = shape[-1].
    A conv kernel in (kh, kw, in, out) "HWIO" layout (flax / optax) becomes (kh*kw*in, out). A torch
    (out, in, kh, kw) kernel must be transposed to that layout first (PITFALLS B07)."""
    if len(shape) < 2:
        raise ValueError(f"matrix_shape needs ndim >= 2, got shape {shape}")
    return int(math.prod(shape[:-1])), int(shape[-1])


def muon_scale(shape: tuple[int, ...], scale: str = "spectral") -> float:
    """The Muon step multiplier s for a parameter of this shape (flattened by :func:`matrix_shape`):

    * ``'spectral'``:  sqrt(fan_out / fan_in)        (post 003; muP spectral condition, Yang et al. 2023)
    * ``'jordan'``:    sqrt(max(1, fan_out / fan_in)) (KellerJordan/Muon and torch 'original' on their
      (out, in) arrays; optax ``scale_by_shape`` on (in, out) arrays)
    * ``'jordan_4d'``: KellerJordan/Muon's scale for 4-D conv filters, read from the 4-D shape in refopt's
      (kh, kw, fan_in, fan_out) layout: sqrt(max(1, kh/kw)) (what its code computes from torch's
      (out, in, kh, kw) as max(1, size(-2)/size(-1))**0.5); on a 2-D array it equals ``'jordan'``; other
      ndims raise ValueError
    * ``'rms_match'``: 0.2 * sqrt(max(fan_in, fan_out)) (Moonlight; torch 'match_rms_adamw'; optax
      ``consistent_rms=0.2``): the update RMS matches AdamW's ~0.2
    * ``'none'``:      1
    """
    _checks.one_of("scale", scale, set(_SCALES))
    if scale == "jordan_4d":
        if len(shape) == 4:
            kh, kw = shape[0], shape[1]
            return math.sqrt(max(1.0, kh / kw)) if kw else 1.0
        if len(shape) != 2:
            raise ValueError(f"scale 'jordan_4d' takes 2-D or 4-D (kh, kw, fan_in, fan_out) arrays, got shape {shape}")
        scale = "jordan"
    fi, fo = matrix_shape(shape)
    if fi == 0 or fo == 0:
        return 1.0
    if scale == "spectral":
        return math.sqrt(fo / fi)
    if scale == "jordan":
        return math.sqrt(max(1.0, fo / fi))
    if scale == "rms_match":
        return 0.2 * math.sqrt(max(fi, fo))
    return 1.0


class ShapeScaledStep:
    """The step of a matrix rule that computes an update U_t on the (fan_in, fan_out) view and applies
    x_t = ctx.decay * x_{t-1} - lr_t s U_t, s = :func:`muon_scale` of its ``scale`` (Muon, NorMuon, Dion). The
    rule defines ``_update(ctx, s, x, g) -> U_t`` (a new array, the state advanced in place); ``ctx`` has ``lr_t``
    and ``decay``. lr_t s is formed in float64 and cast checked, for every array before any is written."""

    def _step_scalars(self, ctx, x) -> Axpby:
        """(decay, lr_t * s) for x, the product formed in float64 and cast checked."""
        step = float(ctx.lr_t) * muon_scale(x.shape, self.scale)
        return Axpby(ctx.decay, cast_scalar(step, x.dtype, f"{type(self).__name__}.lr_t * scale", True))

    def prepare(self, ctx, ss, xs, gs, paths):
        for x in xs:
            self._step_scalars(ctx, x)
        return gs

    def update_leaf(self, ctx, s, x, g, path):
        U = self._update(ctx, s, x, g)
        AXPBY.step(x, U, (), self._step_scalars(ctx, x))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        U = self._update(ctx, s, x, g)
        U *= x.dtype.type(muon_scale(x.shape, self.scale))
        return U.reshape(x.shape), s

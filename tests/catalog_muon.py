"""Catalog entries for Muon (see catalog.py). Muon takes matrices only, so every case uses matrix_params.

With a constant lr the Muon step has spectral norm lr*s whatever the gradient size (msign has unit
singular values), so it circles a minimum at distance ~lr instead of settling: only the cases with a
schedule decaying to 0 are marked as converging.
"""
import numpy as np
from catalog import Case, matrix_params

from refopt.rules.muon import Muon
from refopt.schedules import warmup_cosine

def conv_params(dtype=np.float64, seed=0) -> dict:
    """4-D conv filters in refopt's (kh, kw, fan_in, fan_out) layout and a matrix."""
    rng = np.random.default_rng(seed)
    return {"conv": rng.standard_normal((3, 2, 4, 5)).astype(dtype), "w": rng.standard_normal((6, 4)).astype(dtype)}


_FIXED_LR = "constant lr: the msign step keeps spectral norm lr*s, so Muon orbits the minimum at radius ~lr"

CASES = [
    Case("muon_jordan_4d_conv", lambda: Muon(lr=0.05, scale="jordan_4d"), conv_params, converges=False,
         note=_FIXED_LR),
    Case("muon", lambda: Muon(lr=0.05), matrix_params, converges=False, note=_FIXED_LR),
    Case("muon_jordan_wd", lambda: Muon(lr=0.05, scale="jordan", weight_decay=0.01), matrix_params,
         converges=False, note=_FIXED_LR),
    Case("muon_rms_match_independent_wd", lambda: Muon(lr=0.05, scale="rms_match", weight_decay=1e-3,
                                                       wd_mode="independent"), matrix_params,
         converges=False, note=_FIXED_LR),
    Case("muon_plain_momentum_svd", lambda: Muon(lr=0.05, nesterov=False, msign="svd", scale="none"),
         matrix_params, converges=False, note=_FIXED_LR),
    Case("muon_polar_express", lambda: Muon(lr=0.05, ns_coeffs="polar_express", ns_steps=8), matrix_params,
         converges=False, note=_FIXED_LR),
    Case("muon_like_torch", lambda: Muon.like_torch(lr=0.05), matrix_params, converges=False, note=_FIXED_LR),
    Case("muon_like_optax", lambda: Muon.like_optax(0.05, ns_coeffs="dion"), matrix_params,
         converges=False, note=_FIXED_LR),
    Case("muon_cosine", lambda: Muon(lr=0.1, schedule=warmup_cosine(5, 300, 0.0)), matrix_params),
    Case("muon_svd_cosine_wd", lambda: Muon(lr=0.1, msign="svd", weight_decay=1e-3,
                                            schedule=warmup_cosine(0, 300, 0.0)), matrix_params),
]

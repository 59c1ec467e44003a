"""Catalog entries for SGD, Adam and AdamW (with NAdam, AMSGrad), Lion and clipping (see catalog.py)."""
import refopt
from catalog import Case

_GLOBAL = {"not_leafwise": "clipping by the global norm couples the leaves (each leaf alone has its own norm)"}

CASES = [
    Case("sgd", lambda: refopt.SGD(lr=0.05)),
    Case("sgd_momentum_dampening", lambda: refopt.SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    Case("sgd_nesterov", lambda: refopt.SGD(lr=0.05, momentum=0.9, nesterov=True)),
    Case("adam", lambda: refopt.Adam(lr=0.05, weight_decay=1e-3)),
    Case("adamw_decoupled", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01)),
    Case("adamw_independent", lambda: refopt.AdamW(lr=0.05, weight_decay=1e-3, wd_mode="independent")),
    Case("nadam_l2", lambda: refopt.Adam(lr=0.05, weight_decay=1e-3, nesterov=True)),
    Case("nadamw_decoupled", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01, nesterov=True)),
    Case("amsgrad_torch", lambda: refopt.Adam(lr=0.05, weight_decay=1e-3, amsgrad=True)),
    Case("amsgradw_optax", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01, amsgrad="bias_corrected")),
    Case("nadam_torch", lambda: refopt.Adam(lr=0.05, nesterov=True, momentum_decay=4e-3)),
    Case("nadamw_torch", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01, nesterov=True, momentum_decay=4e-3)),
    Case("lion", lambda: refopt.Lion(lr=0.01, weight_decay=0.1), converges=False,
         note="constant lr: every sign step has size lr, so Lion orbits the minimum at distance ~lr"),
    Case("clip_adam", lambda: refopt.ClipByGlobalNorm(refopt.Adam(lr=0.05), max_norm=0.5), extra=_GLOBAL),
    Case("clip_sgd_torch", lambda: refopt.ClipByGlobalNorm(refopt.SGD(lr=0.05, momentum=0.9), max_norm=0.5, eps=1e-6),
         extra=_GLOBAL),
]

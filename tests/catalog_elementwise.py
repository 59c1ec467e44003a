"""Catalog entries for SGD, Adam and AdamW (with NAdam, nesterov=True) (see catalog.py)."""
import refopt
from catalog import Case

CASES = [
    Case("sgd", lambda: refopt.SGD(lr=0.05)),
    Case("sgd_momentum_dampening", lambda: refopt.SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    Case("sgd_nesterov", lambda: refopt.SGD(lr=0.05, momentum=0.9, nesterov=True)),
    Case("adam", lambda: refopt.Adam(lr=0.05, weight_decay=1e-3)),
    Case("adamw_decoupled", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01)),
    Case("adamw_independent", lambda: refopt.AdamW(lr=0.05, weight_decay=1e-3, wd_mode="independent")),
    Case("nadam_l2", lambda: refopt.Adam(lr=0.05, weight_decay=1e-3, nesterov=True)),
    Case("nadamw_decoupled", lambda: refopt.AdamW(lr=0.05, weight_decay=0.01, nesterov=True)),
]

"""Optimizer names of the command line and how each becomes a refopt rule.

One table, ``OPTIMIZERS``: name -> (builder, default lr, help). A builder takes the parsed arguments and
the peak lr and returns a rule. ``add_arguments`` declares the hyperparameter options they read.
"""
from __future__ import annotations

import argparse

import refopt


def _sgd(a, lr):
    return refopt.SGD(lr=lr, momentum=a.momentum, nesterov=a.nesterov, weight_decay=a.weight_decay,
                      schedule=a.schedule_fn)


def _adam(a, lr):
    return refopt.Adam(lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps, weight_decay=a.weight_decay,
                       schedule=a.schedule_fn)


def _adamw(a, lr):
    return refopt.AdamW(lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps,
                        weight_decay=a.weight_decay if a.weight_decay is not None else 0.01,
                        wd_mode=a.wd_mode, schedule=a.schedule_fn)


OPTIMIZERS = {
    "sgd": (_sgd, 0.1, "SGD (torch semantics): --momentum, --nesterov, --weight-decay (L2)"),
    "adam": (_adam, 3e-3, "Adam, L2 --weight-decay"),
    "adamw": (_adamw, 3e-3, "AdamW: --weight-decay (default 0.01), --wd-mode decoupled|independent"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", default=None, choices=sorted(OPTIMIZERS),
                   help="the rule (default: adamw); " + "; ".join(f"{k}: {v[2]}" for k, v in OPTIMIZERS.items()))
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per optimizer)")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum mu")
    g.add_argument("--nesterov", action="store_true", help="SGD Nesterov momentum")
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.999)
    g.add_argument("--eps", type=float, default=1e-8)
    g.add_argument("--weight-decay", type=float, default=None,
                   help="lambda (default 0, AdamW 0.01)")
    g.add_argument("--wd-mode", default="decoupled", choices=["decoupled", "independent"])
    g.add_argument("--schedule", default="constant", choices=["constant", "cosine"],
                   help="lr multiplier over the run: constant, or linear warmup (--warmup steps) then cosine to 0")
    g.add_argument("--warmup", type=int, default=0, help="warmup steps of the cosine schedule")


def build_rule(args: argparse.Namespace):
    """The rule named by ``args.optimizer`` with ``args``' hyperparameters (ValueError if invalid)."""
    builder, default_lr, _ = OPTIMIZERS[args.optimizer]
    lr = default_lr if args.lr is None else args.lr
    if args.weight_decay is None and args.optimizer != "adamw":
        args.weight_decay = 0.0
    return builder(args, lr), lr

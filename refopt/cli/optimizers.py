"""Optimizer names of the command line and how each becomes a refopt rule.

One table, ``OPTIMIZERS``: name -> :class:`Entry` (builder, default peak lr per model, help). A builder
takes the parsed arguments, the peak lr, the schedule and the task's labels (which arrays are the
"hidden" matrices) and returns a rule. Names with a ``hidden`` part (muon, muonh, adamh, covariant) are a
:class:`refopt.Partition`: that rule on the hidden matrices, AdamW (``--adam-lr``) on embeddings, gains,
biases, the input layer and the head, as practitioners run Muon.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import refopt


@dataclass(frozen=True)
class Entry:
    build: Callable
    lr: dict            # default peak lr per model name
    help: str
    partitioned: bool = False


def _sgd(a, lr, sched):
    return refopt.SGD(lr=lr, momentum=a.momentum, nesterov=a.nesterov, weight_decay=_wd(a, 0.0), schedule=sched)


def _adam(a, lr, sched):
    return refopt.Adam(lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps, weight_decay=_wd(a, 0.0), schedule=sched)


def _adamw(a, lr, sched, wd=None):
    return refopt.AdamW(lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps,
                        weight_decay=_wd(a, 0.01) if wd is None else wd, wd_mode=a.wd_mode, schedule=sched)


def _muon(a, lr, sched, wd=None):
    return refopt.Muon(lr=lr, momentum=a.muon_momentum, ns_coeffs=a.ns_coeffs, ns_steps=a.ns_steps,
                       scale=a.muon_scale, weight_decay=_wd(a, 0.0) if wd is None else wd, wd_mode=a.wd_mode,
                       schedule=sched)


def _hidden_base(a, name):
    """The direction rule inside Hyperball / Covariant (its own lr and schedule are unused there)."""
    if name == "muon":
        return _muon(a, 1.0, None, wd=0.0)
    if name == "adam":
        return refopt.Adam(lr=1.0, beta1=a.beta1, beta2=a.beta2, eps=a.eps)
    return refopt.SGD(lr=1.0, momentum=a.momentum, nesterov=a.nesterov)


def _wd(a, default):
    return default if a.weight_decay is None else a.weight_decay


def _partition(hidden_rule, a, sched, labels):
    other = _adamw(a, a.adam_lr, sched, wd=0.0 if a.weight_decay is None else a.weight_decay)
    return refopt.Partition(rules={"hidden": hidden_rule, "other": other}, labels=labels)


OPTIMIZERS = {
    "sgd": Entry(lambda a, lr, s, lab: _sgd(a, lr, s), {"mlp": 0.1, "gpt": 0.3},
                 "SGD (torch semantics): --momentum, --nesterov, --weight-decay (L2)"),
    "adam": Entry(lambda a, lr, s, lab: _adam(a, lr, s), {"mlp": 3e-3, "gpt": 3e-3}, "Adam, L2 --weight-decay"),
    "adamw": Entry(lambda a, lr, s, lab: _adamw(a, lr, s), {"mlp": 3e-3, "gpt": 3e-3},
                   "AdamW: --weight-decay (default 0.01), --wd-mode decoupled|independent"),
    "muon": Entry(lambda a, lr, s, lab: _partition(_muon(a, lr, s), a, s, lab), {"mlp": 0.02, "gpt": 0.02},
                  "Muon on the hidden matrices (--muon-scale, --ns-coeffs, --ns-steps, --muon-momentum), "
                  "AdamW elsewhere", partitioned=True),
    "muonh": Entry(lambda a, lr, s, lab: _partition(refopt.Hyperball(_hidden_base(a, "muon"), lr=lr, schedule=s),
                                                    a, s, lab), {"mlp": 0.02, "gpt": 0.02},
                   "Hyperball(Muon) (MuonH, seed 002) on the hidden matrices, AdamW elsewhere", partitioned=True),
    "adamh": Entry(lambda a, lr, s, lab: _partition(refopt.Hyperball(_hidden_base(a, "adam"), lr=lr, schedule=s),
                                                    a, s, lab), {"mlp": 0.02, "gpt": 0.02},
                   "Hyperball(Adam) (AdamH) on the hidden matrices, AdamW elsewhere", partitioned=True),
    "covariant": Entry(lambda a, lr, s, lab: _partition(
        refopt.Covariant(_hidden_base(a, a.covariant_base), lr=lr, schedule=s), a, s, lab),
        {"mlp": 0.02, "gpt": 0.02},
        "Covariant / ELR rule (seed 000, eq. elr-u) over --covariant-base on the hidden matrices, AdamW "
        "elsewhere", partitioned=True),
    "schedulefree-sgd": Entry(lambda a, lr, s, lab: refopt.ScheduleFreeSGD(
        lr=lr, beta=a.sf_beta, warmup_steps=a.warmup, weight_decay=_wd(a, 0.0)), {"mlp": 1.0, "gpt": 1.0},
        "Schedule-Free SGD (Defazio et al. 2024, reference implementation); --warmup"),
    "schedulefree-adamw": Entry(lambda a, lr, s, lab: refopt.ScheduleFreeAdamW(
        lr=lr, beta1=a.sf_beta, beta2=a.beta2, eps=a.eps, warmup_steps=a.warmup, weight_decay=_wd(a, 0.0)),
        {"mlp": 3e-3, "gpt": 3e-3}, "Schedule-Free AdamW (reference implementation); --warmup"),
    "average": Entry(lambda a, lr, s, lab: refopt.Average(_adamw(a, lr, s)), {"mlp": 3e-3, "gpt": 3e-3},
                     "AdamW with a uniform average of the iterates for evaluation (seed 004)"),
    "ema": Entry(lambda a, lr, s, lab: refopt.EMA(_adamw(a, lr, s), decay=a.ema_decay), {"mlp": 3e-3, "gpt": 3e-3},
                 "AdamW with an EMA of the iterates for evaluation (--ema-decay; seed 004)"),
}

#: Schedule-Free rules carry their own warmup and must not get an lr schedule on top
SCHEDULE_FREE = ("schedulefree-sgd", "schedulefree-adamw")


def add_arguments(p: argparse.ArgumentParser, with_name: bool = True) -> None:
    g = p.add_argument_group("optimizer")
    if with_name:
        g.add_argument("--optimizer", default=None, choices=list(OPTIMIZERS),
                       help="the rule (default: muon for the GPT, adamw for the MLP); "
                            + "; ".join(f"{k}: {v.help}" for k, v in OPTIMIZERS.items()))
    g.add_argument("--lr", type=float, default=None,
                   help="peak learning rate of the rule (of the hidden-matrix rule for partitioned ones); "
                        "default per optimizer and model")
    g.add_argument("--adam-lr", type=float, default=3e-3, help="AdamW lr on the non-hidden arrays of "
                                                             "muon/muonh/adamh/covariant")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum mu")
    g.add_argument("--nesterov", action="store_true", help="SGD Nesterov momentum")
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.999)
    g.add_argument("--eps", type=float, default=1e-8)
    g.add_argument("--weight-decay", type=float, default=None,
                   help="lambda (default 0; AdamW 0.01; 0 on the AdamW part of partitioned rules)")
    g.add_argument("--wd-mode", default="decoupled", choices=["decoupled", "independent"])
    g.add_argument("--muon-momentum", type=float, default=0.95)
    g.add_argument("--muon-scale", default="spectral", choices=["spectral", "jordan", "rms_match", "none"])
    g.add_argument("--ns-coeffs", default="jordan", choices=["jordan", "polar_express", "you", "classic"])
    g.add_argument("--ns-steps", type=int, default=5)
    g.add_argument("--covariant-base", default="adam", choices=["adam", "muon", "sgd"])
    g.add_argument("--sf-beta", type=float, default=0.9, help="Schedule-Free interpolation beta (beta1)")
    g.add_argument("--ema-decay", type=float, default=0.99)
    g.add_argument("--schedule", default=None, choices=["constant", "cosine", "wsd"],
                   help="lr multiplier: constant; linear --warmup then cosine to 0; or warmup-stable-decay "
                        "with the last --decay-fraction linear to 0 (default: cosine for the GPT, constant "
                        "for the MLP; Schedule-Free rules take only --warmup)")
    g.add_argument("--warmup", type=int, default=None, help="warmup steps (default: mlp 0, gpt 30 but at most "
                                                            "a tenth of the steps)")
    g.add_argument("--decay-fraction", type=float, default=0.2, help="WSD: fraction of steps in the decay")


def build_schedule(args, steps: int):
    """The lr multiplier t -> gamma_t of ``args`` for a run of ``steps`` steps (None for constant)."""
    from refopt import schedules

    if args.optimizer in SCHEDULE_FREE:
        if args.schedule not in (None, "constant"):
            raise ValueError(f"{args.optimizer} is schedule-free: use --warmup only, not --schedule {args.schedule}")
        # the rule applies this warmup itself (warmup_steps, the same t/W); returned so the lr is logged right
        return schedules.LinearWarmup(args.warmup) if args.warmup else None
    if args.warmup > steps:
        raise ValueError(f"--warmup {args.warmup} exceeds the {steps} steps of the run")
    if args.schedule == "cosine":
        return schedules.warmup_cosine(args.warmup, steps, floor=0.0)
    if args.schedule == "wsd":
        if not 0.0 <= args.decay_fraction <= 1.0:
            raise ValueError(f"--decay-fraction must be in [0, 1], got {args.decay_fraction}")
        decay = min(steps - args.warmup, int(round(args.decay_fraction * steps)))
        return schedules.WSD(warmup_steps=args.warmup, decay_steps=decay, total_steps=steps)
    if args.warmup:
        return schedules.LinearWarmup(args.warmup)
    return None


def build_rule(args: argparse.Namespace, model: str, schedule, labels):
    """The rule named by ``args.optimizer`` (ValueError if a hyperparameter is invalid) and its peak lr."""
    entry = OPTIMIZERS[args.optimizer]
    lr = entry.lr[model] if args.lr is None else args.lr
    return entry.build(args, lr, schedule, labels), lr

"""Optimizer names of the command line and how each becomes a refopt rule.

One table, ``OPTIMIZERS``: name -> :class:`Entry` (builder, default peak lr per model, help). A builder
takes the parsed arguments, the peak lr, the schedule and the task's labels (which arrays are the
"hidden" matrices) and returns a rule. Names with a ``hidden`` part (muon, muonh, adamh, covariant) are a
:class:`refopt.Partition`: that rule on the hidden matrices, AdamW (``--adam-lr``) on embeddings, gains,
biases, the input layer and the head, as practitioners run Muon.
"""
from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass
from typing import Callable

import refopt


@dataclass(frozen=True)
class Entry:
    build: Callable
    lr: dict            # default peak lr per model name
    help: str
    partitioned: bool = False


#: the command-line option that sets each rule field (a rule's ValueError about the field names the option)
FIELD_OPTIONS = {"lr": "--lr", "momentum": "--momentum", "nesterov": "--nesterov", "beta1": "--beta1",
                 "beta2": "--beta2", "eps": "--eps", "weight_decay": "--weight-decay", "wd_mode": "--wd-mode",
                 "ns_steps": "--ns-steps", "ns_coeffs": "--ns-coeffs", "scale": "--muon-scale",
                 "warmup_steps": "--warmup", "beta": "--sf-beta", "decay": "--ema-decay"}


def _make(cls, options: dict | None = None, **fields):
    """``cls(**fields)``; its ValueError about a field is raised again naming the command-line option that
    set the field (``FIELD_OPTIONS``, with ``options`` overriding: the AdamW part of a partitioned rule takes
    its lr from ``--adam-lr``): ``lr must be >= 0, got -1.0`` becomes ``--lr must be >= 0, got -1.0``."""
    try:
        return cls(**fields)
    except ValueError as e:
        names = {**FIELD_OPTIONS, **(options or {})}
        msg = str(e)
        found = [(m.start(), f) for f in fields if f in names for m in [re.search(rf"\b{f}\b", msg)] if m]
        if not found:
            raise
        at, field = min(found)              # the field the message is about: the first it names
        if at == 0 and msg[len(field):len(field) + 1] in (" ", ":"):
            raise ValueError(names[field] + msg[len(field):]) from None
        raise ValueError(f"{names[field]}: {msg}") from None


def _sgd(a, lr, sched):
    return _make(refopt.SGD, lr=lr, momentum=a.momentum, nesterov=a.nesterov, weight_decay=_wd(a, 0.0),
                 schedule=sched)


def _adam(a, lr, sched):
    return _make(refopt.Adam, lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps, weight_decay=_wd(a, 0.0),
                 schedule=sched)


def _adamw(a, lr, sched, wd=None, lr_option="--lr"):
    return _make(refopt.AdamW, {"lr": lr_option}, lr=lr, beta1=a.beta1, beta2=a.beta2, eps=a.eps,
                 weight_decay=_wd(a, 0.01) if wd is None else wd, wd_mode=a.wd_mode, schedule=sched)


def _muon(a, lr, sched, wd=None):
    return _make(refopt.Muon, {"momentum": "--muon-momentum"}, lr=lr, momentum=a.muon_momentum,
                 ns_coeffs=a.ns_coeffs, ns_steps=a.ns_steps, scale=a.muon_scale,
                 weight_decay=_wd(a, 0.0) if wd is None else wd, wd_mode=a.wd_mode, schedule=sched)


def _normuon(a, lr, sched):
    return _make(refopt.NorMuon, {"momentum": "--muon-momentum"}, lr=lr, momentum=a.muon_momentum,
                 ns_coeffs=a.ns_coeffs, ns_steps=a.ns_steps, weight_decay=_wd(a, 0.0), schedule=sched)


def _dion(a, lr, sched):
    return _make(refopt.Dion, {"momentum": "--muon-momentum"}, lr=lr, momentum=a.muon_momentum,
                 weight_decay=_wd(a, 0.0), schedule=sched)


def _hidden_base(a, name):
    """The direction rule inside Hyperball / Covariant (its own lr and schedule are unused there)."""
    if name == "muon":
        return _muon(a, 1.0, None, wd=0.0)
    if name == "adam":
        return _make(refopt.Adam, lr=1.0, beta1=a.beta1, beta2=a.beta2, eps=a.eps)
    return _make(refopt.SGD, lr=1.0, momentum=a.momentum, nesterov=a.nesterov)


def _hyperball(a, base, lr, sched):
    return _make(refopt.Hyperball, base=_hidden_base(a, base), lr=lr, schedule=sched)


def _wd(a, default):
    return default if a.weight_decay is None else a.weight_decay


def _partition(hidden_rule, a, sched, labels):
    other = _adamw(a, a.adam_lr, sched, wd=0.0 if a.weight_decay is None else a.weight_decay, lr_option="--adam-lr")
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
    "normuon": Entry(lambda a, lr, s, lab: _partition(_normuon(a, lr, s), a, s, lab), {"mlp": 1e-2, "gpt": 1e-2},
                     "NorMuon (Li et al. 2025, the paper's form: each neuron's row of msign normalised, the update "
                     "rescaled to RMS 0.2 x lr) on the hidden matrices (--ns-coeffs, --ns-steps, --muon-momentum), AdamW elsewhere",
                     partitioned=True),
    "dion": Entry(lambda a, lr, s, lab: _partition(_dion(a, lr, s), a, s, lab), {"mlp": 0.02, "gpt": 0.02},
                  "Dion (Ahn et al. 2025: a full-rank orthonormal update by one warm-started power iteration with "
                  "error feedback) on the hidden matrices (--muon-momentum), AdamW elsewhere", partitioned=True),
    "muonh": Entry(lambda a, lr, s, lab: _partition(_hyperball(a, "muon", lr, s), a, s, lab),
                   {"mlp": 0.02, "gpt": 0.02},
                   "Hyperball(Muon) (MuonH, post 002) on the hidden matrices, AdamW elsewhere", partitioned=True),
    "adamh": Entry(lambda a, lr, s, lab: _partition(_hyperball(a, "adam", lr, s), a, s, lab),
                   {"mlp": 0.02, "gpt": 0.02},
                   "Hyperball(Adam) (AdamH) on the hidden matrices, AdamW elsewhere", partitioned=True),
    "covariant": Entry(lambda a, lr, s, lab: _partition(
        _make(refopt.Covariant, base=_hidden_base(a, a.covariant_base), lr=lr, schedule=s), a, s, lab),
        {"mlp": 0.02, "gpt": 0.02},
        "Covariant / ELR rule (post 000, eq. elr-u) over --covariant-base on the hidden matrices, AdamW "
        "elsewhere", partitioned=True),
    "schedulefree-sgd": Entry(lambda a, lr, s, lab: _make(
        refopt.ScheduleFreeSGD, lr=lr, beta=a.sf_beta, warmup_steps=a.warmup, weight_decay=_wd(a, 0.0)),
        {"mlp": 1.0, "gpt": 1.0},
        "Schedule-Free SGD (Defazio et al. 2024, reference implementation); --warmup"),
    "schedulefree-adamw": Entry(lambda a, lr, s, lab: _make(
        refopt.ScheduleFreeAdamW, {"beta1": "--sf-beta"}, lr=lr, beta1=a.sf_beta, beta2=a.beta2, eps=a.eps,
        warmup_steps=a.warmup, weight_decay=_wd(a, 0.0)),
        {"mlp": 3e-3, "gpt": 3e-3}, "Schedule-Free AdamW (reference implementation); --warmup"),
    "average": Entry(lambda a, lr, s, lab: refopt.Average(_adamw(a, lr, s)), {"mlp": 3e-3, "gpt": 3e-3},
                     "AdamW with a uniform average of the iterates for evaluation (post 004)"),
    "ema": Entry(lambda a, lr, s, lab: _make(refopt.EMA, base=_adamw(a, lr, s), decay=a.ema_decay),
                 {"mlp": 3e-3, "gpt": 3e-3},
                 "AdamW with an EMA of the iterates for evaluation (--ema-decay; post 004)"),
}

def _registry_entry(cli):
    """An :class:`Entry` for a command-line name declared in a conventions file (:class:`refopt.conventions.
    CliName`): the rule built from --lr, the schedule, --weight-decay when the rule has it, and the options
    ``cli.options`` maps to rule fields, each only when given on the command line (else the rule's default)."""
    def build(a, lr, sched, labels):
        given = getattr(a, "explicit_options", set())
        fields = {"lr": lr, "schedule": sched}
        if "weight_decay" in cli.rule.__dataclass_fields__ and a.weight_decay is not None:
            fields["weight_decay"] = a.weight_decay
        fields.update({f: getattr(a, dest) for f, dest in cli.options.items() if dest in given})
        return _make(cli.rule, {f: "--" + dest.replace("_", "-") for f, dest in cli.options.items()}, **fields)
    return Entry(build, dict(cli.lr), cli.help)


def _registry_names() -> dict:
    from refopt.conventions import registry
    return {n.name: n for c in registry().values() for n in c.cli}


#: the names declared by the conventions files (refopt/conventions/<rule>.py, ``cli=``)
REGISTRY_NAMES = _registry_names()
OPTIMIZERS.update({name: _registry_entry(cli) for name, cli in REGISTRY_NAMES.items() if name not in OPTIMIZERS})

#: Schedule-Free rules carry their own warmup and must not get an lr schedule on top
SCHEDULE_FREE = ("schedulefree-sgd", "schedulefree-adamw")


def _partitioned(name, a):
    return OPTIMIZERS[name].partitioned


def _covariant_over(base):
    return lambda name, a: name == "covariant" and a.covariant_base == base


def _any(*preds):
    return lambda name, a: any(p(name, a) for p in preds)


def _named(*names):
    return lambda name, a: name in names


#: which optimizers use an option: ``dest -> predicate(name, args)``; options not listed (--lr,
#: --weight-decay, --warmup) apply to every optimizer. An option given on the command line that no
#: chosen optimizer uses is an error (:func:`check_options`), never silently recorded in config.json.
def _registry_uses(dest):
    """The names of the conventions files whose options include ``dest``."""
    return lambda name, a: name in REGISTRY_NAMES and dest in REGISTRY_NAMES[name].options.values()


USED_BY = {
    "momentum": _any(_named("sgd"), _covariant_over("sgd"), _registry_uses("momentum")),
    "nesterov": _any(_named("sgd"), _covariant_over("sgd")),
    "beta1": _any(_named("adam", "adamw", "average", "ema"), _partitioned, _registry_uses("beta1")),
    "beta2": _any(_named("adam", "adamw", "average", "ema", "schedulefree-adamw"), _partitioned,
                  _registry_uses("beta2")),
    "eps": _any(_named("adam", "adamw", "average", "ema", "schedulefree-adamw"), _partitioned, _registry_uses("eps")),
    "wd_mode": _any(_named("adamw", "average", "ema"), _partitioned),
    "adam_lr": _partitioned,
    "muon_momentum": _any(_named("muon", "muonh", "normuon", "dion"), _covariant_over("muon")),
    "muon_scale": _any(_named("muon", "muonh"), _covariant_over("muon")),
    "ns_coeffs": _any(_named("muon", "muonh", "normuon"), _covariant_over("muon")),
    "ns_steps": _any(_named("muon", "muonh", "normuon"), _covariant_over("muon")),
    "covariant_base": _named("covariant"),
    "sf_beta": _named(*SCHEDULE_FREE),
    "ema_decay": _named("ema"),
    "schedule": lambda name, a: name not in SCHEDULE_FREE,
    "decay_fraction": lambda name, a: name not in SCHEDULE_FREE and a.schedule == "wsd",
}


def check_options(args: argparse.Namespace, names: list[str]) -> None:
    """Raise ValueError (one line) for an option written on the command line that none of the optimizers
    ``names`` uses (e.g. ``--optimizer adamw --muon-scale spectral``)."""
    for dest in sorted(getattr(args, "explicit_options", ())):
        used = USED_BY.get(dest)
        if used is not None and not any(used(n, args) for n in names):
            users = [n for n in OPTIMIZERS if used(n, args)]
            which = f"--optimizer {names[0]}" if len(names) == 1 else f"any of --optimizers {','.join(names)}"
            raise ValueError(f"--{dest.replace('_', '-')} does not apply to {which} (it is used by "
                             f"{', '.join(users) if users else 'no optimizer with these settings'})")


def option_defaults() -> dict:
    """``{dest: default}`` of the optimizer options (:func:`add_arguments`)."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p, with_name=False)
    return vars(p.parse_args([]))


def for_optimizer(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """A copy of ``args`` for the run of optimizer ``name`` among several (``refopt compare``): every option
    written on the command line that ``name`` does not use (``USED_BY``) goes back to its default and out of
    ``explicit_options``, so the run applies, checks and records only its own rule's options (the
    Schedule-Free rules drop ``--schedule`` and ``--decay-fraction``, adamw drops ``--momentum``). ``args``
    is not modified."""
    a = copy.copy(args)
    a.optimizer = name
    a.explicit_options = set(getattr(args, "explicit_options", ()))
    defaults = option_defaults()
    dropped = True
    while dropped:          # until nothing changes: whether --decay-fraction is used depends on --schedule
        dropped = sorted(set(unused_options(name, a)) & a.explicit_options)
        for dest in dropped:
            setattr(a, dest, defaults[dest])
            a.explicit_options.discard(dest)
    return a


def unused_options(name: str, args: argparse.Namespace) -> list[str]:
    """The optimizer options (dests) that optimizer ``name`` does not use with the settings ``args``."""
    return [d for d in USED_BY if not USED_BY[d](name, args)]


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
                                                             "muon/normuon/dion/muonh/adamh/covariant")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum mu (sgd; covariant over sgd)")
    g.add_argument("--nesterov", action="store_true", help="SGD Nesterov momentum (sgd; covariant over sgd)")
    g.add_argument("--beta1", type=float, default=0.9,
                   help="Adam first-moment decay beta1 (adam, adamw, average, ema, and the AdamW part of "
                        "muon/normuon/dion/muonh/adamh/covariant; schedule-free rules take --sf-beta)")
    g.add_argument("--beta2", type=float, default=0.999,
                   help="Adam second-moment decay beta2 (Adam-type rules and parts, schedulefree-adamw)")
    g.add_argument("--eps", type=float, default=1e-8,
                   help="Adam denominator epsilon, added to sqrt(v_hat) (Adam-type rules and parts, "
                        "schedulefree-adamw)")
    g.add_argument("--weight-decay", type=float, default=None,
                   help="lambda (default 0; AdamW 0.01; 0 on the AdamW part of partitioned rules)")
    g.add_argument("--wd-mode", default="decoupled", choices=["decoupled", "independent"],
                   help="weight decay of AdamW and Muon: decoupled (x *= 1 - lr_t*lambda) or independent of "
                        "the lr (x *= 1 - gamma_t*lambda)")
    g.add_argument("--muon-momentum", type=float, default=0.95, help="Muon momentum mu (muon, normuon, dion, muonh)")
    g.add_argument("--muon-scale", default="spectral", choices=["spectral", "jordan", "rms_match", "none"],
                   help="Muon's scale of the orthogonalized update (refopt.Muon's scale)")
    g.add_argument("--ns-coeffs", default="jordan", choices=["jordan", "polar_express", "you", "classic"],
                   help="Newton-Schulz coefficients of Muon's orthogonalization")
    g.add_argument("--ns-steps", type=int, default=None,
                   help="Newton-Schulz iterations of Muon (default: gpt 4, mlp 5; the GPT's choice: "
                        "docs/speed.md)")
    g.add_argument("--covariant-base", default="adam", choices=["adam", "muon", "sgd"],
                   help="the direction rule inside covariant")
    g.add_argument("--sf-beta", type=float, default=0.9, help="Schedule-Free interpolation beta (beta1)")
    g.add_argument("--ema-decay", type=float, default=0.99, help="decay of the iterate EMA (ema)")
    g.add_argument("--schedule", default=None, choices=["constant", "cosine", "wsd"],
                   help="lr multiplier: constant; linear --warmup then cosine to 0; or warmup-stable-decay "
                        "with the last --decay-fraction linear to 0 (default: cosine for the GPT, constant "
                        "for the MLP; Schedule-Free rules take only --warmup)")
    g.add_argument("--warmup", type=int, default=None, help="warmup steps (default: mlp 0, gpt 30 but at most "
                                                            "a tenth of the steps)")
    g.add_argument("--decay-fraction", type=float, default=0.2,
                   help="fraction of the steps in the linear decay of --schedule wsd")


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

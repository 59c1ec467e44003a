"""Train the same model from the same init on the same data order with several optimizers and compare.

Writes ``compare.png`` (training and validation loss against step and against time), ``summary.csv``
(one row per optimizer: final losses and metrics, wall time, the median time per step), ``config.json``
(per optimizer the settings its run applied and its rule) and one ``metrics_<optimizer>.csv`` per run.
An option is rejected (before anything trains) only when it applies to none of the listed optimizers;
each run applies the options its own rule uses (the Schedule-Free rules take ``--warmup`` but no
``--schedule``). Every optimizer uses its default peak lr for the model unless ``--lr`` is given (then
it applies to all, which is rarely what you want for rules of different kinds).

Defaults sized for a class (about 2-3 minutes on 2 cores): the GPT with ``--n-layer 2`` (``refopt
train``'s GPT has 4 blocks; width, heads, context and data are the same) for ``--steps 200``; the five
rules adamw, muon, muonh, covariant, schedulefree-adamw. Each run is bit for bit the ``refopt train`` run
of the same options (``--n-layer 2 --steps 200``).

Time. One run's wall time depends on what else the machine does while it trains (on a shared machine it
varied 10x between runs), and the runs train one after another. So the time per step is measured apart
from the runs: after training, :data:`TIMING_ROUNDS` rounds, each timing :data:`TIMING_STEPS` steps of
every rule in turn from its init (the order rotated from round to round); a rule's time per step is the
median over its rounds of the median step in the round, with the rounds' smallest and largest in
summary.csv. The right panel plots the loss against step x that median; its title gives the load
average and, where a rule's rounds differ by more than 1.5x (a busy machine), says that the times are
not to be trusted.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from refopt.cli import optimizers, output, train

HELP = "train one model with several optimizers (same init, same data order) and plot them together"


#: compare's defaults where they differ from refopt train's (sized for a class: about 2-3 minutes on 2 cores)
GPT_STEPS, GPT_N_LAYER = 200, 2
#: the time per step: rounds over the rules, steps timed per rule and round (see the module docstring)
TIMING_ROUNDS, TIMING_STEPS = 3, 5
#: a rule whose slowest round took this many times its fastest marks the time panel as not to be trusted
UNTRUSTED_SPREAD = 1.5


def add_arguments(p: argparse.ArgumentParser) -> None:
    train.add_model_arguments(p)
    p.add_argument("--optimizers", default="adamw,muon,muonh,covariant,schedulefree-adamw",
                   help="comma-separated names among: " + ", ".join(optimizers.OPTIMIZERS))
    optimizers.add_arguments(p, with_name=False)
    p.set_defaults(out="runs/compare", n_layer=GPT_N_LAYER)
    for a in p._actions:
        if a.dest == "steps":
            a.help = (f"optimizer steps of each run (default: gpt {GPT_STEPS}, mlp "
                      f"{train.DEFAULTS['mlp']['steps']}; overrides --epochs)")
        elif a.dest == "n_layer":
            a.help = f"transformer blocks (default {GPT_N_LAYER} here, 4 in refopt train)"


def run(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.optimizers.split(",") if n.strip()]
    unknown = [n for n in names if n not in optimizers.OPTIMIZERS]
    if not names or unknown:
        raise ValueError(f"--optimizers: unknown {unknown or 'empty list'}; choose from {', '.join(optimizers.OPTIMIZERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--optimizers lists a name twice: {names}")
    train.check_options(args, names)       # an option none of the chosen optimizers uses is an error
    train.matrix_products()                # REFOPT_GEMM checked before --out is created
    # every run checked and its rule built before any trains (or --out is created): a bad value fails now,
    # not after the runs before it have trained
    if args.model == "gpt" and args.steps is None and args.epochs is None:
        args.steps = GPT_STEPS
    per_run = {name: optimizers.for_optimizer(args, name) for name in names}
    prepared, task = {}, None
    for name, a in per_run.items():
        prepared[name] = train.prepare(a, task)
        task = prepared[name][0]
    out = output.prepare_out(args.out, check_run=True, overwrite=args.overwrite)
    train.say_unused_mkl()
    runs, summary = {}, []
    for name, a in per_run.items():
        runs[name] = train.train_one(a, progress_desc=name, prepared=prepared[name])
    timing = time_steps(per_run, prepared)
    for name in names:
        runs[name]["timing"] = timing["ms"][name]
        runs[name]["load"] = timing["load"]
        summary.append(summary_row(name, runs[name]))
    if args.overwrite:                         # every run succeeded: the previous run's files go only now
        output.remove_previous(out)
    for name, result in runs.items():
        rows = result["rows"]
        output.write_csv(os.path.join(out, f"metrics_{name}.csv"), rows, train.metric_columns(rows))
    cols = list(summary[0])
    output.write_csv(os.path.join(out, "summary.csv"), summary, cols)
    output.write_json(os.path.join(out, "config.json"), config(names, per_run, prepared, runs))
    _plot(os.path.join(out, "compare.png"), runs, args)
    for s in summary:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    print(f"wrote {out}/{{summary.csv, config.json, compare.png, metrics_*.csv}}")
    return 0


def config(names, per_run, prepared, runs) -> dict:
    """config.json of a compare: per optimizer the settings its run applied (those of the options its rule
    uses, e.g. no ``schedule`` for a Schedule-Free rule), its steps, peak lr, rule and final metrics; the
    task once (it is the same for every run). No wall times: the same seed gives the same file."""
    out = {"command": "compare", "optimizers": names, "runs": {}}
    for name in names:
        a, (task, rule, lr, steps) = per_run[name], prepared[name]
        unused = set(optimizers.unused_options(name, a))
        settings = {k: v for k, v in train._settings(a).items() if k not in unused and k != "optimizers"}
        out["runs"][name] = {"settings": settings, "steps": steps, "lr": lr, "rule": train.describe_rule(rule),
                             "final": runs[name]["final"]}
    out["task"] = prepared[names[0]][0].describe()
    out["versions"] = output.package_versions()
    out["matrix_products"] = train.matrix_products()
    return out


def time_steps(per_run, prepared, rounds: int = TIMING_ROUNDS, steps: int = TIMING_STEPS) -> dict:
    """The time per step of each rule, measured apart from its run: ``rounds`` rounds, each running
    ``steps`` steps of every rule from its init (``train.fit`` with ``stop_after``, no evaluation, the
    order rotated by one rule per round, so that no rule always runs first or last); per rule and round the
    median of its step times. Returns ``{"ms": {name: {"median": the median over the rounds (ms), "min":
    ..., "max": ...}}, "load": (1-minute load average before, after)}``."""
    names = list(per_run)
    per_round = {n: [] for n in names}
    load_before = os.getloadavg()[0]
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            a, (task, rule, lr, total) = per_run[name], prepared[name]
            _, _, rows = train.fit(task, rule, total, a.seed, lr, a.schedule_fn, eval_interval=total + 1,
                                   progress=False, stop_after=min(steps, total))
            ends = [0.0] + [row["_seconds"] for row in rows]
            per_round[name].append(1000 * float(np.median(np.diff(ends))))
    ms = {n: {"median": float(np.median(v)), "min": min(v), "max": max(v)} for n, v in per_round.items()}
    return {"ms": ms, "load": (load_before, os.getloadavg()[0])}


def summary_row(name: str, result: dict) -> dict:
    """One line of summary.csv: the final metrics, the whole run's ``seconds`` (one timing, as the machine
    was while it ran), ``first_step_s`` (the first step, which compiles the rule's kernels on a cold numba
    cache), and ``ms_per_step`` with ``ms_per_step_min`` / ``ms_per_step_max``: the median time per step
    of :func:`time_steps` and its rounds' smallest and largest (what the time panel of compare.png uses)."""
    rows = result["rows"]
    tail = rows[-max(1, len(rows) // 10):]
    t = result["timing"]
    return {"optimizer": name, "lr": result["lr"], "steps": len(rows),
            "train_loss_last10pct": float(np.mean([r["loss"] for r in tail])), **result["final"],
            "seconds": result["seconds"], "first_step_s": rows[0]["_seconds"], "ms_per_step": t["median"],
            "ms_per_step_min": t["min"], "ms_per_step_max": t["max"]}


def _smooth(y, k):
    if len(y) < k or k <= 1:
        return np.asarray(y)
    c = np.cumsum(np.insert(np.asarray(y, dtype=float), 0, 0.0))
    head = c[1:k] / np.arange(1, k)
    return np.concatenate([head, (c[k:] - c[:-k]) / k])


def _plot(path, runs, args):
    fig = compare_figure(runs, args)
    fig.savefig(path, metadata={"Software": None}, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)


def compare_figure(runs, args):
    """The figure of compare.png: loss against step, and against time = (step - 1) x the rule's median
    time per step (``runs[name]["timing"]``, from :func:`time_steps`; the title says how it was measured,
    with the load), on log axes with labelled ticks; one legend below the panels, outside the data, whose
    labels give each rule's median ms per step and its rounds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = "test" if args.model == "mlp" else "validation"
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2), dpi=110)
    ys = []
    for i, (name, res) in enumerate(runs.items()):
        rows = res["rows"]
        color = f"C{i}"
        t = res["timing"]
        per_step = t["median"] / 1000
        steps = np.array([r["step"] for r in rows])
        train_loss = _smooth([r["loss"] for r in rows], max(1, len(rows) // 50))
        ev = [r for r in rows if "val_loss" in r]
        ys += list(train_loss) + [r["val_loss"] for r in ev]
        ev_steps = np.array([r["step"] for r in ev])
        timed = f" ({t['median']:.0f} ms/step, {t['min']:.0f}-{t['max']:.0f})"
        for ax, x, xe in ((axes[0], steps, ev_steps), (axes[1], (steps - 1) * per_step, (ev_steps - 1) * per_step)):
            ax.plot(x, train_loss, color=color, alpha=0.45, lw=1, label=f"{name} train (smoothed)")
            ax.plot(xe, [r["val_loss"] for r in ev], color=color, lw=1.8, marker="o", ms=2.5,
                    label=f"{name} {split}" + timed)
    load = next(iter(runs.values()))["load"]
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("time (s) = (step - 1) x median time per step")
    axes[0].set_title("against step", fontsize=9)
    spread = max(res["timing"]["max"] / res["timing"]["min"] for res in runs.values())
    axes[1].set_title(f"against time: per rule the median of {TIMING_ROUNDS} alternating rounds of "
                      f"{TIMING_STEPS} steps\n(measured after the runs; load average {load[0]:.1f} before, "
                      f"{load[1]:.1f} after)" + (
                          f"\nnot to be trusted: a rule's rounds differ up to {spread:.1f}x (a busy machine)"
                          if spread > UNTRUSTED_SPREAD else ""), fontsize=9,
                      color="firebrick" if spread > UNTRUSTED_SPREAD else "black")
    for ax in axes:
        ax.set_ylabel("cross-entropy (nats)")
        output.log_axis(ax, min(ys), max(ys))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(f"{args.model}: same init, same data order (seed {args.seed})")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    return fig

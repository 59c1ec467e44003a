"""Train the same model from the same init on the same data order with several optimizers and compare.

Writes ``compare.png`` (training and validation loss against step and against wall time),
``summary.csv`` (one row per optimizer: final losses and metrics, wall time), ``config.json`` (per
optimizer the settings its run applied and its rule) and one ``metrics_<optimizer>.csv`` per run. An
option is rejected (before anything trains) only when it applies to none of the listed optimizers; each
run applies the options its own rule uses (the Schedule-Free rules take ``--warmup`` but no
``--schedule``). Every optimizer uses its default peak lr for the model unless
``--lr`` is given (then it applies to all, which is rarely what you want for rules of different kinds).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from refopt.cli import optimizers, output, train

HELP = "train one model with several optimizers (same init, same data order) and plot them together"


def add_arguments(p: argparse.ArgumentParser) -> None:
    train.add_model_arguments(p)
    p.add_argument("--optimizers", default="adamw,muon,muonh,covariant,schedulefree-adamw",
                   help="comma-separated names among: " + ", ".join(optimizers.OPTIMIZERS))
    optimizers.add_arguments(p, with_name=False)
    p.set_defaults(out="runs/compare")


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
    per_run = {name: optimizers.for_optimizer(args, name) for name in names}
    prepared, task = {}, None
    for name, a in per_run.items():
        prepared[name] = train.prepare(a, task)
        task = prepared[name][0]
    out = output.prepare_out(args.out, check_run=True, overwrite=args.overwrite)
    train.say_unused_mkl()
    runs, summary = {}, []
    for name, a in per_run.items():
        result = train.train_one(a, progress_desc=name, prepared=prepared[name])
        runs[name] = result
        summary.append(summary_row(name, result))
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


def summary_row(name: str, result: dict) -> dict:
    """One line of summary.csv: the final metrics, the whole run's ``seconds``, ``first_step_s`` (the first
    step, which compiles the rule's kernels on a cold numba cache) and ``ms_per_step`` over the steps after
    it (as the wall-time panel of compare.png measures them: a rule compiled first is not slower)."""
    rows = result["rows"]
    tail = rows[-max(1, len(rows) // 10):]
    first = rows[0]["_seconds"]
    after = (rows[-1]["_seconds"] - first) / (len(rows) - 1) if len(rows) > 1 else first
    return {"optimizer": name, "lr": result["lr"], "steps": len(rows),
            "train_loss_last10pct": float(np.mean([r["loss"] for r in tail])), **result["final"],
            "seconds": result["seconds"], "first_step_s": first, "ms_per_step": 1000 * after}

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
    """The figure of compare.png: loss against step and against wall time (each curve from the end of
    its own first step, so that start-up and JIT compilation do not shift it), on log axes with labelled
    ticks; one legend below the panels, outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    split = "test" if args.model == "mlp" else "validation"
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    ys = []
    for i, (name, res) in enumerate(runs.items()):
        rows = res["rows"]
        color = f"C{i}"
        steps = np.array([r["step"] for r in rows])
        secs = np.array([r["_seconds"] for r in rows])
        secs = secs - secs[0]
        train_loss = _smooth([r["loss"] for r in rows], max(1, len(rows) // 50))
        ev = [r for r in rows if "val_loss" in r]
        ys += list(train_loss) + [r["val_loss"] for r in ev]
        ev_secs = [r["_seconds"] - rows[0]["_seconds"] for r in ev]
        for ax, x, xe in ((axes[0], steps, [r["step"] for r in ev]), (axes[1], secs, ev_secs)):
            ax.plot(x, train_loss, color=color, alpha=0.45, lw=1, label=f"{name} train (smoothed)")
            ax.plot(xe, [r["val_loss"] for r in ev], color=color, lw=1.8, marker="o", ms=2.5,
                    label=f"{name} {split}")
    for ax, xl in zip(axes, ("step", "wall time since the end of step 1 (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("cross-entropy (nats)")
        output.log_axis(ax, min(ys), max(ys))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(f"{args.model}: same init, same data order (seed {args.seed})")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    return fig

"""Train a reference model with a refopt rule and write metrics.csv, config.json and loss.png.

Default: the MLP on scikit-learn's 8x8 handwritten digits (shipped offline) with AdamW. The same seed
gives byte-identical output files (wall-clock times are printed, never written).
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import refopt
from refopt.cli import optimizers, output
from refopt.cli.tasks import MLPTask

HELP = "train a reference model (default: the MLP on the digits) and write metrics, config and plots"

TASKS = {"mlp": MLPTask}
DTYPES = {"float32": np.float32, "float64": np.float64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="mlp", choices=sorted(TASKS), help="what to train")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 600; overrides --epochs)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training set (instead of --steps)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="seeds the init and the data order")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--out", default="runs/train", help="output directory (created if missing)")
    p.add_argument("--eval-interval", type=int, default=50, help="steps between validation evaluations")
    p.add_argument("--hidden", type=int, nargs="+", default=[128], help="MLP hidden widths")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    optimizers.add_arguments(p)


def _resolve(args) -> None:
    if args.optimizer is None:
        args.optimizer = "adamw"
    for name in ("batch_size", "eval_interval"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if args.epochs is not None and not args.epochs > 0:
        raise ValueError(f"--epochs must be > 0, got {args.epochs}")
    if any(h < 1 for h in args.hidden):
        raise ValueError(f"--hidden widths must be >= 1, got {args.hidden}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")


def _schedule(args, steps: int):
    if args.schedule == "constant":
        if args.warmup:
            raise ValueError("--warmup needs --schedule cosine")
        return None
    from refopt import schedules

    return schedules.WarmupCosine(warmup_steps=args.warmup, total_steps=steps, floor=0.0)


def run(args: argparse.Namespace) -> int:
    _resolve(args)
    dtype = DTYPES[args.dtype]
    out = output.prepare_out(args.out)
    task = TASKS[args.model](args, dtype)
    if args.steps is not None:
        steps = args.steps
    elif args.epochs is not None:
        steps = max(1, int(math.ceil(args.epochs * task.steps_per_epoch)))
    else:
        steps = 600
    args.schedule_fn = _schedule(args, steps)
    rule, lr = optimizers.build_rule(args)

    rng = np.random.default_rng(args.seed)
    params = task.init_params(args.seed)
    state = refopt.init(rule, params)
    loss_and_grad = refopt.autograd.value_and_grad(task.loss)

    rows: list[dict] = []
    t0 = time.perf_counter()
    bar = _progress(steps, args.no_progress)
    for step in range(1, steps + 1):
        batch = task.batch(rng)
        loss, grads = loss_and_grad(params, *batch)
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError(f"the training loss became {loss} at step {step}; lower --lr")
        gamma = 1.0 if args.schedule_fn is None else float(args.schedule_fn(step))
        params, state = refopt.update_(rule, state, params, grads)
        row = {"step": step, "loss": loss, "lr": lr * gamma}
        if step % args.eval_interval == 0 or step == steps:
            row.update(task.periodic_eval(refopt.eval_params(rule, state, params)))
        rows.append(row)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0

    final_params = refopt.eval_params(rule, state, params)
    final = task.evaluate(final_params)
    extra = task.finish(final_params, out, args.seed)

    columns = ["step", "loss", "lr"] + [k for k in _periodic_keys(rows)]
    output.write_csv(os.path.join(out, "metrics.csv"), rows, columns)
    config = {
        "command": "train",
        "settings": {k: v for k, v in sorted(vars(args).items()) if k not in ("schedule_fn",)},
        "steps": steps,
        "rule": {"name": type(rule).__name__, **{k: _describe(v) for k, v in rule.hyperparameters().items()}},
        "task": task.describe(),
        "final": final,
        "versions": output.package_versions(),
    }
    output.write_json(os.path.join(out, "config.json"), config)
    _plot(os.path.join(out, "loss.png"), rows, f"{args.model} / {args.optimizer} (seed {args.seed})")

    print(" ".join(f"{k}={v:.4f}" for k, v in final.items()))
    for k, v in extra.items():
        print(f"{k}:\n{v}")
    print(f"{steps} steps in {seconds:.1f} s ({1000 * seconds / steps:.1f} ms/step); wrote {out}/"
          "{metrics.csv, config.json, loss.png}")
    return 0


def _periodic_keys(rows):
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in ("step", "loss", "lr") and k not in keys:
                keys.append(k)
    return keys


def _describe(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _progress(total: int, disabled: bool):
    if disabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, mininterval=0.5)


def _plot(path, rows, title):
    steps = [r["step"] for r in rows]
    curves = {"train loss (batch)": (steps, [r["loss"] for r in rows])}
    ev = [r for r in rows if "val_loss" in r]
    if ev:
        curves["validation loss"] = ([r["step"] for r in ev], [r["val_loss"] for r in ev])
    output.plot_curves(path, curves, "step", "cross-entropy (nats)", title, logy=True)

"""Train a reference model with a refopt rule; write metrics.csv, config.json, loss.png, checkpoint.npz.

Default: the GPT of ``models.gpt`` (4 layers, 128 wide, 4 heads, block 64, batch 32, float32) on the
English text CPython ships (``pydoc_data.topics``), with Muon on the hidden matrices and AdamW on the
embeddings and gains, a 30-step warmup and cosine decay. ``--model mlp`` trains the MLP on
scikit-learn's 8x8 digits. The same seed gives the same files (wall-clock times are printed, never
written). ``--resume DIR`` continues a run from its checkpoint, bit for bit as if uninterrupted.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import time

import numpy as np

import refopt
from refopt.cli import optimizers, output
from refopt.cli.tasks import GPTTask, MLPTask

HELP = "train a reference model (default: the GPT on CPython's docs text) and write metrics, config, plot"

TASKS = {"gpt": GPTTask, "mlp": MLPTask}
DTYPES = {"float32": np.float32, "float64": np.float64}
DEFAULTS = {  # per-model defaults of the options left at None
    "gpt": {"optimizer": "muon", "schedule": "cosine", "warmup": 30, "steps": 500, "batch_size": 32},
    "mlp": {"optimizer": "adamw", "schedule": "constant", "warmup": 0, "steps": 600, "batch_size": 64},
}
#: settings a resumed run may change; all others come from the checkpointed run's config.json
RESUMABLE = ("out", "no_progress", "stop_after", "checkpoint_interval")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gpt", choices=sorted(TASKS), help="what to train")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: gpt 500, mlp 600; overrides --epochs)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training set (instead of --steps)")
    p.add_argument("--batch-size", type=int, default=None, help="default: gpt 32, mlp 64")
    p.add_argument("--seed", type=int, default=0, help="seeds the init and the data order")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--out", default="runs/train", help="output directory (created if missing)")
    p.add_argument("--eval-interval", type=int, default=50, help="steps between validation evaluations")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    m = p.add_argument_group("mlp")
    m.add_argument("--hidden", type=int, nargs="+", default=[128], help="MLP hidden widths")
    g = p.add_argument_group("gpt")
    g.add_argument("--data", default=None, help="a UTF-8 text file (default: CPython's pydoc_data.topics)")
    g.add_argument("--n-layer", type=int, default=4)
    g.add_argument("--n-embd", type=int, default=128)
    g.add_argument("--n-head", type=int, default=4)
    g.add_argument("--block-size", type=int, default=64)
    g.add_argument("--ffn", default="swiglu", choices=["swiglu", "reglu", "gelu"])
    g.add_argument("--qk-norm", action="store_true", help="RMSNorm on q and k per head")
    g.add_argument("--untie-head", action="store_true", help="a separate lm_head instead of wte^T")
    g.add_argument("--init", default="normal", choices=["normal", "mup"], help="init scheme (see models.gpt.init)")
    g.add_argument("--eval-batches", type=int, default=8, help="validation batches per evaluation")
    g.add_argument("--sample-chars", type=int, default=300, help="characters generated at the end")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run saved in DIR (its checkpoint.npz and config.json)")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="stop after N steps of this invocation (the checkpoint lets --resume continue)")
    p.add_argument("--checkpoint-interval", type=int, default=0, help="also checkpoint every N steps (0: end only)")
    optimizers.add_arguments(p)


def _resolve(args) -> None:
    """Fill the per-model defaults and reject impossible values (ValueError, one line)."""
    d = DEFAULTS[args.model]
    for name in ("optimizer", "batch_size"):
        if getattr(args, name) is None:
            setattr(args, name, d[name])
    if args.schedule is None:
        args.schedule = "constant" if args.optimizer in optimizers.SCHEDULE_FREE else d["schedule"]
    for name in ("batch_size", "eval_interval", "n_layer", "n_embd", "n_head", "block_size", "eval_batches"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("steps", "stop_after"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.epochs is not None and not args.epochs > 0:
        raise ValueError(f"--epochs must be > 0, got {args.epochs}")
    if any(h < 1 for h in args.hidden):
        raise ValueError(f"--hidden widths must be >= 1, got {args.hidden}")
    if (args.warmup or 0) < 0 or args.sample_chars < 0 or getattr(args, "checkpoint_interval", 0) < 0:
        raise ValueError("--warmup, --sample-chars and --checkpoint-interval must be >= 0")


def _total_steps(args, task) -> int:
    if args.steps is not None:
        return args.steps
    if args.epochs is not None:
        return max(1, int(math.ceil(args.epochs * task.steps_per_epoch)))
    return DEFAULTS[args.model]["steps"]


def prepare(args):
    """(task, rule, lr, steps) for fully resolved ``args``."""
    _resolve(args)
    task = TASKS[args.model](args, DTYPES[args.dtype])
    steps = _total_steps(args, task)
    if args.warmup is None:  # the model's default, at most a tenth of the run
        args.warmup = min(DEFAULTS[args.model]["warmup"], steps // 10)
    if args.warmup > steps:
        raise ValueError(f"--warmup {args.warmup} exceeds the {steps} steps of the run")
    args.schedule_fn = optimizers.build_schedule(args, steps)
    rule, lr = optimizers.build_rule(args, args.model, args.schedule_fn, task.labels(task.init_params(args.seed)))
    return task, rule, lr, steps


def fit(task, rule, steps: int, seed: int, lr: float, schedule, eval_interval: int, progress: bool = True,
        desc: str = "train", start=None, stop_after: int | None = None, on_checkpoint=None,
        checkpoint_interval: int = 0):
    """Train ``task``'s model with ``rule`` up to step ``steps`` from the init and data order of ``seed``.

    ``start=(params, state)`` continues from a checkpointed state (its ``t`` steps done). Returns
    ``(params, state, rows)``; ``rows`` holds per step the batch loss (at the params before the update),
    the learning rate lr*gamma_t of the update, the elapsed wall time (``_seconds``, never written to
    files), and every ``eval_interval`` steps (and at the last) the validation metrics at the evaluation
    params (:func:`refopt.eval_params`).
    """
    if start is None:
        params = task.init_params(seed)
        state = refopt.init(rule, params)
    else:
        params, state = start
    first = state.t + 1
    last = steps if stop_after is None else min(steps, state.t + stop_after)
    loss_and_grad = refopt.value_and_grad(task.loss)
    rows: list[dict] = []
    t0 = time.perf_counter()
    bar = _progress(last - first + 1, not progress, desc)
    for step in range(first, last + 1):
        loss, grads = loss_and_grad(params, *task.batch(seed, step))
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError(f"the training loss became {loss} at step {step}; lower --lr")
        gamma = 1.0 if schedule is None else float(schedule(step))
        params, state = refopt.update_(rule, state, params, grads)
        row = {"step": step, "loss": loss, "lr": lr * gamma}
        if step % eval_interval == 0 or step == steps:
            row.update(task.periodic_eval(refopt.eval_params(rule, state, params)))
        row["_seconds"] = time.perf_counter() - t0
        rows.append(row)
        if on_checkpoint is not None and checkpoint_interval and step % checkpoint_interval == 0 and step < last:
            on_checkpoint(params, state)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)
    if bar is not None:
        bar.close()
    return params, state, rows


def train_one(args, progress_desc: str = "train") -> dict:
    """Prepare and fit one run of ``args`` (no files written); used by ``refopt compare``."""
    task, rule, lr, steps = prepare(args)
    t0 = time.perf_counter()
    params, state, rows = fit(task, rule, steps, args.seed, lr, args.schedule_fn, args.eval_interval,
                              progress=not args.no_progress, desc=progress_desc)
    seconds = time.perf_counter() - t0
    final = final_metrics(task, rows, refopt.eval_params(rule, state, params))
    return {"rows": rows, "final": final, "lr": lr, "seconds": seconds, "rule": rule, "task": task}


def final_metrics(task, rows, params) -> dict:
    """``task.evaluate(params)``, or, for a task whose final metrics are its periodic ones
    (``final_is_periodic``), the evaluation already logged in the last row at these same params (the GPT's
    validation loss is not computed twice)."""
    last = rows[-1] if rows else {}
    keys = getattr(task, "final_is_periodic", ())
    if keys and all(k in last for k in keys):
        return {k: last[k] for k in keys}
    return task.evaluate(params)


def _settings(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k not in ("schedule_fn", "resume")}


def _load_resume(args):
    """Settings of the run in ``args.resume`` (with the RESUMABLE overrides), its checkpoint and rows."""
    d = args.resume
    cfg_path, ckpt_path, metrics_path = (os.path.join(d, f) for f in ("config.json", "checkpoint.npz", "metrics.csv"))
    for p in (cfg_path, ckpt_path, metrics_path):
        if not os.path.isfile(p):
            raise ValueError(f"--resume {d}: missing {os.path.basename(p)} (not a refopt train output directory?)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    new = argparse.Namespace(**cfg["settings"])
    out_given = args.out != "runs/train"
    for k in RESUMABLE:
        setattr(new, k, getattr(args, k))
    if not out_given:
        new.out = d
    ckpt = refopt.load(ckpt_path)
    with open(metrics_path, newline="") as f:
        rows = [{k: _parse(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    rows = [r for r in rows if r["step"] <= ckpt.state.t]
    return new, ckpt, rows


def _parse(v: str):
    try:
        return int(v)
    except ValueError:
        return float(v)


def run(args: argparse.Namespace) -> int:
    previous: list[dict] = []
    start = ckpt = None
    if args.resume is not None:
        args, ckpt, previous = _load_resume(args)
    task, rule, lr, steps = prepare(args)
    out = output.prepare_out(args.out)
    if ckpt is not None:
        if refopt.checkpoint.rule_to_json(ckpt.rule) != refopt.checkpoint.rule_to_json(rule):
            raise ValueError(f"--resume: the checkpointed rule differs from the one {args.resume} describes")
        if ckpt.state.t >= steps:
            raise ValueError(f"--resume: the run already completed its {steps} steps")
        start = (ckpt.params, ckpt.state)
    ckpt_file = os.path.join(out, "checkpoint.npz")

    def checkpoint(params, state):
        refopt.save(ckpt_file, params, state, rule, seed=args.seed, step=state.t)

    t0 = time.perf_counter()
    params, state, rows = fit(task, rule, steps, args.seed, lr, args.schedule_fn, args.eval_interval,
                              progress=not args.no_progress, start=start, stop_after=args.stop_after,
                              on_checkpoint=checkpoint, checkpoint_interval=args.checkpoint_interval)
    seconds = time.perf_counter() - t0
    checkpoint(params, state)
    rows = previous + rows
    done = state.t >= steps

    final_params = refopt.eval_params(rule, state, params)
    final = final_metrics(task, rows, final_params)
    extra = task.finish(final_params, out, args.seed) if done else {}
    output.write_csv(os.path.join(out, "metrics.csv"), rows, ["step", "loss", "lr"] + periodic_keys(rows))
    config = {"command": "train", "settings": _settings(args), "steps": steps, "steps_done": state.t,
              "rule": describe_rule(rule), "task": task.describe(), "final": final,
              "versions": output.package_versions()}
    output.write_json(os.path.join(out, "config.json"), config)
    _plot(os.path.join(out, "loss.png"), rows, f"{args.model} / {args.optimizer} (seed {args.seed})")

    print(" ".join(f"{k}={v:.4f}" for k, v in final.items()))
    for k, v in extra.items():
        print(f"{k}:\n{v}")
    n = max(1, len(rows) - len(previous))
    status = "" if done else f" (stopped at step {state.t} of {steps}; continue with --resume {out})"
    print(f"{n} steps in {seconds:.1f} s ({1000 * seconds / n:.1f} ms/step){status}; wrote {out}/")
    return 0


def periodic_keys(rows) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in ("step", "loss", "lr") and not k.startswith("_") and k not in keys:
                keys.append(k)
    return keys


def describe_rule(rule) -> dict:
    """The rule as JSON-ready data: its class name and fields, nested rules and schedules expanded."""
    from dataclasses import fields, is_dataclass

    def conv(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if is_dataclass(v) and not isinstance(v, type):
            return {"name": type(v).__name__, **{f.name: conv(getattr(v, f.name)) for f in fields(v)}}
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return getattr(v, "__qualname__", repr(v))

    return conv(rule)


def _progress(total: int, disabled: bool, desc: str = "train"):
    if disabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, mininterval=0.5)


def _plot(path, rows, title):
    steps = [r["step"] for r in rows]
    curves = {"train loss (batch)": (steps, [r["loss"] for r in rows])}
    ev = [r for r in rows if "val_loss" in r]
    if ev:
        curves["validation loss"] = ([r["step"] for r in ev], [r["val_loss"] for r in ev])
    output.plot_curves(path, curves, "step", "cross-entropy (nats)", title, logy=True)

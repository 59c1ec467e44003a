"""Train a reference model with a refopt rule; write metrics.csv, config.json, loss.png, checkpoint.npz.

Default: the GPT of ``refopt.models.gpt`` (4 layers, 128 wide, 4 heads, block 64, batch 32, float32) on the
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
import sys
import time

import numpy as np

import refopt
from refopt.fast import blas
from refopt.cli import diagnostics as cli_diagnostics
from refopt.cli import optimizers, output
from refopt.cli.tasks import GPTTask, MLPTask

HELP = "train a reference model (default: the GPT on CPython's docs text) and write metrics, config, plot"

TASKS = {"gpt": GPTTask, "mlp": MLPTask}
DTYPES = {"float32": np.float32, "float64": np.float64}
DEFAULTS = {  # per-model defaults of the options left at None
    "gpt": {"optimizer": "muon", "schedule": "cosine", "warmup": 30, "steps": 500, "batch_size": 32, "ns_steps": 4},
    "mlp": {"optimizer": "adamw", "schedule": "constant", "warmup": 0, "steps": 600, "batch_size": 64, "ns_steps": 5},
}
#: settings a resumed run may change; all others come from the checkpointed run's config.json
RESUMABLE = ("out", "no_progress", "stop_after", "checkpoint_interval", "overwrite")
#: attributes of the parsed arguments that are not settings of the run (not written to config.json)
NOT_SETTINGS = ("schedule_fn", "resume", "explicit_options", "debug", "overwrite")
#: options that only one model uses
MODEL_OPTIONS = {"mlp": ("hidden",),
                 "gpt": ("data", "n_layer", "n_embd", "n_head", "block_size", "ffn", "qk_norm", "untie_head",
                         "init", "eval_batches", "sample_chars")}


def check_options(args, names: list[str]) -> None:
    """Raise ValueError (one line) for an option written on the command line that does not apply to
    ``args.model`` or to any of the optimizers ``names``."""
    for model, dests in MODEL_OPTIONS.items():
        for dest in dests:
            if model != args.model and dest in getattr(args, "explicit_options", ()):
                raise ValueError(f"--{dest.replace('_', '-')} applies to --model {model}, not --model {args.model}")
    optimizers.check_options(args, names)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gpt", choices=sorted(TASKS), help="what to train")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: gpt 500, mlp 600; overrides --epochs)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training set (instead of --steps)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="examples (MLP) or sequences (GPT) per step (default: gpt 32, mlp 64)")
    p.add_argument("--seed", type=int, default=0, help="seeds the init and the data order")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="floating type of the parameters, the data and the optimizer state")
    p.add_argument("--out", default="runs/train", help="output directory (created if missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the outputs of a previous run in --out (without it, such a directory is refused)")
    p.add_argument("--eval-interval", type=int, default=50,
                   help="steps between evaluations on the validation split (the test split for the MLP)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    m = p.add_argument_group("mlp")
    m.add_argument("--hidden", type=int, nargs="+", default=[128], help="MLP hidden widths")
    g = p.add_argument_group("gpt")
    g.add_argument("--data", default=None, help="a UTF-8 text file (default: CPython's pydoc_data.topics)")
    g.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    g.add_argument("--n-embd", type=int, default=128, help="embedding width")
    g.add_argument("--n-head", type=int, default=4, help="attention heads (must divide --n-embd)")
    g.add_argument("--block-size", type=int, default=64, help="context length in characters")
    g.add_argument("--ffn", default="swiglu", choices=["swiglu", "reglu", "gelu"], help="feed-forward block")
    g.add_argument("--qk-norm", action="store_true", help="RMSNorm on q and k per head")
    g.add_argument("--untie-head", action="store_true", help="a separate lm_head instead of wte^T")
    g.add_argument("--init", default="normal", choices=["normal", "mup"], help="init scheme (see refopt.models.gpt.init)")
    g.add_argument("--eval-batches", type=int, default=8, help="validation batches per evaluation")
    g.add_argument("--sample-chars", type=int, default=300, help="characters generated at the end")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run saved in DIR (its checkpoint.npz and config.json)")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="stop after N steps of this invocation (the checkpoint lets --resume continue)")
    p.add_argument("--checkpoint-interval", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (0: at the end only)")
    p.add_argument("--diagnostics", action="store_true",
                   help="add per-group elr[G], aus[G], w_rms[G], u_rms[G] columns to metrics.csv; write diagnostics.png")
    optimizers.add_arguments(p)


def _resolve(args) -> None:
    """Fill the per-model defaults and reject impossible values (ValueError, one line)."""
    d = DEFAULTS[args.model]
    for name in ("optimizer", "batch_size", "ns_steps"):
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


def prepare(args, task=None):
    """(task, rule, lr, steps) for fully resolved ``args``: every option checked (ValueError, one line) and
    the rule built, nothing trained. ``task``: one already built for the same model options (``refopt
    compare`` shares it between its runs), else a new one."""
    _resolve(args)
    check_options(args, [args.optimizer])
    if task is None:
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
        checkpoint_interval: int = 0, diagnostics=None):
    """Train ``task``'s model with ``rule`` up to step ``steps`` from the init and data order of ``seed``.

    ``start=(params, state)`` continues from a checkpointed state (its ``t`` steps done). Returns
    ``(params, state, rows)``; ``rows`` holds per step the batch loss (at the params before the update),
    the learning rate lr*gamma_t each parameter group's rule applied (``lr[GROUP]``, as ``refopt.update_``
    reports it in ``info``; ``lr`` is the main group's: 'hidden' of a Partition), the elapsed wall time (``_seconds``, never written to
    files), and every ``eval_interval`` steps (and at the last) the validation metrics at the evaluation
    params (:func:`refopt.eval_params`). ``diagnostics`` (a :class:`refopt.cli.diagnostics.Diagnostics`)
    adds its per-group columns to every row.
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
        before = diagnostics.snapshot(params) if diagnostics is not None else None
        info: dict = {}
        params, state = refopt.update_(rule, state, params, grads, info=info)
        row = {"step": step, "loss": loss, **group_lrs(info["lr"])}
        if diagnostics is not None:
            row.update(diagnostics.row(step, before, params, state, info["lr"]))
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


def train_one(args, progress_desc: str = "train", prepared=None) -> dict:
    """Fit one run of ``args`` (no files written); used by ``refopt compare``. ``prepared``: what
    :func:`prepare` returned for ``args`` (called here if None)."""
    task, rule, lr, steps = prepare(args) if prepared is None else prepared
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
    return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}


def matrix_products() -> str:
    """``refopt.fast.blas.describe()``, deciding the BLAS before anything is written; REFOPT_GEMM set to a bad
    value, or to ``mkl`` where MKL cannot be used, is a user mistake (ValueError: one line, exit status 2)."""
    try:
        return blas.describe()
    except (RuntimeError, ValueError) as e:
        raise ValueError(str(e)) from None


def say_unused_mkl() -> None:
    """Print :func:`refopt.fast.blas.notice` to stderr (one line, once per process): the ``mkl`` package is
    installed but the matrix products run on NumPy's BLAS, and why (``config.json`` records it too)."""
    line = blas.notice()
    if line:
        print(line, file=sys.stderr)


def _load_resume(args):
    """Settings of the run in ``args.resume`` (with the RESUMABLE overrides), its checkpoint and rows.

    Also returns the BLAS the run recorded (``matrix_products``; None before it was recorded).
    Raises ValueError (one line) for anything wrong in the directory: a missing or malformed
    config.json (not JSON, no settings, a setting missing, unknown or of the wrong type), a checkpoint
    that cannot be loaded, a malformed metrics.csv, or options given that the resumed run cannot change.
    """
    d = args.resume
    given = sorted(set(getattr(args, "explicit_options", ())) - set(RESUMABLE) - {"resume"})
    if given:
        raise ValueError(f"--resume takes the run's settings from {d}/config.json; only "
                         f"{', '.join('--' + k.replace('_', '-') for k in RESUMABLE)} may be given with it, "
                         f"not {', '.join('--' + k.replace('_', '-') for k in given)}")
    cfg_path, ckpt_path, metrics_path = (os.path.join(d, f) for f in ("config.json", "checkpoint.npz", "metrics.csv"))
    for p in (cfg_path, ckpt_path, metrics_path):
        if not os.path.isfile(p):
            raise ValueError(f"--resume {d}: missing {os.path.basename(p)} (not a refopt train output directory?)")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"--resume {d}: config.json is not valid JSON ({e})") from None
    settings = cfg.get("settings") if isinstance(cfg, dict) else None
    if not isinstance(settings, dict):
        raise ValueError(f"--resume {d}: config.json has no 'settings' object (not written by refopt train?)")
    new = argparse.Namespace(**_check_settings(settings, d))
    out_given = "out" in getattr(args, "explicit_options", ()) or args.out != "runs/train"
    for k in RESUMABLE:
        setattr(new, k, getattr(args, k))
    if not out_given:
        new.out = d
    new.explicit_options = set()
    ckpt = refopt.load(ckpt_path)
    try:
        with open(metrics_path, newline="", encoding="utf-8") as f:
            rows = [{k: _parse(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
        rows = [r for r in rows if r["step"] <= ckpt.state.t]
    except (UnicodeDecodeError, KeyError, TypeError, ValueError, csv.Error) as e:
        raise ValueError(f"--resume {d}: metrics.csv is malformed ({type(e).__name__}: {e})") from None
    return new, ckpt, rows, cfg.get("matrix_products")


def _check_settings(settings: dict, d: str) -> dict:
    """``settings`` of a config.json, checked against the options of ``refopt train``: every setting
    present (but the RESUMABLE ones), none unknown, each of its option's type and among its choices."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    actions = {a.dest: a for a in p._actions if a.dest not in ("help", *NOT_SETTINGS)}
    missing = sorted(set(actions) - set(settings) - set(RESUMABLE))
    unknown = sorted(set(settings) - set(actions) - {"command"})
    if missing or unknown:
        raise ValueError(f"--resume {d}: config.json " + "; ".join(
            x for x in (f"lacks the settings {missing}" if missing else "",
                        f"has unknown settings {unknown}" if unknown else "") if x) +
            " (written by another refopt version, or edited?)")
    if settings.get("command", "train") != "train":
        raise ValueError(f"--resume {d}: config.json is of a refopt {settings['command']!r} run, not train")
    for dest, v in settings.items():
        if dest == "command":
            continue
        a = actions[dest]
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            ok = type(v) is bool
        else:
            kind = {int: (int,), float: (int, float)}.get(a.type, (str,))
            values = v if a.nargs == "+" and isinstance(v, list) and v else [v]
            ok = (v is None and dest not in ("model", "seed", "dtype")) or (
                (a.nargs != "+" or isinstance(v, list)) and
                all(type(x) in kind and (a.choices is None or x in a.choices) for x in values))
        if not ok:
            raise ValueError(f"--resume {d}: config.json has an invalid value {v!r} for {dest}")
    return settings


def _parse(v: str):
    try:
        return int(v)
    except ValueError:
        return float(v)


def run(args: argparse.Namespace) -> int:
    previous: list[dict] = []
    start = ckpt = None
    resumed = args.resume
    products = matrix_products()
    if args.resume is not None:
        args, ckpt, previous, products_before = _load_resume(args)
        if products_before is not None and products_before != products:
            print(f"refopt train: warning: the run was started with matrix products {products_before!r} and "
                  f"continues with {products!r}: it may differ in the last bits from the uninterrupted run; "
                  "config.json records both", file=sys.stderr)
            products = f"{products_before}, then from step {ckpt.state.t + 1}: {products}"
    task, rule, lr, steps = prepare(args)
    own = resumed is not None and os.path.realpath(args.out) == os.path.realpath(resumed)   # its own run
    overwrite = getattr(args, "overwrite", False) and not own
    out = output.prepare_out(args.out, check_run=not own, overwrite=overwrite)
    say_unused_mkl()
    if ckpt is not None:
        if refopt.checkpoint.rule_to_json(ckpt.rule) != refopt.checkpoint.rule_to_json(rule):
            raise ValueError(f"--resume: the checkpointed rule differs from the one {args.resume} describes")
        if ckpt.state.t >= steps:
            raise ValueError(f"--resume: the run already completed its {steps} steps")
        start = (ckpt.params, ckpt.state)
    ckpt_file = os.path.join(out, "checkpoint.npz")

    def checkpoint(params, state):
        refopt.save(ckpt_file, params, state, rule, seed=args.seed, step=state.t)

    diag = cli_diagnostics.Diagnostics(rule) if getattr(args, "diagnostics", False) else None
    t0 = time.perf_counter()
    params, state, rows = fit(task, rule, steps, args.seed, lr, args.schedule_fn, args.eval_interval,
                              progress=not args.no_progress, start=start, stop_after=args.stop_after,
                              on_checkpoint=checkpoint, checkpoint_interval=args.checkpoint_interval,
                              diagnostics=diag)
    seconds = time.perf_counter() - t0
    if overwrite:     # the previous run's files go only now that this one has its results
        output.remove_previous(out)
    checkpoint(params, state)
    rows = previous + rows
    done = state.t >= steps

    final_params = refopt.eval_params(rule, state, params)
    final = final_metrics(task, rows, final_params)
    extra = task.finish(final_params, out, args.seed) if done else {}
    output.write_csv(os.path.join(out, "metrics.csv"), rows, metric_columns(rows))
    config = {"command": "train", "settings": _settings(args), "steps": steps, "steps_done": state.t,
              "rule": describe_rule(rule), "task": task.describe(), "final": final,
              "versions": output.package_versions(), "matrix_products": products}
    output.write_json(os.path.join(out, "config.json"), config)
    _plot(os.path.join(out, "loss.png"), rows, f"{args.model}: {rule_title(rule)} (seed {args.seed})",
          task.eval_split)
    if diag is not None:
        cli_diagnostics.plot(os.path.join(out, "diagnostics.png"), rows, f"{args.model}: {rule_title(rule)}")

    print(" ".join(f"{k}={v:.4f}" for k, v in final.items()))
    for k, v in extra.items():
        print(f"{k}:\n{v}")
    n = max(1, len(rows) - len(previous))
    status = "" if done else f" (stopped at step {state.t} of {steps}; continue with --resume {out})"
    print(f"{n} steps in {seconds:.1f} s ({1000 * seconds / n:.1f} ms/step){status}; wrote {out}/")
    return 0


def group_lrs(lrs: dict) -> dict[str, float]:
    """``{"lr[GROUP]": lr_t}`` from what ``refopt.update_`` reports in ``info["lr"]``: the learning rate each
    parameter group's rule applied at the step, GROUP the label of a :class:`refopt.Partition` (``all``
    for another rule; a wrapper without its own lr, Average or EMA, reports its base rule's)."""
    return {f"lr[{k}]": v for k, v in lrs.items()}


def metric_columns(rows) -> list[str]:
    """The metrics.csv columns of ``rows``: step, loss, the lr of every group, then the periodic metrics."""
    keys = [k for r in rows for k in r if not k.startswith("_")]
    keys = list(dict.fromkeys(keys))
    lrs = [k for k in keys if k.startswith("lr[")]
    return ["step", "loss"] + lrs + [k for k in keys if k not in ("step", "loss") and k not in lrs]


def rule_title(rule) -> str:
    """A short name of ``rule`` for plot titles: ``Muon on hidden, AdamW on other`` for a Partition,
    ``EMA(AdamW)`` for a wrapper."""
    if isinstance(rule, refopt.Partition):
        return ", ".join(f"{rule_title(r)} on {k}" for k, r in rule.rules.items())
    base = getattr(rule, "base", None)
    return f"{type(rule).__name__}({rule_title(base)})" if base is not None else type(rule).__name__


def describe_rule(rule) -> dict:
    """The rule as JSON-ready data: its class name and fields, nested rules and schedules expanded."""
    from refopt.serialize import describe

    return describe(rule)


def _progress(total: int, disabled: bool, desc: str = "train"):
    if disabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, mininterval=0.5)


def _plot(path, rows, title, eval_split="validation"):
    fig = loss_figure(rows, title, eval_split)
    fig.savefig(path, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)


def loss_figure(rows, title: str, eval_split: str = "validation"):
    """The figure of loss.png: the loss against step on a log axis with labelled ticks (top; the
    legend gives the final values) and the lr of every parameter group (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_lr) = plt.subplots(2, 1, figsize=(7, 6), dpi=110, sharex=True,
                                    gridspec_kw={"height_ratios": [3, 1]})
    steps = [r["step"] for r in rows]
    losses = [r["loss"] for r in rows]
    ax.plot(steps, losses, lw=1.2, marker="o" if len(steps) < 30 else None, ms=3,
            label=f"train loss (batch), last {losses[-1]:#.4g}")
    ev = [r for r in rows if "val_loss" in r]
    ys = list(losses)
    if ev:
        ve = [r["val_loss"] for r in ev]
        ys += ve
        ax.plot([r["step"] for r in ev], ve, lw=1.6, marker="o", ms=3, label=f"{eval_split} loss, last {ve[-1]:#.4g}")
    output.log_axis(ax, min(ys), max(ys))
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    for k in [k for k in metric_columns(rows) if k.startswith("lr[")]:
        ax_lr.plot(steps, [r.get(k, float("nan")) for r in rows], lw=1.2, label=k)
    ax_lr.set_ylim(bottom=0.0)
    ax_lr.margins(y=0.15)
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(alpha=0.3)
    ax_lr.legend(fontsize=8)
    fig.tight_layout()
    return fig

# %% [markdown]
# # Tutorial 2 — weight averaging acts like a learning-rate schedule (post 004)
#
# **Claims** (post 004, eqs. (2), (10), (17)).
# 1. Averaging beside training, μ_{t+1} = (1 − c_{t+1})μ_t + c_{t+1}θ_{t+1} (eq. (2)), does not change the
#    trajectory θ_t (`refopt.Average`, `refopt.EMA`: checked bit for bit).
# 2. Evaluating the average with weights v_t acts like multiplying the learning rate by
#    γ_t = v_{t+1:T}/v_{1:T} (the meaning of eq. (10)). `averaging_multiplier(v)` computes it: uniform
#    weights (c_t = 1/t) give the linear decay 1 − t/T; an EMA (v_t = γ^{−t}) gives
#    (1 − γ^{T−t})/(1 − γ^T) (eq. (17)): a decay over the last ~1/(1 − γ) steps only.
# 3. Hence an EMA run beside constant-lr training *previews*, at any step t, the end of a linear decay over a
#    window before t: the figure branches a linear decay (lr → 0 over W = 2/(1 − γ) steps, the window whose
#    lost lr area equals the EMA's) off the constant-lr run at several points and compares its endpoint with
#    the EMA at the same step.
# 4. Schedule-Free (eq. (18), `refopt.ScheduleFreeSGD`) against a tuned linear-decay schedule, and why
#    warmup remains: at a large lr Schedule-Free without warmup is hurt by the large early gradients.
#
# What the figure does *not* show: the convex-theory correspondence of the uniform average with a linear
# decay holds only at the endpoint T (the average at t < T corresponds to a decay that ends at t), and on
# this easy, non-convex problem the uniform average is slow (it keeps the early, poor iterates: the seed's
# "poor in practice"), so it is not claimed to match the decayed run.
#
# Setting: refopt's MLP 64-64-10 on the 8x8 digits (float64), SGD, batch 16, the same batches in every run.
#
# Run: `python tutorials/t02_averaging_as_schedule.py --out DIR` (about 40 s).

# %%
"""Tutorial 2 -- weight averaging acts like a learning-rate schedule (post 004), and Schedule-Free."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t02_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import mlp
from refopt.models.data import load_digits

# %% [markdown]
# ## Eq. (10): a weighting of the iterates as a learning-rate multiplier

# %%


def averaging_multiplier(v) -> np.ndarray:
    """gamma_t = v_{t+1:T} / v_{1:T} for t = 1..T (post 004, eq. (10) read as a multiplier of the lr): the
    schedule that evaluating the v-weighted average of the iterates acts like. v: T weights >= 0, sum > 0.
    gamma_T = 0. Raises ValueError for negative weights or a zero sum."""
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or np.any(v < 0) or not v.sum() > 0:
        raise ValueError("v must be a non-empty 1-D array of weights >= 0 with a positive sum")
    tail = np.cumsum(v[::-1])[::-1]                 # tail[t-1] = v_{t:T}
    return np.append(tail[1:], 0.0) / tail[0]


def ema_weights(T: int, decay: float) -> np.ndarray:
    """The weights v_t = decay^(T - t) of an EMA at step T (proportional to decay^-t)."""
    return decay ** (T - np.arange(1, T + 1, dtype=np.float64))


# %% [markdown]
# ## Training helpers

# %%


def _batches(n_train: int, batch_size: int, steps: int, seed: int):
    """Index arrays of `steps` mini-batches: epochs of a seeded permutation (the same in every run)."""
    rng = np.random.default_rng(seed)
    out, perm = [], np.empty(0, dtype=np.int64)
    while len(out) < steps:
        if len(perm) < batch_size:
            perm = rng.permutation(n_train)
        out.append(perm[:batch_size])
        perm = perm[batch_size:]
    return out


def _train(rule, params, data, batches, eval_every: int, start: int = 0, keep=()):
    """Train with `rule` on batches[start:]; every `eval_every` steps (and at the first and last) record the
    test loss of the raw iterate and of refopt.eval_params. Returns (steps, raw, eval, final params,
    {step: raw params} for the steps in `keep`)."""
    vg = refopt.value_and_grad(mlp.loss)
    state = refopt.init(rule, params)
    at, raw, ev, kept = [], [], [], {}

    def record(t):
        at.append(t)
        raw.append(float(mlp.loss(params, data.x_test, data.y_test)))
        ev.append(float(mlp.loss(refopt.eval_params(rule, state, params), data.x_test, data.y_test)))

    record(start)
    for t, idx in enumerate(batches[start:], start=start + 1):
        _, grads = vg(params, data.x_train[idx], data.y_train[idx])
        params, state = refopt.update(rule, state, params, grads)
        if t in keep:
            kept[t] = params
        if t % eval_every == 0 or t == len(batches):
            record(t)
    return np.array(at), np.array(raw), np.array(ev), params, kept


# %% [markdown]
# ## 1-3. Constant lr with its uniform average and EMA, linear decay, and linear decays branched off

# %%


def run(steps: int = 1500, lr: float = 0.5, ema_decay: float = 0.98, hidden: int = 64, batch_size: int = 16,
        seed: int = 0, eval_every: int = 20, n_branches: int = 4, data=None) -> dict:
    """Constant-lr SGD (raw, uniform average, EMA), linear-decay SGD, and linear decays over
    W = 2/(1 - ema_decay) steps branched off the constant-lr run so that they end at n_branches points.

    Returns a dict: ``step`` (evaluation steps), test losses ``loss_const``, ``loss_average``, ``loss_ema``,
    ``loss_linear``; ``ema_raw_bitwise`` (averaging left the trajectory unchanged, bit for bit);
    ``branch_end`` (the steps where the branches end), ``branch_loss``, ``ema_at_branch``, ``raw_at_branch``
    (test losses there) and ``branch_curves`` ({end: (steps, losses)}); and the settings.
    """
    data = data if data is not None else load_digits(dtype=np.float64)
    params = mlp.init(seed, [64, hidden, 10], dtype=np.float64)
    batches = _batches(len(data.y_train), batch_size, steps, seed)
    window = int(round(2.0 / (1.0 - ema_decay)))
    ends = [int(round(steps * (k + 1) / n_branches)) for k in range(n_branches)]
    ends = [e - e % eval_every for e in ends if e - window >= 0]
    step, l_const, l_avg, p_const, kept = _train(refopt.Average(refopt.SGD(lr=lr)), params, data, batches,
                                                 eval_every, keep={e - window for e in ends})
    kept[0] = params
    _, l_raw_e, l_ema, p_ema, _ = _train(refopt.EMA(refopt.SGD(lr=lr), decay=ema_decay), params, data, batches,
                                         eval_every)
    lin = refopt.SGD(lr=lr, schedule=refopt.schedules.LinearDecay(steps))
    _, l_lin, _, _, _ = _train(lin, params, data, batches, eval_every)
    same = all(np.array_equal(a, b) for a, b in
               zip(refopt.tree.flatten(p_const)[0], refopt.tree.flatten(p_ema)[0]))
    curves, b_loss = {}, []
    for e in ends:
        rule = refopt.SGD(lr=lr, schedule=refopt.schedules.LinearDecay(window + 1))
        # the branch runs steps e-W+1 .. e of the same batches with lr * (1 - k/(W+1)), k = 1..W
        s, raw, _, _, _ = _train(rule, kept[e - window], data, batches[:e], max(1, window // 10), start=e - window)
        curves[e] = (s, raw)
        b_loss.append(raw[-1])
    where = {int(t): i for i, t in enumerate(step)}
    return dict(step=step, loss_const=l_const, loss_average=l_avg, loss_ema=l_ema, loss_linear=l_lin,
                ema_raw_bitwise=bool(same and np.array_equal(l_const, l_raw_e)), steps=steps, lr=lr,
                ema_decay=ema_decay, window=window, hidden=hidden, batch_size=batch_size, seed=seed,
                branch_end=np.array(ends), branch_loss=np.array(b_loss), branch_curves=curves,
                ema_at_branch=np.array([l_ema[where[e]] for e in ends]),
                raw_at_branch=np.array([l_const[where[e]] for e in ends]))


# %% [markdown]
# ## 4. Schedule-Free against a tuned linear decay, and warmup

# %%


def schedule_free(steps: int = 1500, lrs=(0.1, 0.3, 1.0), big_lr: float = 3.0, warmup: int = 100,
                  hidden: int = 64, batch_size: int = 16, seed: int = 0, eval_every: int = 50, data=None) -> dict:
    """Final test losses of linear-decay SGD and ScheduleFreeSGD (beta 0.9) over `lrs` (the tuned value is
    the best of the sweep), and Schedule-Free at `big_lr` with and without `warmup` steps of linear warmup."""
    data = data if data is not None else load_digits(dtype=np.float64)
    params = mlp.init(seed, [64, hidden, 10], dtype=np.float64)
    batches = _batches(len(data.y_train), batch_size, steps, seed)
    out = {"lrs": np.array(lrs), "big_lr": big_lr, "warmup": warmup}
    for name, make in (("linear", lambda lr: refopt.SGD(lr=lr, schedule=refopt.schedules.LinearDecay(steps))),
                       ("schedule_free", lambda lr: refopt.ScheduleFreeSGD(lr=lr))):
        finals, curves = [], []
        for lr in lrs:
            s, raw, ev, _, _ = _train(make(lr), params, data, batches, eval_every)
            finals.append(ev[-1])
            curves.append(ev)
        out[name] = np.array(finals)
        out[f"{name}_best_curve"] = curves[int(np.argmin(finals))]
    out["step"] = s
    with np.errstate(over="ignore", invalid="ignore"):
        for tag, w in (("no_warmup", 0), ("warmup", warmup)):
            try:
                _, _, ev, _, _ = _train(refopt.ScheduleFreeSGD(lr=big_lr, warmup_steps=w), params, data, batches,
                                        eval_every)
            except FloatingPointError:           # diverged: refopt refuses a non-finite gradient
                ev = np.full(len(s), np.nan)
            out[f"big_{tag}"] = np.where(np.isfinite(ev), ev, np.nan)
    return out


# %% [markdown]
# ## Figure and printout

# %%


def plot(r: dict, sf: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axs[0]
    T = 200
    t = np.arange(1, T + 1)
    ax.plot(t, averaging_multiplier(np.ones(T)), lw=3, alpha=0.5, label="uniform v (computed)")
    ax.plot(t, 1 - t / T, "k:", label="1 − t/T")
    for g in (0.9, 0.97):
        ax.plot(t, averaging_multiplier(ema_weights(T, g)), lw=3, alpha=0.5, label=f"EMA γ={g} (computed)")
        ax.plot(t, (1 - g ** (T - t)) / (1 - g ** T), "k--", lw=0.8, label=f"eq. (17), γ={g}")
    ax.set_xlabel("step t")
    ax.set_ylabel("lr multiplier v_{t+1:T}/v_{1:T}")
    ax.set_title("eq. (10): averaging weights as an lr schedule", fontsize=10)
    ax = axs[1]
    s = r["step"]
    ax.plot(s, r["loss_const"], color="tab:gray", lw=1, label=f"SGD lr={r['lr']:g}: raw iterate")
    ax.plot(s, r["loss_ema"], color="tab:green", lw=2, label=f"  its EMA (γ={r['ema_decay']:g})")
    ax.plot(s, r["loss_average"], color="tab:blue", lw=1.5, label="  its uniform average")
    ax.plot(s, r["loss_linear"], color="tab:red", lw=1.2, ls="--", label="linear decay over the whole run")
    for k, (e, (bs, bl)) in enumerate(r["branch_curves"].items()):
        ax.plot(bs, bl, color="tab:purple", lw=2, label=f"linear decay over the last W={r['window']} steps"
                if k == 0 else None)
        ax.plot([e], [bl[-1]], "o", color="tab:purple")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("test loss (nats)")
    ax.set_title("eq. (17): the EMA previews the end of a short decay", fontsize=10)
    ax = axs[2]
    ax.plot(sf["step"], sf["linear_best_curve"], color="tab:red", label=f"linear decay, best lr of {[float(v) for v in sf['lrs']]}")
    ax.plot(sf["step"], sf["schedule_free_best_curve"], color="tab:blue", label="Schedule-Free SGD, best lr (at x)")
    ax.plot(sf["step"], sf["big_no_warmup"], color="tab:orange", ls=":", lw=2,
            label=f"Schedule-Free lr={sf['big_lr']:g}, no warmup")
    ax.plot(sf["step"], sf["big_warmup"], color="tab:orange", lw=1.5,
            label=f"Schedule-Free lr={sf['big_lr']:g}, {sf['warmup']} warmup steps")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("Schedule-Free vs a tuned schedule; warmup", fontsize=10)
    for ax in axs:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--steps", type=int, default=1500, help="training steps T")
    ap.add_argument("--lr", type=float, default=0.5, help="peak SGD learning rate")
    ap.add_argument("--ema-decay", type=float, default=0.98)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=20)
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    if a.steps < 1 or a.eval_every < 1:
        ap.error("--steps and --eval-every must be >= 1")
    os.makedirs(a.out, exist_ok=True)
    data = load_digits(dtype=np.float64)
    r = run(a.steps, a.lr, a.ema_decay, a.hidden, a.batch_size, a.seed, a.eval_every, data=data)
    sf = schedule_free(a.steps, hidden=a.hidden, batch_size=a.batch_size, seed=a.seed,
                       eval_every=max(a.eval_every, a.steps // 30), data=data)
    print(f"test loss after {a.steps} steps:")
    for k, name in [("loss_const", "constant lr, raw iterate"), ("loss_average", "constant lr, uniform average"),
                    ("loss_ema", "constant lr, EMA"), ("loss_linear", "linear decay")]:
        print(f"  {name:<30} {r[k][-1]:.4f}   (best over the run {np.min(r[k]):.4f})")
    print(f"averaging leaves the trajectory unchanged (bitwise): {r['ema_raw_bitwise']}")
    print(f"EMA vs a linear decay over the last {r['window']} steps, at steps {[int(e) for e in r['branch_end']]}:")
    print("  decay endpoint " + " ".join(f"{v:.4f}" for v in r["branch_loss"]))
    print("  EMA            " + " ".join(f"{v:.4f}" for v in r["ema_at_branch"]))
    print("  raw iterate    " + " ".join(f"{v:.4f}" for v in r["raw_at_branch"]))
    print(f"lr sweep {[float(v) for v in sf['lrs']]}: linear decay {np.round(sf['linear'], 4)}, Schedule-Free "
          f"{np.round(sf['schedule_free'], 4)}")
    print(f"Schedule-Free at lr {sf['big_lr']:g}: final test loss without warmup {sf['big_no_warmup'][-1]:.4f}, "
          f"with {sf['warmup']} warmup steps {sf['big_warmup'][-1]:.4f}")
    path = os.path.join(a.out, "t02_averaging_as_schedule.png")
    plot(r, sf, path)
    print(f"wrote {path}")
    return {**r, "schedule_free": sf}


# %%
if __name__ == "__main__":
    main()

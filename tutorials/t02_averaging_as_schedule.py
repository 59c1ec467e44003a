"""Tutorial 2 -- weight averaging acts like a learning-rate schedule.

Claim (seed 004, eqs. (2), (10), (17)): averaging the iterates beside training,

    theta_{t+1} = theta_t - eta g_t,    mu_{t+1} = (1 - c_{t+1}) mu_t + c_{t+1} theta_{t+1}      (eq. (2))

does not change the trajectory, and evaluating the average mu_T with weights v_t acts like multiplying the
learning rate by v_{t+1:T} / v_{1:T}: for the uniform average (c_t = 1/t, v_t = 1) that is the linear
decay 1 - t/T, so "constant lr + uniform average" is, in theory (convex case), "linear-decay lr". An EMA
(v_t = gamma^-t) previews the end of a linear decay over a window of about 1/(1 - gamma) steps (eq. (17)).
The seed also warns that the uniform average underperforms in practice (non-convexity: it keeps the
early, poor iterates).

This script trains refopt's MLP on the 8x8 digits (float64) from one init on one batch order with
  * SGD at constant lr, evaluated at its raw iterate, its uniform average (refopt.Average) and an EMA
    (refopt.EMA; a separate run, whose training trajectory is the same bit for bit);
  * SGD with the linear-decay schedule refopt.schedules.LinearDecay(T) (lr -> 0 at step T);
and plots the test loss of each against the step.

Run from the repository root:  python tutorials/t02_averaging_as_schedule.py [--out DIR] [--steps N]
It writes DIR/t02_averaging_as_schedule.png and prints the final test losses.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t02_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.models import mlp
from refopt.models.data import load_digits


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


def _train(rule, params, data, batches, eval_every: int):
    """Train with `rule`; every `eval_every` steps (and at step 0 and the last step) record the test loss
    of the raw iterate and of refopt.eval_params (the average, for Average/EMA). Returns (steps, raw, eval,
    final params)."""
    vg = refopt.value_and_grad(mlp.loss)
    state = refopt.init(rule, params)
    at, raw, ev = [], [], []

    def record(t):
        at.append(t)
        raw.append(float(mlp.loss(params, data.x_test, data.y_test)))
        ev.append(float(mlp.loss(refopt.eval_params(rule, state, params), data.x_test, data.y_test)))

    record(0)
    for t, idx in enumerate(batches, start=1):
        _, grads = vg(params, data.x_train[idx], data.y_train[idx])
        params, state = refopt.update(rule, state, params, grads)
        if t % eval_every == 0 or t == len(batches):
            record(t)
    return np.array(at), np.array(raw), np.array(ev), params


def run(steps: int = 1500, lr: float = 0.5, ema_decay: float = 0.98, hidden: int = 64, batch_size: int = 16,
        seed: int = 0, eval_every: int = 20, data=None) -> dict:
    """Constant-lr SGD (raw, uniform average, EMA) and linear-decay SGD for `steps` steps.

    Returns a dict: ``step`` (evaluation steps), test losses ``loss_const`` (raw constant-lr iterate),
    ``loss_average`` (its uniform average), ``loss_ema`` (its EMA), ``loss_linear`` (linear-decay SGD),
    ``ema_raw_bitwise`` (whether the EMA run's raw iterates equal the plain constant-lr run's, bit for bit:
    averaging does not change the trajectory), and the settings.
    """
    data = data if data is not None else load_digits(dtype=np.float64)
    params = mlp.init(seed, [64, hidden, 10], dtype=np.float64)
    batches = _batches(len(data.y_train), batch_size, steps, seed)
    step, l_const, l_avg, p_const = _train(refopt.Average(refopt.SGD(lr=lr)), params, data, batches, eval_every)
    _, l_raw_e, l_ema, p_ema = _train(refopt.EMA(refopt.SGD(lr=lr), decay=ema_decay), params, data, batches,
                                      eval_every)
    lin = refopt.SGD(lr=lr, schedule=refopt.schedules.LinearDecay(steps))
    _, l_lin, _, _ = _train(lin, params, data, batches, eval_every)
    same = all(np.array_equal(a, b) for a, b in
               zip(refopt.tree.flatten(p_const)[0], refopt.tree.flatten(p_ema)[0]))
    return dict(step=step, loss_const=l_const, loss_average=l_avg, loss_ema=l_ema, loss_linear=l_lin,
                ema_raw_bitwise=bool(same and np.array_equal(l_const, l_raw_e)), steps=steps, lr=lr,
                ema_decay=ema_decay, hidden=hidden, batch_size=batch_size, seed=seed)


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    s = r["step"]
    ax.plot(s, r["loss_const"], color="tab:gray", lw=1, label=f"SGD constant lr={r['lr']:g}: raw iterate")
    ax.plot(s, r["loss_average"], color="tab:blue", lw=2, label="  ... its uniform average (c_t = 1/t)")
    ax.plot(s, r["loss_ema"], color="tab:green", lw=2, ls="--", label=f"  ... its EMA (decay {r['ema_decay']:g})")
    ax.plot(s, r["loss_linear"], color="tab:red", lw=2, label=f"SGD linear decay {r['lr']:g}(1 - t/T)")
    ax.set_xlabel("step")
    ax.set_ylabel("test loss (nats)")
    ax.set_yscale("log")
    ax.set_title("Averaging beside constant-lr SGD vs a linear-decay schedule (seed 004)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    a = ap.parse_args(argv)
    if a.steps < 1 or a.eval_every < 1:
        ap.error("--steps and --eval-every must be >= 1")
    os.makedirs(a.out, exist_ok=True)
    r = run(a.steps, a.lr, a.ema_decay, a.hidden, a.batch_size, a.seed, a.eval_every)
    print(f"test loss after {a.steps} steps:")
    for k, name in [("loss_const", "constant lr, raw iterate"), ("loss_average", "constant lr, uniform average"),
                    ("loss_ema", "constant lr, EMA"), ("loss_linear", "linear decay")]:
        print(f"  {name:<30} {r[k][-1]:.4f}   (best over the run {np.min(r[k]):.4f})")
    print(f"averaging leaves the trajectory unchanged (bitwise): {r['ema_raw_bitwise']}")
    path = os.path.join(a.out, "t02_averaging_as_schedule.png")
    plot(r, path)
    print(f"wrote {path}")
    return r


if __name__ == "__main__":
    main()

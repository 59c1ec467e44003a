# %% [markdown]
# # Tutorial 5 — weight decay only sets the learning rate (post 002)
#
# **Claim** (post 002, the experiment the post leaves to the reader). Train Muon with decoupled weight
# decay (MuonWD) and record, for every matrix and every step, its effective learning rate
# η_eff,t = η_t/‖W_t‖_F. Then train Muon *without* decay, giving each matrix at each step the learning rate
# η_eff,t·‖W'_t‖_F (its own current norm): the relative step sizes are the same, and the seed predicts the
# validation curves almost coincide, while Muon without decay at the plain lr does not follow MuonWD.
# Likewise MuonH (Hyperball on Muon, a fixed norm) aligned to MuonWD by angular velocity should follow it,
# and MuonWD aligned to MuonH should follow MuonH ("both ways").
#
# How refopt does it: `refopt.LRTable(Muon(...), lrs={path: (η_eff,1, ..., η_eff,T)}, relative=True)`
# replays a recorded table (it is part of the rule, so it is saved in checkpoints). MuonH gets a per-matrix
# lr schedule tan θ_t from MuonWD's measured angle per step θ_t = 2 arcsin(AUS_t/2) (exact for a direction
# orthogonal to W, first-order otherwise); MuonWD aligned to MuonH gets per matrix and step the lr that
# gives its step the angle of MuonH's, to first order: η_t = θ_t ‖W_t‖_F/‖s·msign(M)‖_F, with
# ‖msign(M)‖_F = sqrt(rank) (computed online from the weights of that run).
#
# Setting: an MLP 64-128-128-10 on the 8x8 digits (float64) with an RMSNorm after each hidden matrix,
# h ← relu(rmsnorm(h W) + b), so that the loss does not depend on the scale of those two matrices (the
# situation of the seed, where pre-norm layers make the hidden matrices nearly scale-invariant; on a plain
# MLP the weight norm sets the logits' scale and the claim fails: try `--no-norm`). Muon (spectral scale,
# momentum 0.95) on the two normalised matrices, AdamW on the head and the biases; batch 32; the same
# batches in every run.
#
# Run: `python tutorials/t05_weight_decay_sets_lr.py --out DIR` (about 30 s). Writes DIR/t05_weight_decay_sets_lr.png.

# %%
"""Tutorial 5 -- weight decay only sets the learning rate (post 002): MuonWD, eta_eff-matched Muon, MuonH."""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

try:  # run as `python tutorials/t05_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import mlp
from refopt.models.data import load_digits
from refopt import autograd as ag
from refopt import diagnostics as D
from refopt.rules.muon import muon_scale

MATS = ("layers[0].w", "layers[1].w")     # the Muon matrices
NORMED = [True]                           # --no-norm sets it to False (a plain MLP)


def loss(params, x, y):
    """Cross-entropy of the MLP with h <- relu(rmsnorm(h W) + b) on the hidden layers (NORMED[0]), or
    refopt's plain MLP (refopt.models.mlp.loss)."""
    if not NORMED[0]:
        return mlp.loss(params, x, y)
    h = np.asarray(x, dtype=np.float64)
    layers = params["layers"]
    for layer in layers[:-1]:
        z = h @ layer["w"]
        h = ag.relu(ag.rms_norm(z, None, 0.0) + layer["b"])
    return ag.cross_entropy(h @ layers[-1]["w"] + layers[-1]["b"], y)


# %% [markdown]
# ## One training loop for every variant
# `rule_for(t, params)` may return a different rule object per step only through per-step values that the
# loop sets (MuonWD aligned to MuonH needs the current weights); everything else is a fixed refopt rule.

# %%


class Recorded:
    """A schedule t -> values[t-1] (a recorded or online per-step multiplier; in memory only)."""

    def __init__(self, values=None):
        self.values = [] if values is None else list(values)

    def __call__(self, t):
        return self.values[t - 1]


def _batches(n, batch_size, steps, seed):
    rng = np.random.default_rng(seed)
    return [rng.choice(n, batch_size, replace=False) for _ in range(steps)]


def _partition(hidden_rules: dict, adam_lr: float):
    """Per-matrix labels (one rule per Muon matrix) and AdamW for the rest."""
    rules = dict(hidden_rules)
    rules["other"] = refopt.AdamW(lr=adam_lr, weight_decay=0.0)
    if len(hidden_rules) == 1:
        label = lambda p, x: next(iter(hidden_rules)) if p in MATS else "other"  # noqa: E731
    else:
        label = lambda p, x: p if p in MATS else "other"  # noqa: E731
    return refopt.Partition(rules=rules, labels=label)


def train(rule, data, batches, params, eval_every, before_step=None):
    """Returns (eval steps, test losses, per-matrix records {path: {"eta_eff", "aus", "norm"}})."""
    vg = refopt.value_and_grad(loss)
    state = refopt.init(rule, params)
    steps, losses = [0], [float(loss(params, data.x_test, data.y_test))]
    rec = {p: {"norm": [], "aus": []} for p in MATS}
    for t, idx in enumerate(batches, start=1):
        if before_step is not None:
            before_step(t, params)
        _, g = vg(params, data.x_train[idx], data.y_train[idx])
        new, state = refopt.update(rule, state, params, g)
        for i, p in enumerate(MATS):
            w, w_new = params["layers"][i]["w"], new["layers"][i]["w"]
            rec[p]["norm"].append(np.linalg.norm(w))
            rec[p]["aus"].append(D.aus(w, w_new))
        params = new
        if t % eval_every == 0 or t == len(batches):
            steps.append(t)
            losses.append(float(loss(params, data.x_test, data.y_test)))
    return np.array(steps), np.array(losses), {p: {k: np.array(v) for k, v in r.items()} for p, r in rec.items()}


# %% [markdown]
# ## The six runs

# %%


def run(steps: int = 400, lr: float = 0.02, wd: float = 0.2, muonh_lr: float = 0.01, adam_lr: float = 3e-3,
        hidden: int = 128, batch_size: int = 32, seed: int = 0, eval_every: int = 20, data=None) -> dict:
    data = data if data is not None else load_digits(dtype=np.float64)
    params = mlp.init(seed, [64, hidden, hidden, 10], dtype=np.float64)
    batches = _batches(len(data.y_train), batch_size, steps, seed)
    muon = lambda **kw: refopt.Muon(momentum=0.95, **kw)  # noqa: E731
    out = {"steps": steps, "lr": lr, "wd": wd, "muonh_lr": muonh_lr}

    # A: MuonWD, recording eta_eff = lr/||W|| per matrix and step
    s, out["loss_wd"], rec_wd = train(_partition({"h": muon(lr=lr, weight_decay=wd)}, adam_lr), data, batches,
                                      params, eval_every)
    out["step"] = s
    out["eta_eff_wd"] = {p: lr / rec_wd[p]["norm"] for p in MATS}
    # B: Muon without decay, replaying eta_eff on its own norm (LRTable, relative)
    table = {p: tuple(float(v) for v in out["eta_eff_wd"][p]) for p in MATS}
    matched = refopt.LRTable(muon(lr=0.0), table, relative=True)
    _, out["loss_matched"], rec_m = train(_partition({"h": matched}, adam_lr), data, batches, params, eval_every)
    # C: Muon without decay at the plain lr (unmatched)
    _, out["loss_nowd"], rec_n = train(_partition({"h": muon(lr=lr)}, adam_lr), data, batches, params, eval_every)
    # D: MuonH aligned to MuonWD by angular velocity: lr_t = tan(theta_t), theta_t = 2 asin(AUS_t/2)
    theta_wd = {p: 2 * np.arcsin(np.minimum(rec_wd[p]["aus"], 2.0) / 2) for p in MATS}
    muonh_aligned = {p: refopt.Hyperball(muon(lr=1.0), lr=1.0, schedule=Recorded(np.tan(theta_wd[p]))) for p in MATS}
    _, out["loss_muonh_aligned"], rec_ha = train(_partition(muonh_aligned, adam_lr), data, batches, params, eval_every)
    # E: MuonH at a constant lr, then F: MuonWD aligned to it (online first-order lr from the current W)
    _, out["loss_muonh"], rec_h = train(_partition({"h": refopt.Hyperball(muon(lr=1.0), lr=muonh_lr)}, adam_lr),
                                        data, batches, params, eval_every)
    theta_h = {p: 2 * np.arcsin(np.minimum(rec_h[p]["aus"], 2.0) / 2) for p in MATS}
    online = {p: Recorded() for p in MATS}
    gain = {p: 1.0 for p in MATS}
    prev = {}

    def set_lr(t, prm):
        """lr_t = k theta_t ||W_t|| / ||s msign(M)||_F, with ||msign(M)||_F = sqrt(rank) (full rank) and a
        feedback factor k that corrects the first-order formula by the angle the previous step turned."""
        for i, p in enumerate(MATS):
            w = prm["layers"][i]["w"]
            if t > 1:
                turned = 2 * math.asin(min(D.aus(prev[p], w), 2.0) / 2)
                gain[p] *= (theta_h[p][t - 2] / turned) ** 0.5 if turned > 0 else 1.0
            prev[p] = w.copy()
            u_norm = muon_scale(w.shape) * math.sqrt(min(w.shape))
            online[p].values.append(gain[p] * theta_h[p][t - 1] * np.linalg.norm(w) / u_norm)

    wd_aligned = {p: muon(lr=1.0, weight_decay=wd, schedule=online[p]) for p in MATS}
    _, out["loss_wd_aligned"], rec_wa = train(_partition(wd_aligned, adam_lr), data, batches, params, eval_every,
                                              before_step=set_lr)
    out["theta"] = {"wd": theta_wd, "muonh_aligned": {p: 2 * np.arcsin(rec_ha[p]["aus"] / 2) for p in MATS},
                    "muonh": theta_h, "wd_aligned": {p: 2 * np.arcsin(rec_wa[p]["aus"] / 2) for p in MATS}}
    out["norm"] = {"wd": rec_wd, "matched": rec_m, "nowd": rec_n, "muonh": rec_h}

    def gap(a, b):
        """mean over the evaluations of |log(loss_a / loss_b)| (the vertical distance on the log plot)"""
        return float(np.mean(np.abs(np.log(out[a] / out[b]))))

    out["gap_matched"], out["gap_nowd"] = gap("loss_matched", "loss_wd"), gap("loss_nowd", "loss_wd")
    out["gap_muonh_aligned"] = gap("loss_muonh_aligned", "loss_wd")
    out["gap_wd_aligned"], out["gap_wd_vs_muonh"] = gap("loss_wd_aligned", "loss_muonh"), gap("loss_wd", "loss_muonh")
    return out


# %% [markdown]
# ## Figure and printout

# %%


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(15, 4.3))
    s = r["step"]
    ax = axs[0]
    ax.plot(s, r["loss_wd"], color="k", lw=2.5, label=f"MuonWD (lr {r['lr']:g}, λ {r['wd']:g})")
    ax.plot(s, r["loss_matched"], color="tab:green", ls="--", lw=2, label="Muon, no WD, η_eff matched (LRTable)")
    ax.plot(s, r["loss_nowd"], color="tab:red", lw=1.3, label="Muon, no WD, same lr (unmatched)")
    ax.plot(s, r["loss_muonh_aligned"], color="tab:blue", ls=":", lw=2, label="MuonH aligned to MuonWD")
    ax.set_title("weight decay as a learning-rate schedule", fontsize=10)
    ax = axs[1]
    ax.plot(s, r["loss_muonh"], color="k", lw=2.5, label=f"MuonH (lr {r['muonh_lr']:g})")
    ax.plot(s, r["loss_wd_aligned"], color="tab:purple", ls="--", lw=2, label="MuonWD aligned to MuonH")
    ax.plot(s, r["loss_wd"], color="tab:gray", lw=1, label="MuonWD (unaligned)")
    ax.set_title("and the other way round", fontsize=10)
    for ax in axs[:2]:
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("test loss (nats)")
    ax = axs[2]
    t = np.arange(1, r["steps"] + 1)
    for p, col in zip(MATS, ("tab:orange", "tab:cyan")):
        ax.plot(t, r["theta"]["wd"][p], color=col, lw=2, label=f"MuonWD {p}")
        ax.plot(t, r["theta"]["muonh_aligned"][p], color=col, ls=":", lw=1.5, label=f"MuonH aligned {p}")
        ax.plot(t, r["theta"]["muonh"][p], color=col, ls="--", lw=1, label=f"MuonH {p}")
        ax.plot(t, r["theta"]["wd_aligned"][p], color=col, ls="-.", lw=1, label=f"MuonWD aligned {p}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("angle turned per step θ_t (radians)", fontsize=10)
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
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.02, help="Muon lr")
    ap.add_argument("--wd", type=float, default=0.2, help="MuonWD's decoupled weight decay")
    ap.add_argument("--muonh-lr", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-norm", action="store_true", help="plain MLP (no RMSNorm): the claim's assumption fails")
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    NORMED[0] = not a.no_norm
    os.makedirs(a.out, exist_ok=True)
    r = run(a.steps, a.lr, a.wd, a.muonh_lr, hidden=a.hidden, seed=a.seed)
    print(f"test loss after {a.steps} steps: MuonWD {r['loss_wd'][-1]:.4f}, eta_eff-matched Muon "
          f"{r['loss_matched'][-1]:.4f}, Muon no WD {r['loss_nowd'][-1]:.4f}, MuonH aligned to MuonWD "
          f"{r['loss_muonh_aligned'][-1]:.4f}")
    print(f"mean |log(test loss / MuonWD's)| over the run: matched {r['gap_matched']:.4f}, unmatched "
          f"{r['gap_nowd']:.4f}, MuonH aligned {r['gap_muonh_aligned']:.4f}")
    print(f"MuonH {r['loss_muonh'][-1]:.4f}, MuonWD aligned to it {r['loss_wd_aligned'][-1]:.4f}; mean log gap "
          f"{r['gap_wd_aligned']:.4f} (unaligned MuonWD vs MuonH {r['gap_wd_vs_muonh']:.4f})")
    for p in MATS:
        print(f"{p}: ||W_T||_F MuonWD {r['norm']['wd'][p]['norm'][-1]:.2f}, matched "
              f"{r['norm']['matched'][p]['norm'][-1]:.2f}, no WD {r['norm']['nowd'][p]['norm'][-1]:.2f}, "
              f"MuonH {r['norm']['muonh'][p]['norm'][-1]:.2f}")
    path = os.path.join(a.out, "t05_weight_decay_sets_lr.png")
    plot(r, path)
    print(f"wrote {path}")
    return r


# %%
if __name__ == "__main__":
    main()

# %% [markdown]
# # Tutorial 7 — independent weight decay (post 001)
#
# **Claim** (post 001, "Weight decay that transfers", arXiv:2405.13698). Read as an EMA, weight decay
# forgets the past with the rate α = λγ_t per step, i.e. over τ_iter = 1/(λγ_t) steps. PyTorch's AdamW
# multiplies the decay by the peak lr (θ ← θ − η γ_t λ θ), so its time scale τ_iter = 1/(ηγ_tλ) *moves*
# whenever η is changed (by an lr sweep, or by muP's per-layer rates); the "independent" form
# θ ← θ − ηγ_t u − λγ_t θ (`refopt.AdamW(wd_mode='independent')`) keeps τ_iter = 1/(λγ_t) put. Across data
# sizes, keep τ_epoch = τ_iter/M fixed (M steps per epoch), i.e. λ = 1/(τ_epoch M).
#
# How it is measured: every run carries a **probe**, an extra parameter that the loss does not use (its
# gradient is exactly 0, so Adam's direction for it is 0 and only the decay acts on it): its norm after t
# steps is Π(1 − rate_s), and τ_iter is read off as the step where it has fallen by 1/e. Beside it, the
# training and test loss of the MLP 64-64-10 on the 8x8 digits (float64, batch 32).
#
# 1. An lr sweep (7 values) with torch-style decoupled decay (λ = 0.1) and with independent decay
#    (λ = 3e-3): τ_iter of the probe and the final test loss.
# 2. Three training-set sizes (360, 720, 1437 digits) for 20 epochs with independent decay: λ fixed vs
#    λ = 1/(τ_epoch·M) with τ_epoch = 10 epochs: the probe's decay against *epochs*.
#
# Run: `python tutorials/t07_independent_weight_decay.py --out DIR` (about 20 s).

# %%
"""Tutorial 7 -- independent weight decay: the decay time scale under an lr sweep and across data sizes (post 001)."""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

try:  # run as `python tutorials/t07_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import mlp
from refopt.models.data import load_digits

# %% [markdown]
# ## Training with a probe

# %%


def loss_with_probe(params, x, y):
    """The MLP's loss; params["probe"] is carried along but unused (its gradient is 0)."""
    return mlp.loss({"layers": params["layers"]}, x, y)


def train(rule, x_train, y_train, data, steps: int, batch_size: int = 32, hidden: int = 64, seed: int = 0):
    """Returns probe norm ratios ||p_t||/||p_0|| (t = 0..steps), the final test loss and the final train loss."""
    rng = np.random.default_rng(seed)
    params = mlp.init(seed, [64, hidden, 10], dtype=np.float64)
    params["probe"] = np.ones(16)
    vg = refopt.value_and_grad(loss_with_probe)
    state = refopt.init(rule, params)
    n = len(y_train)
    ratio = [1.0]
    perm = np.empty(0, dtype=np.int64)
    for _ in range(steps):
        if len(perm) < batch_size:
            perm = rng.permutation(n)
        idx, perm = perm[:batch_size], perm[batch_size:]
        _, g = vg(params, x_train[idx], y_train[idx])
        params, state = refopt.update(rule, state, params, g)
        ratio.append(float(np.linalg.norm(params["probe"]) / 4.0))
    test = float(mlp.loss({"layers": params["layers"]}, data.x_test, data.y_test))
    return np.array(ratio), test


def tau_iter(ratio) -> float:
    """The e-folding time of the probe in steps, t / (-log(||p_t||/||p_0||)) at the last step t (exact for a
    constant decay rate, the mean time scale otherwise); inf when it did not decay."""
    t, decay = len(ratio) - 1, -math.log(ratio[-1])
    return t / decay if decay > 0 else math.inf


# %% [markdown]
# ## 1. The lr sweep

# %%


def lr_sweep(lrs=tuple(10.0 ** np.arange(-3.5, -0.49, 0.5)), steps: int = 400, wd_torch: float = 0.1,
             wd_indep: float = 3e-3, seed: int = 0, data=None) -> dict:
    data = data if data is not None else load_digits(dtype=np.float64)
    out = {"lrs": np.array(lrs), "steps": steps, "wd_torch": wd_torch, "wd_indep": wd_indep}
    for mode, wd in (("decoupled", wd_torch), ("independent", wd_indep)):
        taus, tests = [], []
        for lr in lrs:
            ratio, test = train(refopt.AdamW(lr=lr, weight_decay=wd, wd_mode=mode), data.x_train, data.y_train,
                                data, steps, seed=seed)
            taus.append(tau_iter(ratio))
            tests.append(test)
        out[f"tau_{mode}"], out[f"test_{mode}"] = np.array(taus), np.array(tests)
    out["tau_decoupled_theory"] = 1.0 / (out["lrs"] * wd_torch)
    out["tau_independent_theory"] = np.full(len(lrs), 1.0 / wd_indep)
    return out


# %% [markdown]
# ## 2. The tau_epoch rule across data sizes

# %%


def data_sizes(sizes=(360, 720, 1437), epochs: int = 20, tau_epoch: float = 10.0, lr: float = 3e-3,
               batch_size: int = 32, seed: int = 0, data=None) -> dict:
    data = data if data is not None else load_digits(dtype=np.float64)
    lam_fixed = 1.0 / (tau_epoch * (sizes[-1] / batch_size))       # right for the largest set only
    out = {"sizes": sizes, "epochs": epochs, "tau_epoch": tau_epoch, "lam_fixed": lam_fixed}
    for n in sizes:
        m = n / batch_size
        steps = int(round(epochs * m))
        for tag, lam in (("tau_epoch", 1.0 / (tau_epoch * m)), ("fixed", lam_fixed)):
            ratio, test = train(refopt.AdamW(lr=lr, weight_decay=lam, wd_mode="independent"),
                                data.x_train[:n], data.y_train[:n], data, steps, batch_size, seed=seed)
            out[(tag, n)] = dict(epoch=np.arange(steps + 1) / m, ratio=ratio, test=test,
                                 tau_epoch=tau_iter(ratio) / m)
    return out


# %% [markdown]
# ## Figure and printout

# %%


def plot(sw: dict, ds: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axs[0]
    ax.plot(sw["lrs"], sw["tau_decoupled"], "o-", color="tab:red", label=f"torch AdamW, λ={sw['wd_torch']:g}")
    ax.plot(sw["lrs"], sw["tau_decoupled_theory"], ":", color="tab:red", label="1/(ηλ)")
    ax.plot(sw["lrs"], sw["tau_independent"], "s-", color="tab:blue", label=f"independent, λ={sw['wd_indep']:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak lr η")
    ax.set_ylabel("τ_iter (steps), measured on the probe")
    ax.set_title("the decay's time scale under an lr sweep", fontsize=10)
    ax = axs[1]
    ax.plot(sw["lrs"], sw["test_decoupled"], "o-", color="tab:red", label="torch AdamW")
    ax.plot(sw["lrs"], sw["test_independent"], "s-", color="tab:blue", label="independent")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak lr η")
    ax.set_ylabel(f"test loss after {sw['steps']} steps")
    ax.set_title("the lr sweep", fontsize=10)
    ax = axs[2]
    for i, n in enumerate(ds["sizes"]):
        a, b = ds[("tau_epoch", n)], ds[("fixed", n)]
        ax.plot(a["epoch"], a["ratio"], color=f"C{i}", lw=2, label=f"N={n}: λ = 1/(τ_epoch M)")
        ax.plot(b["epoch"], b["ratio"], color=f"C{i}", ls=":", lw=1.5, label=f"N={n}: λ fixed")
    ax.plot(a["epoch"], np.exp(-a["epoch"] / ds["tau_epoch"]), "k--", lw=1, label="e^{-epoch/τ_epoch}")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("probe ||p_t|| / ||p_0||")
    ax.set_title(f"fixed τ_epoch = {ds['tau_epoch']:g} across data sizes", fontsize=10)
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
    ap.add_argument("--steps", type=int, default=400, help="steps of each run of the lr sweep")
    ap.add_argument("--epochs", type=int, default=20, help="epochs of the data-size runs")
    ap.add_argument("--seed", type=int, default=0)
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    data = load_digits(dtype=np.float64)
    sw = lr_sweep(steps=a.steps, seed=a.seed, data=data)
    ds = data_sizes(epochs=a.epochs, seed=a.seed, data=data)
    print(f"lr sweep ({a.steps} steps): tau_iter measured on the probe (steps)")
    for i, lr in enumerate(sw["lrs"]):
        print(f"  lr {lr:.1e}: torch AdamW {sw['tau_decoupled'][i]:9.1f} (1/(eta lambda) = "
              f"{sw['tau_decoupled_theory'][i]:9.1f}), independent {sw['tau_independent'][i]:7.1f} (1/lambda = "
              f"{1 / sw['wd_indep']:.1f});  test loss {sw['test_decoupled'][i]:.3f} / {sw['test_independent'][i]:.3f}")
    print(f"data sizes, tau_epoch measured (epochs), target {ds['tau_epoch']:g}:")
    for n in ds["sizes"]:
        print(f"  N={n}: lambda = 1/(tau_epoch M): {ds[('tau_epoch', n)]['tau_epoch']:.2f} (test "
              f"{ds[('tau_epoch', n)]['test']:.3f});  lambda fixed {ds['lam_fixed']:.2e}: "
              f"{ds[('fixed', n)]['tau_epoch']:.2f} (test {ds[('fixed', n)]['test']:.3f})")
    path = os.path.join(a.out, "t07_independent_weight_decay.png")
    plot(sw, ds, path)
    print(f"wrote {path}")
    return {"sweep": sw, "sizes": ds}


# %%
if __name__ == "__main__":
    main()

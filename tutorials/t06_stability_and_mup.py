# %% [markdown]
# # Tutorial 6 — stability metrics of linear layers, and muP (posts 003 and 001)
#
# **Claims.**
# 1. (post 003) For f(x; W) = xW with an input norm (‖x‖_RMS = 1), W ∈ R^{d_in×d_out}, the three stability
#    metrics are forward = sqrt(d_in/d_out)‖W‖₂, dependency = 2·sqrt(d_in/d_out)‖W‖₂ and
#    update = sqrt(d_in/d_out)‖ΔW‖₂ (`refopt.diagnostics.linear_stability`); measured over inputs
#    (`empirical_stability`) they are attained by the top singular direction, and random inputs see far less.
# 2. (post 003) σ = sqrt(d_out/d_in)/(sqrt(d_in) + sqrt(d_out)) (`refopt.mup.mup_sigma`) gives every matrix
#    an RMS→RMS norm ≈ 1 at any shape.
# 3. (post 001, muP) With the per-layer-type learning rates of post 001 (`refopt.mup.mup_partition`: Adam
#    first lr, hidden lr/m, last lr/m, m = n/n₀) and that init, the change of every layer's activations after
#    k steps is Θ(1) in the width n (a flat *coordinate check*, `refopt.diagnostics.coordinate_check`); with
#    the standard init and one Adam lr it grows with n. Muon with the spectral scale sqrt(d_out/d_in) (seed
#    003's steepest descent under the RMS→RMS norm) is flat as well, with no per-layer lr.
# 4. Hence the best learning rate transfers across widths under muP and drifts under the standard
#    parametrization (an lr sweep at three widths).
#
# Setting: an MLP 64-n-n-10 on the 8x8 digits (float64), batch 64.
#
# Run: `python tutorials/t06_stability_and_mup.py --out DIR` (about 1 min on 2 idle cores). Writes DIR/t06_stability_and_mup.png.

# %%
"""Tutorial 6 -- stability metrics of linear layers, the coordinate check and lr transfer (posts 003, 001)."""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

try:  # run as `python tutorials/t06_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import mlp
from refopt.models.data import load_digits
from refopt import diagnostics as D
from refopt import mup

# %% [markdown]
# ## 1-2. A linear layer: closed forms against measurements

# %%


def linear_layer_table(shapes=((256, 64), (64, 256), (512, 512)), seed: int = 0) -> list[dict]:
    """For W = mup_sigma * N(0, 1) and a small dW: closed forms, maxima over the worst-case inputs (the top
    left singular vectors of W and dW, scaled to RMS 1, and -x) and over 256 random RMS-1 inputs."""
    rng = np.random.default_rng(seed)
    rows = []
    for d_in, d_out in shapes:
        W = mup.mup_sigma(d_in, d_out) * rng.standard_normal((d_in, d_out))
        dW = 1e-2 * mup.mup_sigma(d_in, d_out) * rng.standard_normal((d_in, d_out))
        closed = D.linear_stability(W, dW)
        u = np.linalg.svd(W)[0][:, 0]
        ud = np.linalg.svd(dW)[0][:, 0]
        worst = math.sqrt(d_in) * np.stack([u, -u, ud])
        xr = rng.standard_normal((256, d_in))
        xr *= math.sqrt(d_in) / np.linalg.norm(xr, axis=1, keepdims=True)
        lin = lambda p, x: x @ p  # noqa: E731
        rows.append(dict(shape=(d_in, d_out), closed=closed, worst=D.empirical_stability(lin, W, worst, dW),
                         random=D.empirical_stability(lin, W, xr, dW), rms_op=D.rms_operator_norm(W)))
    return rows


# %% [markdown]
# ## 3. The coordinate check
# Three parametrizations of the MLP 64-n-n-10, trained k steps on the same batches at each width:
# *standard* (He init, Adam with one lr), *muP* (seed-003 init, `mup_partition` Adam lrs with base width
# n₀ = 64) and *Muon* (seed-003 init, Muon with scale='spectral' on the three matrices, Adam on the biases).

# %%
BASE = 64


def init_params(kind: str, n: int, seed: int = 0):
    if kind == "standard":
        return mlp.init(seed, [64, n, n, 10], dtype=np.float64)
    rng = np.random.default_rng(seed)
    sizes = [64, n, n, 10]
    return {"layers": [{"w": mup.mup_sigma(a, b) * rng.standard_normal((a, b)), "b": np.zeros(b)}
                       for a, b in zip(sizes[:-1], sizes[1:])]}


def make_rule(kind: str, n: int, lr: float, params):
    if kind == "standard":
        return refopt.Adam(lr=lr)
    if kind == "mup":
        return mup.mup_partition(params, lr, n, BASE, "adam")
    return refopt.Partition(rules={"hidden": refopt.Muon(lr=lr * 10, scale="spectral"), "other": refopt.Adam(lr=lr)},
                            labels=refopt.matrix_labels)


def features(params, x):
    """Pre-activations of the two hidden layers and the logits."""
    out, h = {}, x
    for i, layer in enumerate(params["layers"]):
        z = h @ layer["w"] + layer["b"]
        out[f"z{i + 1}" if i < 2 else "logits"] = z
        h = np.maximum(z, 0.0)
    return out


def coordinate_checks(widths=(64, 128, 256, 512, 1024), k: int = 5, lr: float = 1e-2, seed: int = 0,
                      data=None) -> dict:
    data = data if data is not None else load_digits(dtype=np.float64)
    rng = np.random.default_rng(seed)
    batches = [(data.x_train[i], data.y_train[i]) for i in (rng.choice(len(data.y_train), 64, replace=False)
                                                            for _ in range(k))]
    probe = data.x_test[:128]
    out = {}
    for kind in ("standard", "mup", "muon"):
        cache = {}

        def init(n, kind=kind):
            cache[n] = init_params(kind, n, seed)
            return cache[n]

        out[kind] = D.coordinate_check(widths, init, lambda n, kind=kind: make_rule(kind, n, lr, cache[n]),
                                       mlp.loss, features, batches, probe)
    return out


def slope(widths, values) -> float:
    """Least-squares slope of log(value) against log(width)."""
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])


# %% [markdown]
# ## 4. Learning-rate transfer

# %%


def lr_sweep(widths=(64, 128, 512), lrs=tuple(10.0 ** np.arange(-3.5, -0.49, 0.5)), steps: int = 100,
             seed: int = 0, data=None) -> dict:
    """Final training loss (mean of the last 10 batch losses) of 'standard' and 'mup' for every (width, lr)."""
    data = data if data is not None else load_digits(dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    idx = [rng.choice(len(data.y_train), 64, replace=False) for _ in range(steps)]
    vg = refopt.value_and_grad(mlp.loss)
    out = {}
    for kind in ("standard", "mup"):
        table = np.full((len(widths), len(lrs)), np.nan)
        for i, n in enumerate(widths):
            for j, lr in enumerate(lrs):
                params = init_params(kind, n, seed)
                rule = make_rule(kind, n, lr, params)
                state = refopt.init(rule, params)
                losses = []
                with np.errstate(over="ignore", invalid="ignore"):
                    for b in idx:
                        loss, g = vg(params, data.x_train[b], data.y_train[b])
                        if not np.isfinite(float(loss)):
                            losses = [np.inf]
                            break
                        losses.append(float(loss))
                        try:
                            params, state = refopt.update(rule, state, params, g)
                        except FloatingPointError:
                            losses = [np.inf]
                            break
                table[i, j] = min(float(np.mean(losses[-10:])), 10.0)
        out[kind] = table
    out["widths"], out["lrs"] = np.array(widths), np.array(lrs)
    out["best_lr"] = {k: out["lrs"][np.argmin(out[k], axis=1)] for k in ("standard", "mup")}
    return out


# %% [markdown]
# ## Figure and printout

# %%


def plot(table, cc, sweep, widths, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 4, figsize=(17, 4.2))
    ax = axs[0]
    lab = [f"{r['shape'][0]}x{r['shape'][1]}" for r in table]
    xs = np.arange(len(table))
    for off, key, col in ((-0.25, "closed", "k"), (0.0, "worst", "tab:green"), (0.25, "random", "tab:red")):
        ax.bar(xs + off, [getattr(r[key], "forward") for r in table], 0.25, color=col, label=f"forward: {key}")
    ax.set_xticks(xs, lab)
    ax.set_title("post 003: forward metric of x·W (RMS-1 inputs)", fontsize=9)
    ax.legend(fontsize=7)
    for ax, kind, title in ((axs[1], "standard", "standard init + Adam"), (axs[2], "mup", "muP init + muP Adam lrs")):
        for layer, col in (("z1", "tab:blue"), ("z2", "tab:orange"), ("logits", "tab:green")):
            ax.plot(widths, [cc[kind][n][f"dact[{layer}]"] for n in widths], "o-", color=col, label=f"Δ{layer}")
            if kind == "mup":
                ax.plot(widths, [cc["muon"][n][f"dact[{layer}]"] for n in widths], "x:", color=col,
                        label=f"Δ{layer} (Muon, spectral)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width n")
        ax.set_title(f"coordinate check: {title}", fontsize=9)
        ax.legend(fontsize=7)
    ax = axs[3]
    for kind, ls in (("standard", "-"), ("mup", "--")):
        for i, n in enumerate(sweep["widths"]):
            ax.plot(sweep["lrs"], sweep[kind][i], ls, marker="o", ms=3, color=f"C{i}", label=f"{kind} n={n}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Adam lr (base)")
    ax.set_title("lr transfer: training loss after the sweep", fontsize=9)
    ax.legend(fontsize=7)
    for ax in axs:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--sweep-widths", type=int, nargs="+", default=[64, 128, 512])
    ap.add_argument("--sweep-steps", type=int, default=100)
    ap.add_argument("--k", type=int, default=5, help="steps of the coordinate check")
    ap.add_argument("--seed", type=int, default=0)
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    data = load_digits(dtype=np.float64)
    table = linear_layer_table(seed=a.seed)
    print("linear layer x W, RMS-1 inputs: forward / dependency / update")
    for r in table:
        c, w, rd = r["closed"], r["worst"], r["random"]
        print(f"  {r['shape']}: closed {c.forward:.4f} / {c.dependency:.4f} / {c.update:.2e};  worst-case inputs "
              f"{w.forward:.4f} / {w.dependency:.4f} / {w.update:.2e};  random inputs {rd.forward:.4f} / "
              f"{rd.dependency:.4f} / {rd.update:.2e};  ||W||_RMS->RMS with mup_sigma {r['rms_op']:.3f}")
    cc = coordinate_checks(tuple(a.widths), a.k, seed=a.seed, data=data)
    print(f"coordinate check after {a.k} steps, slope of log ||Δh||_RMS against log n:")
    for kind in cc:
        print(f"  {kind:<8} " + ", ".join(f"{layer} {slope(a.widths, [cc[kind][n][f'dact[{layer}]'] for n in a.widths]):+.2f}"
                                         for layer in ("z1", "z2", "logits")))
    sweep = lr_sweep(tuple(a.sweep_widths), steps=a.sweep_steps, seed=a.seed, data=data)
    for kind in ("standard", "mup"):
        print(f"  best lr, {kind:<8}: " + ", ".join(f"n={n}: {lr:.1e}" for n, lr in zip(a.sweep_widths,
                                                                                      sweep["best_lr"][kind])))
    path = os.path.join(a.out, "t06_stability_and_mup.png")
    plot(table, cc, sweep, a.widths, path)
    print(f"wrote {path}")
    return {"table": table, "cc": cc, "sweep": sweep}


# %%
if __name__ == "__main__":
    main()

# %% [markdown]
# # Tutorial 6 — stability metrics of linear layers, and muP
#
# **Claims.**
# 1. (post 003, the three stability metrics) For a linear layer $f(x; W) = xW$ with an input norm
#    ($\|x\|_{RMS} = 1$), $W \in \mathbb{R}^{d_{in}\times d_{out}}$: forward $= \sqrt{d_{in}/d_{out}}\,\|W\|_2$,
#    dependency $= 2\sqrt{d_{in}/d_{out}}\,\|W\|_2$, update $= \sqrt{d_{in}/d_{out}}\,\|\Delta W\|_2$
#    (`refopt.diagnostics.linear_stability`). They are suprema over inputs: the top singular direction of $W$
#    attains them, random inputs see far less.
# 2. (post 003, the init) $\sigma = \sqrt{d_{out}/d_{in}}/(\sqrt{d_{in}} + \sqrt{d_{out}})$
#    (`refopt.mup.mup_sigma`) gives every matrix an RMS→RMS norm $\approx 1$ at any shape.
# 3. (post 001, muP) With the per-layer-type learning rates of post 001 (`refopt.mup.mup_partition`: Adam
#    first layer $\eta$, hidden $\eta/m$, last $\eta/m$, $m = n/n_0$) and that init, the change of every
#    layer's activations after $k$ steps is $\Theta(1)$ in the width $n$ (a flat *coordinate check*,
#    `refopt.diagnostics.coordinate_check`); with the standard init and one Adam lr it grows with $n$. Muon with
#    the spectral scale $\sqrt{d_{out}/d_{in}}$ (post 003's steepest descent under the RMS→RMS norm) is flat
#    as well, with no per-layer lr.
# 4. Hence the best learning rate transfers across widths under muP and drifts under the standard
#    parametrization (an lr sweep at several widths).
#
# **What this notebook shows.** The closed forms against measured maxima; the RMS→RMS norm at init for
# several shapes; the coordinate check of three parametrizations; an lr sweep at four widths. Where the
# measurement limits the claim it is said (section 4).
#
# **Setting.** `refopt.models.mlp` 64-$n$-$n$-10 on the 8x8 digits, float64, batch 64; base width
# $n_0 = 64$.
#
# **Run time.** About 75 s on the shared 2-core machine (load average about 6), as a script or a notebook. As a script: `python tutorials/t06_stability_and_mup.py --out DIR` writes
# `DIR/t06_stability_and_mup.png` and `.json`.

# %%
import argparse
import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

import refopt
from refopt import diagnostics as D
from refopt import mup
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out
from refopt.models import mlp
from refopt.models.data import load_digits
from threadpoolctl import threadpool_limits

ap = argparse.ArgumentParser(description="Tutorial 6: stability metrics of linear layers, the muP coordinate "
                                         "check and lr transfer (posts 003, 001)")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512], help="widths of the coordinate check")
ap.add_argument("--k", type=int, default=5, help="steps of the coordinate check")
ap.add_argument("--sweep-widths", type=int, nargs="+", default=[32, 64, 128, 256], help="widths of the lr sweep")
ap.add_argument("--sweep-steps", type=int, default=100, help="steps of each run of the lr sweep")
ap.add_argument("--seed", type=int, default=0, help="random seed of the matrices, the init and the batches")
args = parse_script_args(ap)
if args.k < 1 or args.sweep_steps < 10 or len(args.widths) < 2:
    ap.error("--k >= 1, --sweep-steps >= 10 and at least two --widths are needed")
data = load_digits(dtype=np.float64)
BASE = 64           # the base width n_0 of muP
# one BLAS thread: the matrices here are small, and on a busy 2-core machine a second OpenBLAS thread made
# this notebook's small matmuls about 10x slower (measured)
threadpool_limits(1)

# %% [markdown]
# ## 1. A linear layer: closed forms against measurements
#
# For $W = \sigma\,N(0, 1)$ with $\sigma$ = `mup_sigma` and a small $\Delta W$: the closed forms, the maxima
# over the worst-case inputs (the top left singular vectors of $W$ and $\Delta W$ scaled to RMS 1, and their
# negatives) and the maxima over 256 random RMS-1 inputs. Worst-case should equal the closed form to
# rounding; random inputs stay well below.

# %%
SHAPES = ((256, 64), (64, 256), (256, 256))
rng = np.random.default_rng(args.seed)
table = []
for d_in, d_out in SHAPES:
    W = mup.mup_sigma(d_in, d_out) * rng.standard_normal((d_in, d_out))
    dW = 1e-2 * mup.mup_sigma(d_in, d_out) * rng.standard_normal((d_in, d_out))
    u = np.linalg.svd(W, full_matrices=False)[0][:, 0]
    ud = np.linalg.svd(dW, full_matrices=False)[0][:, 0]
    worst_x = math.sqrt(d_in) * np.stack([u, -u, ud])
    random_x = rng.standard_normal((256, d_in))
    random_x *= math.sqrt(d_in) / np.linalg.norm(random_x, axis=1, keepdims=True)
    lin = lambda p, x: x @ p  # noqa: E731
    row = {"shape": (d_in, d_out), "closed": D.linear_stability(W, dW)._asdict(),
           "worst": D.empirical_stability(lin, W, worst_x, dW)._asdict(),
           "random": D.empirical_stability(lin, W, random_x, dW)._asdict()}
    table.append(row)
    print(f"{d_in}x{d_out}: " + "; ".join(f"{m} closed {row['closed'][m]:.4g}, worst-case {row['worst'][m]:.4g}, "
                                          f"random {row['random'][m]:.3g}" for m in ("forward", "dependency", "update")))

# %% [markdown]
# ## 2. The init: RMS→RMS norm at several shapes
#
# $\|W\|_{RMS\to RMS} = \sqrt{d_{in}/d_{out}}\,\|W\|_2$ of a fresh $W$, with post 003's $\sigma$ and with the
# standard He init $\sigma = \sqrt{2/d_{in}}$ (which keeps the RMS of *random* inputs, not the worst case).
# Expect about 1 at every shape for post 003's $\sigma$, a shape-dependent value for He.

# %%
INIT_SHAPES = ((64, 10), (64, 256), (256, 64), (256, 256), (512, 64), (64, 512), (512, 512))
rms_op = {"mup_sigma": [], "He": []}
for d_in, d_out in INIT_SHAPES:
    Z = rng.standard_normal((d_in, d_out))
    rms_op["mup_sigma"].append(D.rms_operator_norm(mup.mup_sigma(d_in, d_out) * Z))
    rms_op["He"].append(D.rms_operator_norm(math.sqrt(2.0 / d_in) * Z))
    print(f"{d_in:4d}x{d_out:<4d} ||W||_RMS->RMS: mup_sigma {rms_op['mup_sigma'][-1]:.3f}, He {rms_op['He'][-1]:.3f}")

# %% [markdown]
# ## 3. The coordinate check
#
# Three parametrizations of the MLP 64-$n$-$n$-10, trained $k$ = 5 steps (Adam lr $10^{-2}$) on the same
# batches at each width: *standard* (He init, Adam with one lr), *muP* (post 003's init, `mup_partition`'s
# Adam lrs with $n_0 = 64$) and *Muon* (post 003's init, Muon with `scale="spectral"` on the three matrices,
# Adam on the biases). Measured: $\Delta h = \|h_k - h_0\|_{RMS}$ of the pre-activations $z_1$, $z_2$ and of
# the logits on 128 test digits. The printed slope of $\log\Delta h$ against $\log n$ should be about 0 for
# muP and Muon, clearly positive for the standard parametrization.

# %%
def init_params(kind, n, seed=args.seed):
    if kind == "standard":
        return mlp.init(seed, [64, n, n, 10], dtype=np.float64)
    r = np.random.default_rng(seed)
    sizes = [64, n, n, 10]
    return {"layers": [{"w": mup.mup_sigma(a, b) * r.standard_normal((a, b)), "b": np.zeros(b)}
                       for a, b in zip(sizes[:-1], sizes[1:])]}


def make_rule(kind, n, lr, params):
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


def slope(widths, values):
    """Least-squares slope of log(value) against log(width)."""
    return float(np.polyfit(np.log(widths), np.log(values), 1)[0])


KINDS, LAYERS = ("standard", "mup", "muon"), ("z1", "z2", "logits")
brng = np.random.default_rng(args.seed)
batches = [(data.x_train[i], data.y_train[i])
           for i in (brng.choice(len(data.y_train), 64, replace=False) for _ in range(args.k))]
probe = data.x_test[:128]
dact, slopes = {}, {}
for kind in KINDS:
    cache = {}

    def init(n, kind=kind):
        cache[n] = init_params(kind, n)
        return cache[n]

    cc = D.coordinate_check(args.widths, init, lambda n, kind=kind: make_rule(kind, n, 1e-2, cache[n]),
                            mlp.loss, features, batches, probe)
    dact[kind] = {layer: [cc[n][f"dact[{layer}]"] for n in args.widths] for layer in LAYERS}
    slopes[kind] = {layer: slope(args.widths, dact[kind][layer]) for layer in LAYERS}
    print(f"{kind:<8} slope of log(Delta h) against log(n): "
          + ", ".join(f"{layer} {slopes[kind][layer]:+.2f}" for layer in LAYERS))

# %% [markdown]
# ## 4. Learning-rate transfer
#
# The standard and the muP parametrization trained 100 steps at each width over a grid of base lrs
# (quarter decades from $10^{-2.5}$ to $10^{-1.25}$, around the optima); the score is the mean of the last 10 batch losses (10 for a diverged run). The printed
# best lr should drift with the width under the standard parametrization and stay within about one grid step
# under muP. This is about *where* the optimum sits, not how good it is: after 100 steps muP's best losses
# are higher than the standard parametrization's at every width here (about 0.09-0.13 against 0.03-0.09;
# its last layer starts near zero), see panels (c) and (d).

# %%
lrs = 10.0 ** np.arange(-2.5, -1.24, 0.25)
srng = np.random.default_rng(args.seed + 1)
sweep_idx = [srng.choice(len(data.y_train), 64, replace=False) for _ in range(args.sweep_steps)]
vg = refopt.value_and_grad(mlp.loss)
sweep = {}
for kind in ("standard", "mup"):
    score = np.full((len(args.sweep_widths), len(lrs)), np.nan)
    for i, n in enumerate(args.sweep_widths):
        for j, lr in enumerate(lrs):
            params = init_params(kind, n)
            rule = make_rule(kind, n, lr, params)
            state = refopt.init(rule, params)
            losses = []
            with np.errstate(over="ignore", invalid="ignore"):
                for b in sweep_idx:
                    loss, g = vg(params, data.x_train[b], data.y_train[b])
                    if not np.isfinite(float(loss)):
                        losses = [np.inf]
                        break
                    losses.append(float(loss))
                    try:
                        params, state = refopt.update(rule, state, params, g)
                    except FloatingPointError:      # refopt refuses a non-finite gradient: diverged
                        losses = [np.inf]
                        break
            score[i, j] = min(float(np.mean(losses[-10:])), 10.0)
    sweep[kind] = score
best_lr = {kind: lrs[np.argmin(sweep[kind], axis=1)] for kind in sweep}
for kind in sweep:
    print(f"best lr, {kind:<8}: " + ", ".join(f"n = {n}: {lr:.2g}" for n, lr in zip(args.sweep_widths, best_lr[kind])))

# %% [markdown]
# ## 5. The figure
#
# Top row: (a) the three metrics measured over worst-case and random inputs, divided by the closed form
# (1 = attained); (b) the RMS→RMS norm at init for post 003's $\sigma$ and for He; (c, d) the lr sweep, the
# best lr of each width starred. Bottom row: the coordinate check, $\Delta h$ divided by its value at the
# smallest width (flat = $\Theta(1)$ in $n$), for (e) standard, (f) muP, (g) Muon; (h) the fitted slopes.

# %%
fig, axs = plt.subplots(2, 4, figsize=(21, 10))
ax = axs[0, 0]
pos = np.arange(len(SHAPES) * 3)
names = [f"{m}\n{a}x{b}" for (a, b) in SHAPES for m in ("fwd", "dep", "upd")]
for key, marker, col in (("worst", "o", "tab:green"), ("random", "s", "tab:red")):
    vals = [row[key][m] / row["closed"][m] for row in table for m in ("forward", "dependency", "update")]
    ax.plot(pos, vals, marker, ms=8, color=col, ls="none",
            label={"worst": "max over the top singular directions (and $-x$)",
                   "random": "max over 256 random inputs"}[key])
ax.axhline(1.0, color="k", lw=0.8, ls="--")
ax.set_xticks(pos, names, fontsize=7)
ax.set_ylim(0, 1.15)
ax.set_ylabel("measured / closed form")
ax.set_title("(a) post 003's metrics of $xW$, $\\|x\\|_{RMS} = 1$: fwd, dep(endency), upd(ate)", fontsize=10)
ax = axs[0, 1]
ipos = np.arange(len(INIT_SHAPES))
ax.plot(ipos, rms_op["mup_sigma"], "o", ms=8, color="tab:blue",
        label=r"post 003: $\sigma = \sqrt{d_{out}/d_{in}}/(\sqrt{d_{in}}+\sqrt{d_{out}})$")
ax.plot(ipos, rms_op["He"], "s", ms=8, color="tab:gray", label=r"He: $\sigma = \sqrt{2/d_{in}}$")
ax.axhline(1.0, color="k", lw=0.8, ls="--")
ax.set_xticks(ipos, [f"{a}x{b}" for a, b in INIT_SHAPES], fontsize=7, rotation=30)
ax.set_yscale("log")
ax.set_yticks([0.7, 1, 2, 3, 5], ["0.7", "1", "2", "3", "5"])
ax.yaxis.set_minor_formatter(NullFormatter())
ax.set_ylabel(r"$\|W\|_{RMS\to RMS}$ at init")
ax.set_title(r"(b) the init: $W = \sigma N(0,1)$, shape $d_{in}\times d_{out}$", fontsize=10)
for ax, kind, title in ((axs[0, 2], "standard", "(c) lr sweep, standard: He init, one Adam lr $\\eta$"),
                        (axs[0, 3], "mup", "(d) lr sweep, muP: post 003 init, Adam lr $\\eta$ on the first\nlayer, "
                                           "$\\eta/m$ on the hidden and last, $m = n/64$")):
    for i, n in enumerate(args.sweep_widths):
        ax.plot(lrs, sweep[kind][i], "o-", ms=3, color=f"C{i}", label=f"$n$ = {n}")
        j = int(np.argmin(sweep[kind][i]))
        ax.plot(lrs[j], sweep[kind][i, j], "*", ms=16, color=f"C{i}", mec="k")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([0.003, 0.01, 0.03], ["0.003", "0.01", "0.03"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks([0.03, 0.05, 0.1, 0.2, 0.5], ["0.03", "0.05", "0.1", "0.2", "0.5"])
    ax.set_xlabel(r"base Adam lr $\eta$ (best lr of each width starred)")
    ax.set_ylabel(f"mean of the last 10 batch losses after {args.sweep_steps} steps")
    ax.set_title(title, fontsize=10)
widths = np.array(args.widths)
for ax, kind, title in ((axs[1, 0], "standard", "(e) coordinate check, standard"),
                        (axs[1, 1], "mup", "(f) coordinate check, muP"),
                        (axs[1, 2], "muon", "(g) coordinate check, Muon with the spectral scale")):
    for layer, col in zip(LAYERS, ("tab:blue", "tab:orange", "tab:green")):
        v = np.array(dact[kind][layer])
        ax.plot(widths, v / v[0], "o-", color=col, label={"z1": "$z_1$", "z2": "$z_2$", "logits": "logits"}[layer])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(0.5, 10)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("width $n$")
    ax.set_ylabel(rf"$\Delta h(n)/\Delta h({widths[0]})$, $\Delta h = \|h_k - h_0\|_{{RMS}}$, $k$ = {args.k}")
    ax.set_title(title, fontsize=10)
ax = axs[1, 3]
for i, layer in enumerate(LAYERS):
    ax.bar(np.arange(3) + (i - 1) * 0.27, [slopes[k][layer] for k in KINDS], 0.27,
           color=("tab:blue", "tab:orange", "tab:green")[i], label={"z1": "$z_1$", "z2": "$z_2$", "logits": "logits"}[layer])
ax.axhline(0.0, color="k", lw=0.8)
ax.set_xticks(np.arange(3), ["standard", "muP", "Muon"])
ax.set_ylabel(r"slope of $\log\Delta h$ against $\log n$")
ax.set_title("(h) coordinate-check slopes (0 = width-independent)", fontsize=10)
for ax in axs.flat:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False, ncol=2)
fig.tight_layout()
path = save_figure(fig, args.out, "t06_stability_and_mup")
print(f"wrote {path}")

# %% [markdown]
# ## 6. The numbers
#
# Saved as `t06_stability_and_mup.json` next to the figure; the tests check the claims on them.

# %%
results = {"table": table, "init_shapes": INIT_SHAPES, "rms_op": rms_op, "widths": args.widths, "k": args.k,
           "dact": dact, "slopes": slopes, "lrs": lrs, "sweep_widths": args.sweep_widths,
           "sweep_steps": args.sweep_steps, "sweep": sweep, "best_lr": best_lr}
save_results(args.out, "t06_stability_and_mup", results)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Which init standard deviation $\sigma$ gives a $1024\times64$ matrix (1024 inputs, 64
# outputs) an RMS→RMS norm of about 1? Set `answer1` (a closed form in $d_{in}$, $d_{out}$; do not call
# `mup_sigma`). The check draws $W = \sigma N(0, 1)$ and measures the norm.

# %%
answer1 = None  # your code: sigma for d_in = 1024, d_out = 64

# %%
if answer1 is None:
    print("Exercise 1: not answered yet")
else:
    norm1 = D.rms_operator_norm(answer1 * np.random.default_rng(1).standard_normal((1024, 64)))
    assert 0.9 < norm1 < 1.1, f"||W||_RMS->RMS = {norm1:.3f} with sigma = {answer1:g}"
    print(f"Exercise 1: correct, ||W||_RMS->RMS = {norm1:.3f}; He's sqrt(2/d_in) would give "
          f"{D.rms_operator_norm(math.sqrt(2 / 1024) * np.random.default_rng(1).standard_normal((1024, 64))):.2f}")

# %% [markdown]
# **Exercise 2.** Post 003's steepest descent under the RMS→RMS norm takes the step
# $\Delta W = -\eta\sqrt{d_{out}/d_{in}}\,\mathrm{msign}(G)$. For the gradient `G2` below ($256\times64$) and
# $\eta = 0.01$, build that step (`refopt.msign(G2, "svd")`) and set `answer2` to its update metric
# (`D.linear_stability(W2, dW).update`). What value do you expect before you run it?

# %%
G2 = np.random.default_rng(2).standard_normal((256, 64))
W2 = mup.mup_sigma(256, 64) * np.random.default_rng(3).standard_normal((256, 64))
answer2 = None  # your code: the update metric of the Muon step

# %%
if answer2 is None:
    print("Exercise 2: not answered yet")
else:
    assert abs(answer2 - 0.01) < 1e-12, f"update metric {answer2:.6g}: the step's RMS->RMS norm is eta exactly"
    print(f"Exercise 2: correct, update = {answer2:.12f} = eta: every singular value of msign(G) is 1")

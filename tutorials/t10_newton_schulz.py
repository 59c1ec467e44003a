# %% [markdown]
# # Tutorial 10 — the Newton-Schulz polynomials behind Muon's msign
#
# **Claim** (post 003, "steepest descent": the Muon step is $-\eta\sqrt{d_{out}/d_{in}}\,\mathrm{msign}(G)$;
# PITFALLS B08 for the bands). $\mathrm{msign}(G) = UV^\top$ for $G = U\Sigma V^\top$: every singular value
# becomes 1. Newton-Schulz never forms the SVD. It divides $G$ by $\|G\|_F$ (so every singular value lands in
# $(0, 1]$) and applies odd matrix polynomials $p_k(X) = aX + b(XX^\top)X + c(XX^\top)^2X$, which act on each
# singular value separately as the scalar map $x \mapsto p_k(x) = ax + bx^3 + cx^5$. After $K$ steps a
# normalised singular value $x = \sigma/\|G\|_F$ has become $p_K(\dots p_1(x))$
# (`refopt.linalg.ns_scalar_map`). So an approximate msign maps the singular values into a **band** around 1,
# not onto 1, and the band depends on the coefficients (the presets of `refopt.Muon(ns_coeffs=...)`):
#
# * **classic** $(15/8, -10/8, 3/8)$: converges to 1, but slowly for small $x$;
# * **jordan** $(3.4445, -4.7750, 2.0315)$, Keller Jordan's: pushes small singular values up fast and lands
#   in a wide band around 1;
# * **you** (five per-step rows, Y. You's) and **polar_express** (Amsel et al. 2025, eight rows with a safety
#   scaling): tighter bands.
#
# **What this notebook shows.** The four scalar maps, the band each lands in (`refopt.linalg.ns_band`), and
# the check that refopt's matrix Newton-Schulz does exactly what the scalar map says: the singular values of
# `refopt.msign(G, "newton_schulz", preset)` equal the scalar map of the normalised singular values of $G$.
#
# **Setting.** float64; a $48\times40$ matrix with prescribed singular values from 1 to $10^{-3}$.
#
# **Run time.** About 20 s on the shared 2-core machine (load average about 7; most of it is imports). As a script:
# `python tutorials/t10_newton_schulz.py --out DIR` writes `DIR/t10_newton_schulz.png` and `.json`.

# %%
import argparse

import matplotlib.pyplot as plt
import numpy as np

import refopt
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out
from refopt.linalg import ns_band, ns_scalar_map

ap = argparse.ArgumentParser(description="Tutorial 10: the Newton-Schulz polynomials on singular values")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--lo", type=float, default=1e-3, help="lower end of the band [lo, 1]")
ap.add_argument("--seed", type=int, default=0, help="random seed of the test matrix's singular vectors")
args = parse_script_args(ap)
if not 0 < args.lo < 1:
    ap.error("--lo must be in (0, 1)")
PRESETS = {"classic": 5, "jordan": 5, "you": 5, "polar_express": 8}   # preset -> its usual number of steps

# %% [markdown]
# ## 1. The scalar maps
#
# Each preset at its usual number of steps, applied to a few normalised singular values $x$. The exact msign
# would print 1 everywhere. Look at the small $x$: classic leaves $x = 0.01$ far below 1, jordan overshoots.

# %%
x_show = np.array([1e-3, 1e-2, 0.1, 0.5, 1.0])
print("x:             " + "  ".join(f"{v:7.3g}" for v in x_show))
for name, k in PRESETS.items():
    print(f"{name:<14} " + "  ".join(f"{v:7.4f}" for v in ns_scalar_map(x_show, name, k)))

# %% [markdown]
# ## 2. The bands
#
# `ns_band(lo, 1, preset, K)` is the smallest and largest value of the map over $x \in [lo, 1]$: the
# interval the singular values of the result land in when the smallest normalised singular value of $G$ is
# $lo$. Printed for $[lo, 1]$ and $[0.1, 1]$.

# %%
band = {name: ns_band(args.lo, 1.0, name, k) for name, k in PRESETS.items()}
band_01 = {name: ns_band(0.1, 1.0, name, k) for name, k in PRESETS.items()}
for name in PRESETS:
    b, b1 = band[name], band_01[name]
    print(f"{name:<14} band on [{args.lo:g}, 1]: [{b[0]:.4f}, {b[1]:.4f}]   on [0.1, 1]: [{b1[0]:.4f}, {b1[1]:.4f}]")

# %% [markdown]
# ## 3. The matrix check
#
# $G = U\,\mathrm{diag}(s)\,V^\top$ with random orthonormal $U$ ($48\times40$) and $V$ ($40\times40$) has
# singular values exactly $s$, and $\|G\|_F = \|s\|_2$. So the singular values of refopt's Newton-Schulz msign
# should be the scalar map of $s/\|s\|_2$. The printed largest difference should be at rounding level
# (about $10^{-15}$).

# %%
rng = np.random.default_rng(args.seed)
s = np.geomspace(1.0, 1e-3, 40)
U, _ = np.linalg.qr(rng.standard_normal((48, 40)))
V, _ = np.linalg.qr(rng.standard_normal((40, 40)))
G = (U * s) @ V.T
x_of_G = s / np.linalg.norm(s)                       # the normalised singular values, largest first
sv_msign, diff = {}, {}
for name, k in PRESETS.items():
    sv_msign[name] = np.linalg.svd(refopt.msign(G, "newton_schulz", name, k), compute_uv=False)
    predicted = np.sort(ns_scalar_map(x_of_G, name, k))[::-1]
    diff[name] = np.abs(np.sort(sv_msign[name])[::-1] - predicted)
    print(f"{name:<14} max |singular value of msign(G) - scalar map| = {diff[name].max():.1e}")

# %% [markdown]
# ## 4. The figure
#
# (a) Each preset's map against $x$ (log scale); the exact msign is the dashed line at 1. (b) Zoom on
# $[lo, 1]$: how far each curve swings around 1. (c) The bands as intervals, over $[lo, 1]$ (thick) and over
# $[0.1, 1]$ (thin). (d) The matrix check: the difference between the singular values of `refopt.msign` and
# the scalar map at each singular value of $G$, at rounding level for every preset (exact zeros not drawn).

# %%
xg = np.geomspace(1e-4, 1.0, 2000)
maps = {name: ns_scalar_map(xg, name, k) for name, k in PRESETS.items()}
fig, axs = plt.subplots(1, 4, figsize=(19, 5.0), gridspec_kw={"width_ratios": [1.2, 1.2, 0.55, 1]})
for i, name in enumerate(PRESETS):
    axs[0].plot(xg, maps[name], color=f"C{i}", lw=1.5, label=f"{name} ($K$ = {PRESETS[name]} steps)")
    axs[1].plot(xg, maps[name], color=f"C{i}", lw=1.3)
    axs[2].plot([i, i], band[name], color=f"C{i}", lw=7, solid_capstyle="butt")
    axs[2].plot([i, i], band[name], "_", ms=18, mew=2.5, color=f"C{i}")   # (a zero-width band shows as a tick)
    axs[2].plot([i, i], band_01[name], color="k", lw=1.5)
    nz = diff[name] > 0
    axs[3].plot(x_of_G[nz], diff[name][nz], "o", ms=4, color=f"C{i}", alpha=0.8)
for ax in axs[:2]:
    ax.axhline(1.0, color="k", lw=0.9, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(r"normalised singular value $x = \sigma/\|G\|_F$")
    ax.grid(alpha=0.3)
axs[0].set_ylabel(r"$p_K(\cdots p_1(x))$")
axs[0].set_ylim(-0.05, 1.3)
axs[0].set_title(r"(a) the scalar maps; exact msign maps every $x > 0$ to 1", fontsize=10)
axs[1].set_xlim(args.lo, 1.0)
axs[1].set_ylim(0.6, 1.25)
axs[1].set_title(f"(b) zoom on [{args.lo:g}, 1]", fontsize=10)
axs[2].axhline(1.0, color="k", lw=0.9, ls="--")
axs[2].set_xticks(range(len(PRESETS)), list(PRESETS), rotation=35, ha="right", fontsize=8)
axs[2].set_xlim(-0.6, len(PRESETS) - 0.4)
axs[2].set_ylim(0, 1.3)
axs[2].set_title(f"(c) bands: thick on [{args.lo:g}, 1],\nthin black on [0.1, 1]", fontsize=10)
axs[2].grid(alpha=0.3, axis="y")
axs[3].set_xscale("log")
axs[3].set_yscale("log")
axs[3].set_ylim(1e-17, 1e-13)
axs[3].set_xlabel(r"normalised singular value $x_i$ of $G$")
axs[3].set_ylabel(r"$|\sigma_i(\mathrm{msign}(G)) - p_K(\cdots p_1(x_i))|$")
axs[3].set_title("(d) refopt.msign(G) equals the scalar map, to rounding", fontsize=10)
axs[3].grid(alpha=0.3)
fig.legend(*axs[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9, frameon=False)
fig.tight_layout(rect=(0, 0.07, 1, 1))
path = save_figure(fig, args.out, "t10_newton_schulz")
print(f"wrote {path}")

# %% [markdown]
# ## 5. The numbers
#
# Saved as `t10_newton_schulz.json` next to the figure; the tests check the claims on them.

# %%
results = {"lo": args.lo, "steps": PRESETS, "band": band, "band_0.1": band_01,
           "check": {name: float(d.max()) for name, d in diff.items()},
           "map_at": {"x": x_show, **{name: ns_scalar_map(x_show, name, k) for name, k in PRESETS.items()}}}
save_results(args.out, "t10_newton_schulz", results)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** One step of the jordan polynomial $p(x) = ax + bx^3 + cx^5$ with
# $(a, b, c) = (3.4445, -4.7750, 2.0315)$: what does it do to the largest normalised singular value, $x = 1$?
# Set `answer1` to $p(1)$ (computed from the coefficients, not with `ns_scalar_map`). Compare with the lower
# end of jordan's band: why can jordan never settle exactly on 1?

# %%
answer1 = None  # your code: p(1) for the jordan coefficients

# %%
if answer1 is None:
    print("Exercise 1: not answered yet")
else:
    expected = float(ns_scalar_map(np.array([1.0]), "jordan", 1)[0])
    assert abs(answer1 - expected) < 1e-12, f"p(1) = {expected:.4f}, not {answer1}"
    print(f"Exercise 1: correct, p(1) = {answer1:.4f}: 1 is not a fixed point of the jordan step")

# %% [markdown]
# **Exercise 2.** The classic polynomial converges to 1 but slowly for small $x$. What is the smallest number
# of classic steps $K$ after which $x = 0.01$ has reached at least $0.99$? Set `answer2` to that $K$
# (use `ns_scalar_map(x, "classic", K)`).

# %%
answer2 = None  # your code: the smallest K

# %%
if answer2 is None:
    print("Exercise 2: not answered yet")
else:
    reached = lambda k: float(ns_scalar_map(np.array([0.01]), "classic", k)[0]) >= 0.99  # noqa: E731
    assert reached(answer2), f"after {answer2} steps x = 0.01 is still below 0.99"
    assert not reached(answer2 - 1), f"{answer2 - 1} steps are already enough"
    print(f"Exercise 2: correct, {answer2} classic steps (the preset's 5 leave x = 0.01 at "
          f"{float(ns_scalar_map(np.array([0.01]), 'classic', 5)[0]):.3f})")

# %% [markdown]
# **Exercise 3.** Compute msign exactly from the SVD of the matrix `G` above, $UV^\top$ with
# `np.linalg.svd(G, full_matrices=False)`, as `answer3`. The check compares it with
# `refopt.msign(G, "svd")` and prints how far polar_express's Newton-Schulz result is from it.

# %%
answer3 = None  # your code: U @ Vt from the SVD of G

# %%
if answer3 is None:
    print("Exercise 3: not answered yet")
else:
    exact = refopt.msign(G, "svd")
    err = np.linalg.norm(answer3 - exact) / np.linalg.norm(exact)
    assert err < 1e-12, f"relative difference {err:.1e} from refopt.msign(G, 'svd')"
    ns = refopt.msign(G, "newton_schulz", "polar_express", 8)
    print(f"Exercise 3: correct (relative difference {err:.1e}); polar_express's Newton-Schulz is "
          f"{np.linalg.norm(ns - exact) / np.linalg.norm(exact):.1e} away from it")

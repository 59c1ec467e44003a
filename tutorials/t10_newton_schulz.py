# %% [markdown]
# # Tutorial 10 — the Newton-Schulz polynomials behind Muon's msign
#
# msign(G) = UVᵀ for G = UΣVᵀ. Newton-Schulz never forms the SVD: it divides G by ‖G‖_F (so every
# singular value lands in (0, 1]) and applies odd polynomials p_k(X) = aX + b(XXᵀ)X + c(XXᵀ)²X, which act
# on each singular value separately as the scalar map x ↦ p_k(x) = ax + bx³ + cx⁵. After the last step a
# singular value x has become p_K(…p_1(x)) (`refopt.linalg.ns_scalar_map`); the exact msign would map every
# x > 0 to 1.
#
# The presets (`refopt.Muon(ns_coeffs=...)`): **classic** (15/8, −10/8, 3/8): converges to 1 but slowly for
# small x; **jordan** (3.4445, −4.7750, 2.0315, Keller Jordan's): pushes small singular values up fast and
# lands in a *band* around 1, not on 1 (5 steps, measured here: [0.682, 1.134] over x ∈ [0.1, 1] and
# [0.47, 1.20] over x ∈ [0.001, 1]; PITFALLS B08 and `ns_band`'s docstring quote [0.6818, 1.2024] for
# [0.1, 1], whose upper end is reached only below x = 0.1); **you**
# (five per-step rows, Y. You's) and **polar_express** (Amsel et al. 2025, eight rows with a safety scaling):
# tighter bands. `refopt.linalg.ns_band(lo)` gives the band over [lo, 1].
#
# The check: the singular values of refopt's Newton-Schulz msign of a matrix with prescribed singular
# values equal the scalar map of the normalised singular values.
#
# Run: `python tutorials/t10_newton_schulz.py --out DIR` (about 2 s).

# %%
"""Tutorial 10 -- the Newton-Schulz polynomials (jordan, polar_express, you, classic) on singular values."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t10_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.linalg import ns_band, ns_scalar_map

PRESETS = {"classic": 5, "jordan": 5, "you": 5, "polar_express": 8}   # preset -> its usual number of steps


# %% [markdown]
# ## A matrix with prescribed singular values
# U diag(s) Vᵀ with random orthogonal U and V: its singular values are exactly s, so the singular values
# of msign(G) can be compared with the scalar map applied to s / ‖s‖₂ (‖G‖_F = ‖s‖₂).

# %%
def matrix_with_singular_values(s, seed: int = 0) -> np.ndarray:
    """U diag(s) V^T with random orthogonal U (m x n, m = n + 8) and V (n x n)."""
    rng = np.random.default_rng(seed)
    n = len(s)
    U, _ = np.linalg.qr(rng.standard_normal((n + 8, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * s) @ V.T


# %% [markdown]
# ## The scalar maps, the bands and the check
# For each preset at its usual number of steps: the map x ↦ p_K(…p_1(x)) on a grid, the band it lands in
# over [lo, 1] and over [0.1, 1], and the largest difference between the singular values of refopt's
# msign and the map of the normalised singular values (about 1e-15 in float64).

# %%
def run(lo: float = 1e-3, seed: int = 0) -> dict:
    """The scalar maps on a grid, the bands over [lo, 1] and [0.1, 1], and the matrix check per preset."""
    x = np.geomspace(1e-4, 1.0, 2000)
    s = np.geomspace(1.0, 1e-3, 40)
    G = matrix_with_singular_values(s, seed)
    out = {"x": x, "lo": lo, "maps": {}, "band": {}, "band_0.1": {}, "check": {}}
    for name, k in PRESETS.items():
        out["maps"][name] = ns_scalar_map(x, name, k)
        out["band"][name] = ns_band(lo, 1.0, name, k)
        out["band_0.1"][name] = ns_band(0.1, 1.0, name, k)
        sv = np.linalg.svd(refopt.msign(G, "newton_schulz", name, k), compute_uv=False)
        predicted = np.sort(ns_scalar_map(s / np.linalg.norm(s), name, k))[::-1]
        out["check"][name] = float(np.max(np.abs(np.sort(sv)[::-1] - predicted)))
    return out


# %% [markdown]
# ## The figure
# Left: each preset's scalar map against x (log scale) and the exact msign, 1 for every x > 0. Right: the
# same curves zoomed on [lo, 1] and [0.6, 1.25], where each preset's band shows.

# %%
def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 2, figsize=(12, 4.3))
    for i, (name, y) in enumerate(r["maps"].items()):
        lo_b, hi_b = r["band"][name]
        for ax in axs:
            ax.plot(r["x"], y, color=f"C{i}", lw=1.5, label=f"{name} ({PRESETS[name]} steps): "
                    f"[{lo_b:.3f}, {hi_b:.3f}] on [{r['lo']:g}, 1]")
    for ax in axs:
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("normalised singular value x = σ/‖G‖_F")
        ax.grid(alpha=0.3)
    axs[0].set_ylabel("after Newton-Schulz")
    axs[0].set_title("the scalar maps p_K(…p_1(x)); msign maps every x > 0 to 1", fontsize=10)
    axs[0].legend(fontsize=7)
    axs[1].set_xlim(r["lo"], 1.0)
    axs[1].set_ylim(0.6, 1.25)
    axs[1].set_title("zoom: the bands", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# %% [markdown]
# ## Run it
# `main()` computes, prints the bands and the check per preset, and writes the figure into `--out`.

# %%
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--lo", type=float, default=1e-3, help="lower end of the band")
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    r = run(a.lo)
    for name in PRESETS:
        b, b1 = r["band"][name], r["band_0.1"][name]
        print(f"{name:<14} band on [{a.lo:g}, 1]: [{b[0]:.4f}, {b[1]:.4f}];  on [0.1, 1]: [{b1[0]:.4f}, {b1[1]:.4f}];"
              f"  msign singular values vs scalar map: max diff {r['check'][name]:.1e}")
    path = os.path.join(a.out, "t10_newton_schulz.png")
    plot(r, path)
    print(f"wrote {path}")
    return r


# %%
if __name__ == "__main__":
    main()

# %% [markdown]
# # Tutorial 9 — Adam's bias correction and where ε goes
#
# **Bias correction.** m_t and v_t start at 0, so early on they underestimate E[g] and E[g²] by the factors
# 1 − β₁ᵗ and 1 − β₂ᵗ. Adam divides them out: with a constant gradient g every step of `refopt.Adam` has
# size lr·|g|/(|g| + ε) ≈ lr from the first step on. Without the correction the step is
# lr·(1 − β₁ᵗ)/sqrt(1 − β₂ᵗ) (for ε → 0): 3.16·lr at t = 1 with β = (0.9, 0.999), 6.5·lr near t = 10, and
# it takes thousands of steps to settle to lr (1.26·lr at t = 1000).
#
# **ε placements** (CONVENTIONS.md 0), for the per-coordinate step lr·m̂/denominator:
# * E1 (torch, optax, refopt): m̂/(sqrt(v̂) + ε);
# * E2 ("ε-hat", the paper's efficient form, Moonlight, TF1): m/(sqrt(v) + ε) · sqrt(1 − β₂ᵗ)/(1 − β₁ᵗ), i.e.
#   E1 with ε/sqrt(1 − β₂ᵗ): ε is 31.6× larger at t = 1 with β₂ = 0.999;
# * E3 (optax eps_root, some RMSProps): m̂/sqrt(v̂ + ε) (ε inside the root, in units of g²).
#
# They agree for |g| ≫ ε (or ≫ sqrt(ε) for E3) and differ completely for tiny gradients: the figure shows
# the first step's size against |g|. The numbers are printed beside torch.optim.Adam's (E1) and optax's
# adam with eps_root (E3) when those peers are installed (`pip install ".[peers]"`).
#
# Run: `python tutorials/t09_adam_details.py --out DIR` (about 3 s; a few more with the peers).

# %%
"""Tutorial 9 -- Adam's bias correction and the eps placements of the peers, as numbers."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t09_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args

B1, B2, EPS = 0.9, 0.999, 1e-8

# %% [markdown]
# ## Bias correction with a constant gradient

# %%


def steps_refopt(g: np.ndarray, t_max: int, lr: float = 1e-3, eps: float = EPS) -> np.ndarray:
    """|step| of refopt.Adam per coordinate for the constant gradient g, steps 1..t_max -> (t_max, len(g))."""
    rule = refopt.Adam(lr=lr, beta1=B1, beta2=B2, eps=eps)
    x = np.zeros_like(g)
    state = refopt.init(rule, x)
    out = []
    for _ in range(t_max):
        x_new, state = refopt.update(rule, state, x, g)
        out.append(np.abs(x_new - x))
        x = x_new
    return np.array(out)


def uncorrected_ratio(t) -> np.ndarray:
    """|step| / lr of Adam without bias correction, constant gradient, eps -> 0: (1 - b1^t)/sqrt(1 - b2^t)."""
    t = np.asarray(t, dtype=np.float64)
    return (1 - B1 ** t) / np.sqrt(1 - B2 ** t)


# %% [markdown]
# ## The three ε placements on the first step
# At t = 1: m̂ = g, v̂ = g² (E1, E3); m = (1 − β₁)g, v = (1 − β₂)g² (E2).

# %%


def first_step(g, lr: float = 1e-3, eps: float = EPS) -> dict:
    g = np.abs(np.asarray(g, dtype=np.float64))
    return {"E1": lr * g / (g + eps),
            "E2": lr * np.sqrt(1 - B2) / (1 - B1) * (1 - B1) * g / (np.sqrt(1 - B2) * g + eps),
            "E3": lr * g / np.sqrt(g * g + eps)}


def peers_first_step(g, lr: float = 1e-3, eps: float = EPS) -> dict:
    """The first step of torch.optim.Adam (E1) and optax.adam(eps=0, eps_root=eps) (E3), where installed."""
    out = {}
    try:
        import torch
        p = torch.zeros(len(g), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([p], lr=lr, betas=(B1, B2), eps=eps)
        p.grad = torch.tensor(np.asarray(g, dtype=np.float64))
        opt.step()
        out["torch Adam (E1)"] = np.abs(p.detach().numpy())
    except ImportError:
        pass
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import optax
        tx = optax.adam(lr, b1=B1, b2=B2, eps=0.0, eps_root=eps)
        params = jnp.zeros(len(g), dtype=jnp.float64)
        upd, _ = tx.update(jnp.asarray(g, dtype=jnp.float64), tx.init(params), params)
        out["optax adam eps_root (E3)"] = np.abs(np.asarray(upd))
    except ImportError:
        pass
    return out


def run(t_max: int = 3000, peers: bool = True) -> dict:
    g_const = np.array([1.0, 1e-3, 1e-6])
    st = steps_refopt(g_const, t_max)
    grid = np.geomspace(1e-12, 1.0, 61)
    return {"t": np.arange(1, t_max + 1), "g_const": g_const, "steps": st, "uncorrected": uncorrected_ratio(np.arange(1, t_max + 1)),
            "grid": grid, "first": first_step(grid), "refopt_first": steps_refopt(grid, 1)[0],
            "peers": peers_first_step(grid) if peers else {}}


# %% [markdown]
# ## Figure and printout

# %%


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.3))
    for i, g in enumerate(r["g_const"]):
        ax1.plot(r["t"], r["steps"][:, i] / 1e-3, color=f"C{i}", label=f"refopt.Adam, g = {g:g}")
    ax1.plot(r["t"], r["uncorrected"], "k--", label="no bias correction: (1-β1^t)/sqrt(1-β2^t)")
    ax1.set_xscale("log")
    ax1.set_xlabel("step t")
    ax1.set_ylabel("|step| / lr")
    ax1.set_title("constant gradient: bias correction gives steps of size lr", fontsize=10)
    for name, ls in (("E1", "-"), ("E2", "--"), ("E3", ":")):
        ax2.plot(r["grid"], r["first"][name] / 1e-3, ls, lw=2, label=name)
    ax2.plot(r["grid"], r["refopt_first"] / 1e-3, "k.", ms=4, label="refopt.Adam (measured)")
    for j, (name, v) in enumerate(r["peers"].items()):
        ax2.plot(r["grid"], v / 1e-3, "x+"[j % 2], ms=5, label=name)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("|g|")
    ax2.set_ylabel("first step / lr")
    ax2.set_title(f"ε placements, ε = {EPS:g}, β2 = {B2}", fontsize=10)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--no-peers", action="store_true", help="do not import torch / optax")
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    r = run(a.steps, peers=not a.no_peers)
    print("constant gradient, |step|/lr of refopt.Adam at t = 1, 10, 100: " + "; ".join(
        f"g={g:g}: " + ", ".join(f"{r['steps'][t - 1, i] / 1e-3:.4f}" for t in (1, 10, 100) if t <= a.steps)
        for i, g in enumerate(r["g_const"])))
    print("without bias correction: " + ", ".join(f"t={t}: {uncorrected_ratio(t):.3f}" for t in (1, 10, 100, 1000)))
    print("first step / lr for |g| = 1e-10, 1e-8, 1e-6, 1e-4:")
    idx = [int(np.argmin(np.abs(r["grid"] - v))) for v in (1e-10, 1e-8, 1e-6, 1e-4)]
    for name, v in list(r["first"].items()) + [("refopt", r["refopt_first"])] + list(r["peers"].items()):
        print(f"  {name:<26}" + "  ".join(f"{v[i] / 1e-3:.3e}" for i in idx))
    path = os.path.join(a.out, "t09_adam_details.png")
    plot(r, path)
    print(f"wrote {path}")
    return r


# %%
if __name__ == "__main__":
    main()

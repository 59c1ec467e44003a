# %% [markdown]
# # Tutorial 8 — optimizer trajectories: a course's first pictures
#
# Every rule here is a refopt rule applied to a 2-vector (or a matrix); the loss gradients are written by
# hand, so the pictures show the rules and nothing else.
#
# * **Ill-conditioned quadratic** f(x, y) = (x² + κy²)/2, κ = 25. Plain SGD multiplies the error along each
#   axis by (1 − ηλᵢ) per step (λ = 1 and κ): stable only for η < 2/κ, so the flat x-direction crawls.
#   Momentum (heavy ball) and Nesterov (`SGD(momentum=0.9, nesterov=True)`) build speed along x; Adam and
#   sign descent (`Adam(beta1=0, beta2=0)`: u = g/(|g| + ε) = sign(g)) take steps of the same size in
#   every coordinate whatever the curvature, then chatter at the scale of the lr.
# * **Rosenbrock** (1 − x)² + 100(y − x²)²: the curved valley. Everything first falls into the valley; along
#   it, SGD (lr bounded by the steep walls) crawls, momentum helps, Adam's per-coordinate scaling walks it
#   to the minimum, and sign descent with a constant lr chatters across the valley and stalls.
# * **A matrix problem**: least squares ½‖XW − Y‖²/N with a condition number of 100 in X. SGD's gradient
#   is dominated by the top singular directions; Muon's msign(G) = UVᵀ has *all* singular values 1, so its
#   step moves every singular direction equally (post 003's steepest descent under the spectral norm).
#
# Run: `python tutorials/t08_trajectories.py --out DIR` (about 5 s).

# %%
"""Tutorial 8 -- trajectories of SGD, momentum, Nesterov, Adam, sign descent and Muon on small problems."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t08_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args

KAPPA = 25.0


def quadratic(p):
    """(f, grad f) of (x^2 + kappa y^2)/2."""
    return 0.5 * (p[0] ** 2 + KAPPA * p[1] ** 2), np.array([p[0], KAPPA * p[1]])


def rosenbrock(p):
    x, y = p
    return (1 - x) ** 2 + 100 * (y - x * x) ** 2, np.array([-2 * (1 - x) - 400 * x * (y - x * x), 200 * (y - x * x)])


def rules(problem: str) -> dict:
    """The rules compared on a 2-D problem (learning rates tuned by hand for each problem)."""
    if problem == "quadratic":
        return {"SGD": refopt.SGD(lr=0.07), "momentum 0.9": refopt.SGD(lr=0.01, momentum=0.9),
                "Nesterov 0.9": refopt.SGD(lr=0.01, momentum=0.9, nesterov=True),
                "Adam": refopt.Adam(lr=0.15), "sign descent": refopt.Adam(lr=0.045, beta1=0.0, beta2=0.0, eps=1e-30)}
    return {"SGD": refopt.SGD(lr=1e-3), "momentum 0.9": refopt.SGD(lr=2e-4, momentum=0.9),
            "Nesterov 0.9": refopt.SGD(lr=2e-4, momentum=0.9, nesterov=True),
            "Adam": refopt.Adam(lr=0.05), "sign descent": refopt.Adam(lr=0.01, beta1=0.0, beta2=0.0, eps=1e-30)}


def trajectory(rule, fg, x0, steps: int):
    """Iterates (steps+1, 2) and losses (steps+1,) of ``rule`` on ``fg`` from x0."""
    x = np.array(x0, dtype=np.float64)
    state = refopt.init(rule, x)
    xs, fs = [x.copy()], [fg(x)[0]]
    for _ in range(steps):
        x, state = refopt.update(rule, state, x, fg(x)[1])
        xs.append(x.copy())
        fs.append(fg(x)[0])
    return np.array(xs), np.array(fs)


# %% [markdown]
# ## The matrix problem

# %%


def matrix_problem(n: int = 32, cond: float = 100.0, seed: int = 0):
    """(X, Y, loss_and_grad) for 0.5 ||X W - Y||_F^2 / N, X (N, n) with singular values from 1 to 1/cond."""
    rng = np.random.default_rng(seed)
    N = 4 * n
    U, _ = np.linalg.qr(rng.standard_normal((N, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    X = np.sqrt(N) * (U * np.geomspace(1.0, 1.0 / cond, n)) @ V.T
    Y = X @ rng.standard_normal((n, n))

    def lg(W):
        R = X @ W - Y
        return 0.5 * float(np.sum(R * R)) / N, X.T @ R / N

    return X, Y, lg


def matrix_runs(steps: int = 300, seed: int = 0) -> dict:
    _, _, lg = matrix_problem(seed=seed)
    sched = refopt.schedules.LinearDecay(steps)
    rs = {"SGD": refopt.SGD(lr=0.9, schedule=sched), "SGD momentum 0.9": refopt.SGD(lr=0.09, momentum=0.9, schedule=sched),
          "Adam": refopt.Adam(lr=0.1, schedule=sched),
          "Muon (msign, svd)": refopt.Muon(lr=0.3, momentum=0.9, msign="svd", schedule=sched)}
    out = {}
    for name, rule in rs.items():
        W = np.zeros((32, 32))
        state = refopt.init(rule, W)
        losses = [lg(W)[0]]
        for _ in range(steps):
            W, state = refopt.update(rule, state, W, lg(W)[1])
            losses.append(lg(W)[0])
        out[name] = np.array(losses)
    # the Muon direction has all singular values equal to its scale (here sqrt(32/32) = 1)
    muon = refopt.Muon(lr=1.0, momentum=0.0, nesterov=False, msign="svd")
    W = np.random.default_rng(seed + 1).standard_normal((32, 32))
    u, _ = refopt.direction(muon, refopt.init(muon, W), W, lg(W)[1])
    out["sv_gradient"] = np.linalg.svd(lg(W)[1], compute_uv=False)
    out["sv_muon_direction"] = np.linalg.svd(u, compute_uv=False)
    return out


def run(steps: int = 120, rosen_steps: int = 1500, matrix_steps: int = 300, seed: int = 0) -> dict:
    out = {"quadratic": {}, "rosenbrock": {}}
    for name, rule in rules("quadratic").items():
        out["quadratic"][name] = trajectory(rule, quadratic, (-4.0, 1.0), steps)
    for name, rule in rules("rosenbrock").items():
        out["rosenbrock"][name] = trajectory(rule, rosenbrock, (-1.5, 2.0), rosen_steps)
    out["matrix"] = matrix_runs(matrix_steps, seed)
    return out


# %% [markdown]
# ## Figure and printout

# %%


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, prob, fg, box in ((axs[0], "quadratic", quadratic, (-4.5, 1.0, -1.2, 1.2)),
                              (axs[1], "rosenbrock", rosenbrock, (-2.0, 1.5, -0.5, 3.0))):
        gx, gy = np.meshgrid(np.linspace(box[0], box[1], 200), np.linspace(box[2], box[3], 200))
        fz = np.vectorize(lambda a, b: fg(np.array([a, b]))[0])(gx, gy)
        ax.contour(gx, gy, np.log10(fz + 1e-3), levels=20, colors="0.8", linewidths=0.6)
        for i, (name, (xs, fs)) in enumerate(r[prob].items()):
            ax.plot(xs[:, 0], xs[:, 1], ".-", ms=2, lw=0.8 + 0.6 * (4 - i), color=f"C{i}", alpha=0.8,
                    label=f"{name}: f_T = {fs[-1]:.1e}")
        ax.plot(*((0, 0) if prob == "quadratic" else (1, 1)), "k*", ms=10)
        ax.set_xlim(box[0], box[1])
        ax.set_ylim(box[2], box[3])
        ax.set_title(f"{prob}" + (f" (κ = {KAPPA:g})" if prob == "quadratic" else ""), fontsize=10)
        ax.set_xlabel("w₁")
        ax.set_ylabel("w₂")
        ax.legend(fontsize=7, loc="lower right" if prob == "quadratic" else "upper right")   # off the paths
    ax = axs[2]
    for name, v in r["matrix"].items():
        if not name.startswith("sv_"):
            ax.plot(v, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step (linear decay to 0)")
    ax.set_ylabel("loss")
    ax.set_title("least squares ½‖XW − Y‖²/N, cond(X) = 100", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--steps", type=int, default=120, help="steps on the quadratic")
    ap.add_argument("--rosen-steps", type=int, default=1500, help="steps on the Rosenbrock function")
    ap.add_argument("--matrix-steps", type=int, default=300, help="steps on the matrix problem")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the problems")
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    r = run(a.steps, a.rosen_steps, a.matrix_steps, a.seed)
    for prob in ("quadratic", "rosenbrock"):
        print(f"{prob}: final loss " + ", ".join(f"{k} {v[1][-1]:.2e}" for k, v in r[prob].items()))
    print("matrix least squares, final loss: " + ", ".join(f"{k} {v[-1]:.2e}" for k, v in r["matrix"].items()
                                                           if not k.startswith("sv_")))
    sv_g, sv_u = r["matrix"]["sv_gradient"], r["matrix"]["sv_muon_direction"]
    print(f"singular values: gradient {sv_g.max():.2e} .. {sv_g.min():.2e}; Muon direction "
          f"{sv_u.max():.12f} .. {sv_u.min():.12f}")
    path = os.path.join(a.out, "t08_trajectories.png")
    plot(r, path)
    print(f"wrote {path}")
    return r


# %%
if __name__ == "__main__":
    main()

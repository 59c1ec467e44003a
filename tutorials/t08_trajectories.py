# %% [markdown]
# # Tutorial 8 — optimizer trajectories: a course's first pictures
#
# **Claim** (textbook facts, and post 003's steepest descent under the spectral norm for Muon). On small
# problems whose gradients are written by hand, the rules behave as their update equations say:
#
# * **Ill-conditioned quadratic** $f(w) = (w_1^2 + \kappa w_2^2)/2$, $\kappa = 25$. SGD multiplies the error
#   along each axis by $(1 - \eta\lambda_i)$ per step ($\lambda = 1$ and $\kappa$): stable only for
#   $\eta < 2/\kappa$, so the flat $w_1$-direction crawls. Momentum (heavy ball) and Nesterov build speed
#   along $w_1$. Adam and sign descent (`Adam(beta1=0, beta2=0)`: $u = g/(|g|+\epsilon) = \mathrm{sign}(g)$)
#   take steps of the same size in every coordinate whatever the curvature; sign descent moves each
#   coordinate by exactly $\eta$ per step and ends up chattering at that scale.
# * **Rosenbrock** $f(w) = (1 - w_1)^2 + 100(w_2 - w_1^2)^2$, the curved valley, minimum at $(1, 1)$. All
#   rules first fall into the valley; along it SGD (its lr bounded by the steep walls) crawls, momentum
#   helps, Adam's per-coordinate scaling walks it to the minimum, and sign descent with a constant lr
#   chatters across the valley and stalls.
# * **A matrix problem**: least squares $\tfrac12\|XW - Y\|_F^2/N$ with $\mathrm{cond}(X) = 100$. SGD's
#   gradient is dominated by the top singular directions; Muon's $\mathrm{msign}(G) = UV^\top$ has all
#   singular values 1, so its step moves every singular direction equally.
#
# **What this notebook shows.** The paths on the two 2-D problems, the distance to the minimum of Rosenbrock
# against the step (the paths there all run along the same valley), the matrix problem's loss curves, and
# three exact checks: SGD's iterates are the closed form, sign descent's steps are exactly $\eta$, and Muon's
# direction has singular values 1.
#
# **Setting.** float64, hand-written gradients; learning rates chosen by hand per problem (printed).
#
# **Run time.** About 35 s on the shared 2-core machine (load average about 10). As a script:
# `python tutorials/t08_trajectories.py --out DIR` writes `DIR/t08_trajectories.png` and `.json`.

# %%
import argparse

import matplotlib.pyplot as plt
import numpy as np

import refopt
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out

ap = argparse.ArgumentParser(description="Tutorial 8: trajectories of SGD, momentum, Nesterov, Adam, sign descent "
                                         "and Muon on small problems")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--steps", type=int, default=120, help="steps on the quadratic")
ap.add_argument("--rosen-steps", type=int, default=1500, help="steps on the Rosenbrock function")
ap.add_argument("--matrix-steps", type=int, default=300, help="steps on the matrix problem")
ap.add_argument("--seed", type=int, default=0, help="random seed of the matrix problem")
args = parse_script_args(ap)
if min(args.steps, args.rosen_steps, args.matrix_steps) < 1:
    ap.error("the numbers of steps must be >= 1")
KAPPA = 25.0

# %% [markdown]
# ## 1. The problems and the rules
#
# `quadratic` and `rosenbrock` return $(f, \nabla f)$; `trajectory` applies a refopt rule from $w_0$ and
# records the iterates and the losses. The learning rates are chosen by hand for each problem.

# %%
def quadratic(w):
    """(f, grad f) of (w1^2 + kappa w2^2)/2."""
    return 0.5 * (w[0] ** 2 + KAPPA * w[1] ** 2), np.array([w[0], KAPPA * w[1]])


def rosenbrock(w):
    """(f, grad f) of (1 - w1)^2 + 100 (w2 - w1^2)^2."""
    x, y = w
    return (1 - x) ** 2 + 100 * (y - x * x) ** 2, np.array([-2 * (1 - x) - 400 * x * (y - x * x), 200 * (y - x * x)])


def rules(problem):
    """The rules compared on a 2-D problem (learning rates chosen by hand for each problem)."""
    if problem == "quadratic":
        return {"SGD": refopt.SGD(lr=0.07), "momentum 0.9": refopt.SGD(lr=0.01, momentum=0.9),
                "Nesterov 0.9": refopt.SGD(lr=0.01, momentum=0.9, nesterov=True),
                "Adam": refopt.Adam(lr=0.15), "sign descent": refopt.Adam(lr=0.045, beta1=0.0, beta2=0.0, eps=1e-30)}
    return {"SGD": refopt.SGD(lr=1e-3), "momentum 0.9": refopt.SGD(lr=2e-4, momentum=0.9),
            "Nesterov 0.9": refopt.SGD(lr=2e-4, momentum=0.9, nesterov=True),
            "Adam": refopt.Adam(lr=0.05), "sign descent": refopt.Adam(lr=0.01, beta1=0.0, beta2=0.0, eps=1e-30)}


def trajectory(rule, fg, w0, steps):
    """Iterates (steps+1, 2) and losses (steps+1,) of ``rule`` on ``fg`` from w0."""
    w = np.array(w0, dtype=np.float64)
    state = refopt.init(rule, w)
    ws, fs = [w.copy()], [fg(w)[0]]
    for _ in range(steps):
        w, state = refopt.update(rule, state, w, fg(w)[1])
        ws.append(w.copy())
        fs.append(fg(w)[0])
    return np.array(ws), np.array(fs)


for problem in ("quadratic", "rosenbrock"):
    print(f"{problem}: " + ", ".join(f"{k} lr {r.lr:g}" for k, r in rules(problem).items()))

# %% [markdown]
# ## 2. The quadratic, and two exact checks
#
# SGD with $\eta = 0.07$ from $w_0 = (-4, 1)$ should be exactly $w_t = ((1-\eta)^t w_{0,1}, (1-\eta\kappa)^t
# w_{0,2})$: $1 - 0.07\cdot25 = -0.75$, so $w_2$ flips sign every step while $w_1$ crawls. Sign descent should
# move every coordinate by exactly its lr at every step. Both printed errors should be at rounding level.

# %%
W0_QUAD, W0_ROSEN = (-4.0, 1.0), (-1.5, 2.0)
quad = {name: trajectory(rule, quadratic, W0_QUAD, args.steps) for name, rule in rules("quadratic").items()}
ws = quad["SGD"][0]
tq = np.arange(args.steps + 1)
closed = np.stack([W0_QUAD[0] * 0.93 ** tq, W0_QUAD[1] * (1 - 0.07 * KAPPA) ** tq], axis=1)
sgd_closed_form_err = float(np.max(np.abs(ws - closed) / np.maximum(np.abs(closed), 1e-300)))
sign_lr = rules("quadratic")["sign descent"].lr
sign_step_err = float(np.max(np.abs(np.abs(np.diff(quad["sign descent"][0], axis=0)) - sign_lr)) / sign_lr)
adam_steps = np.abs(np.diff(quad["Adam"][0], axis=0))
print(f"SGD against the closed form: largest relative error {sgd_closed_form_err:.1e}")
print(f"sign descent: every |step| = lr = {sign_lr} to a relative {sign_step_err:.1e}; Adam (beta1 = 0.9) "
      f"steps range over {adam_steps.min():.2e} .. {adam_steps.max():.2e}")
print(f"final loss after {args.steps} steps: " + ", ".join(f"{k} {v[1][-1]:.1e}" for k, v in quad.items()))

# %% [markdown]
# ## 3. Rosenbrock
#
# 1500 steps from $(-1.5, 2)$. The cell prints the final loss and the distance $\|w_T - (1, 1)\|$: Adam
# reaches the minimum, momentum and Nesterov get most of the way, SGD less, sign descent stays near where
# it met the valley.

# %%
rosen = {name: trajectory(rule, rosenbrock, W0_ROSEN, args.rosen_steps) for name, rule in rules("rosenbrock").items()}
dist = {name: np.linalg.norm(ws - np.array([1.0, 1.0]), axis=1) for name, (ws, _) in rosen.items()}
for name, (ws, fs) in rosen.items():
    print(f"{name:<13} f_T = {fs[-1]:.2e}   distance to (1, 1): {dist[name][-1]:.2e}   w_T = {np.round(ws[-1], 3)}")

# %% [markdown]
# ## 4. The matrix problem: Muon against SGD and Adam
#
# $X$ ($128\times32$) has singular values from 1 to 1/100 (times $\sqrt N$); $Y = XW_\star$. Every rule starts
# from $W = 0$ with a linear decay of the lr to 0. The cell also takes one Muon direction at a random $W$ and
# prints the singular values of the gradient (spread over five decades) and of the direction (all 1).

# %%
rng = np.random.default_rng(args.seed)
N, n = 128, 32
Uq, _ = np.linalg.qr(rng.standard_normal((N, n)))
Vq, _ = np.linalg.qr(rng.standard_normal((n, n)))
X = np.sqrt(N) * (Uq * np.geomspace(1.0, 1e-2, n)) @ Vq.T
Y = X @ rng.standard_normal((n, n))


def lsq(W):
    """(0.5 ||X W - Y||_F^2 / N, its gradient X^T (X W - Y) / N)."""
    R = X @ W - Y
    return 0.5 * float(np.sum(R * R)) / N, X.T @ R / N


sched = refopt.schedules.LinearDecay(args.matrix_steps)
matrix_rules = {"SGD": refopt.SGD(lr=0.9, schedule=sched),
                "SGD momentum 0.9": refopt.SGD(lr=0.09, momentum=0.9, schedule=sched),
                "Adam": refopt.Adam(lr=0.1, schedule=sched),
                "Muon (exact msign)": refopt.Muon(lr=0.3, momentum=0.9, msign="svd", schedule=sched)}
matrix = {}
for name, rule in matrix_rules.items():
    W = np.zeros((n, n))
    state = refopt.init(rule, W)
    losses = [lsq(W)[0]]
    for _ in range(args.matrix_steps):
        W, state = refopt.update(rule, state, W, lsq(W)[1])
        losses.append(lsq(W)[0])
    matrix[name] = np.array(losses)
muon = refopt.Muon(lr=1.0, momentum=0.0, nesterov=False, msign="svd")
W = np.random.default_rng(args.seed + 1).standard_normal((n, n))
u, _ = refopt.direction(muon, refopt.init(muon, W), W, lsq(W)[1])
sv_gradient = np.linalg.svd(lsq(W)[1], compute_uv=False)
sv_muon = np.linalg.svd(u, compute_uv=False)
print("final loss: " + ", ".join(f"{k} {v[-1]:.2e}" for k, v in matrix.items()))
print(f"singular values: gradient {sv_gradient.max():.2e} .. {sv_gradient.min():.2e}; "
      f"Muon direction {sv_muon.max():.12f} .. {sv_muon.min():.12f}")

# %% [markdown]
# ## 5. The figure
#
# (a) The quadratic: paths over the contours of $f$. (b) Rosenbrock: the paths, with a dot every 100 steps
# (far apart = fast) and the final iterate circled. (c) Rosenbrock: $\|w_t - w_\star\|$ against the step,
# where the rules that share the valley in (b) separate (momentum and Nesterov stay within 1% of each other
# here, Nesterov dashed). (d) The matrix problem's loss.

# %%
fig, axs = plt.subplots(2, 2, figsize=(14, 11))
for ax, prob, fg, box, runs in ((axs[0, 0], "quadratic", quadratic, (-4.5, 1.0, -1.2, 1.2), quad),
                                (axs[0, 1], "rosenbrock", rosenbrock, (-2.0, 1.5, -0.5, 3.0), rosen)):
    gx, gy = np.meshgrid(np.linspace(box[0], box[1], 200), np.linspace(box[2], box[3], 200))
    fz = np.vectorize(lambda a, b: fg(np.array([a, b]))[0])(gx, gy)
    ax.contour(gx, gy, np.log10(fz + 1e-3), levels=20, colors="0.8", linewidths=0.6)
    for i, (name, (ws, fs)) in enumerate(runs.items()):
        T = len(fs) - 1
        if prob == "quadratic":
            ax.plot(ws[:, 0], ws[:, 1], ".-", ms=2, lw=0.8 + 0.6 * (4 - i), color=f"C{i}", alpha=0.8,
                    label=f"{name}: $f(w_T)$ = {fs[-1]:.1e}")
        else:
            ax.plot(ws[:, 0], ws[:, 1], "-", lw=1.2, color=f"C{i}", alpha=0.7)
            ax.plot(ws[::100, 0], ws[::100, 1], "o", ms=4, color=f"C{i}",
                    label=f"{name}: $f(w_T)$ = {fs[-1]:.1e}")
            ax.plot(ws[-1, 0], ws[-1, 1], "o", ms=12, mfc="none", mew=2, color=f"C{i}")
    ax.plot(*((0, 0) if prob == "quadratic" else (1, 1)), "k*", ms=12)
    ax.set_xlim(box[0], box[1])
    ax.set_ylim(box[2], box[3])
    ax.set_xlabel("$w_1$")
    ax.set_ylabel("$w_2$")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
axs[0, 0].set_title(rf"(a) quadratic $(w_1^2 + \kappa w_2^2)/2$, $\kappa$ = {KAPPA:g}, $T$ = {args.steps} steps",
                    fontsize=10)
axs[0, 1].set_title(f"(b) Rosenbrock, $T$ = {args.rosen_steps} steps: a dot every 100 steps, "
                    "$w_T$ circled, $w_\\star$ = (1, 1) starred", fontsize=10)
ax = axs[1, 0]
for i, (name, d) in enumerate(dist.items()):
    ax.plot(np.arange(len(d)), d, "--" if name.startswith("Nesterov") else "-", color=f"C{i}", lw=1.8, label=name)
ax.set_yscale("log")
ax.set_xlabel("step $t$")
ax.set_ylabel(r"$\|w_t - w_\star\|$")
ax.set_title(r"(c) Rosenbrock: distance to the minimum $w_\star$ = (1, 1)", fontsize=10)
ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
ax.grid(alpha=0.3)
ax = axs[1, 1]
for name, v in matrix.items():
    ax.plot(v, label=name)
ax.set_yscale("log")
ax.set_xlabel("step $t$ (lr decays linearly to 0)")
ax.set_ylabel(r"$\frac{1}{2}\|XW - Y\|_F^2/N$")
ax.set_title(r"(d) least squares, cond$(X)$ = 100; Muon's direction $UV^\top$ has all singular values 1",
             fontsize=10)
ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
ax.grid(alpha=0.3)
fig.tight_layout()
path = save_figure(fig, args.out, "t08_trajectories")
print(f"wrote {path}")

# %% [markdown]
# ## 6. The numbers
#
# Saved as `t08_trajectories.json` next to the figure; the tests check the claims on them.

# %%
results = {"kappa": KAPPA, "sgd_closed_form_err": sgd_closed_form_err, "sign_step_err": sign_step_err,
           "adam_step_range": [float(adam_steps.min()), float(adam_steps.max())],
           "quadratic_final": {k: float(v[1][-1]) for k, v in quad.items()},
           "rosenbrock_final": {k: float(v[1][-1]) for k, v in rosen.items()},
           "rosenbrock_distance": {k: float(d[-1]) for k, d in dist.items()},
           "matrix_final": {k: float(v[-1]) for k, v in matrix.items()},
           "sv_gradient": sv_gradient, "sv_muon_direction": sv_muon}
save_results(args.out, "t08_trajectories", results)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** SGD on the quadratic multiplies $w_2$ by $(1 - \eta\kappa)$ per step. What is the largest
# learning rate for which it does not diverge? Set `answer1` to that $\eta$ (a closed form in $\kappa$). The
# check runs SGD just below and just above it.

# %%
answer1 = None  # your code: the stability limit of SGD's lr on the quadratic

# %%
if answer1 is None:
    print("Exercise 1: not answered yet")
else:
    below = trajectory(refopt.SGD(lr=0.99 * answer1), quadratic, W0_QUAD, 300)[1][-1]
    above = trajectory(refopt.SGD(lr=1.01 * answer1), quadratic, W0_QUAD, 300)[1][-1]
    assert below < 1.0 < above, f"lr 0.99 x {answer1:g} ends at f = {below:.1e}, 1.01 x at {above:.1e}"
    print(f"Exercise 1: correct, eta < {answer1:g}: f(w_300) = {below:.1e} just below, {above:.1e} just above")

# %% [markdown]
# **Exercise 2.** For a quadratic with curvatures $\mu = 1$ and $L = \kappa$, heavy-ball momentum converges
# fastest with $\eta = 4/(\sqrt L + \sqrt\mu)^2$ and $\beta = ((\sqrt\kappa - 1)/(\sqrt\kappa + 1))^2$ (Polyak).
# Set `answer2 = (lr, beta)`. The check runs `refopt.SGD(lr, momentum=beta)` against SGD at its best fixed
# lr $2/(L + \mu)$ for 60 steps.

# %%
answer2 = None  # your code: (lr, beta)

# %%
if answer2 is None:
    print("Exercise 2: not answered yet")
else:
    lr2, beta2 = answer2
    f_hb = trajectory(refopt.SGD(lr=lr2, momentum=beta2), quadratic, W0_QUAD, 60)[1][-1]
    f_sgd = trajectory(refopt.SGD(lr=2 / (KAPPA + 1)), quadratic, W0_QUAD, 60)[1][-1]
    assert f_hb < 1e-12 and f_hb < 1e-6 * f_sgd, f"heavy ball ends at {f_hb:.1e}, SGD at {f_sgd:.1e}"
    print(f"Exercise 2: correct, after 60 steps heavy ball f = {f_hb:.1e}, SGD at its best lr f = {f_sgd:.1e}")

# %% [markdown]
# # Tutorial 9 — Adam's bias correction and where ε goes
#
# **Claim** (Adam's definition and the peers' conventions, docs/reference/CONVENTIONS.md §0; no source post).
#
# 1. **Bias correction.** $m_t$ and $v_t$ start at 0, so early on they underestimate $E[g]$ and $E[g^2]$ by
#    the factors $1-\beta_1^t$ and $1-\beta_2^t$. Adam divides them out, $\hat m_t = m_t/(1-\beta_1^t)$,
#    $\hat v_t = v_t/(1-\beta_2^t)$: with a constant gradient $g$ every step of `refopt.Adam` has size
#    $\eta|g|/(|g|+\epsilon) \approx \eta$ from the first step on. Without the correction the step is
#    $\eta(1-\beta_1^t)/\sqrt{1-\beta_2^t}$ (for $\epsilon \to 0$): $3.16\,\eta$ at $t = 1$ with
#    $\beta = (0.9, 0.999)$, $6.5\,\eta$ near $t = 10$, and it takes thousands of steps to settle.
# 2. **Where ε goes.** Three placements are in use for the step $\eta\,\hat m/\text{denominator}$:
#    * **E1** (torch, optax, refopt): $\hat m/(\sqrt{\hat v} + \epsilon)$;
#    * **E2** ("$\hat\epsilon$", the Adam paper's efficient form, Moonlight, TF1):
#      $m/(\sqrt{v} + \epsilon)\cdot\sqrt{1-\beta_2^t}/(1-\beta_1^t)$, i.e. E1 with $\epsilon/\sqrt{1-\beta_2^t}$
#      ($\epsilon$ is $31.6\times$ larger at $t = 1$ with $\beta_2 = 0.999$);
#    * **E3** (optax `eps_root`, some RMSProps): $\hat m/\sqrt{\hat v + \epsilon}$ ($\epsilon$ inside the root,
#      in units of $g^2$).
#
#    They agree for $|g| \gg \epsilon$ (E3: $|g| \gg \sqrt\epsilon$) and differ completely for tiny gradients.
#
# **What this notebook shows.** The step sizes of `refopt.Adam` under a constant gradient against the
# uncorrected formula; the first step of E1/E2/E3 against $|g|$; and refopt's first step against
# `torch.optim.Adam` (E1) and `optax.adam(eps=0, eps_root=ε)` (E3) when those peers are installed
# (`pip install ".[peers]"`; without them the comparison is skipped and the figure says so).
#
# **Setting.** float64, $\eta = 10^{-3}$, $\beta = (0.9, 0.999)$, $\epsilon = 10^{-8}$; 3000 steps.
#
# **Run time.** About 40 s with the peers (their imports are most of it) on the shared 2-core machine
# (load average about 9). As a script: `python tutorials/t09_adam_details.py --out DIR` writes
# `DIR/t09_adam_details.png` and `.json`.

# %%
import argparse

import matplotlib.pyplot as plt
import numpy as np

import refopt
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out

ap = argparse.ArgumentParser(description="Tutorial 9: Adam's bias correction and the eps placements of the peers")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--steps", type=int, default=3000, help="steps of the constant-gradient run")
ap.add_argument("--no-peers", action="store_true", help="do not import torch / optax (skip the comparison)")
args = parse_script_args(ap)
if args.steps < 1:
    ap.error("--steps must be >= 1")
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8

# %% [markdown]
# ## 1. Bias correction under a constant gradient
#
# `steps_refopt(g, T)` runs `refopt.Adam` from 0 with the same gradient $g$ at every step and returns
# $|x_t - x_{t-1}|$ per coordinate. The cell prints $|\text{step}|/\eta$ at a few steps for
# $|g| = 1, 10^{-3}, 10^{-6}$ (expect $|g|/(|g|+\epsilon)$: 1.0000, 1.0000, 0.9901 at every $t$) and the
# uncorrected ratio $(1-\beta_1^t)/\sqrt{1-\beta_2^t}$.

# %%
def steps_refopt(g, t_max, lr=LR, eps=EPS):
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


def uncorrected_ratio(t):
    """|step| / lr of Adam without bias correction, constant gradient, eps -> 0: (1 - b1^t)/sqrt(1 - b2^t)."""
    t = np.asarray(t, dtype=np.float64)
    return (1 - B1 ** t) / np.sqrt(1 - B2 ** t)


g_const = np.array([1.0, 1e-3, 1e-6])
t = np.arange(1, args.steps + 1)
steps = steps_refopt(g_const, args.steps)
closed = LR * g_const / (g_const + EPS)
step_dev = float(np.max(np.abs(steps - closed) / closed))
for i, g in enumerate(g_const):
    print(f"|g| = {g:g}: |step|/lr at t = 1, 10, 100: "
          + ", ".join(f"{steps[k - 1, i] / LR:.4f}" for k in (1, 10, 100) if k <= args.steps))
print(f"largest relative deviation from lr |g|/(|g| + eps) over all steps: {step_dev:.1e}")
print("without bias correction: " + ", ".join(f"t = {k}: {uncorrected_ratio(k):.3f}" for k in (1, 10, 100, 1000)))

# %% [markdown]
# ## 2. The three ε placements on the first step
#
# At $t = 1$: $\hat m = g$, $\hat v = g^2$ (E1, E3); $m = (1-\beta_1)g$, $v = (1-\beta_2)g^2$ (E2). So the
# first step over $\eta$ is $|g|/(|g|+\epsilon)$ (E1), $|g|/(|g|+\epsilon/\sqrt{1-\beta_2})$ (E2) and
# $|g|/\sqrt{g^2+\epsilon}$ (E3). The cell evaluates them on a grid of $|g|$ and measures refopt's first step.

# %%
grid = np.geomspace(1e-12, 1.0, 61)
first = {"E1": LR * grid / (grid + EPS),
         "E2": LR * grid / (grid + EPS / np.sqrt(1 - B2)),
         "E3": LR * grid / np.sqrt(grid * grid + EPS)}
refopt_first = steps_refopt(grid, 1)[0]
show = [int(np.argmin(np.abs(grid - v))) for v in (1e-10, 1e-8, 1e-6, 1e-4)]
print("first step / lr at |g| = 1e-10, 1e-8, 1e-6, 1e-4:")
for name, v in list(first.items()) + [("refopt.Adam", refopt_first)]:
    print(f"  {name:<12}" + "  ".join(f"{v[i] / LR:.3e}" for i in show))

# %% [markdown]
# ## 3. The peers
#
# The first step of `torch.optim.Adam` (E1) and of `optax.adam(eps=0, eps_root=ε)` (E3) on the same grid, in
# float64, where installed. A missing peer is reported, not hidden.

# %%
peers, missing = {}, []
if not args.no_peers:
    try:
        import torch
        p = torch.zeros(len(grid), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([p], lr=LR, betas=(B1, B2), eps=EPS)
        p.grad = torch.tensor(grid)
        opt.step()
        peers["torch.optim.Adam (E1)"] = np.abs(p.detach().numpy())
    except ImportError:
        missing.append("torch")
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import optax
        tx = optax.adam(LR, b1=B1, b2=B2, eps=0.0, eps_root=EPS)
        zeros = jnp.zeros(len(grid), dtype=jnp.float64)
        upd, _ = tx.update(jnp.asarray(grid), tx.init(zeros), zeros)
        peers["optax.adam eps_root (E3)"] = np.abs(np.asarray(upd))
    except ImportError:
        missing.append("optax")
else:
    missing = ["torch", "optax"]
# each measured first step against the formula of its placement: relative differences
measured = {"refopt.Adam (E1)": (refopt_first, "E1"), **{k: (v, k[-3:-1]) for k, v in peers.items()}}
rel_diff = {k: np.abs(v - first[e]) / first[e] for k, (v, e) in measured.items()}
for k, d in rel_diff.items():
    print(f"{k:<26} largest relative difference from its formula: {d.max():.1e}")
if missing:
    print(f"not installed (comparison skipped): {', '.join(missing)}")

# %% [markdown]
# ## 4. The figure
#
# (a) $|\text{step}|/\eta$ under a constant gradient: refopt's three runs lie on 1 (0.99 for $|g| = 10^{-6}$,
# where $\epsilon$ is 1% of $|g|$), the uncorrected formula does not. (b) The first step against $|g|$ for the
# three placements, with refopt's measured steps (dots) and the peers' (crosses). (c) The measured first steps
# minus their formula, relative: rounding level; a missing peer is named in the panel.

# %%
fig, axs = plt.subplots(1, 3, figsize=(18, 5.4))
ax = axs[0]
for i, (g, ls) in enumerate(zip(g_const, ("-", "--", ":"))):
    ax.plot(t, steps[:, i] / LR, ls, color=f"C{i}", lw=2, label=f"refopt.Adam, $|g|$ = {g:g}")
ax.plot(t, uncorrected_ratio(t), "k--", lw=1.2, label=r"no bias correction: $(1-\beta_1^t)/\sqrt{1-\beta_2^t}$")
ax.set_xscale("log")
ax.set_ylim(0, 7.5)
ax.set_xlabel("step $t$")
ax.set_ylabel(r"$|x_t - x_{t-1}|\,/\,\eta$")
ax.set_title(r"(a) constant gradient $g$: bias correction gives steps of size $\eta$", fontsize=10)
ax = axs[1]
labels = {"E1": r"E1: $\hat m/(\sqrt{\hat v}+\epsilon)$  (torch, optax, refopt)",
          "E2": r"E2: $\hat m/(\sqrt{\hat v}+\epsilon/\sqrt{1-\beta_2^t})$  ($\hat\epsilon$, TF1)",
          "E3": r"E3: $\hat m/\sqrt{\hat v+\epsilon}$  (optax eps_root)"}
for name, ls in (("E1", "-"), ("E2", "--"), ("E3", ":")):
    ax.plot(grid, first[name] / LR, ls, lw=2, label=labels[name])
ax.plot(grid, refopt_first / LR, "k.", ms=5, label="refopt.Adam, measured")
for j, (name, v) in enumerate(peers.items()):
    ax.plot(grid, v / LR, "x+"[j % 2], ms=6, color=("C3", "C4")[j % 2], label=f"{name}, measured")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel(r"$|g|$")
ax.set_ylabel(r"first step $/\,\eta$")
ax.set_title(rf"(b) where $\epsilon$ goes: first step, $\epsilon$ = {EPS:g}, $\beta_2$ = {B2}", fontsize=10)
ax = axs[2]
for j, (name, d) in enumerate(rel_diff.items()):
    ax.plot(grid, np.maximum(d, 1e-18), "o", ms=3.5, color=("k", "C3", "C4")[j], label=name)
if missing:
    ax.text(0.5, 0.55, "not installed, comparison skipped:\n" + ", ".join(missing)
            + '\n(pip install ".[peers]")', transform=ax.transAxes, ha="center", fontsize=10, color="C3")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_ylim(1e-18, 1e-10)
ax.set_xlabel(r"$|g|$")
ax.set_ylabel("|measured − formula| / formula")
ax.set_title("(c) measured first steps against their formula\n(an exact 0 is drawn at the bottom, 1e-18)", fontsize=10)
for ax in axs:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
fig.tight_layout()
path = save_figure(fig, args.out, "t09_adam_details")
print(f"wrote {path}")

# %% [markdown]
# ## 5. The numbers
#
# Saved as `t09_adam_details.json` next to the figure; the tests check the claims on them.

# %%
at = [k for k in (1, 2, 10, 100, 1000, args.steps) if k <= args.steps]
results = {"lr": LR, "beta1": B1, "beta2": B2, "eps": EPS, "g_const": g_const, "t_at": at,
           "step_over_lr_at": {f"{g:g}": steps[np.array(at) - 1, i] / LR for i, g in enumerate(g_const)},
           "step_max_rel_dev": step_dev, "uncorrected_at": uncorrected_ratio(np.array(at)),
           "uncorrected_max": float(uncorrected_ratio(t).max()), "grid": grid,
           "first": first, "refopt_first": refopt_first, "peers": peers, "missing_peers": missing,
           "peer_max_rel_diff": {k: float(d.max()) for k, d in rel_diff.items()}}
save_results(args.out, "t09_adam_details", results)

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Without bias correction the step over $\eta$ is $(1-\beta_1^t)/\sqrt{1-\beta_2^t}$. At which
# step $t$ is it largest, and how large? Set `answer1 = (t_peak, ratio_peak)` (use `uncorrected_ratio`).

# %%
answer1 = None  # your code: (t_peak, ratio_peak)

# %%
if answer1 is None:
    print("Exercise 1: not answered yet")
else:
    tt = np.arange(1, 100001)
    k = int(np.argmax(uncorrected_ratio(tt)))
    assert answer1[0] == tt[k], f"the peak is at another step than {answer1[0]}"
    assert abs(answer1[1] - uncorrected_ratio(tt[k])) < 1e-9, "that is not the ratio at the peak"
    print(f"Exercise 1: correct, t = {tt[k]}: {uncorrected_ratio(tt[k]):.3f} times the step size asked for")

# %% [markdown]
# **Exercise 2.** With E3 (ε inside the root), at which $|g|$ is the first step exactly $\eta/2$? Set
# `answer2` to that $|g|$ (a closed form in $\epsilon$). Compare with E1, whose first step is $\eta/2$ at
# $|g| = \epsilon$.

# %%
answer2 = None  # your code: |g| with E3 first step = lr / 2

# %%
if answer2 is None:
    print("Exercise 2: not answered yet")
else:
    half = answer2 / np.sqrt(answer2 ** 2 + EPS)
    assert abs(half - 0.5) < 1e-9, f"E3's first step at |g| = {answer2:g} is {half:.4f} lr, not lr/2"
    print(f"Exercise 2: correct, |g| = {answer2:.3e}, {answer2 / EPS:.0f} times larger than E1's")

# %% [markdown]
# **Exercise 3.** E2 is E1 with $\epsilon/\sqrt{1-\beta_2^t}$. From which step $t$ on is E2's effective
# $\epsilon$ within 1% of $\epsilon$, i.e. $1/\sqrt{1-\beta_2^t} \le 1.01$? Set `answer3` to the smallest such
# $t$ for $\beta_2 = 0.999$.

# %%
answer3 = None  # your code: the smallest t

# %%
if answer3 is None:
    print("Exercise 3: not answered yet")
else:
    within = lambda k: 1 / np.sqrt(1 - B2 ** k) <= 1.01  # noqa: E731
    assert within(answer3), f"at t = {answer3} E2's eps is still more than 1% larger"
    assert not within(answer3 - 1), f"already at t = {answer3 - 1}"
    print(f"Exercise 3: correct, t = {answer3}: E1 and E2 differ for the first few thousand steps")

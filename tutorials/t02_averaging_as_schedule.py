# %% [markdown]
# # Tutorial 2 — weight averaging acts like a learning-rate schedule
#
# **Claims** (post 004, eqs. (2), (10), (17), (18)).
# 1. Averaging beside training, $\mu_{t+1} = (1 - c_{t+1})\mu_t + c_{t+1}\theta_{t+1}$ (eq. (2)), does not
#    change the trajectory $\theta_t$ (`refopt.Average`, `refopt.EMA`).
# 2. Evaluating the average with weights $v_t$ acts like multiplying the learning rate by
#    $\gamma_t = v_{t+1:T}/v_{1:T}$ (the meaning of eq. (10)): uniform weights ($c_t = 1/t$) give the linear
#    decay $1 - t/T$; an EMA ($v_t \propto \gamma^{-t}$) gives $(1 - \gamma^{T-t})/(1 - \gamma^T)$ (eq. (17)): a
#    decay over the last $\sim 1/(1-\gamma)$ steps only.
# 3. Hence an EMA beside constant-lr training *previews*, at any step, the end of a short linear decay: we
#    branch linear decays (lr $\to$ 0 over $W = 2/(1-\gamma)$ steps, the window whose lost lr area equals the
#    EMA's) off the constant-lr run and compare their endpoints with the EMA at the same step.
# 4. Schedule-Free (eq. (18), `refopt.ScheduleFreeSGD`) against a tuned linear-decay schedule, and why warmup
#    remains: at a large lr Schedule-Free without warmup is hurt by the large early gradients.
#
# **What it does not show.** The convex-theory correspondence of the uniform average with a linear decay
# holds only at the endpoint $T$, and on this easy, non-convex problem the uniform average is slow (it keeps the
# early, poor iterates: the post's "poor in practice"), so it is not claimed to match the decayed run.
#
# **Setting.** refopt's MLP 64-64-10 on the 8x8 digits (float64), SGD, batch 16, 1500 steps, the same batches in
# every run; test loss on the 360 test digits.
#
# **Run time.** About 75 s as a script, 72 s as a notebook, on the shared 2-core machine at load average 8 to 12
# (other jobs running). As a script:
# `python tutorials/t02_averaging_as_schedule.py --out DIR` writes `DIR/t02_averaging_as_schedule.png` and `.json`.

# %%
import argparse

import matplotlib.pyplot as plt
import numpy as np

import refopt
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out
from refopt.models import mlp
from refopt.models.data import load_digits

ap = argparse.ArgumentParser(description="Tutorial 2: weight averaging acts like a learning-rate schedule "
                                         "(post 004), and Schedule-Free")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--steps", type=int, default=1500, help="training steps T")
ap.add_argument("--lr", type=float, default=0.5, help="peak SGD learning rate")
ap.add_argument("--ema-decay", type=float, default=0.98)
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--seed", type=int, default=0, help="random seed of the init and the batch order")
ap.add_argument("--eval-every", type=int, default=20)
ap.add_argument("--branches", type=int, default=8, help="linear decays branched off the constant-lr run")
args = parse_script_args(ap)
if args.steps < 1 or args.eval_every < 1 or args.branches < 1:
    ap.error("--steps, --eval-every and --branches must be >= 1")
data = load_digits(dtype=np.float64)

# %% [markdown]
# ## 1. Eq. (10): a weighting of the iterates as a learning-rate multiplier
#
# `averaging_multiplier(v)` computes $\gamma_t = v_{t+1:T}/v_{1:T}$. The cell compares it with the closed forms:
# $1 - t/T$ for uniform weights and eq. (17) for an EMA (the printed errors are rounding).

# %%
def averaging_multiplier(v) -> np.ndarray:
    """gamma_t = v_{t+1:T} / v_{1:T} for t = 1..T (post 004, eq. (10) read as a multiplier of the lr): the
    schedule that evaluating the v-weighted average of the iterates acts like. v: T weights >= 0, sum > 0.
    gamma_T = 0. Raises ValueError for negative weights or a zero sum."""
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or np.any(v < 0) or not v.sum() > 0:
        raise ValueError("v must be a non-empty 1-D array of weights >= 0 with a positive sum")
    tail = np.cumsum(v[::-1])[::-1]                 # tail[t-1] = v_{t:T}
    return np.append(tail[1:], 0.0) / tail[0]


def ema_weights(T: int, decay: float) -> np.ndarray:
    """The weights v_t = decay^(T - t) of an EMA at step T (proportional to decay^-t)."""
    return decay ** (T - np.arange(1, T + 1, dtype=np.float64))


T_demo = 200
t_demo = np.arange(1, T_demo + 1)
err_uniform = float(np.max(np.abs(averaging_multiplier(np.ones(T_demo)) - (1 - t_demo / T_demo))))
err_ema = max(float(np.max(np.abs(averaging_multiplier(ema_weights(T_demo, g))
                                  - (1 - g ** (T_demo - t_demo)) / (1 - g ** T_demo)))) for g in (0.9, 0.97))
print(f"uniform weights vs 1 - t/T: max error {err_uniform:.1e};  EMA vs eq. (17): max error {err_ema:.1e}")

# %% [markdown]
# ## 2. Training helpers
#
# `batches_for` fixes the mini-batches (the same in every run); `train` runs a rule and records, every
# `eval_every` steps, the test loss of the raw iterate and of `refopt.eval_params` (the average, for an
# averaging rule).

# %%
def batches_for(n_train, batch_size, steps, seed):
    """Index arrays of `steps` mini-batches: epochs of a seeded permutation (the same in every run)."""
    rng = np.random.default_rng(seed)
    out, perm = [], np.empty(0, dtype=np.int64)
    while len(out) < steps:
        if len(perm) < batch_size:
            perm = rng.permutation(n_train)
        out.append(perm[:batch_size])
        perm = perm[batch_size:]
    return out


def train(rule, params, data, batches, eval_every, start=0, keep=()):
    """Train with `rule` on batches[start:]; every `eval_every` steps (and at the first and last) record the
    test loss of the raw iterate and of refopt.eval_params. Returns (steps, raw, eval, final params,
    {step: raw params} for the steps in `keep`)."""
    vg = refopt.value_and_grad(mlp.loss)
    state = refopt.init(rule, params)
    at, raw, ev, kept = [], [], [], {}

    def record(t):
        at.append(t)
        raw.append(float(mlp.loss(params, data.x_test, data.y_test)))
        ev.append(float(mlp.loss(refopt.eval_params(rule, state, params), data.x_test, data.y_test)))

    record(start)
    for t, idx in enumerate(batches[start:], start=start + 1):
        _, grads = vg(params, data.x_train[idx], data.y_train[idx])
        params, state = refopt.update(rule, state, params, grads)
        if t in keep:
            kept[t] = params
        if t % eval_every == 0 or t == len(batches):
            record(t)
    return np.array(at), np.array(raw), np.array(ev), params, kept


params0 = mlp.init(args.seed, [64, args.hidden, 10], dtype=np.float64)
batches = batches_for(len(data.y_train), args.batch_size, args.steps, args.seed)
window = int(round(2.0 / (1.0 - args.ema_decay)))
ends = sorted({int(round(args.steps * (k + 1) / args.branches)) for k in range(args.branches)})
ends = [e - e % args.eval_every for e in ends if e - e % args.eval_every - window >= 0]

# %% [markdown]
# ## 3. Constant lr with its uniform average and its EMA
#
# Two runs of the same SGD, one wrapped in `Average`, one in `EMA`: the raw iterates must be identical bit for
# bit (claim 1). The first run also keeps the iterates where the branches of part 5 start.

# %%
step, loss_const, loss_average, p_const, kept = train(refopt.Average(refopt.SGD(lr=args.lr)), params0, data,
                                                      batches, args.eval_every, keep={e - window for e in ends})
kept[0] = params0
_, loss_raw_e, loss_ema, p_ema, _ = train(refopt.EMA(refopt.SGD(lr=args.lr), decay=args.ema_decay), params0, data,
                                          batches, args.eval_every)
bitwise = all(np.array_equal(a, b) for a, b in zip(refopt.tree.flatten(p_const)[0], refopt.tree.flatten(p_ema)[0]))
bitwise = bool(bitwise and np.array_equal(loss_const, loss_raw_e))
print(f"averaging leaves the trajectory unchanged, bit for bit: {bitwise}")
print(f"test loss at T: raw {loss_const[-1]:.4f}, uniform average {loss_average[-1]:.4f}, EMA {loss_ema[-1]:.4f}")

# %% [markdown]
# ## 4. A linear decay over the whole run, for comparison

# %%
_, loss_linear, _, _, _ = train(refopt.SGD(lr=args.lr, schedule=refopt.schedules.LinearDecay(args.steps)),
                                params0, data, batches, args.eval_every)
print(f"linear decay over the whole run: test loss at T {loss_linear[-1]:.4f}")

# %% [markdown]
# ## 5. Short linear decays branched off the constant-lr run
#
# Each branch restarts from the constant-lr iterate $W$ steps before a branch point and runs the same batches
# with lr $\eta(1 - k/(W+1))$, $k = 1..W$. Compare, at each branch point, its endpoint with the EMA and with the
# raw iterate: the claim is that the EMA is much closer. With the default options it is on average (0.0020
# against 0.0081 nats), at 7 of the 8 points: where the raw iterate happens to sit low, it can be closer.

# %%
curves, branch_loss = {}, []
for e in ends:
    rule = refopt.SGD(lr=args.lr, schedule=refopt.schedules.LinearDecay(window + 1))
    s, raw, _, _, _ = train(rule, kept[e - window], data, batches[:e], max(1, window // 10), start=e - window)
    curves[e] = (s, raw)
    branch_loss.append(raw[-1])
where = {int(t): i for i, t in enumerate(step)}
branch_loss = np.array(branch_loss)
ema_at = np.array([loss_ema[where[e]] for e in ends])
raw_at = np.array([loss_const[where[e]] for e in ends])
for e, b, m, r in zip(ends, branch_loss, ema_at, raw_at):
    print(f"step {e:5d}: decay endpoint {b:.4f}, EMA {m:.4f} (gap {abs(m - b):.4f}), "
          f"raw {r:.4f} (gap {abs(r - b):.4f})")
ema_closer = int(np.sum(np.abs(ema_at - branch_loss) < np.abs(raw_at - branch_loss)))
print(f"mean distance to the decay endpoints: EMA {np.mean(np.abs(ema_at - branch_loss)):.4f}, raw "
      f"{np.mean(np.abs(raw_at - branch_loss)):.4f}; the EMA is closer at {ema_closer} of {len(ends)} points")

# %% [markdown]
# ## 6. Schedule-Free against a tuned linear decay, and warmup
#
# Linear-decay SGD and `ScheduleFreeSGD` over an lr grid (the "tuned" value is the best of the grid), then
# Schedule-Free at lr 3 with and without 100 warmup steps.

# %%
sf_lrs, big_lr, warmup = (0.1, 0.3, 1.0), 3.0, 100
sf_every = max(args.eval_every, args.steps // 30)
sf = {}
for name, make in (("linear", lambda lr: refopt.SGD(lr=lr, schedule=refopt.schedules.LinearDecay(args.steps))),
                   ("schedule_free", lambda lr: refopt.ScheduleFreeSGD(lr=lr))):
    finals, best = [], None
    for lr in sf_lrs:
        sf_step, _, ev, _, _ = train(make(lr), params0, data, batches, sf_every)
        finals.append(ev[-1])
        if best is None or ev[-1] < best[-1]:
            best = ev
    sf[name], sf[f"{name}_best_curve"] = np.array(finals), best
with np.errstate(over="ignore", invalid="ignore"):
    for tag, w in (("no_warmup", 0), ("warmup", warmup)):
        try:
            _, _, ev, _, _ = train(refopt.ScheduleFreeSGD(lr=big_lr, warmup_steps=w), params0, data, batches, sf_every)
        except FloatingPointError:           # diverged: refopt refuses a non-finite gradient
            ev = np.full(len(sf_step), np.nan)
        sf[f"big_{tag}"] = np.where(np.isfinite(ev), ev, np.nan)
print(f"final test loss over lr {list(sf_lrs)}: linear decay {np.round(sf['linear'], 4)}, "
      f"Schedule-Free {np.round(sf['schedule_free'], 4)}")
print(f"Schedule-Free at lr {big_lr:g}: without warmup {sf['big_no_warmup'][-1]:.4f}, "
      f"with {warmup} warmup steps {sf['big_warmup'][-1]:.4f}")

# %% [markdown]
# ## 7. The figure
#
# (a) Eq. (10) computed from the weights (thick) against the closed forms (black). (b) The constant-lr run's
# raw iterate and EMA, and the short decays branched off it (purple, ending at the dots). (c) At each branch
# point, the distance of the EMA and of the raw iterate to the decay's endpoint. (d) Schedule-Free against the
# best linear decay of the grid, and warmup at a large lr.

# %%
fig, axs = plt.subplots(1, 4, figsize=(20, 5.2))
ax = axs[0]
ax.plot(t_demo, averaging_multiplier(np.ones(T_demo)), lw=4, alpha=0.45, color="tab:blue",
        label=r"uniform $v_t$, computed")
ax.plot(t_demo, 1 - t_demo / T_demo, "k:", lw=1.2, label=r"$1 - t/T$")
for g, col in ((0.9, "tab:orange"), (0.97, "tab:green")):
    ax.plot(t_demo, averaging_multiplier(ema_weights(T_demo, g)), lw=4, alpha=0.45, color=col,
            label=rf"EMA $\gamma$={g}, computed")
    ax.plot(t_demo, (1 - g ** (T_demo - t_demo)) / (1 - g ** T_demo), "k--", lw=0.9,
            label=rf"eq. (17), $\gamma$={g}")
ax.set_xlabel("step $t$")
ax.set_ylabel(r"lr multiplier $\gamma_t = v_{t+1:T}\,/\,v_{1:T}$")
ax.set_title("(a) eq. (10): averaging weights as an lr schedule", fontsize=10)
ax = axs[1]
ax.plot(step, loss_const, color="0.6", lw=1, label=rf"SGD, constant lr {args.lr:g}: raw iterate")
ax.plot(step, loss_ema, color="tab:green", lw=2, label=rf"its EMA, $\gamma$={args.ema_decay:g}")
for k, (e, (bs, bl)) in enumerate(curves.items()):
    ax.plot(bs, bl, color="tab:purple", lw=2,
            label=f"linear decay over the last $W$={window} steps" if k == 0 else None)
    ax.plot([e], [bl[-1]], "o", color="tab:purple", ms=5)
ax.set_yscale("log")
ax.set_ylim(None, 0.5)
ax.set_xlabel("step")
ax.set_ylabel("test loss (nats)")
ax.set_title("(b) the EMA runs near the ends of short decays", fontsize=10)
ax = axs[2]
xb = np.arange(len(ends))
ax.bar(xb - 0.2, np.abs(ema_at - branch_loss), width=0.4, color="tab:green", label="|EMA − decay endpoint|")
ax.bar(xb + 0.2, np.abs(raw_at - branch_loss), width=0.4, color="0.6", label="|raw iterate − decay endpoint|")
ax.set_xticks(xb, [str(e) for e in ends], fontsize=8)
ax.set_xlabel("branch point (step)")
ax.set_ylabel("test-loss distance to the decay's endpoint (nats)")
ax.set_title(f"(c) EMA: mean distance {np.mean(np.abs(ema_at - branch_loss)):.4f}, "
             f"raw: {np.mean(np.abs(raw_at - branch_loss)):.4f}", fontsize=10)
ax = axs[3]
ax.plot(sf_step, sf["linear_best_curve"], color="tab:red", lw=1.5,
        label=f"linear decay, best lr of {list(sf_lrs)}")
ax.plot(sf_step, sf["schedule_free_best_curve"], color="tab:blue", lw=1.5,
        label="Schedule-Free SGD, best lr of the grid (evaluated at $x$)")
ax.plot(sf_step, sf["big_no_warmup"], color="tab:orange", ls=":", lw=2, label=f"Schedule-Free lr {big_lr:g}, no warmup")
ax.plot(sf_step, sf["big_warmup"], color="tab:orange", lw=1.5,
        label=f"Schedule-Free lr {big_lr:g}, {warmup} warmup steps")
ax.set_yscale("log")
ax.set_ylim(None, 0.5)
ax.set_xlabel("step")
ax.set_ylabel("test loss (nats)")
ax.set_title("(d) Schedule-Free vs a tuned schedule; warmup", fontsize=10)
for ax in axs:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
fig.tight_layout()
save_figure(fig, args.out, "t02_averaging_as_schedule")

# %% [markdown]
# ## 8. The numbers the claims rest on

# %%
results = dict(steps=args.steps, lr=args.lr, ema_decay=args.ema_decay, hidden=args.hidden,
               batch_size=args.batch_size, seed=args.seed, window=window, err_uniform=err_uniform, err_ema=err_ema,
               bitwise=bitwise, step=step, loss_const=loss_const, loss_average=loss_average, loss_ema=loss_ema,
               loss_linear=loss_linear, branch_end=ends, branch_loss=branch_loss, ema_at_branch=ema_at,
               raw_at_branch=raw_at, ema_closer=ema_closer, branch_start_loss=[curves[e][1][0] for e in ends],
               const_at_branch_start=[loss_const[where[e - window]] if (e - window) in where else None for e in ends],
               sf_lrs=sf_lrs, sf_linear=sf["linear"], sf_schedule_free=sf["schedule_free"], big_lr=big_lr,
               warmup=warmup, big_no_warmup=sf["big_no_warmup"][-1], big_warmup=sf["big_warmup"][-1])
print(save_results(args.out, "t02_averaging_as_schedule", results))

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Which EMA decay $\gamma$ makes the lr multiplier equal to $1/2$ exactly 50 steps before the end
# (for a long run, $T$ = 2000)? Put the number in `answer1`.

# %%
answer1 = None  # your code: a float

# %%
if answer1 is None:
    print("not answered yet")
else:
    m = averaging_multiplier(ema_weights(2000, answer1))[2000 - 50 - 1]
    assert abs(m - 0.5) < 1e-3, f"the multiplier 50 steps before the end is {m:.4f}, not 0.5"
    print(f"correct: multiplier {m:.6f} at t = T - 50")

# %% [markdown]
# **Exercise 2.** Uniform weights act like the linear decay $1 - t/T$. Which weights $v_t$ act like the
# quadratic decay $(1 - t/T)^2$? Put a function `answer2(T)` returning the $T$ weights.

# %%
answer2 = None  # your code: def answer2(T): return ...

# %%
if answer2 is None:
    print("not answered yet")
else:
    T_ex = 300
    t_ex = np.arange(1, T_ex + 1)
    err = np.max(np.abs(averaging_multiplier(answer2(T_ex)) - (1 - t_ex / T_ex) ** 2))
    assert err < 1e-12, f"max error {err:.1e} against (1 - t/T)^2"
    print(f"correct: max error {err:.1e}")

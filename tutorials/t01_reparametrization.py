# %% [markdown]
# # Tutorial 1 — reparametrization: SGD is not covariant, the covariant (ELR) rule is (post 000)
#
# Train ŵ = c·w of the first layer on ℓ̂(ŵ) = ℓ(ŵ/c): the same function, but ∇ℓ̂(ŵ) = ∇ℓ(w)/c, so SGD on
# ŵ with lr η is SGD on w with η/c². (a) SGD on w; (b) SGD on ŵ with the same η (another trajectory);
# (c) SGD on ŵ with η·c² on that layer (reproduces (a) to rounding); (d) `Covariant(SGD(lr=1), lr=elr)` on
# ŵ: w ← w − elr·‖w‖ g/‖g‖ satisfies φ(c₁w, c₂g) = c₁φ(w, g) (eq. (phi)), so its trajectory mapped back is
# the same for every c. Details in the docstring below.
#
# Run: `python tutorials/t01_reparametrization.py --out DIR` (about 30 s). Writes DIR/t01_reparametrization.png.

# %%
"""Tutorial 1 -- reparametrization: SGD is not covariant, the covariant (ELR) rule is.

Claim (post 000, "Reparametrization" and eq. (phi)): write one layer's weight as w = w_hat / c, i.e. train
w_hat = c*w on the loss l_hat(w_hat) = l(w_hat / c). This is the same function, but

    grad l_hat(w_hat) = grad l(w) / c,  so  SGD on w_hat with lr eta' moves w by -(eta'/c^2) grad l(w):

SGD on w_hat is SGD on w with learning rate eta'/c^2 (the seed's "c^-2 eta"). Hence

  (a) SGD on w, lr eta                          -- the reference trajectory;
  (b) SGD on w_hat, the SAME lr eta             -- a different trajectory (slower for c > 1, faster or
                                                   divergent for c < 1): SGD is not covariant;
  (c) SGD on w_hat, lr eta*c^2                  -- reproduces (a) mapped back (w = w_hat/c) to rounding;
  (d) Covariant(SGD(lr=1), lr=elr) on w_hat     -- w <- w - elr*||w|| g/||g|| (eq. (elr-g)) satisfies
      phi(c1 w, c2 g) = c1 phi(w, g) (eq. (phi)), so its trajectory mapped back is the SAME for every c,
      with no retuning.

Only the first layer's weight is reparametrized; the other arrays get plain SGD with lr eta in every run
(via refopt.Partition in (d)). The MLP is ``refopt.models.mlp`` on the 8x8 digits, float64, trained
with mini-batches in a fixed order (the same batches in every run).

Run from the repository root:  python tutorials/t01_reparametrization.py [--out DIR] [--steps N]
It writes DIR/t01_reparametrization.png and prints the max relative deviation of the mapped-back weights.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:  # run as `python tutorials/t01_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import mlp
from refopt.models.data import load_digits

SCALED = "layers[0].w"  # the leaf that is reparametrized (the first layer's weight)
CS = (1.0, 10.0, 0.1)


# %% [markdown]
# ## The reparametrized loss

# %%

def reparam_loss(c: float):
    """l_hat(params_hat) = l(params) with params[SCALED] = params_hat[SCALED] / c (the rest unchanged)."""

    def loss(params_hat, x, y):
        layers = list(params_hat["layers"])
        layers[0] = {"w": layers[0]["w"] / c, "b": layers[0]["b"]}
        return mlp.loss({"layers": layers}, x, y)

    return loss


def to_hat(params, c: float):
    """w_hat = c*w for the scaled leaf; every other array copied."""
    layers = [{k: v.copy() for k, v in layer.items()} for layer in params["layers"]]
    layers[0]["w"] = layers[0]["w"] * c
    return {"layers": layers}


def from_hat(params_hat, c: float):
    """w = w_hat / c for the scaled leaf (the map back to the original parametrization)."""
    return to_hat(params_hat, 1.0 / c) if c != 1.0 else params_hat


def rel_dev(p, q) -> float:
    """max over arrays of ||p_i - q_i||_F / ||q_i||_F (0 where both are zero, e.g. zero-initialised biases)."""
    out = 0.0
    for a, b in zip(refopt.tree.flatten(p)[0], refopt.tree.flatten(q)[0]):
        num, den = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
        if num > 0.0:
            out = max(out, num / den if den > 0.0 else np.inf)
    return out


# %% [markdown]
# ## Training the four runs

# %%

def _batches(n_train: int, batch_size: int, steps: int, seed: int):
    """Index arrays of `steps` mini-batches: epochs of a seeded permutation (the same in every run)."""
    rng = np.random.default_rng(seed)
    out, perm = [], np.empty(0, dtype=np.int64)
    while len(out) < steps:
        if len(perm) < batch_size:
            perm = rng.permutation(n_train)
        out.append(perm[:batch_size])
        perm = perm[batch_size:]
    return out


def _train(rule, params0, c, data, batches):
    """Train on l_hat with parameters params0 (already in the hat parametrization). Returns the list of
    mapped-back params after every step (index 0 = init) and the full training loss at each of them.
    Stops early (padding the losses with nan) if the run diverges (a nan/inf gradient or loss)."""
    vg = refopt.value_and_grad(reparam_loss(c))
    params, state = params0, refopt.init(rule, params0)
    traj = [from_hat(params, c)]
    with np.errstate(over="ignore", invalid="ignore"):
        losses = [float(mlp.loss(traj[0], data.x_train, data.y_train))]
        for idx in batches:
            _, grads = vg(params, data.x_train[idx], data.y_train[idx])
            try:
                params, state = refopt.update(rule, state, params, grads)
            except FloatingPointError:  # refopt refuses nan/inf gradients: the run diverged
                break
            traj.append(from_hat(params, c))
            loss = float(mlp.loss(traj[-1], data.x_train, data.y_train))
            if not np.isfinite(loss):
                losses.append(np.nan)
                break
            losses.append(loss)
    losses += [np.nan] * (len(batches) + 1 - len(losses))
    return traj, np.array(losses)


def run(steps: int = 200, c: float = 10.0, lr: float = 0.1, elr: float = 0.01, hidden: int = 32,
        batch_size: int = 128, seed: int = 0, data=None) -> dict:
    """Train the five runs (a)-(d) of the module docstring (and the Covariant run on w itself, c = 1) for
    `steps` steps from the same init on the same batches.

    Returns a dict of numpy arrays of length steps+1 (index 0 = init):
      loss_sgd, loss_sgd_same_lr, loss_sgd_scaled_lr, loss_cov_ref, loss_cov  -- training loss of (a), (b),
          (c), Covariant on w (c = 1) and (d) on w_hat;
      dev_same_lr, dev_scaled_lr -- rel_dev of (b), (c) mapped back vs (a) at each step (nan after a
          divergence); dev_cov -- rel_dev of (d) mapped back vs the Covariant run on w;
    and the floats max_dev_same_lr, max_dev_scaled_lr, max_dev_cov (max over the steps both runs made;
    inf if (b) diverged), plus the settings (c, lr, elr, steps, ...).
    """
    data = data if data is not None else load_digits(dtype=np.float64)
    params = mlp.init(seed, [64, hidden, 10], dtype=np.float64)
    batches = _batches(len(data.y_train), batch_size, steps, seed)
    p_hat = to_hat(params, c)

    def covariant():
        return refopt.Partition(
            rules={"scaled": refopt.Covariant(refopt.SGD(lr=1.0), lr=elr), "other": refopt.SGD(lr=lr)},
            labels=lambda path, x: "scaled" if path == SCALED else "other")

    ref, loss_a = _train(refopt.SGD(lr=lr), params, 1.0, data, batches)
    same, loss_b = _train(refopt.SGD(lr=lr), p_hat, c, data, batches)
    # per-group learning rates through Partition: eta*c^2 on the scaled leaf, eta elsewhere
    scaled_rule = refopt.Partition(rules={"scaled": refopt.SGD(lr=lr * c * c), "other": refopt.SGD(lr=lr)},
                                   labels=lambda path, x: "scaled" if path == SCALED else "other")
    scaled, loss_c = _train(scaled_rule, p_hat, c, data, batches)
    cov_ref, loss_cr = _train(covariant(), params, 1.0, data, batches)
    cov, loss_d = _train(covariant(), p_hat, c, data, batches)

    def devs(traj, base):
        d = np.full(steps + 1, np.nan)
        for i, (p, q) in enumerate(zip(traj, base)):
            d[i] = rel_dev(p, q)
        return d

    out = dict(c=c, lr=lr, elr=elr, steps=steps, hidden=hidden, batch_size=batch_size, seed=seed,
               loss_sgd=loss_a, loss_sgd_same_lr=loss_b, loss_sgd_scaled_lr=loss_c,
               loss_cov_ref=loss_cr, loss_cov=loss_d,
               dev_same_lr=devs(same, ref), dev_scaled_lr=devs(scaled, ref), dev_cov=devs(cov, cov_ref))
    out["diverged_same_lr"] = len(same) < steps + 1
    for k in ("same_lr", "scaled_lr", "cov"):
        out[f"max_dev_{k}"] = float(np.nanmax(out[f"dev_{k}"]))
    if out["diverged_same_lr"]:
        out["max_dev_same_lr"] = np.inf
    return out


# %% [markdown]
# ## Figure and printout

# %%

def plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    r0 = results[0]
    steps = np.arange(r0["steps"] + 1)
    ax1.plot(steps, r0["loss_sgd"], color="black", lw=2.5, label=f"(a) SGD on w, lr={r0['lr']:g}")
    ax2.plot(steps, r0["loss_cov_ref"], color="black", lw=2.5, label=f"Covariant on w, elr={r0['elr']:g}")
    colors = {1.0: "tab:blue", 10.0: "tab:orange", 0.1: "tab:green"}
    for r in results:
        col = colors.get(r["c"], None)
        if r["c"] != 1.0:
            tag = " (diverged)" if r["diverged_same_lr"] else ""
            ax1.plot(steps, r["loss_sgd_same_lr"], color=col, lw=1.3,
                     label=f"(b) w_hat=c·w, c={r['c']:g}, same lr{tag}")
            ax1.plot(steps, r["loss_sgd_scaled_lr"], color=col, ls=":", lw=2,
                     label=f"(c) c={r['c']:g}, lr·c²={r['lr'] * r['c'] ** 2:g}")
        ax2.plot(steps, r["loss_cov"], color=col, ls="--", lw=1.5,
                 label=f"(d) Covariant on w_hat, c={r['c']:g} (max rel dev {r['max_dev_cov']:.0e})")
    ax1.set_title("SGD: the trajectory depends on the parametrization")
    ax2.set_title("Covariant(SGD): the same trajectory for every c")
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylabel("training loss (nats)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate eta")
    ap.add_argument("--elr", type=float, default=0.01, help="Covariant effective learning rate on layer 0")
    ap.add_argument("--hidden", type=int, default=32, help="hidden width of the MLP 64-hidden-10")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    os.makedirs(a.out, exist_ok=True)
    data = load_digits(dtype=np.float64)
    results = [run(a.steps, c, a.lr, a.elr, a.hidden, a.batch_size, a.seed, data=data) for c in CS]
    print(f"max relative deviation of the mapped-back weights from the reference over {a.steps} steps")
    print(f"{'c':>5}  {'(b) SGD same lr':>16}  {'(c) SGD lr*c^2':>15}  {'(d) Covariant':>14}")
    for r in results:
        b = "diverged" if r["diverged_same_lr"] else f"{r['max_dev_same_lr']:.2e}"
        print(f"{r['c']:>5g}  {b:>16}  {r['max_dev_scaled_lr']:>15.2e}  {r['max_dev_cov']:>14.2e}")
    print(f"final training loss: (a) SGD {results[0]['loss_sgd'][-1]:.4f}, "
          f"Covariant {results[0]['loss_cov_ref'][-1]:.4f}")
    path = os.path.join(a.out, "t01_reparametrization.png")
    plot(results, path)
    print(f"wrote {path}")
    return results


# %%
if __name__ == "__main__":
    main()

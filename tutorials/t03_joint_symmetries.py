# %% [markdown]
# # Tutorial 3 — joint symmetries of a pre-norm GPT, and the gradient identity (post 000)
#
# **Claim** (post 000, "Joint symmetries"). A pre-norm transformer is *not* invariant to the scale of a
# single weight (the norm removes the scale of a layer's input, not of its own weight), but it is
# invariant to joint rescalings ℓ(c·w₁, c⁻¹·w₂) = ℓ(w₁, w₂), c > 0:
#
# 1. (W_q, W_k), (W_v, W_o) in attention; (W_up, W_down) in the GLU;
# 2. with a ReLU gate: (W_gate, W_down) and (W_gate, W_up);
# 3. [W_q, W_k, W_v] jointly with the gain of that block's RMSNorm; 4. [W_up, W_gate] with theirs;
# 5. the final RMSNorm gain with the LM head;
#
# and (post 000's "embedding + all output matrices jointly") scaling the embeddings wte, wpe **and every
# output matrix** (W_o and W_down of each block) by the same c: the residual stream is multiplied by c,
# every RMSNorm removes it, so the logits do not change. This one holds exactly only with an **untied**
# head (with the tied head wte is also the head, so the logits scale by c) and with the norms' eps = 0.
#
# Differentiating a joint symmetry at c = 1 gives the **gradient identity**
# Σ_up ⟨w, ∇_w ℓ⟩ − Σ_down ⟨w, ∇_w ℓ⟩ = 0 at every point; the per-weight terms ⟨w, ∇_w ℓ⟩ (zero under
# single-weight scale invariance, the assumption behind the ELR story) do **not** vanish.
#
# What the script does: a tiny GPT (2 layers, width 32, ReGLU FFN so that every symmetry of the list
# exists, untied head, norm_eps = 0, float64) on CPython's docs text; (a) the relative loss change of each
# symmetry at c = 2.5 and with a random per-channel c; (b) the embedding + outputs scaling for the untied
# head with eps = 0, with eps = 1e-6 and with the tied head; (c) the loss change when one weight alone
# is scaled; (d) along an AdamW training run, the identity's residual next to the per-weight terms.
#
# Run: `python tutorials/t03_joint_symmetries.py --out DIR` (about 15 s). Writes DIR/t03_joint_symmetries.png.

# %%
"""Tutorial 3 -- joint symmetries of a pre-norm GPT and the gradient identity (post 000)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

try:  # run as `python tutorials/t03_...py` from a checkout without `pip install .`
    import refopt  # noqa: F401
    import refopt.models  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the script is launched
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import refopt
from refopt.cli.output import parse_script_args
from refopt.models import gpt, symmetries
from refopt.models.data import CharVocab, get_batch, load_text

# %% [markdown]
# ## The model and a fixed batch

# %%


def setup(n_layer=2, n_embd=32, n_head=4, block=16, batch=8, tie_head=False, norm_eps=0.0, seed=0):
    """(config, params, loss(params), data ids): a tiny float64 GPT and a fixed batch of the default text."""
    corpus = load_text()
    vocab = CharVocab(corpus.text)
    ids = vocab.encode(corpus.text[:200_000])
    config = gpt.GPTConfig(vocab_size=vocab.size, block_size=block, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, ffn="reglu", tie_head=tie_head, norm_eps=norm_eps)
    params = gpt.init(config, seed=seed, dtype=np.float64)
    x, y = get_batch(ids, block, batch, np.random.default_rng(seed))
    return config, params, (lambda p: float(gpt.loss(p, x, y, config))), ids


def scale_embedding_and_outputs(params, c: float):
    """wte, wpe and every output matrix (W_o, W_down of each block) times c; new params, input untouched."""
    out = {**params, "wte": params["wte"] * c, "wpe": params["wpe"] * c,
           "blocks": [{**b, "attn": {**b["attn"], "w_o": b["attn"]["w_o"] * c},
                       "mlp": {**b["mlp"], "w_down": b["mlp"]["w_down"] * c}} for b in params["blocks"]]}
    return out


def _leaf(tree, member: str):
    """A top-level leaf ('wte') or a member of block 0 ('attn.w_q')."""
    if member in tree:
        return tree[member]
    node = tree["blocks"][0]
    for key in member.split("."):
        node = node[key]
    return node


def embedding_identity(params, grads) -> tuple[float, float]:
    """(residual, scale) of the embedding symmetry's identity sum <w, g> over wte, wpe, W_o, W_down = 0."""
    terms = [np.vdot(params[k], grads[k]) for k in ("wte", "wpe")]
    for b, gb in zip(params["blocks"], grads["blocks"]):
        terms += [np.vdot(b["attn"]["w_o"], gb["attn"]["w_o"]), np.vdot(b["mlp"]["w_down"], gb["mlp"]["w_down"])]
    return float(sum(terms)), float(sum(abs(t) for t in terms))


# %% [markdown]
# ## (a)-(c): which rescalings leave the loss unchanged (measured at the end of the run (d))

# %%
SINGLE = ["attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o", "mlp.w_up", "mlp.w_gate", "mlp.w_down", "attn_norm"]


def invariances(params, config, x, y, c: float = 2.5, seed: int = 0) -> dict:
    """Relative loss changes |l(T(w)) - l(w)| / l(w) at ``params`` (a point of a training run) for every
    joint symmetry (scalar c and a random per-channel c), for the embedding + outputs scaling (untied
    with eps = 0 as configured, then the same weights with eps = 1e-6, then with the head tied to wte),
    and for single weights of block 0 scaled alone."""
    loss_of = lambda p, cfg: float(gpt.loss(p, x, y, cfg))  # noqa: E731
    l0 = loss_of(params, config)
    rel = lambda p: abs(loss_of(p, config) - l0) / l0  # noqa: E731
    rng = np.random.default_rng(seed + 1)
    joint, per_channel = {}, {}
    for name in symmetries.available(config):
        layer = None if name == "final_norm" else 0
        joint[name] = rel(symmetries.transform(params, config, name, c, layer))
        n = config.ffn_hidden if symmetries.table(config)[name].dim == "F" else config.n_embd
        per_channel[name] = rel(symmetries.transform(params, config, name, rng.uniform(0.5, 2.0, n), layer))
    emb = {"untied, eps=0": rel(scale_embedding_and_outputs(params, c))}
    cfg_eps = dataclasses.replace(config, norm_eps=1e-6)
    emb["untied, eps=1e-6"] = abs(loss_of(scale_embedding_and_outputs(params, c), cfg_eps)
                                  - loss_of(params, cfg_eps)) / loss_of(params, cfg_eps)
    cfg_tied = dataclasses.replace(config, tie_head=True)
    tied = {k: v for k, v in params.items() if k != "lm_head"}
    emb["tied head, eps=0"] = abs(loss_of(scale_embedding_and_outputs(tied, c), cfg_tied)
                                  - loss_of(tied, cfg_tied)) / loss_of(tied, cfg_tied)
    single = {m: rel(symmetries.rescale(params, config, [(m, 0)], [], c, layer=0)) for m in SINGLE}
    return dict(loss=l0, joint=joint, per_channel=per_channel, embedding=emb, single=single, c=c)


# %% [markdown]
# ## (d): the gradient identity along a training run
# At each recorded step, for every symmetry: the residual Σ_up⟨w,g⟩ − Σ_down⟨w,g⟩, relative to
# Σ|⟨w,g⟩| (so 1e-16 is rounding), and the per-weight terms |⟨w,g⟩| / (‖w‖‖g‖) (the cosine between a weight
# and its gradient, which single-weight scale invariance would make 0).

# %%


def identity_along_training(steps: int = 60, every: int = 5, lr: float = 3e-3, seed: int = 0, **kw) -> dict:
    config, params, _, ids = setup(seed=seed, **kw)
    vg = refopt.value_and_grad(lambda p, x, y: gpt.loss(p, x, y, config))
    rule = refopt.AdamW(lr=lr, weight_decay=0.1)
    state = refopt.init(rule, params)
    rng = np.random.default_rng(seed + 2)
    names = symmetries.available(config)
    rec = {"step": [], "residual": {n: [] for n in names + ["embedding"]}, "cosine": {}}
    for t in range(steps + 1):
        x, y = get_batch(ids, config.block_size, 8, rng)
        _, g = vg(params, x, y)
        if t % every == 0:
            rec["step"].append(t)
            for n in names:
                layer = None if n == "final_norm" else 0
                idn = symmetries.gradient_identity(params, g, config, n, layer)
                rec["residual"][n].append(abs(idn.residual) / idn.dot_scale)
            r, s = embedding_identity(params, g)
            rec["residual"]["embedding"].append(abs(r) / s)
            for m in SINGLE + ["wte", "final_norm", "lm_head"]:
                w, gw = _leaf(params, m), _leaf(g, m)
                cos = abs(float(np.vdot(w, gw))) / (np.linalg.norm(w) * np.linalg.norm(gw))
                rec["cosine"].setdefault(m, []).append(cos)
        if t < steps:
            params, state = refopt.update(rule, state, params, g)
    rec["max_residual"] = max(max(v) for v in rec["residual"].values())
    rec["params"], rec["config"], rec["batch"] = params, config, (x, y)
    rec["median_cosine"] = {m: float(np.median(v)) for m, v in rec["cosine"].items()}
    return rec


# %% [markdown]
# ## Figure and printout

# %%


def plot(inv: dict, tr: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    floor = 1e-18
    labels = ([f"{n}" for n in inv["joint"]] + [f"emb+outputs ({k})" for k in inv["embedding"]]
              + [f"{m} alone" for m in inv["single"]])
    vals = list(inv["joint"].values()) + list(inv["embedding"].values()) + list(inv["single"].values())
    colors = (["tab:green"] * len(inv["joint"]) + ["tab:green", "tab:orange", "tab:red"]
              + ["tab:red"] * len(inv["single"]))
    ax1.barh(range(len(vals)), [max(v, floor) for v in vals], color=colors)
    ax1.set_yticks(range(len(vals)), labels, fontsize=7)
    ax1.set_xscale("log")
    ax1.invert_yaxis()
    ax1.set_xlabel(f"relative loss change at c = {inv['c']:g} (floor {floor:g})")
    ax1.set_title("joint rescalings keep the loss (green); single weights do not (red)", fontsize=9)
    s = tr["step"]
    for n, v in tr["residual"].items():
        ax2.plot(s, np.maximum(v, floor), color="tab:green", lw=1, alpha=0.7)
    cosine_colors = plt.cm.tab20(np.linspace(0, 1, max(len(tr["cosine"]), 1)))   # one colour per weight
    for (m, v), c in zip(tr["cosine"].items(), cosine_colors):
        ax2.plot(s, v, lw=1.2, ls="--", color=c, label=f"|<w,g>|/(|w||g|): {m}")
    ax2.plot([], [], color="tab:green", label="identity residual (each symmetry), relative")
    ax2.set_yscale("log")
    ax2.set_xlabel("AdamW step")
    ax2.set_ylabel("relative residual; |cosine|")
    ax2.set_title("gradient identity holds to rounding; per-weight terms do not vanish", fontsize=9)
    ax2.legend(fontsize=6, ncol=2)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="runs/tutorials", help="output folder")
    ap.add_argument("--steps", type=int, default=60, help="AdamW steps of the identity run")
    ap.add_argument("--c", type=float, default=2.5, help="the scale of the rescalings")
    ap.add_argument("--seed", type=int, default=0, help="seed of the GPT init and the batches")
    a = parse_script_args(ap, argv)   # a notebook kernel's "-f KERNEL.json" ignored, a mistyped option refused
    os.makedirs(a.out, exist_ok=True)
    tr = identity_along_training(a.steps, seed=a.seed)
    inv = invariances(tr["params"], tr["config"], *tr["batch"], c=a.c, seed=a.seed)
    print(f"after {a.steps} AdamW steps: batch loss {inv['loss']:.4f}; relative loss change at c = {a.c:g}:")
    for n in inv["joint"]:
        print(f"  joint {n:<11} scalar {inv['joint'][n]:.1e}   per-channel {inv['per_channel'][n]:.1e}")
    for k, v in inv["embedding"].items():
        print(f"  embedding + all output matrices, {k:<17} {v:.1e}")
    for k, v in inv["single"].items():
        print(f"  {k} alone (block 0)  {v:.1e}")
    print(f"gradient identity over {a.steps} AdamW steps: max relative residual {tr['max_residual']:.1e}")
    print("median |<w,g>|/(||w|| ||g||) per weight (0 under single-weight scale invariance):")
    print("  " + ", ".join(f"{m} {v:.2f}" for m, v in tr["median_cosine"].items()))
    path = os.path.join(a.out, "t03_joint_symmetries.png")
    plot(inv, tr, path)
    print(f"wrote {path}")
    return {"invariances": inv, "training": tr}


# %%
if __name__ == "__main__":
    main()

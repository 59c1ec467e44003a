# %% [markdown]
# # Tutorial 3 — joint symmetries of a pre-norm GPT, and the gradient identity
#
# **Claim** (post 000, "Joint symmetries"). A pre-norm transformer is *not* invariant to the scale of a
# single weight (the norm removes the scale of a layer's input, not of its own weight), but it is
# invariant to joint rescalings $\ell(c\,w_1, c^{-1}w_2) = \ell(w_1, w_2)$, $c > 0$:
#
# 1. $(W_q, W_k)$, $(W_v, W_o)$ in attention; $(W_{\rm up}, W_{\rm down})$ in the GLU;
# 2. with a ReLU gate: $(W_{\rm gate}, W_{\rm down})$ and $(W_{\rm gate}, W_{\rm up})$;
# 3. $[W_q, W_k, W_v]$ jointly with the gain of that block's RMSNorm; 4. $[W_{\rm up}, W_{\rm gate}]$ with theirs;
# 5. the final RMSNorm gain with the LM head;
#
# and scaling the embeddings wte, wpe **and every output matrix** ($W_o$, $W_{\rm down}$ of each block) by the
# same $c$: the residual stream is multiplied by $c$, every RMSNorm removes it, so the logits do not change.
# This one holds exactly only with an **untied** head and with the norms' eps = 0.
# Differentiating a joint symmetry at $c = 1$ gives the **gradient identity**
# $\sum_{\rm up}\langle w, \nabla_w\ell\rangle - \sum_{\rm down}\langle w, \nabla_w\ell\rangle = 0$ at every
# point; the per-weight terms $\langle w, \nabla_w\ell\rangle$ (zero under single-weight scale invariance, the
# assumption behind the ELR story) do **not** vanish.
#
# **What this notebook shows.** A tiny GPT (2 layers, width 32, ReGLU FFN so that every symmetry of the list
# exists, untied head, norm eps = 0, float64) on CPython's docs text, trained 60 AdamW steps: (a) the relative
# loss change of each symmetry at $c = 2.5$ and with a random per-channel $c$; (b) the embedding + outputs
# scaling, untied with eps = 0, with eps = 1e-6, and with the tied head; (c) one weight scaled alone; (d) along
# the training run, the identity's residual next to the per-weight cosines $|\langle w, g\rangle|/(\|w\|\|g\|)$.
#
# **Run time.** About 17 s as a script (load average about 6 on the shared 2-core machine). As a script:
# `python tutorials/t03_joint_symmetries.py --out DIR` writes `DIR/t03_joint_symmetries.png` and `.json`.

# %%
import argparse
import dataclasses

import matplotlib.pyplot as plt
import numpy as np

import refopt
from refopt.cli.output import parse_script_args, save_figure, save_results, tutorial_out
from refopt.models import gpt, symmetries
from refopt.models.data import CharVocab, get_batch, load_text

ap = argparse.ArgumentParser(description="Tutorial 3: joint symmetries of a pre-norm GPT and the gradient "
                                         "identity (post 000)")
ap.add_argument("--out", default=tutorial_out(), help="output folder")
ap.add_argument("--steps", type=int, default=60, help="AdamW steps of the identity run")
ap.add_argument("--c", type=float, default=2.5, help="the scale of the rescalings")
ap.add_argument("--seed", type=int, default=0, help="random seed of the GPT init and the batches")
args = parse_script_args(ap)
if args.steps < 0 or not args.c > 0:
    ap.error("--steps must be >= 0 and --c > 0")

# %% [markdown]
# ## 1. The model, and the helpers
#
# `setup` builds the tiny float64 GPT and its token ids; `scale_embedding_and_outputs` multiplies wte, wpe and
# every output matrix by $c$; `embedding_identity` is that symmetry's gradient identity
# $\sum\langle w, g\rangle = 0$ over those arrays (a residual and its scale $\sum|\langle w, g\rangle|$).

# %%
SINGLE = ["attn.w_q", "attn.w_k", "attn.w_v", "attn.w_o", "mlp.w_up", "mlp.w_gate", "mlp.w_down", "attn_norm"]


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
# ## 2. The gradient identity along a training run
#
# 60 AdamW steps; every 5 steps, for every symmetry, the residual $\sum_{\rm up}\langle w,g\rangle -
# \sum_{\rm down}\langle w,g\rangle$ relative to $\sum|\langle w,g\rangle|$ (so 1e-16 is rounding), and each
# weight's cosine $|\langle w, g\rangle|/(\|w\|\|g\|)$, which single-weight scale invariance would make 0.

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

tr = identity_along_training(args.steps, seed=args.seed)
print(f"gradient identity over {args.steps} AdamW steps: max relative residual {tr['max_residual']:.1e}")
print("median |<w,g>|/(||w|| ||g||) per weight (0 under single-weight scale invariance):")
print("  " + ", ".join(f"{m} {v:.2f}" for m, v in tr["median_cosine"].items()))

# %% [markdown]
# ## 3. Which rescalings leave the loss unchanged
#
# At the end of the run, the relative loss change $|\ell(T(w)) - \ell(w)|/\ell(w)$ for every joint symmetry
# (scalar $c$ and a random per-channel $c$), for the embedding + outputs scaling in its three variants, and for
# single weights of block 0 scaled alone.

# %%


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

inv = invariances(tr["params"], tr["config"], *tr["batch"], c=args.c, seed=args.seed)
print(f"after {args.steps} AdamW steps: batch loss {inv['loss']:.4f}; relative loss change at c = {args.c:g}:")
for n in inv["joint"]:
    print(f"  joint {n:<11} scalar {inv['joint'][n]:.1e}   per-channel {inv['per_channel'][n]:.1e}")
for k, v in inv["embedding"].items():
    print(f"  embedding + all output matrices, {k:<17} {v:.1e}")
for k, v in inv["single"].items():
    print(f"  {k} alone (block 0)  {v:.1e}")

# %% [markdown]
# ## 4. The figure
#
# Left: the relative loss change of each rescaling on a log scale (values below $10^{-18}$ drawn at
# $10^{-18}$; the grey band is rounding, 1 to 100 times float64's machine epsilon). Right: along training, the
# largest relative residual of the gradient identities (over all symmetries) and the per-weight cosines (the
# band spans the 11 weights, the line is their median).

# %%
floor, eps = 1e-18, np.finfo(np.float64).eps
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.4), gridspec_kw={"width_ratios": [1.1, 1]})
labels = ([f"joint: {n}" for n in inv["joint"]] + [f"wte, wpe, outputs ({k})" for k in inv["embedding"]]
          + [f"{m} alone" for m in inv["single"]])
vals = list(inv["joint"].values()) + list(inv["embedding"].values()) + list(inv["single"].values())
colors = (["tab:green"] * len(inv["joint"]) + ["tab:green", "tab:orange", "tab:red"]
          + ["tab:red"] * len(inv["single"]))
ax1.axvspan(eps, 100 * eps, color="0.85", zorder=0)
ax1.barh(range(len(vals)), [max(v, floor) for v in vals], color=colors, zorder=2)
ax1.set_yticks(range(len(vals)), labels, fontsize=8)
ax1.set_xscale("log")
ax1.set_xlim(floor / 3, 1)
ax1.invert_yaxis()
ax1.set_xlabel(rf"relative loss change $|\ell(T(w)) - \ell(w)|\,/\,\ell(w)$ at $c$ = {inv['c']:g}")
ax1.set_title("green: symmetries (unchanged to rounding); orange: eps = 1e-6 breaks it slightly;\n"
              "red: not a symmetry (tied head, one weight alone)", fontsize=9)
s = tr["step"]
resid = np.max(np.array(list(tr["residual"].values())), axis=0)
cos = np.array(list(tr["cosine"].values()))
ax2.axhspan(eps, 100 * eps, color="0.85", zorder=0)
ax2.plot(s, np.maximum(resid, floor), color="tab:green", lw=2,
         label="gradient identity: largest relative residual over the symmetries")
ax2.fill_between(s, cos.min(0), cos.max(0), color="tab:red", alpha=0.25, lw=0)
ax2.plot(s, np.median(cos, axis=0), color="tab:red", lw=2,
         label=r"per weight: $|\langle w, g\rangle|/(\|w\|\,\|g\|)$, median and range over 11 weights")
ax2.set_yscale("log")
ax2.set_ylim(floor / 3, 3)
ax2.set_xlabel("AdamW step")
ax2.set_title("the identity holds to rounding; the per-weight terms do not vanish", fontsize=9)
ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
fig.tight_layout()
save_figure(fig, args.out, "t03_joint_symmetries")

# %% [markdown]
# ## 5. The numbers the claim rests on

# %%
results = dict(steps=args.steps, c=args.c, seed=args.seed, loss=inv["loss"], joint=inv["joint"],
               per_channel=inv["per_channel"], embedding=inv["embedding"], single=inv["single"],
               step=tr["step"], max_residual=tr["max_residual"], median_cosine=tr["median_cosine"])
print(save_results(args.out, "t03_joint_symmetries", results))

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** Write the $(W_q, W_k)$ symmetry of block 0 by hand, without `refopt.models.symmetries`: a
# function `answer1(params, c)` that returns new parameters with block 0's `attn.w_q` multiplied by $c$ and
# its `attn.w_k` by $1/c$ (leave the input untouched). The check asks for an unchanged loss and changed weights.

# %%
answer1 = None  # your code: def answer1(params, c): ...

# %%
config, params, x, y = tr["config"], tr["params"], *tr["batch"]


def check_exercise_1(transform, c=3.0):
    """(relative loss change, relative change of W_q) of `transform` at the end of the run."""
    new = transform(params, c)
    l0 = float(gpt.loss(params, x, y, config))
    dl = abs(float(gpt.loss(new, x, y, config)) - l0) / l0
    wq0, wq = params["blocks"][0]["attn"]["w_q"], new["blocks"][0]["attn"]["w_q"]
    return dl, float(np.linalg.norm(wq - wq0) / np.linalg.norm(wq0))


if answer1 is None:
    print("not answered yet")
else:
    dl, dw = check_exercise_1(answer1)
    assert dw > 0.1, "W_q did not change"
    assert dl < 1e-13, f"the loss changed by {dl:.1e} (relative): not a symmetry"
    print(f"correct: W_q changed by {dw:.2f} (relative), the loss by {dl:.1e}")

# %% [markdown]
# **Exercise 2.** With the head **tied** to wte, scaling wte, wpe and every output matrix by $c$ is not a
# symmetry. By which factor are the logits multiplied? Put a function of $c$ in `answer2`; the check compares
# it with the logits of the tied model (`gpt.apply`) at $c = 2.5$.

# %%
answer2 = None  # your code: lambda c: ...

# %%
def check_exercise_2(factor, c=2.5):
    cfg = dataclasses.replace(config, tie_head=True)
    tied = {k: v for k, v in params.items() if k != "lm_head"}
    logits = gpt.apply(tied, x, cfg)
    scaled = gpt.apply(scale_embedding_and_outputs(tied, c), x, cfg)
    return float(np.max(np.abs(scaled - factor(c) * logits)) / np.max(np.abs(logits)))


if answer2 is None:
    print("not answered yet")
else:
    err = check_exercise_2(answer2)
    assert err < 1e-12, f"the scaled logits are not factor(c) times the logits (max error {err:.1e})"
    print(f"correct: the logits scale by {answer2(2.5):g} at c = 2.5 (error {err:.1e})")

"""models.symmetries (post 000): exact invariance of the logits, negative controls, and the gradient
identity sum_up <w, g> - sum_down <w, g> = 0 for every joint symmetry, in float64."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import refopt
from refopt.models import gpt
from refopt.models import symmetries as sy
from refopt.autograd import value_and_grad


def make(ffn="reglu", tie_head=False, qk_norm=False, qk_norm_gain=True, n_layer=2, n_head=2, hs=3, seed=0):
    cfg = gpt.GPTConfig(vocab_size=7, block_size=5, n_layer=n_layer, n_head=n_head, n_embd=n_head * hs,
                        ffn=ffn, ffn_hidden=10, tie_head=tie_head, qk_norm=qk_norm, qk_norm_gain=qk_norm_gain,
                        norm_eps=0.0 if qk_norm else 1e-6, init_std=0.5)
    p = gpt.init(cfg, seed, np.float64)
    r = np.random.default_rng(seed + 1)
    leaves, _, td = refopt.tree.flatten(p)
    p = refopt.tree.unflatten(td, [r.uniform(0.5, 1.5, x.shape) if x.ndim == 1 else x for x in leaves])
    x = r.integers(0, cfg.vocab_size, (2, cfg.block_size))
    y = r.integers(0, cfg.vocab_size, (2, cfg.block_size))
    return cfg, p, x, y


def rel_change(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))


configs = st.builds(lambda ffn, tie, qk, gain, L, H, hs, seed: (ffn, tie, qk, gain, L, H, hs, seed),
                    st.sampled_from(gpt.FFN_KINDS), st.booleans(), st.booleans(), st.booleans(),
                    st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1000))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(conf=configs, data=st.data())
def test_logits_invariant(conf, data):
    ffn, tie, qk, gain, L, H, hs, seed = conf
    cfg, p, x, _ = make(ffn, tie, qk, gain, L, H, hs, seed)
    name = data.draw(st.sampled_from(sy.available(cfg)), label="symmetry")
    sym = sy.table(cfg)[name]
    layer = data.draw(st.integers(0, L - 1), label="layer") if sym.per_block else None
    log_c = st.floats(np.log(1e-3), np.log(1e3))
    kind = data.draw(st.sampled_from(["scalar", "channel", "head"]), label="kind")
    attention = any(m.startswith("attn.") for m, _ in sym.up)
    n = cfg.ffn_hidden if sym.dim == "F" else cfg.n_embd
    if kind == "head" and attention:
        n = H
    elif qk and name in ("qk", "q_scale", "k_scale"):
        n = H if kind != "scalar" else n
    c = np.exp(data.draw(log_c)) if kind == "scalar" else np.exp(
        np.array(data.draw(st.lists(log_c, min_size=n, max_size=n), label="log c")))
    before = gpt.apply(p, x, cfg)
    q = sy.transform(p, cfg, name, c, layer)
    assert rel_change(before, gpt.apply(q, x, cfg)) <= 1e-10
    np.testing.assert_array_equal(gpt.apply(p, x, cfg), before)  # input untouched


@pytest.mark.parametrize("ffn,tie,qk", [("reglu", False, False), ("swiglu", False, True), ("gelu", True, False),
                                        ("reglu", True, True)])
def test_gradient_identity_every_symmetry(ffn, tie, qk):
    cfg, p, x, y = make(ffn, tie, qk, seed=3)
    _, g = value_and_grad(gpt.loss)(p, x, y, cfg)
    names = sy.available(cfg)
    assert {"qk", "vo", "attn_norm", "mlp_norm"} <= set(names)
    for name in names:
        for layer in (range(cfg.n_layer) if sy.table(cfg)[name].per_block else [None]):
            res, dot, norm = sy.gradient_identity(p, g, cfg, name, layer)
            assert norm > 1e-6, (name, layer)
            if qk and name in ("q_scale", "k_scale", "qk"):   # w.g = 0 for each of W_q, W_k alone
                assert abs(res) <= 1e-8 * norm and dot <= 1e-8 * norm, (name, layer, res, dot, norm)
            else:
                assert dot > 1e-3 * norm, (name, layer)          # the terms do not vanish one by one
                assert abs(res) <= 1e-8 * dot, (name, layer, res, dot)


def test_gradient_identity_fails_for_non_symmetries():
    """Negative control for the identity: single members and the SwiGLU gate pair give a clear residual."""
    cfg, p, x, y = make("swiglu", False, False, seed=4)
    _, g = value_and_grad(gpt.loss)(p, x, y, cfg)
    w, gw = p["blocks"][0]["attn"]["w_q"], g["blocks"][0]["attn"]["w_q"]
    assert abs(np.vdot(w, gw)) > 1e-3 * np.linalg.norm(w) * np.linalg.norm(gw)
    m, gm = p["blocks"][0]["mlp"], g["blocks"][0]["mlp"]
    res = np.vdot(m["w_gate"], gm["w_gate"]) - np.vdot(m["w_down"], gm["w_down"])
    assert abs(res) > 1e-3 * (abs(np.vdot(m["w_gate"], gm["w_gate"])) + abs(np.vdot(m["w_down"], gm["w_down"])))


NEGATIVE = [  # (ffn, qk_norm, up, down): one group member left out, or a SwiGLU gate pair
    ("reglu", False, [("attn_norm", 0)], [("attn.w_q", 0), ("attn.w_k", 0)]),
    ("reglu", False, [("attn_norm", 0)], [("attn.w_v", 0)]),
    ("swiglu", False, [("mlp_norm", 0)], [("mlp.w_up", 0)]),
    ("reglu", False, [("mlp_norm", 0)], [("mlp.w_gate", 0)]),
    ("reglu", False, [("attn.w_q", 1)], []),
    ("swiglu", False, [("mlp.w_gate", 1)], [("mlp.w_down", 0)]),
    ("swiglu", False, [("mlp.w_gate", 1)], [("mlp.w_up", 1)]),
    ("gelu", False, [("mlp.w_up", 1)], [("mlp.w_down", 0)]),
    ("reglu", False, [("attn.w_v", 1)], []),
]


@pytest.mark.parametrize("ffn,qk,up,down", NEGATIVE)
@pytest.mark.parametrize("c", [0.1, 3.0])
def test_negative_controls_change_output(ffn, qk, up, down, c):
    cfg, p, x, _ = make(ffn, False, qk, seed=5)
    q = sy.rescale(p, cfg, up, down, c, layer=1)
    assert rel_change(gpt.apply(p, x, cfg), gpt.apply(q, x, cfg)) > 1e-4


def test_negative_controls_structural():
    # tied head: the final gain cannot be absorbed (wte also embeds); per-channel q/k scaling under QK-norm
    cfg, p, x, _ = make("reglu", True, False, seed=6)
    q = sy.rescale(p, cfg, [("final_norm", 0)], [("wte", 1)], 2.0, layer=None)
    assert rel_change(gpt.apply(p, x, cfg), gpt.apply(q, x, cfg)) > 1e-4
    cfg, p, x, _ = make("reglu", False, True, seed=7)
    c = np.linspace(0.5, 2.0, cfg.n_embd)
    q = sy.rescale(p, cfg, [("attn.w_q", 1)], [("attn.w_k", 1)], np.ones(cfg.n_embd), layer=0)
    assert rel_change(gpt.apply(p, x, cfg), gpt.apply(q, x, cfg)) == 0
    q = sy.rescale(p, cfg, [("attn.w_q", 1)], [], c, layer=0)
    assert rel_change(gpt.apply(p, x, cfg), gpt.apply(q, x, cfg)) > 1e-4


def test_transform_does_not_mutate_and_errors():
    cfg, p, x, _ = make("swiglu", True, False)
    snapshot = refopt.tree.copy(p)
    q = sy.transform(p, cfg, "vo", 2.0, layer=0)
    for a, b in zip(refopt.tree.leaves(p), refopt.tree.leaves(snapshot)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(q["blocks"][0]["attn"]["w_v"], 2.0 * p["blocks"][0]["attn"]["w_v"])
    assert q["blocks"][1]["attn"]["w_v"] is p["blocks"][1]["attn"]["w_v"]
    with pytest.raises(ValueError, match="gate_down"):
        sy.transform(p, cfg, "gate_down", 2.0, layer=0)          # SwiGLU: not a symmetry
    with pytest.raises(ValueError, match="final_norm"):
        sy.transform(p, cfg, "final_norm", 2.0)                  # tied head
    with pytest.raises(ValueError, match="layer"):
        sy.transform(p, cfg, "qk", 2.0)
    with pytest.raises(ValueError, match="positive"):
        sy.transform(p, cfg, "qk", -1.0, layer=0)
    with pytest.raises(ValueError, match="length"):
        sy.transform(p, cfg, "qk", np.ones(5), layer=0)
    cfg_qk, p_qk, _, _ = make("swiglu", False, True)
    with pytest.raises(ValueError, match="per head"):
        sy.transform(p_qk, cfg_qk, "q_scale", np.ones(cfg_qk.n_embd), layer=0)
    assert sy.members(cfg_qk, "attn_norm", 1) == (["blocks[1].attn_norm"],
                                                  ["blocks[1].attn.w_q", "blocks[1].attn.w_k", "blocks[1].attn.w_v"])

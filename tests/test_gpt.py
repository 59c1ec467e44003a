"""refopt.models.gpt: whole-model gradients vs finite differences on every leaf, causality, stability,
PITFALLS.md B25 (tied embedding), init, generation, config validation."""
import itertools

import numpy as np
import pytest

import refopt
import refopt.autograd as ag
from refopt.models import gpt
from refopt.autograd import check_grads_per_leaf, value_and_grad


# Central-difference step for whole-model checks: near the optimum (3 eps_mach / |f3|)^(1/3) ~ 1e-5 for
# these losses (f3 the third derivative); with it the worst per-leaf error is ~4e-8, 25x under the 1e-6
# bound, while eps = 1e-6 leaves rounding noise of a few 1e-7.
FD_EPS = 1e-5


def tiny(**kw):
    base = dict(vocab_size=11, block_size=4, n_layer=2, n_head=2, n_embd=8, ffn_hidden=12, init_std=0.3)
    base.update(kw)
    return gpt.GPTConfig(**base)


def random_params(cfg, seed=0, dtype=np.float64):
    """init, then every gain drawn in [0.5, 1.5] so gain gradients are tested away from 1."""
    p = gpt.init(cfg, seed, dtype)
    r = np.random.default_rng(seed + 100)
    leaves, paths, td = refopt.tree.flatten(p)
    leaves = [r.uniform(0.5, 1.5, x.shape).astype(dtype) if x.ndim == 1 else x for x in leaves]
    return refopt.tree.unflatten(td, leaves)


def batch(cfg, B=2, T=None, seed=0):
    r = np.random.default_rng(seed)
    T = cfg.block_size if T is None else T
    return r.integers(0, cfg.vocab_size, (B, T)), r.integers(0, cfg.vocab_size, (B, T))


CASES = [dict(ffn=f, tie_head=t, qk_norm=q)
         for f, t, q in itertools.product(gpt.FFN_KINDS, (True, False), (False, True))]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_whole_gpt_grad_fd_every_leaf(kw):
    cfg = tiny(**kw)
    p = random_params(cfg)
    x, y = batch(cfg)
    errs = check_grads_per_leaf(gpt.loss, p, x, y, cfg, eps=FD_EPS)
    assert len(errs) == len(refopt.tree.leaves(p))
    assert max(errs.values()) <= 1e-6


@pytest.mark.parametrize("kw", [dict(qk_norm=True, qk_norm_gain=False), dict(init="mup", zero_init_out_proj=False)])
def test_grad_fd_other_variants(kw):
    cfg = tiny(**kw)
    p = random_params(cfg, seed=3)
    x, y = batch(cfg, T=3, seed=4)   # shorter than block_size
    assert max(check_grads_per_leaf(gpt.loss, p, x, y, cfg, eps=FD_EPS).values()) <= 1e-6
    y[0, 1] = -1                      # ignore_index
    f = lambda p: gpt.loss(p, x, y, cfg, ignore_index=-1)  # noqa: E731
    assert max(check_grads_per_leaf(f, p, eps=FD_EPS).values()) <= 1e-6


def test_plain_equals_traced_and_float32():
    cfg = tiny(qk_norm=True)
    p = random_params(cfg, dtype=np.float32)
    x, y = batch(cfg)
    plain = gpt.loss(p, x, y, cfg)
    v, g = value_and_grad(gpt.loss)(p, x, y, cfg)
    assert v == plain and np.asarray(v).dtype == np.float32
    assert all(leaf.dtype == np.float32 for leaf in refopt.tree.leaves(g))
    assert gpt.apply(p, x, cfg).shape == (2, 4, 11)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_causal_no_leakage_bit_identical(qk_norm):
    cfg = tiny(block_size=8, qk_norm=qk_norm)
    p = random_params(cfg, seed=5)
    x, _ = batch(cfg, B=3, seed=6)
    base = gpt.apply(p, x, cfg)
    r = np.random.default_rng(7)
    for t in range(cfg.block_size - 1):
        x2 = x.copy()
        x2[:, t + 1:] = r.integers(0, cfg.vocab_size, x2[:, t + 1:].shape)
        out = gpt.apply(p, x2, cfg)
        assert np.array_equal(out[:, :t + 1], base[:, :t + 1])
        assert not np.array_equal(out[:, t + 1:], base[:, t + 1:])
    # the gradient of the loss at position 0 with respect to later inputs' embeddings is exactly 0
    g = value_and_grad(lambda p: ag.sum(gpt.apply(p, x, cfg)[:, 0, :] ** 2))(p)[1]
    used = np.unique(x[:, 0])
    unused = np.setdiff1d(np.arange(cfg.vocab_size), used)
    if not cfg.tie_head:
        assert np.all(g["wte"][unused] == 0)
    assert np.all(g["wpe"][1:] == 0)


def test_large_logit_stability():
    cfg = tiny(tie_head=False)
    p = random_params(cfg, seed=8)
    p["lm_head"] = p["lm_head"] * 1e4           # logits of order 1e4..1e5
    x, y = batch(cfg, seed=9)
    logits = gpt.apply(p, x, cfg)
    assert np.abs(logits).max() > 1e4
    v, g = value_and_grad(gpt.loss)(p, x, y, cfg)
    assert np.isfinite(v) and v > 100
    assert all(np.all(np.isfinite(leaf)) for leaf in refopt.tree.leaves(g))
    p32 = refopt.tree.tree_map(lambda a: a.astype(np.float32), p)
    v32, g32 = value_and_grad(gpt.loss)(p32, x, y, cfg)
    assert np.isfinite(v32) and np.isclose(v32, v, rtol=1e-3)
    assert all(np.all(np.isfinite(leaf)) for leaf in refopt.tree.leaves(g32))


def test_b25_tied_embedding_exact():
    E = np.array([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.2]])

    def f(E):
        h = ag.embedding(E, np.array([0]))          # (1, d)
        return ag.cross_entropy(h @ E.T, np.array([2]))

    v, g = value_and_grad(f)(E)
    assert abs(v - 1.1603608505643264) < 1e-15
    expect = [[0.513255052024127, -0.151046490132734], [0.032616207761542, -0.065232415523085],
              [-0.068662692037512, 0.137325384075024]]
    np.testing.assert_allclose(g, expect, rtol=0, atol=1e-14)
    assert ag.check_grads(f, E) <= 1e-9
    rule = refopt.SGD(lr=1.0)
    new, state = refopt.update(rule, refopt.init(rule, E), E, g)   # one leaf, one state
    np.testing.assert_allclose(new, [[-0.413255052024127, -0.048953509867266],
                                     [0.267383792238458, 0.465232415523085],
                                     [-0.431337307962488, 0.062674615924976]], rtol=0, atol=1e-14)
    # the head-only contribution alone is wrong for row 0: the embedding part must be added
    h0 = E[0][None, :].copy()                       # the embedding as a constant: head path only
    head_only = value_and_grad(lambda E: ag.cross_entropy(h0 @ E.T, np.array([2])))(E)[1]
    np.testing.assert_allclose(head_only[0], [0.03604648427597, -0.07209296855194], atol=1e-13)


def test_tied_gpt_has_one_embedding_leaf():
    tied, untied = tiny(tie_head=True), tiny(tie_head=False)
    assert "lm_head" not in gpt.init(tied, 0) and gpt.init(untied, 0)["lm_head"].shape == (8, 11)
    assert gpt.num_params(untied) - gpt.num_params(tied) == 8 * 11


def test_init_scales():
    cfg = gpt.GPTConfig(vocab_size=50, n_layer=2, n_embd=64, n_head=4, tie_head=False)
    p = gpt.init(cfg, 0)
    assert p["wte"].dtype == np.float32
    assert abs(p["blocks"][0]["attn"]["w_q"].std() / 0.02 - 1) < 0.05
    assert abs(p["blocks"][1]["mlp"]["w_down"].std() / (0.02 / 2) - 1) < 0.05
    assert np.all(p["final_norm"] == 1) and p["blocks"][0]["mlp"]["w_gate"].shape == (64, cfg.ffn_hidden)
    m = gpt.init(gpt.GPTConfig(vocab_size=50, n_layer=2, n_embd=64, n_head=4, init="mup", tie_head=False), 0)
    for path, shape in [("w_up", (64, cfg.ffn_hidden)), ("w_down", (cfg.ffn_hidden, 64))]:
        d_in, d_out = shape
        sigma = np.sqrt(d_out / d_in) / (np.sqrt(d_in) + np.sqrt(d_out))
        assert abs(m["blocks"][0]["mlp"][path].std() / sigma - 1) < 0.05
    z = gpt.init(gpt.GPTConfig(vocab_size=50, n_layer=2, n_embd=64, n_head=4, zero_init_out_proj=True), 0)
    assert np.all(z["blocks"][1]["attn"]["w_o"] == 0) and np.all(z["blocks"][0]["mlp"]["w_down"] == 0)
    np.testing.assert_array_equal(z["blocks"][0]["attn"]["w_q"], p["blocks"][0]["attn"]["w_q"])
    p64 = gpt.init(cfg, 0, np.float64)
    np.testing.assert_array_equal(p64["wte"].astype(np.float32), p["wte"])


def test_default_config():
    cfg = gpt.GPTConfig(vocab_size=100)
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.ffn_hidden) == (4, 128, 4, 64, 352)
    assert gpt.GPTConfig(vocab_size=100, ffn="gelu").ffn_hidden == 512


def test_generate_deterministic():
    cfg = tiny(block_size=5)
    p = random_params(cfg, seed=10)
    start = np.array([[1, 2], [3, 4]])
    a = gpt.generate(p, start, 9, 1.0, 123, cfg)
    b = gpt.generate(p, start, 9, 1.0, 123, cfg)
    c = gpt.generate(p, start, 9, 1.0, 124, cfg)
    assert a.shape == (2, 11) and a.dtype == np.int64 and np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(a[:, :2], start) and a.min() >= 0 and a.max() < cfg.vocab_size
    g = gpt.generate(p, start, 1, 0.0, 0, cfg)
    assert np.array_equal(g[:, 2], np.argmax(gpt.apply(p, start, cfg)[:, -1], -1))


def test_errors():
    for bad in [dict(n_embd=10, n_head=3), dict(ffn="geglu"), dict(init="xavier"), dict(norm_eps=-1.0),
                dict(n_layer=0), dict(block_size=2.5), dict(ffn_hidden=0), dict(init_std=0.0), dict(tie_head="no")]:
        with pytest.raises(ValueError):
            tiny(**bad)
    cfg = tiny()
    p = gpt.init(cfg, 0)
    with pytest.raises(ValueError, match="block_size"):
        gpt.apply(p, np.zeros((1, 5), int), cfg)
    with pytest.raises(ValueError, match="integer"):
        gpt.apply(p, np.zeros((1, 2)), cfg)
    with pytest.raises(ValueError, match=r"blocks\[1\].attn.w_q"):
        p["blocks"][1]["attn"]["w_q"] = np.zeros((8, 7))
        gpt.apply(p, np.zeros((1, 2), int), cfg)
    with pytest.raises(ValueError, match="lm_head"):
        gpt.apply(gpt.init(cfg, 0), np.zeros((1, 2), int), tiny(tie_head=False))
    with pytest.raises(ValueError, match="temperature"):
        gpt.generate(gpt.init(cfg, 0), np.zeros((1, 2), int), 1, -1.0, 0, cfg)


def test_tiny_gpt_learns_real_text():
    """60 AdamW steps of a 1-layer GPT on the default corpus: the validation loss falls from ln V
    to well below the unigram entropy of the text."""
    from refopt.models.data import CharVocab, get_batch, load_text, split_ids
    text = load_text().text
    vocab = CharVocab(text)
    train, val = split_ids(vocab.encode(text))
    counts = np.bincount(train, minlength=vocab.size) / len(train)
    unigram = -np.sum(counts[counts > 0] * np.log(counts[counts > 0]))
    cfg = gpt.GPTConfig(vocab_size=vocab.size, block_size=16, n_layer=1, n_head=2, n_embd=32)
    params = gpt.init(cfg, 0)
    rule = refopt.AdamW(lr=1e-2, weight_decay=0.0)
    state = refopt.init(rule, params)
    vg = value_and_grad(gpt.loss)
    rng = np.random.default_rng(0)
    xv, yv = get_batch(val, 16, 64, np.random.default_rng(1))
    start = float(gpt.loss(params, xv, yv, cfg))
    for _ in range(60):
        _, g = vg(params, *get_batch(train, 16, 32, rng), cfg)
        params, state = refopt.update_(rule, state, params, g)
    end = float(gpt.loss(params, xv, yv, cfg))
    assert abs(start - np.log(vocab.size)) < 0.1
    assert end < unigram - 0.2, (start, end, unigram)

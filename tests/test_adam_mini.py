"""Adam-mini written from Zhang et al. 2024 (Algorithm 1) in numpy with explicit lists of each block's entries: every
partition (entries, whole array, output neurons, tokens, heads); closed forms (one block per entry is AdamW, one
block per array at beta1 = beta2 = 0 steps by lr g / RMS(g)); negative controls for each oracle switch; bad input;
pytorch_optimizer.AdamMini's name rules, its rows through docs/factories/adam_mini.py (the float64 reading and the
float32 package as it ships), a numpy Adam-mini with a planted bug named by the diagnosis."""

import numpy as np
import pytest

import refopt
from refopt.rules.adam_mini import AdamMini
from tree_steps import last_params, run

NEEDS_PEER = "peer pytorch_optimizer not installed: pip install -e .[peers]"


def _stream(shape, steps=6, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), [rng.standard_normal(shape) * (1 + np.arange(shape[-1])) for _ in range(steps)]


def blocks_of(shape, block, head_dim=None):
    """The paper's blocks of a (fan_in, fan_out) array as lists of (row, column) index pairs."""
    n0, n1 = shape
    cells = [(i, j) for i in range(n0) for j in range(n1)]
    if block == "element":
        return [[c] for c in cells]
    if block == "tensor":
        return [cells]
    if block == "fan_out":
        return [[(i, j) for i in range(n0)] for j in range(n1)]
    if block == "row":
        return [[(i, j) for j in range(n1)] for i in range(n0)]
    return [[(i, j) for i in range(n0) for j in range(h * head_dim, (h + 1) * head_dim)]
            for h in range(n1 // head_dim)]


def algorithm(x0, gs, lr, b1, b2, eps, wd, blocks):
    """Algorithm 1 of the paper, entry by entry: m = b1 m + (1 - b1) g; per block v = b2 v + (1 - b2) mean(g^2);
    x = (1 - lr wd) x - lr mhat / (sqrt(vhat) + eps)."""
    x, m, v = x0.copy(), np.zeros_like(x0), [0.0] * len(blocks)
    for t, g in enumerate(gs, 1):
        m = b1 * m + (1 - b1) * g
        x = (1 - lr * wd) * x
        for k, cells in enumerate(blocks):
            v[k] = b2 * v[k] + (1 - b2) * sum(g[c] ** 2 for c in cells) / len(cells)
            for c in cells:
                x[c] -= lr * (m[c] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
    return x


@pytest.mark.parametrize("block, head_dim", [("element", None), ("tensor", None), ("fan_out", None), ("row", None),
                                             ("heads", 2), ("heads", 3)])
def test_adam_mini_matches_the_paper(block, head_dim):
    x0, gs = _stream((4, 6))
    rule = AdamMini(lr=0.02, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1, block=block, head_dim=head_dim)
    x, s = run(rule, x0, gs)
    want = algorithm(x0, gs, 0.02, 0.8, 0.95, 1e-6, 0.1, blocks_of((4, 6), block, head_dim))
    np.testing.assert_allclose(x, want, rtol=1e-13, atol=1e-15)
    assert s.leaves.v.size == len(blocks_of((4, 6), block, head_dim)) and s.leaves.block == block


def test_one_block_per_entry_is_adamw():
    x0, gs = _stream((5, 3), steps=8)
    a, _ = run(AdamMini(lr=0.01, weight_decay=0.05, block="element"), x0, gs)
    b, _ = run(refopt.AdamW(lr=0.01, weight_decay=0.05), x0, gs)
    np.testing.assert_allclose(a, b, rtol=1e-15, atol=1e-17)


def test_one_block_at_zero_betas_steps_by_the_gradient_over_its_rms():
    """beta1 = beta2 = 0: x_t = x_{t-1} - lr g / (RMS(g) + eps), a step of RMS lr RMS(g) / (RMS(g) + eps)."""
    x0, gs = _stream((3, 4), steps=1)
    x, _ = run(AdamMini(lr=0.1, beta1=0.0, beta2=0.0, eps=1e-8), x0, gs)
    g = gs[0]
    rms = np.sqrt(np.mean(g * g))
    np.testing.assert_allclose(x, x0 - 0.1 * g / (rms + 1e-8), rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("switch", [dict(block="element"), dict(reduce="sum"), dict(bias2=False),
                                    dict(decay="after")])
def test_each_convention_changes_the_trajectory(switch):
    from refopt.conventions.adam_mini import AdamMiniOracle
    from refopt.testing.adapters import RuleAdapter
    rule = AdamMini(lr=0.05, beta1=0.8, beta2=0.9, weight_decay=0.5, block="fan_out")
    x0, gs = _stream((4, 5), steps=8)
    ours = last_params(RuleAdapter(rule), x0, gs)
    np.testing.assert_allclose(last_params(AdamMiniOracle(rule), x0, gs), ours, rtol=0, atol=1e-14)
    assert np.abs(last_params(AdamMiniOracle(rule, **switch), x0, gs) - ours).max() > 1e-4


def test_a_block_function_and_a_decay_mask_act_per_array():
    x = {"w": np.ones((4, 4)), "b": np.ones(4)}
    g = {"w": np.arange(16.0).reshape(4, 4), "b": np.arange(4.0)}
    rule = AdamMini(lr=0.1, weight_decay=0.5, block=lambda p, a: "heads" if a.ndim == 2 else "element", head_dim=2,
                    decay_mask=lambda p, a: p != "b")
    new, s = refopt.update(rule, refopt.init(rule, x), x, g)
    assert s.leaves["w"].v.shape == (2,) and s.leaves["b"].v.shape == (4,)
    assert not s.leaves["b"].decayed and s.leaves["w"].decayed
    np.testing.assert_allclose(new["b"], 1 - 0.1 * np.sign(g["b"]), rtol=1e-6)      # no decay: Adam's first step
    assert np.all(x["w"] == 1)                                                        # the pure API wrote nothing


def test_adam_mini_bad_input():
    for kw, match in [(dict(lr=-1.0), "lr"), (dict(beta1=1.0), "beta1"), (dict(beta2=-0.1), "beta2"),
                      (dict(eps=0.0), "eps"), (dict(weight_decay=-1.0), "weight_decay"), (dict(block="col"), "block"),
                      (dict(block="heads"), "head_dim"), (dict(block="tensor", head_dim=2), "head_dim"),
                      (dict(block="heads", head_dim=0), "head_dim"), (dict(decay_mask=True), "decay_mask")]:
        with pytest.raises(ValueError, match=match):
            AdamMini(**kw)
    with pytest.raises(ValueError, match=r"two or more axes; b has shape \(3,\)"):
        refopt.init(AdamMini(block="fan_out"), {"b": np.zeros(3)})
    with pytest.raises(ValueError, match=r"fan_out is a multiple of head_dim; w has shape \(2, 5\)"):
        refopt.init(AdamMini(block="heads", head_dim=2), {"w": np.zeros((2, 5))})
    with pytest.raises(ValueError, match=r"gave 'col' for w"):
        refopt.init(AdamMini(block=lambda p, x: "col"), {"w": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"w has block 'heads' but the rule has no head_dim"):
        refopt.init(AdamMini(block=lambda p, x: "heads"), {"w": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"decay_mask gave 1 for w"):
        refopt.init(AdamMini(decay_mask=lambda p, x: 1), {"w": np.zeros((2, 2))})


def test_direction_and_float32():
    rule = AdamMini(lr=0.02, block="row")
    x0, (g,) = _stream((4, 3), steps=1)
    s = refopt.init(rule, x0)
    u, _ = refopt.direction(rule, s, x0, g)
    new, _ = refopt.update(rule, s, x0, g)
    np.testing.assert_allclose(new, x0 - 0.02 * u, rtol=1e-15, atol=1e-17)
    x, s = run(rule, x0.astype(np.float32), [g.astype(np.float32)] * 3)
    assert x.dtype == s.leaves.m.dtype == s.leaves.v.dtype == np.float32


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def test_pytorch_optimizers_names():
    from refopt.conventions.adam_mini import (AuthorsBlocks, PytorchOptimizerBlocks, PytorchOptimizerDecayMask,
                                              torch_name)
    from refopt.crosscheck.problems import make_problem
    gpt = make_problem("gpt")
    assert torch_name("blocks[0].attn.w_q") == "blocks.0.attn.wq.weight" and torch_name("wte") == "wte.weight"
    blocks, mask = PytorchOptimizerBlocks(16, 2), PytorchOptimizerDecayMask()
    got = {p: (blocks(p, x), mask(p, x)) for p, x in zip(gpt.paths, gpt.leaves)}
    assert got == {"blocks[0].attn.w_k": ("heads", True), "blocks[0].attn.w_q": ("heads", True),
                   "blocks[0].attn.w_o": ("tensor", True), "blocks[0].attn.w_v": ("tensor", True),
                   "blocks[0].attn_norm": ("tensor", False), "blocks[0].mlp.w_down": ("tensor", True),
                   "blocks[0].mlp.w_up": ("tensor", True), "blocks[0].mlp_norm": ("tensor", False),
                   "final_norm": ("tensor", False), "wpe": ("tensor", True), "wte": ("element", True)}
    paper = {p: AuthorsBlocks()(p, x) for p, x in zip(gpt.paths, gpt.leaves)}
    assert paper["blocks[0].attn.w_v"] == paper["blocks[0].mlp.w_up"] == "fan_out" and paper["wte"] == "row"
    with pytest.raises(ValueError, match="num_embeds=8"):
        PytorchOptimizerBlocks(8, 2)("blocks[0].attn.w_q", np.zeros((16, 16)))
    with pytest.raises(ValueError, match="fused"):
        PytorchOptimizerBlocks(16, 2)("h[0].attn.qkv", np.zeros((16, 48)))


def test_like_pytorch_optimizer_adam_mini():
    from refopt.conventions.adam_mini import PytorchOptimizerBlocks, PytorchOptimizerDecayMask
    r = refopt.like("pytorch_optimizer.AdamMini", lr=0.01, num_embeds=64, num_heads=4)
    assert r == AdamMini(lr=0.01, weight_decay=0.1, block=PytorchOptimizerBlocks(64, 4), head_dim=16,
                         decay_mask=PytorchOptimizerDecayMask())
    assert refopt.like("pytorch_optimizer.AdamMini").lr == 1.0      # the package's default lr
    for kw, match in [(dict(model_sharding=True), "model_sharding"), (dict(num_query_groups=2), "num_query_groups"),
                      (dict(eps=0.0), "eps"), (dict(num_heads=0), "num_heads"), (dict(maximize=True), "maximize"),
                      (dict(num_embeds=2.5), "num_embeds")]:
        with pytest.raises(ValueError, match=match):
            refopt.like("pytorch_optimizer.AdamMini", **kw)


def _factory():
    from crosscheck_helpers import load_factory
    return load_factory("adam_mini")


def test_pytorch_optimizer_adam_mini_through_the_factory_and_as_shipped():
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    import torch

    import pytorch_optimizer.optimizer.adam_mini as module
    from refopt.crosscheck.plugin import check_impl
    f = _factory()
    kw = dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.05, num_embeds=16, num_heads=2)
    rule = refopt.like("pytorch_optimizer.AdamMini", **kw)
    r = check_impl(f.adam_mini, rule, kwargs=kw, framework="torch", problems=("stream", "gpt"), diagnose=False)
    assert r.agree and all(p.tier == "exact" and p.params_rel <= 1e-12 for p in r.problems), r.report()
    assert module.torch is torch                    # the float32 reading is undone after every step
    # as it ships: float32 gradient and state, float32 rounding from float64 (1e-9 .. 2e-5), named as such
    r = check_impl(f.adam_mini_float32, rule, kwargs=kw, framework="torch", problems=("stream", "gpt"))
    assert not r.agree and all(1e-9 < p.params_rel < 2e-5 for p in r.problems), r.report()
    assert "float32's rounding" in r.diagnosis_line(), r.report()
    # the wrong blocks (Adam's per-entry v) are caught on the GPT, by far
    r = check_impl(f.adam_mini, "AdamMini(lr=0.01, beta1=0.8, beta2=0.99, weight_decay=0.05, block='element')",
                   kwargs=kw, framework="torch", problems=("gpt",), diagnose=False)
    assert not r.agree and r.problems[0].params_rel > 1e-3, r.report()


class NumpyAdamMini:
    """Adam-mini with one block per array over a list of arrays, with one planted bug: 'block sum' (v averages
    the block's sum of g^2, not its mean)."""

    def __init__(self, lr=0.01, b1=0.9, b2=0.99, eps=1e-8, bug=None):
        self.lr, self.b1, self.b2, self.eps, self.bug = lr, b1, b2, eps, bug

    def init(self, params):
        return (0, [np.zeros_like(x) for x in params], [0.0] * len(params))

    def step(self, s, params, grads):
        t, ms, vs = s
        t += 1
        out, nm, nv = [], [], []
        for x, g, m, v in zip(params, grads, ms, vs):
            m = self.b1 * m + (1 - self.b1) * g
            sq = np.sum(g * g) if self.bug == "block sum" else np.mean(g * g)
            v = self.b2 * v + (1 - self.b2) * sq
            out.append(x - self.lr * (m / (1 - self.b1 ** t)) / (np.sqrt(v / (1 - self.b2 ** t)) + self.eps))
            nm.append(m)
            nv.append(v)
        return out, (t, nm, nv)


def test_a_block_sum_for_the_block_mean_is_named():
    from refopt.crosscheck.plugin import check_impl
    rule = "AdamMini(lr=0.01, beta1=0.9, beta2=0.99)"
    ok = check_impl(NumpyAdamMini(), rule, framework="numpy", steps=10, problems=("stream", "mlp"))
    assert ok.agree, ok.report()
    r = check_impl(NumpyAdamMini(bug="block sum"), rule, framework="numpy", steps=10, problems=("stream", "mlp"))
    assert not r.agree and r.best.name == "block sum of squares" and r.best.reproduces, r.report()


def _presets(misconfigured=False):
    from crosscheck_helpers import presets
    return presets("pytorch_optimizer", misconfigured, family="adam_mini")


@pytest.mark.parametrize("problem", ["stream", "gpt"])
@pytest.mark.parametrize("preset", _presets(), ids=[p.name for p in _presets()])
def test_pytorch_optimizer_adam_mini_rows_agree(preset, problem):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_passes
    assert assert_passes(preset, problem).params_rel <= 1e-12


@pytest.mark.parametrize("preset", _presets(True), ids=[p.name for p in _presets(True)])
def test_pytorch_optimizer_adam_mini_wrong_rows_are_caught(preset):
    pytest.importorskip("pytorch_optimizer", reason=NEEDS_PEER)
    from crosscheck_helpers import assert_caught
    assert_caught(preset, "gpt")

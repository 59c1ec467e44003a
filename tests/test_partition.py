"""Partition: per-label dispatch against independent numpy oracles, errors, default labellings."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import refopt
from refopt.core import Rule
from refopt.rules.adam import AdamW
from refopt import gpt_labels, mlp_labels
from refopt.rules.partition import PartitionLeaf, Partition, matrix_labels
from refopt.rules.sgd import SGD


def _params(seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return {"layers": [{"w": rng.standard_normal((5, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype)},
                       {"w": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)}],
            "scale": rng.standard_normal((2, 2)).astype(dtype)}


def _grads(k, dtype=np.float64):
    return _params(seed=100 + k, dtype=dtype)


# ---- independent numpy oracles (written here, not imported) -------------------------------------

def _oracle_sgd_momentum(x, gs, lr, mu):
    b = None
    for g in gs:
        b = g.copy() if b is None else mu * b + g
        x = x - lr * b
    return x


def _oracle_adamw(x, gs, lr, b1, b2, eps, wd):
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    for t, g in enumerate(gs, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat = m / (1 - b1 ** t)
        vhat = v / (1 - b2 ** t)
        x = x * (1 - lr * wd) - lr * mhat / (np.sqrt(vhat) + eps)
    return x


def _rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


RULES = {"hidden": SGD(lr=0.05, momentum=0.9), "other": AdamW(lr=0.01, weight_decay=0.1)}


@pytest.mark.parametrize("labels", ["function", "tree"])
def test_partition_matches_oracles_per_label(labels):
    p0 = _params()
    lab = matrix_labels if labels == "function" else \
        {"layers": [{"w": "hidden", "b": "other"}, {"w": "hidden", "b": "other"}], "scale": "hidden"}
    rule = Partition(rules=RULES, labels=lab)
    state = refopt.init(rule, p0)
    p = p0
    gs = [_grads(k) for k in range(6)]
    for g in gs:
        p, state = refopt.update(rule, state, p, g)
    flat = lambda tree: refopt.tree.flatten(tree)
    for x0, x, path in zip(flat(p0)[0], flat(p)[0], flat(p)[1]):
        gseq = [refopt.tree.flatten(g)[0][flat(p0)[1].index(path)] for g in gs]
        if x0.ndim == 2:
            want = _oracle_sgd_momentum(x0, gseq, 0.05, 0.9)
            assert state_label(state, path) == "hidden"
        else:
            want = _oracle_adamw(x0, gseq, 0.01, 0.9, 0.999, 1e-8, 0.1)
            assert state_label(state, path) == "other"
        assert _rel(x, want) <= 1e-12, path


def state_label(state, path):
    leaves, paths, _ = refopt.tree.flatten(state.leaves, is_leaf=lambda n: isinstance(n, PartitionLeaf))
    return leaves[paths.index(path)].label


def test_partition_equals_sub_rules_on_their_subtrees_bitwise():
    """A Partition step is bit for bit the sub-rules run on their own sub-trees."""
    p = _params(dtype=np.float32)
    rule = Partition(rules=RULES, labels=matrix_labels)
    s = refopt.init(rule, p)
    mats = {"w0": p["layers"][0]["w"], "w1": p["layers"][1]["w"], "scale": p["scale"]}
    vecs = {"b0": p["layers"][0]["b"], "b1": p["layers"][1]["b"]}
    sm, sv = refopt.init(RULES["hidden"], mats), refopt.init(RULES["other"], vecs)
    for k in range(4):
        g = _grads(k, np.float32)
        p, s = refopt.update(rule, s, p, g)
        gm = {"w0": g["layers"][0]["w"], "w1": g["layers"][1]["w"], "scale": g["scale"]}
        gv = {"b0": g["layers"][0]["b"], "b1": g["layers"][1]["b"]}
        mats, sm = refopt.update(RULES["hidden"], sm, mats, gm)
        vecs, sv = refopt.update(RULES["other"], sv, vecs, gv)
    assert np.array_equal(p["layers"][0]["w"], mats["w0"]) and np.array_equal(p["scale"], mats["scale"])
    assert np.array_equal(p["layers"][1]["b"], vecs["b1"]) and p["layers"][1]["b"].dtype == np.float32


def test_direction_dispatches():
    p = _params()
    g = _grads(0)
    rule = Partition(rules=RULES, labels=matrix_labels)
    u, _ = refopt.direction(rule, refopt.init(rule, p), p, g)
    # SGD with momentum, first step: u = g; Adam first step: u = g / (|g| + eps) (bias corrections cancel)
    np.testing.assert_array_equal(u["scale"], g["scale"])
    b = g["layers"][0]["b"]
    assert _rel(u["layers"][0]["b"], b / (np.abs(b) + 1e-8)) <= 1e-12


# ---- context once per step, glob per label ------------------------------------------------------

CALLS: list = []


@dataclass(frozen=True)
class _CountingSGD(SGD):
    tag: str = ""

    def init_global(self):
        return {"n": 0}

    def context(self, t, glob):
        CALLS.append((self.tag, t))
        ctx, _ = super().context(t, None)
        return ctx, {"n": glob["n"] + 1}


def test_each_sub_context_called_once_per_step_and_globals_kept_apart():
    CALLS.clear()
    rule = Partition(rules={"a": _CountingSGD(lr=0.1, tag="a"), "b": _CountingSGD(lr=0.2, tag="b")},
                     labels=lambda path, x: "a" if x.ndim == 2 else "b")
    p = _params()
    s = refopt.init(rule, p)
    for k in range(3):
        p, s = refopt.update(rule, s, p, _grads(k))
    assert sorted(CALLS) == sorted([(tag, t) for t in (1, 2, 3) for tag in "ab"])  # not once per leaf
    assert s.glob == {"a": {"n": 3}, "b": {"n": 3}}


def test_eval_params_dispatches():
    @dataclass(frozen=True)
    class _Doubling(SGD):
        def eval_leaf(self, s, x, path):
            return 2 * x

    rule = Partition(rules={"a": _Doubling(lr=0.1), "b": SGD(lr=0.1)}, labels=lambda path, x: "a" if path == "scale" else "b")
    p = _params()
    e = refopt.eval_params(rule, refopt.init(rule, p), p)
    np.testing.assert_array_equal(e["scale"], 2 * p["scale"])
    assert e["layers"][0]["w"] is p["layers"][0]["w"]


# ---- errors ------------------------------------------------------------------------------------

def test_construction_errors():
    with pytest.raises(ValueError, match="non-empty"):
        Partition(rules={}, labels=matrix_labels)
    with pytest.raises(ValueError, match="must be a refopt rule"):
        Partition(rules={"a": "sgd"}, labels=matrix_labels)
    with pytest.raises(ValueError, match="non-empty strings"):
        Partition(rules={1: SGD()}, labels=matrix_labels)
    with pytest.raises(ValueError, match="labels must be"):
        Partition(rules={"a": SGD()})
    with pytest.raises(ValueError, match=r"no rule for label 'zz' at layers\[1\]\.b"):
        Partition(rules=RULES, labels={"layers": [{"w": "hidden", "b": "other"}, {"w": "hidden", "b": "zz"}],
                                       "scale": "hidden"})
    with pytest.raises(ValueError, match=r"label of scale must be a string"):
        Partition(rules=RULES, labels={"scale": 3})


def test_unknown_label_from_function_names_path():
    rule = Partition(rules=RULES, labels=lambda path, x: "embed" if path == "layers[1].w" else "other")
    with pytest.raises(ValueError, match=r"no rule for label 'embed' at layers\[1\]\.w"):
        refopt.init(rule, _params())


def test_labels_tree_missing_leaf_names_path():
    rule = Partition(rules=RULES, labels={"layers": [{"w": "hidden", "b": "other"}, {"w": "hidden"}],
                                          "scale": "hidden"})
    with pytest.raises(ValueError, match=r"no label for params leaf layers\[1\]\.b"):
        refopt.init(rule, _params())


def test_labels_tree_extra_leaf_names_path():
    labels = {"layers": [{"w": "hidden", "b": "other"}, {"w": "hidden", "b": "other"}], "scale": "hidden",
              "emb": "other"}
    rule = Partition(rules=RULES, labels=labels)
    with pytest.raises(ValueError, match=r"label for emb, which params lacks"):
        rule.check_params(refopt.tree.paths(_params()))
    rule.check_params(refopt.tree.paths({**_params(), "emb": np.zeros(2)}))  # matching: no error
    if hasattr(Rule, "check_params"):   # once the driver calls the whole-tree hook, init catches it too
        with pytest.raises(ValueError, match="emb"):
            refopt.init(rule, _params())


def test_foreign_state_rejected():
    p = _params()
    rule = Partition(rules=RULES, labels=matrix_labels)
    other = Partition(rules={"x": SGD(lr=0.1)}, labels=lambda path, a: "x")
    # the driver's per-leaf state check (refopt.core) or Partition's own global-state check catches it
    with pytest.raises(ValueError, match="global state|not the state Partition makes"):
        refopt.update(rule, refopt.init(other, p), p, _grads(0))
    with pytest.raises(ValueError, match="not a Partition state|not the state Partition makes"):
        refopt.update(rule, refopt.init(SGD(lr=0.1), p)._replace(glob=rule.init_global()), p, _grads(0))


# ---- default labellings ------------------------------------------------------------------------

def _gpt_params(**kw):
    gpt = pytest.importorskip("refopt.models.gpt")
    cfg = gpt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, **kw)
    return gpt.init(cfg, seed=0)


@pytest.mark.parametrize("kw", [dict(), dict(tie_head=False, qk_norm=True), dict(ffn="gelu")])
def test_gpt_labels_on_the_real_gpt(kw):
    params = _gpt_params(**kw)
    xs, paths, _ = refopt.tree.flatten(params)
    got = {p: gpt_labels(p, x) for p, x in zip(paths, xs)}
    hidden = {p for p in paths if p.startswith("blocks[") and (".attn.w_" in p or ".mlp.w_" in p)}
    assert hidden and {p for p, lab in got.items() if lab == "hidden"} == hidden
    for name in ("wte", "wpe", "final_norm", "blocks[0].attn_norm", "blocks[1].mlp_norm"):
        assert got[name] == "other"
    if not kw.get("tie_head", True):
        assert got["lm_head"] == "other" and got["blocks[0].attn.q_norm"] == "other"
    assert len(hidden) == 2 * (4 + (2 if kw.get("ffn") == "gelu" else 3))


def test_gpt_labels_exact_names_and_unknown_matrix():
    m = np.zeros((4, 4))
    assert gpt_labels("blocks[12].attn.w_o", m) == "hidden"
    assert gpt_labels("blocks[0].mlp.w_gate", m) == "hidden"
    assert gpt_labels("lm_head", m) == "other"
    assert gpt_labels("blocks[0].attn.q_norm", np.ones(4)) == "other"
    with pytest.raises(ValueError, match=r"unknown GPT matrix blocks\[0\]\.attn\.w_qkv"):
        gpt_labels("blocks[0].attn.w_qkv", m)
    with pytest.raises(ValueError, match=r"blocks\[0\]\.attn\.w_q should be a matrix"):
        gpt_labels("blocks[0].attn.w_q", np.ones(4))


def test_gpt_partition_with_muon_steps_hidden_only():
    muon_mod = pytest.importorskip("refopt.rules.muon")
    params = _gpt_params(tie_head=False)
    rules = {"hidden": muon_mod.Muon(lr=0.02), "other": AdamW(lr=1e-3)}
    rule = Partition(rules=rules, labels=gpt_labels)
    s = refopt.init(rule, params)
    g = refopt.tree.tree_map(lambda a: np.ones_like(a), params)
    new, s = refopt.update(rule, s, params, g)
    # compare with Muon alone on one hidden matrix and AdamW alone on the head (bitwise)
    w = params["blocks"][1]["mlp"]["w_down"]
    wm, _ = refopt.update(rules["hidden"], refopt.init(rules["hidden"], w), w, np.ones_like(w))
    h = params["lm_head"]
    ha, _ = refopt.update(rules["other"], refopt.init(rules["other"], h), h, np.ones_like(h))
    assert np.array_equal(new["blocks"][1]["mlp"]["w_down"], wm)
    assert np.array_equal(new["lm_head"], ha)


def test_mlp_labels_first_and_last_to_adamw():
    mlp = pytest.importorskip("refopt.models.mlp")
    params = mlp.init(0, [6, 5, 4, 4, 3])
    # the default labels the input layer 'hidden', as `refopt train --model mlp` does (API and CLI agree)
    assert [lay["w"] for lay in mlp_labels(params)["layers"]] == ["hidden", "hidden", "hidden", "other"]
    labels = mlp_labels(params, first="other")
    assert [lay["w"] for lay in labels["layers"]] == ["other", "hidden", "hidden", "other"]
    assert all(lay["b"] == "other" for lay in labels["layers"])
    labels = mlp_labels(params, first="hidden", last="hidden")
    assert [lay["w"] for lay in labels["layers"]] == ["hidden"] * 4
    one_hidden = mlp.init(0, [6, 5, 3])
    assert [lay["w"] for lay in mlp_labels(one_hidden, first="other")["layers"]] == ["other", "other"]
    assert [lay["w"] for lay in mlp_labels(one_hidden)["layers"]] == ["hidden", "other"]
    rule = Partition(rules=RULES, labels=mlp_labels(params))
    s = refopt.init(rule, params)
    assert state_label(s, "layers[2].w") == "hidden" and state_label(s, "layers[3].w") == "other"
    with pytest.raises(ValueError, match="no 2-D"):
        mlp_labels({"b": np.zeros(3)})


def test_matrix_labels():
    assert matrix_labels("x", np.zeros((2, 3))) == "hidden"
    assert matrix_labels("x", np.zeros(3)) == "other"
    assert matrix_labels("x", np.zeros((2, 3, 4))) == "other"


def test_shape_dependent_labels_function_updates():
    # the driver's state check must rebuild the expected state from the real array, not a stand-in
    rules = {"hidden": refopt.Muon(lr=0.02), "other": refopt.AdamW(lr=1e-3)}
    rule = Partition(rules=rules, labels=lambda p, x: "hidden" if x.size >= 4 else "other")
    params = {"a": np.ones((2, 3)), "b": np.ones(3)}
    grads = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones(3)}
    s = refopt.init(rule, params)
    new, _ = refopt.update(rule, s, params, grads)
    alone, _ = refopt.update(rules["hidden"], refopt.init(rules["hidden"], params["a"]), params["a"], grads["a"])
    assert np.array_equal(new["a"], alone)

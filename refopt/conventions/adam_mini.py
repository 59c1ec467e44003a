"""Adam-mini (refopt/rules/adam_mini.py) to pytorch_optimizer.AdamMini 4.1.0, which picks each parameter's blocks
by its name in ``model.named_parameters()``: names holding ``embed``, ``embd``, ``wte``, ``lm_head.weight`` or
``output.weight`` step with Adam (one block per entry); ``q_proj.weight``, ``k_proj.weight``, ``wq.weight`` or
``wk.weight`` with one block of num_embeds^2 / num_heads entries per head; every other array with one block; names
holding ``norm`` or ``ln_f`` do not decay. The decay is decoupled and before the step, eps outside the root.

The package takes a model, not a parameter list: docs/factories/adam_mini.py builds a ``torch.nn.Module`` whose
parameter names are refopt's leaf paths in torch's spelling (:func:`torch_name`: ``blocks[0].attn.w_q`` ->
``blocks.0.attn.wq.weight``), and ``like("pytorch_optimizer.AdamMini", ...)`` reads the same names
(:class:`PytorchOptimizerBlocks`). The package keeps its moments and the gradient in float32 whatever the params'
dtype (``torch.float32`` is written into the module): :func:`pytorch_optimizer_adam_mini` with
``state_dtype='params'`` runs the package's own code with that constant read as the params' dtype, so the
float64 cross-check compares its arithmetic at 1e-12; ``'float32'`` is the package as it ships. The authors'
package (adam-mini 1.1.1) partitions value, attention-output and MLP matrices by output neuron and embeddings by
token, which pytorch_optimizer keeps whole: the atlas entry ``adam-mini-blocks`` measures it. torch.optim and
optax ship no Adam-mini."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from refopt.conventions._spec import (NO_MAXIMIZE, Conventions, Example, ModuleWith, Oracle, PeerMapping, Preset, gamma,
                                      is_number, is_positive_int, patched, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adam_mini import AdamMini

#: refopt.models.gpt's attention matrices under the names pytorch_optimizer's AdamMini reads
_TORCH_NAMES = {"w_q": "wq", "w_k": "wk", "w_v": "wv", "w_o": "wo"}
_EMBED = ("embed", "embd", "wte", "lm_head.weight", "output.weight")
_QK = ("k_proj.weight", "q_proj.weight", "wq.weight", "wk.weight")
_FUSED = ("attn.attn.weight", "attn.qkv.weight")


def torch_name(path: str) -> str:
    """The torch parameter name of refopt leaf ``path``: indices as dotted parts, the GPT's attention matrices
    w_q, w_k, w_v, w_o as wq, wk, wv, wo, and ``.weight`` appended (``blocks[0].attn.w_q`` ->
    ``blocks.0.attn.wq.weight``, ``wte`` -> ``wte.weight``)."""
    parts = re.sub(r"\[(\d+)\]", r".\1", path).split(".")
    parts[-1] = _TORCH_NAMES.get(parts[-1], parts[-1])
    return ".".join(parts + ["weight"])


@dataclass(frozen=True)
class PytorchOptimizerBlocks:
    """pytorch_optimizer AdamMini's choice of blocks for the array at ``path`` (its torch name
    :func:`torch_name`): ``'element'`` for the embedding names, ``'heads'`` for the query and key names, else
    ``'tensor'``. The package's head is num_embeds^2 / num_heads consecutive entries of torch's (out, in)
    matrix, which is head_dim = num_embeds / num_heads output neurons where fan_in = num_embeds; another fan_in,
    and the fused ``attn.qkv.weight``, raise ValueError naming the path."""

    num_embeds: int
    num_heads: int

    def __call__(self, path: str, x: np.ndarray) -> str:
        name = torch_name(path)
        if any(b in name for b in _EMBED):
            return "element"
        if any(b in name for b in _QK):
            if x.ndim != 2 or x.shape[0] != self.num_embeds:
                raise ValueError(f"like('pytorch_optimizer.AdamMini'): {path} ({name}) is a query or key array of "
                                 f"shape {x.shape}; refopt reproduces the package's heads on (num_embeds={self.num_embeds}"
                                 f", fan_out) matrices only")
            return "heads"
        if any(b in name for b in _FUSED):
            raise ValueError(f"like('pytorch_optimizer.AdamMini'): {path} ({name}) is a fused attention matrix; "
                             f"refopt does not reproduce the package's query-group blocks")
        return "tensor"


@dataclass(frozen=True)
class PytorchOptimizerDecayMask:
    """pytorch_optimizer AdamMini's decay mask: False (no decay) where the torch name holds ``norm`` or
    ``ln_f``."""

    def __call__(self, path: str, x: np.ndarray) -> bool:
        name = torch_name(path)
        return not ("norm" in name or "ln_f" in name)


#: the authors' name sets (adam-mini 1.1.1): each a partition of Zhang et al. 2024, Section 2
_AUTHORS_ROW = ("embed", "embd", "wte", "lm_head", "output", "final_layer")      # one block per token
_AUTHORS_HEADS = ("k_proj", "q_proj", "wq", "wk", "query", "key")
_AUTHORS_NEURON = ("v_proj", "wv", "value", "o_proj", "wo", "attn.proj", "feed_forward", "linear", "mlp")


@dataclass(frozen=True)
class AuthorsBlocks:
    """The partition of the paper (Zhang et al. 2024, Section 2 and its Algorithm 3) as the authors' package
    (adam-mini 1.1.1) reads it from the torch name (:func:`torch_name`): embedding and output tables one block per
    token (``'row'``), query and key one per head, value, attention output and MLP matrices one per output neuron
    (``'fan_out'``), biases Adam (``'element'``), every other array one block (norms: ``'tensor'``)."""

    def __call__(self, path: str, x: np.ndarray) -> str:
        name = torch_name(path)
        if x.ndim < 2:
            return "element" if "bias" in name else "tensor"
        if any(b in name for b in _AUTHORS_ROW):
            return "row"
        if any(b in name for b in _AUTHORS_HEADS):
            return "heads"
        if any(b in name for b in _AUTHORS_NEURON):
            return "fan_out"
        return "tensor"


def block_ids(block: str, shape: tuple, head_dim) -> np.ndarray:
    """The block of every entry of an array of ``shape``, as an int array of that shape."""
    idx = np.indices(shape) if shape else np.zeros((0,), int)
    if block == "element":
        return np.arange(int(np.prod(shape))).reshape(shape)
    if block == "tensor":
        return np.zeros(shape, int)
    if block == "fan_out":
        return idx[-1]
    if block == "row":
        return idx[0]
    return idx[1] // head_dim


class AdamMiniOracle(Oracle):
    """Adam-mini from the rule's docstring: each block's mean of g^2 taken over the entries that carry its id
    (:func:`block_ids`). Switches: ``block`` (every array on that partition, e.g. 'element': Adam), ``reduce``
    'mean' | 'sum' (the block's sum of squares), ``decay`` 'before' | 'after' (x_t (1 - lr lambda)),
    ``bias2`` False (no sqrt(1 - beta2^t))."""

    def _block(self, x, path):
        r = self.rule
        b = self.switches.get("block") or (r.block(path, x) if callable(r.block) else r.block)
        return b

    def init_leaf(self, x, path):
        ids = block_ids(self._block(x, path), x.shape, self.rule.head_dim)
        return {"m": np.zeros_like(x), "v": np.zeros(ids.max(initial=0) + 1, x.dtype)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        ids = block_ids(self._block(x, path), x.shape, r.head_dim)
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
        g2 = g * g
        red = np.sum if self.switches.get("reduce", "mean") == "sum" else np.mean
        block_g2 = np.array([red(g2[ids == b]) for b in range(s["v"].size)], d)
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * block_g2
        bc2 = 1.0 - r.beta2 ** t if self.switches.get("bias2", True) else 1.0
        h = np.sqrt(s["v"]) / scalar(np.sqrt(bc2), d) + scalar(r.eps, d)
        return s["m"] / (scalar(1.0 - r.beta1 ** t, d) * h[ids])

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        decayed = r.decay_mask is None or r.decay_mask(path, x)
        keep = scalar(1.0 - lr * r.weight_decay if decayed else 1.0, x.dtype)
        after = self.switches.get("decay", "before") == "after"
        u = self.direction_leaf(t, s, x, g, path)
        x = x - scalar(lr, x.dtype) * u if after else keep * x - scalar(lr, x.dtype) * u
        return keep * x if after else x


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "Adam's per-entry v", "one second moment per entry (Adam) in place of one per block",
             block="element"),
           v(rule, "block sum of squares", "v averages the block's sum of g^2 in place of its mean", reduce="sum"),
           v(rule, "no second-moment bias correction", "sqrt(v_t) in place of sqrt(v_t) / sqrt(1 - beta2^t)",
             bias2=False)]
    if rule.weight_decay > 0:
        out.append(v(rule, "decay after the step", "x_t (1 - lr lambda) in place of the decay of x_{t-1} before "
                     "the step", decay="after"))
    return out


def facts(rule, of):
    """m / sqrt(v) has degree 0 in g (eps -> 0); with beta1 = beta2 = 0 each step sees only g_t over its blocks'
    RMS. One block per entry is Adam (a permutation of the entries commutes with it); one block per array uses
    the array's mean square, which every permutation and every rotation (U g V^T) keeps. The per-neuron, per-token
    and per-head blocks hold for neither."""
    whole = not callable(rule.block) and rule.block == "tensor"
    return {"grad_scale": True, "step_scale_free": rule.beta1 == 0 and rule.beta2 == 0,
            "elementwise": not callable(rule.block) and rule.block in ("element", "tensor"), "orthogonal": whole}


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def named_module(named_params):
    """A ``torch.nn.Module`` whose ``named_parameters()`` are ``[(torch_name(path), param), ...]`` for the given
    ``[(path, param), ...]`` (submodules made for every dotted prefix)."""
    import torch

    root = torch.nn.Module()
    for path, p in named_params:
        *mods, leaf = torch_name(path).split(".")
        node = root
        for m in mods:
            if m not in node._modules:
                node.add_module(m, torch.nn.Module())
            node = node._modules[m]
        node.register_parameter(leaf, p)
    return root


def pytorch_optimizer_adam_mini(named_params, state_dtype: str = "params", **kwargs):
    """``pytorch_optimizer.AdamMini(named_module(named_params), **kwargs)``. ``state_dtype``: 'params' runs the
    package with its float32 (the gradient's cast, m and v) read as the parameters' dtype during construction and
    every step; 'float32' is the package as it ships."""
    import torch

    import pytorch_optimizer.optimizer.adam_mini as module
    from pytorch_optimizer import AdamMini as Package

    if state_dtype not in ("params", "float32"):
        raise ValueError(f"state_dtype must be 'params' or 'float32', got {state_dtype!r}")
    named_params = list(named_params)
    model = named_module(named_params)
    if state_dtype == "float32":
        return Package(model, **kwargs)
    dtypes = {p.dtype for _, p in named_params}
    if len(dtypes) != 1:
        raise ValueError(f"state_dtype='params' needs one params dtype, got {sorted(map(str, dtypes))}")
    reading = ModuleWith(torch, float32=dtypes.pop())     # torch.float32 read as the params' dtype

    class AdamMiniParamsDtype(Package):
        def __init__(self, *a, **kw):
            with patched(module, torch=reading):
                super().__init__(*a, **kw)

        def step(self, closure=None):
            with patched(module, torch=reading):
                return super().step(closure)

    return AdamMiniParamsDtype(model, **kwargs)


pytorch_optimizer_adam_mini.named_parameters = True     # the cross-check hands it [(path, param), ...]


def _pytorch_optimizer(lr, betas, weight_decay, num_embeds, num_heads, eps):
    b1, b2 = betas
    return AdamMini(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay,
                    block=PytorchOptimizerBlocks(int(num_embeds), int(num_heads)),
                    head_dim=int(num_embeds) // int(num_heads), decay_mask=PytorchOptimizerDecayMask())


def _match(rule):
    if type(rule) is not AdamMini or rule.schedule is not None or not isinstance(rule.block, PytorchOptimizerBlocks) \
            or not isinstance(rule.decay_mask, PytorchOptimizerDecayMask) \
            or rule.head_dim != rule.block.num_embeds // rule.block.num_heads:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), weight_decay=rule.weight_decay,
                num_embeds=rule.block.num_embeds, num_heads=rule.block.num_heads, eps=rule.eps)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.AdamMini", "pytorch_optimizer", "AdamMini",
    dict(lr=1.0, betas=(0.9, 0.999), weight_decay=0.1, num_embeds=2048, num_heads=32, eps=1e-8),
    _pytorch_optimizer, "adam_mini", ignore=("foreach",),
    refuse={"model_sharding": (lambda v: v is False, "refopt steps one process: the sharded statistics belong to "
                                                     "the distributed check"),
            "num_query_groups": (lambda v: v is None, "query groups only shape the fused attn.qkv.weight blocks, "
                                                      "which refopt does not reproduce"),
            "num_embeds": (is_positive_int, "num_embeds must be an int > 0"),
            "num_heads": (is_positive_int, "num_heads must be an int > 0"),
            "eps": (lambda v: is_number(v) and v > 0, "eps = 0 divides by zero on a block whose gradient is zero; "
                                                    "refopt's AdamMini takes eps > 0"),
            "maximize": NO_MAXIMIZE},
    state={"m": "m"}, layout="transpose", match=_match, factory=pytorch_optimizer_adam_mini)

def atlas_adam_mini():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    kw = dict(lr=0.01, weight_decay=0.0, num_embeds=16, num_heads=2)
    p = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdamMini", kw, "atlas", factory=pytorch_optimizer_adam_mini)
    authors = AdamMini(lr=0.01, block=AuthorsBlocks(), head_dim=8)
    return Entry(
        "adam-mini-blocks",
        "Adam-mini's blocks: the paper's partition (value, attention output and MLP by output neuron, embeddings by "
        "token) vs pytorch_optimizer's (one block for each of those arrays, embeddings by entry)",
        (peer_side("pytorch_optimizer", p, source="pytorch_optimizer 4.1.0 AdamMini, its float32 read as float64 "
                                                  "(refopt.conventions.adam_mini.pytorch_optimizer_adam_mini)"),
         restated_side("paper", "Zhang et al. 2024, the partition of Section 2 as the authors' adam-mini 1.1.1 reads "
                       "it from parameter names", lambda: authors, oracle=lambda: AdamMiniOracle(authors),
                       source="arXiv:2406.16793, Algorithm 1 and Section 2; adam-mini 1.1.1")),
        (Pair("pytorch_optimizer", "paper", "final", 1e-2, what="params after 50 steps on the GPT at lr 0.01: the "
                                                              "blocks"),),
        "The paper (and the authors' package) gives value, attention-output and MLP matrices one learning rate per "
        "output neuron and embeddings one per token, from the block-diagonal Hessian of each; pytorch_optimizer "
        "keeps one second moment for each of those whole matrices and Adam's per-entry one for the embeddings. "
        "Both give query and key one block per head. refopt's AdamMini takes either (AuthorsBlocks, "
        "PytorchOptimizerBlocks, or any function of the path).",
        "Zhang et al. 2024 (arXiv:2406.16793); adam-mini 1.1.1; pytorch_optimizer 4.1.0", problem="gpt", named=True)


_F = dict(factory=pytorch_optimizer_adam_mini)
_GPT = dict(num_embeds=16, num_heads=2)      # the cross-check's GPT: C = 16, H = 2
_KW = dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.05, eps=1e-6, **_GPT)

CONVENTIONS = Conventions(
    rules=(AdamMini,),
    final="m_t / ((1 - beta1^t)(sqrt(v_B) / sqrt(1 - beta2^t) + eps)) with v_B one second moment per block: which "
          "blocks (entries, heads, neurons, the whole array), mean or sum of g^2, the bias corrections",
    per_step="lr_t / (1 - beta1^t)",
    mappings=(PYTORCH_OPTIMIZER,),
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdamMini", dict(lr=0.01, **_GPT),
                                 "embeddings by entry, wq / wk by head, the rest one block each, norms undecayed, "
                                 "decoupled decay 0.1 before the step; the state in the params' dtype", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdamMini(betas,wd,eps)", _KW,
                                 "betas (0.8, 0.99), decay 0.05, eps 1e-6 outside the root", **_F)),
    wrong=(Preset("WRONG blocks: pytorch_optimizer.AdamMini vs refopt AdamMini(block='element')",
                  "pytorch_optimizer", "adam_mini", ("AdamMini", dict(lr=0.01, weight_decay=0.0, **_GPT)),
                  lambda: AdamMini(lr=0.01, block="element"),
                  "Adam's per-entry second moment for the package's one per block", layout="transpose",
                  expect_fail=True, **_F),),
    no_peer={"torch": "torch.optim ships no Adam-mini", "optax": "optax 0.2.8 ships no Adam-mini",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=AdamMiniOracle,
    variants=variants,
    facts=facts,
    atlas=(atlas_adam_mini,),
    golden=(GoldenCase("adam_mini", lambda: AdamMini(lr=0.02, beta1=0.8, beta2=0.99, weight_decay=0.1,
                                                     block=_matrix_heads, head_dim=4),
                       "AdamMini, the matrix by heads of 4 output neurons, the vector one block", ("m", "v")),
            GoldenCase("adam_mini_pytorch_optimizer", lambda: PYTORCH_OPTIMIZER.rule(**_KW),
                       "like('pytorch_optimizer.AdamMini', betas (0.8, 0.99), wd 0.05, eps 1e-6)", ("m", "v"))),
    examples=(Example("adam_mini", lambda: AdamMini(lr=0.01, weight_decay=0.01)),
              Example("adam_mini_element", lambda: AdamMini(lr=0.01, block="element", beta1=0.0)),
              Example("adam_mini_fan_out", lambda: AdamMini(lr=0.01, block="fan_out"), params="matrix"),
              Example("adam_mini_row", lambda: AdamMini(lr=0.01, block="row"), params="matrix")),
)


def _matrix_heads(path, x):
    """'heads' for a matrix, one block for the rest (the golden case's partition)."""
    return "heads" if x.ndim == 2 else "tensor"

"""A small pre-norm GPT as pure functions over a params pytree, on refopt's autograd.

    x_0 = wte[idx] + wpe[:T]                                               (B, T, C)
    x <- x + Attn(RMSNorm(x; attn_norm))       for each block
    x <- x + FFN(RMSNorm(x; mlp_norm))
    logits = RMSNorm(x; final_norm) @ H,  H = wte^T (tied) or lm_head      (B, T, V)

Attention: q = h W_q, k = h W_k, v = h W_v split into H heads of size hs = C / H, (B, H, T, hs);
optional QK-norm (RMSNorm over hs per head, with gains q_norm, k_norm of shape (hs,) when
``qk_norm_gain``); softmax(q k^T / sqrt(hs)) with a causal mask by selection; heads merged, then W_o.
FFN kinds (Shazeer 2020, arXiv:2002.05202): 'swiglu' (silu(h W_gate) * h W_up) W_down,
'reglu' (relu(h W_gate) * h W_up) W_down, 'gelu' gelu(h W_up) W_down (exact erf GELU).
RMSNorm: gain * x / sqrt(mean(x^2) + norm_eps) (eps inside the root).

Parameter names (layout x @ W, W of shape (fan_in, fan_out)):
    wte (V, C), wpe (block_size, C), final_norm (C,), lm_head (C, V) when not tied,
    blocks[i].attn_norm (C,), blocks[i].mlp_norm (C,),
    blocks[i].attn.w_q / w_k / w_v / w_o (C, C), blocks[i].attn.q_norm / k_norm (hs,) with QK-norm gains,
    blocks[i].mlp.w_up (C, F), blocks[i].mlp.w_gate (C, F) (GLU kinds only), blocks[i].mlp.w_down (F, C).
The config is passed explicitly to every function; params hold arrays only.

Two implementations of one model: ``fused=True`` (default) packs [W_q | W_k | W_v] and [W_gate | W_up] into
single GEMMs and runs RMSNorm, attention (QK-norm included), the feed-forward activation, the output
projections with their residual adds, the cross-entropy and the embedding's scatter-add as fused
primitives (numba kernels, BLAS for the products);
``fused=False`` is the reference, composed from elementary primitives (matmul, mean, power, softmax,
silu, log_softmax, getitem ...). tests/test_fused.py holds them equal (float64 1e-12, float32 1e-5).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from refopt import autograd as ag
from refopt import tree as _tree
from refopt.labels import gpt_labels

FFN_KINDS = ("swiglu", "reglu", "gelu")
INIT_SCHEMES = ("normal", "mup")


@dataclass(frozen=True)
class GPTConfig:
    """Hyperparameters of the GPT.

    vocab_size V, block_size (max context T), n_layer, n_head H, n_embd C (divisible by H);
    ffn in {'swiglu', 'reglu', 'gelu'}; ffn_hidden F (default: 4C for 'gelu'; for the GLU kinds
    8C/3 rounded up to a multiple of 32, which keeps the parameter count near the 4C MLP's);
    qk_norm / qk_norm_gain: RMSNorm on q and k per head, with learned gains of shape (hs,);
    tie_head: logits use wte^T instead of a separate lm_head; norm_eps >= 0 inside every RMSNorm root;
    init 'normal' or 'mup' and init_std (see :func:`init`); zero_init_out_proj: W_o and W_down start at 0.

    Raises: ValueError for non-positive sizes, n_embd not divisible by n_head, an unknown ffn or init,
    a non-bool flag, norm_eps < 0 or init_std <= 0.
    """

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    ffn: str = "swiglu"
    ffn_hidden: int | None = None
    qk_norm: bool = False
    qk_norm_gain: bool = True
    tie_head: bool = True
    norm_eps: float = 1e-6
    init: str = "normal"
    init_std: float = 0.02
    zero_init_out_proj: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for name in ("qk_norm", "qk_norm_gain", "tie_head", "zero_init_out_proj"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"GPTConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.ffn not in FFN_KINDS:
            raise ValueError(f"GPTConfig.ffn must be one of {FFN_KINDS}, got {self.ffn!r}")
        if self.init not in INIT_SCHEMES:
            raise ValueError(f"GPTConfig.init must be one of {INIT_SCHEMES}, got {self.init!r}")
        if not (self.norm_eps >= 0):
            raise ValueError(f"GPTConfig.norm_eps must be >= 0, got {self.norm_eps}")
        if not (self.init_std > 0):
            raise ValueError(f"GPTConfig.init_std must be > 0, got {self.init_std}")
        if self.ffn_hidden is None:
            hidden = 4 * self.n_embd if self.ffn == "gelu" else -(-8 * self.n_embd // 3 // 32) * 32
            object.__setattr__(self, "ffn_hidden", max(hidden, 1))
        elif isinstance(self.ffn_hidden, bool) or not isinstance(self.ffn_hidden, (int, np.integer)) \
                or self.ffn_hidden < 1:
            raise ValueError(f"GPTConfig.ffn_hidden must be a positive int or None, got {self.ffn_hidden!r}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- parameters ------------------------------------------------------------------------------------
def shapes(config: GPTConfig) -> dict:
    """The params pytree with each leaf replaced by its shape tuple."""
    C, F, hs = config.n_embd, config.ffn_hidden, config.head_size
    attn = {n: (C, C) for n in ("w_q", "w_k", "w_v", "w_o")}
    if config.qk_norm and config.qk_norm_gain:
        attn.update(q_norm=(hs,), k_norm=(hs,))
    mlp = {"w_up": (C, F), "w_down": (F, C)}
    if config.ffn != "gelu":
        mlp["w_gate"] = (C, F)
    block = {"attn_norm": (C,), "attn": attn, "mlp_norm": (C,), "mlp": mlp}
    out = {"wte": (config.vocab_size, C), "wpe": (config.block_size, C), "final_norm": (C,),
           "blocks": [dict(block) for _ in range(config.n_layer)]}
    if not config.tie_head:
        out["lm_head"] = (C, config.vocab_size)
    return out


def init(config: GPTConfig, seed: int = 0, dtype=np.float32) -> dict:
    """Random parameters for ``config``.

    * Gains (attn_norm, mlp_norm, final_norm, q_norm, k_norm) are 1.
    * wte, wpe ~ N(0, init_std^2) in both schemes.
    * init='normal' (GPT-2 / nanoGPT): every matrix ~ N(0, init_std^2), except the residual output
      projections W_o and W_down ~ N(0, init_std^2 / (2 n_layer)); lm_head ~ N(0, init_std^2).
    * init='mup' (post 003): every matrix of shape (d_in, d_out), lm_head included, has
      sigma = sqrt(d_out/d_in) / (sqrt(d_in) + sqrt(d_out)), so that x -> x W keeps an RMS-1 input at
      RMS Theta(1) (the spectral norm of a Gaussian d_in x d_out matrix is about sqrt(d_in) + sqrt(d_out)).
    * zero_init_out_proj: W_o and W_down are 0 (after the draws, so other leaves do not change).

    Draws come from ``numpy.random.default_rng(seed)`` in float64, in the flatten order of the params
    tree (sorted dict keys), and are then cast to ``dtype``: float32 and float64 params agree to
    rounding. Raises ValueError for a non-floating dtype.
    """
    if np.dtype(dtype).kind != "f":
        raise ValueError(f"init: dtype must be floating, got {np.dtype(dtype)}")
    rng = np.random.default_rng(seed)
    sh_leaves, paths, treedef = _tree.flatten(shapes(config), is_leaf=lambda x: isinstance(x, tuple))
    leaves = []
    for path, shape in zip(paths, sh_leaves):
        name = path.rsplit(".", 1)[-1]
        if len(shape) == 1:
            leaves.append(np.ones(shape, dtype))
            continue
        if name in ("wte", "wpe"):
            std = config.init_std
        elif config.init == "mup":
            d_in, d_out = shape
            std = np.sqrt(d_out / d_in) / (np.sqrt(d_in) + np.sqrt(d_out))
        elif name in ("w_o", "w_down"):
            std = config.init_std / np.sqrt(2 * config.n_layer)
        else:
            std = config.init_std
        w = rng.standard_normal(shape) * std
        if config.zero_init_out_proj and name in ("w_o", "w_down"):
            w[...] = 0.0
        leaves.append(w.astype(dtype))
    return _tree.unflatten(treedef, leaves)


def check_params(params, config: GPTConfig) -> None:
    """Raise ValueError naming the first leaf path whose structure or shape disagrees with ``config``."""
    want = shapes(config)
    _tree.check_same_structure(want, params, names=("config", "params"), is_leaf=lambda x: isinstance(x, tuple))
    got, paths, _ = _tree.flatten(params)
    for path, shape, leaf in zip(paths, _tree.flatten(want, is_leaf=lambda x: isinstance(x, tuple))[0], got):
        if tuple(np.shape(ag.value(leaf))) != shape:
            raise ValueError(f"params leaf {path} has shape {np.shape(ag.value(leaf))}, config expects {shape}")


def num_params(config: GPTConfig) -> int:
    """Number of scalar parameters (a tied wte counted once)."""
    sh = _tree.leaves(shapes(config), is_leaf=lambda x: isinstance(x, tuple))
    return int(sum(np.prod(s) for s in sh))


# ---- forward ---------------------------------------------------------------------------------------
def _check_idx(idx, config: GPTConfig) -> np.ndarray:
    idx = np.asarray(idx)
    if idx.ndim != 2 or idx.dtype.kind not in "iu":
        raise ValueError(f"idx must be a (B, T) integer array, got shape {idx.shape} dtype {idx.dtype}")
    if idx.shape[1] > config.block_size or idx.shape[1] < 1:
        raise ValueError(f"sequence length {idx.shape[1]} must be in [1, block_size={config.block_size}]")
    return idx


def linear(x, w):
    """x @ w for x (..., fan_in), w (fan_in, fan_out), as one 2-D GEMM over all leading axes (NumPy's
    own ``@`` would loop over the batch axis for plain arrays, one small GEMM per sequence)."""
    return ag.matmul(x, w)


def _attention(x, p: dict, h, config: GPTConfig):
    """x + the fused attention sublayer of h: one GEMM for [W_q | W_k | W_v], the fused causal attention
    kernel (QK-norm inside it), then W_o with the residual add (``residual_linear``)."""
    qkv = ag.linear_concat(h, [p["w_q"], p["w_k"], p["w_v"]])                # (B, T, 3C)
    gains = (p.get("q_norm"), p.get("k_norm")) if config.qk_norm else (None, None)
    y = ag.self_attention(qkv, config.n_head, *gains, qk_norm=config.qk_norm, eps=config.norm_eps)
    return ag.residual_linear(x, y, p["w_o"])


def _ffn(x, p: dict, h, config: GPTConfig):
    """x + the fused feed-forward sublayer of h: one GEMM for [W_gate | W_up] (GLU kinds), the fused
    activation, then W_down with the residual add."""
    if config.ffn == "gelu":
        return ag.residual_linear(x, ag.ffn_activation(linear(h, p["w_up"]), "gelu"), p["w_down"])
    a = ag.ffn_activation(ag.linear_concat(h, [p["w_gate"], p["w_up"]]), config.ffn)
    return ag.residual_linear(x, a, p["w_down"])


# ---- the unfused reference: the same model composed from elementary primitives ---------------------
def _rms_norm_reference(x, gain, eps):
    """gain * x / sqrt(mean(x^2) + eps), composed (mul, mean, add, power)."""
    y = x * (ag.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if gain is None else y * gain


def _attention_reference(x, p: dict, h, config: GPTConfig):
    B, T, C = h.shape
    H, hs = config.n_head, config.head_size

    def heads(t):  # (B, T, C) -> (B, H, T, hs)
        return t.reshape(B, T, H, hs).transpose(0, 2, 1, 3)

    q, k, v = heads(linear(h, p["w_q"])), heads(linear(h, p["w_k"])), heads(linear(h, p["w_v"]))
    if config.qk_norm:
        q = _rms_norm_reference(q, p.get("q_norm"), config.norm_eps)
        k = _rms_norm_reference(k, p.get("k_norm"), config.norm_eps)
    dt = ag.value(h).dtype
    mask = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, 0.0).astype(dt)  # -inf selects j > i out
    S = (q @ k.transpose(0, 1, 3, 2)) * dt.type(1 / np.sqrt(hs)) + mask
    y = ag.softmax(S, axis=-1) @ v                                         # (B, H, T, hs)
    return x + linear(y.transpose(0, 2, 1, 3).reshape(B, T, C), p["w_o"])


def _ffn_reference(x, p: dict, h, config: GPTConfig):
    if config.ffn == "gelu":
        return x + linear(ag.gelu(linear(h, p["w_up"])), p["w_down"])
    act = ag.silu if config.ffn == "swiglu" else ag.relu
    return x + linear(act(linear(h, p["w_gate"])) * linear(h, p["w_up"]), p["w_down"])


def apply(params: dict, idx, config: GPTConfig, *, fused: bool = True, check: bool = True):
    """Logits (B, T, V) for token ids idx (B, T), T <= block_size. Plain arrays in, ndarray out; traced
    params in (under ``value_and_grad``), node out. dtype follows the params.

    ``fused=True`` (the default) runs the fused primitives (numba kernels for RMSNorm, attention, the
    feed-forward activation, packed q/k/v and gate/up GEMMs); ``fused=False`` runs the reference: the same
    model composed from elementary primitives (matmul, mean, power, softmax, silu ...), which the fused
    path must match (tests/test_fused.py). ``check=False`` skips the per-call parameter check (about
    0.7 ms), for loops that checked the params once (``check_params``).

    Raises: ValueError for params that do not match ``config`` (naming the leaf), or a bad idx.
    """
    if check:
        check_params(params, config)
    idx = _check_idx(idx, config)
    eps = config.norm_eps
    T = idx.shape[1]
    norm = ag.rms_norm if fused else _rms_norm_reference
    attn, ffn = (_attention, _ffn) if fused else (_attention_reference, _ffn_reference)
    emb = ag.embedding(params["wte"], idx) if fused else params["wte"][idx]
    x = emb + params["wpe"][:T]                                             # (B, T, C)
    for blk in params["blocks"]:
        x = attn(x, blk["attn"], norm(x, blk["attn_norm"], eps), config)       # x + Attn(RMSNorm(x))
        x = ffn(x, blk["mlp"], norm(x, blk["mlp_norm"], eps), config)          # x + FFN(RMSNorm(x))
    x = norm(x, params["final_norm"], eps)
    head = params["wte"].T if config.tie_head else params["lm_head"]
    return linear(x, head)                                                  # (B, T, V)


def _cross_entropy_reference(logits, targets, ignore_index):
    """-mean over valid rows of log_softmax(logits)[row, target], composed (log_softmax, getitem, mean)."""
    V = logits.shape[-1]
    t = np.asarray(targets).reshape(-1)
    rows = np.nonzero(t != ignore_index)[0] if ignore_index is not None else np.arange(len(t))
    logp = ag.log_softmax(logits.reshape(-1, V), axis=-1)
    return -ag.mean(logp[rows, t[rows]])


def loss(params: dict, idx, targets, config: GPTConfig, ignore_index: int | None = None, *, fused: bool = True,
         check: bool = True):
    """Mean next-token cross-entropy (nats) of ``apply(params, idx, config)`` against targets (B, T),
    skipping targets equal to ``ignore_index``. Returns a 0-d array (or node) of the params' dtype.
    ``fused`` and ``check`` as in :func:`apply` (the reference composes the cross-entropy too)."""
    logits = apply(params, idx, config, fused=fused, check=check)
    if fused:
        return ag.cross_entropy(logits, targets, ignore_index=ignore_index)
    return _cross_entropy_reference(logits, targets, ignore_index)


def generate(params: dict, idx, n_new: int, temperature: float, seed: int, config: GPTConfig) -> np.ndarray:
    """Extend idx (B, T0) by ``n_new`` sampled tokens -> (B, T0 + n_new) int64.

    Each step feeds the last ``block_size`` tokens, takes the last position's logits / temperature and
    samples from the softmax by inverse CDF with ``numpy.random.default_rng(seed)`` (one uniform per row
    per step), so the output is a deterministic function of the arguments. temperature = 0 is greedy
    (arg-max). BLAS runs single-threaded here (``threadpoolctl``): the per-token GEMMs are tiny, and
    waking BLAS threads for each costs more than it saves (10x slower on a busy 2-core machine).
    Raises ValueError for temperature < 0, n_new < 0 or a bad idx.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _generate(params, idx, n_new, temperature, seed, config)


def _generate(params: dict, idx, n_new: int, temperature: float, seed: int, config: GPTConfig) -> np.ndarray:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if n_new < 0:
        raise ValueError(f"n_new must be >= 0, got {n_new}")
    check_params(params, config)
    out = np.array(_check_idx(idx, config), dtype=np.int64)
    rng = np.random.default_rng(seed)
    for _ in range(n_new):
        logits = np.asarray(apply(params, out[:, -config.block_size:], config, check=False))
        logits = logits[:, -1, :].astype(np.float64)
        if temperature == 0:
            nxt = np.argmax(logits, axis=-1)
        else:
            p = ag.softmax(logits / temperature, axis=-1)
            cdf = np.cumsum(p, axis=-1)
            u = rng.random(len(out))[:, None] * cdf[:, -1:]
            nxt = np.minimum((cdf <= u).sum(axis=-1), logits.shape[-1] - 1)
        out = np.concatenate([out, nxt[:, None].astype(np.int64)], axis=1)
    return out


# --- parameter groups -------------------------------------------------------------------------------------

def param_label(path: str, x: np.ndarray) -> str:
    """The parameter group ('hidden' / 'other') of one array of the GPT: :func:`refopt.gpt_labels` (see there;
    a function of this module too, so that checkpoints naming ``refopt.models.gpt.param_label`` load)."""
    return gpt_labels(path, x)


def labels(params: dict) -> dict:
    """The parameter groups of ``params`` as data: a tree of ``'hidden'`` / ``'other'`` strings shaped like
    the params (:func:`param_label` of each array), for ``refopt.Partition(labels=...)``; checkpoints store it."""
    xs, paths, td = _tree.flatten(params)
    return _tree.unflatten(td, [param_label(p, x) for p, x in zip(paths, xs)])

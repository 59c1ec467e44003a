"""Fused primitives for networks: softmax, log_softmax, cross_entropy, rms_norm, embedding, attention, swiglu,
and the GPT's model-level ones: linear_concat (packed q/k/v and gate/up GEMMs), self_attention (causal
multi-head attention of a packed qkv, QK-norm inside), ffn_activation (SwiGLU / ReGLU / GELU),
residual_linear (x + h @ w: an output projection and its residual add).

Each is one primitive with a hand-written VJP, faster and more stable than
composing the pointwise ops, and each has its own finite-difference test; the model-level ones are also
checked against the unfused composition of elementary primitives (``models.gpt.loss(..., fused=False)``,
tests/test_fused.py). The row-wise work runs in numba kernels (``refopt.fast.autograd_kernels``), the matrix
products in BLAS (``refopt.fast.blas``).
Like every primitive they return plain ndarrays when no input is a traced node. All keep the input dtype.
"""
from __future__ import annotations

import numpy as np

from ..fast import autograd_kernels, blas
from .core import Node

#: the products (MKL on the fused kernels' OpenMP threads when installed, else NumPy's BLAS); the attention's
#: stacks of small products too (MKL's strided batches over the batch axis, one call per head, reading the
#: heads in place)
_gemm = blas.matmul


def _shifted(z: np.ndarray, axis: int) -> np.ndarray:
    """z - max(z) along ``axis``; the max is a constant (softmax is shift invariant). A row that is all
    -inf gets shift 0 instead of NaN."""
    m = np.max(z, axis=axis, keepdims=True)
    if not np.all(np.isfinite(m)):
        m = np.where(np.isfinite(m), m, 0).astype(z.dtype)
    return z - m


def softmax(z, axis: int = -1):
    """softmax(z)_i = exp(z_i - m) / sum_j exp(z_j - m), m = max_j z_j (so huge logits do not overflow;
    PITFALLS.md B21). VJP: y * (g - sum(g * y)). Shapes: any, reduced along ``axis``.

    A fully masked row (all -inf) gives all zeros, not NaN, and hence a zero VJP (the convention of
    PyTorch's ``_safe_softmax``, pytorch/pytorch PR #131060). No 0/0 is evaluated.
    """
    zv = z.value if isinstance(z, Node) else np.asarray(z)
    e = np.exp(_shifted(zv, axis))
    d = np.sum(e, axis=axis, keepdims=True)
    if not np.all(d > 0):  # only fully masked rows (e == 0 there): divide them by 1 -> 0
        d = np.where(d > 0, d, np.ones_like(d))
    y = e / d
    if not isinstance(z, Node):
        return y
    return Node(y, (z,), lambda g: (y * (g - np.sum(g * y, axis=axis, keepdims=True)),))


def log_softmax(z, axis: int = -1):
    """log_softmax(z) = (z - m) - log(sum exp(z - m)), never log(softmax(z)).
    VJP: g - softmax(z) * sum(g).

    A fully masked row (all -inf) gives all -inf (= log of softmax's zero row), not NaN, without
    evaluating log(0) or -inf - -inf.
    """
    zv = z.value if isinstance(z, Node) else np.asarray(z)
    s = _shifted(zv, axis)
    d = np.sum(np.exp(s), axis=axis, keepdims=True)
    if np.all(d > 0):
        out = s - np.log(d)
    else:  # fully masked rows: log(1) = 0 there, and s is already -inf on those rows
        out = s - np.log(np.where(d > 0, d, np.ones_like(d)))
    if not isinstance(z, Node):
        return out
    return Node(out, (z,), lambda g: (g - np.exp(out) * np.sum(g, axis=axis, keepdims=True),))


def cross_entropy(logits, targets, ignore_index: int | None = None):
    """Mean softmax cross-entropy over the rows whose target is not ``ignore_index``.

    loss = (1/N) sum_i [lse(z_i - m_i) - (z_{i,t_i} - m_i)],  m_i = max_j z_ij,  N = number of valid rows.
    VJP (llm.c ``crossentropy_softmax_backward``): g * (softmax(z) - onehot(t)) / N on valid rows, 0 on
    ignored rows.

    exp runs in NumPy (SIMD), the float64 row sums in a numba kernel.
    Shapes: logits (..., V) floating, targets (...) integer. Returns a 0-d array (or node) of logits'
    dtype.
    Raises: ValueError for mismatched shapes, non-integer targets, a target outside [0, V) that is not
    ``ignore_index``, or no valid target at all.
    """
    z = logits.value if isinstance(logits, Node) else np.asarray(logits)
    t = np.asarray(targets)
    if t.dtype.kind not in "iu":
        raise ValueError(f"cross_entropy: targets must be integers, got dtype {t.dtype}")
    if z.ndim < 1 or z.shape[:-1] != t.shape:
        raise ValueError(f"cross_entropy: logits {z.shape} need shape targets.shape + (V,), targets {t.shape}")
    V = z.shape[-1]
    z2, t1 = z.reshape(-1, V), t.reshape(-1)
    valid = np.ones(t1.shape, bool) if ignore_index is None else t1 != ignore_index
    if np.any((t1[valid] < 0) | (t1[valid] >= V)):
        raise ValueError(f"cross_entropy: targets must lie in [0, {V}) (or equal ignore_index={ignore_index})")
    n = int(valid.sum())
    if n == 0:
        raise ValueError("cross_entropy: every target equals ignore_index; the mean is undefined")
    z2 = np.ascontiguousarray(z2)
    dt = z.dtype.type
    lse, per_row = np.empty(len(t1), np.float64), np.empty(len(t1), np.float64)
    t_safe = np.where(valid, t1, 0).astype(np.int64)
    m = np.max(z2, axis=1)
    e = z2 - m[:, None]
    np.exp(e, out=e)                                          # NumPy's SIMD exp
    autograd_kernels._xent_rows(e, z2, t_safe, valid, m, lse, per_row)   # row sums in float64, in index order
    del e
    loss = np.asarray(np.sum(per_row) / n, dtype=z.dtype)
    if not isinstance(logits, Node):
        return loss

    def vjp(g):
        d = z2 - (m + lse).astype(z.dtype)[:, None]           # z - m - lse in z's dtype
        np.exp(d, out=d)                                      # softmax(z)
        scale = dt(g) / dt(n)
        d *= scale
        rows = np.nonzero(valid)[0]
        d[rows, t_safe[rows]] -= scale
        d[~valid] = 0
        return (d.reshape(z.shape),)

    return Node(loss, (logits,), vjp)


def rms_norm(x, gain=None, eps: float = 1e-6):
    """RMSNorm over the last axis (Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4), eps inside the root:

        r = 1 / sqrt(mean(x^2) + eps),   xhat = x * r,   y = gain * xhat   (gain omitted if None)

    VJP with h = g * gain: dx = r * (h - xhat * mean(h * xhat)); dgain = sum over all leading axes of
    g * xhat. Rows are computed by a numba kernel (``refopt.fast.autograd_kernels.rms_norm_fused``) that
    accumulates mean(x^2) and mean(h * xhat) in float64. With eps = 0 an all-zero row gives inf / NaN.
    Shapes: x (..., C), gain (C,) or None. Raises ValueError on a gain of the wrong shape or eps < 0.
    """
    if eps < 0:
        raise ValueError(f"rms_norm: eps must be >= 0, got {eps}")
    xv = x.value if isinstance(x, Node) else np.asarray(x)
    gv = None if gain is None else (gain.value if isinstance(gain, Node) else np.asarray(gain, dtype=xv.dtype))
    if gv is not None and gv.shape != xv.shape[-1:]:
        raise ValueError(f"rms_norm: gain shape {gv.shape} must be ({xv.shape[-1]},)")
    gk = np.ones(xv.shape[-1], xv.dtype) if gv is None else gv
    y, xhat, r = autograd_kernels.rms_norm_fused(xv, gk, eps)  # fused, row-parallel; sum of squares in float64
    if not isinstance(x, Node) and not isinstance(gain, Node):
        return y

    def vjp(g):
        dx, dg = autograd_kernels.rms_norm_fused_vjp(g, gk, xhat, r, isinstance(gain, Node))
        return (dx if isinstance(x, Node) else None), dg

    return Node(y, (x, gain), vjp)


def embedding(table, ids):
    """Row gather ``table[ids]``: table (V, C), integer ids (...) -> (..., C).

    VJP: d table = scatter-add of g's rows into the rows named by ids (repeated ids, the normal case in a
    batch of tokens, accumulate; a serial numba loop over the tokens in order, ``np.add.at`` semantics).
    Raises ValueError for non-integer or out-of-range ids.
    """
    tv = table.value if isinstance(table, Node) else np.asarray(table)
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ValueError(f"embedding: ids must be integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= tv.shape[0]):
        raise ValueError(f"embedding: ids must lie in [0, {tv.shape[0]}), got range [{ids.min()}, {ids.max()}]")
    out = np.take(tv, ids, axis=0)
    if not isinstance(table, Node):
        return out

    def vjp(g):
        d = np.zeros(tv.shape, dtype=g.dtype)
        autograd_kernels._scatter_add_rows(ids.reshape(-1), np.ascontiguousarray(g).reshape(-1, tv.shape[1]), d)
        return (d,)

    return Node(out, (table,), vjp)


def attention(q, k, v, causal: bool = True, scale: float | None = None):
    """Scaled dot-product attention, one primitive over (B, H, T, hs) arrays (batch and heads batched).

        S = scale * q k^T  (B, H, T, T),  S_ij = -inf for j > i when causal,  P = softmax(S),  out = P v

    The causal mask is a selection: the fused kernel (``refopt.fast.autograd_kernels.causal_softmax_``)
    normalises each row over keys j <= i only and writes P = 0 for j > i, never a finite fill, so nothing
    leaks (PITFALLS.md B24); every causal row keeps its diagonal, so no row is NaN.
    ``scale`` defaults to 1/sqrt(hs). VJP (llm.c ``attention_backward``): dv = P^T dO, dP = dO v^T,
    dS = P * (dP - rowsum(dP * P)), dq = scale dS k, dk = scale dS^T q.
    Shapes: q, k (..., Tq, hs), v (..., Tk, hv); causal requires Tq == Tk. Returns (..., Tq, hv).
    """
    qv, kv, vv = (a.value if isinstance(a, Node) else np.asarray(a) for a in (q, k, v))
    if qv.shape[-1] != kv.shape[-1] or kv.shape[-2] != vv.shape[-2]:
        raise ValueError(f"attention: incompatible shapes q {qv.shape}, k {kv.shape}, v {vv.shape}")
    T = qv.shape[-2]
    if causal and kv.shape[-2] != T:
        raise ValueError("attention: causal attention needs as many keys as queries")
    dt = qv.dtype.type
    s = dt(1 / np.sqrt(qv.shape[-1]) if scale is None else scale)
    S = qv @ np.swapaxes(kv, -1, -2)
    if causal:  # S is a fresh C-contiguous array: softmax in place over keys j <= i, P = 0 for j > i
        P = autograd_kernels.causal_softmax_(S, s)
    else:
        S *= s
        S -= np.max(S, axis=-1, keepdims=True)
        P = np.exp(S, out=S)
        P /= np.sum(P, axis=-1, keepdims=True)
    out = P @ vv
    if not any(isinstance(a, Node) for a in (q, k, v)):
        return out

    def vjp(g):
        dv = np.swapaxes(P, -1, -2) @ g if isinstance(v, Node) else None
        dP = g @ np.swapaxes(vv, -1, -2)
        if causal:
            dS = autograd_kernels.causal_softmax_vjp_(P, dP, s)
        else:
            dS = P * (dP - np.sum(dP * P, axis=-1, keepdims=True))
            dS *= s
        dq = dS @ kv if isinstance(q, Node) else None
        dk = np.swapaxes(dS, -1, -2) @ qv if isinstance(k, Node) else None
        return dq, dk, dv

    return Node(out, (q, k, v), vjp)


def swiglu(a, u):
    """The SwiGLU gate h = silu(a) * u = a * sigma(a) * u (Shazeer 2020, arXiv:2002.05202), fused.

    VJP: da = g * u * sigma(a) * (1 + a * (1 - sigma(a))), du = g * a * sigma(a).
    Shapes: a and u of the same shape (no broadcasting). Raises ValueError otherwise.
    """
    av = a.value if isinstance(a, Node) else np.asarray(a)
    uv = u.value if isinstance(u, Node) else np.asarray(u, dtype=av.dtype)
    if av.shape != uv.shape:
        raise ValueError(f"swiglu: gate {av.shape} and up {uv.shape} projections must have the same shape")
    h, sig = autograd_kernels.swiglu(av, uv)
    if not (isinstance(a, Node) or isinstance(u, Node)):
        return h

    def vjp(g):
        da, du = autograd_kernels.swiglu_vjp(g, av, uv, sig)
        return (da if isinstance(a, Node) else None), (du if isinstance(u, Node) else None)

    return Node(h, (a, u), vjp)


# ---- model-level fused primitives (the GPT's hot path) ----------------------------------------------
def linear_concat(x, weights):
    """x @ [W_1 | W_2 | ...]: several linear maps of one input as a single GEMM (e.g. W_q, W_k, W_v).

    Shapes: x (..., K), each W_i (K, n_i) -> (..., sum n_i), the column blocks in the order given.
    VJP: dx = g [W_1 | ...]^T (one GEMM), d[W_1 | ...] = x^T g (one GEMM), split back into the W_i.
    Raises ValueError for mismatched inner sizes or dtypes.
    """
    xv = x.value if isinstance(x, Node) else np.asarray(x)
    wv = [w.value if isinstance(w, Node) else np.asarray(w) for w in weights]
    if any(w.ndim != 2 or w.shape[0] != xv.shape[-1] or w.dtype != xv.dtype for w in wv):
        raise ValueError(f"linear_concat: every weight must be ({xv.shape[-1]}, n) of dtype {xv.dtype}, got "
                         f"{[(w.shape, str(w.dtype)) for w in wv]}")
    K = xv.shape[-1]
    W = np.concatenate(wv, axis=1)
    x2 = xv.reshape(-1, K)
    out = _gemm(x2, W).reshape(xv.shape[:-1] + (W.shape[1],))
    if not (isinstance(x, Node) or any(isinstance(w, Node) for w in weights)):
        return out
    cuts = np.cumsum([w.shape[1] for w in wv])[:-1]

    def vjp(g):
        g2 = g.reshape(-1, W.shape[1])
        dx = _gemm(g2, W.T).reshape(xv.shape) if isinstance(x, Node) else None
        dW = _gemm(x2.T, g2) if any(isinstance(w, Node) for w in weights) else None
        dws = [None] * len(wv) if dW is None else np.split(dW, cuts, axis=1)
        return (dx, *(d if isinstance(w, Node) else None for d, w in zip(dws, weights)))

    return Node(out, (x, *weights), vjp)


def residual_linear(x, h, w):
    """The residual branch's output projection and the residual add, one primitive: x + h @ w.

    The sum is written into the GEMM's fresh output (no second (..., C) array, no separate add node).
    Shapes: x (..., N), h (..., K) with the same leading axes, w (K, N); one dtype. VJP: dx = g (the
    residual path: the same array, as :func:`refopt.autograd.add` passes it), dh = g w^T, dw = h^T g (one
    GEMM each over all leading axes). Raises ValueError for mismatched shapes or dtypes.
    """
    xv, hv, wv = (a.value if isinstance(a, Node) else np.asarray(a) for a in (x, h, w))
    if wv.ndim != 2 or hv.shape[-1] != wv.shape[0] or xv.shape != hv.shape[:-1] + (wv.shape[1],) \
            or not xv.dtype == hv.dtype == wv.dtype:
        raise ValueError(f"residual_linear: need x (..., N), h (..., K), w (K, N) of one dtype; got x {xv.shape} "
                         f"{xv.dtype}, h {hv.shape} {hv.dtype}, w {wv.shape} {wv.dtype}")
    K, N = wv.shape
    h2 = hv.reshape(-1, K)
    out = _gemm(h2, wv)
    out += xv.reshape(-1, N)
    out = out.reshape(xv.shape)
    traced = [isinstance(a, Node) for a in (x, h, w)]
    if not any(traced):
        return out

    def vjp(g):
        g2 = g.reshape(-1, N)
        dh = _gemm(g2, wv.T).reshape(hv.shape) if traced[1] else None
        dw = _gemm(h2.T, g2) if traced[2] else None
        return (g if traced[0] else None), dh, dw

    return Node(out, (x, h, w), vjp)


def self_attention(qkv, n_head: int, q_gain=None, k_gain=None, qk_norm: bool = False, eps: float = 1e-6):
    """Causal multi-head self-attention of a packed projection qkv = h [W_q | W_k | W_v], one primitive:

        q, k, v = split(qkv) into n_head heads of size hs = C / n_head        (B, H, T, hs) each
        with qk_norm: q <- RMSNorm(q; q_gain), k <- RMSNorm(k; k_gain) per head (gain None = 1)
        S = q k^T / sqrt(hs),  P = softmax over keys j <= i (P_ij = 0 for j > i, a selection),  o = P v
        out = o with the heads merged back                                     (B, T, C)

    q, k, v are strided views of qkv; the batched products run in BLAS (``refopt.fast.blas.matmul``: with
    MKL, strided batches that read the heads and write the output and the cotangent of qkv in place, spread
    over its threads; with NumPy, a transposed right operand is copied first), the causal softmax and its VJP
    in a numba kernel parallel over (batch, head). Equal to :func:`attention` composed with
    :func:`rms_norm` (tests/test_fused.py). VJP as in those two.
    Shapes: qkv (B, T, 3C), gains (hs,) or None. dtype of qkv throughout (float32 stays float32).
    Raises ValueError if 3C is not divisible into n_head heads, for a gain of the wrong shape, or eps < 0.
    """
    zv = qkv.value if isinstance(qkv, Node) else np.asarray(qkv)
    if zv.ndim != 3 or zv.shape[-1] % (3 * n_head):
        raise ValueError(f"self_attention: qkv must be (B, T, 3C) with C divisible by n_head={n_head}, "
                         f"got {zv.shape}")
    if eps < 0:
        raise ValueError(f"self_attention: eps must be >= 0, got {eps}")
    B, T, C3 = zv.shape
    C, H = C3 // 3, n_head
    hs = C // H
    dt = zv.dtype
    gains = []
    for name, gn in (("q_gain", q_gain), ("k_gain", k_gain)):
        gvv = None if gn is None else (gn.value if isinstance(gn, Node) else np.asarray(gn, dtype=dt))
        if gvv is not None and gvv.shape != (hs,):
            raise ValueError(f"self_attention: {name} shape {gvv.shape} must be ({hs},)")
        gains.append(np.ones(hs, dt) if gvv is None else gvv)
    z5 = np.ascontiguousarray(zv).reshape(B, T, 3, H, hs)

    def heads(a):  # (B, T, H, hs) -> (B, H, T, hs) view
        return a.transpose(0, 2, 1, 3)

    if qk_norm:   # RMSNorm over hs of each head's row: (B, T, H, hs) copies, normalised by the fused kernel
        qn, qhat, rq = autograd_kernels.rms_norm_fused(z5[:, :, 0], gains[0], eps)
        kn, khat, rk = autograd_kernels.rms_norm_fused(z5[:, :, 1], gains[1], eps)
    else:
        qn, kn = z5[:, :, 0], z5[:, :, 1]
    q, k, v = heads(qn), heads(kn), heads(z5[:, :, 2])
    scale = 1 / np.sqrt(hs)
    P = autograd_kernels.causal_softmax_par_(_gemm(q, k.swapaxes(-1, -2)), scale)   # (B, H, T, T), fresh
    y = np.empty((B, T, H, hs), dt)
    _gemm(P, v, out=heads(y))
    y = y.reshape(B, T, C)
    traced = [isinstance(a, Node) for a in (qkv, q_gain, k_gain)]
    if not any(traced):
        return y

    def vjp(g):
        dO = heads(np.ascontiguousarray(g, dtype=dt).reshape(B, T, H, hs))
        dz = np.empty((B, T, 3, H, hs), dt)
        _gemm(P.swapaxes(-1, -2), dO, out=heads(dz[:, :, 2]))         # dv = P^T dO
        dP = _gemm(dO, v.swapaxes(-1, -2))
        dS = autograd_kernels.causal_softmax_vjp_par_(P, dP, scale)  # scale P (dP - <dP, P>), in place on dP
        dgq = dgk = None
        if qk_norm:
            dqn, dkn = np.empty((B, T, H, hs), dt), np.empty((B, T, H, hs), dt)
            _gemm(dS, k, out=heads(dqn))
            _gemm(dS.swapaxes(-1, -2), q, out=heads(dkn))
            dz[:, :, 0], dgq = autograd_kernels.rms_norm_fused_vjp(dqn, gains[0], qhat, rq, traced[1])
            dz[:, :, 1], dgk = autograd_kernels.rms_norm_fused_vjp(dkn, gains[1], khat, rk, traced[2])
        else:
            _gemm(dS, k, out=heads(dz[:, :, 0]))                       # dq = dS k
            _gemm(dS.swapaxes(-1, -2), q, out=heads(dz[:, :, 1]))      # dk = dS^T q
        return (dz.reshape(zv.shape) if traced[0] else None), dgq, dgk

    return Node(y, (qkv, q_gain, k_gain), vjp)


FFN_ACTIVATIONS = ("swiglu", "reglu", "gelu")


def ffn_activation(z, kind: str):
    """The feed-forward nonlinearity, fused and row-parallel (Shazeer 2020, arXiv:2002.05202):

        'swiglu': z = [a | u] (..., 2F) -> silu(a) * u = a sigma(a) u       (..., F)
        'reglu':  z = [a | u] (..., 2F) -> relu(a) * u                      (..., F)   (relu'(0) = 0)
        'gelu':   z (..., F) -> z Phi(z), Phi(z) = erfc(-z / sqrt 2) / 2    (..., F)   (exact erf GELU)

    VJPs: swiglu da = g u s (1 + a (1 - s)), du = g a s (s = sigma(a)); reglu da = g u [a > 0],
    du = g relu(a); gelu dz = g (Phi(z) + z phi(z)). Equal to ``silu(a) * u``, ``relu(a) * u`` and
    :func:`refopt.autograd.gelu` composed from the pointwise primitives (tests/test_fused.py).
    Raises ValueError for an unknown kind or an odd last axis for the GLU kinds.
    """
    if kind not in FFN_ACTIVATIONS:
        raise ValueError(f"ffn_activation: kind must be one of {FFN_ACTIVATIONS}, got {kind!r}")
    zv = z.value if isinstance(z, Node) else np.asarray(z)
    if kind != "gelu" and zv.shape[-1] % 2:
        raise ValueError(f"ffn_activation: a GLU input needs an even last axis [gate | up], got {zv.shape}")
    dt = zv.dtype.type
    W = zv.shape[-1]
    F = W if kind == "gelu" else W // 2
    z2 = np.ascontiguousarray(zv).reshape(-1, W)
    h = np.empty((z2.shape[0], F), zv.dtype)
    aux = None
    if kind == "swiglu":
        aux = np.empty_like(h)
        autograd_kernels._neg_gate(z2, aux)      # -a, in parallel (NumPy's serial negative costs about its exp)
        with np.errstate(over="ignore", under="ignore"):  # exp(-a) = inf (a < -88 in float32): sigma = 0
            np.exp(aux, out=aux)                 # NumPy's SIMD exp; the kernel turns it into sigma(a)
        autograd_kernels._swiglu_fwd(z2, h, aux, dt(1))
    elif kind == "reglu":
        autograd_kernels._reglu_fwd(z2, h)
    else:
        aux = np.empty_like(h)
        autograd_kernels._gelu_fwd(z2, h, aux, dt(-0.7071067811865476), dt(0.5))
    h = h.reshape(zv.shape[:-1] + (F,))
    if not isinstance(z, Node):
        return h

    def vjp(g):
        g2 = np.ascontiguousarray(g, dtype=zv.dtype).reshape(-1, F)
        dz = np.empty_like(z2)
        if kind == "swiglu":
            autograd_kernels._swiglu_bwd(g2, z2, aux, dz, dt(1))
        elif kind == "reglu":
            autograd_kernels._reglu_bwd(g2, z2, dz)
        else:
            autograd_kernels._gelu_bwd(g2, z2, aux, dz, dt(0.3989422804014327), dt(0.5))
        return (dz.reshape(zv.shape),)

    return Node(h, (z,), vjp)

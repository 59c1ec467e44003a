"""Time one GPT training step (forward, backward, AdamW update) in refopt against PyTorch CPU eager.

Both models are the default ``models.gpt.GPTConfig`` (4 layers, n_embd 128, 4 heads, block 64, SwiGLU,
tied head, RMSNorm with gains) in float32, with the *same* initial weights (refopt's ``gpt.init`` copied
into torch), so the first losses must agree (checked). refopt's step is ``value_and_grad(gpt.loss)``
followed by ``refopt.update_`` with ``refopt.AdamW``; torch's is ``loss.backward()`` and
``torch.optim.AdamW`` (default implementation), attention via ``F.scaled_dot_product_attention``.

Usage (torch must be installed: ``pip install torch==2.13.0``)::

    python benchmarks/bench_gpt_step.py [--steps 20] [--threads 2] [--vocab 100]

Prints ms/step (median over --steps after 3 warm-up steps) for both and the ratio refopt / torch.
Not a test; numbers depend on the machine and on its load.
"""
from __future__ import annotations

import argparse
import os
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="BLAS / torch / numba threads")
    ap.add_argument("--vocab", type=int, default=103, help="vocab size (pydoc_data.topics has 103 chars)")
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(a.threads)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import refopt
    from models import gpt
    from refopt.autograd import value_and_grad

    torch.set_num_threads(a.threads)
    cfg = gpt.GPTConfig(vocab_size=a.vocab)
    params = gpt.init(cfg, 0, np.float32)
    rng = np.random.default_rng(0)
    shape = (a.batch, cfg.block_size)
    batches = [(rng.integers(0, a.vocab, shape), rng.integers(0, a.vocab, shape)) for _ in range(a.steps + 3)]

    # ---- refopt ---------------------------------------------------------------------------------------
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    state = refopt.init(rule, params)
    vg = value_and_grad(gpt.loss)
    first_np = float(gpt.loss(params, *batches[0], cfg))
    times_np = []
    for i, (x, y) in enumerate(batches):
        t = time.perf_counter()
        _, g = vg(params, x, y, cfg)
        params, state = refopt.update_(rule, state, params, g)
        if i >= 3:
            times_np.append(time.perf_counter() - t)

    # ---- torch: the same model, the same initial weights ----------------------------------------------
    p0 = gpt.init(cfg, 0, np.float32)
    tp = refopt.tree.tree_map(lambda w: torch.nn.Parameter(torch.from_numpy(w.copy())), p0)
    leaves = refopt.tree.leaves(tp)
    H, hs, eps = cfg.n_head, cfg.head_size, cfg.norm_eps

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def forward(x, y):
        B, T = x.shape
        h = tp["wte"][x] + tp["wpe"][:T]
        for blk in tp["blocks"]:
            at, ml = blk["attn"], blk["mlp"]
            z = rms(h, blk["attn_norm"])
            q, k, v = ((z @ at[n]).view(B, T, H, hs).transpose(1, 2) for n in ("w_q", "w_k", "w_v"))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + o.transpose(1, 2).reshape(B, T, -1) @ at["w_o"]
            z = rms(h, blk["mlp_norm"])
            h = h + (F.silu(z @ ml["w_gate"]) * (z @ ml["w_up"])) @ ml["w_down"]
        logits = rms(h, tp["final_norm"]) @ tp["wte"].T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

    opt = torch.optim.AdamW(leaves, lr=1e-3, weight_decay=0.01)
    tb = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    with torch.no_grad():
        first_t = float(forward(*tb[0]))
    times_t = []
    for i, (x, y) in enumerate(tb):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        forward(x, y).backward()
        opt.step()
        if i >= 3:
            times_t.append(time.perf_counter() - t)

    ms_np, ms_t = 1e3 * np.median(times_np), 1e3 * np.median(times_t)
    print(f"config: {cfg}")
    print(f"first loss: refopt {first_np:.6f}  torch {first_t:.6f}  (rel diff {abs(first_np - first_t) / first_t:.1e})")
    print(f"threads {a.threads}, batch {a.batch}, {a.steps} timed steps (median)")
    print(f"refopt (numpy autograd + refopt.AdamW update_): {ms_np:8.1f} ms/step")
    print(f"torch {torch.__version__} eager + torch.optim.AdamW: {ms_t:8.1f} ms/step")
    print(f"ratio refopt / torch: {ms_np / ms_t:.2f}")


if __name__ == "__main__":
    main()

"""Time one GPT training step (forward, backward, AdamW update) in refopt against PyTorch CPU eager.

Both models are ``refopt.models.gpt.GPTConfig`` (default: 4 layers, n_embd 128, 4 heads, block 64, SwiGLU,
tied head, RMSNorm with gains; ``--n-embd``, ``--n-layer`` change it) in float32, with the *same* initial
weights (refopt's ``gpt.init`` copied into torch), so the first losses must agree (checked). refopt's step
is ``value_and_grad(gpt.loss)`` (the fused path; params checked once, as ``refopt train`` does) followed
by ``refopt.update_`` with ``refopt.AdamW``; torch's is ``loss.backward()`` and ``torch.optim.AdamW``
(default implementation), attention via ``F.scaled_dot_product_attention``.

Usage (torch must be installed: ``pip install torch==2.13.0``)::

    PYTHONPATH=. python benchmarks/bench_gpt_step.py [--steps 20] [--threads 2] [--n-embd 256 --n-layer 6]
        [--repeats 3] [--malloc default] [--gemm numpy]

Prints ms/step (median over --steps after 3 warm-up steps) for both and the ratio refopt / torch; with
--repeats R, the two alternate R times in one process and the medians of the per-repeat medians are
reported. Also prints the load average before and after. The process reuses freed heap pages as
``refopt train`` does (``refopt.cli._memory.keep_freed_memory``, for both libraries alike);
``--malloc default`` keeps glibc's defaults instead. ``--gemm`` chooses refopt's matrix products
(``REFOPT_GEMM``: MKL on the fused kernels' OpenMP threads with the ``mkl`` extra, else NumPy's BLAS with
serial fused kernels); the line "refopt's products" says which ran. Not a test; numbers depend on the machine and
on its load.
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
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1, help="alternate refopt and torch this many times")
    ap.add_argument("--malloc", default="keep", choices=["keep", "default"],
                    help="keep: reuse freed heap pages, as refopt train does (both libraries); default: glibc's")
    ap.add_argument("--only", default=None, choices=["refopt", "torch"],
                    help="time one library only (run each in its own process: torch's OpenMP threads and "
                         "MKL's are two pools in one process)")
    ap.add_argument("--gemm", default="auto", choices=["auto", "numpy", "mkl"],
                    help="refopt's matrix products (refopt.fast.blas): MKL on the fused kernels' OpenMP pool when "
                         "installed (auto), or NumPy's BLAS with serial fused kernels")
    a = ap.parse_args()
    os.environ["REFOPT_GEMM"] = a.gemm
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(a.threads)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import refopt
    from refopt.fast import blas
    from refopt.models import gpt
    from refopt.autograd import value_and_grad

    torch.set_num_threads(a.threads)
    if a.malloc == "keep":
        from refopt.cli._memory import keep_freed_memory

        keep_freed_memory()
    print(f"load average before: {os.getloadavg()}")
    cfg = gpt.GPTConfig(vocab_size=a.vocab, n_embd=a.n_embd, n_layer=a.n_layer)
    params = gpt.init(cfg, 0, np.float32)
    rng = np.random.default_rng(0)
    shape = (a.batch, cfg.block_size)
    batches = [(rng.integers(0, a.vocab, shape), rng.integers(0, a.vocab, shape)) for _ in range(a.steps + 3)]

    # ---- refopt ---------------------------------------------------------------------------------------
    gpt.check_params(params, cfg)
    first_np = float(gpt.loss(params, *batches[0], cfg))
    vg = value_and_grad(lambda p, x, y: gpt.loss(p, x, y, cfg, check=False))

    def run_refopt():
        p = gpt.init(cfg, 0, np.float32)
        rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
        state = refopt.init(rule, p)
        times, cpu = [], []
        for i, (x, y) in enumerate(batches):
            t, c = time.perf_counter(), time.process_time()
            _, g = vg(p, x, y)
            p, state = refopt.update_(rule, state, p, g)
            if i >= 3:
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        return np.median(times), np.median(cpu)

    # ---- torch: the same model, the same initial weights ----------------------------------------------
    p0 = gpt.init(cfg, 0, np.float32)
    H, hs, eps = cfg.n_head, cfg.head_size, cfg.norm_eps
    tp = refopt.tree.tree_map(lambda w: torch.nn.Parameter(torch.from_numpy(w.copy())), p0)

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

    tb = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    with torch.no_grad():
        first_t = float(forward(*tb[0]))

    def run_torch():
        with torch.no_grad():  # fresh copy of the same initial weights
            for w, w0 in zip(refopt.tree.leaves(tp), refopt.tree.leaves(p0)):
                w.copy_(torch.from_numpy(w0))
        opt = torch.optim.AdamW(refopt.tree.leaves(tp), lr=1e-3, weight_decay=0.01)
        times, cpu = [], []
        for i, (x, y) in enumerate(tb):
            t, c = time.perf_counter(), time.process_time()
            opt.zero_grad(set_to_none=True)
            forward(x, y).backward()
            opt.step()
            if i >= 3:
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        return np.median(times), np.median(cpu)

    res_np, res_t = [], []
    nan = (float("nan"), float("nan"))
    for _ in range(a.repeats):
        res_np.append(run_refopt() if a.only != "torch" else nan)
        res_t.append(run_torch() if a.only != "refopt" else nan)
    (med_np, cpu_np), (med_t, cpu_t) = np.array(res_np).T, np.array(res_t).T
    ms_np, ms_t = 1e3 * np.median(med_np), 1e3 * np.median(med_t)
    print(f"load average after: {os.getloadavg()}")
    print(f"per-repeat medians (ms): refopt {[round(1e3 * v, 1) for v in med_np]}, "
          f"torch {[round(1e3 * v, 1) for v in med_t]}")
    print(f"CPU time per step (all threads, median; steadier than wall time on a loaded machine): refopt "
          f"{1e3 * np.median(cpu_np):.1f} ms, torch {1e3 * np.median(cpu_t):.1f} ms, "
          f"ratio {np.median(cpu_np) / np.median(cpu_t):.2f}")
    print(f"config: {cfg}")
    print(f"first loss: refopt {first_np:.6f}  torch {first_t:.6f}  (rel diff {abs(first_np - first_t) / first_t:.1e})")
    print(f"refopt's products: {blas.describe()}")
    print(f"malloc {a.malloc}, threads {a.threads}, batch {a.batch}, {a.steps} timed steps (median), {a.repeats} repeats")
    print(f"refopt (numpy autograd + refopt.AdamW update_): {ms_np:8.1f} ms/step")
    print(f"torch {torch.__version__} eager + torch.optim.AdamW: {ms_t:8.1f} ms/step")
    print(f"ratio refopt / torch: {ms_np / ms_t:.2f}")


if __name__ == "__main__":
    main()

"""Benchmark: the six batched products of one causal self-attention layer (``refopt.autograd.nn.self_attention``,
forward and backward), through ``refopt.fast.blas.matmul`` (MKL's strided batches on its OpenMP threads, reading
the heads in place) against the NumPy path the autograd takes without MKL (a transposed right operand copied
row-major first, then ``np.matmul``, one OpenBLAS call per head), in the same process and interleaved
repeat by repeat. ``--torch`` times instead torch's ``scaled_dot_product_attention`` forward and backward on
the same shapes (a whole fused attention, softmax included), alone in its process (torch's OpenMP threads
and MKL's are two pools: in one process they compete).

Not a test; the numbers depend on the machine and its load (printed before and after, with the host's steal
time: CPU time a virtual machine's host took away). Run
``PYTHONPATH=. python benchmarks/bench_attention.py`` (``--batch 32 --block 64 --n-embd 128 --n-head 4``,
``--repeats 7``, ``--threads 2``, ``--torch``). Needs the ``mkl`` extra for the MKL column.

The products, for q, k, v (B, H, T, hs) views of a packed qkv (B, T, 3C), P the (B, H, T, T) softmax weights
and dO the output's cotangent: S = q k^T, y = P v (written into the heads-merged (B, T, C) output), dv = P^T dO,
dP = dO v^T, dq = dS k, dk = dS^T q (written into the packed cotangent of qkv).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def _steal() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=30, help="calls per timed block (median of each block's mean)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch", action="store_true", help="time torch's SDPA instead (run it in its own process)")
    a = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(a.threads)

    import numpy as np

    from refopt.fast import blas

    B, T, C, H = a.batch, a.block, a.n_embd, a.n_head
    hs = C // H
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((B, T, 3 * C)).astype(np.float32)
    z5 = qkv.reshape(B, T, 3, H, hs)

    def heads(x):
        return x.transpose(0, 2, 1, 3)

    q, k, v = (heads(z5[:, :, i]) for i in range(3))
    P = np.tril(rng.random((B, H, T, T))).astype(np.float32)
    P /= P.sum(-1, keepdims=True)
    dO = heads(rng.standard_normal((B, T, H, hs)).astype(np.float32))
    y = np.empty((B, T, H, hs), np.float32)
    dz = np.empty((B, T, 3, H, hs), np.float32)

    def six(mm):
        mm(q, k.swapaxes(-1, -2), None)
        mm(P, v, heads(y))
        mm(P.swapaxes(-1, -2), dO, heads(dz[:, :, 2]))
        mm(dO, v.swapaxes(-1, -2), None)
        mm(P, k, heads(dz[:, :, 0]))
        mm(P.swapaxes(-1, -2), q, heads(dz[:, :, 1]))

    def run_numpy():
        six(blas._numpy_matmul)

    def run_mkl():
        six(blas.matmul)

    cases = {}
    if a.torch:
        import torch
        import torch.nn.functional as F

        torch.set_num_threads(a.threads)
        tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).requires_grad_() for x in (q, k, v))
        tg = torch.from_numpy(np.ascontiguousarray(dO))

        def run_torch():
            o = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            torch.autograd.grad(o, (tq, tk, tv), tg)

        cases[f"torch {torch.__version__} SDPA fwd+bwd (whole attention)"] = run_torch
    else:
        cases["numpy (OpenBLAS, copies)"] = run_numpy
        if blas.backend() == "mkl":
            cases["refopt.fast.blas (MKL strided batches)"] = run_mkl
        else:
            print(f"no MKL column: {blas.describe()}")
    for f in cases.values():   # warm-up (page faults, MKL's and torch's first calls)
        for _ in range(5):
            f()
    times = {name: [] for name in cases}
    print(f"B={B} T={T} C={C} H={H} (hs={hs}), float32, {a.threads} threads"
          + ("" if a.torch else f"; {blas.describe()}"))
    load0, steal0 = os.getloadavg()[0], _steal()
    for _ in range(a.repeats):
        for name, f in cases.items():
            t = time.perf_counter()
            for _ in range(a.inner):
                f()
            times[name].append((time.perf_counter() - t) / a.inner)
    load1, steal1 = os.getloadavg()[0], _steal()
    base = statistics.median(times.get("numpy (OpenBLAS, copies)", [float("nan")]))
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:52s} {1e3 * med:7.3f} ms  ({med / base:.2f} of numpy)  repeats "
              f"{[round(1e3 * t, 2) for t in ts]}")
    print(f"load average {load0:.2f} -> {load1:.2f}; host steal {steal1 - steal0} ticks during the run")


if __name__ == "__main__":
    main()

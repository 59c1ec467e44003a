"""Benchmark: ``refopt.linalg.msign`` (Newton-Schulz, 5 steps, float32) against BLAS matmul throughput.

Not a test. Run ``python benchmarks/bench_msign.py`` (``--sizes 1024x1024,1024x4096`` to choose, ``--help``).

For a wide X (m <= n; tall inputs are transposed) one iteration is::

    A = X X^T   (m x n times n x m)      nominal 2 m^2 n flops; numpy calls BLAS syrk here, which
                                          computes one triangle: m^2 n (+ m n) flops actually executed
    P = a I + b A + c A A                 2 m^3 (gemm) + ~3 m^2 (elementwise)
    X = P X  (= a X + (b A + c A A) X)    2 m^2 n (gemm)

Figures, all from this run:

* ``gemm GF/s``: sgemm throughput on exactly the three products of one iteration, each computed as a
  plain gemm (X times a separate copy of X^T, so no syrk), timed back to back;
* ``NS GF/s (nominal)``: nominal flops (4 m^2 n + 2 m^3 per step, elementwise ignored) / time of the
  whole ``msign`` call (normalisation, transposes and the finite check included);
* ``NS GF/s (executed)``: flops actually executed by BLAS (3 m^2 n + 2 m^3 per step, syrk counted as
  m^2 n) / time: the honest throughput;
* ``ratio``: (time of the same products as plain gemms) / (time of msign), i.e. how close msign is to
  "the matmul work at BLAS gemm speed" (aim >= 0.90). A ratio above 1 comes from syrk's halved work.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refopt.linalg import msign  # noqa: E402


def bench(m: int, n: int, steps: int, repeats: int, warmup: bool) -> dict:
    """Best-of-``repeats`` timings, the gemm reference and msign interleaved (the machine may be shared)."""
    rng = np.random.default_rng(0)
    G = rng.standard_normal((m, n)).astype(np.float32)
    m, n = min(m, n), max(m, n)
    X = rng.standard_normal((m, n)).astype(np.float32)
    Xt = np.ascontiguousarray(X.T)
    A = rng.standard_normal((m, m)).astype(np.float32)
    out_mm = np.empty((m, m), np.float32)
    out_mn = np.empty((m, n), np.float32)

    def gemms():                       # the three products of one step, each as a plain sgemm
        np.matmul(X, Xt, out=out_mm)   # same shape as X X^T, but a true gemm (no syrk)
        np.matmul(A, A, out=out_mm)
        np.matmul(A, X, out=out_mn)

    def ns():
        msign(G, "newton_schulz", "jordan", steps)

    if warmup:
        gemms()
        ns()
    t_gemm = t_ns = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        gemms()
        t1 = time.perf_counter()
        ns()
        t2 = time.perf_counter()
        t_gemm, t_ns = min(t_gemm, t1 - t0), min(t_ns, t2 - t1)
    per_step = 4.0 * m * m * n + 2.0 * m ** 3
    executed = 3.0 * m * m * n + 2.0 * m ** 3
    return {"shape": f"{G.shape[0]}x{G.shape[1]}", "t_ns": t_ns, "gemm": per_step / t_gemm / 1e9,
            "ns_nominal": steps * per_step / t_ns / 1e9, "ns_executed": steps * executed / t_ns / 1e9,
            "ratio": steps * t_gemm / t_ns}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024x1024,1024x4096,4096x4096")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=4, help="best of N (N=1, no warm-up, for sides >= 4096)")
    a = p.parse_args(argv)
    print(f"numpy {np.__version__}, float32, Newton-Schulz {a.steps} steps (jordan), "
          f"threads: OMP/OPENBLAS={os.environ.get('OPENBLAS_NUM_THREADS') or os.environ.get('OMP_NUM_THREADS')}"
          f", cpus={os.cpu_count()}")
    print(f"{'shape':>10} {'msign s':>9} {'gemm GF/s':>10} {'NS GF/s nominal':>16} {'NS GF/s executed':>17} "
          f"{'ratio':>6}")
    for s in a.sizes.split(","):
        m, n = (int(v) for v in s.lower().split("x"))
        big = max(m, n) >= 4096 and min(m, n) >= 4096
        r = bench(m, n, a.steps, 1 if big else a.repeats, warmup=not big)
        print(f"{r['shape']:>10} {r['t_ns']:9.3f} {r['gemm']:10.1f} {r['ns_nominal']:16.1f} "
              f"{r['ns_executed']:17.1f} {r['ratio']:6.2f}", flush=True)


if __name__ == "__main__":
    main()

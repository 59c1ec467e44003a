"""Benchmark: ``refopt.msign`` (Newton-Schulz, float32, CPU) against torch's straightforward iteration and
against the machine's sgemm rate, all in the same run.

Not a test. Run ``PYTHONPATH=. python benchmarks/bench_msign.py`` (``--sizes 2048x2048,768x3072``,
``--repeats 9``, ``--help``). Needs torch for the peer column (skipped with a note without it).

For a wide X (m <= n; tall inputs are transposed) one plain iteration (torch's, the peers')::

    A = X X^T;  B = b A + c A @ A;  X = a X + B @ X      4 m^2 n + 2 m^3 flops (three gemms)

refopt computes both symmetric products as BLAS syrk (``X @ X.T`` and ``A @ A.T``: one triangle each) and
folds a into the m x m factor: 3 m^2 n + m^3 flops executed. Columns, all from this run:

* ``refopt s`` / ``torch s``: median time of one whole msign call (normalisation included), the two
  interleaved repeat by repeat (the machine may be shared: the ratio is the median of per-repeat ratios);
* ``ratio``: refopt time / torch time (target: <= 0.65 at 2048x2048 and 768x3072);
* ``floor``: ``steps`` times the time of refopt's three products of one step alone (numpy's syrk for
  X X^T and for A A^T of a symmetric m x m A, its gemm for P X), over torch's time: the ratio refopt cannot
  go below with numpy's BLAS, whatever it does around the products;
* ``gemm GF/s``: numpy's sgemm on the three products of one plain iteration, each as a plain gemm;
  ``torch GF/s``: the same three products in torch (its own BLAS), the rate torch's iteration runs at;
* ``NS GF/s``: plain-iteration flops / refopt time, and ``% gemm``: that rate over the gemm rate (the
  symmetric form does fewer flops, so it can exceed 100%; 100 * (4 m^2 n + 2 m^3) / (3 m^2 n + m^3) is
  the ceiling at syrk = gemm speed).

``--many`` times instead the step of Muon over the hidden matrices of ``refopt train``'s GPT (per layer
W_q, W_k, W_v, W_o (C, C), W_gate, W_up (C, F), W_down (F, C); ``--n-embd``, ``--n-layer``, F = the GPT's
SwiGLU width): the plain loop of msign calls (numpy's BLAS on all its threads), ``newton_schulz_many``
(what Muon runs: the matrices on parallel threads, one BLAS thread each) and torch's iteration in a loop,
interleaved repeat by repeat.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refopt.linalg import msign, ns_coefficients  # noqa: E402


def torch_ns(G, rows):
    """torch's straightforward float32 iteration (as torch.optim.Muon / KellerJordan's Muon, without bf16)."""
    X = G / G.norm()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    for a, b, c in rows:
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tall else X


def bench(m: int, n: int, steps: int, repeats: int, torch=None) -> dict:
    rng = np.random.default_rng(0)
    G = rng.standard_normal((m, n)).astype(np.float32)
    rows = ns_coefficients("jordan", steps)
    k, w = min(m, n), max(m, n)
    X = rng.standard_normal((k, w)).astype(np.float32)
    Xt = np.ascontiguousarray(X.T)
    A = rng.standard_normal((k, k)).astype(np.float32)
    out_kk = np.empty((k, k), np.float32)
    out_kw = np.empty((k, w), np.float32)

    def gemms():                       # the three products of one plain step, each as a plain sgemm
        np.matmul(X, Xt, out=out_kk)   # same shape as X X^T, but a true gemm (no syrk)
        np.matmul(A, A, out=out_kk)
        np.matmul(A, X, out=out_kw)

    S = A + A.T                        # a symmetric m x m factor, as P in refopt's step
    out_kk2 = np.empty((k, k), np.float32)

    def products():                    # refopt's three products of one step: syrk, syrk, gemm
        np.matmul(X, X.T, out=out_kk)
        np.matmul(S, S.T, out=out_kk2)
        np.matmul(S, X, out=out_kw)

    Gt = torch.from_numpy(G) if torch is not None else None
    runs = [("gemm", gemms), ("products", products), ("refopt", lambda: msign(G, coeffs="jordan", steps=steps))]
    if torch is not None:
        tX, tXt, tA = (torch.from_numpy(v) for v in (X, Xt, A))

        def torch_gemms():             # the same three plain products in torch (its BLAS)
            tX @ tXt
            tA @ tA
            tA @ tX
        runs += [("torch", lambda: torch_ns(Gt, rows)), ("torch_gemm", torch_gemms)]
    for _, f in runs:                  # warm-up
        f()
    t = {name: [] for name, _ in runs}
    for _ in range(repeats):
        for name, f in runs:
            t0 = time.perf_counter()
            f()
            t[name].append(time.perf_counter() - t0)
    plain = 4.0 * k * k * w + 2.0 * k ** 3
    med = {name: statistics.median(v) for name, v in t.items()}
    r = {"shape": f"{m}x{n}", "refopt": med["refopt"], "gemm": plain / med["gemm"] / 1e9,
         "ns": steps * plain / med["refopt"] / 1e9, "ceiling": 100 * plain / (3.0 * k * k * w + k ** 3)}
    r["pct"] = 100 * r["ns"] / r["gemm"]
    if torch is not None:
        r["torch"] = med["torch"]
        r["ratio"] = statistics.median(a / b for a, b in zip(t["refopt"], t["torch"]))
        r["torch_gemm"] = plain / med["torch_gemm"] / 1e9
        r["floor"] = steps * med["products"] / med["torch"]
    return r


def bench_many(n_embd: int, n_layer: int, steps: int, repeats: int, torch=None) -> None:
    from refopt.linalg._msign import newton_schulz, newton_schulz_many
    from refopt.models.gpt import GPTConfig

    C, F = n_embd, GPTConfig(vocab_size=2, n_embd=n_embd).ffn_hidden
    rng = np.random.default_rng(0)
    shapes = ([(C, C)] * 4 + [(C, F)] * 2 + [(F, C)]) * n_layer
    Gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    rows = ns_coefficients("jordan", steps)
    runs = {"loop": lambda: [newton_schulz(G, rows) for G in Gs],
            "many": lambda: newton_schulz_many(Gs, rows)}
    if torch is not None:
        Ts = [torch.from_numpy(G) for G in Gs]
        runs["torch"] = lambda: [torch_ns(T, rows) for T in Ts]
    for f in runs.values():
        f()
    t = {k: [] for k in runs}
    for _ in range(repeats):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            t[k].append(time.perf_counter() - t0)
    med = {k: 1e3 * statistics.median(v) for k, v in t.items()}
    print(f"{len(Gs)} matrices of the GPT (n_embd {C}, {n_layer} layers, F {F}), float32, {steps} steps: "
          + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()))
    print(f"many / loop {statistics.median(a / b for a, b in zip(t['many'], t['loop'])):.2f}"
          + (f", many / torch {statistics.median(a / b for a, b in zip(t['many'], t['torch'])):.2f}"
             if torch is not None else "") + " (medians of per-repeat ratios)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2048x2048,768x3072")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=9, help="repeats (medians are quoted)")
    p.add_argument("--threads", type=int, default=None, help="BLAS threads of numpy and torch (default: theirs)")
    p.add_argument("--many", action="store_true", help="Muon's step over the GPT's hidden matrices (see above)")
    p.add_argument("--n-embd", type=int, default=128, help="with --many")
    p.add_argument("--n-layer", type=int, default=4, help="with --many")
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not installed: no peer column")
    if a.threads:
        from threadpoolctl import threadpool_limits
        threadpool_limits(a.threads)
        if torch is not None:
            torch.set_num_threads(a.threads)
    load = os.getloadavg()
    peer = f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ""
    print(f"numpy {np.__version__}{peer}"
          + f", float32, Newton-Schulz {a.steps} steps (jordan), cpus={os.cpu_count()}, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, medians of {a.repeats}")
    if a.many:
        bench_many(a.n_embd, a.n_layer, a.steps, a.repeats, torch)
    else:
        print(f"{'shape':>10} {'refopt s':>9} {'torch s':>8} {'ratio':>6} {'floor':>6} {'gemm GF/s':>10} "
              f"{'torch GF/s':>10} {'NS GF/s':>8} {'% gemm':>7} {'ceiling %':>9}")
        for s in a.sizes.split(","):
            m, n = (int(v) for v in s.lower().split("x"))
            r = bench(m, n, a.steps, a.repeats, torch)
            print(f"{r['shape']:>10} {r['refopt']:9.3f} {r.get('torch', float('nan')):8.3f} "
                  f"{r.get('ratio', float('nan')):6.2f} {r.get('floor', float('nan')):6.2f} {r['gemm']:10.1f} "
                  f"{r.get('torch_gemm', float('nan')):10.1f} {r['ns']:8.1f} {r['pct']:7.0f} "
                  f"{r['ceiling']:9.0f}", flush=True)
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()

"""Benchmark: refopt's numba-CUDA msign kernels against cuBLAS on the same GPU (float32).

Not a test; needs a CUDA GPU, ``pip install ".[cuda]"`` (plus the CUDA wheels, e.g.
``numba-cuda[cu12]==0.30.4``, where no toolkit is installed) and, for the cuBLAS columns, a CUDA build of
torch or CuPy. Run ``PYTHONPATH=. python benchmarks/bench_msign_cuda.py`` (``--sizes``, ``--repeats``).

Rows: 1024x1024, 4096x4096, 4096x16384, float32.

* ``gemm``: refopt's tiled gemm kernel computing P X with P (m x m) and X (m x n) against cuBLAS SGEMM
  (torch with TF32 switched off, or CuPy) on the same operands: TFLOP/s = 2 m^2 n / time. Aim at
  4096x4096: >= 30% of cuBLAS.
* ``NS5``: the whole ``msign`` (Newton-Schulz, 5 jordan steps, normalisation included) on a device array,
  against torch's straightforward float32 iteration on cuBLAS (A = X X^T; B = b A + c A@A; X = a X + B@X).
  TFLOP/s counts the plain iteration's 4 m^2 n + 2 m^3 flops a step (refopt executes 3 m^2 n + m^3).
  Aim: refopt's time within 3x of torch's.
* ``max |diff|``: refopt against the peer on the same input (a check that the kernels are right on the
  hardware, not only in the simulator); without a peer, NS5 against the CPU msign (up to 4096x4096).

Times are medians of ``--repeats`` runs after a warm-up (which includes the JIT compilation), each run
bracketed by device synchronisation.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from refopt.fast import msign_cuda  # noqa: E402
from refopt.linalg import msign, ns_coefficients  # noqa: E402


def _peer():
    """(name, module) of a cuBLAS path: torch (CUDA build) or CuPy; (None, None) without one."""
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False     # true FP32 SGEMM, not TF32
            torch.backends.cudnn.allow_tf32 = False
            return "torch", torch
    except ImportError:
        pass
    try:
        import cupy
        return "cupy", cupy
    except ImportError:
        return None, None


def _median_time(f, sync, repeats):
    f()
    sync()
    ts = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024x1024,4096x4096,4096x16384")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args(argv)
    cuda = msign_cuda._cuda()
    dev = cuda.get_current_device()
    name, lib = _peer()
    gpu = getattr(dev, "name", "the CUDA simulator")
    print(f"GPU: {gpu.decode() if isinstance(gpu, bytes) else gpu}, numba-cuda, float32, "
          f"tiles {msign_cuda.DEFAULT_TILES.bm} or {msign_cuda.SMALL_TILES.bm} (auto_tiles), cuBLAS via {name or 'none (install a CUDA torch or CuPy)'}, "
          f"medians of {a.repeats}")
    rows = ns_coefficients("jordan", a.steps)
    print(f"{'shape':>11} {'gemm TF/s':>9} {'cuBLAS TF/s':>11} {'% cuBLAS':>8} {'NS5 s':>8} {'peer NS5 s':>10} "
          f"{'ratio':>6} {'NS5 TF/s':>8} {'max|diff| gemm':>14} {'max|diff| NS5':>13}")
    for s in a.sizes.split(","):
        m, n = (int(v) for v in s.lower().split("x"))
        rng = np.random.default_rng(0)
        G = rng.standard_normal((m, n)).astype(np.float32)
        P = (rng.standard_normal((m, m)) / np.sqrt(m)).astype(np.float32)
        dG, dP = cuda.to_device(G[None]), cuda.to_device(P[None])
        dY = cuda.device_array((1, m, n), np.float32)
        tiles = msign_cuda.auto_tiles(m, n)      # the geometry Newton-Schulz uses at this size
        t_gemm = _median_time(lambda: msign_cuda.gemm(dP, dG, dY, tiles=tiles), cuda.synchronize, a.repeats)
        t_ns = _median_time(lambda: msign_cuda.newton_schulz_device(dG, rows), cuda.synchronize, a.repeats)
        out = msign_cuda.newton_schulz_device(dG, rows).copy_to_host()[0]
        gemm_flops = 2.0 * m * m * n
        mm, nn = min(m, n), max(m, n)
        ns_flops = a.steps * (4.0 * mm * mm * nn + 2.0 * mm ** 3)
        t_peer = t_peer_ns = float("nan")
        d_gemm = d_ns = float("nan")
        if name == "torch":
            tG, tP = lib.from_numpy(G).cuda(), lib.from_numpy(P).cuda()
            t_peer = _median_time(lambda: tP @ tG, lib.cuda.synchronize, a.repeats)

            def torch_ns():
                X = tG / tG.norm()
                X = X.T if X.shape[0] > X.shape[1] else X
                for ca, cb, cc in rows:
                    A = X @ X.T
                    X = ca * X + (cb * A + cc * A @ A) @ X
                return X.T if m > n else X
            t_peer_ns = _median_time(torch_ns, lib.cuda.synchronize, a.repeats)
            d_gemm = float(np.abs(dY.copy_to_host()[0] - (tP @ tG).cpu().numpy()).max())
            d_ns = float(np.abs(out - torch_ns().cpu().numpy()).max())
        elif name == "cupy":
            cG, cP = lib.asarray(G), lib.asarray(P)
            sync = lib.cuda.Device().synchronize
            t_peer = _median_time(lambda: cP @ cG, sync, a.repeats)

            def cupy_ns():
                X = cG / lib.linalg.norm(cG)
                X = X.T if X.shape[0] > X.shape[1] else X
                for ca, cb, cc in rows:
                    A = X @ X.T
                    X = ca * X + (cb * A + cc * A @ A) @ X
                return X.T if m > n else X
            t_peer_ns = _median_time(cupy_ns, sync, a.repeats)
            d_gemm = float(np.abs(dY.copy_to_host()[0] - lib.asnumpy(cP @ cG)).max())
            d_ns = float(np.abs(out - lib.asnumpy(cupy_ns())).max())
        if name is None and m * n <= 2 ** 24:      # no peer: check against the CPU msign instead
            d_ns = float(np.abs(out - msign(G, steps=a.steps)).max())
        print(f"{s + '/' + str(tiles.bm):>11} {gemm_flops / t_gemm / 1e12:9.2f} {gemm_flops / t_peer / 1e12:11.2f} "
              f"{100 * t_peer / t_gemm:8.0f} {t_ns:8.4f} {t_peer_ns:10.4f} {t_ns / t_peer_ns:6.2f} "
              f"{ns_flops / t_ns / 1e12:8.2f} {d_gemm:14.2e} {d_ns:13.2e}", flush=True)


if __name__ == "__main__":
    main()

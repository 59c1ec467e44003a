"""Benchmark: ``refopt.update_`` for AdamW against a plain-numpy Adam and the memory bandwidth of a triad.

Not a test. Run ``python benchmarks/bench_adam.py`` (``--help`` for options). All timings are the median
of ``--repeats`` runs after a warm-up call (which also compiles the numba kernels).

Figures reported (ms per update and effective bandwidth in GB/s):

* triad ``c = a + s*b`` (:func:`refopt.kernels.triad`, numba, parallel): 3 arrays moved, 3 x 4 x N bytes;
* AdamW via ``refopt.update_`` on one leaf of N float32 and on ``--leaves`` leaves of N/leaves each, with
  ``check_finite=True`` (default, one extra read of g) and ``check_finite=False``; Adam moves 7 arrays
  (x, g, m, v read; x, m, v written), 7 x 4 x N bytes;
* the same AdamW step written with in-place numpy ufuncs (one temporary, no allocation per step);
* the finite check alone and the raw Adam kernel without the tree walk (to split the overhead).

The aim (issue 2) is Adam's effective bandwidth >= 85% of the triad's.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba  # noqa: E402

import refopt  # noqa: E402
from refopt.kernels import all_finite, triad  # noqa: E402

try:  # the raw kernel, to separate kernel time from the tree walk (private; optional)
    from refopt.rules.adam import _adam_kernel
except ImportError:  # pragma: no cover
    _adam_kernel = None


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (JIT compile, page faults)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def gbps(arrays: int, n: int, itemsize: int, ms: float) -> float:
    return arrays * itemsize * n / (ms * 1e-3) / 1e9


class NumpyAdamW:
    """AdamW (decoupled decay, torch order) with in-place numpy ufuncs and one scratch array."""

    def __init__(self, x, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
        self.m, self.v, self.tmp = np.zeros_like(x), np.zeros_like(x), np.empty_like(x)
        self.lr, self.b1, self.b2, self.eps, self.wd, self.t = lr, b1, b2, eps, wd, 0

    def step(self, x, g):
        self.t += 1
        d = x.dtype.type
        m, v, tmp = self.m, self.v, self.tmp
        x *= d(1.0 - self.lr * self.wd)
        m *= d(self.b1)
        np.multiply(g, d(1.0 - self.b1), out=tmp)
        m += tmp
        v *= d(self.b2)
        np.multiply(g, g, out=tmp)
        tmp *= d(1.0 - self.b2)
        v += tmp
        np.sqrt(v, out=tmp)
        tmp /= d(math.sqrt(1.0 - self.b2 ** self.t))
        tmp += d(self.eps)
        np.divide(m, tmp, out=tmp)
        tmp *= d(self.lr / (1.0 - self.b1 ** self.t))
        x -= tmp


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000, help="number of float32 parameters (default 10M)")
    ap.add_argument("--leaves", type=int, default=100, help="leaves for the many-leaf case (default 100)")
    ap.add_argument("--repeats", type=int, default=15, help="timed repeats; the median is reported")
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = ap.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    n, k, rep = args.n, args.leaves, args.repeats
    rng = np.random.default_rng(0)
    isz = dt.itemsize

    print(f"refopt {refopt.__version__}, numpy {np.__version__}, numba {numba.__version__}, "
          f"numba threads {numba.get_num_threads()}, cpus {os.cpu_count()}, N = {n:,} {dt}, repeats {rep}")
    rows = []

    def report(name, ms, arrays):
        bw = gbps(arrays, n, isz, ms)
        rows.append((name, ms, bw))
        print(f"{name:<44s} {ms:9.2f} ms  {bw:7.2f} GB/s", flush=True)

    # --- triad: the bandwidth yardstick -----------------------------------------------------------
    a = rng.standard_normal(n).astype(dt)
    b = rng.standard_normal(n).astype(dt)
    c = np.empty_like(a)
    s = dt.type(0.5)
    ms_triad = median_ms(lambda: triad(c, a, b, s), rep)
    report("triad c = a + s*b (numba)", ms_triad, 3)
    bw_triad = rows[-1][2]
    del a, b, c

    # --- refopt AdamW, one leaf -------------------------------------------------------------------
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    x = rng.standard_normal(n).astype(dt)
    g = (1e-2 * rng.standard_normal(n)).astype(dt)
    st = [refopt.init(rule, x)]

    def step(cf):
        _, st[0] = refopt.update_(rule, st[0], x, g, check_finite=cf)

    report("refopt.update_ AdamW 1 leaf, check_finite", median_ms(lambda: step(True), rep), 7)
    report("refopt.update_ AdamW 1 leaf, no check", median_ms(lambda: step(False), rep), 7)
    report("  finite check alone (1 read of g)", median_ms(lambda: all_finite(g), rep), 1)
    if _adam_kernel is not None:
        m, v = st[0].leaves.m, st[0].leaves.v
        d = dt.type
        args_k = (d(0.9), d(0.1), d(0.999), d(1e-3), d(1e-8), d(0.5), d(2e-3), d(1 - 1e-5), d(0.0), d(2.0))
        report("  raw Adam kernel (no tree walk)",
               median_ms(lambda: _adam_kernel(x, g, m, v, x, False, *args_k), rep), 7)

    # --- plain numpy AdamW, in place --------------------------------------------------------------
    npa = NumpyAdamW(x)
    report("numpy in-place AdamW 1 leaf", median_ms(lambda: npa.step(x, g), rep), 7)
    del npa, x, g, st

    # --- refopt AdamW, many leaves ----------------------------------------------------------------
    per = n // k
    xs = {f"l{i:03d}": rng.standard_normal(per).astype(dt) for i in range(k)}
    gs = {key: (1e-2 * rng.standard_normal(per)).astype(dt) for key in xs}
    stk = [refopt.init(rule, xs)]

    def stepk(cf):
        _, stk[0] = refopt.update_(rule, stk[0], xs, gs, check_finite=cf)

    report(f"refopt.update_ AdamW {k} leaves x {per:,}, check", median_ms(lambda: stepk(True), rep), 7)
    report(f"refopt.update_ AdamW {k} leaves x {per:,}, no chk", median_ms(lambda: stepk(False), rep), 7)
    del xs, gs, stk

    # --- per-call overhead on tiny trees ----------------------------------------------------------
    xt = {f"l{i:03d}": np.zeros(10, dt) for i in range(k)}
    gt = {key: np.ones(10, dt) for key in xt}
    stt = [refopt.init(rule, xt)]

    def stept():
        _, stt[0] = refopt.update_(rule, stt[0], xt, gt)

    ms_tiny = median_ms(stept, rep)
    print(f"{'overhead: update_ on ' + str(k) + ' leaves of 10':<44s} {ms_tiny:9.3f} ms "
          f"({1e3 * ms_tiny / k:.1f} us per leaf)")

    print("\nAdam effective bandwidth as a fraction of the triad's (aim >= 85%):")
    for name, ms, bw in rows:
        if "AdamW" in name or "raw Adam" in name:
            print(f"  {name:<44s} {100 * bw / bw_triad:6.1f}%")


if __name__ == "__main__":
    main()

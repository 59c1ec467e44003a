"""Benchmark: ``refopt.update_`` for AdamW against a plain-numpy Adam and the memory bandwidth of a triad.

Not a test. Run ``python benchmarks/bench_adam.py`` (``--help`` for options). After one warm-up call of each
case (which also compiles the numba kernels) the cases run in ``--repeats`` interleaved rounds, so machine
noise hits all of them alike; the median and the min over the rounds are reported.

Figures reported (ms per update and effective bandwidth in GB/s):

* triad ``c = a + s*b`` (:func:`refopt.kernels.triad`, numba, parallel): 3 arrays moved, 3 x 4 x N bytes;
* AdamW via ``refopt.update_`` on one leaf of N float32 and on ``--leaves`` leaves of N/leaves each, with
  ``check_finite=True`` (default, one extra read of g) and ``check_finite=False``; Adam moves 7 arrays
  (x, g, m, v read; x, m, v written), 7 x 4 x N bytes;
* the same AdamW step written with in-place numpy ufuncs (one temporary, no allocation per step);
* the finite check alone and the raw Adam kernel without the tree walk (to split the overhead).

The aim is Adam's effective bandwidth >= 85% of the triad's. Adam can exceed 100%: the triad
writes a third array c, which the CPU must first read into cache (write-allocate), so it really moves 4
arrays, while Adam writes only arrays it has just read.

On a busy machine (more runnable threads than cores) every parallel region waits for its worker threads
to be scheduled, which adds milliseconds per kernel call; the min over the rounds is then the better
figure, and trees of many large leaves suffer most (one parallel region per large leaf; the small leaves
share one, :meth:`refopt.kernels.Elementwise.many`). ``benchmarks/bench_walk.py`` times whole trees.
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
from refopt.kernels import count_bad, triad  # noqa: E402

try:  # the raw step kernel, to separate kernel time from the tree walk (private; optional)
    from refopt.core import cast_context
    from refopt.rules.adam import _ADAM, AdamState
except ImportError:  # pragma: no cover
    _ADAM = None


def gbps(arrays: int, n: int, itemsize: int, ms: float) -> float:
    return arrays * itemsize * n / (ms * 1e-3) / 1e9


# --- prototype: a vectorizable finite check (x - x is 0 for finite x, nan for inf/nan) -------------
def _count_nonfinite(a):
    bad = 0
    for i in numba.prange(a.size):
        d = a[i] - a[i]
        bad += d != d
    return bad


_count_nonfinite_serial = numba.njit(cache=True)(_count_nonfinite)


@numba.njit(cache=True, parallel=True)
def _count_nonfinite_chunked(a, nchunks):
    n = a.size
    out = np.zeros(nchunks, np.int64)
    for c in numba.prange(nchunks):
        bad = 0
        for i in range(c * n // nchunks, (c + 1) * n // nchunks):
            d = a[i] - a[i]
            bad += d != d
        out[c] = bad
    return out.sum()


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
    ap.add_argument("--n", type=int, default=10_000_000, help="number of parameters (default 10M)")
    ap.add_argument("--leaves", type=int, default=100, help="leaves for the many-leaf case (default 100)")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds; median and min are reported")
    ap.add_argument("--threads", type=int, default=None, help="numba threads (default: all)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--prototypes", action="store_true", help="also time candidate faster finite checks")
    args = ap.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    n, k, rep = args.n, args.leaves, args.repeats
    per = n // k
    rng = np.random.default_rng(0)
    d = dt.type
    print(f"refopt {refopt.__version__}, numpy {np.__version__}, numba {numba.__version__}, "
          f"numba threads {numba.get_num_threads()}, cpus {os.cpu_count()}, N = {n:,} {dt}, "
          f"{rep} interleaved rounds", flush=True)

    # ---- data -------------------------------------------------------------------------------------
    a = rng.standard_normal(n).astype(dt)
    b = rng.standard_normal(n).astype(dt)
    c = np.empty_like(a)
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    x = rng.standard_normal(n).astype(dt)
    g = (1e-2 * rng.standard_normal(n)).astype(dt)
    st = [refopt.init(rule, x)]
    xr, mr, vr = x.copy(), np.zeros_like(x), np.zeros_like(x)   # for the raw kernel
    xn = x.copy()
    npa = NumpyAdamW(xn)
    xs = {f"l{i:03d}": rng.standard_normal(per).astype(dt) for i in range(k)}
    gs = {key: (1e-2 * rng.standard_normal(per)).astype(dt) for key in xs}
    stk = [refopt.init(rule, xs)]
    xt = {f"l{i:03d}": np.zeros(10, dt) for i in range(k)}
    gt = {key: np.ones(10, dt) for key in xt}
    stt = [refopt.init(rule, xt)]

    def step(cf):
        _, st[0] = refopt.update_(rule, st[0], x, g, check_finite=cf)

    def stepk(cf):
        _, stk[0] = refopt.update_(rule, stk[0], xs, gs, check_finite=cf)

    def stept():
        _, stt[0] = refopt.update_(rule, stt[0], xt, gt)

    s_tri = d(0.5)
    # name -> (callable, arrays moved per element of N)
    cases = {
        "triad c = a + s*b (numba)": (lambda: triad(c, a, b, s_tri), 3),
        "refopt.update_ AdamW 1 leaf, check_finite": (lambda: step(True), 7),
        "refopt.update_ AdamW 1 leaf, no check": (lambda: step(False), 7),
        "  finite check alone (1 read of g)": (lambda: count_bad(g) == 0, 1),
        "numpy in-place AdamW 1 leaf": (lambda: npa.step(xn, g), 7),
        f"refopt.update_ AdamW {k} leaves x {per:,}, check": (lambda: stepk(True), 7),
        f"refopt.update_ AdamW {k} leaves x {per:,}, no chk": (lambda: stepk(False), 7),
        f"overhead: update_ on {k} leaves of 10": (stept, 0),
    }
    if _ADAM is not None:
        kctx = cast_context(refopt.AdamW(lr=1e-3, weight_decay=0.01).context(2, None)[0], xr.dtype, "AdamW")
        cases["  raw Adam step kernel (no tree walk)"] = (lambda: _ADAM.step(xr, g, AdamState(mr, vr), kctx), 7)
    if args.prototypes:
        cases["  proto finite check, serial x-x (vectorized)"] = (lambda: _count_nonfinite_serial(g), 1)
        cases["  proto finite check, parallel chunks"] = (
            lambda: _count_nonfinite_chunked(g, 4 * numba.get_num_threads()), 1)

    times = {name: [] for name in cases}
    for fn, _ in cases.values():  # warm-up: JIT compile, first touch of pages
        fn()
    for _ in range(rep):  # interleaved, so that machine noise hits every case alike
        for name, (fn, _) in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    def ms(name, agg):
        return 1e3 * agg(times[name])

    tri = "triad c = a + s*b (numba)"
    print(f"\n{'':<46s} {'median':>16s}   {'min':>16s}   {'% of triad (median / min)':>26s}")
    for name, (_, arrays) in cases.items():
        med, mn = ms(name, statistics.median), ms(name, min)
        if arrays == 0:
            print(f"{name:<46s} {med:9.3f} ms         {mn:9.3f} ms          ({1e3 * med / k:.1f} us per leaf)")
            continue
        bm, bn = gbps(arrays, n, dt.itemsize, med), gbps(arrays, n, dt.itemsize, mn)
        line = f"{name:<46s} {med:8.2f} ms {bm:6.1f} GB/s  {mn:8.2f} ms {bn:6.1f} GB/s"
        if arrays == 7:
            tm, tn = gbps(3, n, dt.itemsize, ms(tri, statistics.median)), gbps(3, n, dt.itemsize, ms(tri, min))
            line += f"   {100 * bm / tm:6.1f}% / {100 * bn / tn:6.1f}%"
        print(line)
    print(f"\nnumba threading layer: {numba.threading_layer()}")
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cpus")
    print("Effective bandwidth: Adam 7 x itemsize x N / time (x, g, m, v read; x, m, v written); triad "
          "3 x itemsize x N / time. Aim: Adam >= 85% of the triad.")


if __name__ == "__main__":
    main()

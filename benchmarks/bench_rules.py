"""Time ``refopt.update_`` of every elementwise rule on N float32 parameters against torch.optim.

A script, not a test: ``python benchmarks/bench_rules.py [--n 10000000] [--repeats 7]``. For each rule the
torch counterpart is its fused implementation where torch has one (Adam, AdamW), else ``foreach=True``;
Schedule-Free runs against the ``schedulefree`` package's foreach classes when installed. One parameter
array of N elements (one leaf) on both sides; the median and the minimum of the repeats are printed in ms.
Kernels are compiled and caches warmed before timing. torch uses its default intra-op thread count.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import refopt


def _time(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts)), 1e3 * min(ts)


def _torch_case(make_opt, x0, g0):
    import torch

    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    p.grad = torch.from_numpy(g0.copy())
    opt = make_opt([p])

    def step():
        opt.step()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal(args.n).astype(np.float32)
    g0 = (1e-2 * rng.standard_normal(args.n)).astype(np.float32)
    try:
        import torch
        import torch.optim as to
    except ImportError:  # pragma: no cover
        torch = None
    try:
        import schedulefree as sf
    except ImportError:  # pragma: no cover
        sf = None

    cases = [
        ("SGD", refopt.SGD(lr=1e-3), lambda p: to.SGD(p, lr=1e-3, foreach=True), "foreach"),
        ("SGD momentum 0.9", refopt.SGD(lr=1e-3, momentum=0.9), lambda p: to.SGD(p, lr=1e-3, momentum=0.9, foreach=True), "foreach"),
        ("SGD Nesterov", refopt.SGD(lr=1e-3, momentum=0.9, nesterov=True),
         lambda p: to.SGD(p, lr=1e-3, momentum=0.9, nesterov=True, foreach=True), "foreach"),
        ("Adam", refopt.Adam(lr=1e-3), lambda p: to.Adam(p, lr=1e-3, fused=True), "fused"),
        ("AdamW", refopt.AdamW(lr=1e-3), lambda p: to.AdamW(p, lr=1e-3, fused=True), "fused"),
        ("NAdam (optax form)", refopt.Adam(lr=1e-3, nesterov=True), lambda p: to.NAdam(p, lr=1e-3, foreach=True),
         "foreach (Dozat form)"),
        ("AMSGrad (torch form)", refopt.Adam(lr=1e-3, amsgrad=True),
         lambda p: to.Adam(p, lr=1e-3, amsgrad=True, fused=True), "fused"),
        ("NAdam (torch form)", refopt.Adam(lr=1e-3, nesterov=True, momentum_decay=4e-3),
         lambda p: to.NAdam(p, lr=1e-3, foreach=True), "foreach"),
        ("Lion", refopt.Lion(lr=1e-4), None, "-"),
        ("Clip(AdamW)", refopt.ClipByGlobalNorm(refopt.AdamW(lr=1e-3), max_norm=1.0), None, "-"),
        ("ScheduleFreeSGD", refopt.ScheduleFreeSGD(lr=1e-3),
         (lambda p: _train(sf.SGDScheduleFree(p, lr=1e-3, foreach=True))) if sf else None, "schedulefree foreach"),
        ("ScheduleFreeAdamW", refopt.ScheduleFreeAdamW(lr=1e-3),
         (lambda p: _train(sf.AdamWScheduleFree(p, lr=1e-3, foreach=True))) if sf else None, "schedulefree foreach"),
        ("EMA(AdamW)", refopt.EMA(refopt.AdamW(lr=1e-3), decay=0.999), None, "-"),
        ("Average(AdamW)", refopt.Average(refopt.AdamW(lr=1e-3)), None, "-"),
    ]
    import os
    print(f"N = {args.n:,} float32, one leaf; median / min of {args.repeats} in ms; load {os.getloadavg()[0]:.1f}")
    print(f"{'rule':22s} {'refopt update_':>18s} {'torch':>18s}  torch path")
    for name, rule, make_torch, path in cases:
        x = x0.copy()
        state = refopt.init(rule, x)
        box = [x, state]

        def step():
            box[0], box[1] = refopt.update_(rule, box[1], box[0], g0)

        r = _time(step, args.repeats)
        t = None
        if torch is not None and make_torch is not None:
            t = _time(_torch_case(make_torch, x0, g0), args.repeats)
        ts = f"{t[0]:8.1f} / {t[1]:7.1f}" if t else f"{'n/a':>18s}"
        print(f"{name:22s} {r[0]:8.1f} / {r[1]:7.1f} {ts}  {path}")


def _train(opt):
    opt.train()
    return opt


if __name__ == "__main__":
    main()

"""Benchmark: the first step of each elementwise rule in a fresh process.

A script, not a test: ``PYTHONPATH=. python benchmarks/walk_first_step.py [--rounds 3]``. Each round starts
a new Python process that runs, for the elementwise rules (Adam, AdamW, AMSGrad, NAdam, SGD, SGD with
momentum, Lion) in float32 and float64, three ``update_`` and one ``update`` on 100 leaves of 10 elements
(one serial multi-leaf call) and on 100 leaves of 1000 (one parallel call), and prints the seconds that took.
The first round may compile into numba's on-disk cache (``NUMBA_CACHE_DIR``); the later rounds show what
every new process pays. Run it on two checkouts (e.g. one made with ``git worktree add``) to compare walks:
with a warm cache the time that remains is loading the compiled kernels from it (a multi-leaf call that held
numba typed lists, whose methods compile anew in every process, would pay about 5 s more)."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import time
import numpy as np
import refopt
rules = [refopt.Adam(lr=1e-2), refopt.AdamW(lr=1e-2, weight_decay=0.1), refopt.Adam(lr=1e-2, amsgrad=True),
         refopt.Adam(lr=1e-2, nesterov=True), refopt.SGD(lr=1e-2), refopt.SGD(lr=1e-2, momentum=0.9),
         refopt.Lion(lr=1e-3)]
t0 = time.perf_counter()
for rule in rules:
    for dt in (np.float32, np.float64):
        for n in (10, 1000):
            p = {f"l{i}": np.ones(n, dt) for i in range(100)}
            st = refopt.init(rule, p)
            g = {k: np.full(v.shape, 0.1, v.dtype) for k, v in p.items()}
            for _ in range(3):          # the multi-leaf call is prepared on the second call
                p, st = refopt.update_(rule, st, p, g)
            refopt.update(rule, st, p, g)
print(time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    times = []
    for r in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", _CHILD], cwd=root, env=env, capture_output=True, text=True,
                             check=True)
        times.append(float(out.stdout.split()[-1]))
        print(f"round {r}: {times[-1]:.2f} s (3 update_ + 1 update of 7 rules x 2 dtypes x 2 sizes)")
    if len(times) > 1:
        print(f"median of the warm rounds: {statistics.median(times[1:]):.2f} s; load: {os.getloadavg()}")


if __name__ == "__main__":
    main()

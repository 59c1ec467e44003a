"""Cost of ``refopt train --diagnostics`` relative to a training step of the default GPT run.

Times, in the same process and interleaved, (a) one training step of the default run (value_and_grad of
the GPT loss + refopt.update_ of its Muon/AdamW Partition) and (b) what --diagnostics adds to it (a copy of
the params before the step, then refopt.diagnostics.group_metrics per group). Prints medians of the
repeats. Run from the repository root:  PYTHONPATH=. python benchmarks/bench_diagnostics.py [--repeats N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import refopt
from refopt.cli import train
from refopt.cli.diagnostics import Diagnostics


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    args = p.parse_args(["--no-progress"])
    task, rule, lr, steps = train.prepare(args)
    params = task.init_params(0)
    state = refopt.init(rule, params)
    vg = refopt.value_and_grad(task.loss)
    diag = Diagnostics(rule)
    t_step, t_diag = [], []
    for k in range(1, a.repeats + 2):
        t0 = time.perf_counter()
        _, g = vg(params, *task.batch(0, k))
        t1 = time.perf_counter()
        before = diag.snapshot(params)
        t2 = time.perf_counter()
        params, state = refopt.update_(rule, state, params, g)
        t3 = time.perf_counter()
        diag.row(k, before, params, state)
        t4 = time.perf_counter()
        if k > 1:                                   # the first step compiles
            t_step.append((t1 - t0) + (t3 - t2))
            t_diag.append((t2 - t1) + (t4 - t3))
    s, d = statistics.median(t_step), statistics.median(t_diag)
    print(f"median over {a.repeats} steps: step {1000 * s:.1f} ms, diagnostics (params copy + metrics) "
          f"{1000 * d:.1f} ms = {100 * d / s:.1f} % of a step")


if __name__ == "__main__":
    main()

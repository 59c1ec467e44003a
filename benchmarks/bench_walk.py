"""Benchmark: the tree walk of ``refopt.update_`` / ``refopt.update`` on real trees, against torch.optim.

A script, not a test: ``python benchmarks/bench_walk.py [--case gpt2|many|one|muon|all] [--repeats 9]``.
Each case builds the same float32 params and grads for both sides, warms both up (numba compiles, caches
fill), then times them in interleaved rounds so that machine noise hits every variant alike; the median
and the minimum over the rounds are printed in ms, with the ratio of the medians to torch's fused step.

Cases:

* ``gpt2``: AdamW ``update_`` on the GPT-2-small parameter shapes (75 leaves, 124M float32: wte 50304x768,
  wpe 1024x768, 12 blocks of 768 / 768x2304 / 768x768 / 768 / 768x3072 / 3072x768, a final 768), with the
  finite-gradient check on and off, against ``torch.optim.AdamW(fused=True)``; also the check alone and
  a read-only pass of torch over the same gradients, and from them the floor of the check-on ratio;
* ``many``: Adam on 1000 leaves of 100 float32: ``update_`` and the pure ``update`` against torch's fused
  and foreach Adam;
* ``one``: Adam ``update_`` on one leaf of 10M float32 (check on and off, the check alone, the floor) against
  torch fused Adam;
* ``rss``: the peak RSS that in-place AdamW steps on the GPT-2-small shapes add (run first, in a process
  that has not yet made the torch copies);
* ``muon``: ``Partition`` (Muon on the 48 hidden matrices, AdamW on the rest) on the GPT-2-small shapes
  against ``torch.optim.Muon`` + ``torch.optim.AdamW(fused=True)``; torch's Newton-Schulz runs in bfloat16,
  refopt's in float32 (the params' dtype), so this compares different arithmetic.

torch runs with as many intra-op threads as numba (``--threads``, default: numba's default). Each round
feeds the same gradient arrays again (a new gradient per step would only add its allocation to both).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba  # noqa: E402

import refopt  # noqa: E402


def gpt2_shapes() -> dict:
    """name -> shape of GPT-2 small's parameters (vocabulary padded to 50304, as nanoGPT)."""
    C = 768
    shapes = {"wte": (50304, C), "wpe": (1024, C), "ln_f": (C,)}
    for b in range(12):
        shapes.update({f"h{b:02d}.ln_1": (C,), f"h{b:02d}.attn": (C, 3 * C), f"h{b:02d}.attn_proj": (C, C),
                       f"h{b:02d}.ln_2": (C,), f"h{b:02d}.fc": (C, 4 * C), f"h{b:02d}.fc_proj": (4 * C, C)})
    return shapes


def make_tree(shapes: dict, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s, dtype=np.float32) * np.float32(0.02) for k, s in shapes.items()}
    grads = {k: rng.standard_normal(s, dtype=np.float32) * np.float32(1e-3) for k, s in shapes.items()}
    return params, grads


def refopt_step(rule, params, grads, pure=False, **kw):
    """One refopt step per call on its own copy of ``params`` (each variant needs its own rule object: the
    walk remembers one tree per rule)."""
    params = {k: v.copy() for k, v in params.items()}
    box = [params, refopt.init(rule, params)]
    fn = refopt.update if pure else refopt.update_

    def step():
        box[0], box[1] = fn(rule, box[1], box[0], grads, **kw)
    return step


def torch_step(make_opts, params, grads):
    import torch

    ps = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    for k, p in ps.items():
        p.grad = torch.from_numpy(grads[k].copy())
    opts = make_opts(ps)

    def step():
        for o in opts:
            o.step()
    return step


def run(cases: list, repeats: int) -> dict:
    """Interleaved rounds of every case's step; returns name -> list of ms."""
    for _, fn in cases:  # warm-up: compile, fill caches
        fn()
        fn()
    times = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, fn in cases:
            t = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - t))
    return times


def report(title: str, times: dict, ref: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{title}   (load {os.getloadavg()[0]:.1f})")
    print(f"  {'variant':44s} {'median ms':>10s} {'min ms':>9s} {'/ ' + ref:>14s}")
    for k, v in times.items():
        print(f"  {k:44s} {med[k]:10.2f} {min(v):9.2f} {med[k] / med[ref]:14.2f}")


def case_gpt2(repeats):
    import torch
    params, grads = make_tree(gpt2_shapes())
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.1)
    cases = [
        ("torch AdamW fused", torch_step(lambda ps: [torch.optim.AdamW(ps.values(), lr=1e-3, weight_decay=0.1,
                                                                         fused=True)], params, grads)),
        ("refopt AdamW update_ (check on)", refopt_step(rule, params, grads)),
        ("refopt AdamW update_ (check off)", refopt_step(refopt.AdamW(lr=1e-3, weight_decay=0.1), params, grads,
                                                         check_finite=False)),
        ("refopt gradient check alone", grad_check(grads)),
        ("torch read-only pass (sum of every grad)", torch_read_pass(grads)),
    ]
    times = run(cases, repeats)
    report("AdamW update_, GPT-2-small shapes (75 leaves, 124M float32)", times, "torch AdamW fused")
    report_floor(times, grads, "torch AdamW fused", "refopt AdamW update_ (check off)")


def report_floor(times: dict, grads: dict, ref: str, off: str) -> None:
    """The read rates of the check and of torch's read-only pass, and the floor of the check-on ratio: the
    check-off step plus the check alone (a separate pass: nothing may be written before it ends)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = sum(g.nbytes for g in grads.values())
    print(f"  read rate of the check {nbytes / med['refopt gradient check alone'] / 1e6:.1f} GB/s, of torch's "
          f"read-only pass {nbytes / med['torch read-only pass (sum of every grad)'] / 1e6:.1f} GB/s; the floor "
          f"of 'check on' (check-off step + the check, over {ref}): "
          f"{(med[off] + med['refopt gradient check alone']) / med[ref]:.2f} (8/7 = 1.14 would mean the "
          f"check's read stream costs what one of the step's 7 streams costs)")


def grad_check(grads):
    """The walk's whole-tree gradient check (one compiled pass, :func:`refopt.fast.many.any_bad_many`) alone,
    with AdamW's bound: what ``check_finite=True`` adds to a step."""
    from refopt.fast.many import any_bad_many
    from refopt.kernels import square_bound
    gs = list(grads.values())
    bounds = [square_bound(np.float32)] * len(gs)

    def step():
        assert not any(any_bad_many(gs, bounds))
    return step


def torch_read_pass(grads):
    """A peer's read-only pass over the same bytes (``torch.sum`` of every gradient): the yardstick of
    reading every gradient once, which is what the check costs at best."""
    import torch
    ts = [torch.from_numpy(g) for g in grads.values()]

    def step():
        for t in ts:
            t.sum()
    return step


def case_many(repeats):
    import torch
    params, grads = make_tree({f"p{i:04d}": (100,) for i in range(1000)})
    rule = refopt.Adam(lr=1e-3)
    cases = [
        ("torch Adam fused", torch_step(lambda ps: [torch.optim.Adam(ps.values(), lr=1e-3, fused=True)],
                                        params, grads)),
        ("torch Adam foreach", torch_step(lambda ps: [torch.optim.Adam(ps.values(), lr=1e-3, foreach=True)],
                                          params, grads)),
        ("refopt Adam update_", refopt_step(rule, params, grads)),
        ("refopt Adam update_ (check off)", refopt_step(refopt.Adam(lr=1e-3), params, grads, check_finite=False)),
        ("refopt Adam update (pure)", refopt_step(refopt.Adam(lr=1e-3), params, grads, pure=True)),
    ]
    report("Adam, 1000 leaves of 100 float32", run(cases, repeats), "torch Adam fused")


def case_one(repeats):
    import torch
    params, grads = make_tree({"w": (10_000_000,)})
    rule = refopt.Adam(lr=1e-3)
    cases = [
        ("torch Adam fused", torch_step(lambda ps: [torch.optim.Adam(ps.values(), lr=1e-3, fused=True)],
                                        params, grads)),
        ("refopt Adam update_ (check on)", refopt_step(rule, params, grads)),
        ("refopt Adam update_ (check off)", refopt_step(refopt.Adam(lr=1e-3), params, grads, check_finite=False)),
        ("refopt gradient check alone", grad_check(grads)),
        ("torch read-only pass (sum of every grad)", torch_read_pass(grads)),
    ]
    times = run(cases, repeats)
    report("Adam update_, one leaf of 10M float32", times, "torch Adam fused")
    report_floor(times, grads, "torch Adam fused", "refopt Adam update_ (check off)")


def case_muon(repeats):
    import torch
    shapes = gpt2_shapes()
    params, grads = make_tree(shapes)
    hidden = {k for k, s in shapes.items() if len(s) == 2 and k not in ("wte", "wpe")}
    labels = {k: ("muon" if k in hidden else "adamw") for k in shapes}
    rule = refopt.Partition({"muon": refopt.Muon.like_torch(lr=0.02, weight_decay=0.1),
                             "adamw": refopt.AdamW(lr=1e-3, weight_decay=0.1)}, labels)

    def torch_opts(ps):
        return [torch.optim.Muon([ps[k] for k in sorted(hidden)], lr=0.02, momentum=0.95, nesterov=True,
                                 weight_decay=0.1),
                torch.optim.AdamW([ps[k] for k in shapes if k not in hidden], lr=1e-3, weight_decay=0.1,
                                  fused=True)]
    cases = [("torch Muon (bf16 NS) + AdamW fused", torch_step(torch_opts, params, grads)),
             ("refopt Partition(Muon, AdamW) update_", refopt_step(rule, params, grads))]
    report("Muon on the 48 hidden matrices + AdamW elsewhere, GPT-2-small shapes, float32",
           run(cases, repeats), "torch Muon (bf16 NS) + AdamW fused")


def case_rss(repeats):
    """Peak RSS added by update_ steps (after init and a warm-up step) on the GPT-2-small shapes: the
    elementwise rules' in-place step allocates nothing proportional to the params."""
    import resource

    params, grads = make_tree(gpt2_shapes())
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.1)
    state = refopt.init(rule, params)
    params, state = refopt.update_(rule, state, params, grads)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for _ in range(max(3, repeats)):
        params, state = refopt.update_(rule, state, params, grads)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    nbytes = sum(v.nbytes for v in params.values()) / 2**20
    print(f"\npeak RSS, AdamW update_ on the GPT-2-small shapes (params {nbytes:.0f} MiB, state {2 * nbytes:.0f} "
          f"MiB, grads {nbytes:.0f} MiB): {before:.0f} MiB after the first step, {after:.0f} MiB after "
          f"{max(3, repeats)} more (+{after - before:.1f} MiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["gpt2", "many", "one", "muon", "rss", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    print(f"threads: numba {numba.get_num_threads()}, torch {torch.get_num_threads()}; torch {torch.__version__}, "
          f"numba {numba.__version__}, numpy {np.__version__}; {os.cpu_count()} cores")
    for name in (["rss", "many", "one", "gpt2", "muon"] if args.case == "all" else [args.case]):
        globals()[f"case_{name}"](args.repeats if name != "muon" else max(3, args.repeats // 3))


if __name__ == "__main__":
    main()

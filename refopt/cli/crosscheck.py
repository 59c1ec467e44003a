"""Cross-check refopt against torch.optim, optax and schedulefree, step by step (docs/crosscheck.md).

Every row of the convention table (refopt.crosscheck.presets) runs refopt and the peer on the same
initial params and the same gradient sequence (computed along refopt's trajectory) and compares params
and state after every step. Exit status 1 if any row fails (or a deliberately wrong preset is not
caught with --negative), 2 for a usage error or a requested peer that is not installed.
"""
from __future__ import annotations

import argparse
import json
import sys

HELP = "compare refopt with torch.optim / optax / schedulefree step by step on identical inputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from refopt.crosscheck.presets import FAMILIES, PEERS
    from refopt.crosscheck.problems import PROBLEMS

    p.add_argument("--against", default="all", choices=["all", *PEERS], help="which peer library")
    p.add_argument("--rules", nargs="+", default=None, metavar="FAMILY",
                   help=f"rule families to check (default all): {' '.join(FAMILIES)}")
    p.add_argument("--problems", nargs="+", default=["stream", "mlp"], choices=list(PROBLEMS),
                   help="canonical problems providing params and gradients")
    p.add_argument("--steps", type=int, default=50, help="steps per run")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--negative", action="store_true",
                   help="also run the deliberately wrong presets, which must be caught (status 'caught')")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from refopt.crosscheck import peers
    from refopt.crosscheck.presets import PEERS, select
    from refopt.crosscheck.run import run_all, table

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    presets = select(args.against, args.rules, misconfigured=args.negative)
    if not presets:
        raise ValueError("no preset matches --against/--rules")
    wanted = PEERS if args.against == "all" else (args.against,)
    missing = {}
    for peer in wanted:
        ok, why = peers.available(peer)
        if not ok:
            missing[peer] = why
    if args.against != "all" and missing:
        print(f"refopt crosscheck: {missing[args.against]}", file=sys.stderr)
        return 2
    for peer, why in missing.items():
        print(f"note: skipping {peer}: {why}", file=sys.stderr)
    if len(missing) == len(wanted):
        print("refopt crosscheck: none of the peers is installed, nothing was checked "
              "(pip install torch==2.13.0 jax jaxlib optax schedulefree)", file=sys.stderr)
        return 2
    presets = [p for p in presets if p.peer not in missing or p.make_rule is None]
    results = run_all(presets, tuple(args.problems), args.steps, args.dtype, args.seed)
    print(table(results))
    n_fail = sum(r.failed for r in results)
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "gap", "caught", "MISSED", "skip")}
    print("\n" + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "dtype": args.dtype, "seed": args.seed, "problems": args.problems,
                       "missing_peers": missing, "results": [r.to_dict() for r in results]}, f, indent=1)
            f.write("\n")
    return 1 if n_fail else 0

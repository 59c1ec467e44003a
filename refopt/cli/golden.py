"""Export or check golden vectors (docs/golden.md).

``refopt golden export DIR`` runs every rule configuration of the golden catalog (refopt.golden) on the
canonical problems and writes ``<case>__<problem>__<dtype>.npz`` + ``.json`` manifests into DIR.
``refopt golden check DIR --against refopt|torch|optax|schedulefree`` verifies every file's hashes and
replays it. Exit status 1 if a replay fails, 2 for a corrupted or malformed file, a usage error, or a
requested peer that is not installed.

``refopt golden export DIR --rule "EXPR" [--name STEM]`` exports any rule configuration (a refopt rule
expression, parsed safely); the file stem is ``<STEM>__<problem>__<dtype>`` with STEM a slug of EXPR by
default. Peer presets are matched by hyperparameters, so the manifest names every peer call that
reproduces the rule (``Adam(beta2=0.95)`` -> ``torch.optim.Adam(betas=(0.9, 0.95))``).
"""
from __future__ import annotations

import argparse
import json
import sys

HELP = "export golden vectors (npz + JSON manifest) or replay them against refopt / torch / optax"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from refopt.crosscheck.problems import PROBLEMS

    p.allow_abbrev = False
    sub = p.add_subparsers(dest="golden_command", metavar="{export,check}")
    sub.required = True
    e = sub.add_parser("export", help="write golden files into DIR", allow_abbrev=False)
    e.add_argument("dir", help="folder to write the golden files into (created if missing)")
    from refopt.golden import catalog

    e.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                   help="catalog case names (default all): " + " ".join(c.name for c in catalog()))
    e.add_argument("--rule", default=None, metavar="EXPR",
                   help="export this rule configuration instead of catalog cases, e.g. 'Adam(beta2=0.95)'")
    e.add_argument("--name", default=None, metavar="STEM", help="file stem for --rule (default: a slug of EXPR)")
    e.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS),
                   help="the gradient problems to record")
    e.add_argument("--steps", type=int, default=50, help="optimizer steps per file")
    e.add_argument("--dtype", default="float64", choices=["float64", "float32"], help="params and gradients dtype")
    e.add_argument("--seed", type=int, default=0, help="seeds the problems' initial params and gradients")
    c = sub.add_parser("check", help="verify and replay the golden files in DIR", allow_abbrev=False)
    c.add_argument("dir", help="a folder of golden files (e.g. tests/golden)")
    c.add_argument("--against", default="refopt", choices=["refopt", "torch", "optax", "schedulefree"],
                   help="replay the files with refopt or with an installed peer")
    c.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from refopt import golden

    if args.golden_command == "export":
        if args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        if args.rule is not None:
            if args.cases:
                raise ValueError("--rule and --cases do not go together")
            stems = golden.export_rule(args.dir, args.rule, args.name, tuple(args.problems), args.steps, args.dtype,
                                       args.seed)
        else:
            if args.name is not None:
                raise ValueError("--name needs --rule")
            stems = golden.export(args.dir, args.cases, tuple(args.problems), args.steps, args.dtype, args.seed)
        print(f"wrote {len(stems)} golden vectors (npz + json) into {args.dir}")
        return 0

    from refopt.crosscheck import peers
    from refopt.crosscheck.run import table

    if args.against != "refopt":
        ok, why = peers.available(args.against)
        if not ok:
            print(f"refopt golden: {why}", file=sys.stderr)
            return 2
    try:
        results = golden.check(args.dir, args.against)
    except golden.GoldenError as e:
        print(f"refopt golden: error: {e}", file=sys.stderr)
        return 2
    print(table(results))
    n_fail = sum(r.failed for r in results)
    n_pass = sum(r.status == "pass" for r in results)
    n_skip = sum(r.status == "skip" for r in results)
    print(f"\n{n_pass} pass, {n_fail} fail, {n_skip} skipped (no {args.against} preset for that rule)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in results], f, indent=1)
            f.write("\n")
    return 1 if n_fail else 0

"""Cross-check refopt against torch.optim, optax and schedulefree, step by step (docs/crosscheck.md).

Every row of the convention table (refopt.crosscheck.presets) runs refopt and the peer on the same
initial params and the same gradient sequence (computed along refopt's trajectory) and compares params
and state after every step. Exit status 1 if any row fails (or a deliberately wrong preset is not
caught with --negative), 2 for a usage error or a requested peer that is not installed.

Your own implementation (docs/crosscheck.md, "Your own implementation")::

    refopt crosscheck --impl MODULE_OR_FILE.py:NAME [--kwargs JSON] --rule "EXPR" [--steps N] [--dtype D]
                      [--framework torch|jax|numpy] [--layout torch|refopt]

NAME is a torch.optim.Optimizer subclass or a callable returning one (``NAME(params, **kwargs)``, the
default), with --framework jax a callable returning an optax GradientTransformation (``NAME(**kwargs)``),
with --framework numpy an object with ``init(params)`` and ``step(state, params, grads)``. EXPR is a
refopt rule expression (``AdamW(lr=1e-3, weight_decay=0.1)``; parsed with ast, never evaluated).
Exit status: 0 they agree within the documented tolerance, 1 they differ (the first differing step and
leaf and the closest convention variant are printed), 2 a usage error or a missing peer, 3 the
implementation raised (the last line of its traceback is printed).
"""
from __future__ import annotations

import argparse
import json
import sys

HELP = "compare refopt with torch.optim / optax / schedulefree step by step on identical inputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from refopt.crosscheck.presets import ALL_PEERS, FAMILIES
    from refopt.crosscheck.problems import PROBLEMS

    p.allow_abbrev = False      # --rule and --rules must never be confused
    g = p.add_argument_group("your own implementation (--impl; --against/--rules/--negative do not apply)")
    g.add_argument("--impl", default=None, metavar="MODULE_OR_FILE.py:NAME",
                   help="the implementation to check against --rule")
    g.add_argument("--kwargs", default=None, metavar="JSON", help="keyword arguments for NAME, a JSON object")
    g.add_argument("--rule", default=None, metavar="EXPR", help="the refopt rule, e.g. 'AdamW(lr=1e-3)'")
    g.add_argument("--framework", default=None, choices=["torch", "jax", "numpy"],
                   help="what NAME is (default torch)")
    g.add_argument("--layout", default=None, choices=["torch", "refopt"],
                   help="how NAME holds matrices: torch (out, in) or refopt (fan_in, fan_out) (default: torch "
                        "for torch, refopt otherwise)")
    p.add_argument("--against", default="all", choices=["all", *ALL_PEERS], help="which peer library")
    p.add_argument("--rules", nargs="+", default=None, metavar="FAMILY",
                   help=f"rule families to check (default all): {' '.join(FAMILIES)}")
    p.add_argument("--problems", nargs="+", default=None, choices=list(PROBLEMS),
                   help="canonical problems providing params and gradients (default stream mlp; with --impl "
                        "stream quadratic mlp gpt)")
    p.add_argument("--steps", type=int, default=50, help="steps per run")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="the dtype of params, gradients and both optimizers")
    p.add_argument("--seed", type=int, default=0, help="seeds the problems' initial params and gradients")
    p.add_argument("--negative", action="store_true",
                   help="also run the deliberately wrong presets, which must be caught (status 'caught')")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")


def parse_kwargs(text: str | None) -> dict:
    """--kwargs JSON -> dict (ValueError naming the problem). JSON lists become tuples (betas=(0.9, 0.95))."""
    if text is None:
        return {}
    try:
        kw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--kwargs is not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    if not isinstance(kw, dict):
        raise ValueError(f"--kwargs must be a JSON object such as '{{\"lr\": 0.001}}', got {text!r}")

    def tup(v):
        return tuple(tup(a) for a in v) if isinstance(v, list) else v
    return {k: tup(v) for k, v in kw.items()}


def load_target(args: argparse.Namespace):
    """(impl object, display name, kwargs, rule) from --impl/--kwargs/--rule (ValueError on a usage error)."""
    from refopt.crosscheck.expr import parse_rule
    from refopt.testing.adapters import load_impl

    if args.impl is None or args.rule is None:
        raise ValueError("--impl and --rule go together: --impl MODULE_OR_FILE.py:NAME --rule \"EXPR\"")
    rule = parse_rule(args.rule)
    kwargs = parse_kwargs(args.kwargs)
    impl, name = load_impl(args.impl)
    return impl, name, kwargs, rule


def run_user_code(fn, prog: str) -> tuple[int, object]:
    """Run ``fn()``; map the implementation raising to exit 3 and a missing peer to exit 2."""
    from refopt.crosscheck.peers import PeerNotInstalled
    from refopt.testing.adapters import UserCodeError

    try:
        return 0, fn()
    except UserCodeError as e:
        print(f"refopt {prog}: your implementation raised: {e}", file=sys.stderr)
        return 3, None
    except PeerNotInstalled as e:
        print(f"refopt {prog}: {e}", file=sys.stderr)
        return 2, None


def run_impl(args: argparse.Namespace) -> int:
    from refopt.crosscheck.plugin import DEFAULT_PROBLEMS, check_impl

    if args.against != "all" or args.rules or args.negative:
        raise ValueError("--against, --rules and --negative do not apply with --impl (use --rule)")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    code, target = run_user_code(lambda: load_target(args), "crosscheck")
    if code:
        return code
    impl, name, kwargs, _ = target     # (the rule is parsed there; check_impl reads a like(PEER, ...) call's
    rule = args.rule                   # state names from the text)
    code, res = run_user_code(lambda: check_impl(impl, rule, kwargs, args.framework, args.layout, args.steps,
                                                 args.dtype, tuple(args.problems or DEFAULT_PROBLEMS), args.seed,
                                                 name=name), "crosscheck")
    if code:
        return code
    print(res.report(debug=getattr(args, "debug", False)))
    if args.json:
        from dataclasses import asdict
        with open(args.json, "w") as f:
            json.dump(asdict(res), f, indent=1, default=str)
            f.write("\n")
    return res.exit_code


def run(args: argparse.Namespace) -> int:
    if args.impl is not None or args.rule is not None:
        return run_impl(args)
    if args.kwargs is not None or args.framework is not None or args.layout is not None:
        raise ValueError("--kwargs, --framework and --layout need --impl and --rule")
    if args.problems is None:
        args.problems = ["stream", "mlp"]
    from refopt.crosscheck import peers
    from refopt.crosscheck.presets import ALL_PEERS, select
    from refopt.crosscheck.run import run_all, table

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    presets = select(args.against, args.rules, misconfigured=args.negative)
    if not presets:
        raise ValueError("no preset matches --against/--rules")
    wanted = ALL_PEERS if args.against == "all" else (args.against,)
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
              "(pip install torch==2.13.0 && pip install -e \".[peers]\")", file=sys.stderr)
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

"""Run the invariance properties of refopt.testing on your optimizer, next to the refopt rule.

``refopt invariants --impl MODULE_OR_FILE.py:NAME [--kwargs JSON] --rule "EXPR"`` runs every property
(gradient-scale invariance, parameter-scale covariance (post 000, eq. phi), orthogonal and permutation
equivariance, reparametrization covariance, the GPT's joint symmetries, Muon's muP step size, purity,
determinism, bit-identical resume) with hypothesis on the implementation and on the refopt rule, and
prints a table: property, what the theory says for the rule, what the refopt rule does, what your code
does, verdict ('expected' for a failure the rule shares, e.g. SGD is not gradient-scale invariant).
An expected failure more than 10x the rule's own error on the same input is a FAIL. Each failure's input is
saved in full precision to ``--counterexamples DIR`` (``<property>.npz``) and printed with the command that
replays it (``--replay FILE``: that input only, on your code and on the rule).
Exit status: 0 every property the refopt rule satisfies also holds for the implementation, 1 one does
not (or a replayed counterexample still fails), 2 a usage error or a missing peer, 3 the implementation raised.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

HELP = "run the invariance properties (hypothesis) on your optimizer and print the expected-outcome table"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.allow_abbrev = False
    p.add_argument("--impl", required=True, metavar="MODULE_OR_FILE.py:NAME", help="the implementation")
    p.add_argument("--kwargs", default=None, metavar="JSON", help="keyword arguments for NAME, a JSON object")
    p.add_argument("--rule", required=True, metavar="EXPR", help="the refopt rule, e.g. 'Adam(lr=1e-3)'")
    p.add_argument("--framework", default=None, choices=["torch", "jax", "numpy"], help="what NAME is (default torch)")
    p.add_argument("--layout", default=None, choices=["torch", "refopt"], help="how NAME holds matrices")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="the dtype of the drawn params and gradients")
    p.add_argument("--max-examples", type=int, default=8, help="hypothesis examples per property")
    p.add_argument("--properties", nargs="+", default=None, metavar="NAME", help="run only these properties")
    p.add_argument("--counterexamples", default="refopt_counterexamples", metavar="DIR",
                   help="where the full-precision input of each failure is saved (<property>.npz); "
                        "default %(default)s")
    p.add_argument("--replay", default=None, metavar="FILE",
                   help="check one saved counterexample again (on your code and on the rule) instead of drawing")


def run(args: argparse.Namespace) -> int:
    from refopt.cli.crosscheck import load_target, run_user_code

    try:
        from refopt.testing import properties as P
    except ImportError as e:
        print(f"refopt invariants: {e}", file=sys.stderr)
        return 2
    if args.max_examples < 1:
        raise ValueError(f"--max-examples must be >= 1, got {args.max_examples}")
    known = [p.name for p in P.PROPERTIES]
    for n in args.properties or []:
        if n not in known:
            raise ValueError(f"unknown property {n!r}; choose from {known}")
    code, target = run_user_code(lambda: load_target(args), "invariants")
    if code:
        return code
    impl, name, kwargs, rule = target
    if args.replay is not None:
        return _replay(args, impl, name, kwargs, rule)
    command = " ".join(["refopt invariants", "--impl", shlex.quote(args.impl)]
                       + (["--kwargs", shlex.quote(args.kwargs)] if args.kwargs else [])
                       + ["--rule", shlex.quote(args.rule)]
                       + sum(([f"--{k}", v] for k, v in (("framework", args.framework), ("layout", args.layout),
                                                          ("dtype", args.dtype)) if v), []))
    code, rep = run_user_code(lambda: P.invariants(impl, rule, kwargs, args.framework, args.layout, args.properties,
                                                   args.max_examples, None, args.dtype, name=name,
                                                   save_dir=args.counterexamples, command=command), "invariants")
    if code:
        return code
    print(rep.table())
    bad = rep.failures
    print("\n" + ("every property the refopt rule satisfies also holds" if not bad else
                  "FAILED: " + "; ".join(f"{r[0]}: {r[5]}" for r in bad)))
    return rep.exit_code


def _replay(args, impl, name, kwargs, rule) -> int:
    from refopt.cli.crosscheck import run_user_code
    from refopt.testing import properties as P

    if not os.path.isfile(args.replay):
        raise ValueError(f"--replay: no such file {args.replay!r}")
    code, out = run_user_code(lambda: P.replay(args.replay, impl, rule, kwargs, args.framework, args.layout, name),
                              "invariants")
    if code:
        return code
    mine, ref = out
    print(f"replay of {args.replay} ({mine.property}):\n  your code:   {mine.describe()}\n"
          f"  refopt rule: {ref.describe()}")
    return 1 if mine.holds is False else 0

"""The diagnosis trial: run `refopt crosscheck --impl` on every implementation of manifest.json and print, per
implementation, its planted bug, the exit status and the DIAGNOSIS line.

The implementations (impls_torch.py, impls_numpy.py) were written from the papers and the rule docstrings by a
session that had not read refopt's diagnosis code; each buggy one states its bug in its docstring and in the
manifest ("bug"), with the words a correct diagnosis should contain ("keywords": a first, automatic reading;
the table in docs/crosscheck.md is judged by reading each line).

    python benchmarks/planted_bugs/trial.py [--manifest FILE] [--steps 30] [--problems stream quadratic mlp]
                                            [--only ID ...] [--verbose]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--problems", nargs="+", default=["stream", "quadratic", "mlp"])
    ap.add_argument("--only", nargs="+", default=None)
    ap.add_argument("--verbose", action="store_true", help="print each full report")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.json"),
                    help="the trial's manifest (round2/manifest.json: the second trial)")
    args = ap.parse_args()
    with open(args.manifest) as f:
        manifest = json.load(f)
    rows = []
    for m in manifest:
        if args.only and m["id"] not in args.only:
            continue
        cmd = [sys.executable, "-m", "refopt.cli", "crosscheck", "--impl", f"{m['file']}:{m['name']}",
               "--kwargs", json.dumps(m["kwargs"]), "--rule", m["rule"], "--steps", str(args.steps),
               "--problems", *args.problems]
        if m.get("framework"):
            cmd += ["--framework", m["framework"]]
        if m.get("layout"):
            cmd += ["--layout", m["layout"]]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        out = p.stdout + p.stderr
        line = next((ln for ln in out.splitlines() if ln.startswith("DIAGNOSIS")), "-")
        hit = bool(m["keywords"]) and all(k.lower() in line.lower() for k in m["keywords"])
        rows.append((m["id"], m["bug"], p.returncode, line, hit, dt))
        if args.verbose:
            print(out)
        print(f"{m['id']}: exit {p.returncode} ({dt:.1f} s) {'[keywords found]' if hit else ''}\n  bug: {m['bug']}\n"
              f"  {line}", flush=True)
    buggy = [r for r in rows if r[1]]
    ok = [r for r in rows if not r[1]]
    print(f"\n{len(buggy)} buggy: {sum(r[2] == 1 for r in buggy)} caught, {sum(r[4] for r in buggy)} with every "
          f"keyword in the DIAGNOSIS line; {len(ok)} correct: {sum(r[2] == 0 for r in ok)} agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())

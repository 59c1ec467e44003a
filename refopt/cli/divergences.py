"""The divergence atlas (docs/divergences.md): where torch.optim, optax and schedulefree (and a few codes
restated by refopt) disagree, measured live.

For every entry the installed peers run on one gradient stream (float64, 50 steps); the command prints
the measured differences between the sides and, for each side, the refopt configuration that reproduces
it with the measured reproduction error and its tolerance, and which side follows the paper or the
original author's code. Entries whose peer is not installed are skipped with the reason. Every figure is
measured in the run; the peers' versions are printed (the ``peers`` extra pins them).

Exit status: 0 every entry reproduced as documented (skipped entries included), 1 an entry no longer does
(a divergence vanished, an agreement broke, or a side is no longer reproduced by its preset: a peer
changed, update the atlas), 2 a usage error (or the peer named by ``--against`` is not installed).
"""
from __future__ import annotations

import argparse
import json

HELP = "where the major optimizer implementations disagree, measured live (the divergence atlas)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from refopt.crosscheck.presets import ALL_PEERS

    p.add_argument("--against", default="all", choices=["all", *ALL_PEERS],
                   help="only the entries involving this peer ('all' also runs the entries restated by refopt only)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these entries (by name; see --list)")
    p.add_argument("--list", action="store_true", help="list the entries and exit")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="also write the entries as a JSON list (each: name, status, peers and their versions, the "
                        "measured differences, each side's refopt preset with its measured reproduction error)")


def run(args: argparse.Namespace) -> int:
    from refopt.crosscheck import divergences as D

    chosen = D.select(args.against)
    if args.list:
        for e in chosen:
            print(f"{e.name}: {e.title} (peers: {', '.join(e.peers) or 'none, restated by refopt'})")
        return 0
    if args.only:
        names = [e.name for e in chosen]
        unknown = [n for n in args.only if n not in names]
        if unknown:
            raise ValueError(f"unknown entry {unknown[0]!r} for --against {args.against}; choose from {names}")
        chosen = [e for e in chosen if e.name in args.only]
    if args.against != "all":              # as `refopt crosscheck`: the one requested peer must be there
        from refopt.crosscheck import peers
        ok, why = peers.available(args.against)
        if not ok:
            raise ValueError(why)
    if args.json:                          # fail on an unwritable file before the minute of running
        open(args.json, "a").close()
    results = [D.run_entry(e) for e in chosen]
    print(D.report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in results], f, indent=1, allow_nan=False)
            f.write("\n")
    return 1 if any(r.status == "changed" for r in results) else 0

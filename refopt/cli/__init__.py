"""The ``refopt`` command line: ``refopt train`` (the main job) and friends.

The command line is an application on top of the library: it may import ``models`` (lazily), the core
of ``refopt`` never does. Every user mistake (unknown value, unwritable directory, bad data file)
ends in a one-line ``refopt: error: ...`` message and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

from refopt.cli import compare, crosscheck, golden, invariants, train


class UserError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit status 2."""


COMMANDS = {"train": train, "compare": compare, "crosscheck": crosscheck, "golden": golden, "invariants": invariants}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refopt", description="refopt: a golden reference for optimizers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in COMMANDS.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].run(args) or 0
    except (UserError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as e:
        print(f"refopt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("refopt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``refopt`` command line: ``refopt train`` (the main job) and friends.

The command line is an application on top of the library: it may import ``refopt.models`` (lazily), the
core of ``refopt`` never does. Every user mistake (unknown value, an option that does not apply to the
chosen model or optimizer, unwritable directory, bad data file, bad checkpoint or run directory) ends in
a one-line ``refopt COMMAND: error: ...`` message and exit status 2. Anything else is a bug: one line
naming the exception, exit status 1; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import sys

from refopt.cli import compare, crosscheck, divergences, golden, invariants, train


class UserError(Exception):
    """A mistake in the command line or its inputs: printed as one line, exit status 2."""


COMMANDS = {"train": train, "compare": compare, "crosscheck": crosscheck, "golden": golden, "invariants": invariants,
            "divergences": divergences}
#: exceptions that report a user mistake (a bad value, file or directory): one line, exit status 2
USER_ERRORS = (UserError, ValueError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help unless the default is None or False (flags, and
    options whose default depends on the model: their help text says it)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS \
                or "%(default)" in (action.help or "") or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _add_debug(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an unexpected error, show the Python traceback instead of one line; crosscheck --impl: "
                        "also list the diagnosis variants that could not run, with their errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refopt", description="refopt: a golden reference for optimizers.")
    _add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in COMMANDS.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__, formatter_class=HelpFormatter)
        mod.add_arguments(p)
        _add_debug(p, argparse.SUPPRESS)    # accepted after the command too, without hiding the first
    return parser


def _suppress_defaults(p: argparse.ArgumentParser) -> None:
    p._defaults.clear()
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                _suppress_defaults(sp)
        elif a.dest != "help":
            a.default = argparse.SUPPRESS


def explicit_options(argv: list[str]) -> set[str]:
    """The destinations of the options written on the command line ``argv`` (not left at default)."""
    p = build_parser()
    _suppress_defaults(p)
    return set(vars(p.parse_args(argv))) - {"command", "golden_command", "debug"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    args.explicit_options = explicit_options(argv)
    if args.command in ("train", "compare"):   # training loops: reuse freed heap pages (refopt.cli._memory)
        from refopt.cli._memory import keep_freed_memory

        keep_freed_memory()
    try:
        return COMMANDS[args.command].run(args) or 0
    except USER_ERRORS as e:
        print(f"refopt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("refopt: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        msg = " ".join(str(e).split())[:300]
        print(f"refopt {args.command}: internal error: {type(e).__name__}: {msg} (a bug in refopt, or an "
              f"unusual input: run again with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

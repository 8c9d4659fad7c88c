"""``spectune`` command line: one module per subcommand, each with ``register(subparsers)``.

Errors a user can cause (bad files, bad parameters, incompatible models) end with a
one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import NoReturn

from spectune.cli import bench, distill, experiment, export, generate, report, select, serve
from spectune.errors import SpectuneError

__all__ = ["main"]

COMMANDS = (generate, report, bench, distill, select, experiment, serve, export)


class UsageError(SpectuneError):
    """The command line does not parse (an unknown option, a value of the wrong type)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``spectune: error: ...``, exit status 2)
    like every other error, instead of the usage text and a ``SystemExit``."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spectune", description="Lossless speculative decoding with live tuning.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        # The command line as typed, for results files that name the command behind a figure.
        args.command_line = "spectune " + shlex.join(sys.argv[1:] if argv is None else argv)
        status: int = args.run(args)
    except SpectuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

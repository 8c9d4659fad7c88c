"""``spectune`` command line: one module per subcommand, each with ``register(subparsers)``.

Errors a user can cause (bad files, bad parameters, incompatible models) end with a
one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from spectune.cli import (
    bench,
    corpus,
    distill,
    experiment,
    export,
    generate,
    report,
    select,
    serve,
    suffix,
)
from spectune.errors import SpectuneError

__all__ = ["main"]

COMMANDS = (generate, report, bench, corpus, distill, select, experiment, serve, export, suffix)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectune", description="Lossless speculative decoding with live tuning."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # The command line as typed, for results files that name the command behind a figure.
    args.command_line = "spectune " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        status: int = args.run(args)
    except SpectuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())

"""``spectune`` command line: one module per subcommand, each with ``register(subparsers)``.

Errors a user can cause (bad files, bad parameters, incompatible models) end with a
one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Sequence
from typing import Protocol, TextIO

from spectune.cli import bench, distill, experiment, export, generate, report, select, serve
from spectune.cli.common import print_warning
from spectune.errors import SpectuneError, SpectuneWarning

__all__ = ["main"]


class ShowWarning(Protocol):
    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None: ...


COMMANDS = (generate, report, bench, distill, select, experiment, serve, export)


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
        with warnings.catch_warnings():
            # spectune's own warnings (checks an expert flag switched off) as one line each.
            warnings.simplefilter("always", SpectuneWarning)
            warnings.showwarning = _show_warning(warnings.showwarning)
            status: int = args.run(args)
    except SpectuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


def _show_warning(default: ShowWarning) -> ShowWarning:
    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, SpectuneWarning):
            print_warning(str(message))
        else:
            default(message, category, filename, lineno, file, line)

    return show


if __name__ == "__main__":
    sys.exit(main())

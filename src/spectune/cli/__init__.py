"""``spectune`` command line: one module per subcommand, each with ``register(subparsers)``.

Errors a user can cause (bad files, bad parameters, incompatible models) end with a
one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn, TextIO

from spectune.cli import (
    advise,
    bench,
    convert,
    corpus,
    distill,
    experiment,
    export,
    generate,
    report,
    select,
    serve,
    suffix,
    tune,
    watch,
)
from spectune.cli.common import print_warning
from spectune.errors import SpectuneError, SpectuneWarning

__all__ = ["main"]

COMMANDS = (
    generate,
    report,
    tune,
    bench,
    corpus,
    distill,
    select,
    advise,
    experiment,
    serve,
    export,
    convert,
    suffix,
    watch,
)


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
    for subparser in subparsers.choices.values():
        _show_defaults(subparser)
    return parser


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option's ``--help`` line names its default, unless its help already says it
    (an option that is off unless given, or has no default, says nothing)."""
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        default = action.default
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        if default in (None, False, [], argparse.SUPPRESS) or "default" in (action.help or ""):
            continue
        shown = "(default: %(default)s)"
        action.help = f"{action.help} {shown}" if action.help else shown


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        # The command line as typed, for results files that name the command behind a figure.
        args.command_line = "spectune " + shlex.join(sys.argv[1:] if argv is None else argv)
        with _one_line_warnings():
            status: int = args.run(args)
    except SpectuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return status


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """spectune's own warnings (a check an expert flag switched off) as one
    ``spectune: warning:`` line each; other warnings as Python shows them."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", SpectuneWarning)
        python_show = warnings.showwarning

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
                python_show(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


if __name__ == "__main__":
    sys.exit(main())

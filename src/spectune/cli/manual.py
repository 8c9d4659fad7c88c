"""The manual's options tables, written from the command line's own parsers.

A task page marks where a subcommand's table goes::

    <!-- options: generate -->
    (the table: generated, never edited by hand)
    <!-- end options -->

``<!-- options: generate --tree-width --tree-nodes -->`` limits a table to the flags named
(a page about one feature of a command). ``python -m spectune.cli.manual`` (``make docs``)
rewrites every such block in ``docs/*.md`` from ``spectune.cli.build_parser()``: one row
per option with its flag, default, choices and help, so that a page cannot drift from the
flags the command takes. ``--check`` changes
nothing and exits 1 naming each page whose tables differ (the test suite runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["options_table", "stale_pages", "subcommand_parsers", "update_page"]

BLOCK = re.compile(
    r"(?P<open><!-- options: (?P<command>[a-z-]+)(?P<flags>(?: --?[a-z][a-z-]*)*) -->\n)"
    r"(?P<table>.*?)(?P<close><!-- end options -->)",
    re.DOTALL,
)
REGENERATE = "make docs"  # the command that rewrites the tables
_SHOWN_DEFAULT = " (default: %(default)s)"  # what spectune.cli adds to a help line


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name, as ``spectune`` builds them."""
    from spectune.cli import build_parser  # the manual is written from the real parsers

    for action in build_parser()._actions:  # argparse keeps no public list of actions
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("spectune's parser has no subcommands")


def options_table(parser: argparse.ArgumentParser, only: Sequence[str] = ()) -> str:
    """A Markdown table of ``parser``'s arguments (those among ``only``, if given): flag,
    default, choices, help."""
    actions = [
        action
        for action in parser._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
    ]
    if only:
        known = {option for action in actions for option in action.option_strings}
        if unknown := [flag for flag in only if flag not in known]:
            raise KeyError(f"an options block names {', '.join(unknown)}, which it does not take")
        actions = [action for action in actions if set(action.option_strings) & set(only)]
    rows = ["| option | default | choices | what it does |", "|---|---|---|---|"]
    for action in actions:
        cells = (f"`{_flag(action)}`", _default(action), _choices(action), _help(action))
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _flag(action: argparse.Action) -> str:
    """``--max-tokens N`` / ``-k K, --k K`` / ``prompt``: the choices have their own column."""
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return ", ".join(f"{option} {metavar}" for option in action.option_strings)


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction) and action.default is not None:
        return "on" if action.default else "off"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off"  # the flag is not given unless typed
    default = action.default
    if default in (None, argparse.SUPPRESS, "") or default == []:
        return ""
    if isinstance(default, list | tuple):
        return ", ".join(f"`{item}`" for item in default)
    return f"`{default}`"


def _choices(action: argparse.Action) -> str:
    if action.choices is None or isinstance(action, argparse._SubParsersAction):
        return ""
    return ", ".join(f"`{choice}`" for choice in action.choices)


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace(_SHOWN_DEFAULT, "").replace(_SHOWN_DEFAULT.strip(), "")
    values = {**vars(action), "prog": "spectune"}
    for name, value in list(values.items()):
        if isinstance(value, list | tuple):
            values[name] = ", ".join(str(item) for item in value)
    return " ".join((text % values).split())


def update_page(text: str, parsers: dict[str, argparse.ArgumentParser]) -> str:
    """``text`` with every options block rewritten from ``parsers``."""

    def table(match: re.Match[str]) -> str:
        command = match["command"]
        if command not in parsers:
            raise KeyError(f"an options block names '{command}', which is no subcommand")
        table = options_table(parsers[command], match["flags"].split())
        return match["open"] + "\n" + table + "\n" + match["close"]

    return BLOCK.sub(table, text)


def stale_pages(docs: Path, parsers: dict[str, argparse.ArgumentParser]) -> list[Path]:
    """The pages under ``docs`` whose options tables differ from ``parsers``."""
    pages = sorted(docs.glob("*.md"))
    return [page for page in pages if update_page(page.read_text(), parsers) != page.read_text()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectune.cli.manual", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="the manual's folder")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a table is stale"
    )
    args = parser.parse_args(argv)
    parsers = subcommand_parsers()
    stale = stale_pages(args.docs, parsers)
    if args.check:
        for page in stale:
            print(f"{page}: options tables differ from the parsers; run '{REGENERATE}'")
        return 1 if stale else 0
    for page in stale:
        page.write_text(update_page(page.read_text(), parsers))
        print(f"rewrote the options tables in {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The manual's options tables equal the parsers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from spectune.cli.manual import (
    REGENERATE,
    options_table,
    stale_pages,
    subcommand_parsers,
    update_page,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"
# Each task page opens with the options of the commands it is the manual of.
PAGES = {
    "usage.md": ["generate"],
    "advise.md": ["advise"],
    "serving.md": ["serve", "watch", "export"],
    "bench.md": ["bench"],
    "drafts.md": ["select", "distill", "corpus", "convert"],
    "adaptive.md": ["tune", "report"],
    "suffix.md": ["suffix-index"],
    "trees-batching.md": ["generate --tree-width --tree-nodes --tree-min-prob", "experiment"],
}


def test_every_page_table_equals_its_parser() -> None:
    stale = stale_pages(DOCS, subcommand_parsers())
    assert not stale, (
        f"options tables differ from the parsers in {', '.join(p.name for p in stale)}: "
        f"run '{REGENERATE}' (python -m spectune.cli.manual)"
    )


@pytest.mark.parametrize("page", sorted(PAGES))
def test_task_page_opens_with_its_options(page: str) -> None:
    text = (DOCS / page).read_text()
    for command in PAGES[page]:
        assert f"<!-- options: {command} -->" in text, f"docs/{page} has no table for {command}"
    first_table = text.index("<!-- options: ")
    assert text.count("\n## ", 0, first_table) <= 1, (
        f"docs/{page}: the options come after a section"
    )


def test_every_subcommand_has_a_table() -> None:
    documented = {command for commands in PAGES.values() for command in commands}
    assert set(subcommand_parsers()) <= documented


def _toy() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt", nargs="?", help="the text")
    parser.add_argument("-k", "--k", type=int, default=None, help="draft tokens")
    parser.add_argument("--mode", choices=["a", "b"], default="a", help="a|b mode (%(default)s)")
    parser.add_argument("--fast", action="store_true", help="go fast")
    parser.add_argument("--usage", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    return parser


def test_options_table_rows() -> None:
    rows = options_table(_toy()).splitlines()
    assert rows[0] == "| option | default | choices | what it does |"
    assert rows[2:] == [
        "| `prompt` |  |  | the text |",
        "| `-k K, --k K` |  |  | draft tokens |",
        "| `--mode MODE` | `a` | `a`, `b` | a\\|b mode (a) |",
        "| `--fast` | off |  | go fast |",
        "| `--usage, --no-usage` | on |  |  |",
    ]


def test_update_page_rewrites_only_the_blocks() -> None:
    page = "# Title\n\n<!-- options: toy -->\nold\n<!-- end options -->\n\nText stays.\n"
    updated = update_page(page, {"toy": _toy()})
    assert updated.startswith("# Title\n\n<!-- options: toy -->\n\n| option |")
    assert updated.endswith("|\n\n<!-- end options -->\n\nText stays.\n")
    assert update_page(updated, {"toy": _toy()}) == updated
    with pytest.raises(KeyError, match="'nope', which is no subcommand"):
        update_page("<!-- options: nope -->\n<!-- end options -->", {"toy": _toy()})


def test_check_names_the_stale_page_and_the_fix(tmp_path: Path) -> None:
    from spectune.cli.manual import main

    (tmp_path / "page.md").write_text("<!-- options: watch -->\n<!-- end options -->\n")
    assert main(["--docs", str(tmp_path), "--check"]) == 1
    assert main(["--docs", str(tmp_path)]) == 0
    assert main(["--docs", str(tmp_path), "--check"]) == 0

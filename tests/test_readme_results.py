"""The README's results block (``spectune bench --preset readme``): the table from a run's
rows, the rewrite between the markers, the preset's options, and the CLI's help defaults."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from spectune.bench.readme import BEGIN, END, readme_block, rewrite_readme, write_readme_results
from spectune.cli import build_parser
from spectune.errors import InvalidParameterError


def _row(system: str, dtype: str, t: float, tps: float, speedup: float | None) -> dict[str, Any]:
    return {
        "system": system,
        "dtype": dtype,
        "temperature": t,
        "category": "all",
        "tokens_per_second": tps,
        "speedup_vs_plain": speedup,
        "greedy_equal": 14 if t == 0 else 0,
        "greedy_compared": 14 if t == 0 else 0,
    }


DATA: dict[str, Any] = {
    "command": "spectune bench --target default",
    "environment": {"machine": "AMD EPYC, 2 cores, torch 2.13.0+cpu (2 threads)"},
    "schedule": {"prompts": 14},
    "config": {"max_tokens": 48},
    "rows": [
        _row("spectune plain", "fp32", 0.0, 20.0, 1.0),
        _row("spectune suffix K=2", "fp32", 0.0, 26.0, 1.3),
        _row("spectune plain", "int4", 0.0, 55.0, 1.0),
        _row("spectune suffix K=2", "int4", 0.0, 60.5, 1.1),
        _row("spectune plain", "int4", 0.7, 50.0, 1.0),
        _row("spectune suffix K=2", "int4", 0.7, 49.0, 0.98),
        _row("llama.cpp plain", "llamacpp", 0.0, 90.0, None),
        {**_row("spectune plain", "int4", 0.0, 1.0, 1.0), "category": "code"},  # not shown
    ],
}


def test_the_table_has_one_row_per_system_and_a_column_per_runtime() -> None:
    block = readme_block(DATA, "docs/results/readme/speedup.png", datetime.date(2026, 12, 6))
    lines = block.splitlines()
    assert lines[0] == BEGIN and lines[-1] == END
    assert "Last run 2026-12-06 on AMD EPYC, 2 cores" in block
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == (
        "| system | int4, T = 0 | int4, T = 0.7 | fp32, T = 0 | llama.cpp, T = 0 | = greedy |"
    )
    assert table[1] == "| plain | 55.0 (1.00x) | 50.0 (1.00x) | 20.0 (1.00x) |  | 28/28 |"
    assert table[2] == "| suffix K=2 | 60.5 (1.10x) | 49.0 (0.98x) | 26.0 (1.30x) |  | 28/28 |"
    assert table[3] == "| llama.cpp plain |  |  |  | 90.0 | 14/14 |"
    assert "![Speedup over plain decoding" in block


def test_the_block_is_rewritten_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{BEGIN}\nold table\n{END}\n\n## After\n", encoding="utf-8")
    plot = write_readme_results(DATA, tmp_path / "results", readme, datetime.date(2026, 12, 6))
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\n" + BEGIN) and text.endswith(END + "\n\n## After\n")
    assert "old table" not in text and "](results/speedup.png)" in text
    assert plot.stat().st_size > 1000  # a PNG was drawn
    readme.write_text("# no block\n", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match="has no results block"):
        rewrite_readme(readme, "x")


def test_the_preset_sets_the_readme_run_and_later_flags_override() -> None:
    args = build_parser().parse_args(["bench", "--preset", "readme", "--threads", "1"])
    assert args.temperatures == "0,0.7" and args.k == "2" and args.threads == 1
    assert args.readme == Path("README.md") and args.out == Path("docs/results/readme")
    assert args.dtype[:2] == ["int4", "fp32"]


def test_every_help_names_its_defaults() -> None:
    import argparse

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = commands.choices["serve"].format_help()
    assert "--port PORT" in text and "(default: 8000)" in text
    assert "--max-batch MAX_BATCH" in text and "(default 16;" in text


def test_the_block_shows_the_verification_cost_curve_and_explains_llamacpp() -> None:
    curves = {
        "int4": {"spectune": {"sizes": [1, 2, 4], "relative": [1.0, 1.3, 1.9]}},
        "fp32": {"spectune": {"sizes": [1, 2, 4], "relative": [1.0, 1.05, 1.1]}},
    }
    block = readme_block({**DATA, "curves": curves}, "p.png", datetime.date(2026, 12, 6))
    lines = block.splitlines()
    header = lines.index("| runtime | n = 1 | n = 2 | n = 4 |")
    assert lines[header + 2 : header + 4] == [
        "| int4 | 1.00x | 1.30x | 1.90x |",
        "| fp32 | 1.00x | 1.05x | 1.10x |",
    ]
    assert "llama-cpp-python's own decoding loop" in block  # a llama.cpp column is there
    no_llama = {**DATA, "rows": [r for r in DATA["rows"] if r["dtype"] != "llamacpp"]}
    assert "llama-cpp-python" not in readme_block(no_llama, "p.png", datetime.date(2026, 12, 6))


def test_the_block_reads_the_figures_per_runtime_off_the_same_run() -> None:
    """The "when speculation pays" figures come from the run, so they never go stale."""
    curves = {"int4": {"spectune": {"sizes": [1, 2, 4], "relative": [1.0, 1.3, 1.9]}}}
    rows = [
        {**r, "acceptance_rate": 0.41} if r["system"] == "spectune suffix K=2" else r
        for r in DATA["rows"]
    ]
    block = readme_block({**DATA, "rows": rows, "curves": curves}, "p.png", datetime.date.today())
    lines = [line for line in block.splitlines() if line.startswith("- ")]
    assert lines == [
        "- int4: a pass over 4 tokens costs 1.90x a pass over one; acceptance 41%; speculation "
        "0.98-1.10x over plain decoding; plain decoding 50.0-55.0 tokens/s; fastest suffix K=2 "
        "at T = 0 (60.5 tokens/s).",
        "- fp32: acceptance 41%; speculation 1.30x over plain decoding; plain decoding 20.0 "
        "tokens/s; fastest suffix K=2 at T = 0 (26.0 tokens/s).",
        "- llama.cpp: fastest llama.cpp plain at T = 0 (90.0 tokens/s).",
    ]

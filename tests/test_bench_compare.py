"""Two benchmark runs side by side (``spectune.bench.compare``, ``bench --baseline``): each
shared cell's speedups, the paired jackknife standard error of their difference, and the
one-line errors for a baseline that is not a benchmark's results."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from spectune.bench.compare import (
    compare_runs,
    comparison_markdown,
    load_baseline,
    summary_line,
    write_comparison,
)
from spectune.errors import InvalidParameterError

PROMPTS = [f"p{i}" for i in range(14)]
SYSTEMS = ("spectune plain", "spectune suffix K=2", "llama.cpp plain")


def _run(speed: dict[str, float], jitter: float, seed: int) -> dict[str, Any]:
    """A run's results.json: 48 tokens per prompt, each prompt's seconds the system's
    per-token time (prompt-specific) times a random factor within ``1 ± jitter``."""
    rng = random.Random(seed)
    measurements = []
    for system in SYSTEMS:
        for i, prompt in enumerate(PROMPTS):
            base = (1.0 + 0.05 * i) * 48 / speed[system]  # prompts differ in cost
            measurements.append(
                {
                    "system": system,
                    "dtype": "int4",
                    "temperature": 0.0,
                    "prompt_id": prompt,
                    "tokens": [1] * 48,
                    "seconds": base * (1 + rng.uniform(-jitter, jitter)),
                }
            )
    totals = {
        s: (
            sum(len(m["tokens"]) for m in measurements if m["system"] == s)
            / sum(m["seconds"] for m in measurements if m["system"] == s)
        )
        for s in SYSTEMS
    }
    rows = [
        {
            "system": s,
            "dtype": "int4",
            "temperature": 0.0,
            "category": "all",
            "tokens_per_second": totals[s],
            "speedup_vs_plain": totals[s] / totals["spectune plain"],
        }
        for s in SYSTEMS
    ]
    return {
        "command": "spectune bench",
        "environment": {"machine": "test machine"},
        "rows": rows,
        "measurements": measurements,
    }


SPEED = {"spectune plain": 50.0, "spectune suffix K=2": 60.0, "llama.cpp plain": 65.0}


def test_a_run_against_itself_moves_nothing() -> None:
    run = _run(SPEED, jitter=0.05, seed=0)
    changes = compare_runs(run, run)
    assert [c.system for c in changes] == list(SYSTEMS)
    plain, suffix, llama = changes
    assert plain.difference is None and plain.old_tps == plain.new_tps  # speedup 1 by definition
    assert suffix.difference == 0.0 and suffix.stderr == 0.0 and not suffix.beyond_noise
    assert llama.difference == 0.0  # llama.cpp's own loop is compared over spectune plain
    assert summary_line(changes).startswith("2 of 2 speedups moved less than 2 standard errors")


def test_timing_noise_stays_within_it_and_a_real_change_does_not() -> None:
    """Fixed seeds: 5% per-prompt jitter on both runs gives a suffix speedup difference of a
    few hundredths with a standard error of the same size; a 20% faster drafter in the new run
    moves its speedup by about 0.24x, many standard errors."""
    old = _run(SPEED, jitter=0.05, seed=1)
    same = compare_runs(old, _run(SPEED, jitter=0.05, seed=2))[1]
    assert same.stderr is not None and 0.005 < same.stderr < 0.05
    assert not same.beyond_noise
    faster = compare_runs(old, _run({**SPEED, "spectune suffix K=2": 72.0}, 0.05, seed=2))[1]
    assert faster.difference is not None and faster.difference == pytest.approx(0.24, abs=0.05)
    assert faster.beyond_noise
    page = comparison_markdown([faster], old, old)
    assert "| suffix K=2 | int4 | 0 |" in page and "| yes |" in page


def test_cells_only_one_run_has_are_left_out_and_missing_timings_give_no_error_bar() -> None:
    old = _run(SPEED, jitter=0.05, seed=1)
    new = _run(SPEED, jitter=0.05, seed=2)
    new["rows"] = new["rows"][:2]  # the new run has no llama.cpp row
    new["measurements"] = []  # and no per-prompt timings
    changes = compare_runs(old, new)
    assert [c.system for c in changes] == ["spectune plain", "spectune suffix K=2"]
    assert changes[1].difference is not None and changes[1].stderr is None
    assert not changes[1].beyond_noise
    assert summary_line(changes).startswith("No speedup of the two runs could be compared")


def test_the_comparison_page_is_written_beside_the_results(tmp_path: Path) -> None:
    old = _run(SPEED, jitter=0.05, seed=1)
    page, summary = write_comparison(old, _run(SPEED, 0.05, seed=2), tmp_path)
    text = page.read_text(encoding="utf-8")
    assert page == tmp_path / "comparison.md" and summary in text
    assert "Previous: test machine" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "cannot read it"),
        (json.dumps({"rows": "x"}), "not a benchmark's results.json"),
        (json.dumps([1, 2]), "not a benchmark's results.json"),
    ],
)
def test_a_bad_baseline_is_a_one_line_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidParameterError, match=message) as info:
        load_baseline(path)
    assert "\n" not in str(info.value)


def test_bench_rejects_a_bad_baseline_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.cli import main

    missing = tmp_path / "nothing.json"
    assert main(["bench", "--baseline", str(missing), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spectune: error: --baseline {missing}: cannot read it")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_the_readme_preset_compares_with_the_committed_run_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spectune.cli import build_parser

    monkeypatch.chdir(tmp_path)
    assert build_parser().parse_args(["bench", "--preset", "readme"]).baseline is None
    committed = Path("docs/results/readme/results.json")
    committed.parent.mkdir(parents=True)
    committed.write_text("{}", encoding="utf-8")
    assert build_parser().parse_args(["bench", "--preset", "readme"]).baseline == committed

"""``spectune experiment evidence --toy``: every stage end to end on the toy models; the
report has a section and a verdict per rule, its numbers are the stage files', and a
second run reuses the cached stages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.experiments.evidence.rules import RULES, VERDICTS


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("evidence")
    tune = root / "tune.json"  # a tune report's shape, as `spectune tune` writes it
    tune.write_text(
        json.dumps(
            {
                "parameters": [
                    {"option": "initial_k", "seed": 4, "tuned": 2, "rule": "", "why": ""},
                    {"option": "raise_above", "seed": 0.8, "tuned": 0.8, "rule": "", "why": ""},
                ],
                "predicted": {"tuned": {"speedup": 1.3}, "seed": {"speedup": 1.1}},
            }
        )
    )
    argv = ["experiment", "evidence", "--toy", "--threads", "1", "--out-dir", str(root / "ev")]
    assert main([*argv, "--tune-report", str(tune)]) == 0
    return root


def _sections(report: str) -> dict[str, str]:
    parts = re.split(r"^## ", report, flags=re.MULTILINE)[1:]
    return {p.splitlines()[0]: p for p in parts}


def _stage(root: Path, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((root / "ev" / f"stage-{name}.json").read_text())["data"]  # type: ignore[no-any-return]


def test_every_rule_has_a_measured_section_with_a_verdict(toy_run: Path) -> None:
    sections = _sections((toy_run / "ev.md").read_text())
    assert list(sections) == [finding.title for finding, _ in RULES]
    for title, text in sections.items():
        verdict = re.search(r"\*\*Verdict: (.+)\.\*\*", text)
        assert verdict is not None and verdict.group(1) in VERDICTS, title
        assert verdict.group(1) != "not run", (title, text)  # toy runs measure every rule
        assert "--stages" in text and "--force" in text  # the command that reruns it
    for png in (toy_run / "ev").glob("*.png"):
        assert png.stat().st_size > 5_000
        assert f"](ev/{png.name})" in (toy_run / "ev.md").read_text()


def test_report_numbers_are_the_stage_files(toy_run: Path) -> None:
    sections = _sections((toy_run / "ev.md").read_text())
    temperature = _stage(toy_run, "temperature")
    greedy = temperature["alpha"][temperature["temperatures"].index(0.0)]
    assert f"alpha {greedy:.1%} at T = 0" in sections["Temperature"]
    code = temperature["per_category"]["code"][0]
    assert f"code {code:.1%}" in sections["Code against chat"]
    fixed = [r for r in _stage(toy_run, "policies")["rows"] if r["temperature"] == 0.0]
    best = max((r for r in fixed if r["fixed_k"]), key=lambda r: r["tokens_per_second"])
    assert f"K = {best['fixed_k']}" in sections["Initial K"]
    drafts = _stage(toy_run, "drafts")["drafts"]
    assert {d["family"] for d in drafts} == {"llama", "gpt2"}
    assert all(
        f"{d['alpha_t0']:.1%}" in sections["Draft size"] for d in drafts if d["family"] == "llama"
    )
    assert "seed 4 -> tuned 2" in sections["Tuned thresholds"]
    memory = _stage(toy_run, "memory")["rows"]
    chain = [r["mean_peak_bytes"] for r in memory if r["kind"] == "chain"]
    assert chain == sorted(chain) and chain[0] < chain[-1]  # grows with K


def test_a_second_run_reuses_cached_stages_and_reads_edited_numbers(toy_run: Path) -> None:
    folder = toy_run / "ev"
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("stage-*.json")}
    # An edited stage file must show up in the report: the report only reads the files.
    path = folder / "stage-temperature.json"
    record = json.loads(path.read_text())
    record["data"]["alpha"][0] = 0.4321
    path.write_text(json.dumps(record))
    edited = path.stat().st_mtime_ns
    stages = "temperature,position,policies,memory,costs,tree"
    assert (
        main(["experiment", "evidence", "--toy", "--out-dir", str(folder), "--stages", stages]) == 0
    )
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("stage-*.json")}
    assert after == {**before, "stage-temperature.json": edited}  # nothing re-measured
    assert "alpha 43.2% at T = 0" in (toy_run / "ev.md").read_text()
    # --force measures the chosen stage again.
    argv = ["experiment", "evidence", "--toy", "--out-dir", str(folder), "--stages", "costs"]
    assert main([*argv, "--force"]) == 0
    assert (folder / "stage-costs.json").stat().st_mtime_ns != before["stage-costs.json"]
    assert "alpha 43.2% at T = 0" in (toy_run / "ev.md").read_text()  # cached ones still read


def _draft(ratio: float, alpha: float, speedup: float, family: str = "llama") -> dict:  # type: ignore[type-arg]
    return {"family": family, "ratio": ratio, "alpha_t0": alpha, "predicted_speedup": speedup}


def test_draft_size_rules_say_when_the_budget_cannot_decide() -> None:
    """Drafts too weak to pay, or all under 50%, cannot say which size is best or whether
    small ones fall under 50%: the verdict says so instead of naming a winner of a tie."""
    from spectune.experiments.evidence.judges import INCONCLUSIVE
    from spectune.experiments.evidence.rules import judge_all

    def verdicts(drafts: list[dict]) -> dict[str, str]:  # type: ignore[type-arg]
        found = judge_all({"drafts": {"drafts": drafts, "budget": "8 min"}})
        return {f.title: f.verdict for f in found}

    weak = verdicts([_draft(1 / 42, 0.07, 1.0), _draft(1 / 9, 0.13, 1.0), _draft(1 / 4, 0.08, 1.0)])
    assert weak["Draft size"] == weak["Very small drafts"] == INCONCLUSIVE
    strong = verdicts(
        [_draft(1 / 42, 0.3, 1.05), _draft(1 / 9, 0.62, 1.4), _draft(1 / 4, 0.7, 1.2)]
    )
    assert strong["Draft size"] == strong["Very small drafts"] == "holds"

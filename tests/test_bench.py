"""``spectune bench`` end to end on tiny models: it runs, writes every output, flags a wrong
system, and its JSON holds every field its Markdown shows. Not timed: numbers are not
checked, only that they are reported."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from bench_fixtures import make_models, make_prompts
from spectune.bench.assemble import Workbench, build_systems, measure_curves, random_draft
from spectune.bench.plan import BenchConfig, BenchPrompt, fit_budget
from spectune.bench.report import COLUMNS, cell, json_text
from spectune.bench.suite import run_suite
from spectune.bench.summary import ALL
from spectune.bench.systems import CallResult, SpectuneSystem
from spectune.cli import main
from spectune.drafters.ngram import NgramDrafter
from spectune.models.llama import LlamaLM
from spectune.models.toy import toy_model
from spectune.sampling import SamplingParams


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """Tiny models on a shared machine: one thread avoids thread-pool stalls."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("bench")
    target, draft = make_models(root)
    prompts = make_prompts(root / "prompts.jsonl")
    out = root / "out"
    status = main(
        [
            "bench",
            "--target", str(target),
            "--draft", str(draft),
            "--draft", "ngram",
            "--draft", "random",
            "--draft", "suffix:none",
            "--prompts", str(prompts),
            "--split", "all",
            "--temperatures", "0,0.7",
            "--repeats", "1",
            "--max-tokens", "8",
            "--k", "1,3",
            "--trees", "2x6",
            "--tree-k", "2",
            "--out", str(out),
            "--threads", "1",
        ]
    )  # fmt: skip
    assert status == 0
    torch.set_num_threads(threads)
    return out


def test_bench_writes_every_output(bench_run: Path) -> None:
    data = json.loads((bench_run / "results.json").read_text())
    assert (bench_run / "results.md").read_text().startswith("# spectune bench")
    for temperature in ("0", "0.7"):
        assert (bench_run / f"speedup_fp32_T{temperature}.png").stat().st_size > 0
        assert (bench_run / f"tokens_per_s_vs_k_fp32_T{temperature}.png").stat().st_size > 0
    systems = {r["system"] for r in data["rows"]}
    assert {
        "spectune plain",
        "HF generate",
        "spectune draft K=1",
        "spectune ngram K=3",
        "spectune random K=3",
        "spectune draft threshold",
        "spectune ngram cost",
        "spectune random threshold",
        "spectune suffix:none K=3",
        "spectune draft tree2x6 K=2",
        "HF assisted draft",
        "HF assisted draft heuristic",
        "HF assisted random",
        "HF prompt lookup 10",
    } <= systems
    # Every raw call is kept: 4 prompts x 2 temperatures x 1 repeat per system.
    assert len(data["measurements"]) == 4 * 2 * len(systems)
    assert set(data["curves"]["fp32"]) == {"spectune", "hf"}
    assert data["curves"]["fp32"]["spectune"]["sizes"] == [1, 2, 4, 8, 16]
    assert data["command"].startswith("spectune bench --target ")
    # One line per raw call (and per row), so a diff shows which call changed.
    lines = (bench_run / "results.json").read_text().splitlines()
    records = [v for v in data.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
    assert len(lines) == 2 + len(data) + sum(1 + len(v) for v in records)
    assert len(records) >= 2  # the rows and the raw measurements at least


def test_greedy_spectune_systems_equal_plain(bench_run: Path) -> None:
    data = json.loads((bench_run / "results.json").read_text())
    greedy = [r for r in data["rows"] if r["temperature"] == 0 and r["category"] == ALL]
    for row in greedy:
        assert row["greedy_compared"] == 4, row["system"]
        if row["family"].startswith("spectune"):
            assert row["greedy_equal"] == 4, row["system"]  # lossless, toy fp32
        else:
            assert row["hf_greedy_compared"] == 4, row["system"]
    assert all(r["greedy_compared"] == 0 for r in data["rows"] if r["temperature"] > 0)
    # The analytic bound is reported for chains, and left empty for token trees.
    chains = [r for r in greedy if r["family"] == "spectune" and "tree" not in r["system"]]
    assert chains and all(r["predicted_speedup"] is not None for r in chains)
    assert all(r["predicted_speedup"] is None for r in greedy if "tree" in r["system"])


def test_acceptance_by_position_agrees_with_the_steps(bench_run: Path) -> None:
    """Position 1's rate is recomputed from the raw steps; deeper positions are never tested
    more often than shallower ones, and the table is in the report."""
    data = json.loads((bench_run / "results.json").read_text())
    rows = [
        r
        for r in data["rows"]
        if r["system"] == "spectune draft K=3" and r["category"] == ALL and r["temperature"] == 0
    ]
    assert len(rows) == 1
    by_position = rows[0]["acceptance_by_position"]
    assert len(by_position) == 3
    raw = [
        m
        for m in data["measurements"]
        if m["system"] == "spectune draft K=3" and m["temperature"] == 0
    ]
    steps = [
        (p, a) for m in raw for p, a in zip(m["step_positions"], m["step_accepted"], strict=True)
    ]
    tested = sum(1 for p, _ in steps if p >= 1)
    assert by_position[0] == pytest.approx(sum(1 for p, a in steps if p >= 1 and a >= 1) / tested)
    assert all(0 <= a <= 1 for a in by_position)
    plain = next(r for r in data["rows"] if r["system"] == "spectune plain")
    assert plain["acceptance_by_position"] == []
    assert "Acceptance by draft position" in (bench_run / "results.md").read_text()


def test_json_carries_every_markdown_cell(bench_run: Path) -> None:
    data = json.loads((bench_run / "results.json").read_text())
    markdown = (bench_run / "results.md").read_text().splitlines()
    for row in data["rows"]:
        for column in COLUMNS:
            assert all(field in row for field in column.fields), column.header
        if row["category"] != ALL:
            continue
        # The row's line in its section's headline table shows exactly these cells.
        expected = "| " + " | ".join(cell(column, row) for column in COLUMNS) + " |"
        assert expected in markdown, expected
    curve = data["curves"]["fp32"]["spectune"]
    assert any(f"{1000 * curve['seconds'][0]:.1f} ms" in line for line in markdown)


class OneTokenOff:
    """A deliberately wrong system: a correct one whose output has one token changed."""

    def __init__(self, inner: SpectuneSystem, vocab: int) -> None:
        self.inner = inner
        self.vocab = vocab
        self.info = replace(inner.info, name="wrong ngram K=2")

    def run(self, prompt: Sequence[int], params: SamplingParams, seed: int) -> CallResult:
        result = self.inner.run(prompt, params, seed)
        tokens = list(result.tokens)
        tokens[len(tokens) // 2] = (tokens[len(tokens) // 2] + 1) % self.vocab
        return replace(result, tokens=tuple(tokens))


def test_equality_check_flags_a_wrong_system(tmp_path: Path) -> None:
    target = toy_model(0, scale=3.0)
    config = BenchConfig(
        drafters=("ngram",), ks=(2,), policies=(), systems=("plain", "spectune"), repeats=2
    )
    notes: list[str] = []
    systems = build_systems(config, target, None, [_ngram()], notes)
    good = systems[1]
    assert isinstance(good, SpectuneSystem)
    systems.append(OneTokenOff(good, target.info.vocab_size))
    bench = Workbench("fp32", target, None, systems, measure_curves(target, None, repeats=1))
    prompts = [BenchPrompt(f"p{i}", "c", tuple(range(5 + i, 15 + i))) for i in range(3)]
    with open(tmp_path / "log.txt", "w") as log:
        data = run_suite(
            replace(config, max_tokens=6),
            [bench],
            prompts,
            out=tmp_path,
            console=Console(file=log),
            command="test",
            plots=False,
        )
    rows = {r["system"]: r for r in data["rows"] if r["category"] == ALL}
    assert rows["spectune ngram K=2"]["greedy_equal"] == 6  # 3 prompts x 2 repeats
    assert rows["wrong ngram K=2"]["greedy_equal"] == 0
    wrong = [m for m in data["mismatches"] if m["system"] == "wrong ngram K=2"]
    assert len(wrong) == 6 and {m["first_difference"] for m in wrong} == {3}
    assert all(m["system"] == "wrong ngram K=2" for m in data["mismatches"])
    assert (
        "wrong ngram K=2 (fp32), prompt p0, repeat 0: differs"
        in (tmp_path / "results.md").read_text()
    )


def test_each_cost_policy_system_calibrates_its_own_curve() -> None:
    """The requests of one bench system share the cost policy's curve calibration (as one
    server's would); two systems never do, so neither's figures depend on the other."""
    from spectune.bench.assemble import DraftSource
    from spectune.control.cost import CostK
    from spectune.control.fallback import Guarded

    target = toy_model(0, scale=3.0)
    config = BenchConfig(drafters=("ngram",), ks=(), policies=("cost",), systems=("spectune",))
    drafts = [_ngram(), DraftSource("ngram-2", NgramDrafter())]
    systems = build_systems(config, target, None, drafts, [])
    learners = []
    for system in systems[1:]:
        assert isinstance(system, SpectuneSystem)
        first, second = (system.policy_factory(SamplingParams()) for _ in range(2))
        assert isinstance(first, Guarded) and isinstance(first.inner, CostK)
        assert isinstance(second, Guarded) and isinstance(second.inner, CostK)
        assert first.inner is not second.inner  # a fresh policy per request ...
        assert first.inner.learned is second.inner.learned  # ... one calibration
        learners.append(first.inner.learned)
    assert len(learners) == 2 and learners[0] is not learners[1]


def _ngram() -> Any:
    from spectune.bench.assemble import DraftSource

    return DraftSource("ngram", NgramDrafter())


def test_budget_trims_repeats_then_prompts() -> None:
    prompts = [BenchPrompt(f"{c}{i}", c, (1, 2)) for c in "ab" for i in range(4)]

    def estimate(ps: Sequence[BenchPrompt], repeats: int) -> float:
        return 10.0 * len(ps) * repeats

    assert fit_budget(prompts, 3, estimate, None).repeats == 3
    fitted = fit_budget(prompts, 3, estimate, 45.0)  # 8 prompts x 1 repeat = 80 s: too long
    assert fitted.repeats == 1
    assert [p.id for p in fitted.prompts] == ["a0", "a1", "b0", "b1"]
    assert fitted.estimate_seconds == 40.0 and fitted.notes
    tight = fit_budget(prompts, 3, estimate, 1.0)
    assert len(tight.prompts) == 2 and "still estimated" in tight.notes[-1]


def test_random_draft_is_compatible_and_confident() -> None:
    target = toy_model(0, scale=3.0)
    draft = random_draft(target.info)
    assert isinstance(draft, LlamaLM)
    assert draft.info.vocab_size == target.info.vocab_size
    assert draft.info.eos_token_ids == target.info.eos_token_ids
    cache = draft.new_cache(capacity=16)
    probs = draft.forward(torch.tensor([[5, 6, 7, 8]]), cache).logits.softmax(-1)
    # Confident (beats transformers' 0.4 assistant threshold) on most positions.
    assert (probs.max(-1).values > 0.4).float().mean() >= 0.5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--systems", "plain,bogus"], "unknown systems"),
        (["--k", "0"], "K (draft tokens per step)"),
        (["--temperatures", "0,hot"], "--temperatures"),
        (["--trees", "2by16"], "tree shape"),
        (["--repeats", "0"], "at least 1"),
        (["--draft", "no-such-draft"], "model not found"),
    ],
)
def test_bad_input_is_one_line_error(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--no-plots", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _plot_row(system: str, category: str, k: int | None, tps: float) -> dict[str, Any]:
    family = "spectune-plain" if k is None and system == "spectune plain" else "spectune"
    return {
        "system": system,
        "category": category,
        "family": family,
        "drafter": None if family == "spectune-plain" else "ngram",
        "policy": "fixed" if k is not None else ("cost" if family == "spectune" else None),
        "k": k,
        "tokens_per_second": tps,
        "speedup_vs_plain": tps / 50.0,
        "dtype": "fp32",
        "temperature": 0.0,
    }


@pytest.mark.parametrize(("ks", "k_plot"), [((4,), False), ((2, 4), True)])
def test_plots_draw_a_k_curve_only_over_two_k_values(
    tmp_path: Path, ks: tuple[int, ...], k_plot: bool
) -> None:
    from spectune.bench.plots import write_plots

    rows = [
        _plot_row(name, category, k, tps)
        for category in ("all", "translation")
        for name, k, tps in [
            ("spectune plain", None, 50.0),
            ("spectune ngram cost", None, 55.0),
            *((f"spectune ngram K={k}", k, 50.0 + k) for k in ks),
        ]
    ]
    written = {p.name for p in write_plots(tmp_path, rows)}
    expected = {"speedup_fp32_T0.png"} | ({"tokens_per_s_vs_k_fp32_T0.png"} if k_plot else set())
    assert written == expected
    assert {p.name for p in tmp_path.iterdir()} == expected


def test_results_json_round_trips_with_a_record_per_line() -> None:
    data = {
        "command": "spectune bench",
        "config": {"k": [1, 2], "note": "a\nb"},
        "rows": [{"system": "plain", "tps": 1.5}, {"system": "ngram", "tps": None}],
        "empty": [],
        "mixed": [1, {"a": 2}],
    }
    text = json_text(data)
    assert json.loads(text) == data
    assert '  {"system":"ngram","tps":null}' in text.splitlines()

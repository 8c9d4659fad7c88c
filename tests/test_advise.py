"""``spectune advise``: the prediction arithmetic against hand-computed cases, the verdict on
scripted drafters with known acceptance and on an untrained toy draft, the report's schema,
and bad input as one-line errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from spectune.advise.advisor import AdviseSettings, advise, split_prompts
from spectune.advise.measure import Survival, VerifiedRun, survival_of, verify_interleaved
from spectune.advise.predict import predict_config, speedup_from_survival
from spectune.advise.schema import SCHEMA_VERSION, Advice
from spectune.advise.verdict import DO_NOT_SPECULATE, NO_VERDICT, checklist, decide
from spectune.cli import main
from spectune.control.costs import CostCurve, break_even_acceptance, predicted_speedup
from spectune.drafters.pairing import Loaded
from spectune.drafters.scripted import ScriptedDrafter
from spectune.errors import IncompatibleModelsError, PromptError
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.toy import toy_config, toy_model
from spectune.records import SpecCounts

FLAT = CostCurve((1, 2, 3), (1.0, 1.0, 1.0))  # v(K) = 1: verification as cheap as one step


class _NoTokenizer:
    kind = "BPE"


def _prompts(count: int, seed: int = 0) -> list[tuple[str, str, list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    categories = ("chat", "math")
    return [
        (f"p{i}", categories[i % 2], torch.randint(3, 64, (6,), generator=generator).tolist())
        for i in range(count)
    ]


# --- prediction arithmetic -------------------------------------------------------------


def test_break_even_acceptance_hand_computed() -> None:
    # K=1, c=0.5, v=1: (1 + a) / 1.5 = 1  ->  a = 0.5
    assert break_even_acceptance(0.5, FLAT, 1) == pytest.approx(0.5, abs=1e-5)
    # K=2, c=0.5, v=1: (1 + a + a^2) / 2 = 1  ->  a = (sqrt(5) - 1) / 2
    assert break_even_acceptance(0.5, FLAT, 2) == pytest.approx((5**0.5 - 1) / 2, abs=1e-5)
    # A free draft breaks even at any acceptance; one as dear as the target never does.
    assert break_even_acceptance(0.0, FLAT, 1) == 0.0
    assert break_even_acceptance(1.0, FLAT, 1) is None


def test_predicted_speedup_with_partial_coverage() -> None:
    # alpha 0.8, K=2, c=0.1, v=1: (1 + 0.8 + 0.64) / 1.2
    assert predicted_speedup(0.8, 0.1, FLAT, 2) == pytest.approx(2.44 / 1.2)
    # Half the steps propose: tokens 0.5 * 2.44 + 0.5, time 0.5 * 1.2 + 0.5.
    assert predicted_speedup(0.8, 0.1, FLAT, 2, coverage=0.5) == pytest.approx(1.72 / 1.1)
    p = predict_config("d", 0.8, 1.0, 0.1, FLAT, 2, max_k=2)
    assert p.predicted_speedup == pytest.approx(2.44 / 1.2)
    assert p.label == "d K=2" and p.verify_cost == 1.0
    assert set(p.break_even) == {1, 2}


def test_survival_curve_prediction() -> None:
    # i.i.d. survival alpha^(j+1) gives the seed's formula.
    iid = [0.8 ** (j + 1) for j in range(3)]
    assert speedup_from_survival(iid, 1.0, 0.1, FLAT, 3) == pytest.approx(
        predicted_speedup(0.8, 0.1, FLAT, 3)
    )
    # Measured: the first position kept 60%, both 30%: (1 + 0.6 + 0.3) / (2 * 0.1 + 1).
    assert speedup_from_survival([0.6, 0.3], 1.0, 0.1, FLAT, 2) == pytest.approx(1.9 / 1.2)
    # Past the curve: the last conditional rate (0.5) again: 1 + 0.6 + 0.3 + 0.15.
    assert speedup_from_survival([0.6, 0.3], 1.0, 0.0, FLAT, 3) == pytest.approx(2.05)
    # A probe at K=2 whose steps cost 1.5 plain steps, 0.3 over the model's 1.2: that
    # overhead is added at every K.
    probe = Survival(2, (0.6, 0.3), 1.0, 1.5)
    p = predict_config("d", 0.8, 1.0, 0.1, FLAT, 2, survival=probe)
    assert p.predicted_speedup == pytest.approx(1.9 / 1.5)
    assert p.iid_speedup == pytest.approx(2.44 / 1.2)
    p1 = predict_config("d", 0.8, 1.0, 0.1, FLAT, 1, survival=probe)
    assert p1.predicted_speedup == pytest.approx(1.6 / (0.1 + 1.0 + 0.3))


# --- verdict ---------------------------------------------------------------------------


def _run(label: str, speedup: float, ratios: Sequence[float], **counts: int) -> VerifiedRun:
    plain = SpecCounts(steps=100, emitted=100, step_time=1.0)
    mine = SpecCounts(
        steps=50, emitted=round(100 * speedup), step_time=1.0, positions=100, **counts
    )
    return VerifiedRun(label, mine, plain, tuple(ratios))


def test_verdict_speculates_beyond_the_noise_only() -> None:
    good = predict_config("d", 0.8, 1.0, 0.1, FLAT, 2)
    clear = _run("d K=2", 1.3, (1.28, 1.31, 1.3, 1.32), accepted=80)
    verdict = decide([good], [clear])
    assert verdict.speculate and verdict.winner == "d K=2"
    noisy = _run("d K=2", 1.3, (0.6, 2.0, 0.9, 1.7), accepted=80)
    assert noisy.noise > 0.3
    # Beside a steady 1.3x, a noisier 1.4x loses: its lower bound is lower.
    wild = _run("e K=2", 1.4, (1.1, 1.7, 1.2, 1.6), accepted=80)
    other = predict_config("e", 0.8, 1.0, 0.1, FLAT, 2)
    assert decide([good, other], [clear, wild]).winner == "d K=2"
    verdict = decide([good], [noisy])
    assert not verdict.speculate and verdict.summary == DO_NOT_SPECULATE
    assert verdict.needed_acceptance == good.break_even[2]
    assert any("break even" in reason for reason in verdict.reasons)


def test_checklist_marks_each_rule_with_its_value() -> None:
    p = predict_config("d", 0.7, 1.0, 0.1, FLAT, 2)
    run = _run("d K=2", 1.3, (1.3, 1.3), accepted=90, fallback_steps=10)
    rows, notes = checklist(p, run)
    by_rule = {r.rule: r for r in rows}
    assert by_rule["acceptance baseline (test set)"].met is True  # 70% > 65%
    assert by_rule["acceptance live"].met is False  # 90% is above 85%
    assert by_rule["fallback steps"].met is False  # 10 of 50 steps
    assert by_rule["end-to-end speedup"].met is False  # 1.3x is under 1.5x
    assert by_rule["end-to-end speedup"].shown() == "1.30x"
    assert any("60-85%" in n for n in notes)


def _greedy(model: LlamaLM, context: Sequence[int], count: int) -> list[int]:
    tokens = list(context)
    for _ in range(count):
        cache = model.new_cache(capacity=len(tokens) + 1)
        out = model.forward(torch.tensor([tokens]), cache, last_only=True)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens[len(context) :]


@torch.inference_mode()
def test_scripted_drafters_with_known_acceptance(toy_target: LlamaLM) -> None:
    vocab = toy_target.info.vocab_size
    oracle = ScriptedDrafter(lambda ctx, k: _greedy(toy_target, ctx, k), vocab_size=vocab)

    def wrong(ctx: Sequence[int], k: int) -> list[int]:
        return [(t + 1) % vocab for t in _greedy(toy_target, ctx, k)]

    prompts = [p[2] for p in _prompts(3)]
    runs = verify_interleaved(
        toy_target,
        [("oracle K=3", oracle, 3), ("wrong K=3", ScriptedDrafter(wrong, vocab_size=vocab), 3)],
        prompts,
        12,
    )
    assert runs[0].counts.acceptance_rate == 1.0
    assert runs[1].counts.acceptance_rate == 0.0
    oracle_survival, wrong_survival = (survival_of(run, 3) for run in runs)
    assert oracle_survival.kept[:2] == (1.0, 1.0) and oracle_survival.coverage == 1.0
    assert wrong_survival.kept == (0.0, 0.0, 0.0) and wrong_survival.step_cost > 0
    assert len(runs[1].ratios) == 3
    # The wrong drafter keeps nothing and runs the target k times per draft: the model says
    # it cannot pay, and the measurement agrees.
    hopeless = predict_config("wrong", 0.0, 1.0, 0.1, FLAT, 3)
    assert hopeless.predicted_speedup < 1.0
    verdict = decide([hopeless], [runs[1]])
    assert not verdict.speculate and verdict.summary == DO_NOT_SPECULATE


def test_a_tuned_threshold_policy_follows_the_drafters_acceptance(toy_target: LlamaLM) -> None:
    from spectune.advise.advisor import _tuned

    vocab = toy_target.info.vocab_size
    oracle = ScriptedDrafter(lambda ctx, k: _greedy(toy_target, ctx, k), vocab_size=vocab)
    wrong = ScriptedDrafter(
        lambda ctx, k: [(t + 1) % vocab for t in _greedy(toy_target, ctx, k)], vocab_size=vocab
    )
    target = Loaded(toy_target, _NoTokenizer(), Path("."))  # type: ignore[arg-type]
    settings = AdviseSettings(temperatures=(0.0,), max_tokens=16, max_k=6)
    base = predict_config("oracle", 1.0, 1.0, 0.05, FLAT, 2)
    recorded: list[None] = []
    good = _tuned(target, base, oracle, _prompts(4), FLAT, settings, lambda: recorded.append(None))
    assert len(recorded) == 4  # one recording per fitting prompt, at K = max_k
    assert good.policy is not None and good.policy.name == "threshold"
    assert good.label == "oracle tuned" and good.k >= 2
    # Verification as cheap as one step and every draft kept: the replay says it pays.
    assert good.predicted_speedup > 1.5
    bad = _tuned(target, base, wrong, _prompts(4), FLAT, settings, lambda: None)
    assert bad.predicted_speedup < good.predicted_speedup and bad.predicted_speedup <= 1.05
    run = verify_interleaved(
        toy_target,
        [(good.label, oracle, good.k)],
        [p[2] for p in _prompts(2, seed=1)],
        12,
        policies={good.label: good.policy},
    )[0]
    assert run.counts.acceptance_rate == 1.0 and run.counts.steps > 0


# --- end to end on a toy pair ------------------------------------------------------------


def test_untrained_draft_gets_do_not_speculate(toy_target: LlamaLM, tmp_path: Path) -> None:
    save_native(toy_model(7, scale=3.0), tmp_path / "untrained")
    target = Loaded(toy_target, _NoTokenizer(), tmp_path)  # type: ignore[arg-type]
    settings = AdviseSettings(
        temperatures=(0.0,), max_tokens=16, verify_prompts=4, top=2, trust_draft_vocab=True
    )
    advice = advise(target, "toy", [str(tmp_path / "untrained")], _prompts(8), settings)
    assert advice.verdict.summary == DO_NOT_SPECULATE
    assert advice.verdict.needed_acceptance is None or advice.verdict.needed_acceptance > 0
    best = advice.configurations[0]
    assert best.prediction.alpha < 0.2 and best.run is not None
    # The schema.
    advice.write(tmp_path / "advice.json")
    data = json.loads((tmp_path / "advice.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert set(data) == {
        "schema_version", "target", "target_parameters", "machine", "settings", "candidates",
        "configurations", "verdict", "checklist", "notes", "outputs", "seconds",
        "screening_verdict", "engine_check",
    }  # fmt: skip
    assert data["engine_check"] is None and data["screening_verdict"] is None  # no vLLM run
    config = data["configurations"][0]
    for key in ("predicted_speedup", "measured_speedup", "noise", "prediction_error", "k"):
        assert key in config
    assert config["live"]["acceptance_rate"] is not None
    assert {row["rule"] for row in data["checklist"]} >= {"draft latency share", "fallback steps"}
    assert data["verdict"]["speculate"] is False
    assert data["candidates"][0]["size_verdict"]
    tuned = [c for c in data["configurations"] if c["policy"] == "threshold"]
    assert len(tuned) == 1 and tuned[0]["measured_speedup"] is not None  # fitted and verified
    assert tuned[0]["label"].endswith(" tuned") and tuned[0]["policy_options"]["max_k"] >= 1
    assert data["settings"]["tune_policy"] is True
    assert isinstance(advice, Advice)


def test_no_verdict_from_a_run_on_a_busy_machine(
    toy_target: LlamaLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other processes' load over the run withholds the verdict (SPECTUNE_BUSY_CORES=0
    counts any load as busy); advice.json says how busy the machine was."""
    monkeypatch.setenv("SPECTUNE_BUSY_CORES", "0")
    save_native(toy_model(7, scale=3.0), tmp_path / "untrained")
    target = Loaded(toy_target, _NoTokenizer(), tmp_path)  # type: ignore[arg-type]
    settings = AdviseSettings(
        temperatures=(0.0,), max_tokens=8, verify_prompts=2, top=1, tune_policy=False,
        trust_draft_vocab=True,
    )  # fmt: skip
    advice = advise(target, "toy", [str(tmp_path / "untrained")], _prompts(4), settings)
    assert advice.verdict.summary == NO_VERDICT and not advice.verdict.speculate
    assert "busy machine" in advice.verdict.reasons[0]
    assert DO_NOT_SPECULATE in advice.verdict.reasons[1]  # what the figures alone would say
    load = advice.to_dict()["machine"]["load"]
    assert load["busy"] is True and load["cores"] >= 1


def test_split_keeps_every_category_on_both_sides() -> None:
    fit, held = split_prompts(_prompts(8))
    assert {p[1] for p in fit} == {p[1] for p in held} == {"chat", "math"}
    assert not {p[0] for p in fit} & {p[0] for p in held}


# --- bad input -----------------------------------------------------------------------------


def test_incompatible_draft_and_no_prompts(toy_target: LlamaLM, tmp_path: Path) -> None:
    save_native(toy_model(0, config=toy_config(vocab_size=256)), tmp_path / "wide")
    target = Loaded(toy_target, _NoTokenizer(), tmp_path)  # type: ignore[arg-type]
    settings = AdviseSettings(temperatures=(0.0,), max_tokens=8, trust_draft_vocab=True)
    with pytest.raises(IncompatibleModelsError, match="no candidate draft can pair") as info:
        advise(target, "toy", [str(tmp_path / "wide")], _prompts(4), settings)
    assert "\n" not in str(info.value)
    with pytest.raises(PromptError, match="no prompts"):
        advise(target, "toy", [str(tmp_path / "wide")], [], settings)


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args, message in (
        (["--engine", "tgi"], "unknown engine 'tgi'"),
        (["--prompts", str(empty)], ""),
        (["--draft", str(tmp_path / "missing")], ""),
        (["--temperatures", "hot"], "--temperatures"),
    ):
        assert main(["advise", *args, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("spectune: error: ") and err.count("\n") == 1
        assert message in err


def test_help_names_every_default_and_quick_scales_only_untouched_flags() -> None:
    import argparse

    from spectune.cli import build_parser
    from spectune.cli.advise import _per_category, _settings

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(commands.choices["advise"].format_help().split())
    assert "(default: 48; with --quick: 24)" in text
    assert "(default: spectune)" in text and "(default: advise-report)" in text
    args = parser.parse_args(["advise", "--quick", "--top", "3"])
    settings = _settings(args)
    assert (settings.max_tokens, settings.temperatures, settings.top, _per_category(args)) == (
        24,
        (0.0,),
        3,
        2,
    )
    args = parser.parse_args(["advise"])
    settings = _settings(args)
    assert (settings.max_tokens, settings.temperatures, settings.top) == (48, (0.0, 0.7), 3)
    assert _per_category(args) == 4
    # Recorded traffic: its temperatures, most frequent first (--quick: that one), and more
    # prompts per trace file; an explicit flag still wins.
    args = parser.parse_args(["advise", "--traces", "t"])
    assert _settings(args, (0.7, 0.0)).temperatures == (0.7, 0.0) and _per_category(args) == 28
    args = parser.parse_args(["advise", "--traces", "t", "--quick"])
    assert _settings(args, (0.7, 0.0)).temperatures == (0.7,) and _per_category(args) == 14
    args = parser.parse_args(["advise", "--traces", "t", "--temperatures", "0"])
    assert _settings(args, (0.7,)).temperatures == (0.0,)

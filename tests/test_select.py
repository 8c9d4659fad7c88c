"""``spectune select`` on toy models: ranking, incompatibility reasons, reports, and the
teacher-forced alpha estimate against the acceptance rate of real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectune.cli.select import check_candidate_paths
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.hybrid import HybridDrafter
from spectune.drafters.model import ModelDrafter
from spectune.drafters.pairing import Loaded
from spectune.drafters.suffix import SuffixDrafter, SuffixSettings
from spectune.errors import ModelLoadError
from spectune.models.llama import LlamaLM
from spectune.models.loading import save_native
from spectune.models.toy import perturbed, toy_config, toy_model
from spectune.sampling import SamplingParams
from spectune.select.alpha import estimate_alpha, make_continuations
from spectune.select.report import to_json, write_report
from spectune.select.selector import SelectSettings, select


class _NoTokenizer:
    """Toy models have no tokenizer; the draft folders carry none (the tests trust their
    vocabulary), so it is never read."""

    kind = "BPE"


def _prompts(count: int, seed: int = 0) -> list[tuple[str, str, list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    categories = ("chat", "math")
    return [
        (f"p{i}", categories[i % 2], torch.randint(3, 64, (6,), generator=generator).tolist())
        for i in range(count)
    ]


def test_select_ranks_good_above_bad_and_flags_incompatible(
    toy_target: LlamaLM, tmp_path: Path
) -> None:
    save_native(perturbed(toy_target, 0.05), tmp_path / "good")
    save_native(toy_model(7, scale=3.0), tmp_path / "bad")
    save_native(toy_model(0, config=toy_config(vocab_size=256)), tmp_path / "wide")
    target = Loaded(toy_target, _NoTokenizer(), tmp_path)  # type: ignore[arg-type]
    specs = [str(tmp_path / n) for n in ("bad", "wide", "good")]
    specs += ["ngram", "suffix:none", "/no/such/model"]
    settings = SelectSettings(
        continuation_tokens=24,
        confirm_prompts=2,
        confirm_tokens=24,
        max_k=4,
        trust_draft_vocab=True,  # the toy draft folders carry no tokenizer
    )
    report = select(target, "toy", specs, _prompts(4), settings)
    ranked = [c.spec for c in report.candidates]
    assert ranked.index(str(tmp_path / "good")) < ranked.index(str(tmp_path / "bad"))
    by_spec = {c.spec: c for c in report.candidates}
    good, bad, wide = (by_spec[str(tmp_path / n)] for n in ("good", "bad", "wide"))
    assert good.alpha_at(0.0) > bad.alpha_at(0.0) + 0.3  # type: ignore[operator]
    assert not wide.compatible and "vocabulary sizes differ" in wide.problems[0]
    assert not by_spec["/no/such/model"].compatible
    assert "model not found" in by_spec["/no/such/model"].problems[0]
    assert set(good.alpha[0].per_category) == {"chat", "math"}
    suffix = by_spec["suffix:none"]
    assert suffix.compatible and suffix.kind == "suffix" and suffix.alpha_at(0.0) is not None
    assert good.runs and good.draft_cost is not None and good.draft_cost > 0
    data = to_json(report)
    # Timing decides between the good draft, the lookups (free to run) and no speculation;
    # never the bad or the incompatible draft.
    free = ("ngram", "suffix:none", "none")
    assert data["recommendation"]["draft"] in (str(tmp_path / "good"), *free)
    assert {"draft", "k", "predicted_speedup", "measured_speedup"} <= set(data["recommendation"])
    assert len(data["candidates"]) == len(specs)
    paths = write_report(report, tmp_path / "report")
    assert json.loads(paths["json"].read_text())["candidates"]
    assert "Incompatible" in paths["markdown"].read_text()
    assert (tmp_path / "report" / "speedup_vs_k.png").is_file()


def test_alpha_estimate_matches_the_acceptance_of_real_runs(toy_target: LlamaLM) -> None:
    """At T = 1 and K = 1 every step is one Bernoulli trial with success probability
    sum(min(p, q)) at its context, contexts being target samples; the estimate averages the
    same quantity over independently sampled continuations. Both are means of values in
    [0, 1], so each is within 4 sigma = 4 * sqrt(0.25 / n) of the common expectation
    except with probability < 1e-4; the test allows the sum of the two bands."""
    draft = perturbed(toy_target, 0.3)
    prompts = _prompts(24, seed=1)
    continuations = make_continuations(toy_target, prompts, 40, temperature=1.0, seed=10)
    (estimate,) = estimate_alpha(ModelDrafter(draft), continuations, toy_target, (1.0,))
    engine = SpeculativeEngine(toy_target, ModelDrafter(draft))
    drafted = accepted = 0
    for i, (_, _, tokens) in enumerate(prompts):
        run = engine.run(
            tokens, SamplingParams(temperature=1.0, max_tokens=40, seed=500 + i), policy=FixedK(1)
        )
        drafted += run.drafted
        accepted += run.accepted
    tolerance = 4 * (0.25 / drafted) ** 0.5 + 4 * (0.25 / estimate.positions) ** 0.5
    assert abs(accepted / drafted - estimate.overall) < tolerance, (
        accepted / drafted,
        estimate.overall,
        tolerance,
    )
    assert 0.2 < estimate.overall < 0.95  # a draft that is neither useless nor perfect


def test_identical_draft_has_alpha_one(toy_target: LlamaLM) -> None:
    continuations = make_continuations(toy_target, _prompts(3), 16)
    estimates = estimate_alpha(ModelDrafter(toy_target), continuations, toy_target)
    # The target's logits are kept in fp16, so the sampled-temperature overlap is 1 only to
    # about 1e-3.
    assert estimates[0].overall == 1.0
    assert all(e.overall > 0.998 for e in estimates)


def test_select_cli_takes_suffix_and_hybrid_and_rejects_a_missing_file(tmp_path: Path) -> None:
    check_candidate_paths(["ngram", "suffix", "suffix:none", "hybrid", "suffix+smollm2-draft"])
    with pytest.raises(ModelLoadError, match="model not found"):
        check_candidate_paths(["suffix", str(tmp_path / "nope.gguf")])


def test_alpha_of_a_hybrid_with_a_feature_head(toy_target: LlamaLM, toy_feature_drafter) -> None:  # type: ignore[no-untyped-def]
    """A hybrid whose suffix source never proposes drafts from its feature head: its
    first-token acceptance is the head's own (the recorded target states reach the head
    inside; select used to fail with 'needs the target's hidden states')."""
    silent = SuffixDrafter(settings=SuffixSettings(factor=0.0, offset=0.0))
    hybrid = HybridDrafter(silent, toy_feature_drafter)
    continuations = make_continuations(toy_target, _prompts(4, seed=2), 16, temperature=0.0)
    (alone,) = estimate_alpha(toy_feature_drafter, continuations, toy_target, (0.0,))
    (inside,) = estimate_alpha(hybrid, continuations, toy_target, (0.0,))
    assert inside.positions == alone.positions > 0
    assert inside.overall == pytest.approx(alone.overall, abs=1e-5)

"""Distillation on a tiny toy target: the KL falls, the measured acceptance rises, and the
exported folders load as drafters that keep the target's greedy output."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from spectune.decode.engine import SpeculativeEngine
from spectune.distill.data import DistillCorpus, GenerationSettings, corpus_from_token_ids
from spectune.distill.models import DraftArchitecture
from spectune.distill.pipeline import distill
from spectune.distill.train import Budget, TrainSettings
from spectune.drafters.loading import (
    feature_drafter_from_folder,
    lm_drafter_from_folder,
    read_draft_meta,
)
from spectune.errors import InvalidParameterError
from spectune.models.llama import LlamaLM
from spectune.models.loading import load_model
from spectune.sampling import SamplingParams

SETTINGS = TrainSettings(learning_rate=3e-3, warmup_steps=10, batch_tokens=512, eval_every=60)


@pytest.fixture(scope="module")
def corpus(toy_target: LlamaLM) -> DistillCorpus:
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (6,), generator=generator).tolist() for _ in range(72)]
    return corpus_from_token_ids(
        toy_target, prompts, GenerationSettings(max_new_tokens=24, batch_size=24, top_k=16)
    )


def _acceptance(target: LlamaLM, drafter: object) -> float:
    engine = SpeculativeEngine(target, drafter)  # type: ignore[arg-type]
    drafted = accepted = 0
    for seed in range(4):
        prompt = torch.randint(3, 64, (6,), generator=torch.Generator().manual_seed(100 + seed))
        run = engine.run(prompt.tolist(), SamplingParams(max_tokens=32))
        plain = SpeculativeEngine(target, None).run(prompt.tolist(), SamplingParams(max_tokens=32))
        assert run.tokens == plain.tokens  # lossless, whatever the draft
        drafted += run.drafted
        accepted += run.accepted
    return accepted / drafted


def _distill(  # type: ignore[no-untyped-def]
    target: LlamaLM,
    corpus: DistillCorpus,
    arch: DraftArchitecture,
    out: Path,
    steps: int,
    *,
    vocab_size: int | None,
    settings: TrainSettings = SETTINGS,
):
    return distill(
        target,
        (corpus, DistillCorpus([])),
        arch,
        out,
        vocab_size=vocab_size,
        settings=settings,
        budget=Budget(max_steps=steps),
        heldout_sequences=8,
        training_record={"command": "test"},
    )


def _drafter(kind: str, folder: Path, target: LlamaLM) -> object:
    if kind == "feature":
        return feature_drafter_from_folder(folder, target)
    return lm_drafter_from_folder(folder, load_model(folder))


@pytest.mark.parametrize(
    ("kind", "precision"), [("feature", "fp32"), ("lm", "fp32"), ("feature", "bf16")]
)
def test_distillation_lowers_kl_and_raises_acceptance(
    kind: str, precision: str, toy_target: LlamaLM, corpus: DistillCorpus, tmp_path: Path
) -> None:
    arch = DraftArchitecture(
        kind=kind, num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    settings = dataclasses.replace(SETTINGS, precision=precision)

    def run(steps: int, out: Path):  # type: ignore[no-untyped-def]
        return _distill(toy_target, corpus, arch, out, steps, vocab_size=48, settings=settings)

    untrained = run(0, tmp_path / "untrained")
    trained = run(180, tmp_path / "trained")
    first, last = trained.state.curve[0], trained.state.curve[-1]
    assert last.heldout_kl < 0.7 * first.heldout_kl
    assert last.heldout_top1 > first.heldout_top1 + 0.15
    before = _acceptance(toy_target, _drafter(kind, untrained.folder, toy_target))
    after = _acceptance(toy_target, _drafter(kind, trained.folder, toy_target))
    assert after > before + 0.1, (before, after)
    assert (trained.folder / "spectune_draft.json").is_file()
    assert (tmp_path / "trained" / "learning_curve.png").is_file()


def test_training_resumes_from_its_checkpoint(
    toy_target: LlamaLM, corpus: DistillCorpus, tmp_path: Path
) -> None:
    arch = DraftArchitecture(kind="feature", intermediate_size=64)
    common = dict(vocab_size=None, settings=SETTINGS, heldout_sequences=8, training_record={})
    distill(
        toy_target,
        (corpus, DistillCorpus([])),
        arch,
        tmp_path,
        budget=Budget(max_steps=60),
        **common,
    )  # type: ignore[arg-type]
    resumed = distill(
        toy_target,
        (corpus, DistillCorpus([])),
        arch,
        tmp_path,
        budget=Budget(max_steps=90),
        resume=True,
        **common,
    )  # type: ignore[arg-type]
    assert resumed.state.step == 90
    assert [p.step for p in resumed.state.curve] == [0, 60, 90]


def test_budget_needs_a_limit() -> None:
    with pytest.raises(InvalidParameterError):
        Budget()
    with pytest.raises(InvalidParameterError, match="precision"):
        TrainSettings(precision="fp16")
    assert Budget(max_steps=0).fraction(0, 0, 0.0) >= 1.0


def test_corpus_marks_only_target_tokens_for_training(corpus: DistillCorpus) -> None:
    sequence = corpus.sequences[0]
    mask = sequence["loss_mask"].bool()
    assert not mask[:5].any()  # prompt positions (6 prompt tokens; position 5 predicts the first)
    assert mask[5]
    assert sequence["hidden"].shape == (sequence["tokens"].shape[0], 32)
    probs = sequence["topk_probs"][mask].float()
    assert bool((probs[:, :-1] >= probs[:, 1:]).all())  # most likely first


@pytest.mark.slow
def test_shipped_draft_serves_the_default_target(smollm2) -> None:  # type: ignore[no-untyped-def]
    """The shipped feature draft loads by name and keeps the target's greedy output."""
    from spectune.drafters.feature import FeatureDrafter
    from spectune.drafters.pairing import load_drafter
    from spectune.models.shipped import shipped_draft_path

    if shipped_draft_path("smollm2-draft") is None:
        pytest.skip("no shipped draft in this checkout")
    drafter = load_drafter("smollm2-draft", smollm2)
    assert isinstance(drafter, FeatureDrafter)
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "What is 12 + 30?"}])
    params = SamplingParams(max_tokens=24)
    plain = SpeculativeEngine(smollm2.model, None).run(prompt, params)
    spec = SpeculativeEngine(smollm2.model, drafter).run(prompt, params)
    assert spec.tokens == plain.tokens
    assert all(s.fallback is None for s in spec.steps)


def test_gpt2_family_draft_distils_and_loads_through_transformers(
    toy_target: LlamaLM, corpus: DistillCorpus, tmp_path: Path
) -> None:
    """Another architecture family, same pipeline: the KL falls, and the exported folder
    runs through transformers as a draft that keeps the target's greedy output."""
    from spectune.drafters.model import ModelDrafter
    from spectune.models.hf import load_hf_model

    arch = DraftArchitecture(
        kind="gpt2", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64
    )

    def run(steps: int, out: Path):  # type: ignore[no-untyped-def]
        return _distill(toy_target, corpus, arch, out, steps, vocab_size=None)

    untrained, trained = run(0, tmp_path / "untrained"), run(120, tmp_path / "trained")
    first, last = trained.state.curve[0], trained.state.curve[-1]
    assert last.heldout_kl < 0.7 * first.heldout_kl
    draft = load_hf_model(trained.folder)
    assert draft.info.family == "gpt2"
    # As `--draft FOLDER` reads it: an ordinary transformers draft, not a feature head.
    meta = read_draft_meta(trained.folder)
    assert meta is not None and meta.kind == "gpt2"
    before = _acceptance(toy_target, ModelDrafter(load_hf_model(untrained.folder)))
    assert _acceptance(toy_target, ModelDrafter(draft)) > before + 0.1
    with pytest.raises(InvalidParameterError, match="full vocabulary"):
        _distill(toy_target, corpus, arch, tmp_path / "subset", 1, vocab_size=48)

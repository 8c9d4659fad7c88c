"""EAGLE-3's two changes to the feature head: fused features from several target layers,
and training-time test (the head unrolled on its own outputs). On the toy target and, for
greedy equality, on the real one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from spectune.cli import main
from spectune.control.base import FixedK
from spectune.decode.engine import SpeculativeEngine
from spectune.distill.corpus import Answer, CorpusSettings, SeedData, build_shards
from spectune.distill.data import (
    DistillCorpus,
    GenerationSettings,
    corpus_from_token_ids,
    features_of_answers,
)
from spectune.distill.losses import kl_to_target, soft_labels
from spectune.distill.models import DraftArchitecture, FeatureDraftModel, unroll_mask
from spectune.distill.pipeline import column_map, distill
from spectune.distill.train import Budget, TrainSettings, iterate_batches
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.loading import feature_drafter_from_folder, load_feature_head
from spectune.models.llama import LlamaLM
from spectune.models.quant import Int8Linear
from spectune.models.toy import toy_config, toy_model
from spectune.sampling import SamplingParams
from spectune.select.alpha import make_continuations, restate
from tree_checks import first_two_tokens_pvalue

ALPHA = 1e-4  # false-failure probability of the chi-square test
SETTINGS = TrainSettings(learning_rate=3e-3, warmup_steps=10, batch_tokens=512, eval_every=1000)


def _corpus(target: LlamaLM, count: int = 72, seed: int = 0) -> DistillCorpus:
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 64, (6,), generator=generator).tolist() for _ in range(count)]
    return corpus_from_token_ids(
        target, prompts, GenerationSettings(max_new_tokens=24, batch_size=24, top_k=16)
    )


@pytest.fixture(scope="module")
def fused_target() -> LlamaLM:
    """The toy target exposing both of its layers (its own instance: exposing layers
    changes what ``forward`` returns as ``hidden``), without EOS so every run is long."""
    target = toy_model(0, config=dataclasses.replace(toy_config(), eos_token_ids=()), scale=3.0)
    target.expose_layers((0, 1))
    return target


def test_unroll_mask_sees_the_real_prefix_and_the_drafts_own_slots() -> None:
    mask = unroll_mask(5, 2)  # step 2: slot i drafts the third token after slot i - 2
    # Slot 4: real-state slots 0..2 (step 0), its chain's slot 3 at step 1, itself at step 2.
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]
    assert torch.equal(unroll_mask(4, 0), torch.ones(4, 4, dtype=torch.bool).tril())


def test_training_time_test_lowers_the_loss_at_later_draft_positions(
    toy_target: LlamaLM, tmp_path: Path
) -> None:
    train, heldout = _corpus(toy_target), _corpus(toy_target, 16, seed=9)
    trained: dict[int, FeatureDraftModel] = {}
    for unroll in (1, 3):
        arch = DraftArchitecture(kind="feature", intermediate_size=64, unroll=unroll)
        torch.manual_seed(0)
        distill(
            toy_target,
            (train, DistillCorpus([])),
            arch,
            tmp_path / f"unroll{unroll}",
            vocab_size=None,
            settings=SETTINGS,
            budget=Budget(max_steps=150),
            heldout_sequences=8,
            training_record={},
            heldout=heldout,
        )
        drafter = feature_drafter_from_folder(tmp_path / f"unroll{unroll}" / "draft", toy_target)
        trained[unroll] = FeatureDraftModel(drafter.head, None, unroll=3)
    columns = column_map(None, toy_target.info.vocab_size)

    def loss_by_position(model: FeatureDraftModel) -> list[float]:
        sums, counts = [0.0] * 3, [0] * 3
        with torch.no_grad():
            for batch in iterate_batches(heldout, SETTINGS, None):
                out = model.train_forward(batch)
                rows, cols = out.position_index
                labels = soft_labels(
                    batch.topk_ids[rows, cols], batch.topk_probs[rows, cols], columns
                )
                assert out.draft_position is not None
                for p in range(3):
                    keep = out.draft_position == p
                    part = type(labels)(
                        labels.columns[keep], labels.probs[keep], labels.target_top1[keep]
                    )
                    sums[p] += float(kl_to_target(out.logits[keep], part)) * int(keep.sum())
                    counts[p] += int(keep.sum())
        return [s / c for s, c in zip(sums, counts, strict=True)]

    plain, unrolled = loss_by_position(trained[1]), loss_by_position(trained[3])
    # Same data, same steps: the head trained on its own features is better there.
    assert unrolled[1] < plain[1] and unrolled[2] < plain[2], (plain, unrolled)


@pytest.fixture(scope="module")
def fused_folder(fused_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fused head distilled for ``fused_target``: its draft folder."""
    folder = tmp_path_factory.mktemp("fused-head")
    distill(
        fused_target,
        (_corpus(fused_target), DistillCorpus([])),
        DraftArchitecture(kind="feature", intermediate_size=64, feature_layers=(0, 1), unroll=2),
        folder,
        vocab_size=48,
        settings=SETTINGS,
        budget=Budget(max_steps=150),
        heldout_sequences=8,
        training_record={},
    )
    return folder / "draft"


@pytest.fixture(scope="module")
def fused_drafter(fused_target: LlamaLM, fused_folder: Path) -> FeatureDrafter:
    """The head as loaded for use: on int8 kernels beside this fp32 target."""
    return feature_drafter_from_folder(fused_folder, fused_target)


def test_fused_head_reads_the_exposed_layers(
    fused_target: LlamaLM, fused_drafter: FeatureDrafter
) -> None:
    assert fused_drafter.head.cfg.feature_layers == (0, 1)
    out = fused_target.forward(torch.tensor([[1, 5, 9]]), fused_target.new_cache(1, 8))
    assert out.hidden is not None and out.hidden.shape[-1] == 2 * 32
    with pytest.raises(ValueError, match="width"):
        fused_drafter.head.target_input(torch.zeros(3, 32))  # the last state alone


def _random_answers(seed: int, count: int = 6) -> list[Answer]:
    """Answers of random toy tokens: an 8-token prompt and 16, 17, ... answer tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [
        Answer(
            id=str(i),
            category="chat",
            split="train",
            temperature=0.0,
            prompt=tuple(torch.randint(3, 64, (8,), generator=generator).tolist()),
            answer=tuple(torch.randint(3, 64, (16 + i,), generator=generator).tolist()),
        )
        for i in range(count)
    ]


def test_teacher_states_in_bf16_stay_close_to_fp32(fused_target: LlamaLM) -> None:
    """The cached teacher pass under bf16 autocast really runs in bf16 (its outputs differ
    from fp32's) and stays close: states within 3% (relative norm), soft labels' argmax
    equal at >= 90% of positions (measured on this toy: at most 0.9%, and 159 of 159)."""
    answers = _random_answers(seed=1)
    fp32, bf16 = (
        features_of_answers(fused_target, answers, layers=(0, 1), precision=precision)
        for precision in ("fp32", "bf16")
    )
    for exact, rounded in zip(fp32, bf16, strict=True):
        assert torch.equal(exact["tokens"], rounded["tokens"])
        assert not torch.equal(exact["hidden"], rounded["hidden"])
        error = (exact["hidden"].float() - rounded["hidden"].float()).norm(dim=-1)
        assert (error / exact["hidden"].float().norm(dim=-1)).max() < 0.03
    top1 = torch.cat([r["topk_ids"][:, 0] for r in fp32])
    top1_bf16 = torch.cat([r["topk_ids"][:, 0] for r in bf16])
    assert (top1 == top1_bf16).float().mean() >= 0.9


@pytest.mark.gpu
def test_distill_on_cuda_caches_and_trains_as_on_the_cpu(
    fused_target: LlamaLM, tmp_path: Path
) -> None:
    """``--device cuda``: the teacher pass on the GPU caches CPU records equal to the CPU's
    (states within fp16 storage and TF32-free fp32 rounding, top-1 labels at >= 99% of
    positions), and a head trained on the GPU reaches the held-out agreement of the same
    run on the CPU (within 0.05; the toy's runs differ only in float rounding) and is saved
    as an ordinary CPU draft folder."""
    import copy

    on_gpu = LlamaLM(copy.deepcopy(fused_target.net).to("cuda"), name=fused_target.info.name)
    answers = _random_answers(seed=2)
    cpu_records, gpu_records = (
        features_of_answers(model, answers, layers=(0, 1)) for model in (fused_target, on_gpu)
    )
    for exact, other in zip(cpu_records, gpu_records, strict=True):
        assert all(value.device.type == "cpu" for value in other.values())
        assert torch.equal(exact["tokens"], other["tokens"])
        error = (exact["hidden"].float() - other["hidden"].float()).norm(dim=-1)
        assert (error / exact["hidden"].float().norm(dim=-1)).max() < 0.01
    top1 = torch.cat([r["topk_ids"][:, 0] for r in cpu_records])
    assert (top1 == torch.cat([r["topk_ids"][:, 0] for r in gpu_records])).float().mean() >= 0.99

    corpus, heldout = _corpus(fused_target), _corpus(fused_target, 16, seed=9)
    arch = DraftArchitecture(kind="feature", intermediate_size=64, feature_layers=(0, 1), unroll=2)
    agreement = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        result = distill(
            fused_target,
            (corpus, DistillCorpus([])),
            arch,
            tmp_path / device,
            vocab_size=48,
            settings=SETTINGS,
            budget=Budget(max_steps=100),
            heldout_sequences=8,
            training_record={},
            heldout=heldout,
            device=torch.device(device),
        )
        agreement[device] = result.state.curve[-1].heldout_top1
    assert abs(agreement["cuda"] - agreement["cpu"]) < 0.05, agreement
    drafter = feature_drafter_from_folder(tmp_path / "cuda" / "draft", fused_target)
    assert next(drafter.head.parameters()).device.type == "cpu"


def test_fused_head_scales_each_layer_to_unit_rms(fused_drafter: FeatureDrafter) -> None:
    """A layer with massive activations (as SmolLM2's middle layers have) weighs no more in
    the fused feature than the same state at its ordinary size."""
    states = torch.randn(4, 2 * 32, generator=torch.Generator().manual_seed(0))
    loud = states.clone()
    loud[:, :32] *= 1000.0  # layer 0's state, a thousand times larger
    head = fused_drafter.head
    with torch.no_grad():
        torch.testing.assert_close(head.target_input(loud), head.target_input(states))


def test_select_restates_continuations_for_a_fused_head() -> None:
    """``select`` makes its continuations before loading candidates; a fused head loaded
    afterwards gets them again with the layers it reads."""
    target = toy_model(0)
    [made] = make_continuations(target, [("p", "chat", [1, 5, 9])], 6)
    assert made.hidden.shape[-1] == 32
    target.expose_layers((0, 1))
    [again] = restate(target, [made])
    assert again.tokens == made.tokens
    assert again.hidden.shape == (len(made.tokens) - 1, 64)


def test_fused_head_keeps_greedy_output_and_drafts_well(
    fused_target: LlamaLM, fused_drafter: FeatureDrafter
) -> None:
    params = SamplingParams(max_tokens=32)
    accepted = drafted = 0
    for seed in range(4):
        prompt = torch.randint(3, 64, (6,), generator=torch.Generator().manual_seed(100 + seed))
        plain = SpeculativeEngine(fused_target).run(prompt.tolist(), params, policy=FixedK(0))
        drafter = FeatureDrafter(fused_drafter.head, fused_drafter.vocab_subset)
        run = SpeculativeEngine(fused_target, drafter).run(
            prompt.tolist(), params, policy=FixedK(3)
        )
        assert run.tokens == plain.tokens
        accepted += run.accepted
        drafted += run.drafted
    # It learned something: an untrained head over 48 tokens is accepted about 1 in 48 times.
    assert accepted / drafted > 0.15


@pytest.mark.slow
def test_fused_head_speculation_emits_the_target_distribution(
    fused_target: LlamaLM, fused_drafter: FeatureDrafter
) -> None:
    """First two tokens at T = 1, 4,000 runs, chi-square against the target's exact joint
    distribution; fixed seeds, false-failure probability 1e-4."""
    drafter = FeatureDrafter(fused_drafter.head, fused_drafter.vocab_subset)
    pvalue, accepted = first_two_tokens_pvalue(fused_target, drafter, runs=4_000, seed=31)
    assert accepted > 500  # the head's drafts were verified, not bypassed
    assert pvalue > ALPHA, pvalue


@pytest.mark.slow
def test_a_float_fused_head_keeps_speculation_lossless(
    fused_target: LlamaLM, fused_folder: Path
) -> None:
    """The head with its trained float weights (as distillation evaluates it; loaded for use
    it runs on int8 kernels, the test above): the same chi-square test, its own seed,
    false-failure probability 1e-4."""
    head, subset = load_feature_head(fused_folder, fused_target.net)
    drafter = FeatureDrafter(head.eval(), subset)
    pvalue, accepted = first_two_tokens_pvalue(fused_target, drafter, runs=4_000, seed=37)
    assert accepted > 500
    assert pvalue > ALPHA, pvalue


@pytest.mark.slow
def test_fused_head_on_the_real_target_keeps_greedy_output(smollm2) -> None:  # type: ignore[no-untyped-def]
    """An untrained three-layer head on SmolLM2: speculation must not change a token."""
    model: LlamaLM = smollm2.model
    arch = DraftArchitecture(kind="feature", intermediate_size=256, feature_layers=(2, 15, 29))
    head = FeatureDraftModel.create(arch, model.net, None, torch.Generator().manual_seed(0)).head
    prompt = smollm2.tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}])
    params = SamplingParams(max_tokens=24)
    plain = SpeculativeEngine(model).run(prompt, params, policy=FixedK(0)).tokens
    model.expose_layers((2, 15, 29))
    try:
        drafter = FeatureDrafter(head.eval(), None)
        run = SpeculativeEngine(model, drafter).run(prompt, params, policy=FixedK(3))
    finally:
        model.expose_layers(())  # the fixture is shared
    assert run.tokens == plain
    assert all(step.fallback is None for step in run.steps)


def test_distill_command_trains_a_fused_head_on_an_answer_corpus_and_it_loads(
    tmp_path: Path,
) -> None:
    from bench_fixtures import make_models
    from spectune.drafters.pairing import load_drafter, load_target

    target_dir, _ = make_models(tmp_path)
    target = load_target(str(target_dir))
    answers = tmp_path / "answers"
    build_shards(
        target.model,
        target.tokenizer,
        SeedData(),
        answers,
        range(3),
        CorpusSettings(
            items_per_shard=24,
            max_answer_tokens=12,
            max_document_tokens=8,
            max_turn_tokens=6,
            max_batch=8,
            prompt_mix=1,  # these toy shards hold held-out answers (fixed ids): distill needs them
        ),
    )
    out = tmp_path / "run"
    # --features-only caches the teacher pass and trains nothing; the run below reuses it.
    teacher = ["--target", str(target_dir), "--answers", str(answers), "--out", str(out)]
    layers_and_cache = ["--feature-layers", "0,1", "--cache-dir", str(tmp_path / "cache")]
    assert main(["distill", *teacher, *layers_and_cache, "--features-only"]) == 0
    marked = sorted(p.name for p in (tmp_path / "cache").glob("answer-features/*/done/*"))
    assert marked == sorted(p.name for p in answers.glob("shard-*.safetensors"))
    assert not (out / "draft").exists()
    status = main(
        [
            "distill",
            "--target",
            str(target_dir),
            "--answers",
            str(answers),
            "--kind",
            "feature",
            "--feature-layers",
            "0,1",
            "--unroll",
            "2",
            "--ffn",
            "64",
            "--steps",
            "20",
            "--eval-every",
            "10",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(out),
        ]
    )
    assert status == 0
    fresh = load_target(str(target_dir))
    drafter = load_drafter(str(out / "draft"), fresh)
    assert isinstance(drafter, FeatureDrafter)
    assert drafter.head.cfg.feature_layers == (0, 1)
    assert fresh.model.feature_layers == (0, 1)  # loading wired the target's layers
    # Beside an fp32 target the head runs on int8 weight-only kernels (``head_kernels``).
    assert drafter.head.output is not None
    assert any(isinstance(m, Int8Linear) for m in drafter.head.modules())
    prompt = fresh.tokenizer.encode_chat([{"role": "user", "content": "w5 w6 w7"}])
    params = SamplingParams(max_tokens=16)
    plain = SpeculativeEngine(fresh.model).run(prompt, params, policy=FixedK(0)).tokens
    assert SpeculativeEngine(fresh.model, drafter).run(prompt, params).tokens == plain


@pytest.fixture(scope="module")
def first_draft(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The common distill arguments on a tiny answer corpus, and a head trained by them."""
    from bench_fixtures import make_models
    from spectune.drafters.pairing import load_target

    tmp_path = tmp_path_factory.mktemp("init-from")
    target_dir, _ = make_models(tmp_path)
    target = load_target(str(target_dir))
    answers = tmp_path / "answers"
    settings = CorpusSettings(
        items_per_shard=24,
        max_answer_tokens=12,
        max_document_tokens=8,
        max_turn_tokens=6,
        prompt_mix=1,  # these toy shards hold held-out answers (ids are fixed): distill needs them
    )
    build_shards(target.model, target.tokenizer, SeedData(), answers, range(2), settings)
    common = ["distill", "--target", str(target_dir), "--answers", str(answers)]
    common += ["--steps", "12", "--eval-every", "6", "--cache-dir", str(tmp_path / "cache")]
    first = tmp_path / "first"
    layers = ["--feature-layers", "0,1", "--ffn", "48", "--vocab-size", "40"]
    assert main([*common, "--out", str(first), *layers]) == 0
    return common, first / "draft"


def _meta(folder: Path) -> dict[str, Any]:
    meta = json.loads((folder / "spectune_draft.json").read_text())
    assert isinstance(meta, dict)
    return meta


def test_distill_init_from_continues_a_trained_head_with_its_vocabulary(
    first_draft: tuple[list[str], Path], tmp_path: Path
) -> None:
    from spectune.drafters.pairing import load_drafter, load_target

    common, folder = first_draft
    assert main([*common, "--out", str(tmp_path / "second"), "--init-from", str(folder)]) == 0
    first, second = _meta(folder), _meta(tmp_path / "second" / "draft")
    # It starts where the first run ended (same held-out set), not from a fresh head.
    ended, started = first["training"]["curve"][-1], second["training"]["curve"][0]
    assert started["step"] == 0
    assert started["heldout_kl"] == pytest.approx(ended["heldout_kl"], rel=1e-5)
    assert second["head"] == first["head"]  # layers and width come from the folder
    # The record keeps what shaped the head, not the LM sizes a feature head ignores.
    assert second["training"]["architecture"] == {
        "kind": "feature",
        "intermediate_size": 48,
        "feature_layers": [0, 1],
        "unroll": 1,
    }
    assert second["vocab_subset_size"] == 40
    assert second["training"]["initialised_from"] == str(folder)
    # The lineage (as JSON text: a record's NaN never equals another NaN).
    assert json.dumps(second["training"]["previous_training"]) == json.dumps(first["training"])
    fresh = load_target(common[2])
    one = load_drafter(str(folder), fresh)
    two = load_drafter(str(tmp_path / "second" / "draft"), fresh)
    assert isinstance(one, FeatureDrafter) and isinstance(two, FeatureDrafter)
    assert one.vocab_subset is not None and two.vocab_subset is not None
    assert torch.equal(one.vocab_subset, two.vocab_subset)


def test_distill_init_from_refuses_what_would_change_the_head(
    first_draft: tuple[list[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common, folder = first_draft
    cases = [
        (["--kind", "lm"], "continues a feature draft"),
        (["--feature-layers", "0"], "reads target layers [0, 1]"),
        (["--vocab-size", "30"], "drafts over 40 tokens"),
        (["--init-from", str(tmp_path)], "is not a feature-draft folder"),
    ]
    for extra, message in cases:
        args = [*common, "--out", str(tmp_path / "x"), "--init-from", str(folder), *extra]
        assert main(args) == 2, extra
        assert message in capsys.readouterr().err, extra

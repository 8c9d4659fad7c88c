"""Drafts whose vocabulary differs from the target's within the pairing tolerance draft over
the shared range, losslessly (issue 17); drafts without a tokenizer are refused unless
trusted (issue 16, item 4)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from scipy import stats

from spectune.control.base import FixedK
from spectune.decode.batch import BatchEngine
from spectune.decode.engine import SpeculativeEngine
from spectune.drafters import TreeDrafter, TreeShape
from spectune.drafters.model import ModelDrafter
from spectune.drafters.pairing import Loaded, drafter_summary, load_drafter, tree_drafter_for
from spectune.errors import IncompatibleModelsError, SpectuneWarning
from spectune.models.llama import LlamaLM, LlamaTransformer
from spectune.models.loading import save_native
from spectune.models.vocab import TargetVocabModel, fit_logits_to_vocab
from spectune.sampling import SamplingParams, process_logits
from spectune.server.engines import DraftSource
from spectune.server.testing import toy_tokenizer
from spectune.verify.chain import verify_sampled

TARGET_VOCAB = 64  # the toy target's
PROMPT = [1, 5, 9, 14, 3]


def resized(model: LlamaLM, vocab: int) -> LlamaLM:
    """``model`` with ``vocab`` embedding and output rows: the shared rows kept; extra output
    rows copy rows 3.. at 1.5x, so they draw real draft mass (a draft that proposed them
    unchecked would fail loudly)."""
    old = model.net.cfg.vocab_size
    net = LlamaTransformer(dataclasses.replace(model.net.cfg, vocab_size=vocab))
    state = model.net.state_dict()
    for key in ("embed_tokens.weight", "lm_head.weight"):
        rows = net.state_dict()[key].clone()  # [vocab, hidden]
        shared = min(vocab, old)
        rows[:shared] = state[key][:shared]
        if vocab > old:
            scale = 1.5 if key == "lm_head.weight" else 1.0
            rows[old:] = state[key][3 + torch.arange(vocab - old) % (old - 3)] * scale
        state[key] = rows
    net.load_state_dict(state)
    return LlamaLM(net, name=f"{model.info.name}-v{vocab}")


@pytest.fixture(scope="module")
def target_folder(toy_target: LlamaLM, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    folder = tmp_path_factory.mktemp("target")
    save_native(toy_target, folder)
    return Loaded(toy_target, toy_tokenizer(folder, TARGET_VOCAB), folder)


def draft_folder(root: Path, draft: LlamaLM, vocab: int, *, tokenizer: bool = True) -> Path:
    folder = root / f"draft-{vocab}"
    save_native(resized(draft, vocab), folder)
    if tokenizer:
        toy_tokenizer(folder, vocab)  # the same strings as the target's over the shared ids
    return folder


def test_fit_logits_cuts_or_pads_with_minus_infinity() -> None:
    logits = torch.arange(6.0).view(1, 6)
    assert fit_logits_to_vocab(logits, 4).tolist() == [[0, 1, 2, 3]]
    padded = fit_logits_to_vocab(logits, 8)
    assert padded[0, :6].tolist() == list(range(6))
    assert padded[0, 6:].tolist() == [float("-inf")] * 2
    assert process_logits(padded[0], SamplingParams(temperature=1.0))[6:].tolist() == [0, 0]


@pytest.mark.parametrize("draft_vocab", [58, pytest.param(70, marks=pytest.mark.slow)])
def test_mismatched_vocabulary_verification_is_lossless(
    toy_target: LlamaLM, toy_draft: LlamaLM, draft_vocab: int
) -> None:
    """The first emitted token of a step follows the target row exactly, with the drafter's
    own (cut or padded) distribution as the draft probabilities.

    The drafter's row for a fixed context is taken from ``propose``; 60,000 draft tokens are
    drawn from it and each verified. Chi-square goodness of fit over the target's tokens
    (bins expected below 5 pooled), fixed seed; the test fails when p < 1e-4, so a correct
    verifier fails it with probability 1e-4 per case (for this seed it always passes or
    always fails). The acceptance rate must equal sum(min(target, draft)) within 4 sigma."""
    params = SamplingParams(temperature=0.9)
    generator = torch.Generator().manual_seed(17)
    model = TargetVocabModel(resized(toy_draft, draft_vocab), TARGET_VOCAB)
    drafter = ModelDrafter(model)
    draft = drafter.propose(PROMPT, 1, params, generator)
    assert draft.probs is not None
    draft_row = draft.probs[0]  # [64]
    assert draft_row.shape == (TARGET_VOCAB,)
    assert float(draft_row.sum()) == pytest.approx(1.0, abs=1e-5)
    raw = resized(toy_draft, draft_vocab)
    own = process_logits(raw.forward(torch.tensor([PROMPT]), raw.new_cache()).logits[0, -1], params)
    if draft_vocab < TARGET_VOCAB:
        assert draft_row[draft_vocab:].sum() == 0  # ids only the target has: never drafted
    else:
        assert float(own[TARGET_VOCAB:].sum()) > 0.05  # the cut removes real mass...
        # ...and what remains is the draft's own distribution renormalised.
        shared = own[:TARGET_VOCAB] / own[:TARGET_VOCAB].sum()
        assert torch.allclose(draft_row, shared, atol=1e-5)

    context = torch.tensor([PROMPT])
    target_row = process_logits(
        toy_target.forward(context, toy_target.new_cache()).logits[0, -1], params
    )  # [64]
    target_probs = torch.stack((target_row, target_row))  # [k + 1, vocab]; row 2 is unused
    samples = 60_000
    drafted = torch.multinomial(draft_row, samples, replacement=True, generator=generator)
    assert int(drafted.max()) < min(draft_vocab, TARGET_VOCAB)
    counts = torch.zeros(TARGET_VOCAB)
    accepted = 0
    for token in drafted:
        result = verify_sampled(token.view(1), draft.probs, target_probs, generator)
        counts[result.tokens[0]] += 1
        accepted += result.num_accepted
    expected = target_row.double() * samples
    big = expected >= 5
    observed = torch.cat((counts[big].double(), counts[~big].sum().view(1)))
    wanted = torch.cat((expected[big], expected[~big].sum().view(1)))
    if not bool((~big).any()):
        observed, wanted = observed[:-1], wanted[:-1]
    wanted = wanted * samples / wanted.sum()  # the target row sums to 1 up to rounding
    _, p_value = stats.chisquare(observed.numpy(), wanted.numpy())
    assert p_value > 1e-4, (counts, expected)
    alpha = float(torch.minimum(target_row, draft_row).sum())
    sigma = (alpha * (1 - alpha) / samples) ** 0.5
    assert abs(accepted / samples - alpha) < 4 * sigma
    if draft_vocab < TARGET_VOCAB:  # the target-only ids come out, by recovery
        assert counts[draft_vocab:].sum() > 0


@pytest.mark.parametrize("draft_vocab", [58, pytest.param(70, marks=pytest.mark.slow)])
def test_mismatched_vocabulary_drafts_and_keeps_greedy_output(
    target_folder: Loaded, toy_draft: LlamaLM, tmp_path: Path, draft_vocab: int
) -> None:
    """Paired through the folders as the CLI pairs them: it drafts on every step (no
    fallback) and greedy output equals plain decoding, chained, as a tree and batched."""
    target = target_folder.model
    drafter = load_drafter(str(draft_folder(tmp_path, toy_draft, draft_vocab)), target_folder)
    assert isinstance(drafter, ModelDrafter)
    assert f"shared by its vocabulary ({draft_vocab}) and the target's (64)" in drafter_summary(
        drafter
    )
    params = SamplingParams(max_tokens=40)
    plain = SpeculativeEngine(target).run(PROMPT, params, policy=FixedK(0)).tokens
    spec = SpeculativeEngine(target, drafter).run(PROMPT, params, policy=FixedK(3))
    assert spec.tokens == plain
    assert spec.accepted > 0
    assert all(step.fallback is None for step in spec.steps)

    tree = tree_drafter_for(drafter, target, TreeShape(width=2, nodes=8))
    assert isinstance(tree, TreeDrafter)
    assert SpeculativeEngine(target, tree).run(PROMPT, params, policy=FixedK(3)).tokens == plain

    batch = BatchEngine(
        target,
        DraftSource(drafter).for_batch(),
        max_batch=2,
        capacity=128,
        policy_factory=lambda p: FixedK(3),
    )
    batch.add("a", PROMPT, params)
    records = []
    while batch.active:
        records += [update.record for update in batch.step()]
    assert [t for r in records for t in r.emitted] == plain
    assert all(r.fallback is None for r in records)

    sampled = SamplingParams(temperature=0.8, max_tokens=40, seed=3)
    run = SpeculativeEngine(target, drafter).run(PROMPT, sampled, policy=FixedK(3))
    assert run.drafted > 0 and all(step.fallback is None for step in run.steps)


def test_draft_without_tokenizer_is_refused_unless_trusted(
    target_folder: Loaded, toy_draft: LlamaLM, tmp_path: Path
) -> None:
    folder = draft_folder(tmp_path, toy_draft, TARGET_VOCAB, tokenizer=False)
    with pytest.raises(IncompatibleModelsError, match="token strings could not be compared"):
        load_drafter(str(folder), target_folder)
    with pytest.warns(SpectuneWarning, match="token strings were not compared"):
        drafter = load_drafter(str(folder), target_folder, trust_draft_vocab=True)
    assert isinstance(drafter, ModelDrafter)


def test_vocabulary_beyond_the_tolerance_is_still_refused(
    target_folder: Loaded, toy_draft: LlamaLM, tmp_path: Path
) -> None:
    folder = draft_folder(tmp_path, toy_draft, TARGET_VOCAB + 129)
    with pytest.raises(IncompatibleModelsError, match="vocabulary sizes differ by 129"):
        load_drafter(str(folder), target_folder)


@pytest.mark.slow
def test_narrower_draft_keeps_greedy_output_on_the_real_model(smollm2: Loaded) -> None:
    """SmolLM2 with a 4-layer draft whose vocabulary lacks the target's last 100 ids (the
    inner view cuts them, the outer pads them back as the pairing does): greedy output
    equals plain decoding token for token, and every step drafts."""
    from spectune.models.llama import truncated

    assert isinstance(smollm2.model, LlamaLM)
    vocab = smollm2.model.info.vocab_size
    narrower = TargetVocabModel(truncated(smollm2.model, 4), vocab - 100)
    drafter = ModelDrafter(TargetVocabModel(narrower, vocab))
    prompt = smollm2.tokenizer.encode_chat(
        [{"role": "user", "content": "Name three rivers in Europe and one fact about each."}]
    )
    params = SamplingParams(max_tokens=48)
    plain = SpeculativeEngine(smollm2.model).run(prompt, params).tokens
    spec = SpeculativeEngine(smollm2.model, drafter).run(prompt, params, policy=FixedK(4))
    assert spec.tokens == plain
    fallbacks = {step.fallback for step in spec.steps}
    assert spec.drafted > 0 and fallbacks == {None}, (spec.drafted, spec.accepted, fallbacks)

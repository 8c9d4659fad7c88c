"""Reduced draft vocabularies keep verification lossless (statistical test) and greedy exact."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from spectune.decode.engine import SpeculativeEngine
from spectune.drafters.loading import lm_drafter_from_folder
from spectune.drafters.reduced import scatter_to_vocab, top_token_subset
from spectune.models.llama import LlamaLM
from spectune.models.loading import load_model, save_native
from spectune.sampling import SamplingParams
from spectune.verify.chain import verify_sampled


def test_scatter_puts_zeros_outside_the_subset() -> None:
    subset = torch.tensor([1, 4, 6])
    full = scatter_to_vocab(torch.tensor([[0.2, 0.5, 0.3]]), subset, 8)
    assert full.shape == (1, 8)
    assert full[0].tolist() == pytest.approx([0, 0.2, 0, 0, 0.5, 0, 0.3, 0])


def test_top_token_subset_keeps_special_tokens() -> None:
    counts = torch.tensor([50, 0, 40, 30, 20, 10])
    subset = top_token_subset(counts, 3, always=[1])
    assert subset.tolist() == [0, 1, 2]  # sorted; id 1 kept although it never occurs


@pytest.mark.slow  # seconds: the quick loop (-m 'not slow') stays under 3 minutes
def test_reduced_vocabulary_verification_is_lossless() -> None:
    """The first emitted token of a step must follow the target row exactly, although the
    draft can only propose 4 of 10 tokens (the other 6 hold 45% of the target's mass).

    Chi-square goodness of fit over 10 categories (df = 9) with 100,000 steps, fixed seed;
    the test fails when p < 1e-4, so a correct verifier fails it with probability 1e-4
    (for this seed it either always passes or always fails)."""
    generator = torch.Generator().manual_seed(2024)
    vocab, k = 10, 2
    target = torch.softmax(torch.randn(k + 1, vocab, generator=generator) * 1.5, -1)
    subset = torch.tensor([0, 3, 5, 8])
    target[0] = torch.tensor([0.10, 0.05, 0.10, 0.20, 0.05, 0.10, 0.10, 0.05, 0.15, 0.10])
    draft_small = torch.softmax(torch.randn(k, subset.numel(), generator=generator), -1)
    draft = scatter_to_vocab(draft_small, subset, vocab)  # [k, vocab]
    samples = 100_000
    counts = torch.zeros(vocab)
    accepted_first = 0
    # Draft tokens for every step, drawn up front (the verifier's draws follow in order).
    drafted = torch.stack(
        [
            torch.multinomial(draft[i], samples, replacement=True, generator=generator)
            for i in range(k)
        ],
        dim=1,
    )  # [samples, k]
    assert set(drafted.unique().tolist()) <= set(subset.tolist())
    for tokens in drafted:
        result = verify_sampled(tokens, draft, target, generator)
        counts[result.tokens[0]] += 1
        accepted_first += result.num_accepted >= 1
    expected = target[0] * samples
    _, p_value = stats.chisquare(counts.numpy(), expected.numpy())
    assert p_value > 1e-4, (counts, expected)
    # Tokens outside the subset are emitted only as recovered tokens, at their target rate.
    outside = [i for i in range(vocab) if i not in subset.tolist()]
    assert counts[outside].sum() > 0.4 * samples
    # The first token's acceptance rate is sum(min(target, draft)); 4 sigma binomial band.
    alpha = float(torch.minimum(target[0], draft[0]).sum())
    sigma = (alpha * (1 - alpha) / samples) ** 0.5
    assert abs(accepted_first / samples - alpha) < 4 * sigma


def test_reduced_vocab_lm_draft_keeps_greedy_output(toy_target: LlamaLM, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from spectune.drafters.loading import DRAFT_META_FILE, subset_tensor_file
    from spectune.models.toy import perturbed

    draft = perturbed(toy_target, 0.2)
    save_native(draft, tmp_path)
    subset = torch.arange(0, 64, 2)  # half of the vocabulary
    subset_tensor_file(tmp_path / "vocab_subset.safetensors", subset)
    (tmp_path / DRAFT_META_FILE).write_text('{"kind": "lm"}')
    drafter = lm_drafter_from_folder(tmp_path, load_model(tmp_path))
    prompt = [1, 5, 9, 14, 3]
    plain = SpeculativeEngine(toy_target, None).run(prompt, SamplingParams(max_tokens=40))
    spec = SpeculativeEngine(toy_target, drafter).run(prompt, SamplingParams(max_tokens=40))
    assert spec.tokens == plain.tokens
    assert spec.drafted > 0
    assert all(s.fallback is None for s in spec.steps)

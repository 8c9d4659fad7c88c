"""Statistical losslessness of the verifier (Leviathan et al. 2023, Theorem 1).

For random target/draft distributions over a small vocabulary, the first emitted token
must follow the target distribution, and the first draft token must be accepted with
probability 1 - TV(draft, target) = sum(min(draft, target)).

False-failure odds: each chi-square test fails under the null hypothesis with
probability 1e-4 (p-value threshold), and each acceptance-rate check with probability
below 1e-6 (a two-sided 4.9-sigma normal bound on a binomial with n = 1e5). The seeds are
fixed, so a pass is reproducible; across the whole file the chance that a correct
verifier would fail any check, had the seeds been drawn at random, is below 2e-3.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from spectune.sampling import SamplingParams, process_logits, sample_from
from spectune.verify.chain import verify_sampled

SAMPLES = 100_000
P_VALUE = 1e-4
SIGMAS = 4.9
VOCAB = 12


def _emitted_first_tokens(
    target_probs: torch.Tensor,  # [k + 1, vocab]
    draft_probs: torch.Tensor | None,  # [k, vocab]
    draft_sampler: torch.Tensor,  # [k, vocab] distribution the draft tokens are drawn from
    k: int,
    seed: int,
) -> tuple[torch.Tensor, int]:
    """Run SAMPLES verifications; return first-token counts and how often x_1 was accepted."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(target_probs.shape[-1], dtype=torch.long)
    accepted_first = 0
    # Draw every draft up front (vectorised): [SAMPLES, k].
    drafts = torch.stack(
        [
            torch.multinomial(draft_sampler[i], SAMPLES, replacement=True, generator=generator)
            for i in range(k)
        ],
        dim=1,
    )
    for row in drafts:
        result = verify_sampled(row, draft_probs, target_probs, generator)
        counts[result.tokens[0]] += 1
        accepted_first += result.num_accepted > 0
    return counts, accepted_first


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() / probs.double().sum() * counts.sum().item()
    observed = counts.double()
    # Tokens the target never emits must never be emitted.
    assert observed[expected == 0].sum() == 0
    keep = expected > 0
    return float(stats.chisquare(observed[keep].numpy(), expected[keep].numpy()).pvalue)


def _acceptance_bound(p: float) -> float:
    return SIGMAS * math.sqrt(max(p * (1 - p), 1e-12) / SAMPLES)


def _random_logits(seed: int, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * 1.5


@pytest.mark.parametrize(
    "k", [1, pytest.param(3, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=6, top_p=0.9),
    ],
    ids=["plain", "temp-topk-topp"],
)
def test_first_token_follows_target(k: int, params: SamplingParams) -> None:
    target_probs = process_logits(_random_logits(10 + k, k + 1), params)
    draft_probs = process_logits(_random_logits(20 + k, k), params)
    counts, accepted_first = _emitted_first_tokens(
        target_probs, draft_probs, draft_probs, k, seed=k
    )

    assert _chi_square_p(counts, target_probs[0]) > P_VALUE

    expected_accept = float(torch.minimum(target_probs[0], draft_probs[0]).sum())
    observed_accept = accepted_first / SAMPLES
    assert abs(observed_accept - expected_accept) < _acceptance_bound(expected_accept)


@pytest.mark.slow  # seconds: the quick loop (-m 'not slow') stays under 3 minutes
def test_drafter_without_probabilities_is_lossless() -> None:
    """One-hot treatment of a deterministic-looking drafter (n-gram) keeps the output exact,
    whatever distribution its tokens really come from."""
    params = SamplingParams(temperature=1.0)
    target_probs = process_logits(_random_logits(31, 4), params)
    proposal = process_logits(_random_logits(32, 3), params)
    counts, accepted_first = _emitted_first_tokens(target_probs, None, proposal, 3, seed=5)
    assert _chi_square_p(counts, target_probs[0]) > P_VALUE
    # Acceptance of token x is target(x): the expected rate is sum(proposal * target).
    expected_accept = float((proposal[0] * target_probs[0]).sum())
    assert abs(accepted_first / SAMPLES - expected_accept) < _acceptance_bound(expected_accept)


def test_sample_from_follows_distribution() -> None:
    probs = process_logits(_random_logits(3, 1), SamplingParams(temperature=1.0))[0]
    generator = torch.Generator().manual_seed(0)
    draws = sample_from(probs.expand(SAMPLES, VOCAB), generator)
    counts = torch.bincount(draws, minlength=VOCAB)
    assert _chi_square_p(counts, probs) > P_VALUE

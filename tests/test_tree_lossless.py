"""Tree verification is lossless: the emitted tokens have the target's distribution.

A fixed two-level tree over a 5-token vocabulary: three children of the root drawn
without replacement from the draft, two children under each of them. The first two
emitted tokens (a rejection at the root emits one token; the second then comes from the
target, as the next step would draw it) must follow p(t1) p(t2 | t1) exactly.
Chi-square over the 25 cells with fixed seeds: 100,000 samples (marked slow, about a minute
each) and a quick 10,000-sample run. Each test fails by chance with probability 1e-4 when
the verifier is right (the p-value threshold).
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from spectune.sampling import sample_from
from spectune.verify.tree import verify_tree_sampled

VOCAB = 5
SAMPLES = 100_000
ALPHA = 1e-4  # false-failure probability of each chi-square test


def gumbel_order(log_probs: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """[trials, vocab] -> [trials, count]: draws without replacement (Gumbel-top-k, which is
    distributed exactly as drawing one token at a time and removing it)."""
    uniforms = torch.rand(log_probs.shape, generator=generator, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(uniforms.clamp_min(1e-300)))
    return torch.topk(log_probs + gumbel, count, dim=-1).indices


def joint_counts(
    with_probs: bool, seed: int, samples: int = SAMPLES
) -> tuple[torch.Tensor, torch.Tensor]:
    setup = torch.Generator().manual_seed(seed)
    target_root = (torch.randn(VOCAB, generator=setup) * 1.2).softmax(-1)  # p(t1)
    target_next = (torch.randn(VOCAB, VOCAB, generator=setup) * 1.2).softmax(-1)  # p(t2 | t1)
    draft_root = (torch.randn(VOCAB, generator=setup) * 1.2).softmax(-1)  # q(t1)
    draft_next = (torch.randn(VOCAB, VOCAB, generator=setup) * 1.2).softmax(-1)  # q(t2 | t1)
    generator = torch.Generator().manual_seed(seed + 1)
    first = gumbel_order(draft_root.double().log().expand(samples, VOCAB), 3, generator)
    # Children of each first-level node, drawn without replacement from q(. | that token).
    second = [gumbel_order(draft_next[first[:, j]].double().log(), 2, generator) for j in range(3)]
    parents = torch.tensor([-1, -1, -1, 0, 0, 1, 1, 2, 2])
    counts = torch.zeros(VOCAB, VOCAB)
    verify_generator = torch.Generator().manual_seed(seed + 2)
    for trial in range(samples):
        level1 = first[trial].tolist()
        level2 = [second[j][trial].tolist() for j in range(3)]
        tokens = torch.tensor(level1 + [t for pair in level2 for t in pair])
        rows = [target_root] + [target_next[t] for t in level1]
        rows += [target_next[t] for pair in level2 for t in pair]  # bonus rows (unused cells)
        target_probs = torch.stack(rows)  # [10, vocab]
        draft_probs = None
        if with_probs:
            draft_probs = torch.stack(
                [draft_root] * 3 + [draft_next[level1[j // 2]] for j in range(6)]
            )  # [9, vocab]: each node's parent distribution
        result = verify_tree_sampled(tokens, parents, draft_probs, target_probs, verify_generator)
        t1 = result.tokens[0]
        t2 = (
            result.tokens[1]
            if len(result.tokens) > 1
            else int(sample_from(target_next[t1], verify_generator))
        )
        counts[t1, t2] += 1
    expected = target_root.double()[:, None] * target_next.double()
    return counts.double(), expected / expected.sum() * samples


@pytest.mark.slow
@pytest.mark.parametrize("with_probs", [True, False], ids=["sampled-siblings", "one-hot"])
def test_tree_emits_the_target_distribution(with_probs: bool) -> None:
    counts, expected = joint_counts(with_probs, seed=11)
    result = stats.chisquare(counts.flatten().numpy(), expected.flatten().numpy())
    assert result.pvalue > ALPHA, (result.pvalue, counts, expected)


@pytest.mark.parametrize("with_probs", [True, False], ids=["sampled-siblings", "one-hot"])
def test_tree_emits_the_target_distribution_quick(with_probs: bool) -> None:
    """The same test on 10,000 samples (a few seconds): less power, same false-failure odds."""
    counts, expected = joint_counts(with_probs, seed=23, samples=10_000)
    result = stats.chisquare(counts.flatten().numpy(), expected.flatten().numpy())
    assert result.pvalue > ALPHA, (result.pvalue, counts, expected)


@pytest.mark.slow
def test_tree_drafter_end_to_end_emits_the_target_distribution(toy_target, toy_draft) -> None:  # type: ignore[no-untyped-def]
    """The whole path (TreeDrafter's best-first sampled tree, the engine, the verifier):
    the first two tokens follow the toy target's own distribution. Chi-square over the
    likely (t1, t2) pairs (expected count >= 5; the rest pooled), 4,000 runs, fixed seeds,
    false-failure probability 1e-4."""
    from spectune.drafters import TreeDrafter, TreeShape
    from tree_checks import first_two_tokens_pvalue

    drafter = TreeDrafter(toy_draft, TreeShape(width=3, nodes=7))
    pvalue, _ = first_two_tokens_pvalue(toy_target, drafter, runs=4_000, seed=77)
    assert pvalue > ALPHA, pvalue

"""Greedy exactness table and the verifier's edge policies."""

from __future__ import annotations

import pytest
import torch

from spectune.verify.chain import verify_greedy, verify_sampled

VOCAB = 8


def logits_for(argmaxes: list[int]) -> torch.Tensor:
    """[len, vocab] logits whose argmax at row i is argmaxes[i]."""
    return torch.nn.functional.one_hot(torch.tensor(argmaxes), VOCAB).float() * 5.0


@pytest.mark.parametrize(
    ("draft", "target_argmax", "accepted", "emitted"),
    [
        ([], [3], 0, [3]),  # K = 0: plain decoding step
        ([3], [3, 5], 1, [3, 5]),  # full acceptance: bonus token
        ([4], [3, 5], 0, [3]),  # rejection at position 0: the target's token
        ([3, 4, 6], [3, 4, 6, 1], 3, [3, 4, 6, 1]),
        ([3, 4, 6], [3, 7, 6, 1], 1, [3, 7]),  # mismatch in the middle
        ([3, 4, 6], [3, 4, 2, 1], 2, [3, 4, 2]),  # mismatch at the last position
    ],
)
def test_greedy_table(
    draft: list[int], target_argmax: list[int], accepted: int, emitted: list[int]
) -> None:
    result = verify_greedy(torch.tensor(draft, dtype=torch.long), logits_for(target_argmax))
    assert result.num_accepted == accepted
    assert list(result.tokens) == emitted
    assert result.bonus == (accepted == len(draft))


def test_identical_distributions_always_accept() -> None:
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(5, VOCAB, generator=generator), -1)
    for _ in range(500):
        draft = torch.multinomial(probs[:4], 1, generator=generator).view(-1)
        result = verify_sampled(draft, probs[:4], probs, generator)
        assert result.num_accepted == 4


def test_disjoint_supports_always_reject() -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.zeros(3, VOCAB)
    target[:, :4] = 0.25
    draft = torch.zeros(2, VOCAB)
    draft[:, 4:] = 0.25
    for _ in range(500):
        tokens = torch.multinomial(draft, 1, generator=generator).view(-1)
        result = verify_sampled(tokens, draft, target, generator)
        assert result.num_accepted == 0
        assert result.tokens[0] < 4  # recovered from the target's support


def test_zero_draft_probability_does_not_produce_nan() -> None:
    """A token the draft gave probability 0 is accepted iff the target gives it mass."""
    generator = torch.Generator().manual_seed(0)
    target = torch.full((2, VOCAB), 1.0 / VOCAB)
    draft = torch.zeros(1, VOCAB)
    draft[0, 0] = 1.0
    result = verify_sampled(torch.tensor([3]), draft, target, generator)
    assert result.num_accepted == 1
    target_zero = target.clone()
    target_zero[0, 3] = 0.0
    target_zero[0] /= target_zero[0].sum()
    result = verify_sampled(torch.tensor([3]), draft, target_zero, generator)
    assert result.num_accepted == 0
    assert result.tokens[0] != 3


def test_random_stream_is_reproducible() -> None:
    probs = torch.softmax(torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1)), -1)
    draft = torch.tensor([1, 2, 3, 4])
    runs = [
        [verify_sampled(draft, probs[:4], probs, g).tokens for _ in range(50)]
        for g in (torch.Generator().manual_seed(9), torch.Generator().manual_seed(9))
    ]
    assert runs[0] == runs[1]

"""The one place logits become a distribution, and the one sampler: exact, documented draws."""

from __future__ import annotations

import pytest
import torch

from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams, argmax_rows, process_logits, sample_from

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])  # [1, vocab]


def test_greedy_is_one_hot_on_the_argmax() -> None:
    probs = process_logits(LOGITS, SamplingParams())
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_temperature_scales_the_logits() -> None:
    probs = process_logits(LOGITS, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, (LOGITS / 0.5).softmax(-1))
    assert probs.dtype == torch.float32


def test_top_k_then_top_p_keep_the_documented_tokens() -> None:
    top2 = process_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert (top2[0] > 0).tolist() == [True, True, False, False, False]
    assert float(top2.sum()) == pytest.approx(1.0)
    full = LOGITS.softmax(-1)[0]
    # The smallest prefix (by probability) whose mass reaches top_p.
    p = float(full[0] + full[1]) - 1e-4
    nucleus = process_logits(LOGITS, SamplingParams(temperature=1.0, top_p=p))
    assert (nucleus[0] > 0).tolist() == [True, True, False, False, False]
    # A top_p below fp32's resolution still keeps the most likely token (never NaN).
    tiny = process_logits(LOGITS, SamplingParams(temperature=1.0, top_p=1e-45))
    assert tiny.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_top_p_on_a_wide_flat_row_keeps_what_a_full_sort_keeps() -> None:
    """A row whose nucleus holds thousands of tokens (the search widens past its first 256):
    the kept set is the full sort's, token for token, in every row."""
    logits = torch.randn(3, 49_152, generator=torch.Generator().manual_seed(0))
    for top_p in (0.5, 0.9, 0.99):
        kept = process_logits(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0
        probs = logits.softmax(-1)
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        keep_sorted = (ordered.cumsum(-1) - ordered) < top_p
        expected = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        assert int(kept.sum(-1).min()) > 256
        assert torch.equal(kept, expected)


def test_sample_from_draws_one_uniform_per_row() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 3.0]])  # last unnormalised
    generator = torch.Generator().manual_seed(5)
    tokens = sample_from(probs, generator)
    assert tokens[0] == 1 and tokens[1] in (0, 2) and tokens[2] == 2
    reference = torch.Generator().manual_seed(5)
    torch.rand(3, 1, generator=reference)
    assert torch.equal(generator.get_state(), reference.get_state())


def test_sample_from_never_draws_a_zero_probability_token() -> None:
    probs = torch.tensor([0.3, 0.0, 0.7, 0.0]).repeat(2000, 1)  # [2000, 4]
    tokens = sample_from(probs, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) <= {0, 2}
    # 2000 draws of a 0.3 / 0.7 coin: the share of token 0 lies within 5 standard errors
    # (false-failure odds below 1e-6).
    share = float((tokens == 0).float().mean())
    assert abs(share - 0.3) < 5 * (0.3 * 0.7 / 2000) ** 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"temperature": 101.0},
        {"top_p": 0.0},
        {"top_k": -1},
        {"max_tokens": 0},
        {"stop": ("",)},
        {"seed": 2**63},
    ],
)
def test_bad_parameters_are_one_line_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidParameterError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_argmax_rows_is_torchs_argmax_ties_included() -> None:
    """The fast CPU path (numpy) picks what torch.argmax picks: the first maximum, also
    with ties and infinities, in fp32 and in bf16 (torch's own path)."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 4, (64, 300), generator=generator).float()  # many ties
    logits[5, 7] = float("inf")
    logits[6] = float("-inf")
    for rows in (logits, logits.to(torch.bfloat16), logits[:, ::2], logits[:1]):
        assert argmax_rows(rows) == rows.argmax(-1).tolist()

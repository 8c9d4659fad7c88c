"""Verification: which drafted tokens the target keeps, and which token it adds.

Glossary (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling"):

- draft tokens      x_1..x_k proposed by the drafter, each sampled from ``draft_probs``
                    (the paper's q) after the same temperature/top-k/top-p as the target.
- target probs      the target's processed distributions at the k + 1 positions (the
                    paper's p); row i scores x_{i+1}, row k is the bonus position.
- accepted          the longest prefix of draft tokens that passes: x_i is kept with
                    probability min(1, target(x_i) / draft(x_i)).
- recovered token   on the first rejection, a sample from the residual
                    normalise(max(0, target - draft)) at that position.
- bonus token       after all k are accepted, a sample from target row k.

Every step emits ``accepted + 1`` tokens, and the emitted sequence has exactly the
target's distribution (the rejection-sampling argument of the papers).

Greedy (temperature 0) is exact matching: keep x_i while it equals the target's argmax,
then emit the target's argmax. No random numbers are drawn.

Random numbers, in order, when sampling: k uniforms for the k acceptance tests (drawn
together, even when an early rejection makes the later ones unused, so the stream's
consumption per step depends only on k), then one uniform for the recovered or bonus
token. Drafters without probabilities (``draft_probs is None``) are treated as one-hot at
their token: the acceptance probability is target(x_i) and the residual is the target
with x_i removed; this keeps the output exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.sampling import sample_from

__all__ = ["VerifyResult", "verify_greedy", "verify_sampled"]


@dataclass(frozen=True)
class VerifyResult:
    num_accepted: int  # draft tokens kept
    tokens: tuple[int, ...]  # emitted: the accepted draft tokens, then a recovered or bonus token
    bonus: bool  # every draft token was accepted, so the last token is the bonus token

    @property
    def path(self) -> tuple[int, ...]:
        """Chunk indices of the accepted tokens (index 0, the pending token, excluded):
        ``1..num_accepted`` for a chain; a tree's result overrides it."""
        return tuple(range(1, self.num_accepted + 1))


def verify_greedy(
    draft_tokens: Tensor,  # [k] int64
    target_logits: Tensor,  # [k + 1, vocab]
) -> VerifyResult:
    """Temperature 0: keep draft tokens while they equal the target's argmax."""
    target_argmax = target_logits.argmax(-1)  # [k + 1]
    k = draft_tokens.shape[0]
    matches = (draft_tokens == target_argmax[:k]).int()
    num_accepted = int(matches.cumprod(0).sum()) if k else 0
    tokens = draft_tokens[:num_accepted].tolist() + [int(target_argmax[num_accepted])]
    return VerifyResult(num_accepted, tuple(tokens), num_accepted == k)


def verify_sampled(
    draft_tokens: Tensor,  # [k] int64
    draft_probs: Tensor | None,  # [k, vocab] fp32, or None for a drafter without probabilities
    target_probs: Tensor,  # [k + 1, vocab] fp32, already processed
    generator: torch.Generator | None,
) -> VerifyResult:
    """Leviathan/Chen rejection sampling over a chain draft (see the module docstring)."""
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    target_at_draft = target_probs[rows, draft_tokens]  # [k]
    if draft_probs is None:
        draft_at_draft = torch.ones(k)
    else:
        draft_at_draft = draft_probs[rows, draft_tokens]  # [k]
    uniforms = torch.rand(k, generator=generator)
    # u < target/draft written without the division: a zero draft probability cannot
    # make a NaN (it accepts iff the target gives the token any mass).
    passed = (uniforms * draft_at_draft < target_at_draft).int()
    num_accepted = int(passed.cumprod(0).sum()) if k else 0
    if num_accepted == k:
        last = sample_from(target_probs[k], generator)
    else:
        target_row = target_probs[num_accepted]
        if draft_probs is None:
            residual = target_row.clone()
            residual[draft_tokens[num_accepted]] = 0.0
        else:
            residual = (target_row - draft_probs[num_accepted]).clamp_min(0.0)
        if not residual.sum() > 0:
            # Only reachable through rounding when target == draft (rejection then has
            # probability ~0); the target row is the correct limit.
            residual = target_row
        last = sample_from(residual, generator)
    tokens = draft_tokens[:num_accepted].tolist() + [int(last)]
    return VerifyResult(num_accepted, tuple(tokens), num_accepted == k)

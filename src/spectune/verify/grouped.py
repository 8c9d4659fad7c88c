"""Chunked verification: verify a long chain draft group by group, stop at the first reject.

One-pass verification forwards ``[pending, d_1..d_k]`` at once. Chunked verification
splits the k draft tokens into m groups and forwards them one group at a time, so a
draft that fails early never pays the target for its tail:

    forward 1: [pending, d_1 .. d_{b1-1}]   rows 0..b1-1: verify d_1..d_b1
    forward 2: [d_b1 .. d_{b2-1}]           rows b1..b2-1: verify d_{b1+1}..d_b2   (if all kept)
    ...
    forward m: [d_{b(m-1)} .. d_k]          the last forward adds row k (the bonus row)

The same k + 1 tokens are forwarded in total when nothing is rejected, split over m
passes; each pass pays the forward's fixed cost (on a CPU, reading all weights once), so
chunking pays only where the verification-cost curve rises steeply with the chunk length
(``chunked_pays``).

Exactness: the emitted tokens are those of ``verify.verify_sampled`` / ``verify_greedy``
for the same target distributions and random numbers. The random-number order is the
one-pass order: all k acceptance uniforms are drawn first (before the first group is
verified, even if a rejection leaves some unused), then one uniform for the recovered or
bonus token; each token's test uses its own uniform, compared in the same fp32 arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from spectune.control.chunking import group_bounds
from spectune.sampling import SamplingParams, process_logits, sample_from
from spectune.verify.chain import VerifyResult

__all__ = ["verify_in_groups"]


def verify_in_groups(
    draft_tokens: Tensor,  # [k] int64
    draft_probs: Tensor | None,  # [k, vocab], or None (one-hot drafts)
    score: Callable[[int, int], Tensor],  # (start, end) -> target logits rows [end - start, vocab]
    groups: int,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Verify group by group; ``score`` runs the target forward for rows [start, end) (it is
    called with consecutive ranges, so it can append to a cache)."""
    k = draft_tokens.shape[0]
    bounds = group_bounds(k, groups) if k else [0]
    uniforms = None if params.greedy else torch.rand(k, generator=generator)  # one-pass order
    tokens = draft_tokens.tolist()
    start = 0
    for j, end in enumerate(bounds):
        last_group = j == len(bounds) - 1
        logits = score(start, end + 1 if last_group else end)  # [rows, vocab]
        if params.greedy:
            target_argmax = logits.argmax(-1).tolist()
            for i in range(start, end):
                if tokens[i] != target_argmax[i - start]:
                    return VerifyResult(i, (*tokens[:i], target_argmax[i - start]), False)
            if last_group:
                return VerifyResult(k, (*tokens, target_argmax[k - start]), True)
        else:
            assert uniforms is not None
            target_probs = process_logits(logits, params)  # [rows, vocab]
            if not math.isfinite(float(target_probs.sum())):
                raise FloatingPointError("the target produced non-finite probabilities")
            rows = torch.arange(end - start)
            group_tokens = draft_tokens[start:end]
            target_at = target_probs[rows, group_tokens]  # [group]
            draft_at = (
                torch.ones(end - start)
                if draft_probs is None
                else draft_probs[start:end][rows, group_tokens]
            )
            passed = (uniforms[start:end] * draft_at < target_at).tolist()
            for offset, ok in enumerate(passed):
                if not ok:
                    i = start + offset
                    residual = _residual(target_probs[offset], draft_probs, draft_tokens, i)
                    last = int(sample_from(residual, generator))
                    return VerifyResult(i, (*tokens[:i], last), False)
            if last_group:
                bonus = int(sample_from(target_probs[k - start], generator))
                return VerifyResult(k, (*tokens, bonus), True)
        start = end
    raise AssertionError("unreachable: the last group always returns")


def _residual(
    target_row: Tensor,  # [vocab]
    draft_probs: Tensor | None,  # [k, vocab]
    draft_tokens: Tensor,  # [k]
    i: int,
) -> Tensor:
    """The recovered token's distribution, computed exactly as ``verify_sampled`` does."""
    if draft_probs is None:
        residual = target_row.clone()
        residual[draft_tokens[i]] = 0.0
    else:
        residual = (target_row - draft_probs[i]).clamp_min(0.0)
    if not residual.sum() > 0:
        residual = target_row
    return residual

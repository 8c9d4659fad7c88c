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
(``spectune.control.chunking.chunked_pays``).

Exactness: each group is verified by the chain verifier's own group step
(``spectune.verify.chain.verify_group_greedy`` / ``verify_group_sampled``), so the emitted
tokens are those of one pass for the same target distributions and random numbers. The
random numbers are the one-pass ones (``spectune.verify.chain.verify_uniforms``): all k
acceptance uniforms (with draft probabilities) and the k + 1 target uniforms are taken
before the first group is verified, even if a rejection leaves some unused; each token's
test uses its own uniform.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from spectune.control.chunking import group_bounds
from spectune.sampling import SamplingParams, argmax_rows
from spectune.verify.chain import (
    VerifyResult,
    target_distribution,
    verify_group_greedy,
    verify_group_sampled,
    verify_uniforms,
)

__all__ = ["verify_in_groups"]


def verify_in_groups(
    draft_tokens: Tensor,  # [k] int64
    draft_probs: Tensor | None,  # [k, vocab], or None (one-hot drafts)
    score: Callable[[int, int], Tensor],  # (start, end) -> target logits rows [end - start, vocab]
    groups: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    target_uniforms: Tensor | None = None,  # [k + 1]: the request's position numbers
) -> VerifyResult:
    """Verify group by group (one group: one pass); ``score`` runs the target forward for
    chunk rows [start, end) and returns their raw logits (it is called with consecutive
    ranges, so it can append to a cache)."""
    k = draft_tokens.shape[0]
    bounds = group_bounds(k, groups) if k else [0]
    drawn = None
    if not params.greedy:  # one-pass order
        drawn = verify_uniforms(k, draft_probs is not None, k + 1, generator, target_uniforms)
    tokens = draft_tokens.tolist()
    start = 0
    for j, end in enumerate(bounds):
        last = j == len(bounds) - 1
        logits = score(start, end + 1 if last else end)  # [rows, vocab]
        if drawn is None:
            result = verify_group_greedy(tokens, argmax_rows(logits), start, end, last)
        else:
            target_probs = target_distribution(logits, params)  # [rows, vocab]
            result = verify_group_sampled(
                draft_tokens, draft_probs, target_probs, *drawn, start, end, last
            )
        if result is not None:
            return result
        start = end
    raise AssertionError("unreachable: the last group always returns")

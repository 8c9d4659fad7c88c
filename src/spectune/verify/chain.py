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

The acceptance test (``passes``), the residual after a rejection (``residual``) and the
distribution a recovered token is drawn from (``recovered_from``) are written here once;
grouped verification (``spectune.verify.grouped``) and tree verification
(``spectune.verify.tree``) call them, so every verifier decides in the same arithmetic.
A one-pass chain is grouped verification with one group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.sampling import SamplingParams, argmax_rows, process_logits, sample_from

__all__ = [
    "VerifyResult",
    "chain_result",
    "passes",
    "recovered_from",
    "residual",
    "target_distribution",
    "verify_greedy",
    "verify_group_greedy",
    "verify_group_sampled",
    "verify_sampled",
]


@dataclass(frozen=True)
class VerifyResult:
    num_accepted: int  # draft tokens kept (a tree: nodes on the accepted path)
    tokens: tuple[int, ...]  # emitted: the accepted draft tokens, then a recovered or bonus token
    bonus: bool  # the path ended with every draft token kept, so the last token is the bonus
    # Chunk indices of the accepted tokens (index 0, the pending token, excluded):
    # ``1..num_accepted`` for a chain; a tree's accepted nodes (node index + 1).
    path: tuple[int, ...]


def chain_result(num_accepted: int, tokens: tuple[int, ...], bonus: bool) -> VerifyResult:
    """A chain's verdict: its accepted path is the first ``num_accepted`` chunk rows."""
    return VerifyResult(num_accepted, tokens, bonus, tuple(range(1, num_accepted + 1)))


def target_distribution(
    target_logits: Tensor,  # [rows, vocab], raw
    params: SamplingParams,
) -> Tensor:
    """[rows, vocab]: the target's processed distributions (the same processing as the
    draft's); non-finite values raise ``FloatingPointError`` rather than verify garbage."""
    target_probs = process_logits(target_logits, params)
    if not math.isfinite(float(target_probs.sum())):
        raise FloatingPointError("the target produced non-finite probabilities")
    return target_probs


def passes(
    uniforms: Tensor,  # [n] fp32
    draft_at: Tensor,  # [n]: draft(x_i) (1 for a drafter without probabilities)
    target_at: Tensor,  # [n]: target(x_i)
) -> Tensor:
    """[n] bool: the acceptance test u < target / draft, written without the division so a
    zero draft probability cannot make a NaN (it accepts iff the target gives the token any
    mass). Every verifier compares in this fp32 arithmetic, so they decide identically."""
    return uniforms * draft_at < target_at


def residual(
    target_row: Tensor,  # [vocab]
    draft_row: Tensor | None,  # [vocab], None: a drafter without probabilities (one-hot)
    token: int,  # the rejected draft token
) -> Tensor:
    """[vocab], unnormalised: max(0, target - draft) after ``token`` was rejected; for a
    one-hot draft, the target with ``token`` removed."""
    if draft_row is None:
        out = target_row.clone()
        out[token] = 0.0
        return out
    return (target_row - draft_row).clamp_min(0.0)


def recovered_from(residual_row: Tensor, target_row: Tensor) -> Tensor:
    """What the recovered token is drawn from: the residual, or the target row where the
    residual has no mass. That is only reachable through rounding when target == draft
    (rejection then has probability ~0), and the target row is the correct limit."""
    return residual_row if residual_row.sum() > 0 else target_row


def verify_group_greedy(
    draft_tokens: list[int],  # all k draft tokens
    target_argmax: list[int],  # the target's argmax at chunk rows start .. (end or k)
    start: int,
    end: int,  # draft tokens start..end-1 are verified here
    last: bool,  # the final group: row ``end - start`` is the bonus row (end == k)
) -> VerifyResult | None:
    """Greedy matching over draft tokens [start, end); None when they all match and more
    groups follow."""
    for i in range(start, end):
        if draft_tokens[i] != target_argmax[i - start]:
            return chain_result(i, (*draft_tokens[:i], target_argmax[i - start]), False)
    if last:
        return chain_result(end, (*draft_tokens, target_argmax[end - start]), True)
    return None


def verify_group_sampled(
    draft_tokens: Tensor,  # [k] int64, all k draft tokens
    draft_probs: Tensor | None,  # [k, vocab], or None (one-hot drafts)
    target_probs: Tensor,  # [end - start (+ 1 for the last group), vocab], processed
    uniforms: Tensor,  # [k]: the acceptance uniforms of the whole draft, drawn up front
    start: int,
    end: int,  # draft tokens start..end-1 are verified here
    last: bool,  # the final group: its extra row is the bonus row (end == k)
    generator: torch.Generator | None,
) -> VerifyResult | None:
    """Rejection sampling over draft tokens [start, end); None when all pass and more groups
    follow. Draws one uniform (the recovered or the bonus token) when it decides."""
    rows = torch.arange(end - start)
    group_tokens = draft_tokens[start:end]
    target_at = target_probs[rows, group_tokens]  # [group]
    draft_at = (
        torch.ones(end - start)
        if draft_probs is None
        else draft_probs[start:end][rows, group_tokens]
    )
    tokens = draft_tokens.tolist()
    for offset, ok in enumerate(passes(uniforms[start:end], draft_at, target_at).tolist()):
        if not ok:
            i = start + offset
            target_row = target_probs[offset]
            draft_row = None if draft_probs is None else draft_probs[i]
            dist = recovered_from(residual(target_row, draft_row, tokens[i]), target_row)
            return chain_result(i, (*tokens[:i], int(sample_from(dist, generator))), False)
    if last:
        bonus = int(sample_from(target_probs[end - start], generator))
        return chain_result(end, (*tokens, bonus), True)
    return None


def verify_greedy(
    draft_tokens: Tensor,  # [k] int64
    target_logits: Tensor,  # [k + 1, vocab]
) -> VerifyResult:
    """Temperature 0: keep draft tokens while they equal the target's argmax."""
    k = draft_tokens.shape[0]
    result = verify_group_greedy(draft_tokens.tolist(), argmax_rows(target_logits), 0, k, last=True)
    assert result is not None  # the last group always decides
    return result


def verify_sampled(
    draft_tokens: Tensor,  # [k] int64
    draft_probs: Tensor | None,  # [k, vocab] fp32, or None for a drafter without probabilities
    target_probs: Tensor,  # [k + 1, vocab] fp32, already processed
    generator: torch.Generator | None,
) -> VerifyResult:
    """Leviathan/Chen rejection sampling over a chain draft (see the module docstring)."""
    k = draft_tokens.shape[0]
    uniforms = torch.rand(k, generator=generator)
    result = verify_group_sampled(
        draft_tokens, draft_probs, target_probs, uniforms, 0, k, True, generator
    )
    assert result is not None  # the last group always decides
    return result

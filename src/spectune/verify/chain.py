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

Random numbers, when sampling, come in two kinds (``verify_uniforms``):

- acceptance uniforms: k, one per acceptance test, drawn together from the request's
  generator (even when an early rejection leaves later ones unused, so the stream's
  consumption per step depends only on k); only when the draft carries probabilities.
- target uniforms: one per chunk row, keyed by the output position that row decides
  (``spectune.sampling.PositionStream``); the token the target chooses itself at row i,
  a recovered or a bonus token, is its inverse-CDF draw at row i's number. Without a
  position stream (a direct call) the k + 1 are drawn from the generator after the
  acceptance uniforms.

Drafters without probabilities (``draft_probs is None``) are one-hot proposals: the
target draws its own token at the row's target uniform, and the draft token is kept
exactly when it is that token. This departs from the papers' form (accept with
probability target(x_i), else draw from the target with x_i removed) in how the random
numbers are used, not in the joint law: the token is kept with probability target(x_i),
and a rejected row emits a draw of the target conditioned on not being x_i, which is
the papers' residual. Its point: every emitted token is the target's own draw at its
position's number, so with a position stream the output is the same at any K (plain
decoding included) and in any batch.

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

from spectune.sampling import SamplingParams, argmax_rows, process_logits, sample_with

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
    "verify_uniforms",
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


def verify_uniforms(
    num_tests: int,  # acceptance tests the draft may need (a chain: k; a tree: its nodes)
    with_probs: bool,  # the draft carries probabilities
    rows: int,  # output positions the step may decide (a chain: k + 1; a tree: depth + 1)
    generator: torch.Generator | None,
    target_uniforms: Tensor | None,  # [rows]: the request's position numbers, or None
) -> tuple[Tensor | None, Tensor]:
    """A sampled verification's random numbers, in the documented order (module
    docstring): the acceptance uniforms ([num_tests], None without draft probabilities),
    then the target uniforms ([rows]; drawn from ``generator`` unless given)."""
    acceptance = torch.rand(num_tests, generator=generator) if with_probs else None
    if target_uniforms is None:
        target_uniforms = torch.rand(rows, generator=generator)
    elif target_uniforms.shape != (rows,):
        raise ValueError(f"target uniforms must be [{rows}], got {list(target_uniforms.shape)}")
    return acceptance, target_uniforms


def verify_group_sampled(
    draft_tokens: Tensor,  # [k] int64, all k draft tokens
    draft_probs: Tensor | None,  # [k, vocab], or None (one-hot drafts)
    target_probs: Tensor,  # [end - start (+ 1 for the last group), vocab], processed
    uniforms: Tensor | None,  # [k]: the acceptance uniforms, drawn up front; None: one-hot
    target_uniforms: Tensor,  # [k + 1]: row i's number for the token the target draws
    start: int,
    end: int,  # draft tokens start..end-1 are verified here
    last: bool,  # the final group: its extra row is the bonus row (end == k)
) -> VerifyResult | None:
    """Rejection sampling over draft tokens [start, end); None when all pass and more groups
    follow. A token the target draws at chunk row i uses ``target_uniforms[i]``."""
    tokens = draft_tokens.tolist()
    if draft_probs is None or uniforms is None:
        # One-hot drafts: the target's own draw at each row; the draft token is kept when
        # it is that draw (module docstring).
        rows = end - start + (1 if last else 0)
        drawn = sample_with(target_probs[:rows], target_uniforms[start : start + rows]).tolist()
        for offset in range(end - start):
            if drawn[offset] != tokens[start + offset]:
                i = start + offset
                return chain_result(i, (*tokens[:i], drawn[offset]), False)
        return chain_result(end, (*tokens, drawn[end - start]), True) if last else None
    rows_range = torch.arange(end - start)
    group_tokens = draft_tokens[start:end]
    target_at = target_probs[rows_range, group_tokens]  # [group]
    draft_at = draft_probs[start:end][rows_range, group_tokens]  # [group]
    for offset, ok in enumerate(passes(uniforms[start:end], draft_at, target_at).tolist()):
        if not ok:
            i = start + offset
            target_row = target_probs[offset]
            dist = recovered_from(residual(target_row, draft_probs[i], tokens[i]), target_row)
            recovered = int(sample_with(dist, target_uniforms[i]))
            return chain_result(i, (*tokens[:i], recovered), False)
    if last:
        bonus = int(sample_with(target_probs[end - start], target_uniforms[end]))
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
    target_uniforms: Tensor | None = None,  # [k + 1]: the request's position numbers
) -> VerifyResult:
    """Leviathan/Chen rejection sampling over a chain draft (see the module docstring)."""
    k = draft_tokens.shape[0]
    uniforms, target_uniforms = verify_uniforms(
        k, draft_probs is not None, k + 1, generator, target_uniforms
    )
    result = verify_group_sampled(
        draft_tokens, draft_probs, target_probs, uniforms, target_uniforms, 0, k, True
    )
    assert result is not None  # the last group always decides
    return result

"""Reduced draft vocabularies: a draft that can only propose the N most frequent tokens.

The draft's output layer covers N token ids (``vocab_subset``); its processed distribution
over those N is scattered into the full vocabulary with zeros elsewhere. Verification
stays lossless: rejection sampling (``spectune.verify.chain``) is exact for *any* draft
distribution q as long as the drafted token was sampled from q and q is what the verifier
sees. A token outside the subset has q = 0, so it is never drafted, and the residual
max(0, p - q) / Z gives such tokens exactly their target probability when a draft token
is rejected. Only acceptance suffers (by the target mass outside the subset), never the
output distribution; ``tests/test_reduced_vocab.py`` checks this with a chi-square test.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectune.models.base import LanguageModel
from spectune.models.vocab import TargetVocabModel

__all__ = ["scatter_to_vocab", "top_token_subset", "vocab_coverage"]


def scatter_to_vocab(
    probs: Tensor,  # [..., num_draft_tokens] a distribution over the subset
    vocab_subset: Tensor,  # [num_draft_tokens] int64 token ids, distinct
    vocab_size: int,
) -> Tensor:
    """The same distribution over the full vocabulary: [..., vocab_size], zero off-subset."""
    full = probs.new_zeros(*probs.shape[:-1], vocab_size)
    full[..., vocab_subset] = probs
    return full


def top_token_subset(counts: Tensor, size: int, always: list[int]) -> Tensor:
    """The ``size`` most frequent ids (counts: [vocab]), with ``always`` (e.g. EOS) included.

    Returned sorted ascending, so the subset's order does not depend on tie-breaking.
    """
    if not 0 < size <= counts.shape[0]:
        raise ValueError(f"a reduced vocabulary needs 1..{counts.shape[0]} tokens, got {size}")
    boosted = counts.clone().double()
    boosted[always] = float("inf")  # special tokens must stay draftable
    chosen = boosted.topk(size).indices
    return torch.sort(chosen).values


def vocab_coverage(subset: Tensor | None, model: LanguageModel | None = None) -> str:
    """How a drafter covers the target's vocabulary, as a clause ('' for all of it): a
    reduced vocabulary (``subset``, [num_draft_tokens]), or a draft ``model`` whose own
    vocabulary differs from the target's (``TargetVocabModel``)."""
    if subset is not None:
        return f", reduced vocabulary of {subset.numel()} tokens"
    if isinstance(model, TargetVocabModel):
        own, target = model.draft_vocab_size, model.info.vocab_size
        return (
            f", drafting over the {min(own, target)} token ids shared by its vocabulary "
            f"({own}) and the target's ({target})"
        )
    return ""

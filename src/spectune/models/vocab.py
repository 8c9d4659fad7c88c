"""A draft model seen through the target's vocabulary (pairing within llama.cpp's tolerance).

Draft and target may differ by a few vocabulary rows (``spectune.drafters.pairing`` allows 128, as
llama.cpp does, once the shared token strings are checked equal). The verifier needs the
draft distribution over the target's ids, so ``TargetVocabModel`` cuts or pads the draft's
logits to the target's width before any drafter sees them:

- a wider draft loses its extra rows: its distribution is renormalised over the shared
  range, and every drafter samples from that, so it never proposes an id the target lacks;
- a narrower draft gains rows of ``-inf`` logits: probability zero for ids only the target
  has, which the verifier emits only as recovered tokens, at the target's rate. When the
  target emits such an id, the draft reads it as its pad token (it has no embedding for
  it): its guesses after it are poorer, never wrong, since every guess is verified.

Either way the draft probabilities handed to the verifier are exactly the distribution the
draft tokens were sampled from, so rejection sampling stays lossless (Leviathan et al.
2023 only ask that the draft distribution be the one sampled from);
``tests/test_vocab_pairing.py`` checks it with a chi-square test. Cutting logits rather than
probabilities keeps one place for the rule: chain, tree and batched drafters all read
``forward``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from spectune.models.base import KVCache, LanguageModel, ModelInfo, ModelOutput, takes_tree_masks

__all__ = ["TargetVocabModel", "fit_logits_to_vocab"]


def fit_logits_to_vocab(
    logits: Tensor,  # [..., draft_vocab]
    vocab_size: int,
) -> Tensor:
    """[..., vocab_size]: the first ``vocab_size`` columns, padded with ``-inf`` when fewer."""
    width = logits.shape[-1]
    if width >= vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - width), float("-inf"))
    return torch.cat((logits, pad), dim=-1)


class TargetVocabModel:
    """``model`` with logits over ``vocab_size`` ids (the target's); everything else as is.

    ``info.vocab_size`` reports the target's width; ``draft_vocab_size`` the model's own.
    Caches are the wrapped model's, so rollback and tree compaction work unchanged.
    """

    def __init__(self, model: LanguageModel, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.model = model
        self.draft_vocab_size = model.info.vocab_size
        self.tree_masks = takes_tree_masks(model)
        pad = model.info.pad_token_id
        # What the draft reads for an id it lacks (only a narrower draft meets one).
        self._unknown = pad if pad is not None and 0 <= pad < self.draft_vocab_size else 0
        self._info = replace(model.info, vocab_size=vocab_size)

    @property
    def info(self) -> ModelInfo:
        return self._info

    def new_cache(self, batch_size: int = 1, capacity: int | None = None) -> KVCache:
        return self.model.new_cache(batch_size, capacity)

    def forward(
        self,
        tokens: Tensor,  # [batch, chunk] int64
        cache: KVCache,
        *,
        positions: Tensor | None = None,  # [batch, chunk] int64
        chunk_mask: Tensor | None = None,  # [batch, chunk, chunk] bool
        last_only: bool = False,
    ) -> ModelOutput:
        if self.draft_vocab_size < self._info.vocab_size:
            tokens = tokens.masked_fill(tokens >= self.draft_vocab_size, self._unknown)
        out = self.model.forward(
            tokens, cache, positions=positions, chunk_mask=chunk_mask, last_only=last_only
        )
        return ModelOutput(fit_logits_to_vocab(out.logits, self._info.vocab_size), out.hidden)

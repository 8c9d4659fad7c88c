"""Model drafter: a small LM with its own KV cache proposes tokens autoregressively."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.drafters.reduced import scatter_to_vocab
from spectune.models.base import KVCache, LanguageModel
from spectune.sampling import SamplingParams, process_logits, sample_from

__all__ = ["ModelDrafter", "SyncedModelCache", "choose_token"]


def choose_token(
    probs: Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Tensor:
    """probs: [..., vocab] -> [...]; greedy takes the argmax and draws no random number."""
    return probs.argmax(-1) if params.greedy else sample_from(probs, generator)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SyncedModelCache:
    """A draft model's KV cache kept in step with the committed context.

    ``ingested`` lists the tokens the cache holds. ``sync`` keeps the longest prefix shared
    with the context (a rejection rolls the cache back to it) and runs the rest forward in
    one chunk. Shared by the chain and tree drafters.
    """

    model: LanguageModel
    cache: KVCache | None
    ingested: list[int]

    def reset(self) -> None:
        self.cache = None
        self.ingested = []

    def _cache(self) -> KVCache:
        if self.cache is None:
            self.cache = self.model.new_cache()
        return self.cache

    def _sync(self, context: Sequence[int]) -> Tensor:
        """Bring the cache to ``context`` and return the logits for the next token. [vocab]"""
        cache = self._cache()
        keep = common_prefix(self.ingested, context)
        if keep == len(context):
            keep -= 1  # re-run the last token: its logits are needed again
        cache.truncate(keep)
        pending = list(context[keep:])
        self.ingested = list(context)
        out = self.model.forward(torch.tensor([pending]), cache)
        return out.logits[0, -1]


class ModelDrafter(SyncedModelCache):
    """Drafts with a ``LanguageModel``.

    On each proposal it syncs its cache to the committed context, then samples ``k``
    tokens. The k-th token is sampled but not ingested; if it is accepted it is ingested
    at the start of the next proposal, together with the target's bonus token.
    """

    def __init__(
        self,
        model: LanguageModel,
        *,
        name: str | None = None,
        vocab_subset: Tensor | None = None,  # [num_draft_tokens] int64
    ) -> None:
        """``vocab_subset``: the model's logits cover only these token ids (a reduced draft
        vocabulary, see ``spectune.drafters.reduced``); drafts map back to full ids."""
        self.model = model
        self.vocab_subset = vocab_subset
        self.name = name or f"model:{model.info.name}"
        self.cache = None
        self.ingested = []

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        if num_tokens <= 0:
            return Draft(
                torch.zeros(0, dtype=torch.long), torch.zeros(0, self.model.info.vocab_size)
            )
        logits = self._sync(context)
        tokens: list[Tensor] = []
        probs: list[Tensor] = []
        for i in range(num_tokens):
            row = process_logits(logits, params)  # [vocab] or [num_draft_tokens]
            choice = choose_token(row, params, generator)
            token = choice if self.vocab_subset is None else self.vocab_subset[choice]
            tokens.append(token)
            probs.append(
                row
                if self.vocab_subset is None
                else scatter_to_vocab(row, self.vocab_subset, self.model.info.vocab_size)
            )
            if i + 1 < num_tokens:
                out = self.model.forward(token.view(1, 1), self._cache())
                self.ingested.append(int(token))
                logits = out.logits[0, -1]
        return Draft(torch.stack(tokens), torch.stack(probs))

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Nothing to do eagerly: the next ``propose`` syncs the cache to ``context``."""

    @torch.inference_mode()
    def score_sequence(
        self, tokens: Sequence[int], target_hidden: Tensor | None, params: SamplingParams
    ) -> Tensor:
        """One causal pass over ``tokens[:-1]``: [len(tokens) - 1, vocab] draft distributions."""
        cache = self.model.new_cache(capacity=len(tokens))
        logits = self.model.forward(torch.tensor([list(tokens[:-1])]), cache).logits[0]
        probs = process_logits(logits, params)
        if self.vocab_subset is None:
            return probs
        return scatter_to_vocab(probs, self.vocab_subset, self.model.info.vocab_size)

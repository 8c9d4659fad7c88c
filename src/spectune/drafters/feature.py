"""Feature drafter: an EAGLE-style head that drafts from the target's own hidden states.

The engine hands every drafter the target hidden states its verification pass computed
(``commit(context, TargetFeatures)``); this drafter keeps them. To draft after a context
of L tokens, the head needs, for each position t in 1..L-1, the token there and the
target state h[t - 1] that predicted it: all known, since the engine's features cover
every committed position but the pending last one. The head's output at position L - 1
stands in for h[L - 1] and yields the first draft token; each further draft token feeds
the head's own output back (see ``spectune.models.feature_head``).

Head cache: slot s holds position s + 1. Slots computed from the head's own outputs (draft
positions) are never kept across proposals: the next proposal rolls the cache back to the
slots built from real target states and recomputes from there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.drafters.model import choose_token, common_prefix
from spectune.drafters.reduced import scatter_to_vocab
from spectune.errors import DrafterError
from spectune.models.feature_head import FeatureHead
from spectune.models.kv_cache import StaticKVCache
from spectune.sampling import SamplingParams, process_logits

__all__ = ["FeatureDrafter"]


class FeatureDrafter:
    """Drafts a chain with an EAGLE-style head over the target's hidden states (see the
    module docstring); ``FeatureTreeDrafter`` drafts trees with the same head."""

    def __init__(
        self,
        head: FeatureHead,
        vocab_subset: Tensor | None,  # [num_draft_tokens] int64, or None: full vocabulary
        *,
        name: str = "feature",
    ) -> None:
        self.head = head.eval()
        self.vocab_subset = vocab_subset
        self.vocab_size = head.cfg.target_vocab_size
        self.name = name
        self.cache: StaticKVCache | None = None
        self.target_hidden: Tensor | None = None  # [capacity, hidden]
        self.known = 0  # positions 0..known-1 have target states
        self.slot_tokens: list[int] = []  # tokens at positions 1.. held by real-state slots

    def reset(self) -> None:
        self.cache = None
        self.target_hidden = None
        self.known = 0
        self.slot_tokens = []

    @torch.inference_mode()
    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Store the target states of the committed positions the step just verified."""
        if features is None:
            return
        capacity = self.head.cfg.max_context
        if self.target_hidden is None:
            self.target_hidden = torch.zeros(capacity, self.head.cfg.hidden_size)
        end = features.start + features.hidden.shape[0]
        if end > capacity:
            raise DrafterError(f"context of {end} tokens exceeds the head's {capacity}")
        self.target_hidden[features.start : end] = self.head.target_input(features.hidden).float()
        self.known = end

    def _probs(self, probs: Tensor) -> Tensor:
        """[num_draft_tokens] -> [vocab]: zeros outside a reduced vocabulary."""
        if self.vocab_subset is None:
            return probs
        return scatter_to_vocab(probs, self.vocab_subset, self.vocab_size)

    def sync(self, context: Sequence[int]) -> Tensor:
        """Bring the head's cache to ``context`` (at least 2 tokens) from real target states
        and return the head's output at the last position, which stands in for the target
        state h[L - 1]: [hidden]. Afterwards the cache holds exactly the real-state slots
        (positions 1..L-1); anything a draft appends past them is dropped by the next sync.
        """
        length = len(context)
        if self.target_hidden is None or self.known < length - 1:
            raise DrafterError("the feature drafter needs the target's hidden states")
        if self.cache is None:
            self.cache = self.head.new_cache(self.head.cfg.max_context)
        cache = self.cache
        # Keep the slots built from real states that still match the context; always
        # recompute the last position (its output is the first draft's input).
        keep = min(common_prefix(self.slot_tokens, context[1:]), length - 2)
        cache.truncate(min(keep, cache.length()))
        keep = cache.length()
        positions = range(keep + 1, length)
        tokens = torch.tensor([[context[p] for p in positions]])  # [1, n]
        prev = self.target_hidden[keep : length - 1][None]  # [1, n, hidden] h[p - 1]
        self.slot_tokens = list(context[1:length])
        features: Tensor = self.head(tokens, prev, cache)[0, -1]
        return features

    def vocab_logits(self, features: Tensor) -> Tensor:
        """features: [..., hidden] -> [..., vocab]; -inf outside a reduced vocabulary."""
        logits = self.head.logits(features)  # [..., num_draft_tokens]
        if self.vocab_subset is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.vocab_subset] = logits
        return full

    @torch.inference_mode()
    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        empty = Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, self.vocab_size))
        if num_tokens <= 0 or len(context) < 2:
            return empty  # position 0 has no head input: nothing to draft from yet
        # 1. Bring the head to the context (real target states only).
        features = self.sync(context)
        cache = self.cache
        assert cache is not None

        # 2. Draft autoregressively, feeding the head's own features back. Rows are over
        #    the full vocabulary (zeros outside a reduced one), as a tree drafts them.
        drafted: list[Tensor] = []
        probs: list[Tensor] = []
        for i in range(num_tokens):
            row = process_logits(self.vocab_logits(features), params)  # [vocab]
            token = choose_token(row, params, generator)
            drafted.append(token)
            probs.append(row)
            if i + 1 < num_tokens:
                features = self.head(token.view(1, 1), features.view(1, 1, -1), cache)[0, -1]
        return Draft(torch.stack(drafted).long(), torch.stack(probs))

    @torch.inference_mode()
    def score_sequence(
        self, tokens: Sequence[int], target_hidden: Tensor | None, params: SamplingParams
    ) -> Tensor:
        """[len(tokens) - 1, vocab]. Row i uses the target's real h[i - 1]: the distribution of
        a *first* draft token. Row 0 (no head input) is uniform."""
        if target_hidden is None:
            raise DrafterError("the feature drafter needs the target's hidden states")
        n = len(tokens) - 1
        rows = torch.full((n, self.vocab_size), 1.0 / self.vocab_size)
        if n < 2:
            return rows
        ids = torch.tensor([list(tokens[1:n])])  # [1, n - 1] positions 1..n-1
        prev = self.head.target_input(target_hidden[None, : n - 1].float())  # [1, n - 1, hidden]
        features = self.head(ids, prev)[0]  # [n - 1, hidden]
        probs = process_logits(self.head.logits(features), params)
        rows[1:] = probs if self.vocab_subset is None else self._probs(probs)
        return rows

"""N-gram (prompt-lookup) drafter: copy what followed the latest earlier match.

Useful when the output repeats its input (summaries, code edits, retrieval answers).
No model, no probabilities: the verifier treats its tokens as one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["NgramDrafter"]


class NgramDrafter:
    """Prompt lookup: proposes what followed the latest earlier match of the context's tail."""

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParameterError("n-gram sizes need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = "ngram"
        self.model_free = True  # a lookup: plain steps may check its guesses (ModelFree)

    def fresh(self) -> NgramDrafter:
        """A copy with the same n-gram sizes (it keeps no state anyway)."""
        return NgramDrafter(max_ngram=self.max_ngram, min_ngram=self.min_ngram)

    def describe(self) -> str:
        return "ngram (prompt lookup)"

    def reset(self) -> None:
        """Stateless: every proposal searches the context afresh."""

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        tokens = self.lookup(context, num_tokens)
        return Draft(torch.tensor(tokens, dtype=torch.long), None)

    def lookup(self, context: Sequence[int], num_tokens: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the context's tail.

        Longer tails are tried first (they predict better); the match must end before
        the tail itself starts so the continuation is real text.
        """
        if num_tokens <= 0:
            return []
        seq = list(context)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == tail:
                    follow = seq[start + n : start + n + num_tokens]
                    if follow:
                        return follow
        return []

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Stateless."""

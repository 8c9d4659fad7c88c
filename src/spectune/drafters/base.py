"""The drafter contract: propose tokens, then hear what the target committed.

A drafter is any source of guesses. It receives the committed context (prompt and
output so far) on every call and keeps whatever private state it likes in sync with it;
the engine never reaches into a drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.sampling import SamplingParams

__all__ = ["Drafter", "SequenceScorer", "TargetFeatures"]


@dataclass(frozen=True)
class TargetFeatures:
    """Target hidden states the engine already computed, handed to drafters that read them.

    ``hidden[i]`` is the target's last hidden state at context position ``start + i``
    (the state that predicted the token at ``start + i + 1``).
    """

    start: int
    hidden: Tensor  # [n, hidden_size]


@runtime_checkable
class Drafter(Protocol):
    """A source of draft tokens: ``propose`` guesses, ``commit`` hears what was kept."""

    name: str

    def reset(self) -> None:
        """Forget all per-request state (a new request begins)."""
        ...

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """Propose up to ``num_tokens`` tokens to follow ``context`` (prompt + output so far).

        Sampling drafters draw from the processed distribution (``params``), using
        ``generator``, and return those exact probabilities.
        """
        ...

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Hear the committed context after a step (accepted tokens plus the target's token).

        ``features`` carries the target hidden states computed by that step, for drafters
        that read them; others ignore it.
        """
        ...


@runtime_checkable
class SequenceScorer(Protocol):
    """A drafter that can give, in one teacher-forced pass, the distribution it would draft
    from after every prefix of a sequence (what ``spectune select`` needs to estimate the
    acceptance rate without a decoding loop). Drafters without it are scored by proposing
    one token per prefix."""

    def score_sequence(
        self,
        tokens: Sequence[int],
        target_hidden: Tensor | None,  # [len(tokens) - 1, hidden]: h[i] predicted token i + 1
        params: SamplingParams,
    ) -> Tensor:
        """[len(tokens) - 1, vocab]: row i is the draft distribution for token i + 1."""
        ...

"""Hybrid drafting: per step, the suffix draft or the model draft, chosen by measured acceptance.

Each step the suffix drafter is asked first (it costs no forward). Its proposal has a
**score** (expected accepted tokens under the corpus frequencies, ``spectune.drafters.
suffix``); what it is worth is learned from what the target kept:

- ``suffix_calibration`` = running mean of accepted / score over suffix-drafted steps
  (starts at 1: take the corpus at its word);
- ``model_accepted`` = running mean of accepted tokens over model-drafted steps (starts
  at 1 token per step, so a corpus guess worth less than one token goes to the model from
  the start, and the model's rate gets measured even where the corpus always has a guess).

**Rule**: draft from the suffix source when it proposes something and
``suffix_calibration * score >= model_accepted``, else from the model. Ties go to the
suffix draft (it costs nothing to make). Running means are exponential with weight
``1 - decay`` on the newest step. The counters are shared by a drafter's ``fresh`` copies,
so a server learns across requests.

Either draft is verified as it is (the model's with its probabilities, the suffix's
one-hot), and the choice depends only on steps already verified, so decoding stays
lossless. "Accepted" is the number of leading draft tokens the target kept: a rejected
token is never the token emitted in its place (the residual has no mass there), so
comparing the draft with the committed context counts it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spectune.draft import Draft
from spectune.drafters.base import Drafter, TargetFeatures
from spectune.drafters.suffix import SuffixDrafter
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["HybridDrafter", "SourceStats"]


@dataclass
class SourceStats:
    """What each source's drafts turned out to be worth (module docstring)."""

    decay: float = 0.9
    suffix_calibration: float = 1.0  # accepted per unit of suffix score
    model_accepted: float = 1.0  # accepted tokens per model-drafted step
    suffix_steps: int = 0
    model_steps: int = 0
    suffix_accepted_total: int = 0
    model_accepted_total: int = 0

    def prefers_suffix(self, score: float) -> bool:
        return self.suffix_calibration * score >= self.model_accepted

    def observe(self, source: str, accepted: int, score: float) -> None:
        keep = self.decay
        if source == "suffix":
            self.suffix_steps += 1
            self.suffix_accepted_total += accepted
            ratio = accepted / score if score > 0 else 0.0
            self.suffix_calibration = keep * self.suffix_calibration + (1 - keep) * ratio
        else:
            self.model_steps += 1
            self.model_accepted_total += accepted
            self.model_accepted = keep * self.model_accepted + (1 - keep) * accepted


@dataclass(frozen=True)
class _Pending:
    source: str  # "suffix" | "model"
    start: int  # context length when the draft was made
    tokens: tuple[int, ...]
    score: float


class HybridDrafter:
    """The suffix draft where it is worth more than the model's measured rate (module doc)."""

    def __init__(
        self,
        suffix: SuffixDrafter,
        model: Drafter,
        stats: SourceStats | None = None,
        *,
        name: str | None = None,
    ) -> None:
        if not 0 <= (stats or SourceStats()).decay < 1:
            raise InvalidParameterError("the hybrid's decay must be in [0, 1)")
        self.suffix = suffix
        self.model = model
        self.stats = stats or SourceStats()
        self.name = name or f"{suffix.name}+{model.name}"
        self._pending: _Pending | None = None

    def reset(self) -> None:
        self.suffix.reset()
        self.model.reset()
        self._pending = None

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        proposal = self.suffix.suggest(context, num_tokens)
        if proposal.tokens and self.stats.prefers_suffix(proposal.score):
            draft = Draft(torch.tensor(proposal.tokens, dtype=torch.long), None)
            source = "suffix"
        else:
            draft = self.model.propose(context, num_tokens, params, generator)
            source = "model"
        tokens = tuple(int(t) for t in draft.tokens.tolist())
        self._pending = _Pending(source, len(context), tokens, proposal.score)
        return draft

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.tokens and len(context) > pending.start:
            kept = context[pending.start : pending.start + len(pending.tokens)]
            accepted = 0
            for drafted, committed in zip(pending.tokens, kept, strict=False):
                if drafted != committed:
                    break
                accepted += 1
            self.stats.observe(pending.source, accepted, pending.score)
        self.suffix.commit(context, features)
        self.model.commit(context, features)

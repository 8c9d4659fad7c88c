"""Suffix drafter: the most frequent continuation of the context's longest earlier match.

SuffixDecoding (Oliaro et al., 2024) without a model: the context's tail is looked up in
three sources, and each source's match proposes its most frequent continuation:

- this request's own prompt and output so far (``scan_matches``; what n-gram lookup sees);
- a corpus index loaded from disk (``SuffixIndex``: the target's own earlier answers);
- in a server, the outputs of earlier requests (``HistoryStore``, bounded, shared by every
  request's drafter; a request's output is filed when its drafter is reset or dropped).

**Proposal length rule** (as SuffixDecoding's). A match of ``m`` tokens whose
occurrences continue with token sequence ``c`` gives ``c``'s corpus probability
``p_j`` = (occurrences continuing with c[:j]) / (all occurrences), a product of the
per-token frequencies along the most frequent path. The draft keeps tokens while

    j <= min(K, floor(factor * m + offset))   and   p_j >= min_prob

(defaults factor 1, offset 0, min_prob 0.1): a short or rarely seen match proposes few
tokens, a long, consistently continued one up to the K the policy asks for. Its
**score** is ``sum_j p_j``, the expected number of accepted tokens if the corpus
frequencies were the target's. Of the three sources' proposals the highest score wins
(ties: the longer match, then the order above).

No probabilities: the verifier treats each token as one-hot (as for n-gram), so decoding
stays lossless at any temperature.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.drafters.suffix_index import (
    SEP,
    HistoryStore,
    Match,
    SuffixIndex,
    TokenArray,
    continuation,
    scan_matches,
)
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["SuffixDrafter", "SuffixProposal", "SuffixSettings"]

_keys = itertools.count()  # history keys: one per request drafted


@dataclass(frozen=True)
class SuffixSettings:
    """The proposal-length rule's constants (module docstring) and the longest match."""

    max_depth: int = 32
    factor: float = 1.0  # proposed tokens allowed per matched token
    offset: float = 0.0  # ... plus this many
    min_prob: float = 0.1  # stop before a prefix's corpus probability falls below this

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise InvalidParameterError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.factor < 0 or not 0 <= self.min_prob <= 1:
            raise InvalidParameterError("suffix drafting needs factor >= 0 and 0 <= min_prob <= 1")

    def length_cap(self, match_length: int, requested: int) -> int:
        return max(0, min(requested, math.floor(self.factor * match_length + self.offset)))


@dataclass(frozen=True)
class SuffixProposal:
    """One source's guess: tokens, each prefix's corpus probability, and where it came from."""

    tokens: list[int]
    probs: list[float]  # probs[j]: corpus probability of tokens[: j + 1]
    match_length: int
    source: str  # "context" | "corpus" | "history" | "none"

    @property
    def score(self) -> float:
        """Expected accepted tokens under the corpus frequencies."""
        return float(sum(self.probs))


NO_PROPOSAL = SuffixProposal([], [], 0, "none")


def propose_from(
    match: Match | None, requested: int, settings: SuffixSettings, source: str
) -> SuffixProposal:
    """Apply the proposal-length rule to one source's match."""
    if match is None:
        return NO_PROPOSAL
    cap = settings.length_cap(match.length, requested)
    if cap == 0:
        return NO_PROPOSAL
    tokens, probs = continuation(match, cap, settings.min_prob)
    return SuffixProposal(tokens, probs, match.length, source) if tokens else NO_PROPOSAL


@dataclass
class _Request:
    """One request's token stream (prompt + output, then SEP), grown in place."""

    stream: TokenArray = field(default_factory=lambda: np.full(256, SEP, dtype=np.int32))
    length: int = 0
    prompt_length: int | None = None
    key: int = field(default_factory=lambda: next(_keys))

    def sync(self, context: Sequence[int]) -> None:
        """Append what ``context`` adds (the engine only ever extends a request's context;
        a shorter one means a new request without a reset, so start over)."""
        if len(context) < self.length:
            self.length = 0
        if len(context) + 1 > len(self.stream):
            grown = np.full(2 * len(context) + 1, SEP, dtype=np.int32)
            grown[: self.length] = self.stream[: self.length]
            self.stream = grown
        self.stream[self.length : len(context)] = context[self.length :]
        self.stream[len(context)] = SEP
        self.length = len(context)
        if self.prompt_length is None:
            self.prompt_length = self.length

    def output(self) -> TokenArray:
        return self.stream[self.prompt_length or 0 : self.length].copy()


def _file_output(history: HistoryStore, request: _Request) -> None:
    """File a finished request's output in the shared history (called at reset or when the
    drafter is dropped; holds no reference to the drafter)."""
    if request.length > (request.prompt_length or 0):
        history.add(request.key, request.output())


class SuffixDrafter:
    """Drafts the most frequent continuation of the context's longest match (module doc).

    ``index``: a corpus index (None: none). ``history``: the server's store of earlier
    outputs, shared between this drafter's ``fresh`` copies (None: none).
    """

    def __init__(
        self,
        index: SuffixIndex | None = None,
        history: HistoryStore | None = None,
        settings: SuffixSettings | None = None,
        *,
        name: str = "suffix",
    ) -> None:
        self.index = index
        self.history = history
        self.settings = settings or SuffixSettings()
        self.name = name
        self.last: SuffixProposal = NO_PROPOSAL  # the latest proposal (hybrid drafting reads it)
        self._filer: weakref.finalize[[HistoryStore, _Request], SuffixDrafter] | None = None
        self._request = self._new_request()

    def _new_request(self) -> _Request:
        request = _Request()
        if self.history is not None:
            # Files the output once: at the next reset, or when the drafter is dropped
            # (a server makes one drafter per request and drops it when the request ends).
            self._filer = weakref.finalize(self, _file_output, self.history, request)
        return request

    def fresh(self) -> SuffixDrafter:
        """A drafter for a new request sharing this one's index and history."""
        return self.with_history(self.history)

    def with_history(self, history: HistoryStore | None) -> SuffixDrafter:
        """This drafter's index and settings over ``history`` (a server's store)."""
        return SuffixDrafter(self.index, history, self.settings, name=self.name)

    def reset(self) -> None:
        if self._filer is not None:
            self._filer()  # runs at most once
        self._request = self._new_request()
        self.last = NO_PROPOSAL

    def suggest(self, context: Sequence[int], num_tokens: int) -> SuffixProposal:
        """The best source's proposal for ``context`` (at most ``num_tokens`` tokens)."""
        request = self._request
        request.sync(context)
        if num_tokens <= 0 or request.length == 0:
            return NO_PROPOSAL
        depth = self.settings.max_depth
        tail = request.stream[max(0, request.length - depth) : request.length].tolist()
        own = request.stream[: request.length + 1]
        candidates = [
            propose_from(
                scan_matches(own, tail, depth, limit=request.length - 1),
                num_tokens,
                self.settings,
                "context",
            )
        ]
        if self.index is not None:
            candidates.append(
                propose_from(self.index.find(tail), num_tokens, self.settings, "corpus")
            )
        if self.history is not None:
            candidates.append(
                propose_from(self.history.find(tail, depth), num_tokens, self.settings, "history")
            )
        # max keeps the first of equal keys: ties go to the longer match, then source order
        return max(candidates, key=lambda p: (p.score, p.match_length))

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        self.last = self.suggest(context, num_tokens)
        return Draft(torch.tensor(self.last.tokens, dtype=torch.long), None)

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        self._request.sync(context)

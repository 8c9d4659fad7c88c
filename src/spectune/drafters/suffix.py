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

**A tree of the top continuations** (``width > 1``; ``--draft suffix --tree-width W
--tree-nodes N``). From the same match, each node's children are the ``width`` tokens that
most often followed its path, and nodes enter the tree best first by path probability
(the ``p_j`` above, now of each path) until ``nodes`` are in (``continuation_tree``). The
same length rule holds per path: depth at most ``min(K, floor(factor * m + offset))``,
path probability at least ``min_prob``. The **score** becomes the sum of the path
probabilities over all nodes, the expected accepted tokens of the tree under the corpus
frequencies. ``width == 1`` is the chain. Sources compete by score as for chains.

No probabilities: the verifier treats each token as one-hot (as for n-gram), chain or tree
(``spectune.verify.tree``: deterministic candidates are exact), so decoding stays lossless
at any temperature.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch

from spectune.draft import MAX_TREE_NODES, Draft
from spectune.drafters import suffix_kernels
from spectune.drafters.base import Drafter, TargetFeatures, TreeShape
from spectune.drafters.suffix_history import HistoryStore
from spectune.drafters.suffix_index import (
    MAX_OCCURRENCES,
    SEP,
    Match,
    SuffixIndex,
    TokenArray,
    continuation,
    continuation_tree,
    scan_matches,
)
from spectune.errors import InvalidParameterError
from spectune.sampling import SamplingParams

__all__ = ["HistoryUser", "SuffixDrafter", "SuffixProposal", "SuffixSettings"]

_keys = itertools.count()  # history keys: one per request drafted


@dataclass(frozen=True)
class SuffixSettings:
    """The proposal-length rule's constants (module docstring), the longest match, and the
    tree's shape (``width`` 1: a chain)."""

    max_depth: int = 32
    factor: float = 1.0  # proposed tokens allowed per matched token
    offset: float = 0.0  # ... plus this many
    min_prob: float = 0.1  # stop before a prefix's corpus probability falls below this
    width: int = 1  # children per tree node (1: one chain)
    nodes: int = 16  # a tree's node budget (width > 1 only)

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise InvalidParameterError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.factor < 0 or not 0 <= self.min_prob <= 1:
            raise InvalidParameterError("suffix drafting needs factor >= 0 and 0 <= min_prob <= 1")
        if not 1 <= self.width <= 8 or not 1 <= self.nodes <= MAX_TREE_NODES:
            raise InvalidParameterError(
                f"a suffix tree needs width in [1, 8] and nodes in [1, {MAX_TREE_NODES}], "
                f"got width {self.width}, nodes {self.nodes}"
            )

    @property
    def tree(self) -> bool:
        return self.width > 1

    def length_cap(self, match_length: int, requested: int) -> int:
        return max(0, min(requested, math.floor(self.factor * match_length + self.offset)))

    @functools.cache  # noqa: B019 (frozen and small: one entry per K asked for)
    def caps(self, requested: int) -> npt.NDArray[np.int64]:
        """``length_cap`` for every match length 0..max_depth (the compiled lookups)."""
        return np.array(
            [self.length_cap(length, requested) for length in range(self.max_depth + 1)],
            dtype=np.int64,
        )


@dataclass(frozen=True)
class SuffixProposal:
    """One source's guess: tokens (a chain, or a tree's nodes with ``parents``), each
    path's corpus probability, and where it came from."""

    tokens: list[int]
    probs: list[float]  # probs[j]: corpus probability of the path ending at token j
    match_length: int
    source: str  # "context" | "corpus" | "history" | "none"
    parents: list[int] | None = None  # a tree's parents (Draft.parents), None for a chain

    @property
    def score(self) -> float:
        """Expected accepted tokens under the corpus frequencies."""
        return float(sum(self.probs))

    @property
    def first_prob(self) -> float:
        """Corpus probability that the first draft token is right (a tree: any first-level
        node)."""
        if self.parents is None:
            return self.probs[0] if self.probs else 0.0
        return float(
            sum(p for p, parent in zip(self.probs, self.parents, strict=True) if parent < 0)
        )

    def draft(self) -> Draft:
        """The proposal as a one-hot draft (no probabilities)."""
        tokens = torch.tensor(self.tokens, dtype=torch.long)
        if self.parents is None:
            return Draft(tokens, None)
        return Draft(tokens, None, torch.tensor(self.parents, dtype=torch.long))


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
    if settings.tree:
        tree = continuation_tree(match, cap, settings.min_prob, settings.width, settings.nodes)
        if not tree.tokens:
            return NO_PROPOSAL
        return SuffixProposal(tree.tokens, tree.probs, match.length, source, tree.parents)
    tokens, probs = continuation(match, cap, settings.min_prob)
    return SuffixProposal(tokens, probs, match.length, source) if tokens else NO_PROPOSAL


def _chain_proposal(chain: suffix_kernels.Chain | None, source: str) -> SuffixProposal:
    """A compiled chain lookup as a proposal (``propose_from`` for chains)."""
    if chain is None:
        return NO_PROPOSAL
    length, tokens, probs, _ = chain
    return SuffixProposal(tokens, probs, length, source) if tokens else NO_PROPOSAL


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


@runtime_checkable
class HistoryUser(Protocol):
    """A drafter that can draft from (and file its outputs in) a server's store of earlier
    outputs (suffix drafting, and a hybrid through its suffix source)."""

    def with_history(self, history: HistoryStore | None) -> Drafter: ...


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
        suffix_kernels.warm_up()  # once per process: not on the first drafting step
        self.index = index
        self.history = history
        self.settings = settings or SuffixSettings()
        self.name = name
        self.model_free = True  # a lookup: plain steps may check its guesses (ModelFree)
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

    def tree(self, shape: TreeShape) -> SuffixDrafter:
        """The token-tree form (``with_tree`` at ``shape``)."""
        return self.with_tree(shape.width, shape.nodes, shape.min_path_prob)

    def describe(self) -> str:
        corpus = "no corpus" if self.index is None else f"{self.index.header.tokens} corpus tokens"
        return f"{self.name} (suffix lookup, {corpus})"

    def with_tree(self, width: int, nodes: int, min_prob: float = 0.0) -> SuffixDrafter:
        """This drafter proposing trees of ``width`` children per node and ``nodes`` nodes
        (module docstring; the target must take tree attention masks), pruned at the
        stricter of its ``min_prob`` and this one."""
        settings = dataclasses.replace(
            self.settings,
            width=width,
            nodes=nodes,
            min_prob=max(self.settings.min_prob, min_prob),
        )
        base = self.name.split(" tree", 1)[0]
        name = base if width == 1 else f"{base} tree{width}x{nodes}"
        return SuffixDrafter(self.index, self.history, settings, name=name)

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
        settings = self.settings
        depth = settings.max_depth
        tail = request.stream[max(0, request.length - depth) : request.length]
        own = request.stream[: request.length + 1]
        if settings.tree:
            candidates = [
                propose_from(
                    scan_matches(own, tail, depth, limit=request.length - 1),
                    num_tokens,
                    settings,
                    "context",
                )
            ]
            if self.index is not None:
                candidates.append(
                    propose_from(self.index.find(tail), num_tokens, settings, "corpus")
                )
            if self.history is not None:
                found = self.history.find(tail, depth)
                candidates.append(propose_from(found, num_tokens, settings, "history"))
        else:  # chains: match and continuation in one compiled call per source
            caps = settings.caps(num_tokens)
            candidates = [
                _chain_proposal(
                    suffix_kernels.scan_chain(
                        own,
                        tail,
                        depth,
                        request.length - 1,
                        caps,
                        settings.min_prob,
                        MAX_OCCURRENCES,
                    ),
                    "context",
                )
            ]
            if self.index is not None:
                candidates.append(
                    _chain_proposal(self.index.chain(tail, caps, settings.min_prob), "corpus")
                )
            if self.history is not None:
                history = self.history.chain(tail, depth, caps, settings.min_prob)
                candidates.append(_chain_proposal(history, "history"))
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
        return self.last.draft()

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        self._request.sync(context)

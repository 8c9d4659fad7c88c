"""Feature drafter: an EAGLE-style head that drafts from the target's own hidden states.

The engine hands every drafter the target hidden states its verification pass computed
(``commit(context, TargetFeatures)``); this drafter keeps them. To draft after a context
of L tokens, the head needs, for each position t in 1..L-1, the token there and the
target state h[t - 1] that predicted it: all known, since the engine's features cover
every committed position but the pending last one. The head's output at position L - 1
stands in for h[L - 1] and yields the first draft token; each further draft token feeds
the head's own output back (see ``spectune.models.feature_head``).

Written once, for rows (as the model drafter, ``spectune.drafters.model``):
``FeatureDrafter`` is the source (the head, its vocabulary mapping, its name);
``open(rows, capacity)`` gives a ``FeatureRows``, one head cache whose rows are the
engine's rows, drafting every requesting row in one head forward per draft step.
``FeatureDrafter``'s own ``Drafter`` methods drive a one-row set
(``spectune.drafters.base.OneRow``), so a sequence drafts the same tokens alone or in a
batch.

Token trees (EAGLE-2's setting: Li et al. 2024): ``tree(shape)`` gives a
``FeatureTreeDrafter``, below. The tree grows exactly as a model's does
(``spectune.drafters.tree``); only scoring differs. A node's head input is its token plus
the head output of its parent (the root's parent output is the head's estimate of the
target state at the last committed position, ``FeatureRows.sync``), so a node can be
scored once its parent has been. One head forward scores the nodes to expand next together
with their ancestors, under the same tree mask and positions a target uses (the head's
slot s holds position s + 1, so the root sits at the last real-state slot).

Compaction: none, on purpose. The head's slots past the real-state ones were computed from
its own estimates; once the target has verified the accepted path, its real states are
known and the next ``sync`` recomputes those slots from them (what EAGLE does too), which
is more accurate than keeping the estimates. The target's cache is still compacted by the
engine.

Head cache: slot s holds position s + 1. Slots computed from the head's own outputs (draft
positions) are never kept across proposals: the next proposal rolls the row back to the
slots built from real target states and recomputes from there. Rows need different
numbers of catch-up positions (ragged): the chunk is padded after each row's real
positions, and every row is truncated back to its own length afterwards (causal
attention keeps real positions blind to the padding). A one-row set never pads.

Random numbers: each sequence draws from its own generator in the order draft token 1,
2, ..., k, so a sequence drafts the same tokens alone or batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor

from spectune.draft import CONTEXT_FULL, Draft, Refusal
from spectune.drafters.base import (
    DraftRequest,
    OneRow,
    RowDrafter,
    TargetFeatures,
    TreeShape,
    propose_ready,
)
from spectune.drafters.model import choose_token, common_prefix
from spectune.drafters.reduced import scatter_to_vocab, vocab_coverage
from spectune.drafters.tree import GrowingTree, TreeGrower, chunk_layout
from spectune.errors import DrafterError
from spectune.models.base import KVCache
from spectune.models.feature_head import FeatureHead
from spectune.models.kv_cache import StaticKVCache
from spectune.models.rows import ragged_forward, row_view
from spectune.sampling import SamplingParams, process_logits

__all__ = ["FeatureDrafter", "FeatureRows", "FeatureTreeDrafter"]

NEEDS_STATES = "the feature drafter needs the target's hidden states"


class FeatureDrafter(RowDrafter):
    """Drafts a chain with an EAGLE-style head over the target's hidden states (see the
    module docstring): the source of ``FeatureRows``s, and itself a one-sequence
    ``Drafter`` over a one-state. ``FeatureTreeDrafter`` drafts trees with the same
    head."""

    def __init__(
        self,
        head: FeatureHead,
        vocab_subset: Tensor | None,  # [num_draft_tokens] int64, or None: full vocabulary
        *,
        name: str = "feature",
    ) -> None:
        self.head = head.eval()
        self.vocab_subset = vocab_subset
        # A subset in ascending id order breaks argmax ties as the full vocabulary does.
        self._ascending = vocab_subset is None or bool((vocab_subset.diff() > 0).all())
        self.vocab_size = head.cfg.target_vocab_size
        self.name = name
        self.row: OneRow[FeatureRows] = OneRow(lambda: self.open(1))

    def open(self, rows: int, capacity: int | None = None, slack: int = 0) -> FeatureRows:
        """A row set over ``rows`` rows of ``capacity`` tokens each (None, or more than the
        head's context: the head's context); ``slack``: slots padding may write past a row."""
        return FeatureRows(self, rows, capacity, slack)

    def fresh(self) -> FeatureDrafter:
        """The same head, vocabulary and name; its own (empty) per-request state."""
        return FeatureDrafter(self.head, self.vocab_subset, name=self.name)

    def tree(self, shape: TreeShape) -> FeatureTreeDrafter:
        """The token-tree form: the same head growing trees of ``shape``."""
        return FeatureTreeDrafter(self, shape)

    def describe(self) -> str:
        return f"{self.name} (feature head{vocab_coverage(self.vocab_subset)})"

    def full_vocab(self, probs: Tensor) -> Tensor:
        """[..., num_draft_tokens] -> [..., vocab]: zeros outside a reduced vocabulary."""
        if self.vocab_subset is None:
            return probs
        return scatter_to_vocab(probs, self.vocab_subset, self.vocab_size)

    def greedy_token(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """features: [hidden] -> (the head's argmax token, a target id; the head's own
        probability of it): the argmax of ``vocab_logits`` (its lowest id among ties),
        taken over the reduced vocabulary alone where its ids ascend, without the
        full-vocabulary rows a greedy draft does not need."""
        if self._ascending:  # [num_draft_tokens], mapped to target ids below
            logits, ids = self.head.logits(features).float(), self.vocab_subset
        else:  # [vocab]
            logits, ids = self.vocab_logits(features).float(), None
        best = logits.argmax(-1)
        sure = logits.softmax(-1)[best]
        return (best if ids is None else ids[best]), sure

    def vocab_logits(self, features: Tensor) -> Tensor:
        """features: [..., hidden] -> [..., vocab]; -inf outside a reduced vocabulary."""
        logits = self.head.logits(features)  # [..., num_draft_tokens]
        if self.vocab_subset is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.vocab_subset] = logits
        return full

    @torch.inference_mode()
    def score_sequence(
        self, tokens: Sequence[int], target_hidden: Tensor | None, params: SamplingParams
    ) -> Tensor:
        """[len(tokens) - 1, vocab]. Row i uses the target's real h[i - 1]: the distribution of
        a *first* draft token. Row 0 (no head input) is uniform."""
        if target_hidden is None:
            raise DrafterError(NEEDS_STATES)
        n = len(tokens) - 1
        rows = torch.full((n, self.vocab_size), 1.0 / self.vocab_size)
        if n < 2:
            return rows
        ids = torch.tensor([list(tokens[1:n])])  # [1, n - 1] positions 1..n-1
        prev = self.head.target_input(target_hidden[None, : n - 1].float())  # [1, n - 1, hidden]
        features = self.head(ids, prev)[0]  # [n - 1, hidden]
        rows[1:] = self.full_vocab(process_logits(self.head.logits(features), params))
        return rows


class FeatureRows:
    """A feature head drafting every requesting row in one forward per draft step."""

    def __init__(self, source: FeatureDrafter, rows: int, capacity: int | None, slack: int) -> None:
        self.source = source
        self.head = source.head
        self.name = source.name
        cfg = self.head.cfg
        capacity = cfg.max_context if capacity is None else min(capacity, cfg.max_context)
        self.cache = self.head.new_cache(capacity, batch_size=rows)
        self.limit = capacity - slack  # padding writes up to ``slack`` slots past a row
        self.slack = slack
        # [rows, capacity, hidden]: row r's target state h[t] at [r, t]
        self.target_hidden = torch.zeros(rows, capacity, cfg.hidden_size)
        self.known = [0] * rows  # positions 0..known-1 have target states
        self.slot_tokens: list[list[int]] = [[] for _ in range(rows)]

    @torch.inference_mode()
    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        self.free(row)
        self.commit(row, prompt, features)
        end = len(prompt) - 1  # the last position is always recomputed by a proposal
        if end >= 2 and self.known[row] >= end and end <= self.limit:
            # Prefill now so later steps catch up a few positions per row, not a prompt.
            with row_view(self.cache, row, row + 1) as view:
                prev = self.target_hidden[row, : end - 1]  # [end - 1, hidden]
                self.forward(torch.tensor([list(prompt[1:end])]), prev[None], view)
            self.slot_tokens[row] = list(prompt[1:end])

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        self.cache.copy_row(src, dst)
        self.target_hidden[dst] = self.target_hidden[src]
        self.known[dst] = self.known[src]
        self.slot_tokens[dst] = self.slot_tokens[src]
        self.free(src)

    def free(self, row: int) -> None:
        self.cache.truncate(0, row)
        self.known[row] = 0
        self.slot_tokens[row] = []

    @torch.inference_mode()
    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Store the target states of the committed positions the step verified."""
        if features is None:
            return
        end = features.start + features.hidden.shape[0]
        if end > self.target_hidden.shape[1]:
            self.known[row] = min(self.known[row], features.start)
            return  # past the head's capacity: the proposal reports the row as full
        self.target_hidden[row, features.start : end] = self.head.target_input(
            features.hidden
        ).float()
        self.known[row] = end

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        vocab = self.source.vocab_size

        def refuse(req: DraftRequest) -> Draft | Refusal | None:
            length = len(req.context)
            if req.k <= 0 or length < 2:  # position 0 has no head input: nothing to draft from
                return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab))
            if length + req.k > self.limit:
                return CONTEXT_FULL
            if self.known[req.row] < length - 1:
                return Refusal.error(NEEDS_STATES)
            return None

        return propose_ready(requests, refuse, lambda ready: self._draft(ready, num_rows))

    def forward(
        self,
        tokens: Tensor,  # [rows, w]
        prev: Tensor,  # [rows, w, hidden]
        view: KVCache,
        positions: Tensor | None = None,  # [rows, w]
        chunk_mask: Tensor | None = None,  # [rows, w, w]
    ) -> Tensor:
        """The head over rows of its cache -> features [rows, w, hidden]."""
        assert isinstance(view, StaticKVCache)  # the head's own cache, made above
        features: Tensor = self.head(
            tokens,
            prev.to(self.head.dtype),
            view,
            positions=positions,
            chunk_mask=chunk_mask,
        )
        return features

    @torch.inference_mode()
    def root(self, row: int, context: Sequence[int]) -> Tensor:
        """[hidden]: ``row`` brought to ``context`` from real target states (``sync``), and
        the head output at its last position (a tree's root); ``DrafterError`` where the
        target states are missing."""
        if self.known[row] < len(context) - 1:
            raise DrafterError(NEEDS_STATES)
        return self.sync({row: context}, row + 1)[row]

    def draft_start(self, row: int) -> int:
        """The slot where ``row``'s draft positions begin: after its real-state slots."""
        return len(self.slot_tokens[row])

    @torch.inference_mode()
    def forward_drafts(
        self,
        row: int,
        tokens: Tensor,  # [1, m] draft nodes
        prev: Tensor,  # [1, m, hidden] each node's parent's head output
        positions: Tensor,  # [1, m]
        chunk_mask: Tensor,  # [1, m, m]
    ) -> Tensor:
        """The head over draft nodes written from ``draft_start(row)`` (what was drafted
        there before is dropped) -> features [1, m, hidden]."""
        self.cache.truncate(self.draft_start(row), row)
        with row_view(self.cache, row, row + 1) as view:
            return self.forward(tokens, prev, view, positions, chunk_mask)

    @torch.inference_mode()
    def sync(self, contexts: dict[int, Sequence[int]], num_rows: int) -> dict[int, Tensor]:
        """Bring each row to its context (at least 2 tokens, whose states are known) from
        real target states; returns row -> the head output at the last position (stands in
        for h[L - 1]) [hidden]. Afterwards a row's cache holds exactly its real-state slots
        (positions 1..L-1); anything a draft appends past them is dropped by the next sync."""
        pending: dict[int, tuple[int, list[int]]] = {}  # row -> (first position, tokens)
        for row, context in contexts.items():
            length = len(context)
            keep = min(common_prefix(self.slot_tokens[row], context[1:]), length - 2)
            self.cache.truncate(min(keep, self.cache.length(row)), row)
            keep = self.cache.length(row)
            pending[row] = (keep + 1, list(context[keep + 1 : length]))
            self.slot_tokens[row] = list(context[1:length])
        hidden_size = self.head.cfg.hidden_size
        out: dict[int, Tensor] = {}
        offset = 0
        while len(out) < len(pending):
            longest = max(len(toks) - offset for _, toks in pending.values())
            width = min(self.slack, longest) if self.slack else longest
            tokens = torch.zeros(num_rows, width, dtype=torch.long)  # [rows, width]
            prev = torch.zeros(num_rows, width, hidden_size)  # [rows, width, hidden]
            used = [0] * num_rows
            for row, (first, toks) in pending.items():
                part = toks[offset : offset + width]
                if not part:
                    continue
                start = first + offset  # position of part[0]; its input state is h[start - 1]
                tokens[row, : len(part)] = torch.tensor(part, dtype=torch.long)
                prev[row, : len(part)] = self.target_hidden[row, start - 1 : start - 1 + len(part)]
                used[row] = len(part)
            head = partial(self.forward, tokens, prev)
            features = ragged_forward(self.cache, num_rows, used, head)
            for row, (_, toks) in pending.items():
                if used[row] and offset + used[row] == len(toks):
                    out[row] = features[row, used[row] - 1]
            offset += width
        return out

    @torch.inference_mode()
    def _draft(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft]:
        features = self.sync({r.row: r.context for r in requests}, num_rows)
        tokens: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        probs: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        sure: dict[int, list[Tensor]] = {r.row: [] for r in requests}  # greedy: own top prob
        hidden_size = self.head.cfg.hidden_size
        for step in range(max(r.k for r in requests)):
            for req in (r for r in requests if r.k > step):
                if req.params.greedy:  # one-hot rows say nothing: none (the verifier's
                    token, own = self.source.greedy_token(features[req.row])  # one-hot)
                    tokens[req.row].append(token)
                    sure[req.row].append(own)
                    continue
                logits = self.source.vocab_logits(features[req.row])
                row_probs = process_logits(logits, req.params)
                tokens[req.row].append(choose_token(row_probs, req.params, req.generator))
                probs[req.row].append(row_probs)  # [vocab]
            feeding = [r for r in requests if r.k > step + 1]
            if not feeding:
                break
            chunk = torch.zeros(num_rows, 1, dtype=torch.long)  # [rows, 1]
            fed = torch.zeros(num_rows, 1, hidden_size)  # [rows, 1, hidden]
            used = [0] * num_rows
            for req in feeding:
                chunk[req.row, 0] = tokens[req.row][-1]
                fed[req.row, 0] = features[req.row]
                used[req.row] = 1
            out = ragged_forward(self.cache, num_rows, used, partial(self.forward, chunk, fed))
            for req in feeding:
                features[req.row] = out[req.row, 0]
        return [
            Draft(
                torch.stack(tokens[r.row]).long(),
                torch.stack(probs[r.row]) if probs[r.row] else None,
                confidence=torch.stack(sure[r.row]) if sure[r.row] else None,
            )
            for r in requests
        ]


class FeatureTreeDrafter:
    """Drafts a token tree with a ``FeatureDrafter``'s head (the module docstring), the tree
    form of that drafter: its own one-row set, driven through the row set's tree verbs
    (``root``, ``draft_start``, ``forward_drafts``). It scores nodes (``NodeScorer``) for
    a ``TreeGrower``, which grows the tree."""

    def __init__(
        self, drafter: FeatureDrafter, shape: TreeShape | None = None, *, name: str | None = None
    ) -> None:
        self.source = drafter
        self.grower = TreeGrower(shape or TreeShape(), drafter.vocab_size)
        self.shape = self.grower.shape
        self.name = name or f"tree:{drafter.name}:w{self.shape.width}n{self.shape.nodes}"
        self.row: OneRow[FeatureRows] = OneRow(lambda: drafter.open(1))
        self._last: GrowingTree | None = None  # the last tree grown
        self._root_features: Tensor | None = None  # [hidden]
        self._node_features: dict[int, Tensor] = {}  # node -> [hidden] head output

    def describe(self) -> str:
        coverage = vocab_coverage(self.source.vocab_subset)
        return self.grower.describe(self.name, "feature-head", coverage)

    def reset(self) -> None:
        self.row.reset()
        self._last = None

    @torch.inference_mode()
    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        self._node_features = {}
        if len(context) < 2:  # position 0 has no head input: nothing to draft from yet
            num_tokens = 0
        self._last = None
        draft, self._last = self.grower.grow(self, context, num_tokens, params, generator)
        return draft

    def root_logits(self, context: Sequence[int]) -> Tensor:
        self.row.join(context)
        self._root_features = self.row.state.root(0, context)
        return self.source.vocab_logits(self._root_features)

    def _parent_features(self, tree: GrowingTree, node: int) -> Tensor:
        parent = tree.parents[node]
        if parent < 0:
            assert self._root_features is not None
            return self._root_features
        return self._node_features[parent]

    def score_nodes(self, tree: GrowingTree, nodes: list[int]) -> Tensor:
        state = self.row.state
        # The root sits at the last real-state slot (slot s holds position s + 1).
        chunk, positions, mask = chunk_layout(tree, nodes, state.draft_start(0) - 1)
        tokens = torch.tensor([[tree.tokens[n] for n in chunk]])  # [1, m]
        prev = torch.stack([self._parent_features(tree, n) for n in chunk])[None]  # [1, m, h]
        features = state.forward_drafts(0, tokens, prev, positions, mask)  # [1, m, h]
        for i, node in enumerate(chunk):
            self._node_features[node] = features[0, i]
        tree.chunk = chunk
        # The output rows only for the nodes asked about (the vocabulary matmul dominates).
        return self.source.vocab_logits(features[0, [chunk.index(n) for n in nodes]])

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Keep the target states of the accepted path; no draft-cache compaction (see the
        module docstring)."""
        self._last = None
        self.row.commit(context, features)

"""Batched drafting with a feature head: one head forward per draft step over the batch.

Per row it does exactly what ``FeatureDrafter`` does for one sequence (see
``spectune.drafters.feature``): the head's cache row holds only slots computed from real
target states (slot s = position s + 1); a proposal keeps the slots that still match the
context, recomputes the rest up to the last committed position from the target states the
engine handed over, then drafts k tokens feeding the head's own output back. Draft slots
are dropped by the next sync. Rows need different numbers of catch-up positions (ragged):
the chunk is padded after each row's real positions, and every row is truncated back to
its own length afterwards (causal attention keeps real positions blind to the padding).

Random numbers: each sequence draws from its own generator in the single-sequence order,
so a sequence drafts the same tokens alone or batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor

from spectune.draft import CONTEXT_FULL, Draft, Refusal
from spectune.drafters.base import TargetFeatures
from spectune.drafters.batched import DraftRequest, propose_ready
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.model import choose_token, common_prefix
from spectune.models.base import KVCache
from spectune.models.kv_cache import StaticKVCache
from spectune.models.rows import ragged_forward, row_view
from spectune.sampling import process_logits

__all__ = ["BatchFeatureDrafter"]


class BatchFeatureDrafter:
    """A feature head drafting every requesting row in one forward per draft step."""

    def __init__(self, drafter: FeatureDrafter, max_batch: int, capacity: int, slack: int) -> None:
        self.drafter = drafter  # the head and vocabulary; its own per-sequence state is unused
        self.head = drafter.head
        self.name = drafter.name
        cfg = self.head.cfg
        capacity = min(capacity, cfg.max_context)
        self.cache = self.head.new_cache(capacity, batch_size=max_batch)
        self.limit = capacity - slack  # padding writes up to ``slack`` slots past a row
        self.slack = slack
        # [max_batch, capacity, hidden]: row r's target state h[t] at [r, t]
        self.target_hidden = torch.zeros(max_batch, capacity, cfg.hidden_size)
        self.known = [0] * max_batch  # positions 0..known-1 have target states
        self.slot_tokens: list[list[int]] = [[] for _ in range(max_batch)]

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        self.free(row)
        self.commit(row, prompt, features)
        end = len(prompt) - 1  # the last position is always recomputed by a proposal
        if end >= 2 and self.known[row] >= end and end <= self.limit:
            # Prefill now so later steps catch up a few positions per row, not a prompt.
            with row_view(self.cache, row, row + 1) as view:
                prev = self.target_hidden[row, : end - 1]  # [end - 1, hidden]
                self._head(torch.tensor([list(prompt[1:end])]), prev[None], view)
            self.slot_tokens[row] = list(prompt[1:end])

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
        vocab = self.drafter.vocab_size

        def refuse(req: DraftRequest) -> Draft | Refusal | None:
            length = len(req.context)
            if length < 2:  # position 0 has no head input: nothing to draft from yet
                return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab))
            if length + req.k > self.limit:
                return CONTEXT_FULL
            if self.known[req.row] < length - 1:
                return Refusal("drafter_error: the feature drafter needs the target's states")
            return None

        return propose_ready(requests, refuse, lambda ready: self._draft(ready, num_rows))

    def _head(self, tokens: Tensor, prev: Tensor, view: KVCache) -> Tensor:
        """tokens [rows, w], prev [rows, w, hidden] -> head features [rows, w, hidden]."""
        assert isinstance(view, StaticKVCache)  # the head's own cache, made above
        features: Tensor = self.head(tokens, prev.to(self.head.fc.weight.dtype), view)
        return features

    def _sync(self, requests: Sequence[DraftRequest], num_rows: int) -> dict[int, Tensor]:
        """Bring each requesting row to its context from real target states; returns
        row -> the head output at the last position (stands in for h[L - 1]) [hidden]."""
        pending: dict[int, tuple[int, list[int]]] = {}  # row -> (first position, tokens)
        for req in requests:
            row, context = req.row, req.context
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
            width = min(self.slack, max(len(toks) - offset for _, toks in pending.values()))
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
            features = ragged_forward(self.cache, num_rows, used, partial(self._head, tokens, prev))
            for row, (_, toks) in pending.items():
                if used[row] and offset + used[row] == len(toks):
                    out[row] = features[row, used[row] - 1]
            offset += width
        return out

    def _draft(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft]:
        features = self._sync(requests, num_rows)
        tokens: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        probs: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        hidden_size = self.head.cfg.hidden_size
        for step in range(max(r.k for r in requests)):
            for req in (r for r in requests if r.k > step):
                row_probs = process_logits(self.drafter.vocab_logits(features[req.row]), req.params)
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
            out = ragged_forward(self.cache, num_rows, used, partial(self._head, chunk, fed))
            for req in feeding:
                features[req.row] = out[req.row, 0]
        return [
            Draft(torch.stack(tokens[r.row]).long(), torch.stack(probs[r.row])) for r in requests
        ]

"""Drafting for a batch: one draft pass per draft step over every sequence that drafts.

Two kinds behind one small interface (``BatchDrafter``):

- ``BatchModelDrafter``: a draft ``LanguageModel`` with one batched cache whose rows are
  the batch's rows. Per row it does exactly what ``ModelDrafter`` does for one sequence
  (keep the longest prefix shared with the committed context, ingest the rest, sample k
  tokens, the k-th not ingested), so a sequence drafts the same tokens alone or batched.
  Rows need different numbers of tokens (ragged): the chunk is padded after each row's
  real tokens, and every row is then truncated back to its own length. Causal attention
  keeps real tokens blind to the padding after them, and truncation forgets it.
- ``PerSequenceDrafters``: one ``Drafter`` per sequence (n-gram lookup, test doubles),
  proposed one after the other; cheap drafters need no batching.

Random numbers: each sequence draws from its own generator, in the order the single-
sequence engine draws them (draft token 1, 2, ..., k), so batching never changes what a
sequence samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.drafters.base import Drafter, TargetFeatures
from spectune.drafters.model import choose_token, common_prefix
from spectune.errors import InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.models.rows import RowsCache, forward_row, ragged_forward
from spectune.records import drafter_error
from spectune.sampling import SamplingParams, process_logits

__all__ = [
    "BatchDrafter",
    "BatchModelDrafter",
    "DraftRequest",
    "CONTEXT_FULL",
    "PerSequenceDrafters",
    "Refusal",
    "propose_ready",
]


@dataclass(frozen=True)
class Refusal:
    """A batch drafter's answer for a request it cannot draft for; ``reason`` becomes the
    step's fallback. A ``permanent`` refusal (the drafter failed) turns drafting off for the
    rest of the request; a passing one (the draft cache is full) for this step only."""

    reason: str
    permanent: bool = True


# The draft cache has no room for this request's context and draft (this step only).
CONTEXT_FULL = Refusal("draft_context_full", permanent=False)


def propose_ready(
    requests: Sequence[DraftRequest],
    refuse: Callable[[DraftRequest], Draft | Refusal | None],
    draft: Callable[[list[DraftRequest]], list[Draft]],
) -> list[Draft | Refusal]:
    """One answer per request, in order: what ``refuse`` says for a request it turns away
    (a reason, or an empty draft), else its draft from one ``draft`` call over the rest."""
    answers = [refuse(req) for req in requests]
    ready = [req for req, answer in zip(requests, answers, strict=True) if answer is None]
    drafts = iter(draft(ready) if ready else [])
    return [next(drafts) if answer is None else answer for answer in answers]


@dataclass(frozen=True)
class DraftRequest:
    """One sequence's ask in a draft pass."""

    row: int
    context: Sequence[int]  # committed tokens: prompt + output so far
    k: int  # draft tokens wanted (> 0)
    params: SamplingParams
    generator: torch.Generator


class BatchDrafter(Protocol):
    name: str

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        """A sequence joins at ``row`` (the row is empty)."""
        ...

    def move(self, src: int, dst: int) -> None:
        """The sequence at ``src`` now lives at ``dst`` (``dst`` was freed)."""
        ...

    def free(self, row: int) -> None:
        """The sequence at ``row`` left the batch."""
        ...

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        """One draft (or a refusal saying why not) per request, in request order.

        ``num_rows`` is the number of active rows (requests cover a subset of them).
        Raising fails every request of the pass; the engine then decodes them plainly.
        """
        ...

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Hear the committed context of ``row`` after a step."""
        ...


class PerSequenceDrafters:
    """One ``Drafter`` per sequence, made by ``factory``; failures stay per sequence."""

    def __init__(self, factory: Callable[[], Drafter], max_batch: int) -> None:
        self.factory = factory
        self.drafters: list[Drafter | None] = [None] * max_batch
        self.name = factory().name

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        drafter = self.factory()
        drafter.reset()
        self.drafters[row] = drafter
        drafter.commit(list(prompt), features)

    def move(self, src: int, dst: int) -> None:
        self.drafters[dst], self.drafters[src] = self.drafters[src], None

    def free(self, row: int) -> None:
        self.drafters[row] = None

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        drafts: list[Draft | Refusal] = []
        for req in requests:
            drafter = self.drafters[req.row]
            if drafter is None:
                drafts.append(Refusal("drafter_error: no drafter for this row"))
                continue
            try:
                drafts.append(drafter.propose(req.context, req.k, req.params, req.generator))
            except Exception as exc:  # one sequence's drafter failing never fails the batch
                drafts.append(Refusal(drafter_error(exc)))
        return drafts

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        drafter = self.drafters[row]
        if drafter is not None:
            drafter.commit(context, features)


class BatchModelDrafter:
    """A draft model drafting every requesting row in one forward per draft step."""

    def __init__(self, model: LanguageModel, max_batch: int, capacity: int, slack: int) -> None:
        self.model = model
        self.name = f"model:{model.info.name}"
        try:
            self.cache = model.new_cache(batch_size=max_batch, capacity=capacity)
        except ValueError as exc:
            raise InvalidParameterError(
                f"the draft model cannot decode a batch of {max_batch}: {exc}"
            ) from exc
        # Padding may write up to ``slack`` slots past a row's own length.
        self.limit = self.cache.capacity - slack
        self.slack = slack
        self.ingested: list[list[int]] = [[] for _ in range(max_batch)]
        self.pad = model.info.pad_token_id or 0

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        self.cache.truncate(0, row)
        self.ingested[row] = []
        if len(prompt) > 1 and len(prompt) - 1 <= self.limit:
            # Prefill now so later steps ingest a few tokens per row, not a whole prompt.
            forward_row(self.model, self.cache, row, torch.tensor([list(prompt[:-1])]))
            self.ingested[row] = list(prompt[:-1])

    def move(self, src: int, dst: int) -> None:
        if isinstance(self.cache, RowsCache):
            self.cache.copy_row(src, dst)
        self.ingested[dst], self.ingested[src] = self.ingested[src], []
        self.cache.truncate(0, src)

    def free(self, row: int) -> None:
        self.cache.truncate(0, row)
        self.ingested[row] = []

    def commit(self, row: int, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Nothing to do eagerly: the next ``propose`` syncs the row to ``context``."""

    def propose(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft | Refusal]:
        def refuse(req: DraftRequest) -> Refusal | None:
            return CONTEXT_FULL if len(req.context) + req.k > self.limit else None

        return propose_ready(requests, refuse, lambda ready: self._draft(ready, num_rows))

    def _sync(self, requests: Sequence[DraftRequest], num_rows: int) -> dict[int, Tensor]:
        """Bring each requesting row to its context; returns row -> next-token logits [vocab].

        Rows ingest ragged numbers of tokens, at most ``slack`` per forward (so padding
        never runs past the cache's capacity).
        """
        pending: dict[int, list[int]] = {}
        for req in requests:
            keep = common_prefix(self.ingested[req.row], req.context)
            if keep == len(req.context):
                keep -= 1  # re-run the last token: its logits are needed again
            self.cache.truncate(keep, req.row)
            pending[req.row] = list(req.context[keep:])
            self.ingested[req.row] = list(req.context)
        logits: dict[int, Tensor] = {}
        offset = 0
        while len(logits) < len(pending):
            longest = max(len(p) - offset for p in pending.values())
            width = min(self.slack, longest)
            tokens = torch.full((num_rows, width), self.pad, dtype=torch.long)  # [rows, width]
            used = [0] * num_rows
            for row, toks in pending.items():
                part = toks[offset : offset + width]
                tokens[row, : len(part)] = torch.tensor(part, dtype=torch.long)
                used[row] = len(part)
            out = ragged_forward(self.cache, num_rows, used, partial(self.model.forward, tokens))
            for row, toks in pending.items():
                if used[row] and offset + used[row] == len(toks):
                    logits[row] = out.logits[row, used[row] - 1]
            offset += width
        return logits

    def _draft(self, requests: Sequence[DraftRequest], num_rows: int) -> list[Draft]:
        logits = self._sync(requests, num_rows)
        tokens: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        probs: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        max_k = max(r.k for r in requests)
        for step in range(max_k):
            drafting = [r for r in requests if r.k > step]
            for req in drafting:
                row_probs = process_logits(logits[req.row], req.params)  # [vocab]
                tokens[req.row].append(choose_token(row_probs, req.params, req.generator))
                probs[req.row].append(row_probs)
            # Ingest token step + 1 where another token is wanted after it (as ModelDrafter:
            # the last draft token is ingested at the next sync, if it was accepted).
            feeding = [r for r in requests if r.k > step + 1]
            if not feeding:
                break
            chunk = torch.full((num_rows, 1), self.pad, dtype=torch.long)  # [rows, 1]
            used = [0] * num_rows
            for req in feeding:
                chunk[req.row, 0] = tokens[req.row][-1]
                used[req.row] = 1
            out = ragged_forward(self.cache, num_rows, used, partial(self.model.forward, chunk))
            for req in feeding:
                self.ingested[req.row].append(int(tokens[req.row][-1]))
                logits[req.row] = out.logits[req.row, 0]
        return [Draft(torch.stack(tokens[r.row]), torch.stack(probs[r.row])) for r in requests]

"""Model drafter: a small LM with its own KV cache proposes tokens autoregressively.

Written once, for rows. ``ModelDrafter`` is the source (the draft model, its vocabulary
mapping, its name); ``open(rows, capacity)`` gives a ``ModelRows``, one batched cache
whose rows are the engine's rows. Per row a row set keeps the longest prefix shared with
the committed context (a rejection rolls the row back to it), ingests the rest, and samples
k tokens, the k-th not ingested (if it is accepted it is ingested at the start of the next
proposal, together with the target's bonus token). ``ModelDrafter``'s own ``Drafter``
methods drive a one-row set (``spectune.drafters.base.OneRow``), so a sequence drafts
the same tokens alone or in a batch. Its tree form (``tree(shape)``: ``TreeDrafter``, below;
the growth is ``spectune.drafters.tree``'s) keeps its cache in step through a one-row
row set too.

Ragged rows: rows need different numbers of tokens, so a chunk is padded after each row's
real tokens and every row is truncated back to its own length afterwards. Causal
attention keeps real tokens blind to the padding after them, and truncation forgets it.
A one-row set never pads.

Random numbers: each sequence draws from its own generator, in the order draft token 1,
2, ..., k, so batching never changes what a sequence samples.
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
from spectune.drafters.reduced import scatter_to_vocab, vocab_coverage
from spectune.drafters.tree import GrowingTree, TreeGrower, chunk_layout
from spectune.errors import InvalidParameterError
from spectune.models.base import LanguageModel, takes_tree_masks
from spectune.models.rows import RowsCache, forward_row, ragged_forward, row_view
from spectune.sampling import SamplingParams, process_logits, sample_from

__all__ = ["ModelDrafter", "ModelRows", "TreeDrafter", "choose_token", "common_prefix"]


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


class ModelDrafter(RowDrafter):
    """Drafts with a ``LanguageModel`` (see the module docstring): the source of
    ``ModelRows``s, and itself a one-sequence ``Drafter`` over a one-state."""

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
        self.row: OneRow[ModelRows] = OneRow(lambda: self.open(1))

    def open(self, rows: int, capacity: int | None = None, slack: int = 0) -> ModelRows:
        """A row set over ``rows`` rows of ``capacity`` tokens each (None: the model's
        context); ``slack``: slots padding may write past a row (0 for one row)."""
        return ModelRows(self, rows, capacity, slack)

    def fresh(self) -> ModelDrafter:
        """The same model, vocabulary and name; its own (empty) per-request state."""
        return ModelDrafter(self.model, name=self.name, vocab_subset=self.vocab_subset)

    def tree(self, shape: TreeShape) -> TreeDrafter:
        """The token-tree form: the same model growing trees of ``shape``."""
        if not takes_tree_masks(self.model) or self.vocab_subset is not None:
            raise InvalidParameterError(
                "token trees need a full-vocabulary draft model that takes tree attention "
                "masks (--runtime native)"
            )
        return TreeDrafter(self.model, shape)

    def describe(self) -> str:
        return f"{self.name} (draft model{vocab_coverage(self.vocab_subset, self.model)})"

    @torch.inference_mode()
    def score_sequence(
        self, tokens: Sequence[int], target_hidden: Tensor | None, params: SamplingParams
    ) -> Tensor:
        """One causal pass over ``tokens[:-1]``: [len(tokens) - 1, vocab] draft distributions."""
        cache = self.model.new_cache(capacity=len(tokens))
        logits = self.model.forward(torch.tensor([list(tokens[:-1])]), cache).logits[0]
        return self.full_vocab(process_logits(logits, params))

    def full_vocab(self, probs: Tensor) -> Tensor:
        """[..., num_draft_tokens] -> [..., vocab]: zeros outside a reduced vocabulary."""
        if self.vocab_subset is None:
            return probs
        return scatter_to_vocab(probs, self.vocab_subset, self.model.info.vocab_size)


class ModelRows:
    """A draft model drafting every requesting row in one forward per draft step."""

    def __init__(self, source: ModelDrafter, rows: int, capacity: int | None, slack: int) -> None:
        model = source.model
        self.source = source
        self.model = model
        self.name = source.name
        try:
            self.cache = model.new_cache(batch_size=rows, capacity=capacity)
        except ValueError as exc:
            raise InvalidParameterError(
                f"the draft model cannot decode a batch of {rows}: {exc}"
            ) from exc
        # Padding may write up to ``slack`` slots past a row's own length; one row never
        # pads, and its last draft token is never ingested.
        self.limit = self.cache.capacity - slack if slack else self.cache.capacity + 1
        self.slack = slack
        self.ingested: list[list[int]] = [[] for _ in range(rows)]
        self.pad = model.info.pad_token_id or 0

    def add(self, row: int, prompt: Sequence[int], features: TargetFeatures | None) -> None:
        self.free(row)
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
        vocab = self.model.info.vocab_size

        def refuse(req: DraftRequest) -> Draft | Refusal | None:
            if req.k <= 0:
                return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab))
            return CONTEXT_FULL if len(req.context) + req.k > self.limit else None

        return propose_ready(requests, refuse, lambda ready: self._draft(ready, num_rows))

    def forward_drafts(
        self,
        row: int,
        tokens: Tensor,  # [1, m] draft nodes
        start: int,  # the slot of tokens[0, 0]: the row is rolled back to it first
        positions: Tensor,  # [1, m]
        chunk_mask: Tensor,  # [1, m, m]
    ) -> Tensor:
        """The draft model over draft nodes written from slot ``start`` of ``row`` (what was
        drafted there before is dropped) -> logits [1, m, vocab]."""
        self.cache.truncate(start, row)
        with row_view(self.cache, row, row + 1) as view:
            return self.model.forward(
                tokens, view, positions=positions, chunk_mask=chunk_mask
            ).logits

    def keep_drafted(self, row: int, context: Sequence[int], start: int, slots: list[int]) -> None:
        """``row`` keeps the draft entries at ``slots`` (their tokens: ``context[start:]``'s
        first ``len(slots)``) compacted to ``start`` onward, and drops everything after."""
        cache = self.cache
        if not slots:
            cache.truncate(min(cache.length(row), start), row)
            return
        cache.move_slots(row, torch.tensor(slots, dtype=torch.long), start)
        cache.truncate(start + len(slots), row)
        self.ingested[row] = list(context[: start + len(slots)])

    def holds(self, row: int, tokens: Sequence[int]) -> bool:
        """Whether ``row``'s cache begins with ``tokens``."""
        return self.ingested[row][: len(tokens)] == list(tokens)

    def sync(self, contexts: dict[int, Sequence[int]], num_rows: int) -> dict[int, Tensor]:
        """Bring each row to its context; returns row -> next-token logits [vocab].

        Rows ingest ragged numbers of tokens, at most ``slack`` per forward when padding
        has only that much room (so it never runs past the cache's capacity).
        """
        pending: dict[int, list[int]] = {}
        for row, context in contexts.items():
            keep = common_prefix(self.ingested[row], context)
            if keep == len(context):
                keep -= 1  # re-run the last token: its logits are needed again
            self.cache.truncate(keep, row)
            pending[row] = list(context[keep:])
            self.ingested[row] = list(context)
        logits: dict[int, Tensor] = {}
        offset = 0
        while len(logits) < len(pending):
            longest = max(len(p) - offset for p in pending.values())
            width = min(self.slack, longest) if self.slack else longest
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
        logits = self.sync({r.row: r.context for r in requests}, num_rows)
        subset = self.source.vocab_subset
        tokens: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        probs: dict[int, list[Tensor]] = {r.row: [] for r in requests}
        max_k = max(r.k for r in requests)
        for step in range(max_k):
            drafting = [r for r in requests if r.k > step]
            for req in drafting:
                row_probs = process_logits(logits[req.row], req.params)  # [draft vocab]
                choice = choose_token(row_probs, req.params, req.generator)
                tokens[req.row].append(choice if subset is None else subset[choice])
                probs[req.row].append(self.source.full_vocab(row_probs))  # [vocab]
            # Ingest token step + 1 where another token is wanted after it (the last draft
            # token is ingested at the next sync, if it was accepted).
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


class TreeDrafter:
    """Drafts a token tree with a draft model (``spectune.drafters.tree``), the tree form of
    ``ModelDrafter``; its cache is kept in step with the context by a one-row
    ``ModelRows``, as the chain drafter's is. It scores nodes (``NodeScorer``) for a
    ``TreeGrower``, which grows the tree."""

    def __init__(
        self, model: LanguageModel, shape: TreeShape | None = None, *, name: str | None = None
    ) -> None:
        self.model = model
        self.grower = TreeGrower(shape or TreeShape(), model.info.vocab_size)
        self.shape = self.grower.shape
        self.name = name or f"tree:{model.info.name}:w{self.shape.width}n{self.shape.nodes}"
        self.row: OneRow[ModelRows] = OneRow(lambda: ModelDrafter(model).open(1))
        self._last: GrowingTree | None = None  # the last tree grown, for compaction

    def describe(self) -> str:
        return self.grower.describe(self.name, "draft-model", vocab_coverage(None, self.model))

    def reset(self) -> None:
        self.row.reset()
        self._last = None

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        self._last = None
        draft, self._last = self.grower.grow(self, context, num_tokens, params, generator)
        return draft

    def root_logits(self, context: Sequence[int]) -> Tensor:
        self.row.join(context)
        return self.row.state.sync({0: context}, 1)[0]

    def score_nodes(self, tree: GrowingTree, nodes: list[int]) -> Tensor:
        """One forward over ``nodes`` and their ancestors under the tree mask."""
        chunk, positions, mask = chunk_layout(tree, nodes, tree.prefix - 1)
        tokens = torch.tensor([[tree.tokens[n] for n in chunk]])  # [1, m]
        logits = self.row.state.forward_drafts(0, tokens, tree.prefix, positions, mask)
        tree.chunk = chunk
        return logits[0, [chunk.index(n) for n in nodes]]

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Compact the accepted path's draft entries from the last forward into place."""
        last, self._last = self._last, None
        if not self.row.joined:
            self.row.join(context, features)
        state = self.row.state
        if last is None or not state.holds(0, context[: last.prefix]):
            return
        slot_of = {node: last.prefix + i for i, node in enumerate(last.chunk)}
        current, slots = -1, []
        for token in context[last.prefix :]:
            child = next(
                (
                    i
                    for i, (t, p) in enumerate(zip(last.tokens, last.parents, strict=True))
                    if p == current and t == token
                ),
                None,
            )
            if child is None or child not in slot_of:
                break
            slots.append(slot_of[child])
            current = child
        state.keep_drafted(0, context, last.prefix, slots)

"""Tree drafter: a draft model expands a token tree instead of a chain.

Expansion, level by level (EAGLE-2's shape, Li et al. 2024): the root's distribution comes
from the synced draft cache; at each depth the ``width`` most probable frontier nodes (by
cumulative draft probability along their path) get ``width`` children each, until the
node budget or the depth K is reached. Children are the top-``width`` tokens by draft
probability at temperature 0, and ``width`` draws *without replacement* from the processed
draft distribution otherwise (the stochastic top-``width``; the verifier's sibling scheme
needs exactly this, see ``spectune.tree_verify``).

Dynamic pruning: a node whose cumulative draft probability is below ``min_path_prob`` is
not expanded, so the tree grows where the draft is confident. At temperature 0 the tree
grows past the node budget (up to ``MAX_TREE_NODES``) and is then re-ranked, keeping the
``nodes`` most probable paths, as EAGLE-2 does; greedy verification is exact for any tree.
When sampling it is not: dropping a *sampled* child because of its own probability would
bias lossless sibling verification, so there the budget stops the growth instead, and
pruning only ever decides whether a node is expanded.

One draft forward per level scores the nodes to be expanded next, with their ancestors,
under a tree mask (positions = prefix + depth). After the target's verdict, ``commit``
compacts the accepted path's draft keys/values from the last forward into the contiguous
cache (``move_slots``) instead of recomputing them.

With ``width == 1`` this drafts exactly the chain ``ModelDrafter`` drafts (same tokens,
same probabilities, same random numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from spectune.drafters.base import Draft, TargetFeatures
from spectune.drafters.model import common_prefix
from spectune.errors import InvalidParameterError
from spectune.models.base import KVCache, LanguageModel
from spectune.sampling import SamplingParams, process_logits, sample_from
from spectune.tree import MAX_TREE_NODES, tree_layout

__all__ = ["TreeDrafter", "TreeShape"]


@dataclass(frozen=True)
class TreeShape:
    """How a tree grows: children per expanded node, node budget, pruning threshold."""

    width: int = 2
    nodes: int = 16
    min_path_prob: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.width <= 8:
            raise InvalidParameterError(f"tree width must be in [1, 8], got {self.width}")
        if not 1 <= self.nodes <= MAX_TREE_NODES:
            raise InvalidParameterError(
                f"tree node budget must be in [1, {MAX_TREE_NODES}], got {self.nodes}"
            )
        if not 0.0 <= self.min_path_prob < 1.0:
            raise InvalidParameterError("min_path_prob must be in [0, 1)")


@dataclass
class _Tree:
    """The last proposal, kept for compaction at commit."""

    prefix: int  # draft cache slots holding the context when the tree was drafted
    tokens: list[int]
    parents: list[int]
    chunk: list[int]  # node indices of the last forward's chunk, in slot order


class TreeDrafter:
    def __init__(
        self, model: LanguageModel, shape: TreeShape | None = None, *, name: str | None = None
    ) -> None:
        self.model = model
        self.shape = shape or TreeShape()
        self.name = name or f"tree:{model.info.name}:w{self.shape.width}n{self.shape.nodes}"
        self.cache: KVCache | None = None
        self.ingested: list[int] = []
        self._last: _Tree | None = None

    def reset(self) -> None:
        self.cache = None
        self.ingested = []
        self._last = None

    def _cache(self) -> KVCache:
        if self.cache is None:
            self.cache = self.model.new_cache()
        return self.cache

    def _sync(self, context: Sequence[int]) -> Tensor:
        """Bring the cache to ``context`` (all of it); return the next-token logits. [vocab]"""
        cache = self._cache()
        keep = common_prefix(self.ingested, context)
        if keep == len(context):
            keep -= 1  # re-run the last token: its logits are needed again
        cache.truncate(keep)
        self.ingested = list(context)
        out = self.model.forward(torch.tensor([list(context[keep:])]), cache)
        return out.logits[0, -1]

    def propose(
        self,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """A tree at most ``num_tokens`` deep with at most ``shape.nodes`` nodes."""
        self._last = None
        vocab = self.model.info.vocab_size
        if num_tokens <= 0:
            return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab))
        shape = self.shape

        def distribution(logits: Tensor) -> Tensor:  # [vocab] -> [vocab] fp32
            # Greedy ranks children by the draft's own probabilities (the processed
            # greedy distribution is one-hot and could not rank a second child).
            return logits.float().softmax(-1) if params.greedy else process_logits(logits, params)

        tokens: list[int] = []
        parents: list[int] = []
        rows: list[Tensor] = []  # [vocab] per node: the distribution it was drawn from
        path_probs: list[float] = []
        frontier: list[tuple[int, Tensor, float]] = [(-1, distribution(self._sync(context)), 1.0)]
        # Greedy grows past the budget and re-ranks afterwards (EAGLE-2); sampling must not
        # (see the module docstring), so its budget bounds the growth itself.
        grow_limit = MAX_TREE_NODES if params.greedy else shape.nodes
        prefix = len(context)
        chunk: list[int] = []
        for depth in range(1, num_tokens + 1):
            new_nodes: list[int] = []
            for parent, dist, path_prob in frontier:
                room = grow_limit - len(tokens)
                if room <= 0:
                    break
                for token in self._children(dist, min(shape.width, room), params, generator):
                    new_nodes.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    rows.append(dist)
                    path_probs.append(path_prob * float(dist[token]))
            if depth == num_tokens or len(tokens) >= grow_limit:
                break
            # Which new nodes get expanded next: the ``width`` most probable paths above
            # the threshold. Decided before their children exist (lossless, see above).
            ranked = sorted(new_nodes, key=lambda i: -path_probs[i])
            expand = [i for i in ranked[: shape.width] if path_probs[i] >= shape.min_path_prob]
            if not expand:
                break
            logits, chunk = self._score(expand, tokens, parents, prefix)
            frontier = [
                (i, distribution(logits[chunk.index(i)]), path_probs[i]) for i in sorted(expand)
            ]
        self._last = _Tree(prefix, tokens, parents, chunk)
        keep = list(range(len(tokens)))
        if len(tokens) > shape.nodes:
            # The ``nodes`` most probable paths. A child's path probability never exceeds
            # its parent's and ties go to the lower index (the parent), so the kept set
            # is ancestor-closed; kept in index order, parents still come first.
            keep = sorted(sorted(keep, key=lambda i: (-path_probs[i], i))[: shape.nodes])
        index = {node: i for i, node in enumerate(keep)}
        return Draft(
            torch.tensor([tokens[i] for i in keep], dtype=torch.long),
            torch.stack([rows[i] for i in keep]),
            torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in keep]),
        )

    @staticmethod
    def _children(
        dist: Tensor, count: int, params: SamplingParams, generator: torch.Generator | None
    ) -> list[int]:
        """Top-``count`` tokens (greedy) or ``count`` draws without replacement."""
        if params.greedy:
            top = torch.topk(dist, count)
            return [int(t) for t, p in zip(top.indices, top.values, strict=True) if p > 0]
        remaining = dist.clone()
        drawn: list[int] = []
        for _ in range(count):
            if not remaining.sum() > 0:
                break  # the support is exhausted
            token = int(sample_from(remaining, generator))
            drawn.append(token)
            remaining[token] = 0.0
        return drawn

    def _score(
        self, expand: list[int], tokens: list[int], parents: list[int], prefix: int
    ) -> tuple[Tensor, list[int]]:
        """Draft logits for the nodes in ``expand``: one forward over them and their
        ancestors under the tree mask. Returns (logits [chunk, vocab], chunk node ids)."""
        members: set[int] = set()
        for node in expand:
            while node >= 0 and node not in members:
                members.add(node)
                node = parents[node]
        chunk = sorted(members)  # parents first, as in the tree
        where = {node: i for i, node in enumerate(chunk)}
        chunk_parents = torch.tensor([where.get(parents[n], -1) for n in chunk])  # [m]
        # Layout of [root, chunk...] with the root already cached at slot prefix - 1.
        positions, mask = tree_layout(chunk_parents, prefix - 1)
        cache = self._cache()
        cache.truncate(prefix)
        out = self.model.forward(
            torch.tensor([[tokens[n] for n in chunk]]),
            cache,
            positions=positions[None, 1:],
            chunk_mask=mask[None, 1:, 1:],
        )
        return out.logits[0], chunk

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Compact the accepted path's draft entries from the last forward into place."""
        last, self._last = self._last, None
        if (
            last is None
            or self.cache is None
            or self.ingested[: last.prefix] != list(context[: last.prefix])
        ):
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
        move_slots = getattr(self.cache, "move_slots", None)
        if not slots or move_slots is None:
            self.cache.truncate(min(self.cache.length(), last.prefix))
            return
        move_slots(0, torch.tensor(slots, dtype=torch.long), last.prefix)
        self.cache.truncate(last.prefix + len(slots))
        self.ingested = list(context[: last.prefix + len(slots)])

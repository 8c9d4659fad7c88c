"""Growing token trees: how a drafter expands a tree instead of a chain.

The growth below is shared; what scores a node is the drafter's own: a draft model's
(``spectune.drafters.model.TreeDrafter``) or a feature head's
(``spectune.drafters.feature.FeatureTreeDrafter``), each the ``tree(shape)`` form of its
chain drafter.

Children of a node are the top-``width`` tokens by draft probability at temperature 0,
and ``width`` draws *without replacement* from the processed draft distribution when
sampling (the stochastic top-``width``; the verifier's sibling scheme needs exactly this,
see ``spectune.verify.tree``). Paths are ranked by cumulative draft probability.

Growth at temperature 0, level by level (EAGLE-2, Li et al. 2024): at each depth the
``width`` most probable frontier nodes get ``width`` children each, up to depth K and
``MAX_TREE_NODES``; then the tree is re-ranked and the ``nodes`` most probable paths are
kept. Greedy verification is exact for any tree, so any selection is safe.

Growth when sampling, best first: the most probable unexpanded path gets ``width``
children (fewer when the budget runs out), until the ``nodes`` budget is spent. No
re-ranking here, on purpose: dropping a *sampled* child because of its own probability
would bias lossless sibling verification. Lossless needs that whether and how much a node
is expanded is decided before its children are drawn, which best-first growth respects.

Dynamic pruning: a node whose cumulative draft probability is below ``min_path_prob`` is
never expanded, so the tree grows where the draft is confident.

Each draft forward scores the nodes to be expanded next, with their ancestors, under a
tree mask (positions = prefix + depth). After the target's verdict, ``commit`` compacts
the accepted path's draft keys/values from the last forward into the contiguous cache
(``move_slots``) instead of recomputing them.

With ``width == 1`` this drafts exactly the chain ``ModelDrafter`` drafts (same tokens,
same probabilities, same random numbers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from spectune.draft import MAX_TREE_NODES, Draft, tree_layout
from spectune.drafters.base import TreeShape
from spectune.sampling import SamplingParams, process_logits, sample_from

__all__ = ["GrowingTree", "NodeScorer", "TreeGrower", "TreeShape", "chunk_layout"]


@dataclass
class GrowingTree:
    """A tree while it grows (node lists indexed by node); kept after the proposal for
    compaction at commit."""

    prefix: int  # committed tokens when the tree was drafted
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    rows: list[Tensor] = field(default_factory=list)  # [vocab] the distribution drawn from
    path_probs: list[float] = field(default_factory=list)  # draft probability of the path
    depths: list[int] = field(default_factory=list)
    chunk: list[int] = field(default_factory=list)  # nodes of the last draft forward

    def add(self, token: int, parent: int, dist: Tensor) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.rows.append(dist)
        self.path_probs.append(self.path_prob(parent) * float(dist[token]))
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def path_prob(self, node: int) -> float:
        return 1.0 if node < 0 else self.path_probs[node]


def chunk_layout(
    tree: GrowingTree, nodes: list[int], root_position: int
) -> tuple[list[int], Tensor, Tensor]:
    """The chunk that scores ``nodes``: them and their ancestors, parents first, with
    positions [1, m] and mask [1, m, m] for a root (already cached) at ``root_position``."""
    members: set[int] = set()
    for node in nodes:
        while node >= 0 and node not in members:
            members.add(node)
            node = tree.parents[node]
    chunk = sorted(members)  # parents first, as in the tree
    where = {node: i for i, node in enumerate(chunk)}
    chunk_parents = torch.tensor([where.get(tree.parents[n], -1) for n in chunk])  # [m]
    positions, mask = tree_layout(chunk_parents, root_position)  # covers [root, chunk...]
    return chunk, positions[None, 1:], mask[None, 1:, 1:]


class NodeScorer(Protocol):
    """How a drafter scores the nodes of a growing tree (its tree form implements this and
    drives a ``TreeGrower``)."""

    def root_logits(self, context: Sequence[int]) -> Tensor:
        """[vocab] logits of the token after ``context`` (the drafter brought to it)."""
        ...

    def score_nodes(self, tree: GrowingTree, nodes: list[int]) -> Tensor:
        """[len(nodes), vocab] logits of the children of each of ``nodes``, in order, from
        one forward over them and their ancestors; records that forward's chunk in
        ``tree.chunk``."""
        ...


@dataclass(frozen=True)
class TreeGrower:
    """Grows token trees of ``shape`` (see the module docstring) from a ``NodeScorer``."""

    shape: TreeShape
    vocab_size: int

    def describe(self, name: str, kind: str, coverage: str = "") -> str:
        """The start-up line of a tree drafter ``name`` whose nodes ``kind`` scores."""
        shape = self.shape
        return f"{name} ({kind} token tree, width {shape.width}, {shape.nodes} nodes{coverage})"

    def grow(
        self,
        scorer: NodeScorer,
        context: Sequence[int],
        num_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[Draft, GrowingTree | None]:
        """A tree at most ``num_tokens`` deep with at most ``shape.nodes`` nodes, and the
        tree as grown (before the greedy re-rank; None for no draft), which the drafter
        keeps for compaction at commit."""
        vocab = self.vocab_size
        if num_tokens <= 0:
            return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, vocab)), None

        def distribution(logits: Tensor) -> Tensor:  # [vocab] -> [vocab] fp32
            # Greedy ranks children by the draft's own probabilities (the processed
            # greedy distribution is one-hot and could not rank a second child).
            return logits.float().softmax(-1) if params.greedy else process_logits(logits, params)

        root = distribution(scorer.root_logits(context))
        tree = GrowingTree(prefix=len(context))
        if params.greedy:
            self._grow_levels(scorer, tree, root, num_tokens, params, generator, distribution)
        else:
            self._grow_best_first(scorer, tree, root, num_tokens, params, generator, distribution)
        tokens, parents, rows, path_probs = tree.tokens, tree.parents, tree.rows, tree.path_probs
        keep = list(range(len(tokens)))
        nodes = self.shape.nodes
        if len(tokens) > nodes:
            # The ``nodes`` most probable paths. A child's path probability never exceeds
            # its parent's and ties go to the lower index (the parent), so the kept set
            # is ancestor-closed; kept in index order, parents still come first.
            keep = sorted(sorted(keep, key=lambda i: (-path_probs[i], i))[:nodes])
        index = {node: i for i, node in enumerate(keep)}
        draft = Draft(
            torch.tensor([tokens[i] for i in keep], dtype=torch.long),
            torch.stack([rows[i] for i in keep]),
            torch.tensor([index[parents[i]] if parents[i] >= 0 else -1 for i in keep]),
        )
        return draft, tree

    def _grow_levels(
        self,
        scorer: NodeScorer,
        tree: GrowingTree,
        root: Tensor,  # [vocab]
        depth_limit: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        distribution: Callable[[Tensor], Tensor],
    ) -> None:
        """Temperature 0: level by level, the ``width`` best frontier nodes get ``width``
        children each, past the budget (the caller re-ranks)."""
        shape = self.shape
        frontier: list[tuple[int, Tensor]] = [(-1, root)]
        for depth in range(1, depth_limit + 1):
            new_nodes: list[int] = []
            for parent, dist in frontier:
                room = MAX_TREE_NODES - len(tree.tokens)
                if room <= 0:
                    break
                for token in self._children(dist, min(shape.width, room), params, generator):
                    new_nodes.append(tree.add(token, parent, dist))
            if depth == depth_limit or len(tree.tokens) >= MAX_TREE_NODES:
                return
            ranked = sorted(new_nodes, key=lambda i: -tree.path_probs[i])
            expand = [i for i in ranked[: shape.width] if tree.path_probs[i] >= shape.min_path_prob]
            if not expand:
                return
            expand = sorted(expand)
            logits = scorer.score_nodes(tree, expand)
            frontier = [(i, distribution(row)) for i, row in zip(expand, logits, strict=True)]

    def _grow_best_first(
        self,
        scorer: NodeScorer,
        tree: GrowingTree,
        root: Tensor,  # [vocab]
        depth_limit: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        distribution: Callable[[Tensor], Tensor],
    ) -> None:
        """Sampling: expand the most probable unexpanded path next, ``width`` children at
        a time, until the budget is spent. Whether and how much a node is expanded is
        decided before its children are drawn (the lossless condition, see above)."""
        shape = self.shape
        known: dict[int, Tensor] = {-1: root}  # node -> distribution of its children
        while len(tree.tokens) < shape.nodes and known:
            node = max(known, key=lambda n: (tree.path_prob(n), -n))
            dist = known.pop(node)
            room = shape.nodes - len(tree.tokens)
            kids = [
                tree.add(token, node, dist)
                for token in self._children(dist, min(shape.width, room), params, generator)
            ]
            if len(tree.tokens) >= shape.nodes:
                return
            scorable = [
                c
                for c in kids
                if tree.depths[c] < depth_limit and tree.path_probs[c] >= shape.min_path_prob
            ]
            if scorable:
                logits = scorer.score_nodes(tree, scorable)
                for c, row in zip(scorable, logits, strict=True):
                    known[c] = distribution(row)

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

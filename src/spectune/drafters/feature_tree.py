"""Token trees drafted by a feature head (EAGLE-2's setting: Li et al. 2024).

The tree grows exactly as a model's does (``spectune.drafters.tree``); only scoring
differs. A node's head input is its token plus the head output of its parent (the root's
parent output is the head's estimate of the target state at the last committed position,
``FeatureSession.sync``), so a node can be scored once its parent has been. One head
forward scores the nodes to expand next together with their ancestors, under the same
tree mask and positions a target uses (the head's slot s holds position s + 1, so the
root sits at the last real-state slot).

Compaction: none, on purpose. The head's slots past the real-state ones were computed from
its own estimates; once the target has verified the accepted path, its real states are
known and the next ``sync`` recomputes those slots from them (what EAGLE does too), which
is more accurate than keeping the estimates. The target's cache is still compacted by the
engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.drafters.base import TargetFeatures
from spectune.drafters.feature import NEEDS_STATES, FeatureDrafter
from spectune.drafters.tree import GrowingTree, TreeGrower, TreeShape, chunk_layout
from spectune.errors import DrafterError
from spectune.sampling import SamplingParams

__all__ = ["FeatureTreeDrafter"]


class FeatureTreeDrafter(TreeGrower):
    """Drafts a token tree with a ``FeatureDrafter``'s head."""

    def __init__(
        self, drafter: FeatureDrafter, shape: TreeShape | None = None, *, name: str | None = None
    ) -> None:
        self.drafter = drafter
        self.shape = shape or TreeShape()
        self.vocab_size = drafter.vocab_size
        self.name = name or f"tree:{drafter.name}:w{self.shape.width}n{self.shape.nodes}"
        self._last = None
        self._root_features: Tensor | None = None  # [hidden]
        self._node_features: dict[int, Tensor] = {}  # node -> [hidden] head output

    def reset(self) -> None:
        self.drafter.reset()
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
        return super().propose(context, num_tokens, params, generator)

    def _root_logits(self, context: Sequence[int]) -> Tensor:
        row = self.drafter.row
        row.join(context)
        if row.session.known[0] < len(context) - 1:
            raise DrafterError(NEEDS_STATES)
        self._root_features = row.session.sync({0: context}, 1)[0]
        return self.drafter.vocab_logits(self._root_features)

    def _parent_features(self, tree: GrowingTree, node: int) -> Tensor:
        parent = tree.parents[node]
        if parent < 0:
            assert self._root_features is not None
            return self._root_features
        return self._node_features[parent]

    def _score(self, tree: GrowingTree, nodes: list[int]) -> Tensor:
        session = self.drafter.row.session
        real = len(session.slot_tokens[0])  # real-state slots (positions 1..L-1)
        session.cache.truncate(real)
        chunk, positions, mask = chunk_layout(tree, nodes, real - 1)
        tokens = torch.tensor([[tree.tokens[n] for n in chunk]])  # [1, m]
        prev = torch.stack([self._parent_features(tree, n) for n in chunk])[None]  # [1, m, h]
        features = session.forward(tokens, prev, session.cache, positions, mask)
        for i, node in enumerate(chunk):
            self._node_features[node] = features[0, i]
        tree.chunk = chunk
        # The output rows only for the nodes asked about (the vocabulary matmul dominates).
        return self.drafter.vocab_logits(features[0, [chunk.index(n) for n in nodes]])

    def commit(self, context: Sequence[int], features: TargetFeatures | None) -> None:
        """Keep the target states of the accepted path; no draft-cache compaction (see the
        module docstring)."""
        self._last = None
        self.drafter.commit(context, features)

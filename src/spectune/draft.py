"""A draft and its geometry: chain or token tree, and the layout a target needs to score a
whole tree in one forward pass.

A tree draft proposes several continuations at once. The target reads the pending token
(the root) and every node in one chunk; each node must see the committed prefix and its
own ancestors only, at the rotary position it would have on its own path.

Worked example. The cache holds 10 tokens; the pending token is "the" (the root, chunk
index 0). The drafter proposes "cat" and "dog" after "the", and "sat" after "cat":

    nodes (chunk index)   0 "the"   1 "cat"   2 "dog"   3 "sat"
    parents (node index)            -1        -1        0          (``Draft.parents``)
    depth                 0         1         1         2
    position = 10 + depth 10        11        11        12

    chunk_mask (row: query, column: key; 1 = may attend; the prefix is always visible)
              the cat dog sat
        the    1   0   0   0
        cat    1   1   0   0
        dog    1   0   1   0
        sat    1   1   0   1

The target's logits at chunk row c score the children of node c. If "cat sat" is
accepted, the keys and values of chunk indices 1 and 3 (slots 11 and 13) are compacted
into slots 11 and 12 (``spectune.decode.step.keep_path``), and everything after is discarded.

A chain is the tree whose parents are ``[-1, 0, 1, ...]``: positions and mask are the
ordinary causal ones, and compaction moves nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch
from torch import Tensor

from spectune.errors import DrafterError

__all__ = [
    "CONTEXT_FULL",
    "MAX_TREE_NODES",
    "Draft",
    "Refusal",
    "RefusalKind",
    "chain_parents",
    "empty_draft",
    "check_parents",
    "tree_depths",
    "tree_layout",
    "trim_tree",
]

MAX_TREE_NODES = 64  # a tree wider than this costs the target more than it can win on a CPU


@dataclass(frozen=True)
class Draft:
    """A chain of draft tokens, or a token tree when ``parents`` is given.

    A tree's nodes are listed parents first, siblings together in the order they were
    drawn; ``parents[i]`` is the node index of node i's parent, -1 for children of the
    pending token (``spectune.draft`` has a worked example). A chain is the tree with
    ``parents = [-1, 0, 1, ...]``, which is what ``parents is None`` means.
    """

    tokens: Tensor  # [k] int64, 0 <= k <= requested (for a tree: its nodes)
    # [k, vocab] fp32: the processed distribution each token was sampled from, or None for a
    # drafter without probabilities (the verifier then treats each token as one-hot).
    # Siblings in a tree share their parent's row (they were drawn without replacement).
    probs: Tensor | None
    parents: Tensor | None = None  # [k] int64 for a tree, None for a chain
    # [k] fp32: the drafter's own probability of each token it drafted, where ``probs``
    # cannot say it (a greedy draft's processed rows are one-hot): how sure the drafter
    # was, which predicts acceptance (EAGLE-2); None where the drafter does not report it.
    confidence: Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> int | None:
        """A tree's longest path (the draft positions one path can test); None for a chain."""
        if self.parents is None:
            return None
        return max(tree_depths(self.parents.tolist()), default=0)


class RefusalKind(Enum):
    """Why a drafter gave no draft. The value starts the step's fallback reason, the text
    records, traces and the monitor's fallback counts read (``Refusal.reason``)."""

    CONTEXT_FULL = "draft_context_full"  # the draft cache has no room for context + draft
    DRAFTER_ERROR = "drafter_error"  # the drafter failed (raised, or cannot draft this row)
    DRAFT_DEADLINE = "draft_deadline"  # a draft pass ran past its deadline


REASON_CHARS = 200  # a permanent reason goes into every later record of its request


@dataclass(frozen=True)
class Refusal:
    """A drafter's answer for a request it cannot draft for; ``reason`` becomes the
    step's fallback. A ``permanent`` refusal (the drafter failed) turns drafting off for the
    rest of the request; a passing one (the draft cache is full) for this step only."""

    kind: RefusalKind
    detail: str | None = None  # what went wrong, in words (an exception's message)
    permanent: bool = True

    @classmethod
    def error(cls, cause: BaseException | str) -> Refusal:
        """A failed drafter: ``cause`` (an exception or a message) becomes the detail."""
        return cls(RefusalKind.DRAFTER_ERROR, str(cause))

    @property
    def reason(self) -> str:
        """The fallback reason, written here only: ``<kind>`` or ``<kind>: <detail>``, its
        first line, at most ``REASON_CHARS`` characters."""
        text = self.kind.value if self.detail is None else f"{self.kind.value}: {self.detail}"
        return text.splitlines()[0][:REASON_CHARS]


# The draft cache has no room for this request's context and draft (this step only).
CONTEXT_FULL = Refusal(RefusalKind.CONTEXT_FULL, permanent=False)


def empty_draft() -> Draft:
    """No draft: the step decodes plainly (the target's token only)."""
    return Draft(torch.zeros(0, dtype=torch.long), None)


def chain_parents(num_nodes: int) -> Tensor:
    """[num_nodes] int64: the parents of a chain, ``[-1, 0, 1, ...]``."""
    return torch.arange(num_nodes, dtype=torch.long) - 1


def check_parents(parents: Tensor, num_nodes: int) -> None:
    """Raise ``DrafterError`` unless ``parents`` describes a tree listed parents first."""
    if parents.dim() != 1 or parents.dtype != torch.long or parents.shape[0] != num_nodes:
        raise DrafterError(f"tree parents must be a 1-D int64 tensor of {num_nodes} entries")
    if num_nodes > MAX_TREE_NODES:
        raise DrafterError(f"a draft tree holds at most {MAX_TREE_NODES} nodes, got {num_nodes}")
    index = torch.arange(num_nodes)
    if bool(((parents < -1) | (parents >= index)).any()):
        raise DrafterError("every tree node's parent must be -1 or an earlier node")


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (children of the root have depth 1)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def tree_layout(parents: Tensor, prefix_length: int) -> tuple[Tensor, Tensor]:
    """Positions and visibility for the chunk ``[root, node_0, ..., node_{n-1}]``.

    parents: [n] int64 (node indices, -1 = the root). Returns
    (positions [n + 1] int64 = prefix_length + depth, chunk_mask [n + 1, n + 1] bool where
    row c is True at c's ancestors and at c itself).
    """
    parent_list = [int(p) for p in parents]
    n = len(parent_list)
    depths = [0] + tree_depths(parent_list)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)  # [n + 1, n + 1]
    mask[0, 0] = True
    for node, parent in enumerate(parent_list):
        row = node + 1
        mask[row] = mask[parent + 1]  # the parent's ancestors (the parent's row is done)
        mask[row, row] = True
    positions = prefix_length + torch.tensor(depths, dtype=torch.long)  # [n + 1]
    return positions, mask


def trim_tree(
    tokens: Tensor,  # [n] int64
    probs: Tensor | None,  # [n, vocab]
    parents: Tensor,  # [n] int64
    max_nodes: int,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Keep the first ``max_nodes`` nodes (ancestor-closed, since parents come first).

    Cutting by count keeps each node's children a prefix of the order they were drawn in,
    which is what lossless sibling verification needs (``spectune.verify.tree``).
    """
    keep = max(0, max_nodes)
    return tokens[:keep], None if probs is None else probs[:keep], parents[:keep]

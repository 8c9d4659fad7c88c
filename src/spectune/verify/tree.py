"""Tree verification: which path of a token tree the target keeps, and which token it adds.

Glossary (SpecInfer, Miao et al. 2024; multi-draft speculative sampling as in SpecTr,
Sun et al. 2023, and Sequoia, Chen et al. 2024, whose without-replacement form this is):

- node, root        the pending token is the root; ``Draft.parents`` links the nodes.
- siblings          the children of one node, x_1..x_m, drawn one after the other from
                    the drafter's distribution q at that node *without replacement*:
                    x_j ~ q_j = normalise(q with x_1..x_{j-1} removed).
- target probs      p at each chunk row (row 0: the root, row i + 1: node i).
- accepted path     the nodes kept, root to deepest; every step emits the path's tokens
                    and one more: a recovered token or a bonus token.

Greedy (temperature 0): from the root, move to the child whose token is the target's
argmax while there is one; emit the path, then the argmax at its last node. Any tree
shape and any drafter ranking give exactly the target's greedy output.

Sampling (recursive rejection sampling over siblings). At a node with target
distribution p_1 = p and children x_1..x_m:

    for j = 1..m:   accept x_j with probability min(1, p_j(x_j) / q_j(x_j));
                    on acceptance descend into x_j (its own p and children);
                    on rejection p_{j+1} = normalise(max(0, p_j - q_j)),
                                 q_{j+1} = normalise(q_j with x_j removed)
    all rejected:   emit a sample of p_{m+1} (the recovered token) and stop.
    a leaf kept:    emit a sample of p at the leaf (the bonus token) and stop.

Why it is lossless: each stage j is one speculative-sampling step with proposal q_j and
target p_j, and, given everything before it, x_j really is distributed as q_j (that is
what drawing without replacement means). The standard argument (Leviathan et al. 2023,
appendix A.1) shows that "accept x_j, else draw from the residual p_{j+1}" yields p_j.
By induction from the last sibling (whose "else" is the exact draw from p_{m+1})
backwards, the first sibling yields p: the token emitted at the node is distributed as the
target's. After an acceptance the same holds one level down, conditioned on the path,
so the emitted sequence has the target's distribution. The rejected x_j has no mass in
p_{j+1} (rejection needs p_j(x_j) < q_j(x_j)), so removing it from q_{j+1} keeps the
stages consistent. Two conditions make this hold, and the drafter keeps both: the
number of children of a node never depends on those children's values (a rerank that
drops a sampled child for its own probability would bias q_j), and siblings are listed
in the order they were drawn. Drafters without probabilities (n-gram, greedy top-b
lists) count as one-hot proposals: x_j is accepted with probability p_j(x_j), and the
residual is p_j with x_j removed; deterministic candidates are exact too. They are
verified in the equivalent form the chain verifier uses (``spectune.verify.chain``): the
target draws its own token at the node from the depth's target uniform, the path moves
to the child holding that token if there is one, else the draw is emitted. The first
child holding it is kept with probability p(x_1), a later one with the mass p_j(x_j) of
the recursion, so the law is the recursion's, and every emitted token is the target's
draw at its position's number, as in plain decoding.

With one child per node this is exactly ``spectune.verify.chain.verify_sampled``: the same
acceptance test, residual and recovery (``passes``, ``residual``, ``recovered_from``, written
once in ``spectune.verify.chain``) and the same random numbers, so a width-1 tree is chain
speculation.

Random numbers (``spectune.verify.chain.verify_uniforms``): with draft probabilities, one
acceptance uniform per node in node order (drawn together; a node never reached leaves
its uniform unused, so consumption depends only on the tree's size); then one target
uniform per depth, 0 (the root) to the tree's depth, keyed by the output position the
depth decides: the token the target draws at a node of depth d (recovered, bonus or
checked against one-hot children) uses number d.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectune.draft import tree_depths
from spectune.sampling import argmax_rows, sample_with
from spectune.verify.chain import (
    VerifyResult,
    passes,
    recovered_from,
    residual,
    verify_uniforms,
)

__all__ = ["verify_tree_greedy", "verify_tree_sampled"]


def _children(parents: list[int]) -> list[list[int]]:
    """children[c]: chunk indices of chunk row c's children, in node order."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node + 1)
    return children


def verify_tree_greedy(
    tokens: Tensor,  # [n] int64, the nodes' tokens
    parents: Tensor,  # [n] int64
    target_logits: Tensor,  # [n + 1, vocab], row 0 = the root
) -> VerifyResult:
    target_argmax = argmax_rows(target_logits)  # [n + 1]
    node_tokens = tokens.tolist()
    children = _children(parents.tolist())
    path: list[int] = []
    current = 0
    while True:
        wanted = target_argmax[current]
        match = next((c for c in children[current] if node_tokens[c - 1] == wanted), None)
        if match is None:
            break
        path.append(match)
        current = match
    emitted = [node_tokens[c - 1] for c in path] + [target_argmax[current]]
    return VerifyResult(len(path), tuple(emitted), not children[current], tuple(path))


def verify_tree_sampled(
    tokens: Tensor,  # [n] int64
    parents: Tensor,  # [n] int64
    draft_probs: Tensor | None,  # [n, vocab]: row i = q at node i's parent; None = one-hot
    target_probs: Tensor,  # [n + 1, vocab] fp32, already processed
    generator: torch.Generator | None,
    target_uniforms: Tensor | None = None,  # [depth + 1]: the request's position numbers
) -> VerifyResult:
    n = tokens.shape[0]
    node_tokens = tokens.tolist()
    parent_list = parents.tolist()
    children = _children(parent_list)
    depth = max(tree_depths(parent_list), default=0)
    uniforms, target_uniforms = verify_uniforms(
        n, draft_probs is not None, depth + 1, generator, target_uniforms
    )
    path: list[int] = []
    current = 0
    while True:
        target_row = target_probs[current]  # p_1 at this node: [vocab]
        number = target_uniforms[len(path)]  # the node's depth decides this position
        kids = children[current]
        if not kids:  # a leaf (or the root of an empty tree): the bonus token
            last = sample_with(target_row, number)
            break
        accepted_child: int | None = None
        if draft_probs is None or uniforms is None:
            # One-hot children: the target's own draw, kept where a child holds it.
            last = sample_with(target_row, number)
            accepted_child = next((c for c in kids if node_tokens[c - 1] == int(last)), None)
            if accepted_child is None:
                break
            path.append(accepted_child)
            current = accepted_child
            continue
        draft_row = draft_probs[kids[0] - 1]  # q_1 at this node: [vocab]
        left = target_row  # p_j: the target row less the siblings rejected so far
        for j, child in enumerate(kids):
            token = node_tokens[child - 1]
            if bool(passes(uniforms[child - 1], draft_row[token], left[token])):  # u < p_j / q_j
                accepted_child = child
                break
            left = residual(left, draft_row, token)  # p_j - q_j
            if j + 1 < len(kids):
                # The next sibling's stage needs p_{j+1} and q_{j+1} normalised; the last
                # residual is sampled as is (``sample_with`` scales by its mass), exactly
                # as the chain verifier does.
                left = _normalised(left, target_row)
                draft_row = draft_row.clone()
                draft_row[token] = 0.0
                draft_row = _normalised(draft_row, draft_row)
        if accepted_child is None:
            last = sample_with(recovered_from(left, target_row), number)
            break
        path.append(accepted_child)
        current = accepted_child
    emitted = [node_tokens[c - 1] for c in path] + [int(last)]
    return VerifyResult(len(path), tuple(emitted), not children[current], tuple(path))


def _normalised(row: Tensor, fallback: Tensor) -> Tensor:
    total = row.sum()
    return row / total if total > 0 else fallback

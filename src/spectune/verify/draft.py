"""Verification's one entry point: a draft and a way to score it in, a verdict out.

Step 5 of the loop (``spectune.decode``). The engine hands over the draft and ``score``,
which runs the target over chunk rows ``[start, end)`` (row 0 the pending token, row i
the i-th draft token) and returns their raw logits; the verifier owns the logit
processing (as vLLM's rejection sampler does), so the sampling parameters reach
``spectune.sampling`` by this one road. A chain is verified in ``groups`` consecutive
target passes (one group: one pass; ``spectune.verify.grouped``), a tree (``parents``
set) in one pass with its ancestor mask (``spectune.verify.tree``). The arithmetic and
its glossary are in ``spectune.verify.chain``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.sampling import SamplingParams
from spectune.verify.chain import VerifyResult, target_distribution
from spectune.verify.grouped import verify_in_groups
from spectune.verify.tree import verify_tree_greedy, verify_tree_sampled

__all__ = ["Score", "positions", "verify_draft"]

# (start, end) -> the target's raw logits at chunk rows [start, end): [end - start, vocab]
Score = Callable[[int, int], Tensor]


def verify_draft(
    draft: Draft,
    score: Score,
    params: SamplingParams,
    generator: torch.Generator,
    *,
    groups: int = 1,
    target_uniforms: Tensor | None = None,
) -> VerifyResult:
    """Greedy matching at temperature 0, rejection sampling otherwise; a tree draft goes
    to the multi-branch verifier in one pass, a chain in ``groups`` passes.
    ``target_uniforms``: [positions(draft)], the request's numbers for the output
    positions the step may decide (``spectune.sampling.PositionStream``); None draws them
    from ``generator``."""
    if draft.parents is None:
        return verify_in_groups(
            draft.tokens, draft.probs, score, groups, params, generator, target_uniforms
        )
    target_logits = score(0, len(draft) + 1)  # [n + 1, vocab]
    if params.greedy:
        return verify_tree_greedy(draft.tokens, draft.parents, target_logits)
    target_probs = target_distribution(target_logits, params)  # [n + 1, vocab]
    return verify_tree_sampled(
        draft.tokens, draft.parents, draft.probs, target_probs, generator, target_uniforms
    )


def positions(draft: Draft) -> int:
    """Output positions a step with ``draft`` may decide: its depth (a chain's length), and
    one more for the bonus token."""
    return 1 + (len(draft) if draft.parents is None else (draft.depth or 0))

"""The verifier's dispatch: which verification a draft gets (greedy or sampled, chain or tree).

Step 5 of the loop (``spectune.decode.engine``). The arithmetic lives in
``spectune.verify.chain`` (the glossary), ``spectune.verify.tree`` and
``spectune.verify.grouped``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spectune.draft import Draft
from spectune.sampling import SamplingParams, process_logits
from spectune.verify.chain import VerifyResult, verify_greedy, verify_sampled
from spectune.verify.tree import verify_tree_greedy, verify_tree_sampled

__all__ = ["verify_draft"]


def verify_draft(
    draft: Draft,
    target_logits: Tensor,  # [k + 1, vocab]
    params: SamplingParams,
    generator: torch.Generator,
) -> VerifyResult:
    """Step 5: greedy matching at temperature 0, rejection sampling otherwise; a tree
    draft (``parents`` set) goes to the multi-branch verifier (``spectune.verify.tree``)."""
    if params.greedy:
        if draft.parents is not None:
            return verify_tree_greedy(draft.tokens, draft.parents, target_logits)
        return verify_greedy(draft.tokens, target_logits)
    target_probs = process_logits(target_logits, params)  # [k + 1, vocab]
    if not math.isfinite(float(target_probs.sum())):
        raise FloatingPointError("the target produced non-finite probabilities")
    if draft.parents is not None:
        return verify_tree_sampled(
            draft.tokens, draft.parents, draft.probs, target_probs, generator
        )
    return verify_sampled(draft.tokens, draft.probs, target_probs, generator)

"""The pieces of a decoding step that every engine shares: prompt and draft checks, the
request's random stream, KV compaction of the accepted path, and stopping.

The single-sequence engine (``spectune.decode.engine``) and the batched one
(``spectune.decode.batch``) both call these, so they check, keep and stop identically.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from spectune.control.base import KPolicy
from spectune.control.fallback import batch_limited
from spectune.draft import MAX_TREE_NODES, Draft, check_parents, tree_depths, trim_tree
from spectune.drafters.base import model_free
from spectune.errors import DrafterError, PromptError
from spectune.models.base import KVCache
from spectune.records import MAX_K, StepRecord, StopCondition
from spectune.sampling import SamplingParams

__all__ = [
    "CHUNK_SLACK",
    "SequenceUpdate",
    "check_draft",
    "check_prompt",
    "crossover_gate",
    "cut_at_stops",
    "fit_to_room",
    "keep_path",
    "request_generator",
]

# Slots a step may write past the context: the pending token plus a chain or a tree.
CHUNK_SLACK = max(MAX_K, MAX_TREE_NODES) + 1


@dataclass(frozen=True)
class SequenceUpdate:
    """What one step did for one request of a batch (both batch engines return these)."""

    request_id: str
    record: StepRecord


def check_prompt(prompt: Sequence[int], vocab_size: int, context: int) -> list[int]:
    """The prompt as a list, or a ``PromptError`` saying why it cannot be decoded."""
    tokens = list(prompt)
    if not tokens:
        raise PromptError("the prompt is empty")
    if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in tokens):
        raise PromptError(f"the prompt holds token ids outside the vocabulary of {vocab_size}")
    if len(tokens) >= context:
        raise PromptError(f"the prompt has {len(tokens)} tokens; the context holds {context}")
    return tokens


def request_generator(params: SamplingParams) -> torch.Generator:
    """A request's own random stream: seeded by ``params.seed``, else from the OS."""
    generator = torch.Generator()
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def crossover_gate(
    policy: KPolicy,
    params: SamplingParams,
    drafter: object | None,  # the request's drafter or the batch's draft rows; None: none
    batch_size: Callable[[], int],
    limit: int | None,
) -> KPolicy:
    """``policy`` behind the batch-size check (``spectune.control.fallback.batch_limited``:
    no speculation above ``limit`` sequences), except for a seeded, sampled request whose
    drafts may carry probabilities (a draft model, a feature head, a hybrid).

    Why the exception: such a request's tokens depend on which positions were drafted
    (rejection sampling and plain sampling are different random processes with the same
    law), so holding its K at 0 in a large batch would change what its seed gives. It
    speculates by its own policy at any batch size instead, and decodes as it would alone.
    A request with a model-free drafter (one-hot drafts) needs no exception: its tokens are
    the target's draws at its position numbers at any K (``spectune.verify.chain``).
    """
    if drafter is not None and not params.greedy and params.seed is not None:
        if not model_free(drafter):
            return policy
    return batch_limited(policy, batch_size, limit)


def cut_at_stops(
    emitted: list[int],
    output: list[int],
    max_tokens: int,
    eos: Collection[int],
    stop: StopCondition | None,
) -> tuple[list[int], str | None]:
    """Step 7 of every decoding loop: cut a step's tokens at EOS, ``max_tokens`` and a stop.

    ``output`` (the request's tokens before this step) is extended in place with what is
    kept. Returns (the kept tokens, the finish reason or None). Shared by the single-
    sequence and the batched engines so both stop identically.
    """
    remaining = max_tokens - len(output)
    finish: str | None = None
    for i, token in enumerate(emitted):
        if token in eos:
            emitted, finish = emitted[: i + 1], "eos"
            break
    if len(output) + len(emitted) >= max_tokens:
        if finish is None or len(output) + len(emitted) > max_tokens:
            emitted, finish = emitted[:remaining], "length"
    output.extend(emitted)
    if stop is not None:
        keep = stop.check(output)
        if keep is not None:
            emitted = emitted[: max(0, len(emitted) - (len(output) - keep))]
            del output[keep:]
            finish = "stop"
    return emitted, finish


def check_draft(draft: Draft, k: int, vocab_size: int) -> Draft:
    """Reject drafts the verifier cannot use; callers fall back on ``DrafterError``."""
    tokens = draft.tokens
    if tokens.dim() != 1 or tokens.dtype != torch.long:
        raise DrafterError("draft tokens must be a 1-D int64 tensor")
    if draft.parents is None and tokens.shape[0] > k:
        raise DrafterError(f"a chain draft holds at most {k} tokens, got {tokens.shape[0]}")
    if draft.parents is not None:
        check_parents(draft.parents, tokens.shape[0])
        if tokens.shape[0] and max(tree_depths(draft.parents.tolist())) > k:
            raise DrafterError(f"a draft tree is at most {k} deep")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise DrafterError("draft token ids outside the target's vocabulary")
    if draft.probs is not None:
        probs = draft.probs
        if probs.shape != (tokens.shape[0], vocab_size):
            raise DrafterError(f"draft probabilities must be [{tokens.shape[0]}, {vocab_size}]")
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise DrafterError("draft probabilities hold NaN, infinite or negative values")
        sums = probs.sum(-1)
        if tokens.numel() and not bool(((sums - 1).abs() < 1e-3).all()):
            raise DrafterError("draft probabilities do not sum to 1")
    return draft


def fit_to_room(draft: Draft, max_nodes: int) -> Draft:
    """Cut a tree to the slots left in the context (a chain already fits: k <= room - 1)."""
    if draft.parents is None or len(draft) <= max_nodes:
        return draft
    return Draft(*trim_tree(draft.tokens, draft.probs, draft.parents, max_nodes))


def keep_path(cache: KVCache, row: int, length_before: int, path: Sequence[int]) -> None:
    """Step 6 for any draft: keep the root and the accepted ``path`` (chunk indices, root
    excluded) of the chunk written at ``length_before``, contiguously; forget the rest.

    For a chain the accepted path already sits in place (``path == 1..a``): only the
    length moves. For a tree the path's entries are copied down (``move_slots``), so
    the cache again holds exactly the committed tokens at their own positions.
    """
    if list(path) != list(range(1, len(path) + 1)):
        src = length_before + torch.tensor(list(path), dtype=torch.long)  # [a]
        cache.move_slots(row, src, length_before + 1)
    cache.truncate(length_before + 1 + len(path), row)

"""The speculative decoding loop, shared by the CLI, the server and the benchmark.

The engine knows nothing about text: it turns prompt token ids into output token ids
and yields one typed ``StepRecord`` per step. Text, chat templates and stop strings are
handled by the caller through ``StopCondition``.

Cache invariant: between steps the target cache holds every committed token except the
last one (the *pending* token). A step forwards ``[pending, draft_1..draft_k]`` in one
pass, so the logits at row i score draft token i + 1 and row k gives the bonus token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from spectune.chunked import GroupedVerification, verify_in_groups
from spectune.control.base import FixedK, KPolicy
from spectune.devices import VerifyMemory, model_device
from spectune.drafters.base import Draft, Drafter, TargetFeatures
from spectune.errors import DrafterError, InvalidParameterError, PromptError
from spectune.models.base import KVCache, LanguageModel
from spectune.sampling import SamplingParams, process_logits
from spectune.tree import (
    MAX_TREE_NODES,
    check_parents,
    keep_path,
    tree_depths,
    tree_layout,
    trim_tree,
)
from spectune.tree_verify import verify_tree_greedy, verify_tree_sampled
from spectune.verify import VerifyResult, verify_greedy, verify_sampled

__all__ = [
    "CHUNK_SLACK",
    "MAX_K",
    "Generation",
    "SpeculativeEngine",
    "StepRecord",
    "StopCondition",
    "check_draft",
    "check_prompt",
    "request_generator",
    "cut_at_stops",
    "fit_to_room",
    "validate_k",
    "verify_draft",
]

MAX_K = 32  # beyond this a chain draft is never accepted in full; larger K is a mistake
# Slots a step may write past the context: the pending token plus a chain or a tree.
CHUNK_SLACK = max(MAX_K, MAX_TREE_NODES) + 1


def validate_k(k: int, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not isinstance(k, int) or isinstance(k, bool) or not low <= k <= MAX_K:
        raise InvalidParameterError(
            f"K (draft tokens per step) must be in [{low}, {MAX_K}], got {k}"
        )
    return k


class StopCondition(Protocol):
    def check(self, output: Sequence[int]) -> int | None:
        """If the output now contains a stop, the number of tokens to keep; else None."""
        ...


@dataclass(frozen=True)
class StepRecord:
    """What one step did. Rates are derived from these counts when reported."""

    index: int
    k: int  # draft tokens asked of the drafter (0: a plain decoding step)
    drafted: int  # draft tokens the drafter returned (<= k)
    accepted: int  # draft tokens the target kept
    emitted: tuple[int, ...]  # tokens appended to the output, after stop truncation
    draft_time: float  # seconds spent drafting
    target_time: float  # seconds in the target's forward pass
    step_time: float  # wall seconds for the whole step (draft + target + verify + bookkeeping)
    fallback: str | None = None  # why speculation was off or cut short this step, if it was
    finish_reason: str | None = None  # "eos" | "length" | "stop" once the request is done
    verify_groups: int = 1  # target passes the verification took (chunked: > 1)
    tree_depth: int | None = None  # a tree draft's longest path; None for a chain
    # Peak memory of the verification pass (spectune.devices.VerifyMemory: the CUDA
    # allocator's peak above resident, or on the CPU the bytes of its tensors from shapes);
    # None where not measured (older traces, test doubles).
    verify_peak_bytes: int | None = None

    @property
    def positions(self) -> int:
        """Draft positions tested along one path: a chain's length, a tree's depth. The
        denominator of acceptance: a tree of 8 nodes and depth 2 can keep 2 tokens at
        most, so accepted / drafted would understate how well it did."""
        return self.drafted if self.tree_depth is None else self.tree_depth


@dataclass
class Generation:
    """A finished request: the output tokens and every step's record."""

    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    prefill_time: float = 0.0
    finish_reason: str | None = None

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over the draft positions tested (``StepRecord.positions``)."""
        positions = sum(s.positions for s in self.steps)
        return self.accepted / positions if positions else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per step, the bonus or recovered token included."""
        return len(self.tokens) / len(self.steps) if self.steps else 0.0

    @property
    def decode_time(self) -> float:
        return sum(s.step_time for s in self.steps)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.decode_time if self.decode_time > 0 else 0.0


class SpeculativeEngine:
    """Decodes one request at a time with a target model and an optional drafter."""

    def __init__(
        self, target: LanguageModel, drafter: Drafter | None = None, *, verify_groups: int = 1
    ) -> None:
        """``verify_groups > 1`` verifies chain drafts group by group (``spectune.chunked``);
        a policy that implements ``GroupedVerification`` chooses per step instead."""
        if verify_groups < 1:
            raise InvalidParameterError(f"verify_groups must be >= 1, got {verify_groups}")
        self.target = target
        self.drafter = drafter
        self.verify_groups = verify_groups

    def run(self, prompt: Sequence[int], params: SamplingParams, **kwargs: object) -> Generation:
        """Decode to completion and collect the result (see ``generate`` for arguments)."""
        result = Generation(prompt_tokens=list(prompt))
        start = time.perf_counter()
        for record in self.generate(prompt, params, **kwargs):  # type: ignore[arg-type]
            result.tokens.extend(record.emitted)
            result.steps.append(record)
            result.finish_reason = record.finish_reason
        # Whatever the steps did not account for is the prefill (and the first setup).
        result.prefill_time = time.perf_counter() - start - result.decode_time
        return result

    def generate(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        policy: KPolicy | None = None,
        generator: torch.Generator | None = None,
        stop: StopCondition | None = None,
    ) -> Iterator[StepRecord]:
        """Yield one ``StepRecord`` per step until EOS, ``max_tokens``, a stop or the context end.

        Random numbers come only from ``generator`` (or a new one seeded with
        ``params.seed``), in this order per step: the drafter's draws, then the verifier's.
        """
        target = self.target
        info = target.info
        prompt = check_prompt(prompt, info.vocab_size, info.max_context)
        generator = generator or request_generator(params)
        policy = policy or FixedK(4 if self.drafter is not None else 0)
        drafter = self.drafter
        eos = set(info.eos_token_ids)
        capacity = min(info.max_context, len(prompt) + params.max_tokens + CHUNK_SLACK)
        device = model_device(target)

        # 1. Prefill: the target ingests all but the last prompt token (the pending token).
        cache = target.new_cache(capacity=capacity)
        context = list(prompt)
        features: TargetFeatures | None = None
        if len(prompt) > 1:
            out = target.forward(torch.tensor([prompt[:-1]]), cache)
            if out.hidden is not None:
                features = TargetFeatures(0, out.hidden[0])
        if drafter is not None:
            drafter.reset()
            drafter.commit(context, features)

        output: list[int] = []
        drafter_failure: str | None = None
        index = 0
        while True:
            step_start = time.perf_counter()
            remaining = params.max_tokens - len(output)
            room = capacity - len(context)  # slots left, the pending token's included
            # 2. How many tokens to draft: the policy's K, never past max_tokens or the
            #    context (a step emits at most k + 1 tokens).
            k = 0 if drafter is None or drafter_failure else policy.next_k()
            k = max(0, min(k, remaining - 1, room - 1))
            fallback = drafter_failure or (policy.reason if k == 0 else None)

            # 3. Draft (a chain, or a tree when the drafter returns parents).
            draft_time = 0.0
            draft = Draft(torch.zeros(0, dtype=torch.long), None)
            if k > 0 and drafter is not None:
                draft_start = time.perf_counter()
                try:
                    proposed = drafter.propose(context, k, params, generator)
                    draft = fit_to_room(check_draft(proposed, k, info.vocab_size), room - 1)
                except Exception as exc:  # any drafter failure falls back to plain decoding
                    drafter_failure = f"drafter_error: {exc}".splitlines()[0][:200]
                    fallback = drafter_failure
                    draft = Draft(torch.zeros(0, dtype=torch.long), None)
                draft_time = time.perf_counter() - draft_start

            # 4. One target pass over the pending token and the draft (a tree goes in with
            #    depth positions and an ancestor mask, see spectune.tree).
            target_start = time.perf_counter()
            memory = VerifyMemory(device)
            length_before = cache.length()
            chunk = torch.cat((torch.tensor([context[-1]]), draft.tokens)).view(1, -1)
            groups = 1
            if draft.parents is None and len(draft) > 1:
                groups = self._groups(policy, len(draft))
            if groups > 1:
                # 4-5. Chunked: one pass per group, each verified as it comes, stopping at
                #      the first rejection (the same tokens as one pass, spectune.chunked).
                result, hidden_states = self._verify_chunked(
                    chunk, cache, draft, groups, params, generator
                )
                target_time = time.perf_counter() - target_start
            else:
                if draft.parents is None:
                    out = target.forward(chunk, cache)
                else:
                    positions, mask = tree_layout(draft.parents, length_before)
                    out = target.forward(
                        chunk, cache, positions=positions[None], chunk_mask=mask[None]
                    )
                target_time = time.perf_counter() - target_start
                hidden_states = None if out.hidden is None else out.hidden[0]

                # 5. Verify.
                result = verify_draft(draft, out.logits[0], params, generator)
            rows = chunk.shape[1]
            verify_peak = memory.peak_bytes(
                rows=rows,
                context=length_before + rows,
                vocab=info.vocab_size,
                sampled=not params.greedy,
            )

            # 6. Keep the accepted path (a tree's is compacted), drop the rest; tell the
            #    drafter what was committed.
            keep_path(cache, 0, length_before, result.path)
            emitted = list(result.tokens)
            context.extend(emitted)

            # 7. Stop: EOS, max_tokens, stop condition (each may cut the emitted tokens).
            emitted, finish = cut_at_stops(emitted, output, params.max_tokens, eos, stop)
            if finish is None and len(context) >= capacity:
                finish = "length"  # the context is full
            if drafter is not None and finish is None:
                hidden = None if hidden_states is None else hidden_states[[0, *result.path]]
                drafter.commit(
                    context,
                    None if hidden is None else TargetFeatures(length_before, hidden),
                )
            record = StepRecord(
                index=index,
                k=k,
                drafted=len(draft),
                accepted=result.num_accepted,
                emitted=tuple(emitted),
                draft_time=draft_time,
                target_time=target_time,
                step_time=time.perf_counter() - step_start,
                fallback=fallback,
                finish_reason=finish,
                verify_groups=groups,
                tree_depth=(
                    None
                    if draft.parents is None
                    else max(tree_depths(draft.parents.tolist()), default=0)
                ),
                verify_peak_bytes=verify_peak,
            )
            policy.observe(record)
            yield record
            if finish is not None:
                return
            index += 1

    def _groups(self, policy: KPolicy, k: int) -> int:
        choice = policy.verify_groups(k) if isinstance(policy, GroupedVerification) else None
        return self.verify_groups if choice is None else max(1, int(choice))

    def _verify_chunked(
        self,
        chunk: Tensor,  # [1, k + 1]: the pending token and a chain draft
        cache: KVCache,
        draft: Draft,
        groups: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[VerifyResult, Tensor | None]:
        """Returns the verdict and the hidden states of the rows scored ([rows, hidden])."""
        hidden: list[Tensor] = []

        def score(start: int, end: int) -> Tensor:
            out = self.target.forward(chunk[:, start:end], cache)
            if out.hidden is not None:
                hidden.append(out.hidden[0])
            return out.logits[0]

        result = verify_in_groups(draft.tokens, draft.probs, score, groups, params, generator)
        return result, torch.cat(hidden) if hidden else None


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


def verify_draft(
    draft: Draft,
    target_logits: Tensor,  # [k + 1, vocab]
    params: SamplingParams,
    generator: torch.Generator,
) -> VerifyResult:
    """Step 5: greedy matching at temperature 0, rejection sampling otherwise; a tree
    draft (``parents`` set) goes to the multi-branch verifier (``spectune.tree_verify``)."""
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


def fit_to_room(draft: Draft, max_nodes: int) -> Draft:
    """Cut a tree to the slots left in the context (a chain already fits: k <= room - 1)."""
    if draft.parents is None or len(draft) <= max_nodes:
        return draft
    return Draft(*trim_tree(draft.tokens, draft.probs, draft.parents, max_nodes))

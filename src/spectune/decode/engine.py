"""The speculative decoding loop, shared by the CLI, the server and the benchmark.

The engine knows nothing about text: it turns prompt token ids into output token ids
and yields one typed ``StepRecord`` per step. Text, chat templates and stop strings are
handled by the caller through ``StopCondition``.

Cache invariant: between steps the target cache holds every committed token except the
last one (the *pending* token). A step forwards ``[pending, draft_1..draft_k]`` in one
pass, so the logits at row i score draft token i + 1 and row k gives the bonus token.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from spectune.control.base import FixedK, GroupedVerification, KPolicy
from spectune.decode.step import (
    CHUNK_SLACK,
    check_draft,
    check_prompt,
    cut_at_stops,
    fit_to_room,
    keep_path,
    request_generator,
)
from spectune.draft import Draft, empty_draft, tree_layout
from spectune.drafters.base import Drafter, TargetFeatures
from spectune.errors import InvalidParameterError
from spectune.models.base import KVCache, LanguageModel
from spectune.models.devices import VerifyMemory, model_device
from spectune.records import (
    CountsReport,
    SpecCounts,
    StepRecord,
    StopCondition,
    drafter_error,
)
from spectune.sampling import SamplingParams
from spectune.verify.chain import VerifyResult
from spectune.verify.draft import verify_draft
from spectune.verify.grouped import verify_in_groups

__all__ = ["Generation", "SpeculativeEngine"]


@dataclass
class Generation(CountsReport):
    """A finished request: the output tokens and every step's record, with the steps'
    counters (filled through ``add``; the rates of ``CountsReport`` are derived there)."""

    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    prefill_time: float = 0.0
    finish_reason: str | None = None
    counts: SpecCounts = field(default_factory=SpecCounts)

    def add(self, record: StepRecord) -> None:
        """Take one step's record: its tokens, the record itself, its counts, the finish
        reason."""
        self.tokens.extend(record.emitted)
        self.steps.append(record)
        self.counts.add(record)
        self.finish_reason = record.finish_reason

    @property
    def decode_time(self) -> float:
        return self.counts.step_time


class SpeculativeEngine:
    """Decodes one request at a time with a target model and an optional drafter."""

    def __init__(
        self, target: LanguageModel, drafter: Drafter | None = None, *, verify_groups: int = 1
    ) -> None:
        """``verify_groups > 1`` verifies chain drafts group by group (``spectune.verify.grouped``);
        a policy that implements ``GroupedVerification`` chooses per step instead."""
        if verify_groups < 1:
            raise InvalidParameterError(f"verify_groups must be >= 1, got {verify_groups}")
        self.target = target
        self.drafter = drafter
        self.verify_groups = verify_groups

    def run(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        policy: KPolicy | None = None,
        generator: torch.Generator | None = None,
        stop: StopCondition | None = None,
    ) -> Generation:
        """Decode to completion and collect the result (see ``generate`` for arguments)."""
        result = Generation(prompt_tokens=list(prompt))
        start = time.perf_counter()
        for record in self.generate(prompt, params, policy=policy, generator=generator, stop=stop):
            result.add(record)
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
            draft = empty_draft()
            if k > 0 and drafter is not None:
                draft_start = time.perf_counter()
                try:
                    proposed = drafter.propose(context, k, params, generator)
                    draft = fit_to_room(check_draft(proposed, k, info.vocab_size), room - 1)
                except Exception as exc:  # any drafter failure falls back to plain decoding
                    drafter_failure = drafter_error(exc)
                    fallback = drafter_failure
                    draft = empty_draft()
                draft_time = time.perf_counter() - draft_start

            # 4. One target pass over the pending token and the draft (a tree goes in with
            #    depth positions and an ancestor mask, see spectune.draft).
            target_start = time.perf_counter()
            memory = VerifyMemory(device)
            length_before = cache.length()
            chunk = torch.cat((torch.tensor([context[-1]]), draft.tokens)).view(1, -1)
            groups = 1
            if draft.parents is None and len(draft) > 1:
                groups = self._groups(policy, len(draft))
            if groups > 1:
                # 4-5. Chunked: one pass per group, each verified as it comes, stopping at
                #      the first rejection (the same tokens as one pass, spectune.verify.grouped).
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
                tree_depth=draft.depth,
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

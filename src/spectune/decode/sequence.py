"""One request's decoding state, and the verbs of a step that every engine shares.

A step of one sequence, in the loop's numbering (``spectune.decode.engine``):

2. ``plan``: how many tokens to draft: the K of the policy's ``StepPlan``, clamped so the
   step never passes ``max_tokens`` or the context (a step emits at most k + 1 tokens);
   0 after the drafter failed. The reason speculation is off, if it is.
3. ``accept``: what the drafter proposed, checked (``check_draft``) and cut to the room
   left (``fit_to_room``); a refusal or a failure becomes the step's fallback (a
   permanent one turns drafting off for the rest of the request).
4-5. The engine runs the target and verifies (``spectune.verify.draft.verify_draft``):
   the single engine one row, the batched engine every row at once.
6-7. ``settle``: keep the accepted path in the cache (a tree's compacted), stop at EOS,
   ``max_tokens``, a stop or the context end, tell the drafter what was committed, build
   the ``StepRecord`` and let the policy observe it.

The single-sequence engine holds one ``SequenceState``, the batched engine one per row;
both call these verbs, so they plan, check, keep, stop and record identically, and a fix
lands once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from spectune.control.base import KPolicy, StepPlan
from spectune.decode.step import (
    CHUNK_SLACK,
    check_draft,
    check_prompt,
    cut_at_stops,
    fit_to_room,
    keep_path,
)
from spectune.draft import Draft, Refusal, empty_draft
from spectune.models.base import KVCache, ModelInfo
from spectune.records import StepRecord, StopCondition
from spectune.sampling import PositionStream, SamplingParams
from spectune.verify.chain import VerifyResult
from spectune.verify.draft import positions

__all__ = ["SequenceState", "Step"]


@dataclass
class Step:
    """One step of one sequence while it runs: what its record is built from."""

    start: float  # perf_counter when the step began
    k: int  # draft tokens asked of the drafter (0: a plain step)
    fallback: str | None  # why speculation was off or cut short this step, if it was
    plan: StepPlan  # the policy's answer, whose verification groups ``accept`` reads
    draft: Draft = field(default_factory=empty_draft)
    verify_groups: int = 1  # target passes the verification takes (a chain: >= 1)
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_peak_bytes: int | None = None  # spectune.models.devices.VerifyMemory's figure
    shadow_token: int | None = None  # a plain step's shadow guess (StepPlan.shadow)


@dataclass
class SequenceState:
    """A request's mutable decoding state, owned by an engine (``start`` builds one)."""

    request_id: str
    params: SamplingParams
    generator: torch.Generator
    # The numbers of the tokens the target draws itself, by output position (split from
    # ``generator`` when the request starts: its first draw, whatever the temperature).
    stream: PositionStream
    policy: KPolicy
    stop: StopCondition | None
    context: list[int]  # prompt + output, the pending (last) token included
    prompt_length: int  # len(context) - prompt_length: the next output position
    capacity: int  # most tokens this sequence may hold (context and draft)
    vocab_size: int
    eos: Collection[int]
    # Chained verification groups when the policy states no preference; None: one pass
    # always (the batched engine verifies every row from one target pass).
    verify_groups: int | None = 1
    row: int = 0  # the sequence's row in its engine's caches
    output: list[int] = field(default_factory=list)
    drafter_failure: str | None = None  # set once the drafter failed: plain to the end
    index: int = 0

    @classmethod
    def start(
        cls,
        request_id: str,
        prompt: Sequence[int],
        params: SamplingParams,
        info: ModelInfo,
        context_limit: int,
        *,
        policy: KPolicy,
        generator: torch.Generator,
        stop: StopCondition | None,
        verify_groups: int | None = 1,
        row: int = 0,
    ) -> SequenceState:
        """Check the prompt (``PromptError``) against ``context_limit`` tokens; the
        sequence may hold the prompt, ``max_tokens`` and one step's slack, within it."""
        tokens = check_prompt(prompt, info.vocab_size, context_limit)
        capacity = min(context_limit, len(tokens) + params.max_tokens + CHUNK_SLACK)
        return cls(
            request_id,
            params,
            generator,
            PositionStream.split_from(generator),
            policy,
            stop,
            tokens,
            len(tokens),
            capacity,
            info.vocab_size,
            frozenset(info.eos_token_ids),
            verify_groups,
            row,
        )

    def target_uniforms(self, step: Step) -> Tensor | None:
        """[positions(step.draft)]: the numbers of the output positions this step may
        decide (``spectune.verify.chain``), None when greedy (no numbers are drawn)."""
        if self.params.greedy:
            return None
        return self.stream.at(len(self.context) - self.prompt_length, positions(step.draft))

    def plan(self, *, drafting: bool, start: float) -> Step:
        """Step 2: K for this step (``drafting``: the engine has a drafter)."""
        remaining = self.params.max_tokens - len(self.output)
        room = self.capacity - len(self.context)  # slots left, the pending token's included
        plan = self.policy.plan()
        k = plan.k if drafting and not self.drafter_failure else 0
        k = max(0, min(k, remaining - 1, room - 1))
        reason = self.drafter_failure or (plan.reason if k == 0 else None)
        return Step(start, k, reason, plan)

    def accept(self, step: Step, proposal: Draft | Refusal) -> None:
        """Step 3: the proposal checked and fitted becomes ``step.draft``; a refusal or a
        draft the verifier cannot use leaves the step plain, with its reason."""
        if isinstance(proposal, Refusal):
            step.fallback = proposal.reason
            if proposal.permanent:
                self.drafter_failure = proposal.reason
            return
        room = self.capacity - len(self.context)
        try:
            step.draft = fit_to_room(check_draft(proposal, step.k, self.vocab_size), room - 1)
        except Exception as exc:  # any unusable draft falls back to plain decoding
            self.drafter_failure = step.fallback = Refusal.error(exc).reason
            return
        step.verify_groups = self._groups(step.plan, step.draft)

    def _groups(self, plan: StepPlan, draft: Draft) -> int:
        if self.verify_groups is None or draft.parents is not None or len(draft) <= 1:
            return 1
        choice = plan.groups_for(len(draft))
        return self.verify_groups if choice is None else choice

    def settle(
        self,
        step: Step,
        result: VerifyResult,
        cache: KVCache,
        length_before: int,
        commit: Callable[[list[int]], None] | None,
    ) -> StepRecord:
        """Steps 6-7: keep the accepted path of the chunk written at ``length_before`` in
        this sequence's row of ``cache``, stop, and record. ``commit(rows)`` tells the
        drafter what was committed (``rows``: the chunk rows kept, the pending token's
        first) unless the request finished or its drafter failed."""
        keep_path(cache, self.row, length_before, result.path)
        self.context.extend(result.tokens)
        emitted, finish = cut_at_stops(
            list(result.tokens), self.output, self.params.max_tokens, self.eos, self.stop
        )
        if finish is None and len(self.context) >= self.capacity:
            finish = "length"  # the context is full
        if commit is not None and finish is None and not self.drafter_failure:
            commit([0, *result.path])
        record = StepRecord(
            index=self.index,
            k=step.k,
            num_draft_tokens=len(step.draft),
            accepted=result.num_accepted,
            emitted=tuple(emitted),
            draft_time=step.draft_time,
            target_time=step.target_time,
            step_time=time.perf_counter() - step.start,
            fallback=step.fallback,
            finish_reason=finish,
            verify_groups=step.verify_groups,
            tree_depth=step.draft.depth,
            verify_peak_bytes=step.verify_peak_bytes,
            shadow_hit=(
                None
                if step.shadow_token is None or not result.tokens
                else result.tokens[0] == step.shadow_token
            ),
        )
        self.policy.observe(record)
        self.index += 1
        return record

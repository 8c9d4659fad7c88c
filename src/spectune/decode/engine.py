"""The speculative decoding loop, shared by the CLI, the server and the benchmark.

The engine knows nothing about text: it turns prompt token ids into output token ids
and yields one typed ``StepRecord`` per step. Text, chat templates and stop strings are
handled by the caller through ``StopCondition``.

Cache invariant: between steps the target cache holds every committed token except the
last one (the *pending* token). A step forwards ``[pending, draft_1..draft_k]`` in one
pass (or one pass per group, ``spectune.verify.grouped``), so the logits at row i score
draft token i + 1 and row k gives the bonus token.

The loop is prefill plus plan, draft, score and verify, settle; the per-request verbs
(``plan``, ``accept``, ``settle``) are ``spectune.decode.sequence.SequenceState``'s, which
the batched engine (``spectune.decode.batch``) calls too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor

from spectune.control.base import FixedK, KPolicy
from spectune.decode.sequence import SequenceState, Step
from spectune.decode.step import request_generator
from spectune.draft import Draft, Refusal, tree_layout
from spectune.drafters.base import Drafter, TargetFeatures, guesses, shadow_guess
from spectune.errors import InvalidParameterError
from spectune.models.base import KVCache, LanguageModel
from spectune.models.devices import VerifyMemory, model_device
from spectune.models.threads import pace
from spectune.records import (
    CountsReport,
    SpecCounts,
    StepRecord,
    StopCondition,
)
from spectune.sampling import SamplingParams
from spectune.verify.draft import Score, verify_draft

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
        a policy whose ``StepPlan`` names groups chooses per step instead."""
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
        ``params.seed``): its first draw seeds the request's position stream
        (``spectune.sampling.PositionStream``: the numbers of the tokens the target draws
        itself, by output position); then, per step, the drafter's draws and the
        verifier's acceptance uniforms (``spectune.verify.chain``).
        """
        target = self.target
        info = target.info
        drafter = self.drafter
        device = model_device(target)
        generator = generator or request_generator(params)
        seq = SequenceState.start(
            "",
            prompt,
            params,
            info,
            info.max_context,
            policy=policy or FixedK(4 if drafter is not None else 0),
            generator=generator,
            stop=stop,
            verify_groups=self.verify_groups,
        )

        # 1. Prefill: the target ingests all but the last prompt token (the pending token).
        cache = target.new_cache(capacity=seq.capacity)
        features: TargetFeatures | None = None
        if len(seq.context) > 1:
            out = target.forward(torch.tensor([seq.context[:-1]]), cache, last_only=True)
            if out.hidden is not None:
                features = TargetFeatures(0, out.hidden[0])
        if drafter is not None:
            drafter.reset()
            drafter.commit(seq.context, features)
        guesser = drafter if drafter is not None and guesses(drafter, params) else None

        while True:
            pace()  # between steps: the CPU thread count follows the idle cores
            # 2. How many tokens to draft (the policy's K, within max_tokens and the context).
            step = seq.plan(drafting=drafter is not None, start=time.perf_counter())

            # 3. Draft (a chain, or a tree when the drafter returns parents).
            if step.k > 0 and drafter is not None:
                draft_start = time.perf_counter()
                try:
                    proposal: Draft | Refusal = drafter.propose(
                        seq.context, step.k, params, generator
                    )
                except Exception as exc:  # any drafter failure falls back to plain decoding
                    proposal = Refusal.error(exc)
                seq.accept(step, proposal)
                step.draft_time = time.perf_counter() - draft_start
            elif step.plan.shadow and guesser is not None:  # a plain step's checked guess
                draft_start = time.perf_counter()
                step.shadow_token = shadow_guess(guesser, seq.context, params, generator)
                step.draft_time = time.perf_counter() - draft_start

            # 4-5. Target passes over the pending token and the draft (one, or one per
            #      group of a chunked chain), verified as they come (spectune.verify).
            memory = VerifyMemory(device)
            length_before = cache.length()
            hidden: list[Tensor] = []
            score = self._scorer(seq.context[-1], step, cache, length_before, hidden)
            result = verify_draft(
                step.draft,
                score,
                params,
                generator,
                groups=step.verify_groups,
                target_uniforms=seq.target_uniforms(step),
            )
            rows = 1 + len(step.draft)
            step.verify_peak_bytes = memory.peak_bytes(
                rows=rows,
                context=length_before + rows,
                vocab=info.vocab_size,
                sampled=not params.greedy,
            )

            # 6-7. Keep the accepted path, stop, tell the drafter, record.
            commit = None if drafter is None else partial(self._commit, seq, hidden, length_before)
            record = seq.settle(step, result, cache, length_before, commit)
            yield record
            if record.finish_reason is not None:
                return

    def _commit(
        self, seq: SequenceState, hidden: list[Tensor], length_before: int, rows: list[int]
    ) -> None:
        """Tell the drafter the committed context, with the target's hidden states at the
        kept chunk ``rows`` when the target exposes them."""
        assert self.drafter is not None
        kept = torch.cat(hidden)[rows] if hidden else None  # [len(rows), hidden]
        features = None if kept is None else TargetFeatures(length_before, kept)
        self.drafter.commit(seq.context, features)

    def _scorer(
        self, pending: int, step: Step, cache: KVCache, length_before: int, hidden: list[Tensor]
    ) -> Score:
        """The target over chunk rows [start, end) of ``[pending, *draft]``: a chain row
        range appended to the cache, or a whole tree with its depth positions and ancestor
        mask (``spectune.draft.tree_layout``). Adds its time to ``step.target_time`` and
        collects the hidden states ([rows, hidden]) for drafters that read them."""
        draft = step.draft
        chunk = torch.cat((torch.tensor([pending]), draft.tokens)).view(1, -1)  # [1, n + 1]

        def score(start: int, end: int) -> Tensor:
            target_start = time.perf_counter()
            if draft.parents is None:
                out = self.target.forward(chunk[:, start:end], cache)
            else:
                positions, mask = tree_layout(draft.parents, length_before)
                out = self.target.forward(
                    chunk, cache, positions=positions[None], chunk_mask=mask[None]
                )
            step.target_time += time.perf_counter() - target_start
            if out.hidden is not None:
                hidden.append(out.hidden[0])
            return out.logits[0]  # [end - start, vocab]

        return score

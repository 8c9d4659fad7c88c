"""Batched speculative decoding: B sequences advance together, joining and leaving freely.

The server's continuous batching runs on this. Each ``step()`` advances every active
sequence by one speculative step:

1. K per sequence from its own policy (``SequenceState.plan``), behind a batch-size check
   (``spectune.control.fallback.BatchSizeCheck``: 0 above ``speculate_max_batch`` active
   sequences, where speculation stops paying; seeded sampled requests with a draft that
   carries probabilities are exempt, ``spectune.decode.step.crossover_gate``), and 0 for
   sequences whose drafter failed.
2. Draft: one draft pass per draft step over the batch (``spectune.drafters.batched``; a
   feature head: ``spectune.drafters.feature``), each proposal checked by
   ``SequenceState.accept``. With a ``draft_deadline``, a pass that takes longer is
   abandoned and the step decodes plainly (below).
3. One target pass over ``[batch, 1 + max K]``: row b is ``[pending_b, draft_b..., pad]``.
4. Per sequence: verify its row (``spectune.verify.draft.verify_draft``), then
   ``SequenceState.settle``: roll back its row to what it kept, stop, tell its drafter
   and policy. The single-sequence engine calls the same verbs.
5. Finished sequences leave the batch.

Layout: the n active sequences occupy rows ``0..n-1`` of one target cache (and one draft
cache); forwards run over those rows only. When a sequence leaves, the last row's
sequence is copied into its row, so the active rows stay a prefix.

Ragged rows: each row holds its own length. A row with fewer tokens than the chunk is
padded *after* its real tokens; causal attention keeps the real tokens blind to the
padding, and truncating the row to its own length forgets it. Every row can therefore be
written up to ``CHUNK_SLACK`` slots past its length (a chain or tree and padding), which
the caches reserve.

Exactness: a sequence's result equals decoding it alone with ``SpeculativeEngine``: the
same K, the same draft tokens, the same verification, the same random numbers from its
own generator in the same order, and the same position numbers for the tokens the
target draws itself (``spectune.sampling.PositionStream``). The only difference is
floating point: a batched matmul may round differently from a single-row one, which can
flip a greedy near-tie or a draw at a token boundary.
Step times in the records are the batch's (every sequence of a step shares them).

Draft deadline: a drafter that hangs must not stall the batch. With ``draft_deadline``
seconds set, the draft pass runs in a worker thread (``spectune.decode.deadline``); past the
deadline the step goes on without drafts. The late pass may still be running inside the
drafter, so the drafter is not touched again until it returns: every sequence in the
batch then decodes plainly to its end (fallback ``draft_deadline``, as for a drafter
that raised), and so do sequences that join while the late pass runs; sequences that
join after it returned draft again. Plain decoding is exact, so no output changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from spectune.control.base import FixedK, KPolicy
from spectune.control.crossover import load_crossover, runtime_of
from spectune.decode.deadline import DeadlineCall, DeadlineExceeded
from spectune.decode.sequence import SequenceState
from spectune.decode.step import (
    CHUNK_SLACK,
    SequenceUpdate,
    crossover_gate,
    request_generator,
)
from spectune.draft import Draft, Refusal, RefusalKind, chain_parents, tree_layout
from spectune.drafters.base import (
    DraftRequest,
    DraftRows,
    DraftSource,
    TargetFeatures,
    guessed_token,
    guesses,
)
from spectune.errors import BatchFullError, InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.models.devices import VerifyMemory, model_device
from spectune.models.rows import RowsCache, forward_row, forward_rows
from spectune.models.threads import pace
from spectune.records import StopCondition
from spectune.sampling import SamplingParams
from spectune.verify.draft import verify_draft

__all__ = ["BatchEngine", "SequenceUpdate"]


def _logit_rows(logits: Tensor, start: int, end: int) -> Tensor:
    """Rows [start, end) of a row's logits from the batched target pass (already run)."""
    return logits[start:end]


def tree_inputs(
    drafts: Sequence[Draft], lengths: Sequence[int], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row positions [rows, width] and chunk mask [rows, width, width] when some row
    drafted a tree: chains get the causal layout, padding sees only itself."""
    rows = len(drafts)
    positions = torch.zeros(rows, width, dtype=torch.long)  # [rows, width]
    mask = torch.eye(width, dtype=torch.bool).repeat(rows, 1, 1)  # [rows, width, width]
    for row, draft in enumerate(drafts):
        parents = chain_parents(len(draft)) if draft.parents is None else draft.parents
        row_positions, row_mask = tree_layout(parents, lengths[row])
        used = len(draft) + 1
        positions[row, :used] = row_positions
        positions[row, used:] = lengths[row] + torch.arange(used, width)  # padding
        mask[row, :used, :used] = row_mask
    return positions, mask


class BatchEngine:
    """Decodes many requests at once with a target model and an optional draft.

    ``draft``: a ``DraftSource`` the engine opens a row set of ``max_batch`` rows from: a
    ``ModelDrafter`` or a ``FeatureDrafter`` (batched draft passes), ``PerRow(factory)``
    for per-sequence drafters (``PerRow(NgramDrafter)``: prompt lookup), or None (plain
    decoding). ``capacity``: most tokens one sequence may hold (prompt + output).
    ``speculate_max_batch``: above this many active sequences every step is plain; None
    reads the crossover ``spectune experiment batch`` measured for this target and draft
    (``spectune.control.crossover``: this machine's, else the shipped one), and speculates at
    every size if there is none.
    ``policy_factory`` makes each request's K policy (default: ``FixedK(4)`` with a
    draft, ``FixedK(0)`` without).
    ``draft_deadline``: seconds a draft pass may take before the step goes on without it
    (None: no deadline; see the module docstring).
    """

    def __init__(
        self,
        target: LanguageModel,
        draft: DraftSource | None = None,
        *,
        max_batch: int = 16,
        capacity: int = 2048,
        speculate_max_batch: int | None = None,
        policy_factory: Callable[[SamplingParams], KPolicy] | None = None,
        draft_deadline: float | None = None,
    ) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {max_batch}")
        if not isinstance(capacity, int) or capacity < 2:
            raise InvalidParameterError(f"capacity must be >= 2 tokens, got {capacity}")
        if speculate_max_batch is not None and speculate_max_batch < 0:
            raise InvalidParameterError("speculate_max_batch must be >= 0")
        if max_batch > 1 and getattr(target, "compiled_steps", False):
            raise InvalidParameterError(
                "a target with compiled steps (--compile) decodes one sequence at a time: "
                f"max_batch must be 1, got {max_batch}"
            )
        self.target = target
        self.max_batch = max_batch
        try:
            self.cache = target.new_cache(batch_size=max_batch, capacity=capacity + CHUNK_SLACK)
        except ValueError as exc:
            raise InvalidParameterError(
                f"the target cannot decode a batch of {max_batch}: {exc}"
            ) from exc
        if max_batch > 1 and not isinstance(self.cache, RowsCache):
            raise InvalidParameterError(
                "batches of more than one need the native or llama.cpp runtime"
            )
        self.capacity = min(capacity, self.cache.capacity - CHUNK_SLACK)
        if self.capacity < 2:
            raise InvalidParameterError("the target's context is too short to batch")
        self.policy_factory = policy_factory
        self.drafter = (
            None
            if draft is None
            else draft.open(max_batch, self.capacity + CHUNK_SLACK, CHUNK_SLACK)
        )
        self.draft_deadline = (
            None
            if draft_deadline is None or self.drafter is None
            else DeadlineCall(draft_deadline, name="spectune-draft")
        )
        if speculate_max_batch is None and self.drafter is not None:
            # None: never measured for this target and draft
            speculate_max_batch = load_crossover(target.info, self.drafter.name, runtime_of(target))
        self.speculate_max_batch = speculate_max_batch
        self.pad = target.info.pad_token_id or 0
        self._rows: list[SequenceState] = []  # index = cache row
        self._by_id: dict[str, SequenceState] = {}

    @property
    def active(self) -> int:
        return len(self._rows)

    @property
    def has_room(self) -> bool:
        return len(self._rows) < self.max_batch

    @property
    def request_ids(self) -> tuple[str, ...]:
        """The active requests, in row order."""
        return tuple(seq.request_id for seq in self._rows)

    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        stop: StopCondition | None = None,
        policy: KPolicy | None = None,
    ) -> None:
        """Join the batch: checks the request, then prefills its row (all but the last token).

        Raises ``BatchFullError`` when every row is taken, ``InvalidParameterError`` for a
        request id already active, ``PromptError`` for a bad prompt. ``policy`` overrides
        ``policy_factory``.
        """
        info = self.target.info
        if request_id in self._by_id:
            raise InvalidParameterError(f"request {request_id!r} is already in the batch")
        if not self.has_room:
            raise BatchFullError(f"the batch is full ({self.max_batch} sequences)")
        if policy is None and self.policy_factory is not None:
            policy = self.policy_factory(params)
        elif policy is None:
            policy = FixedK(4 if self.drafter is not None else 0)
        row = len(self._rows)
        seq = SequenceState.start(
            request_id,
            prompt,
            params,
            info,
            self.capacity,
            policy=crossover_gate(
                policy, params, self.drafter, lambda: len(self._rows), self.speculate_max_batch
            ),
            generator=generator or request_generator(params),
            stop=stop,
            verify_groups=None,  # one batched target pass verifies every row
            row=row,
        )
        prompt = seq.context

        # Prefill the target row with all but the pending (last) prompt token.
        self.cache.truncate(0, row)
        features: TargetFeatures | None = None
        if len(prompt) > 1:
            out = forward_row(self.target, self.cache, row, torch.tensor([prompt[:-1]]))
            if out.hidden is not None:
                features = TargetFeatures(0, out.hidden[0])
        if self._drafter_late():
            late = Refusal(RefusalKind.DRAFT_DEADLINE, "the drafter is still in a late pass")
            seq.drafter_failure = late.reason
        elif self.drafter is not None:
            try:
                self.drafter.add(row, prompt, features)
            except Exception as exc:  # a drafter that cannot start: decode this one plainly
                seq.drafter_failure = Refusal.error(exc).reason
        self._rows.append(seq)
        self._by_id[request_id] = seq

    def cancel(self, request_id: str) -> None:
        """Remove a request and free its row; unknown or finished ids are ignored."""
        seq = self._by_id.get(request_id)
        if seq is not None:
            self._release(seq)

    def _release(self, seq: SequenceState) -> None:
        del self._by_id[seq.request_id]
        last = len(self._rows) - 1
        if seq.row != last:
            # Keep the active rows a prefix: the last row's sequence moves into the hole.
            moved = self._rows[last]
            if isinstance(self.cache, RowsCache):
                self.cache.copy_row(last, seq.row)
            if self.drafter is not None and not self._drafter_late():
                self.drafter.move(last, seq.row)
            moved.row = seq.row
            self._rows[seq.row] = moved
        self._rows.pop()
        self.cache.truncate(0, last)
        if self.drafter is not None and not self._drafter_late():
            self.drafter.free(last)

    def _drafter_late(self) -> bool:
        """A draft pass past its deadline is still running: leave the drafter alone."""
        return self.draft_deadline is not None and self.draft_deadline.busy

    def _propose(
        self, drafter: DraftRows, requests: list[DraftRequest], num_rows: int
    ) -> list[Draft | Refusal]:
        if self.draft_deadline is None:
            return drafter.propose(requests, num_rows)
        # The worker thread gets this thread's autograd modes (they are per thread).
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def propose() -> list[Draft | Refusal]:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                return drafter.propose(requests, num_rows)

        return self.draft_deadline.run(propose)

    def step(self) -> list[SequenceUpdate]:
        """One batched step over every active sequence; finished ones leave the batch."""
        seqs = list(self._rows)
        if not seqs:
            return []
        pace()  # between steps: the CPU thread count follows the idle cores
        step_start = time.perf_counter()
        num_rows = len(seqs)

        # 1. K per sequence (its policy behind the batch-size check), within max_tokens
        #    and the sequence's context.
        drafter = self.drafter
        steps = [seq.plan(drafting=drafter is not None, start=step_start) for seq in seqs]

        # 2. Draft: one batched pass per draft step; a failure falls back for its sequence.
        #    The drafter also guesses one token for the plain steps that ask for it
        #    (StepPlan.shadow, drafters.base.guesses), in the same pass: checked against
        #    the emitted token in 4.
        requests = [
            DraftRequest(seq.row, seq.context, step.k or 1, seq.params, seq.generator)
            for seq, step in zip(seqs, steps, strict=True)
            if step.k > 0
            or (
                drafter is not None
                and step.plan.shadow
                and not seq.drafter_failure
                and guesses(drafter, seq.params)
            )
        ]
        draft_time = 0.0
        if requests and drafter is not None:
            draft_start = time.perf_counter()
            try:
                proposed = self._propose(drafter, requests, num_rows)
            except DeadlineExceeded as exc:
                # Every sequence decodes plainly from now on: the late pass may still be
                # changing the drafter's state of any row.
                late = Refusal(RefusalKind.DRAFT_DEADLINE, f"{exc}; no drafts for this request")
                for seq in seqs:
                    seq.drafter_failure = seq.drafter_failure or late.reason
                proposed = [late] * len(requests)
            except Exception as exc:  # the whole pass failed: its sequences decode plainly
                proposed = [Refusal.error(exc)] * len(requests)
            for req, proposal in zip(requests, proposed, strict=True):
                if steps[req.row].k == 0:  # a shadow guess: evidence only
                    steps[req.row].shadow_token = guessed_token(proposal, req.params)
                else:
                    seqs[req.row].accept(steps[req.row], proposal)
            draft_time = time.perf_counter() - draft_start

        # 3. One target pass over [rows, 1 + longest draft], padded after each row's tokens.
        target_start = time.perf_counter()
        memory = VerifyMemory(model_device(self.target))
        drafts = [step.draft for step in steps]
        width = 1 + max(len(d) for d in drafts)
        chunk = torch.full((num_rows, width), self.pad, dtype=torch.long)  # [rows, width]
        for seq, draft in zip(seqs, drafts, strict=True):
            chunk[seq.row, 0] = seq.context[-1]
            chunk[seq.row, 1 : 1 + len(draft)] = draft.tokens
        lengths_before = [self.cache.length(r) for r in range(num_rows)]
        if all(d.parents is None for d in drafts):
            out = forward_rows(self.target, self.cache, num_rows, chunk)
        else:
            positions, mask = tree_inputs(drafts, lengths_before, width)
            out = forward_rows(self.target, self.cache, num_rows, chunk, positions, mask)
        target_time = time.perf_counter() - target_start
        verify_peak = memory.peak_bytes(
            rows=num_rows * width,
            context=max(lengths_before) + width,
            vocab=self.target.info.vocab_size,
            sampled=any(not s.params.greedy for s in seqs),
        )

        # 4. Per sequence: verify its row, keep, stop, tell the drafter, record.
        updates: list[SequenceUpdate] = []
        finished: list[SequenceState] = []
        for seq, step in zip(seqs, steps, strict=True):
            step.draft_time, step.target_time = draft_time, target_time  # the batch's
            step.verify_peak_bytes = verify_peak  # the whole batch's pass
            row_logits = out.logits[seq.row, : len(step.draft) + 1]  # [drafted + 1, vocab]
            score = partial(_logit_rows, row_logits)
            uniforms = seq.target_uniforms(step)
            result = verify_draft(
                step.draft, score, seq.params, seq.generator, target_uniforms=uniforms
            )
            commit = None
            if drafter is not None:
                commit = partial(self._commit, drafter, seq, out.hidden, lengths_before[seq.row])
            record = seq.settle(step, result, self.cache, lengths_before[seq.row], commit)
            updates.append(SequenceUpdate(seq.request_id, record))
            if record.finish_reason is not None:
                finished.append(seq)

        # 5. Finished sequences leave (highest row first, so moves never touch them).
        for seq in sorted(finished, key=lambda s: s.row, reverse=True):
            self._release(seq)
        return updates

    def _commit(
        self,
        drafter: DraftRows,
        seq: SequenceState,
        hidden: Tensor | None,  # [rows, width, hidden]: the target pass's hidden states
        length_before: int,
        rows: list[int],
    ) -> None:
        """Tell the drafter the row's committed context, with the hidden states of the kept
        chunk ``rows`` when the target exposes them."""
        kept = None if hidden is None else hidden[seq.row, rows]  # [len(rows), hidden]
        features = None if kept is None else TargetFeatures(length_before, kept)
        drafter.commit(seq.row, seq.context, features)

"""A stand-in batch engine: each request's ``SpeculativeEngine.generate`` advanced in turn.

It has the ``BatchEngine`` interface the scheduler drives (``add``, ``cancel``, ``step``,
``active``, ``has_room``) but runs one target pass per request per step instead of one
batched pass. It is exact (each request decodes exactly as it would alone) and serves
as the reference and test double for the batched engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from spectune.control.base import FixedK, KPolicy
from spectune.decode.engine import SpeculativeEngine
from spectune.decode.step import SequenceUpdate, check_prompt, crossover_gate
from spectune.drafters.base import Drafter
from spectune.errors import BatchFullError, InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.records import StepRecord, StopCondition
from spectune.sampling import SamplingParams

__all__ = ["SequenceFailed", "SequenceUpdate", "SequentialBatchEngine"]


class SequenceFailed(Exception):
    """Some sequences failed in a step; their rows are freed, the others stepped as usual.

    ``failures`` maps request id to its exception; ``updates`` are the other sequences'
    updates of that step, which the caller must still deliver.
    """

    def __init__(self, failures: dict[str, BaseException], updates: list[SequenceUpdate]) -> None:
        super().__init__("; ".join(f"request {rid} failed: {exc}" for rid, exc in failures.items()))
        self.failures = failures
        self.updates = updates


class SequentialBatchEngine:
    """Round-robin over per-request generators; the ``BatchEngine`` interface without batching.

    ``drafter_factory`` builds one drafter per request (drafters keep per-request state,
    so sequences cannot share one); ``policy_factory`` one K policy per request unless
    ``add`` is given one.
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter_factory: Callable[[], Drafter] | None = None,
        *,
        max_batch: int = 16,
        speculate_max_batch: int | None = None,
        policy_factory: Callable[[SamplingParams], KPolicy] | None = None,
    ) -> None:
        self.target = target
        self.drafter_factory = drafter_factory
        self.max_batch = max_batch
        self.speculate_max_batch = speculate_max_batch
        self.policy_factory = policy_factory or (
            lambda params: FixedK(4 if drafter_factory is not None else 0)
        )
        self._running: dict[str, Iterator[StepRecord]] = {}

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def has_room(self) -> bool:
        return len(self._running) < self.max_batch

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
        """Join the batch (the ``BatchEngine.add`` contract): ``BatchFullError`` when every
        slot is taken, ``InvalidParameterError`` for a request id already active,
        ``PromptError`` for a bad prompt. ``policy`` overrides ``policy_factory``."""
        if request_id in self._running:
            raise InvalidParameterError(f"request {request_id!r} is already in the batch")
        if not self.has_room:
            raise BatchFullError(f"the batch is full ({self.max_batch} sequences)")
        info = self.target.info
        # Check the prompt now rather than at the first step, so the caller hears of a bad
        # request at once and the running batch never holds one.
        prompt = check_prompt(prompt, info.vocab_size, info.max_context)
        drafter = self.drafter_factory() if self.drafter_factory is not None else None
        gate = crossover_gate(
            policy or self.policy_factory(params),
            params,
            drafter,
            lambda: self.active,
            self.speculate_max_batch,
        )
        engine = SpeculativeEngine(self.target, drafter)
        self._running[request_id] = engine.generate(
            prompt, params, policy=gate, generator=generator, stop=stop
        )

    def cancel(self, request_id: str) -> None:
        """Drop the request; its cache goes with its generator. Unknown ids are ignored."""
        steps = self._running.pop(request_id, None)
        close = getattr(steps, "close", None)  # a generator: closing runs its cleanup now
        if close is not None:
            close()

    def step(self) -> list[SequenceUpdate]:
        """Advance every running request by one speculative step.

        A request that raises is removed and reported through ``SequenceFailed`` after the
        others have stepped, so one bad request never stalls the batch.
        """
        updates: list[SequenceUpdate] = []
        failures: dict[str, BaseException] = {}
        for request_id, steps in list(self._running.items()):
            try:
                record = next(steps)
            except StopIteration:
                del self._running[request_id]
                continue
            except Exception as exc:  # reported per request, below
                del self._running[request_id]
                failures[request_id] = exc
                continue
            updates.append(SequenceUpdate(request_id, record))
            if record.finish_reason is not None:
                self._running.pop(request_id, None)
        if failures:
            raise SequenceFailed(failures, updates)
        return updates

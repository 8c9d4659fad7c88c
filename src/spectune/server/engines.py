"""Building the batch engine the scheduler steps: the batched engine, or the sequential one.

``batch`` (``spectune.decode.batch.BatchEngine``) runs one target pass per step over every
running request; ``sequential`` runs one pass per request (exact, slower; a reference).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from spectune.control.base import KPolicy
from spectune.control.crossover import load_crossover
from spectune.decode.batch import BatchEngine
from spectune.decode.sequential import SequentialBatchEngine
from spectune.drafters import base as drafting
from spectune.drafters.base import Drafter
from spectune.drafters.batched import PerRow
from spectune.drafters.feature import FeatureDrafter
from spectune.drafters.model import ModelDrafter
from spectune.drafters.ngram import NgramDrafter
from spectune.drafters.pairing import fresh_drafter
from spectune.errors import InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.sampling import SamplingParams
from spectune.server.scheduler import RequestPolicies, StepEngine

__all__ = ["ENGINES", "DraftSource", "EngineSettings", "build_engine"]

ENGINES = ("batch", "sequential")
DEFAULT_DRAFT_DEADLINE = 10.0  # seconds


@dataclass(frozen=True)
class DraftSource:
    """What drafts: a draft model, a feature head, prompt lookup (``ngram``), a factory of
    per-request drafters (any ``Drafter``, e.g. the test doubles), or nothing."""

    model: LanguageModel | None = None
    feature: FeatureDrafter | None = None
    ngram: bool = False
    drafters: Callable[[], Drafter] | None = None
    label: str | None = None  # the name clients use in ``spectune.drafter``

    @classmethod
    def from_drafter(cls, drafter: Drafter | None) -> DraftSource:
        """What ``load_drafter`` returned, in the form the engines batch best."""
        if drafter is None:
            return cls()
        if isinstance(drafter, NgramDrafter):
            return cls(ngram=True)
        if isinstance(drafter, ModelDrafter) and drafter.vocab_subset is None:
            return cls(model=drafter.model)
        if isinstance(drafter, FeatureDrafter):
            return cls(feature=drafter, label=drafter.name)
        # A reduced-vocabulary draft model: its logits need the drafter's id mapping.
        return cls(drafters=lambda: fresh_drafter(drafter), label=drafter.name)

    @property
    def name(self) -> str | None:
        if self.label is not None:
            return self.label
        if self.model is not None:
            return f"model:{self.model.info.name}"
        if self.ngram:
            return "ngram"
        return "custom" if self.drafters is not None else None

    def factory(self) -> Callable[[], Drafter] | None:
        """Per-request drafters (drafters keep per-request state)."""
        model, feature = self.model, self.feature
        if model is not None:
            return lambda: ModelDrafter(model)
        if feature is not None:
            return lambda: fresh_drafter(feature)
        if self.ngram:
            return NgramDrafter
        return self.drafters

    def for_batch(self) -> drafting.DraftSource | None:
        """The ``draft`` argument of ``BatchEngine``: what opens a session over its rows."""
        if self.model is not None:
            return ModelDrafter(self.model)
        if self.feature is not None:
            return self.feature
        factory = self.factory()
        return None if factory is None else PerRow(factory)


@dataclass(frozen=True)
class EngineSettings:
    kind: str = "batch"
    max_batch: int = 16
    capacity: int = 2048  # most tokens per sequence (prompt + output)
    speculate_max_batch: int | None = None  # above this many running requests: no drafts
    # Seconds a draft pass may take before the step goes on without drafts (batch engine;
    # None: no deadline). Far above any healthy pass: it catches hung drafters.
    draft_deadline: float | None = DEFAULT_DRAFT_DEADLINE

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise InvalidParameterError(f"engine must be one of {', '.join(ENGINES)}")
        if self.max_batch < 1:
            raise InvalidParameterError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.capacity < 2:
            raise InvalidParameterError(f"capacity must be >= 2 tokens, got {self.capacity}")
        if self.speculate_max_batch is not None and self.speculate_max_batch < 0:
            raise InvalidParameterError("speculate_max_batch must be >= 0")
        if self.draft_deadline is not None and not 0 < self.draft_deadline < math.inf:
            raise InvalidParameterError(
                f"draft_deadline must be a positive number of seconds, got {self.draft_deadline}"
            )


def build_engine(
    target: LanguageModel,
    draft: DraftSource,
    settings: EngineSettings,
    default_policy: Callable[[SamplingParams], KPolicy],
) -> tuple[StepEngine, RequestPolicies, int]:
    """The engine, the policy router it was built with, and its context limit per request."""
    policies = RequestPolicies(default_policy)
    context = min(settings.capacity, target.info.max_context)
    if settings.kind == "sequential":
        limit = settings.speculate_max_batch
        engine = SequentialBatchEngine(
            target,
            draft.factory(),
            max_batch=settings.max_batch,
            # As BatchEngine: without a limit, the crossover measured on this machine.
            speculate_max_batch=(
                limit if limit is not None else load_crossover(target.info, draft.name)
            ),
            policy_factory=policies,
        )
        return engine, policies, context
    batched = BatchEngine(
        target,
        draft.for_batch(),
        max_batch=settings.max_batch,
        capacity=settings.capacity,
        speculate_max_batch=settings.speculate_max_batch,
        policy_factory=policies,
        draft_deadline=settings.draft_deadline,
    )
    return batched, policies, min(context, batched.capacity)

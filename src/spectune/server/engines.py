"""Building the batch engine the scheduler steps: the batched engine, or the sequential one.

``batch`` (``spectune.decode.batch.BatchEngine``) runs one target pass per step over every
running request; ``sequential`` runs one pass per request (exact, slower; a reference).

Suffix and hybrid drafters can also draft from earlier requests' outputs. Whose outputs is
the history scope (``HISTORY_SCOPES``): ``none`` (a request's own prompt and output and the
shipped corpus only), ``tenant`` (also earlier outputs for the same API key's holder) or
``global`` (everyone's: a client can then learn from its acceptance or latency whether some
text was generated for another client; docs/serving.md, "Multi-tenant serving").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from spectune.control.base import KPolicy
from spectune.control.crossover import load_crossover, runtime_of
from spectune.decode.batch import BatchEngine
from spectune.decode.sequential import SequentialBatchEngine
from spectune.drafters import base as drafting
from spectune.drafters.base import Drafter, fresh_drafter
from spectune.drafters.batched import PerRow, batch_source
from spectune.drafters.suffix import HistoryUser
from spectune.drafters.suffix_history import HistoryStore, TenantHistories
from spectune.errors import InvalidParameterError
from spectune.models.base import LanguageModel
from spectune.sampling import SamplingParams
from spectune.server.names import DEFAULT_DRAFT_DEADLINE, ENGINES, HISTORY_SCOPES
from spectune.server.scheduler import AdmitChoice, RequestPolicies, StepEngine

__all__ = [
    "ENGINES",
    "HISTORY_SCOPES",
    "DraftSource",
    "EngineSettings",
    "RequestDrafters",
    "build_engine",
    "scoped_history",
]


class RequestDrafters(AdmitChoice[str]):
    """Per-request drafters over the history of the request's scope (module docstring).

    The engine calls it inside ``add``; the scheduler names the request's tenant with
    ``choosing``. ``scope``: ``tenant`` (one store per tenant, ``max_tokens`` in total,
    ``TenantHistories``) or ``global`` (one store of ``max_tokens``). A request with no
    tenant under ``tenant`` scope drafts from no history.
    """

    def __init__(self, drafter: Drafter, scope: str, max_tokens: int) -> None:
        super().__init__()
        if scope not in HISTORY_SCOPES[1:]:
            raise InvalidParameterError(f"a history scope of {scope!r} keeps no history")
        self.drafter = drafter
        self.scope = scope
        self.tenants = TenantHistories(max_tokens) if scope == "tenant" else None
        self.shared = HistoryStore(max_tokens) if scope == "global" else None

    def history(self, tenant: str | None) -> HistoryStore | None:
        """The store a request of ``tenant`` drafts from and files its output in."""
        if self.tenants is None:
            return self.shared
        return None if tenant is None else self.tenants.store(tenant)

    @property
    def num_stores(self) -> int:
        return 1 if self.tenants is None else len(self.tenants)

    @property
    def num_tokens(self) -> int:
        """Tokens held in every store."""
        store = self.tenants if self.tenants is not None else self.shared
        return 0 if store is None else store.num_tokens

    def __call__(self) -> Drafter:
        fresh = fresh_drafter(self.drafter)  # a hybrid's model source needs its own state
        if isinstance(fresh, HistoryUser):
            return fresh.with_history(self.history(self.chosen))
        return fresh


@dataclass(frozen=True)
class DraftSource:
    """What drafts: a drafter every request gets its own copy of (what ``load_drafter``
    returned), a factory of per-request drafters (any ``Drafter``, e.g. the test doubles,
    which cannot copy themselves), or nothing."""

    drafter: Drafter | None = None
    drafters: Callable[[], Drafter] | None = None
    label: str | None = None  # the name clients use in ``spectune.drafter``

    @property
    def name(self) -> str | None:
        if self.label is not None:
            return self.label
        if self.drafter is not None:
            return self.drafter.name
        return "custom" if self.drafters is not None else None

    def factory(self) -> Callable[[], Drafter] | None:
        """Per-request drafters (drafters keep per-request state)."""
        if self.drafter is not None:
            return partial(fresh_drafter, self.drafter)
        return self.drafters

    def for_batch(self) -> drafting.DraftSource | None:
        """The ``draft`` argument of ``BatchEngine``: what opens a row set over its rows."""
        if self.drafter is not None:
            return batch_source(self.drafter)
        return None if self.drafters is None else PerRow(self.drafters)


def scoped_history(
    draft: DraftSource, scope: str, max_tokens: int
) -> tuple[DraftSource, RequestDrafters | None]:
    """``draft`` with per-request drafters over the ``scope``'s history of ``max_tokens``
    tokens, and those drafters; ``draft`` itself and None where no history is kept: scope
    ``none``, no tokens, or a drafter that cannot use one (only suffix and hybrid can)."""
    if scope not in HISTORY_SCOPES:
        raise InvalidParameterError(
            f"the suffix history scope must be one of {', '.join(HISTORY_SCOPES)}, got {scope!r}"
        )
    if max_tokens < 0:
        raise InvalidParameterError(f"the suffix history needs >= 0 tokens, got {max_tokens}")
    if scope == "none" or max_tokens == 0 or not isinstance(draft.drafter, HistoryUser):
        return draft, None
    drafters = RequestDrafters(draft.drafter, scope, max_tokens)
    return DraftSource(drafters=drafters, label=draft.name), drafters


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
                limit
                if limit is not None
                else load_crossover(target.info, draft.name, runtime_of(target))
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

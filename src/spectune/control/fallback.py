"""Fallback checks: when speculation does not pay, get out of the way, and say why.

Three depths (the engine and the verifier already cover the first and the drafter failures):

- token level   a rejected draft token is replaced by a sample from the residual and the
                step goes on (the verifier; the monitor counts these as ``token`` events).
- local         ``LocalFallback``: acceptance below ``below`` for ``bad_steps`` consecutive
                speculative steps -> K = 0 for a back-off of ``backoff_tokens`` emitted
                tokens (multiplied by ``backoff_growth`` on every further trigger in the
                request, up to ``max_backoff_tokens``), then ``probe_steps`` steps at K = 1;
                speculation resumes if the probe's acceptance reaches ``below``, else it
                backs off again, longer.
- global        ``GlobalFallback``: a draft step (one drafted token) costs more than
                ``max_draft_ratio`` of a target step (smoothed) -> K = 0 for the rest of
                the request.
- batch         ``BatchSizeCheck``: more sequences share the target than the measured
                crossover (``spectune.control.crossover``) -> K = 0 while they do; both
                batch engines put it in front of every request's policy, except a
                seeded sampled request's with a drafter that has probabilities
                (``spectune.decode.step.crossover_gate``: its tokens would change).
- drafter error the engine turns a raising or garbage-returning drafter into plain
                decoding for the request (``drafter_error: ...`` in the record).

Checks are small stateful objects (SGLang's style of a check returning a human-readable
reason or None): ``observe(record)`` learns, ``check()`` returns ``None`` (no objection) or
a ``Hold``, the K it allows and why. ``Guarded`` composes any K policy with checks, so the
policies themselves know nothing about fallback. Reasons start with their kind and a colon
(``local: ...``, ``global: ...``): the monitor counts fallbacks by that kind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from spectune.control.base import KPolicy, PolicyState, ReportsState, StepPlan
from spectune.control.costs import CostCurve, ewma
from spectune.errors import InvalidParameterError
from spectune.records import SpecCounts, StepRecord

__all__ = [
    "BatchSizeCheck",
    "FallbackCheck",
    "GlobalFallback",
    "GlobalFallbackConfig",
    "Guarded",
    "Hold",
    "LocalFallback",
    "LocalFallbackConfig",
    "batch_limited",
]


@dataclass(frozen=True)
class Hold:
    """A check's objection: at most ``max_k`` draft tokens (0 = none, 1 = a probe), and why."""

    max_k: int
    reason: str


class FallbackCheck(Protocol):
    kind: str  # prefix of its reasons and of its keys in the policy state

    def observe(self, record: StepRecord) -> None:
        """Learn from the step that just ran (every step, plain ones included)."""
        ...

    def check(self) -> Hold | None:
        """The current objection, or None. Pure: reading it changes nothing."""
        ...

    def state(self) -> PolicyState: ...


@dataclass(frozen=True)
class LocalFallbackConfig:
    below: float = 0.5  # a step is bad when accepted / positions is below this
    bad_steps: int = 5  # consecutive bad steps that trigger the back-off (the issue: 5-10)
    backoff_tokens: int = 16  # plain-decoded tokens of the first back-off
    backoff_growth: float = 2.0  # back-off multiplier on every further trigger
    max_backoff_tokens: int = 512
    probe_steps: int = 2  # K = 1 steps whose acceptance decides whether to resume

    def __post_init__(self) -> None:
        if not 0.0 < self.below <= 1.0:
            raise InvalidParameterError(f"local.below must be in (0, 1], got {self.below}")
        if not 1 <= self.bad_steps <= 64:
            raise InvalidParameterError(f"local.bad_steps must be in [1, 64], got {self.bad_steps}")
        if self.backoff_tokens < 1 or self.max_backoff_tokens < self.backoff_tokens:
            raise InvalidParameterError(
                "local.backoff_tokens must be >= 1 and <= local.max_backoff_tokens"
            )
        if self.backoff_growth < 1.0:
            raise InvalidParameterError(
                f"local.backoff_growth must be >= 1, got {self.backoff_growth}"
            )
        if self.probe_steps < 1:
            raise InvalidParameterError(f"local.probe_steps must be >= 1, got {self.probe_steps}")


class LocalFallback:
    """Acceptance too low for a while -> back off (in tokens), probe with K = 1, resume.

    Phases: ``watch`` (counting consecutive bad steps) -> ``backoff`` (K = 0 until
    ``backoff`` emitted tokens have passed) -> ``probe`` (K = 1 for ``probe_steps`` steps)
    -> ``watch`` again, or ``backoff`` with a longer back-off. Steps without draft tokens
    neither count as bad nor break a run of bad steps: they say nothing about the draft.
    """

    kind = "local"

    def __init__(self, config: LocalFallbackConfig | None = None) -> None:
        self.config = config or LocalFallbackConfig()
        self.cause = ""
        self.phase = "watch"
        self.bad_run = 0  # consecutive bad speculative steps (watch phase)
        self.triggers = 0
        self.backoff = 0  # tokens of the current (or last) back-off
        self.backoff_left = 0
        self.probe = SpecCounts()  # the steps of the current probe

    def observe(self, record: StepRecord) -> None:
        cfg = self.config
        if self.phase == "backoff":
            self.backoff_left -= len(record.emitted)
            if self.backoff_left <= 0:
                self.phase = "probe"
                self.probe = SpecCounts()
        elif self.phase == "probe":
            self.probe.add(record)
            if self.probe.steps >= cfg.probe_steps:
                rate = self.probe.acceptance_rate or 0.0
                if rate >= cfg.below:
                    self.phase, self.bad_run = "watch", 0
                else:
                    self._trigger(f"probe acceptance {rate:.0%} below {cfg.below:.0%}")
        elif record.num_draft_tokens > 0:
            if record.accepted / record.positions < cfg.below:
                self.bad_run += 1
                if self.bad_run >= cfg.bad_steps:
                    self._trigger(
                        f"acceptance below {cfg.below:.0%} for {cfg.bad_steps} consecutive steps"
                    )
            else:
                self.bad_run = 0

    def _trigger(self, cause: str) -> None:
        cfg = self.config
        self.cause = cause
        self.triggers += 1
        if self.triggers == 1:
            self.backoff = cfg.backoff_tokens
        else:
            grown = round(self.backoff * cfg.backoff_growth)
            self.backoff = min(cfg.max_backoff_tokens, grown)
        self.phase, self.backoff_left, self.bad_run = "backoff", self.backoff, 0

    def check(self) -> Hold | None:
        if self.phase == "backoff":
            return Hold(
                0,
                f"local: {self.cause}; back-off {self.backoff} tokens (trigger {self.triggers})",
            )
        if self.phase == "probe":
            return Hold(1, f"local: probing with K=1 after a back-off of {self.backoff} tokens")
        return None

    def state(self) -> PolicyState:
        return {
            "phase": self.phase,
            "bad_run": self.bad_run,
            "triggers": self.triggers,
            "backoff_left": max(0, self.backoff_left) if self.phase == "backoff" else 0,
        }


@dataclass(frozen=True)
class GlobalFallbackConfig:
    max_draft_ratio: float = 0.5  # a draft step may cost at most this share of a target step
    smoothing: float = 0.2  # EWMA weight of the newest step
    warmup_steps: int = 4  # speculative steps measured before the check may trigger

    def __post_init__(self) -> None:
        if not self.max_draft_ratio > 0.0:
            raise InvalidParameterError(
                f"global.max_draft_ratio must be > 0, got {self.max_draft_ratio}"
            )
        if not 0.0 < self.smoothing <= 1.0:
            raise InvalidParameterError(f"global.smoothing must be in (0, 1], got {self.smoothing}")
        if self.warmup_steps < 1:
            raise InvalidParameterError(
                f"global.warmup_steps must be >= 1, got {self.warmup_steps}"
            )


class BatchSizeCheck:
    """More than ``limit`` sequences share the target -> no speculation while they do.

    Above that size the target is compute-bound on the batch and verifying drafts costs
    more than it saves (``spectune experiment batch`` measures the crossover). None: no
    limit. ``batch_size`` reads the engine's current number of sequences.
    """

    kind = "batch_too_large"

    def __init__(self, batch_size: Callable[[], int], limit: int | None) -> None:
        self.batch_size = batch_size
        self.limit = limit

    def observe(self, record: StepRecord) -> None:
        """Nothing to learn: the batch size is read when asked."""

    def check(self) -> Hold | None:
        size = self.batch_size()
        if self.limit is None or size <= self.limit:
            return None
        return Hold(0, f"{self.kind}: {size} > {self.limit}")

    def state(self) -> PolicyState:
        return {"size": self.batch_size(), "limit": self.limit}


def batch_limited(policy: KPolicy, batch_size: Callable[[], int], limit: int | None) -> KPolicy:
    """``policy`` behind a ``BatchSizeCheck`` (itself when there is no limit): what both
    batch engines give each request."""
    if limit is None:
        return policy
    return Guarded(policy, [BatchSizeCheck(batch_size, limit)], name="batch_limited")


class GlobalFallback:
    """The drafter is too slow for its target -> no speculation for the rest of the request.

    Measured per drafted token: ``draft_time / drafted`` against one target step,
    ``target_time / v(k)`` where v is the verification-cost curve when one is given, else
    1 (the verification pass stands for one target step: on CPUs v(4) is about 1.1, so
    this slightly understates the ratio). Both are EWMAs. The first speculative step is
    not measured: it carries one-time work (the drafter's prefill, allocator warm-up).
    Once tripped the check stays tripped (a new request gets a new check).
    """

    kind = "global"

    def __init__(
        self, config: GlobalFallbackConfig | None = None, *, cost_curve: CostCurve | None = None
    ) -> None:
        self.config = config or GlobalFallbackConfig()
        self.cost_curve = cost_curve
        self.seen = 0  # speculative steps observed, the unmeasured first one included
        self.draft_step: float | None = None  # EWMA seconds per drafted token
        self.target_step: float | None = None  # EWMA seconds per target step
        self.tripped: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.draft_step is None or not self.target_step:
            return None
        return self.draft_step / self.target_step

    def observe(self, record: StepRecord) -> None:
        if self.tripped or record.num_draft_tokens == 0 or record.target_time <= 0.0:
            return
        self.seen += 1
        if self.seen == 1:
            return  # one-time work, see the class docstring
        relative = self.cost_curve.relative(record.num_draft_tokens) if self.cost_curve else 1.0
        draft_step = record.draft_time / record.num_draft_tokens
        target_step = record.target_time / relative
        w = self.config.smoothing
        self.draft_step = ewma(self.draft_step, draft_step, w)
        self.target_step = ewma(self.target_step, target_step, w)
        ratio = self.ratio
        if self.seen > self.config.warmup_steps and ratio is not None:
            if ratio > self.config.max_draft_ratio:
                self.tripped = (
                    f"global: a draft step takes {ratio:.0%} of a target step "
                    f"(limit {self.config.max_draft_ratio:.0%}); speculation off for the "
                    "rest of the request"
                )

    def check(self) -> Hold | None:
        return Hold(0, self.tripped) if self.tripped else None

    def state(self) -> PolicyState:
        ratio = self.ratio
        return {
            "draft_ratio": None if ratio is None else round(ratio, 4),
            "tripped": bool(self.tripped),
        }


class Guarded:
    """A K policy behind fallback checks: K is the policy's, capped by every objection.

    The inner policy observes every step (held ones too) so its estimates stay current;
    the first check (in the given order) that holds K at 0 gives the reason the engine
    records.
    """

    def __init__(self, inner: KPolicy, checks: Sequence[FallbackCheck], *, name: str) -> None:
        self.inner = inner
        self.checks = tuple(checks)
        self.name = name
        # Asked once: a runtime-checkable protocol's isinstance is slow for a per-step check.
        self._inner_state = inner.state if isinstance(inner, ReportsState) else None

    def _holds(self) -> list[Hold]:
        return [hold for check in self.checks if (hold := check.check()) is not None]

    def plan(self) -> StepPlan:
        """The inner policy's plan, whole (its verification groups included), with K
        capped by every objection; the first objection that holds K at 0 gives the
        reason, else the inner policy's."""
        plan = self.inner.plan()
        holds = self._holds()
        if not holds:
            return plan
        reason = next((hold.reason for hold in holds if hold.max_k == 0), plan.reason)
        return plan.capped(min(hold.max_k for hold in holds), reason)

    def observe(self, record: StepRecord) -> None:
        self.inner.observe(record)
        for check in self.checks:
            check.observe(record)

    def state(self) -> PolicyState:
        state: PolicyState = {"policy": self.name, "next_k": self.plan().k}
        if self._inner_state is not None:
            state.update(self._inner_state())
        for check in self.checks:
            state.update({f"{check.kind}.{key}": value for key, value in check.state().items()})
        holds = self._holds()
        state["hold"] = holds[0].reason if holds else None
        return state

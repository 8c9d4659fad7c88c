"""A running deployment judged between scrapes: the window, the verdicts, the advice.

``Watcher.observe(reading)`` takes one ``EngineReading`` (``spectune.monitor.remote``) and
returns a ``WatchReport``: the counts since the last scrape (the first scrape: since the
engine started; counters that went down: a restart, counted from it), the rates derived
from them (acceptance overall and per position), the health targets
(``spectune.monitor.health``; draft share and fallback only where the engine measures
them) and, where the deployment's costs were measured, the K advice.

The advice (``advise``) predicts a speedup only from measured costs
(``spectune.engines.costs.StepCosts``: a cost profile file, with the draft cost measured
live where the engine times its drafts). Acceptance alone predicts nothing: without
measured costs the report gives acceptance and one note saying the speedup cannot be
predicted. The prediction: a step of K draft tokens yields 1 + sum_{j<K} kept(j) tokens,
kept(j) the share of drafts that kept position j + 1 (past the measured positions, kept(j)
decays at the last measured position's conditional rate; without per-position counts,
the i.i.d. formula), and costs ``StepCosts.step(K)`` plain steps. Only the K the costs
measured are considered.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, replace
from typing import Any

from spectune.control.costs import expected_tokens_per_step
from spectune.engines.costs import StepCosts
from spectune.engines.export import export
from spectune.engines.tuned import Tuning
from spectune.monitor.health import HealthCheck, health
from spectune.monitor.remote import EngineReading
from spectune.monitor.stats import Rates
from spectune.records import SpecCounts, ratio

__all__ = [
    "NO_COSTS_NOTE",
    "Advice",
    "CostAssumptions",
    "WatchReport",
    "Watcher",
    "advise",
    "kept_by_position",
]

K_FLAGS = (  # the flags of export's plans that carry K (SGLang: a chain of K steps)
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--spec-draft-n-max",
)
NO_COSTS_NOTE = (
    "speedup not predicted: acceptance alone cannot predict one without this deployment's "
    "measured costs (a cost profile from tune, or its draft cost and verification slope)"
)


@dataclass(frozen=True)
class CostAssumptions:
    """Costs stated on the command line as a line: ``draft_cost`` per draft token and
    ``verify_slope`` per extra verified token, in plain target steps. NaN: not stated; only
    both stated make costs (``stated``)."""

    draft_cost: float = math.nan
    verify_slope: float = math.nan

    def stated(self, max_k: int) -> StepCosts | None:
        if math.isnan(self.draft_cost) or math.isnan(self.verify_slope):
            return None
        verify = tuple(1.0 + k * self.verify_slope for k in range(max_k + 1))
        return StepCosts(self.draft_cost, verify, "--draft-cost / --verify-slope")


@dataclass(frozen=True)
class Advice:
    action: str  # "keep" | "raise" | "lower" | "set" | "disable"
    k: int  # the K advised (0: no speculation)
    current_k: int | None
    speedup: float  # predicted at ``k`` over plain decoding
    current_speedup: float | None  # predicted at ``current_k`` (None: not measured there)
    reason: str
    change: str | None  # the engine's flags for it (None: keep as is)
    costs: StepCosts  # the measured costs the prediction rests on

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "k": self.k,
            "current_k": self.current_k,
            "predicted_speedup": round(self.speedup, 4),
            "current_predicted_speedup": None
            if self.current_speedup is None
            else round(self.current_speedup, 4),
            "reason": self.reason,
            "change": self.change,
            "costs": self.costs.as_json(),
        }


def kept_by_position(counts: SpecCounts, max_k: int) -> list[float] | None:
    """[j]: the share of drafts that kept position j + 1, for j < max_k (None: no
    per-position counts); past the measured positions, decayed (see the module)."""
    measured = [k / t for k, t in zip(counts.accepted_at, counts.tested_at, strict=True) if t > 0]
    if not measured:
        return None
    for j in range(1, len(measured)):  # a position kept implies the ones before it kept
        measured[j] = min(measured[j], measured[j - 1])
    last = measured[-1]
    rate = last / measured[-2] if len(measured) >= 2 and measured[-2] > 0 else measured[0]
    while len(measured) < max_k:
        measured.append(measured[-1] * min(max(rate, 0.0), 1.0))
    return measured[:max_k]


def advise(
    acceptance: float,
    kept: list[float] | None,
    current_k: int | None,
    engine: str,
    costs: StepCosts,
    max_k: int = 8,
) -> Advice:
    """The K with the highest predicted speedup under measured ``costs`` (see the module),
    as the engine's change; K stops at ``max_k`` and at the last K the costs measured."""
    top = min(max_k, costs.max_k)

    def speedup(k: int) -> float:
        tokens = (
            1.0 + sum(kept[:k]) if kept is not None else expected_tokens_per_step(acceptance, k)
        )
        return tokens / costs.step(k)

    best_k, best = 0, 1.0
    for k in range(1, top + 1):
        if speedup(k) > best:
            best_k, best = k, speedup(k)
    measured_now = current_k is not None and 0 < current_k <= costs.max_k
    now = speedup(current_k) if measured_now and current_k is not None else None
    if best_k == 0:
        why = f"no K up to {top} beats plain decoding under the measured costs"
        return Advice("disable", 0, current_k, 1.0, now, why, _change(engine, 0), costs)
    if current_k is None:
        action = "set"
    elif best_k == current_k:
        action = "keep"
    else:
        action = "raise" if best_k > current_k else "lower"
    reason = f"K = {best_k} predicts {best:.2f}x over plain decoding"
    if now is not None and action != "keep":
        reason += f" (K = {current_k}: {now:.2f}x)"
    elif current_k is not None and now is None and current_k > 0:
        reason += f" (K = {current_k} is past the measured costs)"
    change = None if action == "keep" else _change(engine, best_k)
    return Advice(action, best_k, current_k, best, now, reason, change, costs)


def _change(engine: str, k: int) -> str:
    if k == 0:
        return {
            "vllm": "serve without --speculative-config",
            "sglang": "serve without --speculative-algorithm",
            "llamacpp": "serve without --spec-type / --spec-draft-model",
            "spectune": "spectune serve --draft none",
        }[engine]
    if engine == "spectune":
        return f"spectune serve --policy fixed -k {k}"
    # The K-bearing flags of export's plan; the method and draft model stay the user's.
    plan = export(Tuning(draft="DRAFT_MODEL", k=k, target="TARGET_MODEL"), engine)
    if engine == "vllm":
        size = {"num_speculative_tokens": plan.speculative_config["num_speculative_tokens"]}
        return shlex.join(["--speculative-config", json.dumps(size, separators=(",", ":"))])
    pairs = zip(plan.args[::2], plan.args[1::2], strict=True)
    return shlex.join([part for flag, value in pairs if flag in K_FLAGS for part in (flag, value)])


@dataclass(frozen=True)
class WatchReport:
    engine: str
    k: int | None  # the deployment's K, as the engine says it (else as given)
    window: str  # "since start" | "since last scrape" | "since restart" | "last batch"
    counts: SpecCounts | None  # the window's counts (None: the engine has only gauges)
    acceptance: float | None
    accepted_length: float | None
    kept_by_position: tuple[float, ...]  # [j]: drafts that kept position j + 1 / drafts
    checks: tuple[HealthCheck, ...]
    advice: Advice | None
    notes: tuple[str, ...]

    @property
    def breach(self) -> bool:
        return any(c.status in ("low", "high") for c in self.checks) or (
            self.advice is not None and self.advice.action not in ("keep",)
        )

    def as_json(self) -> dict[str, Any]:
        c = self.counts
        return {
            "engine": self.engine,
            "k": self.k,
            "window": self.window,
            "steps": None if c is None else c.steps,
            "draft_tokens": None if c is None else c.positions,
            "accepted": None if c is None else c.accepted,
            "acceptance_rate": self.acceptance,
            "mean_accepted_length": self.accepted_length,
            "acceptance_by_position": list(self.kept_by_position),
            "checks": {
                check.target.label: {"value": check.value, "status": check.status}
                for check in self.checks
            },
            "advice": None if self.advice is None else self.advice.as_json(),
            "notes": list(self.notes),
        }


class Watcher:
    """Keeps the last scrape's counts; each ``observe`` judges the window since.

    ``costs``: the deployment's measured costs (``StepCosts``), the command line's stated
    ones (``CostAssumptions``), or None: then no speedup is predicted."""

    def __init__(
        self,
        costs: StepCosts | CostAssumptions | None = None,
        k: int | None = None,
        max_k: int = 8,
    ) -> None:
        self.costs = costs.stated(max_k) if isinstance(costs, CostAssumptions) else costs
        self.k = k  # the deployment's K where the engine does not say it
        self.max_k = max_k
        self._last: SpecCounts | None = None

    def observe(self, reading: EngineReading) -> WatchReport:
        notes = list(reading.notes)
        if reading.counts is None:
            window, counts = "last batch", None
            acceptance = reading.reported_acceptance
            length = reading.reported_accepted_length
            if acceptance is None and length is not None and self._k(reading) is not None:
                k = self._k(reading)
                assert k is not None
                acceptance = (length - 1.0) / k  # accepted per draft position
            kept = None
        else:
            counts = reading.counts
            window = "since start"
            if self._last is not None:
                delta = counts.since(self._last)
                if delta is None:
                    window = "since restart"
                    notes.append("counters went down since the last scrape: the engine restarted")
                else:
                    window, counts = "since last scrape", delta
            self._last = reading.counts
            acceptance, length = counts.acceptance_rate, counts.accepted_length
            kept = kept_by_position(counts, self.max_k) if counts.tested_at else None
        rates = Rates(
            acceptance_rate=acceptance,
            mean_accepted_length=length,
            draft_share=counts.draft_share if counts and "draft_time" in reading.measured else None,
            tokens_per_second=None,
            estimated_speedup=None,
            fallback_frequency=counts.fallback_frequency
            if counts and "fallback" in reading.measured
            else None,
        )
        checks = tuple(c for c in health(rates) if c.target.field != "estimated_speedup")
        advice = None
        if acceptance is not None:
            costs = self._costs(reading, counts)
            if costs is None:
                notes.append(NO_COSTS_NOTE)
            else:
                k = self._k(reading)
                advice = advise(acceptance, kept, k, reading.engine, costs, self.max_k)
        shown = tuple(
            kept_n / tested
            for kept_n, tested in zip(
                counts.accepted_at if counts else [],
                counts.tested_at if counts else [],
                strict=True,
            )
            if tested > 0
        )
        return WatchReport(
            reading.engine,
            self._k(reading),
            window,
            counts,
            acceptance,
            length,
            shown,
            checks,
            advice,
            tuple(notes),
        )

    def _costs(self, reading: EngineReading, counts: SpecCounts | None) -> StepCosts | None:
        """The measured costs, with the draft cost measured live where the engine times its
        drafts: seconds per draft token over seconds per plain step, the plain step being
        the engine's target time per step over the costs' v at the mean drafted per step."""
        costs = self.costs
        if costs is None or counts is None or "draft_time" not in reading.measured:
            return costs
        per_token = ratio(counts.draft_time, counts.num_draft_tokens)
        per_step = ratio(counts.target_time, counts.steps)
        drafted = ratio(counts.num_draft_tokens, counts.steps)
        if per_token is None or not per_step or drafted is None or drafted > costs.max_k:
            return costs
        low = math.floor(drafted)
        high = min(low + 1, costs.max_k)
        verify = costs.verify[low] + (costs.verify[high] - costs.verify[low]) * (drafted - low)
        plain = per_step / verify
        source = f"{costs.source}; draft cost from {reading.engine}'s draft timing"
        return replace(costs, draft_cost=per_token / plain, source=source)

    def _k(self, reading: EngineReading) -> int | None:
        return reading.k if reading.k is not None else self.k

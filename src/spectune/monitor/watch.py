"""A running deployment judged between scrapes: the window, the verdicts, the advice.

``Watcher.observe(reading)`` takes one ``EngineReading`` (``spectune.monitor.remote``) and
returns a ``WatchReport``: the counts since the last scrape (the first scrape: since the
engine started; counters that went down: a restart, counted from it), the rates derived
from them, the health targets (``spectune.monitor.health``; draft share and fallback only
where the engine measures them) and, below 50% acceptance, the advice to disable.

The advice (``advise``) is the cost model of ``spectune.control.costs``, fed with the
per-position acceptance the engine reports: a step of K draft tokens yields
1 + sum_{j<K} kept(j) tokens, kept(j) the share of drafts that kept position j + 1;
past the measured positions, kept(j) decays at the last measured position's conditional
rate. Without per-position counts it falls back to the i.i.d. formula. A remote engine's
draft cost and verification curve are not measured here: they are ``CostAssumptions``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Any

from spectune.control.costs import CostCurve, expected_tokens_per_step, speedup_of_tokens
from spectune.export import Tuning, export
from spectune.monitor.health import HealthCheck, health
from spectune.monitor.remote import EngineReading
from spectune.monitor.stats import Rates
from spectune.records import SpecCounts, ratio

__all__ = ["DISABLE_BELOW", "Advice", "CostAssumptions", "WatchReport", "Watcher", "advise"]

DISABLE_BELOW = 0.50  # acceptance under which speculation costs more than it saves
K_FLAGS = (  # the flags of export's plans that carry K (SGLang: a chain of K steps)
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--spec-draft-n-max",
)


@dataclass(frozen=True)
class CostAssumptions:
    """What a remote engine's step costs, in units of one plain target step."""

    draft_cost: float = 0.05  # one draft token (a small draft model on a GPU)
    verify_slope: float = 0.02  # each extra token verified (memory-bound: near flat)

    def curve(self) -> CostCurve:
        return CostCurve((1, 2), (1.0, 1.0 + self.verify_slope))


@dataclass(frozen=True)
class Advice:
    action: str  # "keep" | "raise" | "lower" | "set" | "disable"
    k: int  # the K advised (0: no speculation)
    current_k: int | None
    speedup: float  # predicted at ``k`` over plain decoding
    current_speedup: float | None  # predicted at ``current_k``
    reason: str
    change: str | None  # the engine's flags for it (None: keep as is)
    costs: CostAssumptions = CostAssumptions()  # what the prediction assumed

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
            "draft_cost": round(self.costs.draft_cost, 4),
            "verify_slope": self.costs.verify_slope,
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
    costs: CostAssumptions,
    max_k: int = 8,
) -> Advice:
    """The K with the highest predicted speedup (see the module), as the engine's change."""
    curve = costs.curve()

    def speedup(k: int) -> float:
        tokens = (
            1.0 + sum(kept[:k]) if kept is not None else expected_tokens_per_step(acceptance, k)
        )
        return speedup_of_tokens(tokens, costs.draft_cost, curve, k)

    best_k, best = 0, 1.0
    for k in range(1, max_k + 1):
        if speedup(k) > best:
            best_k, best = k, speedup(k)
    now = speedup(current_k) if current_k is not None else None
    if acceptance < DISABLE_BELOW or best_k == 0:
        why = (
            f"acceptance {acceptance:.0%} is below {DISABLE_BELOW:.0%}"
            if acceptance < DISABLE_BELOW
            else "no K beats plain decoding under these costs"
        )
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
    """Keeps the last scrape's counts; each ``observe`` judges the window since."""

    def __init__(
        self, costs: CostAssumptions | None = None, k: int | None = None, max_k: int = 8
    ) -> None:
        self.costs = costs or CostAssumptions()
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
            advice = advise(acceptance, kept, self._k(reading), reading.engine, costs, self.max_k)
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
            reading.engine, window, counts, acceptance, length, shown, checks, advice, tuple(notes)
        )

    def _costs(self, reading: EngineReading, counts: SpecCounts | None) -> CostAssumptions:
        """The assumed costs, with the draft cost measured where the engine times drafts:
        seconds per draft token over seconds per target step."""
        if counts is None or "draft_time" not in reading.measured:
            return self.costs
        per_token = ratio(counts.draft_time, counts.num_draft_tokens)
        per_step = ratio(counts.target_time, counts.steps)
        if per_token is None or not per_step:
            return self.costs
        return replace(self.costs, draft_cost=per_token / per_step)

    def _k(self, reading: EngineReading) -> int | None:
        return reading.k if reading.k is not None else self.k

"""Counters fed from step records, and the rates derived from them.

Like vLLM's spec-decode metrics, the state is plain counters; rates are derived when a
snapshot is taken, three ways: over everything seen (``total``), over the last
``window`` steps (``window``) and as an exponentially weighted moving average (``ewma``,
weight ``smoothing`` on the newest step). EWMA rates are ratios of EWMAs (EWMA accepted
over EWMA drafted, ...): each step weighs by its size, as in the totals, and the
zero start cancels out of every ratio.

The counts are ``spectune.records.SpecCounts`` (the moving averages: ``_Ewma``), and every
rate is derived there, in ``DerivedRates``, as everywhere else in spectune.

Glossary (one step = one ``StepRecord``):
- drafted / accepted    draft positions tested (``SpecCounts.positions``: a chain's tokens,
                        a tree's depth) / draft tokens kept by the target.
- emitted               tokens appended to the output (after stop/EOS truncation).
- rejections            token-level fallbacks: steps cut short by a rejected draft token,
                        whose position the verifier resampled from the residual.
- acceptance rate       accepted / drafted.
- mean accepted length  (accepted + 1) per step: accepted tokens plus the bonus or
                        recovered token, before truncation (plain steps count 1);
                        ``SpecCounts.accepted_length``.
- draft share           draft time / step time.
- overhead              step time - draft time - target time (verification, bookkeeping).
- estimated speedup     tokens per second over the plain-decoding baseline: one given by
                        the caller, else measured from this stream's plain steps (K = 0,
                        at least ``MIN_PLAIN_STEPS``), else predicted from a cost curve
                        (one-token forward time), else unknown (None).
- fallback frequency    steps run with a fallback reason / steps.
- fallback kind         a reason's prefix before the colon (``local``, ``global``, ``cost``,
                        ``drafter_error``); ``token`` counts rejections.
- verify peak bytes     the peak memory of a step's verification pass
                        (``spectune.models.devices.VerifyMemory``); snapshots keep its maximum over
                        everything seen and over the window (a peak, so no averaging).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from spectune.control.costs import CostCurve
from spectune.records import DerivedRates, SpecCounts, StepRecord

__all__ = [
    "FALLBACK_KINDS",
    "MIN_PLAIN_STEPS",
    "Rates",
    "SpecStats",
    "StatsSnapshot",
    "StepNumbers",
    "fallback_kind",
]

FALLBACK_KINDS = ("token", "local", "global", "cost", "drafter_error", "draft_deadline", "other")
MIN_PLAIN_STEPS = 3  # plain steps needed before their rate is used as the baseline


def fallback_kind(reason: str | None) -> str | None:
    """``"local: acceptance ..."`` -> ``"local"``; unknown prefixes -> ``"other"``."""
    if reason is None:
        return None
    kind = reason.split(":", 1)[0].strip()
    return kind if kind in FALLBACK_KINDS else "other"


@dataclass(frozen=True)
class StepNumbers:
    """One record reduced to what the counters need."""

    k: int
    num_draft_tokens: int  # draft tokens returned (a tree: its nodes)
    positions: int  # draft positions tested (``StepRecord.positions``: a tree counts its depth)
    accepted: int
    emitted: int
    draft_time: float
    target_time: float
    step_time: float
    fallback: str | None  # the fallback kind, or None
    new_fallback: bool  # the first step of this fallback in its request (an event)
    verify_peak_bytes: int | None = None  # None: not measured

    @classmethod
    def of(cls, record: StepRecord, previous_fallback: str | None) -> StepNumbers:
        kind = fallback_kind(record.fallback)
        return cls(
            k=record.k,
            num_draft_tokens=record.num_draft_tokens,
            positions=record.positions,
            accepted=record.accepted,
            emitted=len(record.emitted),
            draft_time=record.draft_time,
            target_time=record.target_time,
            step_time=record.step_time,
            fallback=kind,
            new_fallback=kind is not None and kind != previous_fallback,
            verify_peak_bytes=record.verify_peak_bytes,
        )

    @property
    def rejected(self) -> bool:
        return self.accepted < self.positions

    def count_into(self, counts: SpecCounts) -> None:
        counts.add_step(
            num_draft_tokens=self.num_draft_tokens,
            positions=self.positions,
            accepted=self.accepted,
            emitted=self.emitted,
            fallback=self.fallback is not None,
            draft_time=self.draft_time,
            target_time=self.target_time,
            step_time=self.step_time,
        )


@dataclass(frozen=True)
class Rates:
    """Derived values; None where undefined (nothing drafted, no baseline, no steps)."""

    acceptance_rate: float | None
    mean_accepted_length: float | None
    draft_share: float | None
    tokens_per_second: float | None
    estimated_speedup: float | None
    fallback_frequency: float | None

    @classmethod
    def of(cls, counts: DerivedRates, baseline: float | None) -> Rates:
        """The rates of ``counts`` (``SpecCounts`` or moving averages); the monitor's
        mean accepted length is ``accepted_length``: accepted + 1 per step, before
        truncation."""
        tps = counts.tokens_per_second
        return cls(
            acceptance_rate=counts.acceptance_rate,
            mean_accepted_length=counts.accepted_length,
            draft_share=counts.draft_share,
            tokens_per_second=tps,
            estimated_speedup=tps / baseline if tps is not None and baseline else None,
            fallback_frequency=counts.fallback_frequency,
        )


@dataclass(frozen=True)
class StatsSnapshot:
    """Counters and rates at one moment (per request or aggregated across requests)."""

    requests: int
    steps: int
    drafted: int
    accepted: int
    emitted: int
    rejections: int
    accepted_per_position: tuple[int, ...]  # [i]: steps whose draft token i + 1 was accepted
    drafted_per_position: tuple[int, ...]  # [i]: steps that drafted a token i + 1
    fallback_steps: Mapping[str, int]  # kind -> steps run under that fallback
    fallback_events: Mapping[str, int]  # kind -> times it began (``token``: rejections)
    draft_time: float
    target_time: float
    overhead_time: float
    step_time: float
    baseline_tokens_per_second: float | None
    baseline_source: str | None  # "given" | "measured" | "predicted" | None
    total: Rates
    window: Rates
    ewma: Rates
    verify_peak_bytes: int | None = None  # the highest verification peak seen; None: unmeasured
    window_verify_peak_bytes: int | None = None  # the highest over the last window of steps


@dataclass
class _Ewma(DerivedRates):
    """Exponentially weighted moving averages of the counts the rates are ratios of."""

    steps: float = 0.0
    positions: float = 0.0
    accepted: float = 0.0
    emitted: float = 0.0
    draft_time: float = 0.0
    step_time: float = 0.0
    fallback_steps: float = 0.0

    def add(self, n: StepNumbers, weight: float) -> None:
        """self = (1 - weight) * self + weight * n."""
        decay = 1.0 - weight
        self.steps = decay * self.steps + weight
        self.positions = decay * self.positions + weight * n.positions
        self.accepted = decay * self.accepted + weight * n.accepted
        self.emitted = decay * self.emitted + weight * n.emitted
        self.draft_time = decay * self.draft_time + weight * n.draft_time
        self.step_time = decay * self.step_time + weight * n.step_time
        self.fallback_steps = decay * self.fallback_steps + weight * (n.fallback is not None)


@dataclass
class SpecStats:
    """Counters over a stream of steps; ``observe`` one request's records in order.

    Several requests may feed one ``SpecStats`` through ``add`` (the aggregate), each
    with ``StepNumbers.of(record, its own previous fallback kind)``.
    """

    window: int = 32
    smoothing: float = 0.1
    baseline_tokens_per_second: float | None = None  # given by the caller
    cost_curve: CostCurve | None = None  # for a predicted baseline
    requests: int = 0
    _total: SpecCounts = field(default_factory=SpecCounts)
    _ewma: _Ewma = field(default_factory=_Ewma)
    _recent: deque[StepNumbers] = field(default_factory=deque)
    _plain: SpecCounts = field(default_factory=SpecCounts)  # plain (K = 0) steps: the baseline
    _fallback_steps: Counter[str] = field(default_factory=Counter)
    _fallback_events: Counter[str] = field(default_factory=Counter)
    _last_fallback: str | None = None
    _verify_peak: int | None = None

    def observe(self, record: StepRecord) -> StepNumbers:
        numbers = StepNumbers.of(record, self._last_fallback)
        self._last_fallback = numbers.fallback
        self.add(numbers)
        return numbers

    def add(self, n: StepNumbers) -> None:
        n.count_into(self._total)
        self._ewma.add(n, weight=self.smoothing)
        self._recent.append(n)
        if len(self._recent) > self.window:
            self._recent.popleft()
        if n.k == 0:
            n.count_into(self._plain)
        self._verify_peak = _max(self._verify_peak, n.verify_peak_bytes)
        if n.rejected:
            self._fallback_events["token"] += 1
        if n.fallback is not None:
            self._fallback_steps[n.fallback] += 1
            if n.new_fallback:
                self._fallback_events[n.fallback] += 1

    def baseline(self) -> tuple[float | None, str | None]:
        """Plain-decoding tokens per second and where the figure comes from."""
        if self.baseline_tokens_per_second:
            return self.baseline_tokens_per_second, "given"
        plain = self._plain.tokens_per_second
        if self._plain.steps >= MIN_PLAIN_STEPS and plain is not None:
            return plain, "measured"
        if self.cost_curve is not None and self.cost_curve.seconds[0] > 0:
            return 1.0 / self.cost_curve.seconds[0], "predicted"
        return None, None

    def snapshot(self) -> StatsSnapshot:
        baseline, source = self.baseline()
        window = SpecCounts()
        window_peak: int | None = None
        for n in self._recent:
            n.count_into(window)
            window_peak = _max(window_peak, n.verify_peak_bytes)
        total = self._total
        return StatsSnapshot(
            requests=self.requests,
            steps=total.steps,
            drafted=total.positions,
            accepted=total.accepted,
            emitted=total.emitted,
            rejections=total.rejections,
            accepted_per_position=tuple(total.accepted_at),
            drafted_per_position=tuple(total.tested_at),
            fallback_steps=MappingProxyType(dict(self._fallback_steps)),
            fallback_events=MappingProxyType(dict(self._fallback_events)),
            draft_time=total.draft_time,
            target_time=total.target_time,
            overhead_time=total.step_time - total.draft_time - total.target_time,
            step_time=total.step_time,
            baseline_tokens_per_second=baseline,
            baseline_source=source,
            total=Rates.of(total, baseline),
            window=Rates.of(window, baseline),
            ewma=Rates.of(self._ewma, baseline),
            verify_peak_bytes=self._verify_peak,
            window_verify_peak_bytes=window_peak,
        )


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)

"""Prometheus exposition of the step counters, in the style of vLLM's ``spec_decode_*``.

Counters and histograms are updated per step; the gauges (rates over the last window of
steps, across requests) are computed from a snapshot when Prometheus scrapes. Every
exporter registers on its own ``CollectorRegistry`` (never the process-global one), so
tests and servers can hold several side by side; serve it with
``prometheus_client.generate_latest(exporter.registry)``.

Metrics (prefix ``spectune_spec_decode_``):
    num_steps_total, num_draft_tokens_total, num_accepted_tokens_total,
    num_emitted_tokens_total                                      counters
    num_accepted_tokens_per_pos_total{position}                   counter, 1-based
    num_draft_tokens_per_pos_total{position}                      counter, 1-based
    fallback_events_total{kind}, fallback_steps_total{kind}       counters
    requests_total                                                counter
    draft_time_seconds, target_time_seconds, step_time_seconds    histograms, per step
    acceptance_rate, mean_accepted_length, draft_latency_share,
    estimated_speedup, fallback_frequency                         gauges (window; NaN = unknown)
    k                                                             gauge, the last step's K
    verify_peak_bytes                                             gauge, the highest
        verification peak memory over the last window of steps (``spectune.models.devices.
        VerifyMemory``: CUDA allocator peak above resident; on the CPU, tensor bytes)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from spectune.monitor.stats import FALLBACK_KINDS, Rates, StatsSnapshot, StepNumbers

__all__ = ["PREFIX", "PrometheusExporter"]

PREFIX = "spectune_spec_decode"
# Step times from a toy model's sub-millisecond steps to a large model's on a slow CPU.
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PrometheusExporter:
    """Per-step metrics on ``registry`` (a new one when not given)."""

    def __init__(
        self,
        snapshot: Callable[[], StatsSnapshot],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._snapshot = snapshot
        reg = self.registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=reg)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, buckets=TIME_BUCKETS, registry=reg)

        self.steps = counter("num_steps", "Decoding steps (speculative or plain).")
        self.drafted = counter(
            "num_draft_tokens", "Draft tokens tested (a token tree counts its depth)."
        )
        self.accepted = counter("num_accepted_tokens", "Draft tokens accepted by the target.")
        self.emitted = counter("num_emitted_tokens", "Tokens emitted (after truncation).")
        self.requests = counter("requests", "Requests monitored.")
        self.accepted_per_pos = counter(
            "num_accepted_tokens_per_pos",
            "Accepted draft tokens by draft position (1-based).",
            ("position",),
        )
        self.drafted_per_pos = counter(
            "num_draft_tokens_per_pos", "Draft tokens by draft position (1-based).", ("position",)
        )
        self.fallback_events = counter(
            "fallback_events",
            "Fallbacks begun, by kind (token: rejections resampled by the verifier).",
            ("kind",),
        )
        self.fallback_steps = counter(
            "fallback_steps", "Steps run under a fallback, by kind.", ("kind",)
        )
        for kind in FALLBACK_KINDS:  # expose zeros, so rates over them are defined
            self.fallback_events.labels(kind=kind)
            if kind != "token":
                self.fallback_steps.labels(kind=kind)
        self.draft_time = histogram("draft_time_seconds", "Seconds drafting, per step.")
        self.target_time = histogram("target_time_seconds", "Seconds in the target, per step.")
        self.step_time = histogram("step_time_seconds", "Seconds per step, all included.")
        self.k = Gauge(f"{PREFIX}_k", "Draft tokens asked for in the last step.", registry=reg)
        self._gauge("acceptance_rate", "Accepted / drafted, last window.", "acceptance_rate")
        self._gauge(
            "mean_accepted_length",
            "Accepted tokens + 1 per step, last window.",
            "mean_accepted_length",
        )
        self._gauge("draft_latency_share", "Draft time / step time, last window.", "draft_share")
        self._gauge(
            "estimated_speedup",
            "Tokens/s over the plain-decoding baseline, last window (NaN: no baseline).",
            "estimated_speedup",
        )
        self._gauge(
            "fallback_frequency",
            "Steps with a fallback / steps, last window.",
            "fallback_frequency",
        )

        peak = Gauge(
            f"{PREFIX}_verify_peak_bytes",
            "Highest verification peak memory over the last window of steps, bytes "
            "(CUDA: allocator peak above resident; CPU: verification tensors from shapes; "
            "NaN: not measured).",
            registry=reg,
        )
        peak.set_function(self._window_peak)

    def _window_peak(self) -> float:
        value = self._snapshot().window_verify_peak_bytes
        return math.nan if value is None else float(value)

    def _gauge(self, name: str, doc: str, field: str) -> None:
        gauge = Gauge(f"{PREFIX}_{name}", doc, registry=self.registry)

        def read() -> float:
            value: float | None = getattr(self._window(), field)
            return math.nan if value is None else value

        gauge.set_function(read)

    def _window(self) -> Rates:
        return self._snapshot().window

    def request_started(self) -> None:
        self.requests.inc()

    def observe(self, n: StepNumbers) -> None:
        self.steps.inc()
        self.drafted.inc(n.positions)
        self.accepted.inc(n.accepted)
        self.emitted.inc(n.emitted)
        for position in range(1, n.positions + 1):
            self.drafted_per_pos.labels(position=str(position)).inc()
            if position <= n.accepted:
                self.accepted_per_pos.labels(position=str(position)).inc()
        if n.rejected:
            self.fallback_events.labels(kind="token").inc()
        if n.fallback is not None:
            self.fallback_steps.labels(kind=n.fallback).inc()
            if n.new_fallback:
                self.fallback_events.labels(kind=n.fallback).inc()
        self.draft_time.observe(n.draft_time)
        self.target_time.observe(n.target_time)
        self.step_time.observe(n.step_time)
        self.k.set(n.k)
